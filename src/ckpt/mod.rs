//! `probe ckpt-compare A B`: two checkpoints compared per logical parameter, whatever
//! their layout (docs/checkpoints.md).
//!
//! Data flow: [`source::open`] lists each side's stored tensors (safetensors, `torch.save`
//! files through the restricted pickle reader, Megatron-style rank folders, DCP folders
//! with their logical parameters from the metadata) without
//! reading a tensor byte → [`layout`] turns them into logical parameters (a Megatron
//! side's TP shards merged and renamed to HF names, with the model shape from [`config`])
//! → the parameters are paired by name and put in model order → [`measure`] compares each
//! pair a block of rows at a time → [`report`] writes `ckpt_compare.json` and the
//! terminal summary.

pub mod config;
pub mod dcp;
pub mod layout;
pub mod measure;
pub mod megatron;
pub mod report;
pub mod source;

use crate::error::{ProbeError, Result};
use crate::gate::{EXIT_FAIL, EXIT_PASS};
use config::Mapping;
use layout::Logical;
use measure::Side;
use source::{Checkpoint, Layout};
use std::collections::HashMap;
use std::path::PathBuf;

/// `probe ckpt-compare`'s arguments (declared here: the command line's shape is this
/// module's, `main.rs` only dispatches).
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Benchmark checkpoint (trusted): a file, an index json or a folder.
    pub bench: PathBuf,
    /// Comparison checkpoint (under suspicion).
    pub cmp: PathBuf,
    /// Output folder for ckpt_compare.json.
    #[arg(short, long, value_name = "DIR", default_value = "ckpt-out")]
    pub out: PathBuf,
    /// Mapping file (TOML): the model's shape, renames, ignore patterns.
    #[arg(long, value_name = "FILE.toml")]
    pub mapping: Option<PathBuf>,
    /// Largest relative L2 error that passes (default: 0, or the coarser dtype's rounding).
    #[arg(long, value_name = "REL")]
    pub tolerance: Option<f64>,
    /// Print nothing on stdout.
    #[arg(short, long)]
    pub quiet: bool,
}

impl Args {
    /// The request, and whether stdout stays quiet.
    pub fn request(self) -> (CkptRequest, bool) {
        let req = CkptRequest::new(self.bench, self.cmp, self.out, self.mapping, self.tolerance);
        (req, self.quiet)
    }
}

/// What `probe ckpt-compare` was asked.
#[derive(Debug, Clone)]
pub struct CkptRequest {
    /// The trusted checkpoint.
    pub bench: PathBuf,
    /// The checkpoint under suspicion.
    pub cmp: PathBuf,
    /// Output folder.
    pub out: PathBuf,
    /// The mapping file.
    pub mapping: Option<PathBuf>,
    /// Largest relative L2 error a parameter may have and pass; None: exact when both
    /// dtypes agree, else the coarser dtype's rounding (2⁻⁸ bf16, 2⁻¹¹ f16, 2⁻²⁴ f32).
    pub tolerance: Option<f64>,
}

impl CkptRequest {
    /// A request from the command line's values.
    pub fn new(
        bench: PathBuf,
        cmp: PathBuf,
        out: PathBuf,
        mapping: Option<PathBuf>,
        tolerance: Option<f64>,
    ) -> CkptRequest {
        CkptRequest {
            bench,
            cmp,
            out,
            mapping,
            tolerance,
        }
    }
}

/// Both sides' parameters, paired, in model order.
struct Paired {
    pairs: Vec<(usize, usize)>,
    only: [Vec<String>; 2],
    ignored: usize,
}

/// Runs the comparison and writes the reports; the summary (its exit code: 0 pass, 1 a
/// parameter differs or is on one side only).
pub fn run(req: &CkptRequest) -> Result<report::CkptSummary> {
    crate::atomic::prepare_output_dir(&req.out)?;
    let map = match &req.mapping {
        Some(p) => Mapping::from_file(p)?,
        None => Mapping::default(),
    };
    let sides = [source::open(&req.bench)?, source::open(&req.cmp)?];
    let flat_vocab = sides
        .iter()
        .find(|c| !matches!(c.layout, Layout::Megatron { .. }))
        .and_then(|c| {
            let named = |n: &str| map.rename(n) == "model.embed_tokens.weight";
            match c.layout {
                Layout::Dcp => c.logical.iter().find(|l| named(&l.name)).map(|l| l.rows),
                _ => c
                    .tensors
                    .iter()
                    .find(|t| named(&t.name))
                    .map(|t| t.shape[0]),
            }
        });
    let (dims, dims_from) = config::dims(&map, [&sides[0], &sides[1]], flat_vocab)?;
    let rename = |n: &str| map.rename(n);
    let params: Vec<Vec<Logical>> = sides
        .iter()
        .map(|ck| match ck.layout {
            Layout::Megatron { tp, .. } => layout::megatron(ck, tp, &dims, &rename),
            Layout::Dcp => Ok(ck
                .logical
                .iter()
                .map(|l| Logical {
                    name: rename(&l.name),
                    ..l.clone()
                })
                .collect()),
            _ => Ok(layout::flat(ck, &rename)),
        })
        .collect::<Result<_>>()?;
    let paired = pair(&params, &map)?;
    let mut results = Vec::new();
    let mut bufs = measure::Buffers::default();
    for &(i, j) in &paired.pairs {
        let (a, b) = (&params[0][i], &params[1][j]);
        check_shapes(&sides, a, b)?;
        let sides2 = (
            Side {
                ck: &sides[0],
                p: a,
            },
            Side {
                ck: &sides[1],
                p: b,
            },
        );
        let m = measure::compare(&sides2.0, &sides2.1, &mut bufs)?;
        results.push(report::ParamResult::new(&sides, [a, b], m, req.tolerance));
    }
    let summary = report::summarize(
        req,
        &sides,
        dims,
        dims_from,
        results,
        paired.only,
        paired.ignored,
    );
    report::write(&req.out, &summary)?;
    Ok(summary)
}

