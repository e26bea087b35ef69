//! Deterministic synthetic dumps: a small residual MLP run forward and backward, written
//! in the probe dump format, as a benchmark/comparison pair with an optional injected
//! fault. Used for the bundled `testdata/`, the tests, demos and benchmarks — no Python or
//! GPU needed to try probe.
//!
//! The model, per block `i` (width `W`, batch `B`):
//! `h = linear(x, Wa)`, `g = gelu(h)`, `o = linear(g, Wb)`, `y = add(o, x)`, `x' = layer_norm(y)`,
//! then the backward of every op in reverse order from a fixed output gradient.

use crate::atomic;
use crate::dtype::DType;
use crate::error::{ProbeError, Result};
use crate::schema::dump::{ManifestRecord, OpRecord, StackRecord, Stat, StatsRecord, TensorRecord};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What to generate.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    /// `tensor`, `statistics` or `checksum`.
    pub mode: String,
    /// Residual blocks of the model.
    pub blocks: usize,
    /// Hidden width.
    pub width: usize,
    /// Batch size.
    pub batch: usize,
    /// Seed of weights and data (the same for both sides).
    pub seed: u64,
    /// Op (without direction, e.g. `Functional.gelu.1`) whose forward output is perturbed
    /// in the comparison run.
    pub inject: Option<String>,
    /// Relative size of the injected perturbation.
    pub inject_scale: f32,
    /// Relative noise added to every op output of the comparison run (cross-device jitter).
    pub noise: f32,
    /// Round the comparison run's activations to bfloat16 (mixed precision).
    pub cmp_bf16: bool,
    /// Perturb the first weight of this block in the comparison run (divergence from outside).
    pub perturb_weight: Option<usize>,
    /// Op whose forward output gets a NaN in the comparison run.
    pub nan: Option<String>,
    /// Training steps (`step0`, `step1`, ...); weights are updated between steps.
    pub steps: usize,
    /// Data-parallel ranks (`rank0`, `rank1`, ...). More than one adds collectives: an
    /// all_reduce of the model output after the forward (its sum feeds the backward) and a
    /// DDP bucket all-reduce of each block's weight gradients in the backward.
    pub ranks: usize,
    /// The rank of the comparison run that `perturb_op` (or `perturb_collective`) perturbs.
    pub perturb_rank: Option<usize>,
    /// Op (e.g. `Functional.gelu.1` or `Functional.gelu.1.backward`) whose output is
    /// perturbed on `perturb_rank` only.
    pub perturb_op: Option<String>,
    /// Perturb the output of the forward all_reduce on `perturb_rank` (default rank 0):
    /// inputs agree on every rank, one output differs (faulty communication).
    pub perturb_collective: bool,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            mode: "tensor".into(),
            blocks: 3,
            width: 16,
            batch: 4,
            seed: 1234,
            inject: None,
            inject_scale: 0.05,
            noise: 0.0,
            cmp_bf16: false,
            perturb_weight: None,
            nan: None,
            steps: 1,
            ranks: 1,
            perturb_rank: None,
            perturb_op: None,
            perturb_collective: false,
        }
    }
}

/// splitmix64: small, fast, and the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Approximately standard normal (Irwin–Hall with 4 terms).
    fn normal(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.uniform()).sum();
        (s - 2.0) * 3.0f32.sqrt()
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * scale).collect()
    }
}

/// A tensor to write.
struct T {
    name: String,
    role: &'static str,
    dtype: DType,
    shape: Vec<usize>,
    values: Vec<f32>,
    id: Option<u64>,
    src: Option<u64>,
}

