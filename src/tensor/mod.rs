//! Tensor bytes: where a dumped tensor's values are ([`Data`]) and windowed access to them
//! in safetensors shards (probe dumps) and msprobe's `.pt` ([`pt`]) and `.npy` ([`npy`])
//! files, without holding dumps in memory.
//!
//! A shard's header is parsed once (validated by the `safetensors` crate); tensor bytes are
//! then read window by window: small windows with one `pread`, large ones through a
//! short-lived, pre-faulted memory map that is dropped as soon as the window is done.
//! Peak memory is thus a few windows per thread, whatever the dump size.

pub mod npy;
pub mod pickle;
pub mod pt;

use crate::dtype::{AnyDType, DType};
use crate::error::{ProbeError, Result};
use memmap2::MmapOptions;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Where a tensor's values can be read.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    /// A key in a safetensors shard.
    Safetensors {
        /// The shard file.
        shard: PathBuf,
        /// The tensor's key in it.
        key: String,
    },
    /// Raw bytes at a known offset of a shard a crash left unfinished (`*.stream.tmp`),
    /// range already checked against the file.
    Stream {
        /// The unfinished shard file.
        file: PathBuf,
        /// Absolute byte offset of the data in the file.
        offset: u64,
    },
    /// A `torch.save` file holding one tensor (msprobe, PyTorch).
    Pt(PathBuf),
    /// A `.npy` file (msprobe, MindSpore).
    Npy(PathBuf),
}

/// One tensor inside a shard.
#[derive(Debug, Clone)]
struct Entry {
    dtype: Option<DType>,
    dtype_name: String,
    shape: Vec<usize>,
    /// Absolute byte offset of the data in the file.
    offset: u64,
    len: usize,
}

/// The parsed and validated header of a safetensors shard: its tensors and where their
/// bytes lie.
#[derive(Debug, Clone, Default)]
pub struct ShardIndex {
    entries: HashMap<String, Entry>,
}

impl ShardIndex {
    /// Parses and validates the header of a shard from the shard's bytes (the whole file:
    /// the `safetensors` crate checks that the data the header declares fills it exactly).
    /// `Shard::open` reads every shard through this; the error is one line.
    pub fn parse(bytes: &[u8]) -> std::result::Result<ShardIndex, String> {
        let (n, meta) = safetensors::SafeTensors::read_metadata(bytes)
            .map_err(|e| crate::error::one_line(e.to_string()))?;
        let base = 8 + n as u64;
        let entries = meta
            .tensors()
            .into_iter()
            .map(|(name, info)| {
                let dtype_name = format!("{:?}", info.dtype);
                let (start, end) = info.data_offsets;
                let entry = Entry {
                    dtype: DType::parse(&dtype_name),
                    dtype_name,
                    shape: info.shape.clone(),
                    offset: base + start as u64,
                    len: end.saturating_sub(start),
                };
                (name, entry)
            })
            .collect();
        Ok(ShardIndex { entries })
    }
}

impl ShardIndex {
    /// Every tensor of the shard: name, absolute byte offset, dtype (None when probe cannot
    /// decode it), shape. The header was validated: each tensor's bytes lie in the file.
    pub fn entries(&self) -> Vec<(&str, u64, Option<DType>, &[usize])> {
        self.entries
            .iter()
            .map(|(k, e)| (k.as_str(), e.offset, e.dtype, e.shape.as_slice()))
            .collect()
    }
}

/// The parsed header of one shard, with the open file.
#[derive(Debug)]
pub struct Shard {
    path: PathBuf,
    file: File,
    entries: HashMap<String, Entry>,
}

impl Shard {
    /// Opens a safetensors shard and parses and validates its header ([`ShardIndex::parse`]).
    pub(crate) fn open(path: &Path) -> Result<Shard> {
        let file = File::open(path).map_err(|e| ProbeError::io(path, e))?;
        // SAFETY: the map is read-only and only used for header validation below; a file
        // truncated by another process while mapped would fault, which dump files are not.
        let map = unsafe { MmapOptions::new().map(&file) }.map_err(|e| ProbeError::io(path, e))?;
        let index = ShardIndex::parse(&map).map_err(|msg| ProbeError::BadShard {
            path: path.to_path_buf(),
            msg,
        })?;
        Ok(Shard {
            path: path.to_path_buf(),
            file,
            entries: index.entries,
        })
    }
}

/// Shards opened so far, shared between threads; each is opened once.
#[derive(Default)]
pub struct ShardCache {
    shards: Mutex<HashMap<PathBuf, Arc<Shard>>>,
}

