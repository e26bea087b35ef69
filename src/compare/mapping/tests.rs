use super::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn p(name: &str) -> PathBuf {
    PathBuf::from(name)
}

fn toml(text: &str) -> Result<Mapping, MappingError> {
    Mapping::from_toml(text, &p("map.toml"))
}

fn yaml(text: &str) -> Result<Mapping, MappingError> {
    Mapping::from_yaml(text, &p("map.yaml"))
}

/// The error's message, checked to be one line.
fn err(r: Result<Mapping, MappingError>) -> String {
    let e = r.expect_err("expected an error").to_string();
    assert!(!e.contains('\n') && !e.contains('\r'), "{e:?}");
    e
}

fn rule<'a>(m: &'a Mapping, bench: &[&str], cmp: &[&str]) -> Option<&'a str> {
    m.rule_for(bench, cmp).map(|r| r.name.as_str())
}

// ------------------------------------------------------------------ the built-in table

#[test]
fn builtin_entries_are_well_formed_and_unambiguous() {
    let m = Mapping::builtin();
    let mut names = std::collections::HashSet::new();
    for r in &m.rules {
        assert!(names.insert(r.name.as_str()), "rule {} twice", r.name);
        assert_eq!(r.source, "built-in");
        assert!(
            !r.fused.is_empty() && !r.composition.is_empty(),
            "{}",
            r.name
        );
        for e in r.fused.iter().chain(&r.composition) {
            check_api_name(e, true).unwrap_or_else(|msg| panic!("{}: {msg}", r.name));
            // A passthrough entry in a rule would be dropped before the rule sees it.
            assert!(!m.is_passthrough(e), "{}: {e} is also passthrough", r.name);
        }
        for e in &r.composition {
            assert!(
                !r.fused.contains(e),
                "{}: {e} both fused and composition",
                r.name
            );
        }
    }
    for e in &m.passthrough {
        check_api_name(e, true).unwrap();
    }
    assert!(m.api_renames.is_empty() && m.tensor_pairs.is_empty());
    assert!(m.module_renames.is_empty() && m.layer_renames.is_empty());
}

#[test]
fn builtin_table_is_documented() {
    let doc = include_str!("../../../docs/compare.md");
    let section = doc
        .split_once("## Mapping files")
        .expect("docs/compare.md has a \"Mapping files\" section")
        .1;
    let m = Mapping::builtin();
    for r in &m.rules {
        let (_, entry) = section
            .split_once(&format!("#### `{}`", r.name))
            .unwrap_or_else(|| panic!("rule {} is not documented", r.name));
        let entry = entry.split("\n#### ").next().unwrap_or_default();
        for e in r.fused.iter().chain(&r.composition) {
            assert!(
                entry.contains(&format!("`{e}`")),
                "{}: {e} is not in its documented entry",
                r.name
            );
        }
    }
    for e in &m.passthrough {
        assert!(
            section.contains(&format!("`{e}`")),
            "passthrough {e} is not documented"
        );
    }
}

