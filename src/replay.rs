//! `probe replay`: prove the culprit by running the op again. The op (by default a
//! compare's first divergent op) is replayed by the capture agent's Python
//! (`python -m probe.replay`, docs/replay.md) from the tensors the dumps hold; this command
//! checks everything it can first (arguments, the output folder, the dumps, the op's
//! tensors, a Python that imports torch), then hands over and returns the Python's exit
//! code: 0 within tolerance, 1 reproduces, 2 bad input, 3 nothing replayable.
//!
//! An op the dumps hold without its tensors (statistics or checksum mode), or not at all
//! (outside the dumped steps, ranks or ops), is not replayable: `recapture.json` is written
//! into the output folder instead (the capture configuration that dumps it), exit 3.

use crate::app::{self, CompareRequest};
use crate::dump::{self, DumpSet};
use crate::error::{ProbeError, Result};
use crate::op_key::{OpKey, OpKind};
use crate::progress::Progress;
use crate::schema::summary::Summary;
use crate::vocab::Sides;
use crate::{atomic, config_file};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::LazyLock;

/// Exit code: the op's replay agrees with the benchmark within tolerance (or nothing to
/// replay: no divergent op).
pub const EXIT_WITHIN: u8 = 0;
/// Exit code: nothing replayable (the dumps lack the op's tensors).
pub const EXIT_NOTHING_REPLAYABLE: u8 = 3;

/// The environment variable naming the Python that replays (after `--python`).
pub const PYTHON_ENV: &str = "PROBE_PYTHON";

/// The device the op is replayed on (`--device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The CPU.
    Cpu,
    /// An NVIDIA GPU.
    Cuda,
    /// An Ascend NPU.
    Npu,
}

impl Device {
    /// The name `python -m probe.replay --device` takes.
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
            Device::Npu => "npu",
        }
    }
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Device, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda),
            "npu" => Ok(Device::Npu),
            _ => Err(format!("{s:?}: expected cpu, cuda or npu")),
        }
    }
}

/// What `probe replay` was asked to do: its command line (declared here: `main.rs` only
/// dispatches).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ReplayRequest {
    /// Benchmark dump (the trusted run): a dump root, a step<S> or a rank<R> folder.
    #[arg(short = 'b', long = "bench", value_name = "DUMP")]
    pub bench: Option<PathBuf>,
    /// Comparison dump (the run under suspicion).
    #[arg(short = 'c', long = "cmp", value_name = "DUMP")]
    pub cmp: Option<PathBuf>,
    /// A probe compare's output folder: its summary.json names the dumps (unless -b/-c
    /// are given) and the first divergent op.
    #[arg(long = "from", value_name = "OUT")]
    pub from: Option<PathBuf>,
    /// The op to replay (repeatable), e.g. Functional.linear.2.forward. Default: the
    /// compare's first divergent op (forward, and backward in the same step and rank).
    #[arg(long = "op", value_name = "KEY")]
    pub ops: Vec<String>,
    /// Output folder for replay.json and the repro folders (recapture.json when the
    /// dumps lack the op's tensors).
    #[arg(short = 'o', long = "out", value_name = "DIR")]
    pub out: PathBuf,
    /// Device to replay on: cpu, cuda or npu (default: the Python's choice).
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<Device>,
    /// A Python file run before the replay (imports that register custom ops); also
    /// PROBE_REPLAY_PRELUDE.
    #[arg(long, value_name = "FILE.py")]
    pub prelude: Option<PathBuf>,
    /// The Python to replay with (default: $PROBE_PYTHON, the Python beside probe, then
    /// python3 on PATH); it must import torch and probe.
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// The step (default: where the compare named the op).
    #[arg(long, value_name = "S")]
    pub step: Option<u64>,
    /// The rank (default: where the compare named the op).
    #[arg(long, value_name = "R")]
    pub rank: Option<u64>,
    /// Relative tolerance of the replay's check (default: the Python's, by dtype).
    #[arg(long, value_name = "X")]
    pub rtol: Option<f64>,
    /// Absolute tolerance of the replay's check.
    #[arg(long, value_name = "Y")]
    pub atol: Option<f64>,
    /// No progress on stderr; probe's own lines on stdout too are left out.
    #[arg(short, long)]
    pub quiet: bool,
}

