//! Logical parameters: what both sides are compared as. A logical parameter is a matrix
//! (dimension 0 × the product of the others) tiled by [`Piece`]s, each a block of whole
//! rows of one stored tensor placed at a row and column of the logical matrix. A flat
//! checkpoint's tensor is one piece; a Megatron parameter is the pieces of its TP shards,
//! renamed to the HF LLaMA/Qwen name:
//!
//! | Megatron (legacy / core) | HF | how the TP shards merge |
//! |---|---|---|
//! | `query_key_value` / `linear_qkv` | `q_proj`, `k_proj`, `v_proj` | per rank `[groups/tp, (heads/groups + 2), head_dim]` rows: per group its q heads, then k, then v |
//! | `dense` / `linear_proj` | `o_proj` | columns (row-parallel) |
//! | `dense_h_to_4h` / `linear_fc1` | `gate_proj`, `up_proj` | per rank `[gate shard; up shard]` rows |
//! | `dense_4h_to_h` / `linear_fc2` | `down_proj` | columns |
//! | `word_embeddings`, `output_layer` | `embed_tokens`, `lm_head` | rows (vocab), padding rows past the vocab dropped |
//! | norms | norms | replicated: rank 0's, the others checked equal |
//!
//! Pipeline stages number their layers from 0; stage p's layers follow stage p−1's.

use super::source::{Checkpoint, Rank, Stored};
use crate::dtype::DType;
use crate::error::{ProbeError, Result};
use std::collections::BTreeMap;

/// A block of whole rows of a stored tensor, placed in a logical parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The stored tensor (index into [`Checkpoint::tensors`]).
    pub src: usize,
    /// First row of the stored tensor taken.
    pub src_row: usize,
    /// Rows taken.
    pub rows: usize,
    /// Where the block goes: logical row ...
    pub row: usize,
    /// ... and column; the block is as wide as the stored tensor.
    pub col: usize,
}

/// One logical parameter of a side.
#[derive(Debug, Clone)]
pub struct Logical {
    /// Its name (HF names for a Megatron side).
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Rows (dimension 0) ...
    pub rows: usize,
    /// ... and columns (the product of the other dimensions) of its matrix.
    pub cols: usize,
    /// Element type (every piece's).
    pub dtype: DType,
    /// The blocks that tile it.
    pub pieces: Vec<Piece>,
    /// Copies that must be equal to the pieces' tensor (a replicated parameter's other TP
    /// ranks).
    pub replicas: Vec<usize>,
    /// What the merge left out (Megatron's vocabulary padding), for the report.
    pub note: Option<String>,
}

/// The model's shape, as far as a Megatron mapping needs it.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Dims {
    /// Attention heads.
    pub heads: Option<usize>,
    /// Key/value heads (query groups).
    pub kv_heads: Option<usize>,
    /// Size of one head.
    pub head_dim: Option<usize>,
    /// Rows of the unpadded vocabulary.
    pub vocab: Option<usize>,
}

fn bad(ck: &Checkpoint, msg: impl Into<String>) -> ProbeError {
    ProbeError::BadCheckpoint {
        path: ck.root.clone(),
        msg: msg.into(),
    }
}

/// A flat checkpoint's parameters: one per stored tensor, renamed.
pub fn flat(ck: &Checkpoint, rename: &dyn Fn(&str) -> String) -> Vec<Logical> {
    ck.tensors
        .iter()
        .enumerate()
        .map(|(i, t)| whole(i, t, rename(&t.name)))
        .collect()
}

fn whole(i: usize, t: &Stored, name: String) -> Logical {
    let (rows, cols) = t.rows_cols();
    Logical {
        name,
        shape: t.shape.clone(),
        rows,
        cols,
        dtype: t.dtype,
        pieces: vec![Piece {
            src: i,
            src_row: 0,
            rows,
            row: 0,
            col: 0,
        }],
        replicas: Vec::new(),
        note: None,
    }
}

/// How a Megatron tensor merges across TP ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Merge {
    Replicated,
    Qkv,
    GateUp,
    Columns,
    Vocab,
}