#[test]
fn builtin_rules_explain_the_usual_fused_kernels() {
    let m = Mapping::builtin();
    // SDPA against the manual attention, with views, a transpose and a cast in between.
    let manual = [
        "Tensor.transpose.0.forward",
        "Torch.matmul.0.forward",
        "Tensor.__truediv__.0.forward",
        "Tensor.masked_fill.0.forward",
        "Functional.softmax.0.forward",
        "Tensor.float.0.forward",
        "Functional.dropout.0.forward",
        "Torch.matmul.1.forward",
        "Tensor.contiguous.0.forward",
    ];
    let sdpa = ["Functional.scaled_dot_product_attention.0.forward"];
    assert_eq!(rule(&m, &manual, &sdpa), Some("attention"));
    assert_eq!(rule(&m, &sdpa, &manual), Some("attention"));
    assert_eq!(
        rule(
            &m,
            &["Functional.scaled_dot_product_attention"],
            &["NPU.npu_fusion_attention"]
        ),
        Some("attention")
    );
    // Fused on both sides, different kernels.
    assert_eq!(
        rule(&m, &["Functional.rms_norm"], &["NPU.npu_rms_norm"]),
        Some("rms_norm")
    );
    assert_eq!(
        rule(
            &m,
            &[
                "Tensor.float",
                "Tensor.pow",
                "Torch.mean",
                "Tensor.__add__",
                "Torch.rsqrt",
                "Tensor.__mul__",
                "Tensor.to",
                "Tensor.__mul__"
            ],
            &["NPU.npu_rms_norm"]
        ),
        Some("rms_norm")
    );
    assert_eq!(
        rule(
            &m,
            &["Functional.layer_norm"],
            &[
                "Tensor.mean",
                "Tensor.__sub__",
                "Tensor.pow",
                "Tensor.mean",
                "Tensor.__add__",
                "Torch.sqrt",
                "Tensor.__truediv__",
                "Tensor.__mul__",
                "Tensor.__add__"
            ]
        ),
        Some("layer_norm")
    );
    assert_eq!(
        rule(
            &m,
            &[
                "Tensor.__mul__",
                "Tensor.__getitem__",
                "Tensor.__getitem__",
                "Tensor.__neg__",
                "Torch.cat",
                "Tensor.__mul__",
                "Tensor.__add__"
            ],
            &["NPU.npu_rotary_mul"]
        ),
        Some("rotary")
    );
    assert_eq!(
        rule(
            &m,
            &["Tensor.chunk", "Functional.silu", "Tensor.__mul__"],
            &["NPU.npu_swiglu"]
        ),
        Some("swiglu")
    );
    assert_eq!(
        rule(
            &m,
            &[
                "Tensor.__mul__",
                "Tensor.pow",
                "Tensor.__mul__",
                "Tensor.__add__",
                "Torch.tanh",
                "Tensor.__add__",
                "Tensor.__mul__"
            ],
            &["NPU.fast_gelu"]
        ),
        Some("gelu")
    );
    assert_eq!(
        rule(&m, &["Functional.gelu"], &["NPU.npu_gelu"]),
        Some("gelu")
    );
    // Optimizers: fused against foreach, foreach against per-tensor.
    let foreach = [
        "Torch._foreach_lerp_",
        "Torch._foreach_mul_",
        "Torch._foreach_addcmul_",
        "Torch._foreach_sqrt",
        "Torch._foreach_div_",
        "Torch._foreach_addcdiv_",
    ];
    assert_eq!(rule(&m, &foreach, &["Torch._fused_adamw_"]), Some("adam"));
    assert_eq!(
        rule(
            &m,
            &[
                "Tensor.mul_",
                "Tensor.add_",
                "Tensor.addcmul_",
                "Tensor.sqrt",
                "Tensor.add_",
                "Tensor.addcdiv_"
            ],
            &foreach
        ),
        Some("adam")
    );
    assert_eq!(
        rule(
            &m,
            &["Tensor.mul_", "Tensor.lerp_", "Tensor.addcdiv_"],
            &["NPU.npu_apply_adam_w"]
        ),
        Some("adam")
    );
}

#[test]
fn rule_for_refuses_what_no_rule_explains() {
    let m = Mapping::builtin();
    // Nothing left once views are dropped.
    assert_eq!(
        rule(
            &m,
            &["Tensor.view", "Tensor.transpose"],
            &["NPU.npu_fusion_attention"]
        ),
        None
    );
    assert_eq!(rule(&m, &[], &["NPU.npu_rms_norm"]), None);
    // Compositions on both sides: no side is fused.
    assert_eq!(
        rule(
            &m,
            &["Torch.matmul", "Functional.softmax"],
            &["Torch.bmm", "Torch.softmax"]
        ),
        None
    );
    // An op foreign to the rule on the composition side.
    assert_eq!(
        rule(
            &m,
            &["Torch.matmul", "Functional.conv2d"],
            &["Functional.scaled_dot_product_attention"]
        ),
        None
    );
    // Fused ops of different rules.
    assert_eq!(rule(&m, &["NPU.npu_rms_norm"], &["NPU.npu_swiglu"]), None);
    // An empty table explains nothing.
    assert_eq!(
        rule(
            &Mapping::default(),
            &["Functional.rms_norm"],
            &["NPU.npu_rms_norm"]
        ),
        None
    );
}