fn bytes_of(dtype: DType, v: &[f32]) -> Vec<u8> {
    match dtype {
        DType::BF16 => v
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect(),
        _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

fn stats(dtype: DType, v: &[f32]) -> StatsRecord {
    let (mut max, mut min, mut sum, mut sq) = (f64::NEG_INFINITY, f64::INFINITY, 0.0, 0.0);
    let (mut nan, mut inf) = (0u64, 0u64);
    for &x in v {
        let x = if dtype == DType::BF16 {
            half::bf16::from_f32(x).to_f64()
        } else {
            x as f64
        };
        nan += x.is_nan() as u64;
        inf += x.is_infinite() as u64;
        if x.is_nan() {
            max = f64::NAN;
            min = f64::NAN;
        } else if !max.is_nan() {
            max = max.max(x);
            min = min.min(x);
        }
        sum += x;
        sq += x * x;
    }
    StatsRecord {
        max: Stat(Some(max)),
        min: Stat(Some(min)),
        mean: Stat(Some(sum / v.len().max(1) as f64)),
        norm: Stat(Some(sq.sqrt())),
        nan: Some(nan),
        inf: Some(inf),
    }
}

/// Writes one rank of a probe dump.
struct RankWriter {
    dir: PathBuf,
    mode: String,
    ops: Vec<u8>,
    seq: u64,
    shard: Vec<(String, DType, Vec<usize>, Vec<u8>)>,
    shard_bytes: usize,
    shard_idx: usize,
    /// Group and sequence of the next op record, when it is a collective.
    next_coll: Option<(Vec<u32>, u64)>,
}

const SHARD_BYTES: usize = 256 << 20;

impl RankWriter {
    fn new(dir: PathBuf, mode: &str) -> Result<Self> {
        std::fs::create_dir_all(&dir).map_err(output_error(&dir))?;
        Ok(RankWriter {
            dir,
            mode: mode.to_string(),
            ops: Vec::new(),
            seq: 0,
            shard: Vec::new(),
            shard_bytes: 0,
            shard_idx: 0,
            next_coll: None,
        })
    }

    fn op(&mut self, key: &str, direction: &str, module: &str, tensors: Vec<T>) -> Result<()> {
        let mut records = Vec::new();
        for t in tensors {
            let mut o = TensorRecord {
                dtype: t.dtype.name().to_string(),
                id: t.id,
                name: t.name.clone(),
                role: t.role.to_string(),
                shape: t.shape.clone(),
                src: t.src,
                stats: Some(stats(t.dtype, &t.values)),
                ..TensorRecord::default()
            };
            let bytes = bytes_of(t.dtype, &t.values);
            match self.mode.as_str() {
                "tensor" => {
                    if self.shard_bytes + bytes.len() > SHARD_BYTES && !self.shard.is_empty() {
                        self.flush_shard()?;
                    }
                    o.file = Some(format!("tensors-{:05}.safetensors", self.shard_idx));
                    self.shard_bytes += bytes.len();
                    self.shard
                        .push((t.name.clone(), t.dtype, t.shape.clone(), bytes));
                }
                "checksum" => {
                    o.checksum = Some(format!("crc32:{:08x}", crc32fast::hash(&bytes)));
                }
                _ => {}
            }
            records.push(o);
        }
        let rec = OpRecord {
            args: None,
            direction: direction.to_string(),
            kind: "api".into(),
            module: Some(module.to_string()),
            op: key.to_string(),
            recompute: false,
            group: self.next_coll.as_ref().map(|c| c.0.clone()),
            coll_seq: self.next_coll.take().map(|c| c.1),
            seq: self.seq,
            stack: Some(self.seq % 3),
            tensors: records,
        };
        self.seq += 1;
        serde_json::to_writer(&mut self.ops, &rec)
            .map_err(output_error(&self.dir.join("ops.jsonl")))?;
        self.ops.push(b'\n');
        Ok(())
    }

    fn flush_shard(&mut self) -> Result<()> {
        if self.shard.is_empty() {
            return Ok(());
        }
        let path = self
            .dir
            .join(format!("tensors-{:05}.safetensors", self.shard_idx));
        let views = self
            .shard
            .iter()
            .map(|(n, d, s, b)| {
                let dt = match d {
                    DType::BF16 => safetensors::Dtype::BF16,
                    _ => safetensors::Dtype::F32,
                };
                safetensors::tensor::TensorView::new(dt, s.clone(), b).map(|v| (n.clone(), v))
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(output_error(&path))?;
        let bytes = safetensors::serialize(views, None).map_err(output_error(&path))?;
        atomic::write_bytes(&path, &bytes)?;
        self.shard.clear();
        self.shard_bytes = 0;
        self.shard_idx += 1;
        Ok(())
    }

    fn finish(mut self) -> Result<()> {
        self.flush_shard()?;
        atomic::write_bytes(&self.dir.join("ops.jsonl"), &self.ops)?;
        let stacks: String = (0..3)
            .map(|i| {
                let s = StackRecord {
                    frames: vec![
                        "File \"train.py\", line 88, in <module>: loss = model(x).sum()".into(),
                        format!(
                            "File \"model.py\", line {}, in forward: x = self.block(x)",
                            20 + i
                        ),
                    ],
                    id: i,
                };
                serde_json::to_string(&s).unwrap_or_default() + "\n"
            })
            .collect();
        atomic::write_bytes(&self.dir.join("stacks.jsonl"), stacks.as_bytes())
    }
}

fn write_manifest(root: &Path, mode: &str, ranks: usize) -> Result<()> {
    let m = ManifestRecord {
        compiled: None,
        compiled_capture: None,
        created: "2026-01-01T00:00:00Z".into(),
        device: "cpu".into(),
        format: "probe-dump".into(),
        framework: "synthetic".into(),
        framework_version: Some(env!("CARGO_PKG_VERSION").into()),
        level: "api".into(),
        mode: mode.into(),
        overflow: None,
        producer: Some(concat!("probe synth ", env!("CARGO_PKG_VERSION")).into()),
        version: 1,
        world_size: Some(ranks as u64),
    };
    let mut text = serde_json::to_string_pretty(&m).unwrap_or_default();
    text.push('\n');
    atomic::write_bytes(&root.join("manifest.json"), text.as_bytes())
}

fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044715 * x * x * x)).tanh())
}