/// How a replay ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Replayed {
    /// The compare names no divergent op: nothing to replay (exit 0).
    NoDivergentOp {
        /// The compare's headline.
        headline: String,
    },
    /// The dumps lack some op's tensors (exit 3).
    NotReplayable {
        /// Each op and what the dumps lack of it.
        ops: Vec<(String, String)>,
        /// Step and rank labels.
        at: (String, String),
        /// The `recapture.json` written (None when the step or rank has no number a
        /// capture could select).
        recapture: Option<PathBuf>,
    },
    /// The Python replayed; its exit code (0 to 3).
    Ran {
        /// Its exit code.
        code: u8,
    },
}

impl Replayed {
    /// What `probe replay` prints on stdout for this end (a replay that ran prints its
    /// own lines as it goes); every string from the dumps is made printable. `out`: the
    /// output folder, named in the recapture command.
    pub fn message(&self, out: &Path) -> String {
        let p = |s: &str| crate::report::printable(s);
        match self {
            Replayed::NoDivergentOp { headline } => {
                format!("nothing to replay: no divergent op ({})\n", p(headline))
            }
            Replayed::NotReplayable { ops, at, recapture } => {
                let mut t = String::new();
                for (op, lacks) in ops {
                    t += &format!(
                        "not replayable: {} ({}/{}): the dumps lack {lacks}\n",
                        p(op),
                        p(&at.0),
                        p(&at.1)
                    );
                }
                if let Some(path) = recapture {
                    let path = p(&path.display().to_string());
                    let keys: String = ops.iter().map(|(o, _)| format!(" --op {}", p(o))).collect();
                    t += &format!(
                        "recapture: {path}: capture both runs again with PROBE_CONFIG={path} (tensor mode, {}/{} only), then probe replay -b NEW_BENCH -c NEW_CMP{keys} -o {}\n",
                        p(&at.0),
                        p(&at.1),
                        p(&out.display().to_string())
                    );
                }
                t
            }
            Replayed::Ran { .. } => String::new(),
        }
    }

    /// The exit code of `probe replay`.
    pub fn exit_code(&self) -> u8 {
        match self {
            Replayed::NoDivergentOp { .. } => EXIT_WITHIN,
            Replayed::NotReplayable { .. } => EXIT_NOTHING_REPLAYABLE,
            Replayed::Ran { code } => *code,
        }
    }
}

/// Runs `probe replay`: every check first, then the compare when the op must come from
/// one, then the Python.
pub fn replay(req: &ReplayRequest, progress: &Progress) -> Result<Replayed> {
    check_args(req)?;
    check_out(&req.out)?;
    let summary = match &req.from {
        Some(dir) => Some(read_summary(dir)?),
        None => None,
    };
    let paths = dump_paths(req, summary.as_ref())?;
    let sets = Sides {
        bench: dump::discover(&paths.bench)?,
        cmp: dump::discover(&paths.cmp)?,
    };
    atomic::refuse_inside(&req.out, &[&paths.bench, &paths.cmp])?;
    let mut python = None;
    let summary = match summary {
        Some(s) => Some(s),
        None if req.ops.is_empty() => {
            // A long compare ahead: a missing Python is said before it, unless the dumps
            // hold no tensors at all (then the compare only names the op to recapture).
            let without =
                |s: &DumpSet| matches!(s.mode, Some(dump::Mode::Statistics | dump::Mode::Checksum));
            if !(without(&sets.bench) && without(&sets.cmp)) {
                python = Some(find_python(req.python.as_deref())?);
            }
            note(req, "comparing the dumps to find the first divergent op");
            Some(app::compare_summary(
                &compare_request(&paths, &req.out),
                progress,
            )?)
        }
        None => None,
    };
    let (at, ops) = match targets(req, summary.as_ref(), &sets)? {
        Some(t) => t,
        None => {
            let headline = summary.map(|s| s.headline).unwrap_or_default();
            return Ok(Replayed::NoDivergentOp { headline });
        }
    };
    if let Some((op, why)) = ops.iter().find_map(|o| not_an_operator(o).map(|w| (o, w))) {
        return Err(ProbeError::NotAnOperator {
            op: op.clone(),
            why,
        });
    }
    let sides = Sides {
        bench: &sets.bench,
        cmp: &sets.cmp,
    };
    let lacking = app::lacking(sides, (&at.0, &at.1), &ops)?;
    if !lacking.is_empty() {
        return not_replayable(req, at, lacking);
    }
    let python = match python {
        Some(p) => p,
        None => find_python(req.python.as_deref())?,
    };
    let args = python_args(req, &paths, &sets, &at, &ops);
    note(
        req,
        &format!(
            "replaying {} ({}/{}) with {}",
            ops.join(", "),
            at.0,
            at.1,
            python.display()
        ),
    );
    run_python(&python, &args).map(|code| Replayed::Ran { code })
}

