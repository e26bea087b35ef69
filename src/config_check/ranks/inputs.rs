//! One side of a folder comparison: its packs found (a pack, a folder of packs, or a glob),
//! each pack's rank, and the checks that they make one job (docs/config-check.md, "Folders
//! of packs"). Packs are read here for their identity only (manifest, env); the comparison
//! reads them again, a rank at a time.

use super::super::archive;
use super::super::pack::{self, EnvDoc, ManifestDoc};
use crate::error::{ProbeError, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Environment variables naming the job a pack belongs to: two packs that hold different
/// values of one of them come from different jobs. `TORCHELASTIC_RUN_ID` is torchrun's
/// rendezvous id (`none` without one: not compared).
pub(crate) const JOB_VARS: &[&str] = &[
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "PBS_JOBID",
    "LSB_JOBID",
    "MASTER_ADDR",
    "MASTER_PORT",
];

/// One pack of a side.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    /// The pack file.
    pub path: PathBuf,
    /// The rank that wrote it.
    pub rank: u64,
}

/// One side's packs, in rank order, checked to make one job.
#[derive(Debug, Clone)]
pub(crate) struct Side {
    /// The argument as given (a pack, a folder or a glob).
    pub arg: PathBuf,
    /// The packs, one per rank, in rank order.
    pub members: Vec<Member>,
    /// The job's number of ranks, where the packs say (all agree).
    pub world_size: Option<u64>,
    /// What names the job (`TORCHELASTIC_RUN_ID=…`), where the packs say.
    pub job: Option<String>,
    /// Ranks below the world size (or the largest rank) that have no pack.
    pub missing: Vec<u64>,
    /// Files of the folder that are not packs (not `.zip`): not read, and said so.
    pub not_packs: Vec<String>,
}

/// Whether `p` names several packs: a folder, or a glob pattern that is not a file.
pub(crate) fn is_set(p: &Path) -> bool {
    p.is_dir() || (!p.exists() && p.to_string_lossy().contains(['*', '?', '[']))
}

fn is_zip(p: &Path) -> bool {
    p.extension().is_some_and(|e| e.eq_ignore_ascii_case("zip"))
}

fn sorted_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let rd = std::fs::read_dir(dir).map_err(|e| ProbeError::io(dir, e))?;
    let mut out = vec![];
    for e in rd {
        out.push(e.map_err(|e| ProbeError::io(dir, e))?.path());
    }
    out.sort();
    Ok(out)
}

/// `arg` as a glob pattern whose leading folders that exist are taken literally
/// (escaped): only the part below them is a pattern, so `runs/exp[1]/rank*.zip` reads the
/// folder `exp[1]` instead of failing on (or matching) `[1]` as a character class.
fn glob_pattern(arg: &Path) -> String {
    let parts: Vec<_> = arg.components().collect();
    let literal = (0..=parts.len())
        .rev()
        .find(|&n| n == 0 || parts[..n].iter().collect::<PathBuf>().is_dir())
        .unwrap_or(0);
    let head: PathBuf = parts[..literal].iter().collect();
    let tail: PathBuf = parts[literal..].iter().collect();
    let head = glob::Pattern::escape(&head.to_string_lossy());
    Path::new(&head).join(tail).to_string_lossy().into_owned()
}

/// The pack files a side names: a file itself; a folder's `*.zip` files and those of its
/// sub-folders (one level: `rank3/pack.zip`); a glob's matches. Other files of a folder are
/// returned apart, to be reported.
fn discover(arg: &Path) -> Result<(Vec<PathBuf>, Vec<String>)> {
    if arg.is_file() {
        return Ok((vec![arg.to_path_buf()], vec![]));
    }
    let mut packs = vec![];
    let mut others = vec![];
    if arg.is_dir() {
        for p in sorted_dir(arg)? {
            if p.is_dir() {
                for q in sorted_dir(&p)? {
                    if q.is_file() && is_zip(&q) {
                        packs.push(q);
                    }
                }
            } else if is_zip(&p) {
                packs.push(p);
            } else {
                others.push(p.display().to_string());
            }
        }
        if packs.is_empty() {
            return Err(set_error(arg, "no config pack (*.zip) in this folder"));
        }
        return Ok((packs, others));
    }
    let pattern = glob_pattern(arg);
    let paths = glob::glob(&pattern).map_err(|e| {
        ProbeError::Usage(format!("{}: {e}", crate::config_file::printable(&pattern)))
    })?;
    for p in paths {
        let p = p.map_err(|e| ProbeError::io(e.path().to_path_buf(), e.into()))?;
        if p.is_file() {
            packs.push(p);
        }
    }
    if packs.is_empty() {
        return Err(ProbeError::NotFound(arg.to_path_buf()));
    }
    packs.sort();
    Ok((packs, others))
}

/// An error about a side's set of packs (not one job, a rank twice, ...).
pub(crate) fn set_error(arg: &Path, msg: impl Into<String>) -> ProbeError {
    ProbeError::PackSet {
        path: arg.to_path_buf(),
        msg: msg.into(),
    }
}

/// What a pack says about where it comes from.
#[derive(Debug, Clone)]
struct Identity {
    rank: Option<u64>,
    world_size: Option<u64>,
    job: BTreeMap<&'static str, String>,
}