fn gelu_grad(x: f32) -> f32 {
    let k = 0.797_884_6f32;
    let u = k * (x + 0.044715 * x * x * x);
    let t = u.tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x)
}

/// y[b, o] = sum_i x[b, i] * w[o, i]
fn linear(x: &[f32], w: &[f32], batch: usize, n: usize) -> Vec<f32> {
    let mut y = vec![0.0f32; batch * n];
    for b in 0..batch {
        let xr = &x[b * n..(b + 1) * n];
        for o in 0..n {
            let wr = &w[o * n..(o + 1) * n];
            y[b * n + o] = xr.iter().zip(wr).map(|(a, c)| a * c).sum();
        }
    }
    y
}

/// One run of the model (one side).
struct Run<'a> {
    o: &'a SynthOptions,
    cmp: bool,
    /// The op whose output the comparison run perturbs (`SynthOptions::inject`, or on one
    /// rank `perturb_op`).
    inject: Option<String>,
    rng: Rng,
    next_id: u64,
}

struct Tape {
    x: Vec<f32>,
    h: Vec<f32>,
    g: Vec<f32>,
    y: Vec<f32>,
    wa: Vec<f32>,
    wb: Vec<f32>,
    mu_sigma: Vec<(f32, f32)>,
}

impl Run<'_> {
    fn dtype(&self) -> DType {
        if self.cmp && self.o.cmp_bf16 {
            DType::BF16
        } else {
            DType::F32
        }
    }

    /// What the comparison run does to an op's output: rounding, jitter, injected faults.
    fn post(&mut self, op: &str, mut v: Vec<f32>) -> Vec<f32> {
        if !self.cmp {
            return v;
        }
        if self.o.noise > 0.0 {
            for x in v.iter_mut() {
                *x *= 1.0 + self.o.noise * (2.0 * self.rng.uniform() - 1.0);
            }
        }
        if self.inject.as_deref() == Some(op) {
            for x in v.iter_mut() {
                *x *= 1.0 + self.o.inject_scale * (2.0 * self.rng.uniform() - 1.0);
            }
        }
        if self.o.nan.as_deref() == Some(op) {
            if let Some(x) = v.first_mut() {
                *x = f32::NAN;
            }
        }
        if self.o.cmp_bf16 {
            for x in v.iter_mut() {
                *x = half::bf16::from_f32(*x).to_f32();
            }
        }
        v
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id - 1
    }

    fn t(&self, name: String, role: &'static str, shape: &[usize], values: &[f32]) -> T {
        T {
            name,
            role,
            dtype: self.dtype(),
            shape: shape.to_vec(),
            values: values.to_vec(),
            id: None,
            src: None,
        }
    }

    fn step(&mut self, w: &mut RankWriter, weights_seed: u64) -> Result<()> {
        let (_, _, tapes) = self.forward(w, weights_seed, None)?;
        // Backward from a fixed output gradient.
        let (n, bsz) = (self.o.width, self.o.batch);
        let mut gr = Rng(weights_seed ^ 0xD1B5_4A32_D192_ED03);
        let mut gx = gr.vec(bsz * n, 1.0 / (bsz * n) as f32);
        for i in (0..self.o.blocks).rev() {
            gx = self.backward_block(w, i, &tapes[i], &gx)?.0;
        }
        Ok(())
    }

    /// The forward pass; `data` (a seed) replaces the input batch (another rank's data,
    /// the same weights). Returns the output, its dataflow id and the tapes.
    fn forward(
        &mut self,
        w: &mut RankWriter,
        weights_seed: u64,
        data: Option<u64>,
    ) -> Result<(Vec<f32>, Option<u64>, Vec<Tape>)> {
        let (n, bsz) = (self.o.width, self.o.batch);
        let shape = [bsz, n];
        let wshape = [n, n];
        let mut wr = Rng(weights_seed);
        let mut x = wr.vec(bsz * n, 1.0);
        if let Some(d) = data {
            x = Rng(d).vec(bsz * n, 1.0);
        }
        let mut x_id: Option<u64> = None;
        let mut tapes = Vec::new();
        for i in 0..self.o.blocks {
            let scale = 1.0 / (n as f32).sqrt();
            let mut wa = wr.vec(n * n, scale);
            let wb = wr.vec(n * n, scale);
            if self.cmp && self.o.perturb_weight == Some(i) {
                for v in wa.iter_mut() {
                    *v *= 1.0 + self.o.inject_scale * (2.0 * self.rng.uniform() - 1.0);
                }
            }
            let module = format!("blocks.{i}");
            let fwd = |k: &str| format!("{k}.forward");
            // h = linear(x, wa)
            let k = format!("Functional.linear.{}", 2 * i);
            let h = linear(&x, &wa, bsz, n);
            let h = self.post(&k, h);
            let hid = self.id();
            let key = fwd(&k);
            let mut ins = self.t(format!("{key}.input.0"), "input", &shape, &x);
            ins.src = x_id;
            let win = T {
                dtype: DType::F32,
                ..self.t(format!("{key}.input.1"), "input", &wshape, &wa)
            };
            let mut out = self.t(format!("{key}.output.0"), "output", &shape, &h);
            out.id = Some(hid);
            w.op(&key, "forward", &module, vec![ins, win, out])?;
            // g = gelu(h)
            let k = format!("Functional.gelu.{i}");
            let g: Vec<f32> = h.iter().map(|&v| gelu(v)).collect();
            let g = self.post(&k, g);
            let gid = self.id();
            let key = fwd(&k);
            let mut ins = self.t(format!("{key}.input.0"), "input", &shape, &h);
            ins.src = Some(hid);
            let mut out = self.t(format!("{key}.output.0"), "output", &shape, &g);
            out.id = Some(gid);
            w.op(&key, "forward", &module, vec![ins, out])?;
            // o = linear(g, wb)
            let k = format!("Functional.linear.{}", 2 * i + 1);
            let o = linear(&g, &wb, bsz, n);
            let o = self.post(&k, o);
            let oid = self.id();
            let key = fwd(&k);
            let mut ins = self.t(format!("{key}.input.0"), "input", &shape, &g);
            ins.src = Some(gid);
            let win = T {
                dtype: DType::F32,
                ..self.t(format!("{key}.input.1"), "input", &wshape, &wb)
            };
            let mut out = self.t(format!("{key}.output.0"), "output", &shape, &o);
            out.id = Some(oid);
            w.op(&key, "forward", &module, vec![ins, win, out])?;
            // y = o + x
            let k = format!("Torch.add.{i}");
            let y: Vec<f32> = o.iter().zip(&x).map(|(a, b)| a + b).collect();
            let y = self.post(&k, y);
            let yid = self.id();
            let key = fwd(&k);
            let mut i0 = self.t(format!("{key}.input.0"), "input", &shape, &o);
            i0.src = Some(oid);
            let mut i1 = self.t(format!("{key}.input.1"), "input", &shape, &x);
            i1.src = x_id;
            let mut out = self.t(format!("{key}.output.0"), "output", &shape, &y);
            out.id = Some(yid);
            w.op(&key, "forward", &module, vec![i0, i1, out])?;
            // x' = layer_norm(y)
            let k = format!("Functional.layer_norm.{i}");
            let mut xn = vec![0.0f32; bsz * n];
            let mut ms = Vec::new();
            for b in 0..bsz {
                let r = &y[b * n..(b + 1) * n];
                let mu = r.iter().sum::<f32>() / n as f32;
                let var = r.iter().map(|v| (v - mu) * (v - mu)).sum::<f32>() / n as f32;
                let sigma = (var + 1e-5).sqrt();
                for j in 0..n {
                    xn[b * n + j] = (r[j] - mu) / sigma;
                }
                ms.push((mu, sigma));
            }
            let xn = self.post(&k, xn);
            let xid = self.id();
            let key = fwd(&k);
            let mut ins = self.t(format!("{key}.input.0"), "input", &shape, &y);
            ins.src = Some(yid);
            let mut out = self.t(format!("{key}.output.0"), "output", &shape, &xn);
            out.id = Some(xid);
            w.op(&key, "forward", &module, vec![ins, out])?;
            tapes.push(Tape {
                x: x.clone(),
                h,
                g,
                y,
                wa,
                wb,
                mu_sigma: ms,
            });
            x = xn;
            x_id = Some(xid);
        }
        Ok((x, x_id, tapes))
    }

    /// The backward of block `i` from the gradient `gx` of its output: the gradient of its
    /// input and of its two weights.
    #[allow(clippy::type_complexity)]
    fn backward_block(
        &mut self,
        w: &mut RankWriter,
        i: usize,
        tp: &Tape,
        gx: &[f32],
    ) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        let (n, bsz) = (self.o.width, self.o.batch);
        let shape = [bsz, n];
        let wshape = [n, n];
        let module = format!("blocks.{i}");
        // layer_norm backward
        let k = format!("Functional.layer_norm.{i}.backward");
        let mut gy = vec![0.0f32; bsz * n];
        for b in 0..bsz {
            let (mu, sigma) = tp.mu_sigma[b];
            let r = &tp.y[b * n..(b + 1) * n];
            let gb = &gx[b * n..(b + 1) * n];
            let xh: Vec<f32> = r.iter().map(|v| (v - mu) / sigma).collect();
            let mg = gb.iter().sum::<f32>() / n as f32;
            let mgx = gb.iter().zip(&xh).map(|(a, c)| a * c).sum::<f32>() / n as f32;
            for j in 0..n {
                gy[b * n + j] = (gb[j] - mg - xh[j] * mgx) / sigma;
            }
        }
        let gy = self.post(&k, gy);
        let a = self.t(format!("{k}.input.0"), "input", &shape, gx);
        let b = self.t(format!("{k}.output.0"), "output", &shape, &gy);
        w.op(&k, "backward", &module, vec![a, b])?;
        // add backward: both inputs get gy
        let k = format!("Torch.add.{i}.backward");
        let a = self.t(format!("{k}.input.0"), "input", &shape, &gy);
        let b0 = self.t(format!("{k}.output.0"), "output", &shape, &gy);
        let b1 = self.t(format!("{k}.output.1"), "output", &shape, &gy);
        w.op(&k, "backward", &module, vec![a, b0, b1])?;
        // linear(g, wb) backward: dg = gy @ wb, dwb = gy^T g
        let k = format!("Functional.linear.{}.backward", 2 * i + 1);
        let (dg, dwb) = linear_backward(&gy, &tp.g, &tp.wb, bsz, n);
        let dg = self.post(&k, dg);
        let a = self.t(format!("{k}.input.0"), "input", &shape, &gy);
        let b0 = self.t(format!("{k}.output.0"), "output", &shape, &dg);
        let b1 = self.t(format!("{k}.output.1"), "output", &wshape, &dwb);
        w.op(&k, "backward", &module, vec![a, b0, b1])?;
        // gelu backward
        let k = format!("Functional.gelu.{i}.backward");
        let dh: Vec<f32> = dg
            .iter()
            .zip(&tp.h)
            .map(|(d, h)| d * gelu_grad(*h))
            .collect();
        let dh = self.post(&k, dh);
        let a = self.t(format!("{k}.input.0"), "input", &shape, &dg);
        let b0 = self.t(format!("{k}.output.0"), "output", &shape, &dh);
        w.op(&k, "backward", &module, vec![a, b0])?;
        // linear(x, wa) backward
        let k = format!("Functional.linear.{}.backward", 2 * i);
        let (dx, dwa) = linear_backward(&dh, &tp.x, &tp.wa, bsz, n);
        let dx = self.post(&k, dx);
        let a = self.t(format!("{k}.input.0"), "input", &shape, &dh);
        let b0 = self.t(format!("{k}.output.0"), "output", &shape, &dx);
        let b1 = self.t(format!("{k}.output.1"), "output", &wshape, &dwa);
        w.op(&k, "backward", &module, vec![a, b0, b1])?;
        let gx = dx.iter().zip(&gy).map(|(a, b)| a + b).collect();
        Ok((gx, dwa, dwb))
    }
}

