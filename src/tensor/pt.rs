//! A safe reader for tensors saved with `torch.save` (the `.pt` files of msprobe dumps,
//! and checkpoints: [`read_archive`]).
//!
//! A `.pt` file is a zip archive holding `<name>/data.pkl` (a pickle describing the object)
//! and one raw, uncompressed entry `<name>/data/<key>` per storage. The pickle is run by a
//! small interpreter ([`super::pickle`]) that knows only the opcodes and the handful of
//! globals a saved tensor needs (`torch._utils._rebuild_tensor_v2` of a typed storage,
//! `collections.OrderedDict`, the `torch.*Storage` classes). It never imports or calls
//! anything: a global it does not know is an error naming the file. The tensor's bytes are
//! not read here; [`read`] returns where they lie in the file, so compare reads them window
//! by window like any other tensor.

use super::pickle::{self, Node};
use crate::dtype::DType;
use crate::error::{ProbeError, Result};
use std::io::{Read, Seek};
use std::path::Path;

pub use super::pickle::PickledTensor;

/// Largest `data.pkl` accepted: a saved tensor's pickle is a few hundred bytes.
const MAX_PICKLE: u64 = 16 << 20;
/// Largest checkpoint `data.pkl` accepted: a few dozen bytes a tensor, more with an
/// optimizer's state.
const MAX_CHECKPOINT_PICKLE: u64 = 1 << 30;

/// Runs the restricted pickle machine over `data.pkl` and returns the tensor it builds.
pub fn parse_pickle(bytes: &[u8]) -> std::result::Result<PickledTensor, String> {
    pickle::parse_one(bytes).map_err(crate::error::one_line)
}

/// A tensor inside a `.pt` file, located and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct PtTensor {
    /// Element type.
    pub dtype: DType,
    /// Size of each dimension.
    pub shape: Vec<usize>,
    /// Number of elements (the product of `shape`).
    pub numel: usize,
    /// Absolute byte offset of the first element in the file.
    pub offset: u64,
}

fn contiguous(shape: &[usize], stride: &[i64]) -> bool {
    let mut expect: i64 = 1;
    for (&d, &s) in shape.iter().zip(stride).rev() {
        if d != 1 && s != expect {
            return false;
        }
        expect = expect.saturating_mul(d as i64);
    }
    true
}

/// Reads the description of the tensor saved in `path` and where its bytes are.
///
/// `dtype_hint` is the dtype the dump records: used only for an untyped storage, whose
/// element type the file does not say.
pub fn read(path: &Path, dtype_hint: Option<DType>) -> Result<PtTensor> {
    let file = std::fs::File::open(path).map_err(|e| ProbeError::io(path, e))?;
    let file_len = file.metadata().map_err(|e| ProbeError::io(path, e))?.len();
    read_from(std::io::BufReader::new(file), file_len, path, dtype_hint)
}

/// [`read`] over any seekable reader holding the whole `.pt` file (`file_len` bytes):
/// the zip directory, `data.pkl` through [`parse_pickle`], the storage entry. `path` only
/// names the file in errors. Public for tools and fuzzing (a `Cursor` over bytes).
pub fn read_from<R: Read + Seek>(
    reader: R,
    file_len: u64,
    path: &Path,
    dtype_hint: Option<DType>,
) -> Result<PtTensor> {
    let bad = |msg: String| ProbeError::BadTensorFile {
        path: path.to_path_buf(),
        msg,
    };
    let (mut zip, prefix, pickle) = open_archive(reader, path, MAX_PICKLE)?;
    let (pkl_name, pickle) = pickle;
    let t = parse_pickle(&pickle).map_err(|m| bad(format!("{pkl_name}: {m}")))?;
    let entry = format!("{prefix}data/{}", t.storage_key);
    let e = zip
        .by_name(&entry)
        .map_err(|e| bad(format!("storage entry {entry}: {e}")))?;
    let storage = storage_of(&e, &entry, file_len, path)?;
    locate(&t, storage, dtype_hint, path)
}

/// A storage entry of a `.pt` archive: where its bytes start in the file, how many.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Storage {
    /// Absolute byte offset of the entry's data in the file.
    pub start: u64,
    /// Bytes in the entry.
    pub size: u64,
}

