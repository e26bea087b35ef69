//! One error type for the library, one variant per class of failure.
//!
//! Every message names the file, op or tensor involved, because the user of a compare
//! over 50,000 tensors cannot guess which one was bad. `main.rs` maps the variants to
//! exit codes ([`ProbeError::exit_code`]).

use std::path::PathBuf;

/// Result alias used across the library.
pub type Result<T, E = ProbeError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// Wrong or contradictory command-line arguments.
    #[error("{0}")]
    Usage(String),
    /// A path the user named does not exist.
    #[error("{}: no such file or directory", .0.display())]
    NotFound(PathBuf),
    /// An I/O failure while reading input.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The folder holds neither a probe nor an msprobe dump.
    #[error("{}: not a dump (expected manifest.json, step<S>/, rank<R>/ or ops.jsonl)", .0.display())]
    NotADump(PathBuf),
    /// A dump with no op records at all.
    #[error("{}: empty dump: no op records", .0.display())]
    EmptyDump(PathBuf),
    /// A manifest that does not follow the format.
    #[error("{}: bad manifest: {msg}", path.display())]
    BadManifest { path: PathBuf, msg: String },
    /// A line of an op log that is not a valid record.
    #[error("{}:{line}: bad op record: {msg}", path.display())]
    BadRecord {
        path: PathBuf,
        line: usize,
        msg: String,
    },
    /// A tensor whose data cannot be used (missing key, size does not match its shape, ...).
    #[error("{}: tensor {name}: {msg}", path.display())]
    BadTensor {
        path: PathBuf,
        name: String,
        msg: String,
    },
    /// A safetensors shard that is truncated or corrupt.
    #[error("{}: corrupt safetensors shard: {msg}", path.display())]
    BadShard { path: PathBuf, msg: String },
    /// A `.pt` or `.npy` tensor file (msprobe dumps) that is truncated or corrupt.
    #[error("{}: bad tensor file: {msg}", path.display())]
    BadTensorFile { path: PathBuf, msg: String },
    /// An msprobe `dump.json` (or `stack.json`) that does not follow msprobe's format.
    #[error("{}: bad msprobe dump: {msg}", path.display())]
    BadMsprobe { path: PathBuf, msg: String },
    /// Input in a format or variant this version cannot read.
    #[error("{}: unsupported: {msg}", path.display())]
    Unsupported { path: PathBuf, msg: String },
    /// A compare configuration (TOML) that cannot be used.
    #[error("{}: bad config: {msg}", path.display())]
    BadConfig { path: PathBuf, msg: String },
    /// An output that cannot be written.
    #[error("cannot write {}: {msg}", path.display())]
    Output { path: PathBuf, msg: String },
    /// A zip archive refused as hostile or unsafe (path traversal, absolute path, symlink,
    /// too many entries, zip bomb); the message names the entry.
    #[error("{}: rejected archive: {msg}", path.display())]
    HostileZip { path: PathBuf, msg: String },
    /// A config pack that is not a pack, or one of whose entries is malformed.
    #[error("{}: {entry}: {msg}", path.display())]
    BadPack {
        path: PathBuf,
        entry: String,
        msg: String,
    },
    /// An external program probe runs (a Python interpreter) failed.
    #[error("{}: {msg}", program.display())]
    External { program: PathBuf, msg: String },
    /// The two sides have nothing in common to compare.
    #[error("nothing comparable: {0}")]
    NothingComparable(String),
}

impl ProbeError {
    /// Exit code documented in README.md: 2 for usage and input errors, 3 when nothing
    /// could be compared.
    pub fn exit_code(&self) -> u8 {
        match self {
            ProbeError::NothingComparable(_) => 3,
            _ => 2,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        if source.kind() == std::io::ErrorKind::NotFound {
            ProbeError::NotFound(path)
        } else {
            ProbeError::Io { path, source }
        }
    }
}
