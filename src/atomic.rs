//! Atomic output files: write to a temporary file in the destination folder, then rename;
//! and sets of files written all or nothing (`Staging`).
//!
//! A CI job that reads `summary.json` while probe is still writing, or after probe was
//! killed, must never see half a file, nor a new `summary.json` beside the previous run's
//! workbook.

use crate::error::{ProbeError, Result};
use std::io::Write;
use std::path::Path;

/// Writes a file atomically; `fill` receives a buffered writer on the temporary file.
pub(crate) fn write_with<F>(path: &Path, fill: F) -> Result<()>
where
    F: FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::result::Result<(), String>,
{
    let tmp = temp_path(path);
    let out_err = |msg: String| ProbeError::Output {
        path: path.to_path_buf(),
        msg,
    };
    let file = std::fs::File::create(&tmp).map_err(|e| out_err(e.to_string()))?;
    let mut w = std::io::BufWriter::new(file);
    let result = fill(&mut w).and_then(|_| w.flush().map_err(|e| e.to_string()));
    let result = result.and_then(|_| {
        w.get_ref().sync_all().map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, path).map_err(|e| e.to_string())
    });
    if let Err(msg) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(out_err(msg));
    }
    Ok(())
}

/// Writes bytes atomically.
pub(crate) fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    write_with(path, |w| w.write_all(bytes).map_err(|e| e.to_string()))
}

/// The temporary name used next to `path` (same folder, so the rename cannot cross devices).
pub(crate) fn temp_path(path: &Path) -> std::path::PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// Checks before the long work that `dir` exists (creating it) and is writable.
pub(crate) fn prepare_output_dir(dir: &Path) -> Result<()> {
    let err = |msg: String| ProbeError::Output {
        path: dir.to_path_buf(),
        msg,
    };
    if dir.exists() && !dir.is_dir() {
        return Err(err("exists and is not a directory".into()));
    }
    std::fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
    let probe_file = dir.join(format!(".probe-write-test-{}", std::process::id()));
    std::fs::write(&probe_file, b"").map_err(|e| err(format!("not writable: {e}")))?;
    let _ = std::fs::remove_file(&probe_file);
    Ok(())
}

/// A set of output files written all or nothing: each file is first written into a hidden
/// staging folder inside the output folder; [`Staging::commit`] moves them into place only
/// once every one was written. Dropped without a commit (an error on the way), the staging
/// folder is removed and the output folder keeps what it had.
#[derive(Debug)]
pub(crate) struct Staging {
    out: std::path::PathBuf,
    dir: std::path::PathBuf,
}

impl Staging {
    /// Creates the staging folder inside `out` (which must exist).
    pub fn new(out: &Path) -> Result<Staging> {
        let dir = out.join(format!(".probe-staging-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).map_err(|e| ProbeError::Output {
            path: dir.clone(),
            msg: e.to_string(),
        })?;
        Ok(Staging {
            out: out.to_path_buf(),
            dir,
        })
    }

    /// Where to write the file `name` of the set.
    pub(crate) fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.join(name)
    }

    /// Moves every staged file into the output folder (renames in one folder: no copy).
    /// Files are moved in the order given: put the one readers look at first (the summary)
    /// last. Nothing moves if a destination is a directory.
    pub(crate) fn commit(self, names: &[String]) -> Result<()> {
        if let Some(d) = names.iter().map(|n| self.out.join(n)).find(|p| p.is_dir()) {
            return Err(ProbeError::Output {
                path: d,
                msg: "is a directory".into(),
            });
        }
        for name in names {
            let (from, to) = (self.dir.join(name), self.out.join(name));
            std::fs::rename(&from, &to).map_err(|e| ProbeError::Output {
                path: to.clone(),
                msg: e.to_string(),
            })?;
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The absolute form of `p`, resolving symbolic links as far as the path exists.
fn resolved(p: &Path) -> std::path::PathBuf {
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    };
    let mut existing = abs.as_path();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => break,
        }
    }
    let mut out = std::fs::canonicalize(existing).unwrap_or_else(|_| existing.to_path_buf());
    for name in rest.into_iter().rev() {
        out.push(name);
    }
    out
}

/// Refuses an output folder inside one of the input dumps: reports would be written among
/// the dump's files (and read back as part of it by the next compare).
pub(crate) fn refuse_inside(out: &Path, inputs: &[&Path]) -> Result<()> {
    let o = resolved(out);
    for input in inputs {
        let i = resolved(input);
        if i.is_dir() && o.starts_with(&i) {
            return Err(ProbeError::Usage(format!(
                "-o {} is inside the input dump {}: choose an output folder outside it",
                out.display(),
                input.display()
            )));
        }
    }
    Ok(())
}