/// The namespaces below `torch` that the agent's `Torch` APIs hang from (`linalg` of
/// `linalg.vector_norm`), from the list built into the binary.
static TORCH_NAMESPACES: LazyLock<BTreeSet<String>> = LazyLock::new(|| {
    #[derive(serde::Deserialize)]
    struct Listed {
        #[serde(rename = "Torch")]
        torch: Vec<String>,
    }
    // Built into the binary and exercised by tests/replay.rs: not an input.
    let listed: Listed = serde_json::from_str(include_str!("../python/probe/api_list.json"))
        .expect("python/probe/api_list.json is valid");
    let spaces = listed.torch.iter().filter_map(|n| n.split_once('.'));
    spaces.map(|(ns, _)| ns.to_string()).collect()
});

/// What shows that an op key names no operator, before anything else is done with it (no
/// recapture, no Python); None leaves the verdict to the Python's allow-list
/// (`probe/replay/allowed.py`), the guarantee: this check is coarse and early, for a
/// Python whose probe predates it too. An API's name must be identifiers; only a `Tensor`
/// method may have two leading underscores (`__add__`); `Functional`, `Tensor`, `VF` and
/// `NPU` names are one part, `Torch` ones one or a namespace of the agent's list and a name
/// (`linalg.vector_norm`), `Aten` ones an op and an overload.
fn not_an_operator(op: &str) -> Option<&'static str> {
    const REPLAYED: [&str; 6] = ["Torch", "Functional", "Tensor", "VF", "NPU", "Aten"];
    let key = OpKey::parse(op);
    let prefix = key.prefix();
    if key.kind() != OpKind::Api || !REPLAYED.contains(&prefix) {
        return None; // modules, collectives, other types: the Python says what it can replay
    }
    let name = key.base().get(prefix.len() + 1..).unwrap_or("");
    let parts: Vec<&str> = name.split('.').collect();
    let ident = |p: &&str| {
        p.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    match (prefix, parts.as_slice()) {
        _ if !parts.iter().all(ident) => Some("its name is not a dotted identifier"),
        ("Tensor", [_]) => None,
        _ if parts.iter().any(|p| p.starts_with("__")) => {
            Some("a name with two leading underscores")
        }
        (_, [_]) | ("Aten", [_, _]) => None,
        ("Torch", [ns, _]) if TORCH_NAMESPACES.contains(*ns) => None,
        _ => Some("a path through a module that holds no operators"),
    }
}

/// A progress line on stderr, unless quiet.
fn note(req: &ReplayRequest, what: &str) {
    if !req.quiet {
        eprintln!("probe: {}", config_file::printable(what));
    }
}

