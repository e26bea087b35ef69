//! Mapping: which op runs of the two sides compute the same thing (placeholder interface;
//! the full table and the file formats land with the mapping work).

use std::borrow::Cow;

/// One equivalence between op runs.
#[derive(Debug, Clone, PartialEq)]
pub struct MapRule {
    /// Short name (`rms_norm`).
    pub name: String,
    /// API names (no counter, no direction) any run of which forms one side.
    pub fused: Vec<String>,
    /// API names that may make up the other side's run.
    pub composition: Vec<String>,
    /// `built-in` or the file it came from.
    pub source: String,
}

/// Equivalences and renames between the two sides.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Mapping {
    /// Region equivalences.
    pub rules: Vec<MapRule>,
    /// cmp API name → bench API name.
    pub api_renames: Vec<(String, String)>,
    /// cmp tensor name → bench tensor name.
    pub tensor_pairs: Vec<(String, String)>,
    /// cmp module path prefix → bench module path prefix.
    pub module_renames: Vec<(String, String)>,
}

const PASSTHROUGH: &[&str] = &[
    "reshape",
    "view",
    "transpose",
    "permute",
    "contiguous",
    "to",
    "float",
];

fn passthrough(api: &str) -> bool {
    let name = api.rsplit('.').next().unwrap_or(api);
    PASSTHROUGH.contains(&name)
}

fn rule(name: &str, fused: &[&str], composition: &[&str]) -> MapRule {
    MapRule {
        name: name.into(),
        fused: fused.iter().map(|s| s.to_string()).collect(),
        composition: composition.iter().map(|s| s.to_string()).collect(),
        source: "built-in".into(),
    }
}

impl Mapping {
    /// The built-in table.
    pub fn builtin() -> Mapping {
        Mapping {
            rules: vec![
                rule(
                    "attention",
                    &["Functional.scaled_dot_product_attention"],
                    &["Torch.matmul", "Tensor.__truediv__", "Functional.softmax"],
                ),
                rule(
                    "layer_norm",
                    &["Functional.layer_norm"],
                    &["Tensor.mean", "Tensor.var", "Tensor.__sub__", "Torch.rsqrt"],
                ),
            ],
            ..Mapping::default()
        }
    }

    /// The rule under which the two runs are equivalent, either way round.
    pub fn rule_for(&self, bench: &[&str], cmp: &[&str]) -> Option<&MapRule> {
        let all_in = |run: &[&str], set: &[String]| {
            let mut any = false;
            for a in run {
                if set.iter().any(|s| s == a) {
                    any = true;
                } else if !passthrough(a) {
                    return false;
                }
            }
            any
        };
        self.rules.iter().find(|r| {
            (all_in(bench, &r.fused) && all_in(cmp, &r.composition))
                || (all_in(cmp, &r.fused) && all_in(bench, &r.composition))
        })
    }

    /// The bench name of a cmp API.
    pub fn bench_api<'a>(&'a self, cmp_api: &'a str) -> &'a str {
        self.api_renames
            .iter()
            .find(|(c, _)| c == cmp_api)
            .map(|(_, b)| b.as_str())
            .unwrap_or(cmp_api)
    }

    /// The bench path of a cmp module path.
    pub fn bench_module<'a>(&self, cmp_module: &'a str) -> Cow<'a, str> {
        Cow::Borrowed(cmp_module)
    }
}
