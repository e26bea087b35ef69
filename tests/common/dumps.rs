//! Dump builders shared by the integration tests and the golden corpus (`tests/golden.rs`):
//! each writes, or returns the op records of, one kind of run.

use super::*;
use probe::schema::dump::OpRecord;
use std::path::Path;

/// The op records of a one-rank run (`tests/loss_scale.rs`): `gelu` forward, then its
/// backward and a parameter gradient, with every gradient times `scale` and the parameter
/// gradient also times `extra`.
pub fn loss_scale_records(scale: f32, extra: f32) -> Vec<OpRecord> {
    let x = vec![1.0f32, -2.0, 3.0, 0.5];
    let y = vec![0.84f32, -0.05, 2.99, 0.35];
    let seed: Vec<f32> = vec![0.25 * scale; 4];
    let dx: Vec<f32> = [0.27f32, -0.02, 0.26, 0.22]
        .iter()
        .map(|v| v * scale)
        .collect();
    let dw: Vec<f32> = [0.5f32, -0.1].iter().map(|v| v * scale * extra).collect();
    let mut grad = op_record(
        "Module.fc.Linear.parameters_grad",
        &[("weight", "parameter", dw)],
    );
    grad.kind = "parameters_grad".into();
    grad.direction = "backward".into();
    grad.tensors[0].name = "Module.fc.Linear.parameters_grad.weight".into();
    vec![
        op_record(
            "Functional.gelu.0.forward",
            &[("input.0", "input", x.clone()), ("output.0", "output", y)],
        ),
        op_record(
            "Functional.gelu.0.backward",
            &[("input.0", "input", seed), ("output.0", "output", dx)],
        ),
        grad,
        // The optimizer, after unscaling: as recorded on both sides.
        op_record(
            "Tensor.add_.0.forward",
            &[("input.0", "input", x.clone()), ("output.0", "output", x)],
        ),
    ]
}

/// A step of `passes` forward passes through a linear layer and a GELU, each on
/// `rows` rows of 2 (the batch split as gradient accumulation does), then its backward.
pub fn micro_batch_step(passes: usize, rows: usize) -> Vec<OpRecord> {
    let mut ops = vec![op_record(
        "Tensor.chunk.0.forward",
        &[("input.0", "input", vec![0.5; 16])],
    )];
    for i in 0..passes {
        let x: Vec<f32> = (0..rows * 2).map(|v| v as f32 / 10.0).collect();
        let y: Vec<f32> = x.iter().map(|v| v * 0.5).collect();
        ops.push(op_record(
            &format!("Functional.linear.{i}.forward"),
            &[("input.0", "input", x), ("output.0", "output", y.clone())],
        ));
        ops.push(op_record(
            &format!("Functional.gelu.{i}.forward"),
            &[("input.0", "input", y.clone()), ("output.0", "output", y)],
        ));
    }
    ops
}

/// A linear layer's call, as an API record (`api`) and as its module's record (`module`);
/// `scale` multiplies the output.
pub fn linear_at_levels(api: bool, module: bool, scale: f32) -> Vec<OpRecord> {
    let x = vec![0.5, -1.0, 2.0, 0.25];
    let y: Vec<f32> = x.iter().map(|v| v * 3.0 * scale).collect();
    let tensors = [("input.0", "input", x), ("output.0", "output", y)];
    let mut ops = Vec::new();
    if module {
        let mut m = op_record("Module.fc.Linear.forward.0", &tensors);
        m.kind = "module".into();
        ops.push(m);
    }
    if api {
        let mut a = op_record("Functional.linear.0.forward", &tensors);
        a.module = module.then(|| "fc".into());
        ops.push(a);
    }
    ops
}