/// The arguments that need no file: which source, the op keys, the tolerances.
fn check_args(req: &ReplayRequest) -> Result<()> {
    match (&req.from, &req.bench, &req.cmp) {
        (_, Some(_), None) | (_, None, Some(_)) => {
            return Err(ProbeError::Usage("give both -b and -c, or neither".into()))
        }
        (None, None, None) => {
            return Err(ProbeError::Usage(
                "give the dumps (-b BENCH -c CMP) or a compare's output folder (--from OUT)".into(),
            ))
        }
        _ => {}
    }
    for op in &req.ops {
        if op.trim().is_empty() || op.starts_with('-') {
            return Err(ProbeError::Usage(format!(
                "--op {:?}: not an op key (Functional.gelu.3.forward)",
                config_file::printable(op)
            )));
        }
    }
    for (name, v) in [("--rtol", req.rtol), ("--atol", req.atol)] {
        if v.is_some_and(|v| !(v.is_finite() && v >= 0.0)) {
            return Err(ProbeError::Usage(format!(
                "{name} must be a number of at least 0"
            )));
        }
    }
    if let Some(p) = &req.prelude {
        if !p.is_file() {
            return Err(ProbeError::NotFound(p.clone()));
        }
    }
    Ok(())
}

/// The output folder, checked before any work without creating it (the Python does): a
/// writable folder, or a name in a writable folder.
fn check_out(out: &Path) -> Result<()> {
    let err = |path: &Path, msg: String| ProbeError::Output {
        path: path.to_path_buf(),
        msg,
    };
    let dir = if out.exists() {
        if !out.is_dir() {
            return Err(err(out, "exists and is not a directory".into()));
        }
        if !replaceable(out) {
            return Err(err(
                out,
                "holds other files than a replay's output (no replay.json), and a replay \
                 replaces its output folder: name a new or empty one"
                    .into(),
            ));
        }
        out.to_path_buf()
    } else {
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !parent.is_dir() {
            return Err(err(
                out,
                format!("its folder {} does not exist", parent.display()),
            ));
        }
        parent
    };
    let probe_file = dir.join(format!(".probe-write-test-{}", std::process::id()));
    std::fs::write(&probe_file, b"").map_err(|e| err(&dir, format!("not writable: {e}")))?;
    let _ = std::fs::remove_file(&probe_file);
    Ok(())
}

/// Whether an existing output folder may be replaced by a replay's: empty, an earlier
/// replay's (it holds `replay.json`), or only the `recapture.json` of a replay that had
/// nothing to replay. Never a dump or a compare's folder.
fn replaceable(out: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(out) else {
        return false;
    };
    let names: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    names.iter().any(|n| n == "replay.json") || names.iter().all(|n| n == app::RECAPTURE)
}

/// The largest `summary.json` read (a compare's is well under this even for thousands of
/// step/rank pairs).
const MAX_SUMMARY_BYTES: u64 = 256 << 20;

/// A compare's `summary.json` in `dir`.
fn read_summary(dir: &Path) -> Result<Summary> {
    let bad = |path: &Path, msg: &str| ProbeError::NotCompareOutput {
        path: path.to_path_buf(),
        msg: msg.to_string(),
    };
    if !dir.is_dir() {
        return Err(if dir.exists() {
            bad(dir, "not a folder")
        } else {
            ProbeError::NotFound(dir.to_path_buf())
        });
    }
    let path = dir.join("summary.json");
    let meta = std::fs::metadata(&path).map_err(|_| bad(dir, "it holds no summary.json"))?;
    if meta.len() > MAX_SUMMARY_BYTES {
        return Err(bad(&path, "larger than any compare's summary.json"));
    }
    let bytes = std::fs::read(&path).map_err(|e| ProbeError::io(&path, e))?;
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(&path, &format!("not JSON: {e}")))?;
    match value.get("format").and_then(|f| f.as_str()) {
        Some("probe-compare-summary") => {}
        Some(other) => {
            return Err(bad(
                &path,
                &format!(
                    "a {other}, not a probe-compare-summary (give a probe compare's -o folder)"
                ),
            ))
        }
        None => return Err(bad(&path, "no format key: not a probe compare's summary")),
    }
    serde_json::from_value(value).map_err(|e| bad(&path, &format!("unreadable summary: {e}")))
}