/// dx = gy @ w, dw = gy^T @ x for y = x w^T.
fn linear_backward(gy: &[f32], x: &[f32], w: &[f32], bsz: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
    let mut dx = vec![0.0f32; bsz * n];
    let mut dw = vec![0.0f32; n * n];
    for b in 0..bsz {
        for o in 0..n {
            let g = gy[b * n + o];
            for i in 0..n {
                dx[b * n + i] += g * w[o * n + i];
                dw[o * n + i] += g * x[b * n + i];
            }
        }
    }
    (dx, dw)
}

/// The largest sizes `probe synth` takes (a synthetic pair is a test fixture, its buffers
/// allocated whole): width, batch, blocks × steps × ranks, bulk tensors, bulk elements.
const MAX_WIDTH: usize = 4096;
const MAX_BATCH: usize = 65_536;
const MAX_PASSES: usize = 1 << 20;
const MAX_BULK: usize = 1 << 20;
const MAX_BULK_ELEMS: usize = 1 << 28;
/// A distributed step holds every rank's records (each collective's listing the group) and
/// activations until written: ranks² × (blocks + 1) group entries (tens of GB at `--ranks
/// 100000`) and about ranks × blocks × (8 × batch × width + 2 × width²) floats. These caps
/// keep an accepted pair within 2 GiB (`--ranks 1024` takes up to 3 blocks).
const MAX_GROUP_ENTRIES: u128 = 1 << 22;
const MAX_HELD_FLOATS: u128 = 1 << 27;
const HELD: &str = "--ranks x --ranks x (--blocks + 1) at most 2^22 and --ranks x --blocks x \
    (8 x --batch x --width + 2 x --width^2) at most 2^27 (a step of every rank is held)";