/// The exit code of a summary: 0 when every parameter passes and none is on one side
/// only.
pub(crate) fn exit_code(ok: bool) -> u8 {
    if ok {
        EXIT_PASS
    } else {
        EXIT_FAIL
    }
}

/// Pairs the parameters by name (a name twice on a side is an error), in model order.
fn pair(params: &[Vec<Logical>], map: &Mapping) -> Result<Paired> {
    let mut index: [HashMap<&str, usize>; 2] = [HashMap::new(), HashMap::new()];
    let mut ignored = 0;
    for s in 0..2 {
        for (i, p) in params[s].iter().enumerate() {
            if map.ignored(&p.name) {
                ignored += 1;
                continue;
            }
            if index[s].insert(p.name.as_str(), i).is_some() {
                return Err(ProbeError::CheckpointMismatch {
                    name: p.name.clone(),
                    msg: format!(
                        "two tensors of the {} side have this name (after renames)",
                        ["bench", "cmp"][s]
                    ),
                });
            }
        }
    }
    let mut names: Vec<&str> = index[0].keys().chain(index[1].keys()).copied().collect();
    names.sort_by_cached_key(|n| model_order(n));
    names.dedup();
    let mut out = Paired {
        pairs: Vec::new(),
        only: [Vec::new(), Vec::new()],
        ignored,
    };
    for n in names {
        match (index[0].get(n), index[1].get(n)) {
            (Some(&i), Some(&j)) => out.pairs.push((i, j)),
            (Some(_), None) => out.only[0].push(n.to_string()),
            (None, Some(_)) => out.only[1].push(n.to_string()),
            (None, None) => {}
        }
    }
    Ok(out)
}

/// The sort key of model order: embeddings, then the layers by number (in each, the
/// order a LLaMA block runs: norm, q, k, v, o, norm, gate, up, down), then the final norm
/// and head; other names naturally sorted (numbers by value) among them.
pub(crate) fn model_order(name: &str) -> (u8, u64, u8, Vec<(String, u64)>) {
    const IN_LAYER: &[&str] = &[
        "input_layernorm",
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "post_attention_layernorm",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ];
    let layer = name
        .find("layers.")
        .and_then(|i| name[i + 7..].split('.').next()?.parse::<u64>().ok());
    let group = if name.contains("embed") {
        0
    } else if layer.is_some() {
        1
    } else if name.starts_with("lm_head") || name.contains("output_layer") {
        3
    } else {
        2
    };
    let rank = IN_LAYER
        .iter()
        .position(|s| name.contains(s))
        .unwrap_or(IN_LAYER.len()) as u8;
    (group, layer.unwrap_or(0), rank, natural(name))
}

/// A name as text runs each followed by the number after it (`layers.10` after
/// `layers.9`).
fn natural(name: &str) -> Vec<(String, u64)> {
    let mut key = Vec::new();
    let mut text = String::new();
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            let mut num = c.to_string();
            while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                num.push(*d);
                chars.next();
            }
            key.push((std::mem::take(&mut text), num.parse().unwrap_or(u64::MAX)));
        } else {
            text.push(c);
        }
    }
    key.push((text, 0));
    key
}

/// Both sides' shapes must agree after merging: else a one-line error naming where each
/// came from.
fn check_shapes(sides: &[Checkpoint; 2], a: &Logical, b: &Logical) -> Result<()> {
    if a.shape == b.shape {
        return Ok(());
    }
    let from = |ck: &Checkpoint, p: &Logical| {
        let t = &ck.tensors[p.pieces.first().map(|x| x.src).unwrap_or(0)];
        match ck.layout {
            Layout::Megatron { .. } => format!(
                "merged from {} {}",
                p.pieces.len(),
                report::stored_name(ck, t)
            ),
            _ => report::stored_name(ck, t),
        }
    };
    Err(ProbeError::CheckpointMismatch {
        name: a.name.clone(),
        msg: format!(
            "shape {:?} on the bench side ({}) but {:?} on the cmp side ({}); check the model shape (--mapping [model]) or that both checkpoints are of one model",
            a.shape,
            from(&sides[0], a),
            b.shape,
            from(&sides[1], b)
        ),
    })
}