/// A Megatron name (after `language_model.`, `encoder.`/`decoder.` are stripped) → its
/// layer (None outside the layers), the HF name's tail and how it merges.
fn megatron_name(name: &str) -> Option<(Option<usize>, &'static str, Merge)> {
    let n = name.strip_prefix("language_model.").unwrap_or(name);
    let n = n
        .strip_prefix("encoder.")
        .or_else(|| n.strip_prefix("decoder."))
        .unwrap_or(n);
    if let Some(rest) = n.strip_prefix("layers.") {
        let (num, suffix) = rest.split_once('.')?;
        let layer: usize = num.parse().ok()?;
        use Merge::*;
        let (hf, m) = match suffix {
            "input_norm.weight"
            | "input_layernorm.weight"
            | "self_attention.linear_qkv.layer_norm_weight" => {
                ("input_layernorm.weight", Replicated)
            }
            "post_attention_norm.weight"
            | "post_attention_layernorm.weight"
            | "pre_mlp_layernorm.weight"
            | "mlp.linear_fc1.layer_norm_weight" => ("post_attention_layernorm.weight", Replicated),
            "self_attention.query_key_value.weight" | "self_attention.linear_qkv.weight" => {
                ("self_attn.{}_proj.weight", Qkv)
            }
            "self_attention.query_key_value.bias" | "self_attention.linear_qkv.bias" => {
                ("self_attn.{}_proj.bias", Qkv)
            }
            "self_attention.dense.weight" | "self_attention.linear_proj.weight" => {
                ("self_attn.o_proj.weight", Columns)
            }
            "self_attention.dense.bias" | "self_attention.linear_proj.bias" => {
                ("self_attn.o_proj.bias", Replicated)
            }
            "mlp.dense_h_to_4h.weight" | "mlp.linear_fc1.weight" => ("mlp.{}_proj.weight", GateUp),
            "mlp.dense_4h_to_h.weight" | "mlp.linear_fc2.weight" => {
                ("mlp.down_proj.weight", Columns)
            }
            "mlp.dense_4h_to_h.bias" | "mlp.linear_fc2.bias" => ("mlp.down_proj.bias", Replicated),
            _ => return None,
        };
        return Some((Some(layer), hf, m));
    }
    Some(match n {
        "embedding.word_embeddings.weight" => (None, "model.embed_tokens.weight", Merge::Vocab),
        "final_norm.weight" | "final_layernorm.weight" => {
            (None, "model.norm.weight", Merge::Replicated)
        }
        "output_layer.weight" => (None, "lm_head.weight", Merge::Vocab),
        _ => return None,
    })
}

/// Whether a Megatron entry is not a parameter (TransformerEngine's `_extra_state`).
fn non_parameter(name: &str) -> bool {
    name.ends_with("._extra_state") || name.ends_with(".inv_freq")
}