/// The error of writing `path`.
fn output_error<E: std::fmt::Display>(path: &Path) -> impl FnOnce(E) -> ProbeError + '_ {
    move |e| ProbeError::Output {
        path: path.to_path_buf(),
        msg: e.to_string(),
    }
}

/// One line naming an argument out of its range.
fn out_of_range(arg: &str, value: impl std::fmt::Display, range: &str) -> ProbeError {
    ProbeError::Usage(format!("--{arg} {value}: must be {range}"))
}

/// The model's sizes within their ranges (no product overflows, no buffer past a GiB).
fn check_sizes(o: &SynthOptions) -> Result<()> {
    for (arg, v, max) in [
        ("blocks", o.blocks, MAX_PASSES),
        ("width", o.width, MAX_WIDTH),
        ("batch", o.batch, MAX_BATCH),
        ("steps", o.steps, MAX_PASSES),
        ("ranks", o.ranks, MAX_PASSES),
    ] {
        if v == 0 || v > max {
            return Err(out_of_range(arg, v, &format!("from 1 to {max}")));
        }
    }
    let (area, passes) = (o.batch * o.width, o.blocks * o.steps); // no overflow: each factor is capped
    if area > MAX_BULK_ELEMS / 4 || passes.checked_mul(o.ranks).is_none_or(|n| n > MAX_PASSES) {
        let why = "--batch x --width at most 2^26, --blocks x --steps x --ranks at most 2^20";
        return Err(ProbeError::Usage(why.into()));
    }
    let big = |x: usize| x as u128; // no overflow below
    let (r, b, n) = (big(o.ranks), big(o.blocks), big(o.width));
    let floats = r * b * (8 * big(area) + 2 * n * n);
    if o.ranks > 1 && (r * r * (b + 1) > MAX_GROUP_ENTRIES || floats > MAX_HELD_FLOATS) {
        return Err(ProbeError::Usage(HELD.into()));
    }
    for (arg, v) in [("inject-scale", o.inject_scale), ("noise", o.noise)] {
        if !v.is_finite() || v < 0.0 {
            return Err(out_of_range(arg, v, "a finite number, 0 or more"));
        }
    }
    Ok(())
}