#[test]
fn api_names_are_read_from_op_keys() {
    assert_eq!(api_name("Functional.gelu.3.forward"), "Functional.gelu");
    assert_eq!(api_name("Tensor.__add__.12.backward"), "Tensor.__add__");
    assert_eq!(api_name("Functional.gelu"), "Functional.gelu");
    assert_eq!(api_name("Torch.linalg.norm"), "Torch.linalg.norm");
    assert_eq!(api_name("weird.forward"), "weird.forward");
    assert_eq!(api_name("x..forward"), "x..forward");
}

// ------------------------------------------------------------------ renames and merging

#[test]
fn earlier_tables_win() {
    let user = toml(
        r#"
[[rule]]
name = "my_attention"
fused = ["Functional.scaled_dot_product_attention"]
composition = ["Torch.matmul", "Functional.softmax"]

[[api]]
cmp = "NPU.npu_linear"
bench = "Functional.linear"
"#,
    )
    .unwrap();
    let other = toml("[[api]]\ncmp = \"NPU.npu_linear\"\nbench = \"Torch.matmul\"\n").unwrap();
    let m = user.merge(other).merge(Mapping::builtin());
    assert_eq!(
        rule(
            &m,
            &["Torch.matmul", "Functional.softmax", "Torch.matmul"],
            &["Functional.scaled_dot_product_attention"]
        ),
        Some("my_attention")
    );
    assert_eq!(m.rules[0].source, "map.toml");
    // Where the user rule does not fit, the built-in one still does.
    assert_eq!(
        rule(
            &m,
            &[
                "Torch.matmul",
                "Tensor.__truediv__",
                "Functional.softmax",
                "Torch.matmul"
            ],
            &["Functional.scaled_dot_product_attention"]
        ),
        Some("attention")
    );
    assert_eq!(m.bench_api("NPU.npu_linear"), "Functional.linear");
    assert_eq!(m.bench_api("Functional.gelu"), "Functional.gelu");
    // Passthrough entries are merged once.
    let twice = Mapping::builtin().merge(Mapping::builtin());
    assert_eq!(twice.passthrough, Mapping::builtin().passthrough);
}

#[test]
fn with_files_reads_files_in_order_over_the_builtin_table() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.toml"), dir.path().join("b.yaml"));
    std::fs::write(&a, "[[api]]\ncmp = \"NPU.npu_x\"\nbench = \"Torch.x\"\n").unwrap();
    std::fs::write(&b, "NPU.npu_x: Torch.y\nNPU.npu_z: Torch.z\n").unwrap();
    let m = Mapping::with_files(&[a.clone(), b.clone()]).unwrap();
    assert_eq!(m.bench_api("NPU.npu_x"), "Torch.x");
    assert_eq!(m.bench_api("NPU.npu_z"), "Torch.z");
    assert_eq!(m.rules.len(), Mapping::builtin().rules.len());
    let m = Mapping::with_files(&[b, a]).unwrap();
    assert_eq!(m.bench_api("NPU.npu_x"), "Torch.y");
    assert_eq!(Mapping::with_files(&[]).unwrap(), Mapping::builtin());
}

