//! Atomic output files: write to a temporary file in the destination folder, then rename.
//!
//! A CI job that reads `summary.json` while probe is still writing, or after probe was
//! killed, must never see half a file.

use crate::error::{ProbeError, Result};
use std::io::Write;
use std::path::Path;

/// Writes a file atomically; `fill` receives a buffered writer on the temporary file.
pub fn write_with<F>(path: &Path, fill: F) -> Result<()>
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
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    write_with(path, |w| w.write_all(bytes).map_err(|e| e.to_string()))
}

/// The temporary name used next to `path` (same folder, so the rename cannot cross devices).
pub fn temp_path(path: &Path) -> std::path::PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// Checks before the long work that `dir` exists (creating it) and is writable.
pub fn prepare_output_dir(dir: &Path) -> Result<()> {
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