/// The two dumps: as given, else as the compare's summary names them (paths as the
/// compare was given them: relative ones are taken from here).
fn dump_paths(req: &ReplayRequest, summary: Option<&Summary>) -> Result<Sides<PathBuf>> {
    if let (Some(b), Some(c)) = (&req.bench, &req.cmp) {
        return Ok(Sides {
            bench: b.clone(),
            cmp: c.clone(),
        });
    }
    let (Some(s), Some(from)) = (summary, &req.from) else {
        return Err(ProbeError::Usage("give both -b and -c".into()));
    };
    let named = Sides {
        bench: PathBuf::from(&s.bench),
        cmp: PathBuf::from(&s.cmp),
    };
    for (side, p) in [("benchmark", &named.bench), ("comparison", &named.cmp)] {
        if !p.exists() {
            return Err(ProbeError::Usage(format!(
                "{}: the compare's {side} dump {} is not found from here: give -b and -c",
                from.join("summary.json").display(),
                p.display()
            )));
        }
    }
    Ok(named)
}

/// The compare `probe replay` runs itself: the defaults of `probe compare`; rows past the
/// memory budget wait beside the output folder.
fn compare_request(paths: &Sides<PathBuf>, out: &Path) -> CompareRequest {
    let scratch = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let scratch = if out.is_dir() {
        out.to_path_buf()
    } else {
        scratch
    };
    CompareRequest {
        bench: paths.bench.clone(),
        cmp: paths.cmp.clone(),
        out: scratch,
        config: None,
        reference: None,
        fail_on: crate::gate::FailOn::Error,
        formats: vec!["json".into()],
        threads: None,
        level: crate::compare::Level::default(),
        align: crate::compare::AlignRule::default(),
        mappings: Vec::new(),
        max_unmatched: crate::gate::DEFAULT_MAX_UNMATCHED,
        selection: dump::Selection::default(),
        shard: None,
        xlsx_rows: crate::report::XlsxRows::default(),
        row_memory_mb: 256,
    }
}

/// Step and rank labels (`step0`, `rank0`).
type At = (String, String);

/// Step and rank labels, and the ops: as asked, else the compare's first divergent op.
/// None when there is no op to replay.
fn targets(
    req: &ReplayRequest,
    summary: Option<&Summary>,
    sets: &Sides<DumpSet>,
) -> Result<Option<(At, Vec<String>)>> {
    let divergent = summary.and_then(app::divergent_ops);
    let (ops, named_at) = if req.ops.is_empty() {
        match divergent {
            Some((step, rank, ops)) => (ops, Some((step, rank))),
            None => return Ok(None),
        }
    } else {
        // Where the compare named the op, if it did; else where it named its first
        // divergent op.
        let named = summary.and_then(|s| {
            s.findings
                .iter()
                .find(|f| req.ops.contains(&f.finding.op))
                .map(|f| (f.finding.step.clone(), f.finding.rank.clone()))
        });
        let at = named.or(divergent.map(|(s, r, _)| (s, r)));
        (req.ops.clone(), at)
    };
    let step = match (req.step, &named_at) {
        (Some(s), _) => format!("step{s}"),
        (None, Some((s, _))) => s.clone(),
        (None, None) => only(sets, "step", |l| &l.step)?,
    };
    let rank = match (req.rank, &named_at) {
        (Some(r), _) => format!("rank{r}"),
        (None, Some((_, r))) => r.clone(),
        (None, None) => only(sets, "rank", |l| &l.rank)?,
    };
    Ok(Some(((step, rank), ops)))
}

/// The one step (or rank) label the benchmark dump holds; more than one is a usage error.
fn only(sets: &Sides<DumpSet>, what: &str, label: fn(&dump::RankLoc) -> &String) -> Result<String> {
    let mut labels: Vec<&String> = sets.bench.ranks.iter().map(label).collect();
    labels.dedup();
    match labels.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(ProbeError::NotADump(sets.bench.path.clone())),
        many => Err(ProbeError::Usage(format!(
            "{} holds {} {what}s: give --{what}",
            sets.bench.path.display(),
            many.len()
        ))),
    }
}