#[test]
fn module_renames_take_the_longest_prefix_on_dotted_boundaries() {
    let m = Mapping {
        module_renames: vec![
            ("model.layers".into(), "model.h".into()),
            (
                "model.layers.0.attn".into(),
                "model.h.0.self_attention".into(),
            ),
            ("fc2.Dense".into(), "fc2.Linear".into()),
        ],
        ..Mapping::default()
    };
    assert_eq!(m.bench_module("model.layers.3.mlp"), "model.h.3.mlp");
    assert_eq!(m.bench_module("model.layers"), "model.h");
    assert_eq!(
        m.bench_module("model.layers.0.attn.qkv"),
        "model.h.0.self_attention.qkv"
    );
    assert!(matches!(
        m.bench_module("model.layersX.1"),
        Cow::Borrowed("model.layersX.1")
    ));
    assert!(matches!(m.bench_module("model"), Cow::Borrowed(_)));
    assert_eq!(m.bench_module("fc2.Dense"), "fc2.Linear");
}

#[test]
fn layer_renames_apply_inside_their_layer_class_only() {
    let m = Mapping {
        layer_renames: vec![
            LayerRename {
                layer: "ParallelAttention".into(),
                cmp: "qkv_proj".into(),
                bench: "query_key_value".into(),
            },
            LayerRename {
                layer: "Block".into(),
                cmp: "attention".into(),
                bench: "self_attention".into(),
            },
            LayerRename {
                layer: "Net".into(),
                cmp: "network_with_loss".into(),
                bench: "module".into(),
            },
        ],
        ..Mapping::default()
    };
    let classes: HashMap<&str, &str> = [
        ("", "Net"),
        ("network_with_loss.layers.0", "Block"),
        ("network_with_loss.layers.0.attention", "ParallelAttention"),
        ("network_with_loss.layers.1", "Other"),
    ]
    .into_iter()
    .collect();
    let class_of = |p: &str| classes.get(p).copied();
    assert_eq!(
        m.bench_module_in("network_with_loss.layers.0.attention.qkv_proj", class_of),
        "module.layers.0.self_attention.query_key_value"
    );
    // `attention` under a parent of another class is left alone.
    assert_eq!(
        m.bench_module_in("network_with_loss.layers.1.attention", class_of),
        "module.layers.1.attention"
    );
    // Without classes nothing applies.
    assert!(matches!(
        m.bench_module_in("network_with_loss.layers.0", |_| None),
        Cow::Borrowed(_)
    ));
}

// ------------------------------------------------------------------ probe's TOML

const GOOD_TOML: &str = r#"
passthrough = ["Tensor.as_strided", "NPU.npu_format_*"]

[[rule]]
name = "gelu_mul"
fused = ["NPU.npu_gelu_mul"]
composition = ["Functional.gelu", "Tensor.__mul__"]

[[api]]
cmp = "NPU.npu_linear"
bench = "Functional.linear"

[[tensor]]
cmp = "NPU.npu_fusion_attention.4.forward.input.0"
bench = "Functional.scaled_dot_product_attention.4.forward.input.0"

[[module]]
cmp = "model.layers"
bench = "model.h"

[[layer]]
layer = "ParallelAttention"
cmp = "qkv_proj"
bench = "query_key_value"
"#;

#[test]
fn probe_toml_reads_every_table() {
    let m = toml(GOOD_TOML).unwrap();
    assert_eq!(m.rules.len(), 1);
    assert_eq!(m.rules[0].fused, ["NPU.npu_gelu_mul"]);
    assert_eq!(
        m.api_renames,
        [("NPU.npu_linear".into(), "Functional.linear".into())]
    );
    assert_eq!(m.tensor_pairs.len(), 1);
    assert_eq!(
        m.module_renames,
        [("model.layers".into(), "model.h".into())]
    );
    assert_eq!(m.layer_renames[0].bench, "query_key_value");
    assert!(m.is_passthrough("NPU.npu_format_cast_"));
    assert!(!m.is_passthrough("NPU.npu_rms_norm"));
    assert_eq!(
        rule(
            &m,
            &["Functional.gelu", "Tensor.as_strided", "Tensor.__mul__"],
            &["NPU.npu_gelu_mul.0.forward"]
        ),
        Some("gelu_mul")
    );
}

