//! The capture agent's statistics kernel ([`crate::agent_stats`]) as the shared library
//! `build.rs` compiled, embedded in this binary, and written out for the agent on request
//! (`probe agent-kernel --dir DIR`, which prints the file's path).
//!
//! The file is named by its content (version and CRC-32), so agents of one install share
//! one file, a different build never loads another's, and a file already there with the
//! same bytes is reused; it is written atomically (temp + rename), so an agent never loads
//! half a library while another process writes it.

use crate::atomic;
use crate::error::{ProbeError, Result};
use std::path::{Path, PathBuf};

/// `probe agent-kernel`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// Folder to write the shared library to (created when missing).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
}

/// The kernel's bytes, when `build.rs` could build it for this target.
#[cfg(probe_agent_kernel)]
pub(crate) const KERNEL: Option<&[u8]> =
    Some(include_bytes!(concat!(env!("OUT_DIR"), "/agent_stats.so")));
/// The kernel's bytes, when `build.rs` could build it for this target.
#[cfg(not(probe_agent_kernel))]
pub(crate) const KERNEL: Option<&[u8]> = None;

/// Writes the kernel into `dir` (created when missing) unless the same bytes are there
/// already, and returns its path.
pub fn write_kernel(dir: &Path) -> Result<PathBuf> {
    let bytes = KERNEL.ok_or_else(|| ProbeError::Unsupported {
        path: dir.to_path_buf(),
        msg: "this probe was built without the agent's statistics kernel".into(),
    })?;
    let name = format!(
        "agent-stats-{}-{:08x}.so",
        env!("CARGO_PKG_VERSION"),
        crc32fast::hash(bytes)
    );
    let path = dir.join(name);
    if std::fs::read(&path).is_ok_and(|have| have == bytes) {
        return Ok(path);
    }
    std::fs::create_dir_all(dir).map_err(|e| ProbeError::Output {
        path: dir.to_path_buf(),
        msg: e.to_string(),
    })?;
    atomic::write_bytes(&path, bytes)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_is_written_once_and_reused() {
        let Some(bytes) = KERNEL else {
            return; // a build without the kernel: covered by the agent's fallback tests
        };
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cache");
        let first = write_kernel(&dir).unwrap();
        assert_eq!(std::fs::read(&first).unwrap(), bytes);
        let modified = std::fs::metadata(&first).unwrap().modified().unwrap();
        assert_eq!(write_kernel(&dir).unwrap(), first);
        assert_eq!(
            std::fs::metadata(&first).unwrap().modified().unwrap(),
            modified
        );
        // A damaged file is replaced.
        std::fs::write(&first, b"not a library").unwrap();
        assert_eq!(std::fs::read(write_kernel(&dir).unwrap()).unwrap(), bytes);
    }
}