/// The ops the dumps lack: `recapture.json` written into the output folder.
fn not_replayable(
    req: &ReplayRequest,
    at: (String, String),
    lacking: Vec<(String, dump::Holding)>,
) -> Result<Replayed> {
    let ops: Vec<(String, String)> = lacking
        .iter()
        .map(|(op, h)| (op.clone(), h.lacks().to_string()))
        .collect();
    let reason = format!(
        "the dumps lack {} of {}: replaying needs the op's tensors",
        ops.first().map_or("", |(_, l)| l.as_str()),
        ops.iter()
            .map(|(o, _)| o.as_str())
            .collect::<Vec<_>>()
            .join(" and ")
    );
    let keys = ops.iter().map(|(o, _)| o.clone()).collect();
    let recapture = match app::recapture_of((&at.0, &at.1), keys, reason, &req.out) {
        Some((bytes, note)) => {
            std::fs::create_dir_all(&req.out).map_err(|e| ProbeError::Output {
                path: req.out.clone(),
                msg: e.to_string(),
            })?;
            let path = PathBuf::from(note.path);
            atomic::write_bytes(&path, &bytes)?;
            Some(path)
        }
        None => None,
    };
    Ok(Replayed::NotReplayable { ops, at, recapture })
}

/// A Python to try, and how it was found (for the error naming what was tried).
struct Candidate {
    path: PathBuf,
    how: &'static str,
}

/// What the Python is asked to prove it can do: print this after importing torch and the
/// replay engine (a program that is not Python prints no such line, whatever it exits).
const CHECK_MARK: &str = "probe-replay-ok";

/// The first statement of every `python -c` probe runs (the check and the replay): drops
/// the entry `-c` puts first on `sys.path`, `''`, the current folder, which `probe replay`
/// runs from, so that a `torch.py`, `probe.py` or `json.py` there is never imported
/// (issue 70). Not `-I` (it would drop PYTHONPATH, which users set to find probe or torch:
/// their entries are kept, a `.` among them too) nor `-P` (Python 3.11+; the agent
/// supports 3.9). Nothing is imported before it but what the interpreter imports to start.
const SAFE_PATH: &str = "import sys; sys.path[:1] = [p for p in sys.path[:1] if p]";

/// `python -m probe.replay` with the current folder off `sys.path` from the start (the
/// arguments after it are `sys.argv[1:]`, as for `-m`).
const LAUNCHER: &str = "from probe.replay.cli import main; sys.exit(main())";

/// The Pythons to try, in order: `--python`, `$PROBE_PYTHON` (either alone when given),
/// else the Python beside this binary (the wheel installs `probe` into `<prefix>/bin/`),
/// then `python3` on PATH.
fn candidates(python: Option<&Path>) -> Vec<Candidate> {
    if let Some(p) = python {
        return vec![Candidate {
            path: p.to_path_buf(),
            how: "--python",
        }];
    }
    if let Some(p) = std::env::var_os(PYTHON_ENV).filter(|p| !p.is_empty()) {
        return vec![Candidate {
            path: PathBuf::from(p),
            how: "PROBE_PYTHON",
        }];
    }
    let mut out = Vec::new();
    if let Some(bin) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        for name in ["python3", "python"] {
            let p = bin.join(name);
            if p.is_file() {
                out.push(Candidate {
                    path: p,
                    how: "beside probe",
                });
            }
        }
    }
    out.push(Candidate {
        path: PathBuf::from("python3"),
        how: "on PATH",
    });
    out
}

