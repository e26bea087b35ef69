//! The files of a shard result as `probe merge` reads them: each a regular file (never a
//! device, pipe or folder, through a link or not) of the size `shard.json` gives, read with
//! a cap and checked against its SHA-256 before anything of it is used; and the digest of
//! what a shard's plan read, which tells shards of one run from shards of a dump rewritten
//! between them.

use super::plan::Unit;
use crate::error::{ProbeError, Result};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// The shard result's public file, named in messages.
const HEADER_FILE: &str = "shard.json";

/// The bytes of a plan's input file that enter its digest: all of a small one, the first
/// and last [`SAMPLE`] bytes of a larger one (an op log's first and last records, a
/// safetensors shard's header and last values); nothing of what is not a regular file.
fn sample(path: &Path, len: u64) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let head = len.min(SAMPLE);
    let _ = (&mut f).take(head).read_to_end(&mut out);
    if len > 2 * SAMPLE && f.seek(SeekFrom::Start(len - SAMPLE)).is_ok() {
        let _ = f.take(SAMPLE).read_to_end(&mut out);
    } else if len > head {
        let _ = f.take(len - head).read_to_end(&mut out);
    }
    out
}

/// See [`sample`].
const SAMPLE: u64 = 4096;

/// The SHA-256 of a plan's inputs (see `Frame::dumps_sha256`): each side's path and
/// `manifest.json` (an agent's holds its creation time), and for each planned pair, in
/// order, its label and both folders' regular files: name, size and [`sample`]d bytes. A
/// few KB a file, not the op logs of every rank read by every shard; no modification time,
/// so the same dumps give the same digest (and the same `shard.json`).
pub(crate) fn plan_digest(bench: &Path, cmp: &Path, units: &[Unit]) -> String {
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    let file_len = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len())
    };
    for root in [bench, cmp] {
        field(root.as_os_str().as_encoded_bytes());
        let manifest = root.join("manifest.json");
        let bytes = file_len(&manifest)
            .filter(|&n| n <= crate::config_file::MAX_CONFIG_BYTES)
            .map(|n| sample(&manifest, n))
            .unwrap_or_default();
        field(&bytes);
    }
    for u in units {
        field(format!("{}/{}", u.step, u.rank).as_bytes());
        for dir in [&u.locs.bench.dir, &u.locs.cmp.dir] {
            let mut files: Vec<(String, u64)> = std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| {
                    let len = file_len(&e.path())?;
                    Some((e.file_name().to_string_lossy().into_owned(), len))
                })
                .collect();
            files.sort();
            for (name, len) in files {
                field(name.as_bytes());
                field(&len.to_le_bytes());
                field(&sample(&dir.join(&name), len));
            }
        }
    }
    format!("{:x}", h.finalize())
}

/// The size of a shard file, refused unless it is a regular file (not a device such as
/// `/dev/zero`, a pipe or a folder, through a link or not) of at most `cap` bytes.
pub(super) fn regular_file(path: &Path, cap: u64) -> Result<u64> {
    let bad = |msg: String| ProbeError::BadShardResult {
        path: path.to_path_buf(),
        msg,
    };
    let m = std::fs::metadata(path).map_err(|e| ProbeError::io(path, e))?;
    if !m.is_file() {
        return Err(bad("not a regular file".into()));
    }
    if m.len() > cap {
        return Err(bad(format!(
            "{} bytes, more than the {cap} a shard result's file may have",
            m.len()
        )));
    }
    Ok(m.len())
}

/// A whole shard file of `len` bytes (its size as checked), refusing one that grew.
pub(super) fn read_exactly(path: &Path, len: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| ProbeError::io(path, e))?;
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    f.take(len.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| ProbeError::io(path, e))?;
    if bytes.len() as u64 != len {
        return Err(ProbeError::BadShardResult {
            path: path.to_path_buf(),
            msg: format!("changed while read ({} bytes, not {len})", bytes.len()),
        });
    }
    Ok(bytes)
}

/// SHA-256 of the `len` bytes of a file (its size as checked), read in pieces (a rows file
/// may be larger than memory); a file that is not `len` bytes long is refused.
pub(super) fn sha256_of(path: &Path, len: u64) -> Result<String> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| ProbeError::io(path, e))?;
    let mut f = f.take(len.saturating_add(1));
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut seen = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(|e| ProbeError::io(path, e))?;
        if n == 0 {
            break;
        }
        seen += n as u64;
        hash.update(&buf[..n]);
    }
    if seen != len {
        return Err(ProbeError::BadShardResult {
            path: path.to_path_buf(),
            msg: format!("changed while read ({seen} bytes, not {len})"),
        });
    }
    Ok(format!("{:x}", hash.finalize()))
}

/// A shard file checked against `shard.json`: a regular file of the size and SHA-256 it
/// gives.
pub(super) fn check_file(
    dir: &Path,
    name: &str,
    (len, sum): (u64, &str),
    cap: u64,
) -> Result<PathBuf> {
    let path = dir.join(name);
    let bad = |msg: String| ProbeError::BadShardResult {
        path: dir.to_path_buf(),
        msg,
    };
    let size = regular_file(&path, cap)?;
    if size != len {
        return Err(bad(format!(
            "{name} does not match the checksum in {HEADER_FILE} ({size} bytes, not {len}: \
             truncated, corrupted or replaced)"
        )));
    }
    if sha256_of(&path, len)? != sum {
        return Err(bad(format!(
            "{name} does not match the checksum in {HEADER_FILE} (truncated, corrupted or \
             replaced)"
        )));
    }
    Ok(path)
}