/// A checkpoint saved with `torch.save` (a state dict, Megatron's `model_optim_rng.pt`):
/// the object its pickle builds and where each storage lies. Tensors are located on
/// demand ([`Archive::locate`]); no tensor byte is read.
#[derive(Debug, Clone)]
pub struct Archive {
    /// What the pickle built (tensors not yet located).
    pub tree: Node,
    storages: std::collections::HashMap<String, Storage>,
}

impl Archive {
    /// Where the bytes of `t` lie in the file, checked against its storage.
    pub fn locate(&self, t: &PickledTensor, path: &Path) -> Result<PtTensor> {
        let s = self
            .storages
            .get(&t.storage_key)
            .ok_or_else(|| ProbeError::BadTensorFile {
                path: path.to_path_buf(),
                msg: format!("no storage entry data/{} in the archive", t.storage_key),
            })?;
        locate(t, *s, None, path)
    }
}

/// Reads a checkpoint's pickle (restricted: opaque objects are never constructed) and its
/// storage entries. `path` only names the file in errors.
pub fn read_archive<R: Read + Seek>(reader: R, file_len: u64, path: &Path) -> Result<Archive> {
    let bad = |msg: String| ProbeError::BadTensorFile {
        path: path.to_path_buf(),
        msg,
    };
    let (mut zip, prefix, (pkl_name, pickle)) = open_archive(reader, path, MAX_CHECKPOINT_PICKLE)?;
    let tree = pickle::parse_tree(&pickle).map_err(|m| bad(format!("{pkl_name}: {m}")))?;
    drop(pickle);
    let data = format!("{prefix}data/");
    let mut storages = std::collections::HashMap::new();
    for i in 0..zip.len() {
        let e = zip
            .by_index_raw(i)
            .map_err(|e| bad(format!("entry {i}: {e}")))?;
        let Ok(name) = e.name().map(|n| n.into_owned()) else {
            continue;
        };
        if let Some(key) = name.strip_prefix(&data) {
            let s = storage_of(&e, &name, file_len, path)?;
            storages.insert(key.to_string(), s);
        }
    }
    Ok(Archive { tree, storages })
}

/// Opens a `torch.save` zip: the archive, its `<prefix>/` and `(name, bytes)` of its
/// `data.pkl` (at most `max_pickle` bytes), after checking the byte order.
#[allow(clippy::type_complexity)]
fn open_archive<R: Read + Seek>(
    reader: R,
    path: &Path,
    max_pickle: u64,
) -> Result<(zip::ZipArchive<R>, String, (String, Vec<u8>))> {
    let bad = |msg: String| ProbeError::BadTensorFile {
        path: path.to_path_buf(),
        msg,
    };
    // torch.save archives start at offset 0: saying so spares zip's search for the
    // archive start, which reads most of the file in small pieces.
    let config = zip::read::Config {
        archive_offset: zip::read::ArchiveOffset::Known(0),
    };
    let mut zip = zip::ZipArchive::with_config(config, reader).map_err(|e| {
        bad(format!(
            "not a torch.save zip archive ({e}); legacy (pre-1.6) .pt files are not supported"
        ))
    })?;
    let pkl_name = zip
        .file_names()
        .filter_map(|n| n.ok())
        .find(|n| {
            n.strip_suffix("data.pkl")
                .is_some_and(|p| p.ends_with('/') && p.matches('/').count() == 1)
        })
        .map(|n| n.into_owned())
        .ok_or_else(|| bad("no <archive>/data.pkl entry".into()))?;
    let prefix = pkl_name.trim_end_matches("data.pkl").to_string();
    let pickle = {
        let e = zip
            .by_name(&pkl_name)
            .map_err(|e| bad(format!("{pkl_name}: {e}")))?;
        if e.size() > max_pickle {
            return Err(bad(format!("{pkl_name} is {} bytes: too large", e.size())));
        }
        let mut buf = Vec::with_capacity(e.size() as usize);
        e.take(max_pickle)
            .read_to_end(&mut buf)
            .map_err(|e| bad(format!("{pkl_name}: {e}")))?;
        buf
    };
    if let Ok(mut e) = zip.by_name(&format!("{prefix}byteorder")) {
        let mut s = String::new();
        let _ = (&mut e).take(16).read_to_string(&mut s);
        if s.trim() != "little" {
            return Err(ProbeError::Unsupported {
                path: path.to_path_buf(),
                msg: format!(
                    "byte order {:?}; only little-endian files are read",
                    s.trim()
                ),
            });
        }
    }
    Ok((zip, prefix, (pkl_name, pickle)))
}