/// Whether a Python has torch and `probe.replay`; why not, in a few words. Found, not
/// imported: importing torch takes seconds, and the replay imports it anyway (a torch that
/// is there but broken fails the replay with its one-line error, exit 2).
fn can_replay(python: &Path) -> std::result::Result<(), String> {
    let code = format!(
        "{SAFE_PATH}\n\
         import importlib.util as u\n\
         m = [n for n in ('torch', 'probe', 'probe.replay') if u.find_spec(n) is None][:1]\n\
         print(f\"ModuleNotFoundError: No module named {{m[0]!r}}\", file=sys.stderr) \
         if m else print({CHECK_MARK:?})"
    );
    let out = Command::new(python)
        .args(["-c", &code])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run it: {e}"))?;
    let said = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && said.lines().any(|l| l.trim() == CHECK_MARK) {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let why: String = last.trim().chars().take(200).collect();
    Err(if why.is_empty() {
        "not a Python that imports torch and probe.replay".into()
    } else {
        why
    })
}

/// The first Python that can replay, or the error naming every one tried.
fn find_python(python: Option<&Path>) -> Result<PathBuf> {
    let mut tried = Vec::new();
    for c in candidates(python) {
        match can_replay(&c.path) {
            Ok(()) => return Ok(c.path),
            Err(why) => tried.push(format!("{} ({}): {why}", c.path.display(), c.how)),
        }
    }
    Err(ProbeError::NoPython {
        tried: tried.join("; "),
    })
}

/// `python -m probe.replay`'s arguments (docs/replay.md), run as `python -c` [`SAFE_PATH`]
/// [`LAUNCHER`]: the dumps as given with the step and rank numbers, or the rank folders
/// where a label has no number.
fn python_args(
    req: &ReplayRequest,
    paths: &Sides<PathBuf>,
    sets: &Sides<DumpSet>,
    at: &(String, String),
    ops: &[String],
) -> Vec<std::ffi::OsString> {
    let mut a: Vec<std::ffi::OsString> =
        vec!["-c".into(), format!("{SAFE_PATH}; {LAUNCHER}").into()];
    let numbers = (
        app::label_number(&at.0, "step"),
        app::label_number(&at.1, "rank"),
    );
    let folder = |set: &DumpSet, given: &PathBuf| {
        dump::find_rank(set, &at.0, &at.1).map_or_else(|| given.clone(), |l| l.dir.clone())
    };
    let (bench, cmp) = match numbers {
        (Some(_), Some(_)) => (paths.bench.clone(), paths.cmp.clone()),
        _ => (
            folder(&sets.bench, &paths.bench),
            folder(&sets.cmp, &paths.cmp),
        ),
    };
    a.extend([
        "--bench".into(),
        dashless(bench),
        "--cmp".into(),
        dashless(cmp),
    ]);
    for op in ops {
        a.extend(["--op".into(), op.into()]);
    }
    a.extend(["-o".into(), dashless(req.out.clone())]);
    if let Some(d) = req.device {
        a.extend(["--device".into(), d.name().into()]);
    }
    if let Some(p) = &req.prelude {
        a.extend(["--prelude".into(), dashless(p.clone())]);
    }
    if let (Some(s), Some(r)) = numbers {
        a.extend([
            "--step".into(),
            s.to_string().into(),
            "--rank".into(),
            r.to_string().into(),
        ]);
    }
    if let Some(v) = req.rtol {
        a.extend(["--rtol".into(), v.to_string().into()]);
    }
    if let Some(v) = req.atol {
        a.extend(["--atol".into(), v.to_string().into()]);
    }
    if req.quiet {
        a.push("-q".into());
    }
    a
}

/// A path the Python's argument parser cannot take for an option (`-x` → `./-x`).
fn dashless(p: PathBuf) -> std::ffi::OsString {
    if p.as_os_str().to_string_lossy().starts_with('-') {
        Path::new(".").join(p).into_os_string()
    } else {
        p.into_os_string()
    }
}

/// Runs the Python with stdout and stderr passed through; its exit code when it is one of
/// the replay's (0 to 3), else an error (a crash, a signal).
fn run_python(python: &Path, args: &[std::ffi::OsString]) -> Result<u8> {
    let status = Command::new(python)
        .args(args)
        .stdin(Stdio::null())
        .status()
        .map_err(|e| ProbeError::External {
            program: python.to_path_buf(),
            msg: format!("cannot run python -m probe.replay: {e}"),
        })?;
    let failed = |msg: String| ProbeError::External {
        program: python.to_path_buf(),
        msg: format!("python -m probe.replay {msg}"),
    };
    match status.code() {
        Some(c @ 0..=3) => Ok(c as u8),
        Some(c) => Err(failed(format!(
            "exited with status {c}, none of the replay's (0 within tolerance, 1 reproduces, 2 bad input, 3 nothing replayable)"
        ))),
        None => Err(failed(signal_of(&status))),
    }
}

#[cfg(unix)]
fn signal_of(status: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match status.signal() {
        Some(s) => format!("was killed by signal {s}"),
        None => "ended without an exit status".into(),
    }
}

#[cfg(not(unix))]
fn signal_of(_: &std::process::ExitStatus) -> String {
    "ended without an exit status".into()
}