#[test]
fn probe_toml_errors_name_the_line() {
    // Syntax.
    let e = err(toml("[[rule]\nname = 1"));
    assert!(e.starts_with("map.toml:1: TOML:"), "{e}");
    // Unknown key, wrong type, missing field.
    let e = err(toml(
        "\n[[rule]]\nname = \"x\"\nfused = [\"A.b\"]\ncomposition = [\"A.c\"]\nfusd = []\n",
    ));
    assert!(
        e.starts_with("map.toml:6: TOML:") && e.contains("fusd"),
        "{e}"
    );
    let e = err(toml(
        "[[rule]]\nname = \"x\"\nfused = \"A.b\"\ncomposition = [\"A.c\"]\n",
    ));
    assert!(e.starts_with("map.toml:3: TOML:"), "{e}");
    let e = err(toml("[[api]]\ncmp = \"A.b\"\n"));
    assert!(e.contains("bench"), "{e}");
    // An op key where an API name belongs: the API name is suggested.
    let e = err(toml(
        "[[rule]]\nname = \"x\"\nfused = [\"NPU.npu_x.0.forward\"]\ncomposition = [\"A.c\"]\n",
    ));
    assert!(
        e.starts_with("map.toml:3: ") && e.contains("(NPU.npu_x)"),
        "{e}"
    );
    // `*` elsewhere than at the end, and in a rename.
    let e = err(toml(
        "[[rule]]\nname = \"x\"\nfused = [\"NPU.*x\"]\ncomposition = [\"A.c\"]\n",
    ));
    assert!(e.contains("only at the end"), "{e}");
    let e = err(toml("[[api]]\ncmp = \"NPU.x*\"\nbench = \"A.b\"\n"));
    assert!(
        e.starts_with("map.toml:2: ") && e.contains("not an API name"),
        "{e}"
    );
    let e = err(toml(
        "[[rule]]\nname = \"x\"\nfused = [\"npu_x\"]\ncomposition = [\"A.c\"]\n",
    ));
    assert!(e.contains("{ApiType}.{api}"), "{e}");
    // Empty side, duplicate rule, duplicate rename.
    let e = err(toml(
        "[[rule]]\nname = \"x\"\nfused = []\ncomposition = [\"A.c\"]\n",
    ));
    assert!(
        e.starts_with("map.toml:2: ") && e.contains("`fused` is empty"),
        "{e}"
    );
    let r = "[[rule]]\nname = \"x\"\nfused = [\"A.b\"]\ncomposition = [\"A.c\"]\n";
    let e = err(toml(&format!("{r}{r}")));
    assert!(
        e.starts_with("map.toml:6: ") && e.contains("first at line 2"),
        "{e}"
    );
    let a = "[[module]]\ncmp = \"m.a\"\nbench = \"m.b\"\n";
    let e = err(toml(&format!("{a}{a}")));
    assert!(
        e.starts_with("map.toml:5: ") && e.contains("given twice"),
        "{e}"
    );
    let e = err(toml("[[module]]\ncmp = \"m..a\"\nbench = \"m.b\"\n"));
    assert!(e.contains("empty dotted part"), "{e}");
    let e = err(toml("[[tensor]]\ncmp = \"a b\"\nbench = \"m.b\"\n"));
    assert!(e.contains("whitespace"), "{e}");
    // Nothing in it, and a control character in a name, kept on one line.
    let e = err(toml("# just a comment\n"));
    assert!(e.starts_with("map.toml: no entries"), "{e}");
    let e = err(toml(
        "[[rule]]\nname = \"a\\nb\"\nfused = [\"A.b\"]\ncomposition = [\"A.c\"]\n",
    ));
    assert!(e.contains("bad name"), "{e}");
}