/// A Megatron checkpoint's parameters under HF names (`tp` ranks merged, `pp` stages'
/// layers renumbered), by the rules of this module; `dims` as far as known. Names the
/// mapping does not know stay as stored, one logical parameter per rank (`name@tpT_ppP`),
/// so they are reported, not dropped.
pub fn megatron(
    ck: &Checkpoint,
    tp: usize,
    dims: &Dims,
    rename: &dyn Fn(&str) -> String,
) -> Result<Vec<Logical>> {
    let offsets = stage_offsets(ck);
    // (HF name pattern, layer, merge) → the TP ranks' tensors.
    let mut groups: BTreeMap<GroupKey, Vec<(usize, usize)>> = BTreeMap::new();
    let mut out = Vec::new();
    for (i, t) in ck.tensors.iter().enumerate() {
        let rank = t.rank.unwrap_or(Rank { tp: 0, pp: 0 });
        if non_parameter(&t.name) {
            continue;
        }
        match megatron_name(&t.name) {
            Some((layer, hf, m)) => {
                let layer = layer.map(|l| l + offsets.get(&rank.pp).copied().unwrap_or(0));
                groups.entry((layer, hf, m)).or_default().push((rank.tp, i));
            }
            None => out.push(whole(
                i,
                t,
                rename(&format!("{}@tp{}_pp{}", t.name, rank.tp, rank.pp)),
            )),
        }
    }
    for ((layer, hf, m), mut shards) in groups {
        shards.sort();
        let tps: Vec<usize> = shards.iter().map(|s| s.0).collect();
        let name = |part: &str| {
            let tail = hf.replace("{}", part);
            rename(&match layer {
                Some(l) => format!("model.layers.{l}.{tail}"),
                None => tail,
            })
        };
        if tps != (0..tp).collect::<Vec<_>>() {
            return Err(bad(
                ck,
                format!("{}: tensor-parallel shards {tps:?} of 0..{tp}", name("qkv")),
            ));
        }
        let srcs: Vec<usize> = shards.iter().map(|s| s.1).collect();
        let same = check_same_shape(ck, &srcs, &name("qkv"))?;
        match m {
            Merge::Replicated => out.push(replicated(ck, &srcs, name(""))),
            Merge::Columns => out.push(columns(ck, &srcs, same, name(""))),
            Merge::Vocab => out.push(vocab(ck, &srcs, same, dims.vocab, name(""))),
            Merge::GateUp => out.extend(gate_up(ck, &srcs, same, [name("gate"), name("up")])),
            Merge::Qkv => out.extend(qkv(
                ck,
                &srcs,
                same,
                dims,
                [name("q"), name("k"), name("v")],
            )?),
        }
    }
    for l in &out {
        check_tiling(ck, l)?;
    }
    Ok(out)
}

/// The pieces of a parameter lie inside it and their stored tensors, and cover it: every
/// byte a block read writes is a piece's (the constructors above never overlap pieces).
pub(crate) fn check_tiling(ck: &Checkpoint, l: &Logical) -> Result<()> {
    let mut area = 0usize;
    for pc in &l.pieces {
        let (rows, cols) = ck.tensors[pc.src].rows_cols();
        let inside =
            pc.src_row + pc.rows <= rows && pc.row + pc.rows <= l.rows && pc.col + cols <= l.cols;
        if !inside {
            return Err(bad(
                ck,
                format!(
                    "{}: a shard does not fit the merged shape {:?}",
                    l.name, l.shape
                ),
            ));
        }
        area += pc.rows * cols;
    }
    if area != l.rows * l.cols {
        return Err(bad(
            ck,
            format!(
                "{}: the shards cover {area} of {} elements",
                l.name,
                l.rows * l.cols
            ),
        ));
    }
    Ok(())
}