/// Writes `out/bench` and `out/cmp`, two dumps of the synthetic model.
pub fn write_pair(out: &Path, o: &SynthOptions) -> Result<()> {
    if !["tensor", "statistics", "checksum"].contains(&o.mode.as_str()) {
        return Err(ProbeError::Usage(format!(
            "unknown mode {:?} (tensor, statistics or checksum)",
            o.mode
        )));
    }
    check_sizes(o)?;
    if o.perturb_rank.is_some_and(|r| r >= o.ranks) {
        return Err(ProbeError::Usage(format!(
            "--perturb-rank must be below --ranks ({})",
            o.ranks
        )));
    }
    if o.ranks > 1 || o.perturb_op.is_some() || o.perturb_collective {
        if o.ranks < 2 {
            return Err(ProbeError::Usage(
                "--perturb-op and --perturb-collective need --ranks 2 or more".into(),
            ));
        }
        return write_distributed(out, o);
    }
    for (side, cmp) in [("bench", false), ("cmp", true)] {
        let root = out.join(side);
        std::fs::create_dir_all(&root).map_err(output_error(&root))?;
        write_manifest(&root, &o.mode, o.ranks)?;
        for s in 0..o.steps {
            let mut w = RankWriter::new(root.join(format!("step{s}")).join("rank0"), &o.mode)?;
            let mut run = Run {
                o,
                cmp,
                inject: o.inject.clone(),
                rng: Rng(o.seed ^ 0xA5A5 ^ s as u64),
                next_id: 0,
            };
            run.step(&mut w, o.seed.wrapping_add(s as u64))?;
            w.finish()?;
        }
    }
    Ok(())
}