// ------------------------------------------------------------------ msprobe's YAML

#[test]
fn msprobe_api_mapping_list_and_single_entry() {
    let list = "\
- ms_api: Functional.flash_attention_score
  pt_api: NPU.npu_fusion_attention
  ms_args: [0, 1, 2]
  pt_args: [0, 1, 2]
  ms_outputs: [0]
  pt_outputs: [0]
- ms_api: Mint.add
  pt_api: Torch.add
";
    let m = yaml(list).unwrap();
    assert_eq!(
        m.bench_api("Functional.flash_attention_score"),
        "NPU.npu_fusion_attention"
    );
    assert_eq!(m.bench_api("Mint.add"), "Torch.add");
    let single =
        "ms_api: Functional.abs\npt_api: Torch.abs\nms_args:\n- 0\n- 1\npt_args:\n- 0\n- 1\n";
    assert_eq!(
        yaml(single).unwrap().api_renames,
        [("Functional.abs".into(), "Torch.abs".into())]
    );
}

#[test]
fn msprobe_api_mapping_errors() {
    let e = err(yaml(
        "- ms_api: Functional.abs\n  pt_api: Torch.abs\n  ms_args: [0, 2]\n  pt_args: [0, 1]\n",
    ));
    assert!(
        e.starts_with("map.yaml:1: ") && e.contains("remapping slots is not supported"),
        "{e}"
    );
    let e = err(yaml(
        "- ms_api: Functional.abs\n  pt_api: Torch.abs\n  ms_args: [0, 1]\n  pt_args: [0]\n",
    ));
    assert!(e.contains("must pair up"), "{e}");
    let e = err(yaml(
        "- ms_api: Functional.abs\n  pt_api: Torch.abs\n  ms_args: zero\n",
    ));
    assert!(
        e.starts_with("map.yaml:3: ") && e.contains("expected a list"),
        "{e}"
    );
    let e = err(yaml("- ms_api: Functional.abs\n  pt_ap: Torch.abs\n"));
    assert!(
        e.starts_with("map.yaml:2: ") && e.contains("unknown key \"pt_ap\""),
        "{e}"
    );
    let e = err(yaml("- ms_api: Functional.abs\n"));
    assert!(e.contains("without pt_api"), "{e}");
    let e = err(yaml("- ms_api: [Functional.abs]\n  pt_api: Torch.abs\n"));
    assert!(e.contains("expected an API name, found a list"), "{e}");
    let e = err(yaml(
        "- ms_api: Functional.abs.0.forward\n  pt_api: Torch.abs\n",
    ));
    assert!(e.contains("names one call"), "{e}");
    let e = err(yaml("- ms_api: Functional.abs\n  pt_api: Torch.abs\n- ms_api: Functional.abs\n  pt_api: Torch.absolute\n"));
    assert!(
        e.starts_with("map.yaml:3: ") && e.contains("mapped twice"),
        "{e}"
    );
    let e = err(yaml("- Functional.abs\n"));
    assert!(e.contains("holds a name"), "{e}");
}

#[test]
fn msprobe_flat_mappings_by_their_first_key() {
    // Data mapping (PyTorch and MindSpore examples of msprobe's docs).
    let m = yaml(
        "# API\nNPU.npu_fusion_attention.4.forward.input.0: NPU.npu_fusion_attention.4.forward.input.0\n\
         Cell.relu.ReLU.parameters_grad.weight: Module.emb.Embedding.parameters_grad.weight\n\
         Cell.relu.ReLU.forward.0.input.0: Module.emb.Embedding.forward.0.input.0\n",
    )
    .unwrap();
    assert_eq!(m.tensor_pairs.len(), 3);
    assert!(m.tensor_pairs.contains(&(
        "Cell.relu.ReLU.forward.0.input.0".to_string(),
        "Module.emb.Embedding.forward.0.input.0".to_string()
    )));
    // Cell mapping.
    let m = yaml("fc2.Dense: fc2.Linear\nconv1.Conv2d: conv3.Conv2d\n").unwrap();
    assert_eq!(m.bench_module("conv1.Conv2d"), "conv3.Conv2d");
    // API renames in the flat form.
    let m = yaml("Functional.abs: Torch.abs\nMint.add: Torch.add\n").unwrap();
    assert_eq!(m.bench_api("Functional.abs"), "Torch.abs");
}