/// A Megatron parameter: its layer, HF name pattern and merge.
type GroupKey = (Option<usize>, &'static str, Merge);

/// The first layer number of each pipeline stage: the number of layers of the stages
/// before it (stages number their layers from 0), or 0 where a stage's numbers already
/// continue the previous stage's.
fn stage_offsets(ck: &Checkpoint) -> BTreeMap<usize, usize> {
    let mut layers: BTreeMap<usize, std::collections::BTreeSet<usize>> = BTreeMap::new();
    for t in &ck.tensors {
        if let (Some((Some(l), _, _)), Some(r)) = (megatron_name(&t.name), t.rank) {
            layers.entry(r.pp).or_default().insert(l);
        }
    }
    let mut out = BTreeMap::new();
    let mut next = 0;
    for (pp, ls) in &layers {
        let first = ls.first().copied().unwrap_or(0);
        out.insert(*pp, if first >= next && first > 0 { 0 } else { next });
        next = out[pp] + ls.last().copied().unwrap_or(0) + 1;
    }
    out
}

/// Checks that a parameter's TP shards have one shape and dtype; that shape's (rows, cols).
fn check_same_shape(ck: &Checkpoint, srcs: &[usize], name: &str) -> Result<(usize, usize)> {
    let first = &ck.tensors[srcs[0]];
    for &s in &srcs[1..] {
        let t = &ck.tensors[s];
        if t.shape != first.shape || t.dtype != first.dtype {
            return Err(bad(
                ck,
                format!(
                    "{name}: TP shards differ: {} is {:?} {}, {} is {:?} {}",
                    first.name, first.shape, first.dtype, t.name, t.shape, t.dtype
                ),
            ));
        }
    }
    Ok(first.rows_cols())
}

fn logical(name: String, shape: Vec<usize>, dtype: DType, pieces: Vec<Piece>) -> Logical {
    let rows = shape.first().copied().unwrap_or(1);
    let cols = shape
        .iter()
        .product::<usize>()
        .checked_div(rows)
        .unwrap_or(0);
    Logical {
        name,
        shape,
        rows,
        cols,
        dtype,
        pieces,
        replicas: Vec::new(),
        note: None,
    }
}

fn replicated(ck: &Checkpoint, srcs: &[usize], name: String) -> Logical {
    let mut l = whole(srcs[0], &ck.tensors[srcs[0]], name);
    l.replicas = srcs[1..].to_vec();
    l
}

/// Row-parallel: the shards side by side (dimension 1 split; 2-D tensors).
fn columns(ck: &Checkpoint, srcs: &[usize], (rows, cols): (usize, usize), name: String) -> Logical {
    let t = &ck.tensors[srcs[0]];
    let mut shape = t.shape.clone();
    if shape.len() >= 2 {
        shape[1] *= srcs.len();
    }
    let pieces = (0..srcs.len())
        .map(|k| Piece {
            src: srcs[k],
            src_row: 0,
            rows,
            row: 0,
            col: k * cols,
        })
        .collect();
    logical(name, shape, t.dtype, pieces)
}

/// Vocabulary-parallel: the shards stacked, rows from `vocab` on (padding) dropped.
fn vocab(
    ck: &Checkpoint,
    srcs: &[usize],
    (rows, _): (usize, usize),
    vocab: Option<usize>,
    name: String,
) -> Logical {
    let t = &ck.tensors[srcs[0]];
    let padded = rows * srcs.len();
    let keep = vocab.unwrap_or(padded).min(padded);
    let mut shape = t.shape.clone();
    shape[0] = keep;
    let pieces = (0..srcs.len())
        .filter(|k| k * rows < keep)
        .map(|k| Piece {
            src: srcs[k],
            src_row: 0,
            rows: rows.min(keep - k * rows),
            row: k * rows,
            col: 0,
        })
        .collect();
    let mut l = logical(name, shape, t.dtype, pieces);
    if keep < padded {
        l.note = Some(format!(
            "rows {keep}..{padded} of the merged shards (vocabulary padding) not compared"
        ));
    }
    l
}

/// `[gate shard; up shard]` per rank → gate and up.
fn gate_up(
    ck: &Checkpoint,
    srcs: &[usize],
    (rows, _): (usize, usize),
    names: [String; 2],
) -> Vec<Logical> {
    let t = &ck.tensors[srcs[0]];
    let half = rows / 2;
    let mut shape = t.shape.clone();
    shape[0] = half * srcs.len();
    names
        .into_iter()
        .enumerate()
        .map(|(part, name)| {
            let pieces = (0..srcs.len())
                .map(|k| Piece {
                    src: srcs[k],
                    src_row: part * half,
                    rows: half,
                    row: k * half,
                    col: 0,
                })
                .collect();
            logical(name, shape.clone(), t.dtype, pieces)
        })
        .collect()
}

/// The fused QKV of each rank → q, k and v (see the module's table).
fn qkv(
    ck: &Checkpoint,
    srcs: &[usize],
    (rows, _): (usize, usize),
    dims: &Dims,
    names: [String; 3],
) -> Result<Vec<Logical>> {
    let t = &ck.tensors[srcs[0]];
    let need = |v: Option<usize>, what: &str| {
        v.filter(|&x| x > 0).ok_or_else(|| {
            bad(
                ck,
                format!(
                    "{}: cannot split the fused QKV without the number of {what}: give it in --mapping FILE.toml ([model] {}) or put the HF config.json beside a side",
                    names[0],
                    if what == "attention heads" { "heads" } else if what == "key/value heads" { "kv_heads" } else { "head_dim" }
                ),
            )
        })
    };
    let heads = need(dims.heads, "attention heads")?;
    let groups = need(dims.kv_heads, "key/value heads")?;
    let d = need(dims.head_dim, "head size")?;
    let tp = srcs.len();
    if heads % groups != 0 || groups % tp != 0 {
        return Err(bad(
            ck,
            format!(
                "{}: {heads} heads in {groups} groups cannot be split over {tp} ranks",
                names[0]
            ),
        ));
    }
    let qpg = heads / groups;
    let per_rank = groups / tp;
    if rows != per_rank * (qpg + 2) * d {
        return Err(bad(
            ck,
            format!(
                "{}: {} has {rows} rows; {heads} heads, {groups} key/value heads of size {d} over {tp} ranks make {}",
                names[0],
                t.name,
                per_rank * (qpg + 2) * d
            ),
        ));
    }
    let mut out = Vec::new();
    for (part, name) in names.into_iter().enumerate() {
        let (take, at) = match part {
            0 => (qpg * d, 0),
            1 => (d, qpg * d),
            _ => (d, (qpg + 1) * d),
        };
        let pieces = (0..groups)
            .map(|g| Piece {
                src: srcs[g / per_rank],
                src_row: (g % per_rank) * (qpg + 2) * d + at,
                rows: take,
                row: g * take,
                col: 0,
            })
            .collect();
        let mut shape = t.shape.clone();
        shape[0] = take * groups;
        out.push(logical(name, shape, t.dtype, pieces));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_hf() {
        let m =
            megatron_name("language_model.encoder.layers.3.self_attention.query_key_value.weight");
        assert_eq!(m, Some((Some(3), "self_attn.{}_proj.weight", Merge::Qkv)));
        let m = megatron_name("decoder.layers.0.mlp.linear_fc2.weight");
        assert_eq!(m, Some((Some(0), "mlp.down_proj.weight", Merge::Columns)));
        assert_eq!(
            megatron_name("language_model.embedding.word_embeddings.weight").map(|m| m.1),
            Some("model.embed_tokens.weight")
        );
        assert_eq!(megatron_name("something.else"), None);
    }
}

#[cfg(test)]
mod merge_tests {
    use super::*;
    use crate::ckpt::source::{Checkpoint, Layout, Rank, Stored};

    fn ck(shapes: &[(&str, usize, Vec<usize>)]) -> Checkpoint {
        Checkpoint {
            root: "x".into(),
            layout: Layout::Megatron { tp: 2, pp: 1 },
            files: Vec::new(),
            tensors: shapes
                .iter()
                .map(|(n, tp, s)| Stored {
                    name: n.to_string(),
                    file: 0,
                    offset: 0,
                    dtype: DType::F32,
                    shape: s.clone(),
                    rank: Some(Rank { tp: *tp, pp: 0 }),
                })
                .collect(),
            settings: BTreeMap::new(),
            non_parameters: 0,
            logical: Vec::new(),
        }
    }

    /// Rebuilds a logical matrix from its pieces over per-tensor matrices of numbers.
    fn assemble(l: &Logical, ck: &Checkpoint, data: &[Vec<f32>]) -> Vec<f32> {
        let mut out = vec![f32::NAN; l.rows * l.cols];
        for pc in &l.pieces {
            let (_, w) = ck.tensors[pc.src].rows_cols();
            for r in 0..pc.rows {
                for c in 0..w {
                    out[(pc.row + r) * l.cols + pc.col + c] =
                        data[pc.src][(pc.src_row + r) * w + c];
                }
            }
        }
        out
    }

    #[test]
    fn qkv_gqa_over_two_ranks() {
        // 4 heads in 2 groups of size-2 heads, hidden 3: per rank 1 group of (2 q + k + v) heads.
        let name = "language_model.encoder.layers.0.self_attention.query_key_value.weight";
        let c = ck(&[(name, 0, vec![8, 3]), (name, 1, vec![8, 3])]);
        let dims = Dims {
            heads: Some(4),
            kv_heads: Some(2),
            head_dim: Some(2),
            vocab: None,
        };
        let ls = megatron(&c, 2, &dims, &|n| n.to_string()).unwrap();
        let names: Vec<&str> = ls.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "model.layers.0.self_attn.q_proj.weight",
                "model.layers.0.self_attn.k_proj.weight",
                "model.layers.0.self_attn.v_proj.weight"
            ]
        );
        // Row r of rank t holds the value 100 t + r in every column.
        let data: Vec<Vec<f32>> = (0..2)
            .map(|t| (0..24).map(|i| (100 * t + i / 3) as f32).collect())
            .collect();
        let col0 = |l: &Logical| {
            assemble(l, &c, &data)
                .chunks(3)
                .map(|r| r[0])
                .collect::<Vec<_>>()
        };
        assert_eq!(col0(&ls[0]), [0., 1., 2., 3., 100., 101., 102., 103.]);
        assert_eq!(col0(&ls[1]), [4., 5., 104., 105.]);
        assert_eq!(col0(&ls[2]), [6., 7., 106., 107.]);
        assert_eq!(ls[0].shape, [8, 3]);
        assert_eq!(ls[1].shape, [4, 3]);
    }

    #[test]
    fn gate_up_columns_and_vocab() {
        let fc1 = "decoder.layers.1.mlp.linear_fc1.weight";
        let fc2 = "decoder.layers.1.mlp.linear_fc2.weight";
        let emb = "embedding.word_embeddings.weight";
        let c = ck(&[
            (fc1, 0, vec![4, 2]),
            (fc1, 1, vec![4, 2]),
            (fc2, 0, vec![2, 3]),
            (fc2, 1, vec![2, 3]),
            (emb, 0, vec![4, 2]),
            (emb, 1, vec![4, 2]),
        ]);
        let dims = Dims {
            vocab: Some(6),
            ..Dims::default()
        };
        let ls = megatron(&c, 2, &dims, &|n| n.to_string()).unwrap();
        let by = |n: &str| ls.iter().find(|l| l.name == n).unwrap();
        let data: Vec<Vec<f32>> = (0..6)
            .map(|t| (0..8).map(|i| (100 * t + i) as f32).collect())
            .collect();
        // gate: rank 0 rows 0..2, rank 1 rows 0..2; up: their rows 2..4.
        assert_eq!(
            assemble(by("model.layers.1.mlp.gate_proj.weight"), &c, &data),
            [0., 1., 2., 3., 100., 101., 102., 103.]
        );
        assert_eq!(
            assemble(by("model.layers.1.mlp.up_proj.weight"), &c, &data),
            [4., 5., 6., 7., 104., 105., 106., 107.]
        );
        // down: the two [2, 3] shards side by side.
        let down = by("model.layers.1.mlp.down_proj.weight");
        assert_eq!(down.shape, [2, 6]);
        assert_eq!(
            assemble(down, &c, &data),
            [200., 201., 202., 300., 301., 302., 203., 204., 205., 303., 304., 305.]
        );
        // embeddings: 8 padded rows, 6 kept.
        let e = by("model.embed_tokens.weight");
        assert_eq!(e.shape, [6, 2]);
        assert_eq!(
            assemble(e, &c, &data),
            [400., 401., 402., 403., 404., 405., 406., 407., 500., 501., 502., 503.]
        );
        assert!(e.note.as_deref().unwrap().contains("6..8"));
    }

    #[test]
    fn missing_tp_rank_and_unknown_shape_are_errors() {
        let name = "language_model.encoder.layers.0.self_attention.dense.weight";
        let c = ck(&[(name, 0, vec![2, 2])]);
        let e = megatron(&c, 2, &Dims::default(), &|n| n.to_string())
            .unwrap_err()
            .to_string();
        assert!(e.contains("o_proj") && e.contains("[0]"), "{e}");
        let qkv = "language_model.encoder.layers.0.self_attention.query_key_value.weight";
        let c = ck(&[(qkv, 0, vec![8, 3]), (qkv, 1, vec![8, 3])]);
        let e = megatron(&c, 2, &Dims::default(), &|n| n.to_string())
            .unwrap_err()
            .to_string();
        assert!(e.contains("--mapping"), "{e}");
    }
}