impl ShardCache {
    /// The shard at `path`, opened on first use.
    pub fn get(&self, path: &Path) -> Result<Arc<Shard>> {
        if let Some(s) = self.lock().get(path) {
            return Ok(s.clone());
        }
        let shard = Arc::new(Shard::open(path)?);
        self.lock().insert(path.to_path_buf(), shard.clone());
        Ok(shard)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Arc<Shard>>> {
        // A panic elsewhere cannot leave the map inconsistent: entries are only inserted whole.
        self.shards.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Resolves a tensor and checks it against what the op log says about it.
    pub(crate) fn tensor(
        &self,
        shard_path: &Path,
        key: &str,
        dtype: &AnyDType,
        shape: &[usize],
    ) -> Result<TensorData> {
        let shard = self.get(shard_path)?;
        let bad = |msg: String| ProbeError::BadTensor {
            path: shard_path.to_path_buf(),
            name: key.to_string(),
            msg,
        };
        let e = shard
            .entries
            .get(key)
            .ok_or_else(|| bad("not in this shard".into()))?;
        let dt = e
            .dtype
            .ok_or_else(|| bad(format!("unsupported dtype {}", e.dtype_name)))?;
        let d = dtype
            .known()
            .ok_or_else(|| bad(format!("unsupported dtype {dtype} in the op log")))?;
        if d != dt {
            return Err(bad(format!("op log says {d}, shard holds {dt}")));
        }
        if e.shape != shape {
            return Err(bad(format!(
                "op log says shape {shape:?}, shard holds {:?}",
                e.shape
            )));
        }
        let numel: usize = e.shape.iter().product();
        if numel.checked_mul(dt.size()) != Some(e.len) {
            return Err(bad(format!(
                "{} bytes do not hold {numel} {dt} elements",
                e.len
            )));
        }
        let offset = e.offset;
        Ok(TensorData {
            shard,
            offset,
            numel,
            dtype: dt,
        })
    }
}

impl ShardCache {
    /// Resolves a tensor wherever it is stored (safetensors shard, `.pt`, `.npy`) and
    /// checks it against the dtype and shape the op log records.
    pub(crate) fn open(
        &self,
        data: &Data,
        name: &str,
        declared: &AnyDType,
        shape: &[usize],
    ) -> Result<TensorData> {
        let (path, dtype, file_shape, numel, offset) = match data {
            Data::Safetensors { shard, key } => return self.tensor(shard, key, declared, shape),
            Data::Stream { file, offset } => {
                let dtype = declared.known().ok_or_else(|| ProbeError::BadTensor {
                    path: file.clone(),
                    name: name.to_string(),
                    msg: format!("unsupported dtype {declared} in the op log"),
                })?;
                let numel = shape.iter().product();
                return TensorData::in_file(file, *offset, numel, dtype);
            }
            Data::Pt(p) => {
                let t = pt::read(p, declared.known())?;
                (p, t.dtype, t.shape, t.numel, t.offset)
            }
            Data::Npy(p) => {
                let t = npy::read(p)?;
                (p, t.dtype, t.shape, t.numel, t.offset)
            }
        };
        let bad = |msg: String| ProbeError::BadTensor {
            path: path.clone(),
            name: name.to_string(),
            msg,
        };
        if let Some(d) = declared.known() {
            if d != dtype {
                return Err(bad(format!("dump says {d}, file holds {dtype}")));
            }
        }
        if file_shape != shape {
            return Err(bad(format!(
                "dump says shape {shape:?}, file holds {file_shape:?}"
            )));
        }
        TensorData::in_file(path, offset, numel, dtype)
    }
}

/// A readable tensor: where its bytes are and how to decode them.
#[derive(Debug, Clone)]
pub struct TensorData {
    shard: Arc<Shard>,
    offset: u64,
    /// Number of elements.
    pub numel: usize,
    /// Element type of the stored bytes.
    pub dtype: DType,
}

/// Below this a window is read with one `pread` instead of a memory map.
const PREAD_LIMIT: usize = 1 << 20;

impl TensorData {
    /// A tensor stored as `numel` contiguous elements at `offset` of a file of its own
    /// (`.pt` storage, `.npy` data), range already checked against the file.
    pub fn in_file(path: &Path, offset: u64, numel: usize, dtype: DType) -> Result<TensorData> {
        let file = File::open(path).map_err(|e| ProbeError::io(path, e))?;
        Ok(TensorData {
            shard: Arc::new(Shard {
                path: path.to_path_buf(),
                file,
                entries: HashMap::new(),
            }),
            offset,
            numel,
            dtype,
        })
    }

    /// Calls `f` with the bytes of elements `start..start+count`.
    pub fn with_window<R>(
        &self,
        start: usize,
        count: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        let size = self.dtype.size();
        let offset = self.offset + (start * size) as u64;
        let len = count * size;
        let io = |e: std::io::Error| ProbeError::io(&self.shard.path, e);
        if len <= PREAD_LIMIT {
            let mut buf = vec![0u8; len];
            self.shard
                .file
                .read_exact_at(&mut buf, offset)
                .map_err(io)?;
            return Ok(f(&buf));
        }
        // SAFETY: read-only map of a range validated against the file size when the shard
        // was opened; dropped before this function returns.
        let map = unsafe {
            MmapOptions::new()
                .offset(offset)
                .len(len)
                .populate()
                .map(&self.shard.file)
        }
        .map_err(io)?;
        Ok(f(&map))
    }
}