#[test]
fn msprobe_flat_mappings_do_not_mix_kinds() {
    let e = err(yaml(
        "Functional.abs.0.forward.input.0: Torch.abs.0.forward.input.0\nfc2.Dense: fc2.Linear\n",
    ));
    assert!(
        e.starts_with("map.yaml:2: ") && e.contains("data mapping") && e.contains("line 1"),
        "{e}"
    );
    let e = err(yaml(
        "fc2.Dense: fc2.Linear\nFunctional.abs.0.forward.input.0: x.0.forward.input.0\n",
    ));
    assert!(
        e.starts_with("map.yaml:2: ") && e.contains("cell mapping"),
        "{e}"
    );
    let e = err(yaml("fc2.Dense: fc2.Linear\nfc3.Dense:\n"));
    assert!(e.starts_with("map.yaml:2: ") && e.contains("null"), "{e}");
    let e = err(yaml("Cell.fc2.Dense: Module.fc2.Linear\n"));
    assert!(e.contains("without the Cell./Module. prefix"), "{e}");
    let e = err(yaml("fc2: fc2\n"));
    assert!(e.contains("{cell_name}.{class_name}"), "{e}");
    let e = err(yaml("fc2.Dense: fc2.Linear\nfc3.Dense: [a]\n"));
    assert!(e.contains("maps to a list"), "{e}");
}

#[test]
fn msprobe_layer_mapping() {
    let m = yaml(
        "ParallelAttention:                 # layer class\n  qkv_proj: query_key_value\n  out_proj: dense\n\
         VocabParallelEmbedding:\n  reduce_from_mp_region.all_reduce: all_reduce\n",
    )
    .unwrap();
    assert_eq!(m.layer_renames.len(), 3);
    assert_eq!(m.layer_renames[2].cmp, "reduce_from_mp_region.all_reduce");
    let e = err(yaml(
        "ParallelAttention:\n  qkv_proj: query_key_value\nEmbedding: dropout\n",
    ));
    assert!(
        e.starts_with("map.yaml:3: ") && e.contains("layer mapping"),
        "{e}"
    );
    let e = err(yaml("ParallelAttention:\n  qkv_proj: [a, b]\n"));
    assert!(e.contains("expected a child name"), "{e}");
    let e = err(yaml("ParallelAttention: {}\n"));
    assert!(e.contains("no entries"), "{e}");
}