fn identity(path: &Path) -> Result<Identity> {
    let ar = archive::read(path)?;
    let (rank, world_size, env) = if ar.get("manifest.json").is_some() {
        let m: ManifestDoc = ar
            .json("manifest.json")?
            .ok_or_else(|| ar.bad("manifest.json", "missing"))?;
        let env: Option<EnvDoc> = ar.json("env.json")?;
        (
            m.rank,
            m.world_size,
            env.map(|e| e.vars).unwrap_or_default(),
        )
    } else {
        let p = pack::from_archive(&ar)?;
        (p.rank, None, p.env.unwrap_or_default())
    };
    let num = |k: &str| env.get(k).and_then(|v| v.trim().parse::<u64>().ok());
    let mut job = BTreeMap::new();
    for k in JOB_VARS {
        if let Some(v) = env.get(*k) {
            let unset = v.is_empty() || (*k == "TORCHELASTIC_RUN_ID" && v == "none");
            if !unset {
                job.insert(*k, v.clone());
            }
        }
    }
    Ok(Identity {
        rank: rank.or_else(|| num("RANK")),
        world_size: world_size.or_else(|| num("WORLD_SIZE")),
        job,
    })
}

/// `a.zip, b.zip and 3 more`.
fn some_files(files: &[&PathBuf]) -> String {
    let shown: Vec<String> = files
        .iter()
        .take(2)
        .map(|p| p.display().to_string())
        .collect();
    match files.len() {
        n if n > 2 => format!("{} and {} more", shown.join(", "), n - 2),
        _ => shown.join(", "),
    }
}

/// The one value all packs hold for a property, or an error naming the groups.
fn agree<T: Ord + Clone + std::fmt::Display>(
    arg: &Path,
    what: &str,
    values: &[(T, &PathBuf)],
) -> Result<Option<T>> {
    let mut groups: BTreeMap<T, Vec<&PathBuf>> = BTreeMap::new();
    for (v, p) in values {
        groups.entry(v.clone()).or_default().push(p);
    }
    if groups.len() > 1 {
        let parts: Vec<String> = groups
            .iter()
            .map(|(v, ps)| format!("{what} {v} in {}", some_files(ps)))
            .collect();
        return Err(set_error(
            arg,
            format!(
                "packs of different jobs in one side: {}; give each job's packs apart",
                parts.join("; ")
            ),
        ));
    }
    Ok(groups.into_keys().next())
}

/// Reads a side: its packs, their ranks, and checks that they make one job: one world size,
/// one job id, each rank once and below the world size.
pub(crate) fn read_side(arg: &Path) -> Result<Side> {
    let (files, not_packs) = discover(arg)?;
    let ids: Vec<Identity> = {
        use rayon::prelude::*;
        files
            .par_iter()
            .map(|f| identity(f))
            .collect::<Result<Vec<_>>>()?
    };
    let single = files.len() == 1 && !is_set(arg);
    let mut members = vec![];
    for (f, id) in files.iter().zip(&ids) {
        let rank = match id.rank {
            Some(r) => r,
            None if single => 0,
            None => {
                return Err(set_error(
                    arg,
                    format!(
                        "{}: the pack does not say its rank (no manifest rank, no RANK variable, \
                         not one msprobe rank<R> folder)",
                        f.display()
                    ),
                ))
            }
        };
        members.push(Member {
            path: f.clone(),
            rank,
        });
    }
    let sizes: Vec<(u64, &PathBuf)> = ids
        .iter()
        .zip(&files)
        .filter_map(|(id, f)| id.world_size.map(|w| (w, f)))
        .collect();
    let world_size = agree(arg, "world size", &sizes)?;
    let mut job = None;
    for k in JOB_VARS {
        let vals: Vec<(String, &PathBuf)> = ids
            .iter()
            .zip(&files)
            .filter_map(|(id, f)| id.job.get(k).map(|v| (v.clone(), f)))
            .collect();
        if let Some(v) = agree(arg, k, &vals)? {
            job.get_or_insert_with(|| format!("{k}={v}"));
        }
    }
    members.sort_by(|a, b| a.rank.cmp(&b.rank).then(a.path.cmp(&b.path)));
    for w in members.windows(2) {
        if w[0].rank == w[1].rank {
            return Err(set_error(
                arg,
                format!(
                    "two packs of rank {}: {} and {} (packs of two runs in one folder?)",
                    w[0].rank,
                    w[0].path.display(),
                    w[1].path.display()
                ),
            ));
        }
    }
    let mut missing = vec![];
    if !single {
        let top = match (world_size, members.last()) {
            (Some(w), Some(last)) if last.rank >= w => {
                return Err(set_error(
                    arg,
                    format!(
                        "{}: rank {} in a job of world size {w}",
                        last.path.display(),
                        last.rank
                    ),
                ))
            }
            (Some(w), _) => w,
            (None, Some(last)) => last.rank + 1,
            (None, None) => 0,
        };
        let have: std::collections::BTreeSet<u64> = members.iter().map(|m| m.rank).collect();
        missing = (0..top).filter(|r| !have.contains(r)).collect();
    }
    Ok(Side {
        arg: arg.to_path_buf(),
        members,
        world_size,
        job,
        missing,
        not_packs,
    })
}

/// `0-35,37,40-63`: ranks (sorted) as ranges.
pub fn ranges(ranks: &[u64]) -> String {
    let mut out: Vec<String> = vec![];
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if j > i {
            format!("{}-{}", ranks[i], ranks[j])
        } else {
            ranks[i].to_string()
        });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_ranges() {
        assert_eq!(ranges(&[0, 1, 2, 4, 6, 7]), "0-2,4,6-7");
        assert_eq!(ranges(&[]), "");
        assert_eq!(ranges(&[5]), "5");
    }

    #[test]
    fn sets_are_folders_and_patterns() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(is_set(tmp.path()));
        assert!(is_set(&tmp.path().join("rank*.zip")));
        assert!(!is_set(&tmp.path().join("rank0.zip")));
    }
}
