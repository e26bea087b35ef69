//! One error type for the library, one variant per class of failure.
//!
//! Every message names the file, op or tensor involved, because the user of a compare
//! over 50,000 tensors cannot guess which one was bad. `main.rs` maps the variants to
//! exit codes ([`ProbeError::exit_code`]).

use std::path::{Path, PathBuf};

/// Result alias used across the library.
pub type Result<T, E = ProbeError> = std::result::Result<T, E>;

/// Every failure the library reports; each message names the file, op or tensor involved.
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
        /// The file or folder involved.
        path: PathBuf,
        /// The underlying I/O error.
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
    #[error("{}: bad manifest: {}", path.display(), OneLine(msg))]
    BadManifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// A line of an op log that is not a valid record.
    #[error("{}:{line}: bad op record: {}", path.display(), OneLine(msg))]
    BadRecord {
        /// The op log file.
        path: PathBuf,
        /// 1-based line number of the bad record.
        line: usize,
        /// What is wrong with the record.
        msg: String,
    },
    /// A tensor whose data cannot be used (missing key, size does not match its shape, ...).
    #[error("{}: tensor {}: {}", path.display(), OneLine(name), OneLine(msg))]
    BadTensor {
        /// The file holding (or meant to hold) the tensor.
        path: PathBuf,
        /// The tensor's name or key.
        name: String,
        /// What is wrong with the tensor.
        msg: String,
    },
    /// A safetensors shard that is truncated or corrupt.
    #[error("{}: corrupt safetensors shard: {}", path.display(), OneLine(msg))]
    BadShard {
        /// The shard file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// A `.pt` or `.npy` tensor file (msprobe dumps) that is truncated or corrupt.
    #[error("{}: bad tensor file: {}", path.display(), OneLine(msg))]
    BadTensorFile {
        /// The `.pt` or `.npy` file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// An msprobe `dump.json` (or `stack.json`) that does not follow msprobe's format.
    #[error("{}: bad msprobe dump: {}", path.display(), OneLine(msg))]
    BadMsprobe {
        /// The `dump.json` or `stack.json` file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// Input in a format or variant this version cannot read.
    #[error("{}: unsupported: {}", path.display(), OneLine(msg))]
    Unsupported {
        /// The input file or folder.
        path: PathBuf,
        /// What is not supported.
        msg: String,
    },
    /// A compare configuration (TOML) that cannot be used.
    #[error("{}: bad config: {}", path.display(), OneLine(msg))]
    BadConfig {
        /// The config file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// A mapping file (`probe compare --mapping`) that cannot be used; the message names the
    /// file and line.
    #[error("bad mapping file: {0}")]
    BadMapping(#[from] MappingError),
    /// An output that cannot be written.
    #[error("cannot write {}: {msg}", path.display())]
    Output {
        /// The output path.
        path: PathBuf,
        /// Why it cannot be written.
        msg: String,
    },
    /// An entry of an input or output folder that probe refuses to follow, read or remove:
    /// a symbolic link or special file (device, FIFO) where a plain file or folder belongs,
    /// or a link whose target is not a name probe itself makes. Nothing was changed.
    #[error("{}: refused: {}", path.display(), OneLine(msg))]
    Refused {
        /// The entry.
        path: PathBuf,
        /// What it is and why it is not used.
        msg: String,
    },
    /// A zip archive refused as hostile or unsafe (path traversal, absolute path, symlink,
    /// too many entries, zip bomb); the message names the entry.
    #[error("{}: rejected archive: {}", path.display(), OneLine(msg))]
    HostileZip {
        /// The pack zip.
        path: PathBuf,
        /// Why it was rejected, naming the entry.
        msg: String,
    },
    /// A config pack that is not a pack, or one of whose entries is malformed.
    #[error("{}: {}: {}", path.display(), OneLine(entry), OneLine(msg))]
    BadPack {
        /// The pack zip.
        path: PathBuf,
        /// The entry at fault (`-` when the file itself is not a pack).
        entry: String,
        /// What is wrong with it.
        msg: String,
    },
    /// One side of `probe config-check` given as several packs (a folder or a glob) whose
    /// packs do not make one job: different world sizes or job ids, a rank twice, a pack
    /// without a rank.
    #[error("{}: {}", path.display(), OneLine(msg))]
    PackSet {
        /// The folder or glob as given.
        path: PathBuf,
        /// What is wrong, naming the packs.
        msg: String,
    },
    /// An external program probe runs (a Python interpreter) failed.
    #[error("{}: {msg}", program.display())]
    External {
        /// The program that was run.
        program: PathBuf,
        /// How it failed.
        msg: String,
    },
    /// A shard result (`probe compare --shard`, read by `probe merge`) that cannot be read.
    #[error("{}: bad shard result: {}", path.display(), OneLine(msg))]
    BadShardResult {
        /// The shard result's folder or file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// Shard results that do not make one run (another run, overlapping or missing parts).
    #[error("shards do not make one run: {0}")]
    ShardMismatch(String),
    /// A monitor file (`probe.Monitor`'s `rank<R>.arrows`) that cannot be read as one.
    #[error("{}: bad monitor file: {}", path.display(), OneLine(msg))]
    BadMonitor {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// The two sides have nothing in common to compare.
    #[error("nothing comparable: {0}")]
    NothingComparable(String),
    /// An op key that names no operator a replay may run (`Torch.os.system...`): a dump's
    /// name is data, never a path to follow (issue 70).
    #[error(
        "op {}: {why}: not an operator a replay may run (docs/replay.md, \"Only operators\"); nothing run",
        OneLine(op)
    )]
    NotAnOperator {
        /// The op key.
        op: String,
        /// What gives it away.
        why: &'static str,
    },
    /// A folder given as a compare's output (`probe replay --from`) that is not one.
    #[error("{}: not a compare's output folder: {}", path.display(), OneLine(msg))]
    NotCompareOutput {
        /// The folder (or its `summary.json`).
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// A checkpoint (`probe ckpt-compare`) that cannot be read as laid out: a missing
    /// shard, an index naming a file that is not there, a tensor of the wrong size for the
    /// mapping, a model shape the mapping cannot be built from.
    #[error("{}: bad checkpoint: {}", path.display(), OneLine(msg))]
    BadCheckpoint {
        /// The checkpoint file or folder.
        path: PathBuf,
        /// What is wrong, naming the tensor or shard.
        msg: String,
    },
    /// Two checkpoints whose logical parameter (after merging shards) has another shape
    /// on each side: the mapping is wrong or the models differ.
    #[error("parameter {}: {}", OneLine(name), OneLine(msg))]
    CheckpointMismatch {
        /// The logical parameter's name.
        name: String,
        /// Both shapes and where each came from.
        msg: String,
    },
    /// No Python that can replay an op (`probe replay`): none of those tried imports torch
    /// and `probe.replay`.
    #[error(
        "no Python that imports torch and probe.replay: {}; install torch and probe-dl into \
         the Python that runs the training, or name one with --python or PROBE_PYTHON",
        OneLine(tried)
    )]
    NoPython {
        /// Each Python tried, with why it cannot replay.
        tried: String,
    },
}

/// Displays input-derived text on one line: control characters (a newline inside a JSON
/// string, a zip entry name, a pickle string) are written escaped (`\n`), so that every
/// error message stays one line whatever the input holds.
struct OneLine<'a>(&'a str);

impl std::fmt::Display for OneLine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write;
        for c in self.0.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

/// `msg` with its control characters escaped, as [`ProbeError`] displays it: for the
/// readers' public entry points that return a bare message.
pub(crate) fn one_line(msg: String) -> String {
    if msg.chars().any(char::is_control) {
        OneLine(&msg).to_string()
    } else {
        msg
    }
}

impl ProbeError {
    /// Exit code documented in README.md: 2 for usage and input errors, 3 when nothing
    /// could be compared.
    pub fn exit_code(&self) -> u8 {
        match self {
            ProbeError::NothingComparable(_) => crate::gate::EXIT_NOTHING_COMPARABLE,
            _ => crate::gate::EXIT_INPUT,
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

/// What goes wrong reading a mapping file; each message names the file and, where known,
/// the 1-based line.
#[derive(Debug, thiserror::Error)]
pub enum MappingError {
    /// The file does not exist.
    #[error("{}: no such file or directory", .0.display())]
    NotFound(PathBuf),
    /// The file cannot be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The mapping file.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Larger than the cap (`compare::mapping::MAX_MAPPING_BYTES`).
    #[error("{}: larger than {limit} bytes: not a mapping file", path.display())]
    TooLarge {
        /// The mapping file.
        path: PathBuf,
        /// The cap.
        limit: u64,
    },
    /// Not UTF-8 text (a binary file given by mistake).
    #[error("{}: not UTF-8 text: not a mapping file", path.display())]
    NotText {
        /// The mapping file.
        path: PathBuf,
    },
    /// An extension that says neither probe's TOML nor msprobe's YAML.
    #[error(
        "{}: unknown kind of mapping file: expected .toml (probe) or .yaml/.yml (msprobe)",
        path.display()
    )]
    UnknownKind {
        /// The mapping file.
        path: PathBuf,
    },
    /// Not valid TOML, or TOML that does not follow probe's mapping schema (unknown key,
    /// wrong type, missing field).
    #[error("{}: TOML: {msg}", At(path, *line))]
    Toml {
        /// The mapping file.
        path: PathBuf,
        /// 1-based line (0: unknown).
        line: usize,
        /// What the TOML reader said.
        msg: String,
    },
    /// Not valid YAML, or YAML beyond what a mapping file needs (aliases, tags, more than
    /// one document, deep nesting).
    #[error("{}: YAML: {msg}", At(path, *line))]
    Yaml {
        /// The mapping file.
        path: PathBuf,
        /// 1-based line (0: unknown).
        line: usize,
        /// What is wrong.
        msg: String,
    },
    /// Well-formed, but an entry is not what its place asks for: a malformed API name, a
    /// duplicate, an empty file, a mix of msprobe mapping kinds, a slot remapping.
    #[error("{}: {msg}", At(path, *line))]
    Invalid {
        /// The mapping file.
        path: PathBuf,
        /// 1-based line (0: unknown).
        line: usize,
        /// What is wrong.
        msg: String,
    },
}

/// `path:line`, or `path` alone when the line is unknown (0).
struct At<'a>(&'a Path, usize);

impl std::fmt::Display for At<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.1 {
            0 => write!(f, "{}", self.0.display()),
            n => write!(f, "{}:{n}", self.0.display()),
        }
    }
}

impl MappingError {
    /// An [`MappingError::Invalid`] with its message made one line (names come from the
    /// file and may hold control characters).
    pub(crate) fn invalid(path: &Path, line: usize, msg: impl Into<String>) -> MappingError {
        MappingError::Invalid {
            path: path.to_path_buf(),
            line,
            msg: one_line(msg.into()),
        }
    }
}