#[test]
fn hostile_yaml_is_one_clear_error() {
    // Billion laughs: refused at the first alias.
    let laughs = "a: &a [lol, lol, lol]\nb: &b [*a, *a, *a]\nc: [*b, *b, *b]\n";
    assert!(err(yaml(laughs)).contains("aliases"));
    // Deep nesting, flow and block, far past any limit: refused quickly, no stack overflow.
    let t = std::time::Instant::now();
    for deep in [
        "[".repeat(1_000_000),
        "{a: ".repeat(250_000),
        "- ".repeat(500_000),
    ] {
        let e = err(yaml(&deep));
        assert!(
            e.contains("nested deeper") || e.contains("recursion limit"),
            "{e}"
        );
    }
    let mut block = String::new();
    for i in 0..5000 {
        block.push_str(&" ".repeat(i));
        block.push_str("k:\n");
    }
    assert!(err(yaml(&block)).contains("nested deeper"));
    assert!(
        t.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        t.elapsed()
    );
    // Tags, two documents, binary, a scalar, nothing at all, duplicate keys.
    assert!(err(yaml("a: !!binary aGVsbG8=\n")).contains("tags"));
    assert!(err(yaml("a.B: c.D\n---\ne.F: g.H\n")).contains("more than one YAML document"));
    let e = err(yaml("\u{0}\u{1}\u{7f}: \u{2}\n"));
    assert!(e.starts_with("map.yaml:1: YAML:"), "{e}");
    assert!(err(yaml("just.text")).contains("a single value"));
    assert!(err(yaml("")).contains("no entries"));
    assert!(err(yaml("# nothing\n")).contains("no entries"));
    assert!(err(yaml("~\n")).contains("no entries"));
    assert!(err(yaml("[]\n")).contains("no entries"));
    let e = err(yaml("fc2.Dense: fc2.Linear\nfc2.Dense: fc3.Linear\n"));
    assert!(
        e.starts_with("map.yaml:2: ") && e.contains("given twice"),
        "{e}"
    );
    let e = err(yaml("? [a, b]\n: c.D\n"));
    assert!(e.contains("a mapping key must be a name"), "{e}");
    // Unterminated quote: a syntax error with its line.
    let e = err(yaml("a.B: c.D\ne.F: \"g.H\n"));
    assert!(e.starts_with("map.yaml:") && e.contains("YAML:"), "{e}");
}

// ------------------------------------------------------------------ files

#[test]
fn load_checks_kind_size_and_text_before_parsing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let e = Mapping::load(&d.join("map.json")).unwrap_err();
    assert!(matches!(e, MappingError::UnknownKind { .. }), "{e}");
    assert!(e
        .to_string()
        .contains(".toml (probe) or .yaml/.yml (msprobe)"));
    let e = Mapping::load(&d.join("missing.toml")).unwrap_err();
    assert!(matches!(e, MappingError::NotFound(_)), "{e}");
    assert!(
        e.to_string()
            .ends_with("missing.toml: no such file or directory"),
        "{e}"
    );
    let e = Mapping::load(d).unwrap_err();
    assert!(matches!(e, MappingError::UnknownKind { .. }), "{e}");
    let e = Mapping::load(&d.join("dir.yaml")).unwrap_err();
    assert!(matches!(e, MappingError::NotFound(_)), "{e}");
    std::fs::create_dir(d.join("dir.yaml")).unwrap();
    let e = Mapping::load(&d.join("dir.yaml")).unwrap_err();
    assert!(matches!(e, MappingError::Io { .. }), "{e}");
    let big = d.join("big.yaml");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(MAX_MAPPING_BYTES + 1)
        .unwrap();
    assert!(matches!(
        Mapping::load(&big).unwrap_err(),
        MappingError::TooLarge { .. }
    ));
    let bin = d.join("bin.toml");
    std::fs::write(&bin, [0xffu8, 0xfe, 0x00, 0x80]).unwrap();
    let e = Mapping::load(&bin).unwrap_err();
    assert!(matches!(e, MappingError::NotText { .. }), "{e}");
    assert!(e.to_string().starts_with(&bin.display().to_string()));
    let good = d.join("Map.YML");
    std::fs::write(&good, "fc2.Dense: fc2.Linear\n").unwrap();
    assert_eq!(Mapping::load(&good).unwrap().module_renames.len(), 1);
    // Converted into the library's error: exit 2, one line naming the file.
    let pe = crate::ProbeError::from(Mapping::load(&bin).unwrap_err());
    assert_eq!(pe.exit_code(), 2);
    assert!(pe.to_string().starts_with("bad mapping file: "), "{pe}");
}

#[test]
fn the_bundled_examples_read() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/mapping");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let m = Mapping::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(m, Mapping::default(), "{}", path.display());
        n += 1;
    }
    assert!(n >= 5, "{n} examples");
}