/// `linear` of ones into `h`, an extra `__mul__` scaling it by 1.5 where `extra` (an op the
/// other run does not call), then `gelu` of what that leaves (`y` its output).
pub fn with_extra_op(dir: &Path, extra: bool) {
    let (mut ops, x, id) = linear_and_extra_mul(extra);
    if extra {
        ops[1].stack = Some(7);
    }
    let y: Vec<f32> = x.iter().map(|v| v + 1.0).collect();
    let mut gelu = op_record(
        "Functional.gelu.0.forward",
        &[("input.0", "input", x), ("output.0", "output", y)],
    );
    gelu.tensors[0].src = Some(id);
    ops.push(gelu);
    write_op_log(dir, ops);
    let stack = r#"{"id":7,"frames":["File \"port.py\", line 12, in forward: h = h * 1.5"]}"#;
    std::fs::write(dir.join("step0/rank0/stacks.jsonl"), format!("{stack}\n")).unwrap();
}

/// Rewrites a probe dump (tensor mode) as an msprobe dump whose tensors are `.npy` files.
pub fn probe_to_msprobe(probe_root: &Path, out: &Path) {
    let rank = probe_root.join("step0/rank0");
    let dst = out.join("step0/rank0");
    std::fs::create_dir_all(dst.join("dump_tensor_data")).unwrap();
    let shard = std::fs::read(rank.join("tensors-00000.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&shard).unwrap();
    // serde_json's maps are sorted: write the op map by hand to keep execution order.
    let mut data: Vec<String> = Vec::new();
    for line in std::fs::read_to_string(rank.join("ops.jsonl"))
        .unwrap()
        .lines()
    {
        let op: serde_json::Value = serde_json::from_str(line).unwrap();
        let key = op["op"].as_str().unwrap();
        let bwd = op["direction"] == "backward";
        let mut entry = serde_json::Map::new();
        for t in op["tensors"].as_array().unwrap() {
            let name = t["name"].as_str().unwrap();
            let rest = name.strip_prefix(key).unwrap().trim_start_matches('.');
            let (slot, idx) = rest.split_once('.').unwrap();
            let s = &t["stats"];
            let view = st.tensor(name).unwrap();
            let descr = match t["dtype"].as_str().unwrap() {
                "float32" => "<f4",
                "float64" => "<f8",
                "float16" => "<f2",
                other => panic!("dtype {other}"),
            };
            let shape: Vec<String> = t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.to_string())
                .collect();
            let mut header = format!(
                "{{'descr': '{descr}', 'fortran_order': False, 'shape': ({}{}), }}",
                shape.join(", "),
                if shape.len() == 1 { "," } else { "" }
            );
            while (10 + header.len() + 1) % 64 != 0 {
                header.push(' ');
            }
            header.push('\n');
            let mut f = b"\x93NUMPY\x01\x00".to_vec();
            f.extend_from_slice(&(header.len() as u16).to_le_bytes());
            f.extend_from_slice(header.as_bytes());
            f.extend_from_slice(view.data());
            std::fs::write(dst.join("dump_tensor_data").join(format!("{name}.npy")), f).unwrap();
            let leaf = serde_json::json!({
                "type": "torch.Tensor", "dtype": format!("torch.{}", t["dtype"].as_str().unwrap()),
                "shape": t["shape"], "Max": s["max"], "Min": s["min"], "Mean": s["mean"], "Norm": s["norm"],
                "requires_grad": false, "data_name": format!("{name}.npy"),
            });
            let slot_name = match (slot, bwd) {
                ("input", false) => "input_args",
                (other, _) => other,
            };
            let i: usize = idx.parse().unwrap();
            let list = entry
                .entry(slot_name)
                .or_insert_with(|| serde_json::json!([]))
                .as_array_mut()
                .unwrap();
            while list.len() <= i {
                list.push(serde_json::Value::Null);
            }
            list[i] = leaf;
        }
        data.push(format!(
            "{}: {}",
            serde_json::Value::from(key),
            serde_json::Value::Object(entry)
        ));
    }
    let dump = format!(
        "{{\"task\": \"tensor\", \"level\": \"L1\", \"framework\": \"pytorch\", \"dump_data_dir\": null, \"data\": {{\n{}\n}}}}",
        data.join(",\n")
    );
    std::fs::write(dst.join("dump.json"), dump).unwrap();
}