/// Writes the data-parallel pair of `write_pair` (`o.ranks` > 1): every rank runs the same
/// weights on its own batch; after the forward, an all_reduce (sum) of the model output
/// whose result feeds every rank's backward; after each block's backward, a DDP bucket
/// all-reduce (mean) of its weight gradients. Collectives carry `group` and `coll_seq`.
fn write_distributed(out: &Path, o: &SynthOptions) -> Result<()> {
    let (n, bsz) = (o.width, o.batch);
    let group: Vec<u32> = (0..o.ranks as u32).collect();
    let perturbed = o.perturb_rank.unwrap_or(0);
    let op = o
        .perturb_op
        .as_deref()
        .map(|k| k.strip_suffix(".forward").unwrap_or(k).to_string());
    for (side, cmp) in [("bench", false), ("cmp", true)] {
        let root = out.join(side);
        std::fs::create_dir_all(&root).map_err(output_error(&root))?;
        write_manifest(&root, &o.mode, o.ranks)?;
        for s in 0..o.steps {
            let weights_seed = o.seed.wrapping_add(s as u64);
            let mut ws = Vec::with_capacity(o.ranks);
            let mut runs = Vec::with_capacity(o.ranks);
            for r in 0..o.ranks {
                let dir = root.join(format!("step{s}")).join(format!("rank{r}"));
                ws.push(RankWriter::new(dir, &o.mode)?);
                runs.push(Run {
                    o,
                    cmp,
                    inject: if cmp && r == perturbed {
                        op.clone()
                    } else {
                        None
                    },
                    rng: Rng(o.seed ^ 0xA5A5 ^ s as u64 ^ ((r as u64) << 32)),
                    next_id: 0,
                });
            }
            // Forward on every rank, each on its own batch.
            let mut fwd = Vec::with_capacity(o.ranks);
            for (r, (run, w)) in runs.iter_mut().zip(ws.iter_mut()).enumerate() {
                let data = weights_seed ^ 0x9E37_79B9_u64.wrapping_mul(r as u64 + 1);
                fwd.push(run.forward(w, weights_seed, Some(data))?);
            }
            let mut sum = vec![0.0f32; bsz * n];
            for (x, _, _) in &fwd {
                for (a, b) in sum.iter_mut().zip(x) {
                    *a += b;
                }
            }
            let shape = [bsz, n];
            let fixed =
                Rng(weights_seed ^ 0xD1B5_4A32_D192_ED03).vec(bsz * n, 1.0 / (bsz * n) as f32);
            let mut gxs = Vec::with_capacity(o.ranks);
            let mut tapes = Vec::with_capacity(o.ranks);
            for (r, ((run, w), (x, x_id, tape))) in
                runs.iter_mut().zip(ws.iter_mut()).zip(fwd).enumerate()
            {
                let mut reduced = sum.clone();
                if cmp && o.perturb_collective && r == perturbed {
                    for v in reduced.iter_mut() {
                        *v *= 1.0 + o.inject_scale * (2.0 * run.rng.uniform() - 1.0);
                    }
                }
                let key = "Distributed.all_reduce.0.forward";
                let mut ins = run.t(format!("{key}.input.0"), "input", &shape, &x);
                ins.src = x_id;
                let mut outs = run.t(format!("{key}.output.0"), "output", &shape, &reduced);
                outs.id = Some(run.id());
                w.next_coll = Some((group.clone(), 0));
                w.op(key, "forward", "", vec![ins, outs])?;
                let scale = 1.0 / (bsz * n) as f32;
                gxs.push(
                    fixed
                        .iter()
                        .zip(&reduced)
                        .map(|(g, v)| g + v * scale)
                        .collect::<Vec<f32>>(),
                );
                tapes.push(tape);
            }
            // Backward, one DDP bucket per block.
            for (bucket, i) in (0..o.blocks).rev().enumerate() {
                let mut local = Vec::with_capacity(o.ranks);
                for r in 0..o.ranks {
                    let (gx, dwa, dwb) =
                        runs[r].backward_block(&mut ws[r], i, &tapes[r][i], &gxs[r])?;
                    gxs[r] = gx;
                    local.push([dwa, dwb].concat());
                }
                let mut mean = vec![0.0f32; 2 * n * n];
                for l in &local {
                    for (a, b) in mean.iter_mut().zip(l) {
                        *a += b / o.ranks as f32;
                    }
                }
                let key = format!("Distributed.ddp_bucket_allreduce.{bucket}.forward");
                for r in 0..o.ranks {
                    let run = &runs[r];
                    let ins = run.t(format!("{key}.input.0"), "input", &[2 * n * n], &local[r]);
                    let outs = run.t(format!("{key}.output.0"), "output", &[2 * n * n], &mean);
                    ws[r].next_coll = Some((group.clone(), 1 + bucket as u64));
                    ws[r].op(&key, "forward", "ddp", vec![ins, outs])?;
                }
            }
            for w in ws {
                w.finish()?;
            }
        }
    }
    Ok(())
}