/// A storage entry checked: stored uncompressed, inside the file.
fn storage_of<R: Read>(
    e: &zip::read::ZipFile<'_, R>,
    entry: &str,
    file_len: u64,
    path: &Path,
) -> Result<Storage> {
    if e.compression() != zip::CompressionMethod::Stored {
        return Err(ProbeError::Unsupported {
            path: path.to_path_buf(),
            msg: format!(
                "storage entry {entry} is compressed ({}); torch.save stores storages uncompressed",
                e.compression()
            ),
        });
    }
    let bad = |msg: String| ProbeError::BadTensorFile {
        path: path.to_path_buf(),
        msg,
    };
    let start = e
        .data_start()
        .ok_or_else(|| bad(format!("storage entry {entry}: data offset unknown")))?;
    if start.checked_add(e.size()).is_none_or(|x| x > file_len) {
        return Err(bad(format!(
            "storage entry {entry} runs past the end of the file"
        )));
    }
    Ok(Storage {
        start,
        size: e.size(),
    })
}

/// Where the bytes of `t` lie, checked against its storage `s`.
fn locate(
    t: &PickledTensor,
    s: Storage,
    dtype_hint: Option<DType>,
    path: &Path,
) -> Result<PtTensor> {
    let bad = |msg: String| ProbeError::BadTensorFile {
        path: path.to_path_buf(),
        msg,
    };
    let unsupported = |msg: String| ProbeError::Unsupported {
        path: path.to_path_buf(),
        msg,
    };
    let (dtype, storage_bytes) = match t.dtype {
        Some(d) => (
            d,
            t.storage_numel
                .checked_mul(d.size() as u64)
                .ok_or_else(|| bad("storage size overflows".into()))?,
        ),
        None => {
            let d = dtype_hint.ok_or_else(|| {
                unsupported("untyped storage and no dtype recorded for it".into())
            })?;
            (d, t.storage_numel)
        }
    };
    if !contiguous(&t.shape, &t.stride) {
        return Err(unsupported(format!(
            "non-contiguous tensor (size {:?}, stride {:?})",
            t.shape, t.stride
        )));
    }
    let numel = t
        .shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad(format!("size {:?} overflows", t.shape)))?;
    let esize = dtype.size() as u64;
    let end = t
        .storage_offset
        .checked_add(numel as u64)
        .and_then(|e| e.checked_mul(esize))
        .ok_or_else(|| bad("tensor extent overflows".into()))?;
    if end > storage_bytes {
        return Err(bad(format!(
            "tensor (offset {}, {numel} elements of {dtype}) runs past its storage of {storage_bytes} bytes",
            t.storage_offset
        )));
    }
    let entry = format!("data/{}", t.storage_key);
    if s.size < storage_bytes {
        return Err(bad(format!(
            "storage entry {entry} holds {} bytes, the pickle says {storage_bytes}",
            s.size
        )));
    }
    Ok(PtTensor {
        dtype,
        shape: t.shape.clone(),
        numel,
        offset: s.start + t.storage_offset * esize,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguity() {
        assert!(contiguous(&[2, 3], &[3, 1]));
        assert!(contiguous(&[], &[]));
        assert!(contiguous(&[1, 3], &[99, 1]));
        assert!(!contiguous(&[2, 3], &[1, 2]));
    }

    #[test]
    fn refuses_unknown_globals() {
        let p = b"\x80\x02cos\nsystem\nq\x00.";
        let e = parse_pickle(p).unwrap_err();
        assert!(e.contains("os.system"), "{e}");
    }

    #[test]
    fn truncated_pickles_are_errors() {
        let p = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\nq\x00(";
        for n in 0..p.len() {
            assert!(parse_pickle(&p[..n]).is_err());
        }
    }
}
