//! Megatron-style checkpoints: a folder of `mp_rank_TT` (tensor parallel only) or
//! `mp_rank_TT_PPP` (tensor and pipeline parallel) folders, each with one
//! `model_optim_rng.pt` whose `model` entry is that rank's state dict and whose `args`
//! (an `argparse.Namespace`, read as data) records the model's shape.
//!
//! The folder may be the iteration's (`iter_0000010`), or the save folder with
//! `latest_checkpointed_iteration.txt` naming it. Every rank of the TP × PP grid must be
//! there: one missing is an error naming it, never a smaller grid.

use super::source::{self, Checkpoint, Layout, Rank};
use crate::error::{ProbeError, Result};
use crate::tensor::pickle::Node;
use std::path::{Path, PathBuf};

/// The state dict files Megatron writes per rank, in the order looked for.
const RANK_FILES: &[&str] = &["model_optim_rng.pt", "model_rng.pt"];

fn bad(path: &Path, msg: impl Into<String>) -> ProbeError {
    ProbeError::BadCheckpoint {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// `mp_rank_TT` → (TT, 0); `mp_rank_TT_PPP` → (TT, PPP).
fn parse_rank(name: &str) -> Option<Rank> {
    let rest = name.strip_prefix("mp_rank_")?;
    let mut parts = rest.split('_');
    let tp = parts.next()?.parse().ok()?;
    let pp = match parts.next() {
        Some(p) => p.parse().ok()?,
        None => 0,
    };
    parts.next().is_none().then_some(Rank { tp, pp })
}

/// The name Megatron gives a rank's folder.
pub(crate) fn rank_folder(r: Rank, with_pp: bool) -> String {
    if with_pp {
        format!("mp_rank_{:02}_{:03}", r.tp, r.pp)
    } else {
        format!("mp_rank_{:02}", r.tp)
    }
}

/// The iteration folder `latest_checkpointed_iteration.txt` names, if `dir` has one.
fn latest_iteration(dir: &Path) -> Result<Option<PathBuf>> {
    let tracker = dir.join("latest_checkpointed_iteration.txt");
    if !tracker.is_file() {
        return Ok(None);
    }
    let text = crate::config_file::read(&tracker)?;
    let t = text.trim();
    let sub = if t == "release" {
        "release".to_string()
    } else {
        let n: u64 = t
            .parse()
            .map_err(|_| bad(&tracker, format!("{t:?} is not an iteration number")))?;
        format!("iter_{n:07}")
    };
    let p = dir.join(&sub);
    if !p.is_dir() {
        return Err(bad(
            &tracker,
            format!("names iteration folder {sub}, which is missing"),
        ));
    }
    Ok(Some(p))
}

/// The ranks of a Megatron-style folder and each one's state dict file; None when `dir`
/// is not one. A gap in the TP × PP grid, or a rank folder without its file, is an error.
pub(crate) fn find_ranks(dir: &Path) -> Result<Option<Vec<(Rank, PathBuf)>>> {
    if let Some(iter) = latest_iteration(dir)? {
        return find_ranks(&iter);
    }
    let mut found: Vec<(Rank, PathBuf)> = Vec::new();
    let mut with_pp = false;
    for e in std::fs::read_dir(dir).map_err(|e| ProbeError::io(dir, e))? {
        let e = e.map_err(|e| ProbeError::io(dir, e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(r) = parse_rank(&name) {
            with_pp |= name.matches('_').count() == 3;
            found.push((r, e.path()));
        }
    }
    if found.is_empty() {
        return Ok(None);
    }
    found.sort();
    let tp = found.iter().map(|(r, _)| r.tp).max().unwrap_or(0) + 1;
    let pp = found.iter().map(|(r, _)| r.pp).max().unwrap_or(0) + 1;
    let mut out = Vec::new();
    for p in 0..pp {
        for t in 0..tp {
            let r = Rank { tp: t, pp: p };
            let folder = rank_folder(r, with_pp);
            let Some((_, path)) = found.iter().find(|(x, _)| *x == r) else {
                return Err(bad(
                    dir,
                    format!(
                        "shard {folder} is missing (found {} of {tp}×{pp} ranks)",
                        found.len()
                    ),
                ));
            };
            let file = RANK_FILES
                .iter()
                .map(|f| path.join(f))
                .find(|f| f.is_file())
                .ok_or_else(|| bad(path, format!("shard {folder} has no {}", RANK_FILES[0])))?;
            out.push((r, file));
        }
    }
    Ok(Some(out))
}

/// Megatron's `args` settings that describe the model (ints), as `megatron.<name>`.
const ARGS: &[&str] = &[
    "hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "ffn_hidden_size",
    "num_layers",
    "padded_vocab_size",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
];

/// Reads every rank's state dict into `ck`.
pub(crate) fn read(ck: &mut Checkpoint, ranks: &[(Rank, PathBuf)]) -> Result<()> {
    let tp = ranks.iter().map(|(r, _)| r.tp).max().unwrap_or(0) + 1;
    let pp = ranks.iter().map(|(r, _)| r.pp).max().unwrap_or(0) + 1;
    ck.layout = Layout::Megatron { tp, pp };
    for (i, (rank, file)) in ranks.iter().enumerate() {
        let archive = source::open_torch(ck, file)?;
        if archive.tree.get("model0").is_some() {
            return Err(bad(
                file,
                "virtual pipeline stages (model0, model1, ...) are not supported",
            ));
        }
        let model = archive
            .tree
            .get("model")
            .ok_or_else(|| bad(file, "no 'model' entry: not a Megatron checkpoint"))?;
        if i == 0 {
            if let Some(args) = archive.tree.get("args") {
                for k in ARGS {
                    if let Some(Node::Int(v)) = args.get(k) {
                        ck.settings.insert(format!("megatron.{k}"), *v);
                    }
                }
            }
        }
        source::flatten(ck, file, &archive, model, Some(*rank))?;
    }
    for (key, n, what) in [
        ("megatron.tensor_model_parallel_size", tp, "tensor"),
        ("megatron.pipeline_model_parallel_size", pp, "pipeline"),
    ] {
        if let Some(&said) = ck.settings.get(key) {
            if said != n as i64 {
                return Err(bad(
                    &ck.root,
                    format!("args say {what}-parallel size {said}, the folder has {n}: a shard is missing"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_names() {
        assert_eq!(parse_rank("mp_rank_01"), Some(Rank { tp: 1, pp: 0 }));
        assert_eq!(parse_rank("mp_rank_01_003"), Some(Rank { tp: 1, pp: 3 }));
        assert_eq!(parse_rank("mp_rank_x"), None);
        assert_eq!(parse_rank("mp_rank_01_002_3"), None);
        assert_eq!(rank_folder(Rank { tp: 1, pp: 2 }, true), "mp_rank_01_002");
    }
}