/// Writes a large pair for benchmarks: `count` tensors of `elems` f32 elements each, the
/// comparison side with relative noise `noise`. No model, just data at disk speed.
pub fn write_bulk(
    out: &Path,
    mode: &str,
    count: usize,
    elems: usize,
    noise: f32,
    seed: u64,
) -> Result<()> {
    if !["tensor", "statistics", "checksum"].contains(&mode) {
        return Err(ProbeError::Usage(format!(
            "unknown mode {mode:?} (tensor, statistics or checksum)"
        )));
    }
    if count > MAX_BULK {
        return Err(out_of_range("bulk", count, &format!("at most {MAX_BULK}")));
    }
    if elems == 0 || elems > MAX_BULK_ELEMS {
        return Err(out_of_range(
            "bulk-elems",
            elems,
            &format!("from 1 to {MAX_BULK_ELEMS}"),
        ));
    }
    if !noise.is_finite() || noise < 0.0 {
        return Err(out_of_range("noise", noise, "a finite number, 0 or more"));
    }
    for (side, cmp) in [("bench", false), ("cmp", true)] {
        let root = out.join(side);
        std::fs::create_dir_all(&root).map_err(output_error(&root))?;
        write_manifest(&root, mode, 1)?;
        let mut w = RankWriter::new(root.join("step0").join("rank0"), mode)?;
        let mut data = Rng(seed);
        let mut jitter = Rng(seed ^ 0x5555);
        for i in 0..count {
            let mut v = data.vec(elems, 1.0);
            if cmp {
                for x in v.iter_mut() {
                    *x *= 1.0 + noise * (2.0 * jitter.uniform() - 1.0);
                }
            }
            let key = format!("Functional.op{}.{i}.forward", i % 7);
            let t = T {
                name: format!("{key}.output.0"),
                role: "output",
                dtype: DType::F32,
                shape: vec![elems],
                values: v,
                id: None,
                src: None,
            };
            w.op(&key, "forward", "bulk", vec![t])?;
        }
        w.finish()?;
    }
    let _ = std::io::stderr().flush();
    Ok(())
}
