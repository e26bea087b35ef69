//! The `probe` command line. Thin: parse, call one library function, map the outcome to
//! an exit code ([`probe::gate`] names them: 0 pass, 1 divergence at or above
//! `--fail-on`, 2 usage or input error, 3 nothing comparable, 4 compared but incomplete).

use clap::{Parser, Subcommand};
use probe::compare::{AlignRule, Level, Shard};
use probe::dump::{Numbers, Selection};
use probe::gate::{self, FailOn, EXIT_INPUT, EXIT_PASS};
use probe::progress::Progress;
use probe::report::XlsxRows;
use probe::{app, config_check, report, synth, ProbeError};
use std::path::PathBuf;
use std::process::ExitCode;

/// mimalloc instead of the system allocator: a compare allocates and frees millions of small
/// records (op records, tensor names, rows), and glibc's malloc spent ~20 % of a statistics
/// compare in malloc/free and page faults (`perf`, 100,000 tensors). Its v2 (Cargo.toml): it
/// hands freed memory back after 10 ms where v3 waits a second, long enough for the memory
/// a stage frees (the aligner's working set, the report writers' buffers) to add to the
/// next stage's peak (a million-tensor pair: 500 → 460 MB, docs/performance.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "probe",
    version,
    about = "Precision debugging for deep-learning training: \
compare two operator dumps and name the first divergent operator."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Compare a benchmark dump with a comparison dump, op by op.
    Compare(CompareArgs),
    /// Find where NaN/Inf comes from in one dump (no benchmark needed).
    Scan(ScanArgs),
    /// Write a deterministic synthetic benchmark/comparison dump pair (for tests and demos).
    Synth(SynthArgs),
    /// Learn per-op tolerances from clean pairs (the benchmark against reference runs or
    /// reruns) and write them as a `probe compare --config` file.
    Calibrate(CalibrateArgs),
    /// Combine the shard results of `probe compare --shard` into the reports of the whole
    /// run (the same summary.json as one unsharded compare), without reading a tensor.
    Merge(MergeArgs),
    /// Compare two config packs (probe's or msprobe's config_check_pack.zip, either side).
    ConfigCheck(ConfigCheckArgs),
    /// Make a config pack without Python: env, a Python's packages, weight fingerprints.
    ConfigPack(ConfigPackArgs),
    /// Compare two checkpoints per parameter, across layouts (docs/checkpoints.md).
    CkptCompare(probe::ckpt::Args),
    /// Prove the culprit: run an op again (by default the compare's first divergent op)
    /// from the dumped tensors, through the capture agent's Python (`python -m
    /// probe.replay`). Exit 0 within tolerance, 1 reproduces, 2 bad input, 3 nothing
    /// replayable. See docs/replay.md.
    Replay(probe::replay::ReplayRequest),
    /// Golden baselines for a CI gate: accept a dump (with its config pack and calibration
    /// file) as the benchmark, recording when and why; `probe compare -b DIR` reads it.
    /// See docs/ci.md.
    #[command(subcommand)]
    Baseline(probe::baseline::Command),
    /// What a dump costs: the capture agent's forecast (manifest) and the bytes each step
    /// and rank holds on disk. See docs/capture.md.
    Cost(probe::cost::Args),
    /// For the capture agent: write its statistics kernel into DIR and print its path.
    #[command(hide = true)]
    AgentKernel(probe::agent_kernel::Args),
}

fn run_agent_kernel(a: probe::agent_kernel::Args) -> Result<u8, ProbeError> {
    let path = probe::agent_kernel::write_kernel(&a.dir)?;
    say_out(&format!("{}", path.display()));
    Ok(EXIT_PASS)
}

#[derive(clap::Args)]
struct ConfigCheckArgs {
    /// Benchmark pack (the trusted environment), or a folder (or quoted glob) of its per-rank
    /// packs: rank i against rank i, and each job's ranks against their peers.
    #[arg(value_name = "BENCH", required_unless_present = "compare")]
    bench: Option<PathBuf>,
    /// Comparison pack (the environment under suspicion), or a folder (or glob) of packs.
    #[arg(value_name = "CMP", required_unless_present = "compare")]
    cmp: Option<PathBuf>,
    /// The two packs, msprobe's way: `-c BENCH.zip CMP.zip` (instead of the positional form).
    #[arg(short = 'c', long = "compare", num_args = 2, value_names = ["BENCH.zip", "CMP.zip"],
          conflicts_with_all = ["bench", "cmp"])]
    compare: Option<Vec<PathBuf>>,
    /// Framework of the packs (msprobe's `-f`): accepted for pasted command lines; the pack says.
    #[arg(short = 'f', long = "framework", value_name = "NAME")]
    framework: Option<String>,
    /// Output folder for config_check.xlsx, config_check.html and config_check.json.
    #[arg(
        short = 'o',
        long = "out",
        value_name = "DIR",
        default_value = "probe-config-check"
    )]
    out: PathBuf,
    /// Rules (TOML): ignore lists, equivalences, severities. See docs/config-check.md.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Exit 1 when a difference reaches this level: error, warning or never.
    #[arg(long, default_value = "error")]
    fail_on: FailOn,
    /// Report formats (comma separated): json, xlsx, html, junit, markdown.
    #[arg(long, value_delimiter = ',', default_value = "json,xlsx,html")]
    format: Vec<String>,
    /// Print nothing on stdout, and no progress bars on stderr.
    #[arg(short, long)]
    quiet: bool,
}

/// `probe compare` of two monitor folders (`probe.Monitor`; docs/monitor.md).
#[derive(clap::Args)]
struct TrendArgs {
    /// Monitors: one envelope (relative difference) for every series instead of
    /// calibrating on the first steps.
    #[arg(long, value_name = "REL")]
    envelope: Option<f64>,
    /// Monitors: calibrate the envelopes on this many first steps (default: a tenth of the
    /// steps, 3 to 20).
    #[arg(long, value_name = "N")]
    calibration_steps: Option<usize>,
    /// Monitors: a series parts beyond K times its largest difference on the calibration
    /// steps.
    #[arg(long = "trend-k", value_name = "K", default_value_t = probe::monitor::trend::DEFAULT_K)]
    trend_k: f64,
}

#[derive(clap::Args)]
struct ConfigPackArgs {
    /// The pack to write.
    #[arg(short = 'o', long = "out", value_name = "PACK.zip")]
    out: PathBuf,
    /// Python interpreter whose installed packages are listed.
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
    /// safetensors weight files to fingerprint.
    #[arg(long, value_name = "FILE", num_args = 1..)]
    weights: Vec<PathBuf>,
    /// What replaces secret values: hash (`<redacted:sha256:8 hex>`, equal secrets compare
    /// equal; a short secret can be guessed from it) or drop (`<redacted>`).
    #[arg(long, value_name = "MODE", default_value = "hash")]
    redact: config_check::secrets::RedactMode,
    /// The pack's rank (default: $RANK as torchrun sets it, else 0; not $LOCAL_RANK).
    #[arg(long, value_name = "R")]
    rank: Option<u64>,
    /// The job's number of ranks (default: $WORLD_SIZE, else not recorded).
    #[arg(long = "world-size", value_name = "N")]
    world_size: Option<u64>,
    /// No progress bar on stderr (there is none when stderr is not a terminal).
    #[arg(short, long)]
    quiet: bool,
}

fn run_ckpt_compare(a: probe::ckpt::Args) -> Result<u8, ProbeError> {
    let (req, quiet) = a.request();
    let s = probe::ckpt::run(&req)?;
    if !quiet {
        stdout(&probe::ckpt::report::terminal_summary(&s, &req.out));
    }
    Ok(s.exit_code)
}

fn run_config_check(a: ConfigCheckArgs) -> Result<u8, ProbeError> {
    let rules = match &a.config {
        Some(p) => config_check::rules::Rules::from_file(p)?,
        None => config_check::rules::Rules::default(),
    };
    let opts = config_check::CheckOptions {
        rules,
        fail_on: a.fail_on,
    };
    let (bench, cmp) = match (a.compare, a.bench, a.cmp) {
        (Some(v), _, _) if v.len() == 2 => (v[0].clone(), v[1].clone()),
        (_, Some(b), Some(c)) => (b, c),
        _ => {
            return Err(ProbeError::Usage(
                "give two packs: BENCH.zip CMP.zip".into(),
            ))
        }
    };
    note_framework(a.framework.as_deref());
    let progress = Progress::for_stderr(a.quiet);
    let report =
        config_check::run_and_write_formats(&bench, &cmp, &a.out, &opts, &a.format, &progress)?;
    if !a.quiet {
        stdout(&config_check::output::terminal_summary(&report));
    }
    Ok(report.exit_code)
}

/// msprobe's `-f pytorch|mindspore` is accepted so that pasted command lines run: the
/// dumps and packs say which framework wrote them.
fn note_framework(f: Option<&str>) {
    if let Some(f) = f {
        say_err(&format!(
            "probe: note: -f {f} ignored: the input says which framework wrote it"
        ));
    }
}

fn run_config_pack(a: ConfigPackArgs) -> Result<u8, ProbeError> {
    let opts = config_check::make::MakeOptions {
        out: a.out,
        python: a.python,
        weights: a.weights,
        redact: a.redact,
        rank: a.rank,
        world_size: a.world_size,
    };
    let path = config_check::make::make_pack(&opts, &Progress::for_stderr(a.quiet))?;
    say_err(&format!("probe: wrote {}", path.display()));
    Ok(EXIT_PASS)
}

/// What `probe compare` and `probe merge` share: the gate and the reports.
#[derive(clap::Args)]
struct VerdictArgs {
    /// Exit 1 when the verdict reaches this level: error, warning or never.
    #[arg(long, default_value = "error")]
    fail_on: FailOn,
    /// The comparison is incomplete (exit 4) when more than this share of either side's
    /// tensors in a step/rank pair has no counterpart: 0.05 or 5%.
    #[arg(long, value_name = "FRACTION", default_value_t = gate::DEFAULT_MAX_UNMATCHED, value_parser = gate::parse_fraction)]
    max_unmatched: f64,
    /// Report formats to write (comma separated): json, parquet, xlsx, html, junit, markdown.
    #[arg(long, value_delimiter = ',', default_value = "json,parquet,xlsx,html")]
    format: Vec<String>,
    /// Tensor rows in compare.xlsx: all, or N (default 20000): the first N rows, then
    /// warnings and errors with 2 rows either side, up to about max(N, 1000) more rows
    /// (compare.parquet always has every row).
    #[arg(long, value_name = "N|all", default_value = "20000")]
    xlsx_rows: XlsxRows,
    /// Megabytes of compared rows held in memory until the reports are written; past it
    /// each step/rank pair's rows wait in a temporary file in the output folder (merge:
    /// are read from the shards as needed), so memory stays flat whatever the number of
    /// ranks. 0: every pair's but the last.
    #[arg(long, value_name = "MB", default_value = "256")]
    row_memory: u64,
}

#[derive(clap::Args)]
struct CompareArgs {
    /// Benchmark dump (the trusted run): a dump root, a step<S> or a rank<R> folder.
    #[arg(short = 'b', long = "bench", value_name = "DUMP")]
    bench: PathBuf,
    /// Comparison dump (the run under suspicion).
    #[arg(short = 'c', long = "cmp", value_name = "DUMP")]
    cmp: PathBuf,
    /// Output folder for compare.html, compare.xlsx, compare.parquet and summary.json.
    #[arg(
        short = 'o',
        long = "out",
        value_name = "DIR",
        default_value = "probe-out"
    )]
    out: PathBuf,
    /// Tolerance overrides (TOML): per dtype and per op pattern. See docs/compare.md.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// A reference run: the benchmark's own device under the comparison's precision (or a
    /// rerun), differing from the benchmark by expected drift only. Each tensor is judged
    /// against k times the reference's error on it. See docs/compare.md, "Drift or defect".
    #[arg(long, value_name = "DUMP")]
    reference: Option<PathBuf>,
    /// With --reference: how many times the reference's error a tensor may have.
    #[arg(long = "reference-k", value_name = "K", default_value_t = probe::compare::envelope::DEFAULT_K)]
    reference_k: f64,
    #[command(flatten)]
    verdict: VerdictArgs,
    /// Worker threads (default: all cores). Results do not depend on it.
    #[arg(long)]
    threads: Option<usize>,
    /// Compare only API records (`api`), only module records (`module`), or both (`mix`, the
    /// default); the verdict follows.
    #[arg(short = 'l', long = "level", default_value = "mix")]
    level: Level,
    /// How calls are paired: `structural` (within module calls, by signature, with fused-op
    /// mapping and module fallback; the default) or `name` (msprobe's flattened names).
    #[arg(long, default_value = "structural", value_name = "RULE")]
    align: AlignRule,
    /// Framework of the dumps (msprobe's `-f`): accepted for pasted command lines; the dumps say.
    #[arg(short = 'f', long = "framework", value_name = "NAME")]
    framework: Option<String>,
    /// Only these steps: numbers and ranges of the `step<N>` folders (`0,2,5-9`).
    #[arg(long, value_name = "LIST")]
    steps: Option<Numbers>,
    /// Only these ranks: numbers and ranges of the `rank<N>` folders (`0-7`).
    #[arg(long, value_name = "LIST")]
    ranks: Option<Numbers>,
    /// Compare only part I of N (`0/4` .. `3/4`: whole ranks, in contiguous blocks), or
    /// `all` pairs found here (node-local dumps), and write a shard result into -o for
    /// `probe merge` instead of the reports. See docs/scale.md.
    #[arg(long, value_name = "I/N")]
    shard: Option<Shard>,
    /// Mapping file (repeatable): probe's TOML, or msprobe's API/data/cell/layer mapping
    /// YAML. Earlier files take precedence over later ones and over the built-in table.
    /// See docs/compare.md, "Mapping files".
    #[arg(long = "mapping", value_name = "FILE")]
    mapping: Vec<PathBuf>,
    #[command(flatten)]
    trend: TrendArgs,
    /// Print nothing on stdout, and no progress bars on stderr.
    #[arg(short, long)]
    quiet: bool,
}

#[derive(clap::Args)]
struct CalibrateArgs {
    /// Benchmark dump (the trusted run).
    #[arg(short = 'b', long = "bench", value_name = "DUMP")]
    bench: PathBuf,
    /// A reference run (repeatable): the benchmark's own device under the port's precision,
    /// or, with --reruns, a rerun of the benchmark's configuration.
    #[arg(short = 'r', long = "reference", value_name = "DUMP", required = true)]
    references: Vec<PathBuf>,
    /// The references are reruns of the benchmark's configuration on its device: the ops
    /// whose outputs differ from run to run are named nondeterministic (a determinism map).
    #[arg(long)]
    reruns: bool,
    /// The calibration file to write (TOML, for `probe compare --config`).
    #[arg(
        short = 'o',
        long = "out",
        value_name = "FILE",
        default_value = "tolerances.toml"
    )]
    out: PathBuf,
    /// A tensor passes within K times its op's reference error.
    #[arg(long, value_name = "K", default_value_t = probe::compare::envelope::DEFAULT_K)]
    k: f64,
    /// The quantile of an op's errors over every pair, step and rank taken as its
    /// reference error.
    #[arg(long, value_name = "Q", default_value_t = 0.99)]
    quantile: f64,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Compare only API records (`api`), only module records (`module`), or both (`mix`).
    #[arg(short = 'l', long = "level", default_value = "mix")]
    level: Level,
    /// Mapping file (repeatable), as for compare.
    #[arg(long = "mapping", value_name = "FILE")]
    mapping: Vec<PathBuf>,
    /// Only these steps (`0,2,5-9`).
    #[arg(long, value_name = "LIST")]
    steps: Option<Numbers>,
    /// Only these ranks (`0-7`).
    #[arg(long, value_name = "LIST")]
    ranks: Option<Numbers>,
    /// No progress bars on stderr, nothing on stdout.
    #[arg(short, long)]
    quiet: bool,
}

fn run_calibrate(a: CalibrateArgs) -> Result<u8, ProbeError> {
    let req = app::CalibrateRequest {
        bench: a.bench,
        references: a.references,
        reruns: a.reruns,
        out: a.out,
        k: a.k,
        quantile: a.quantile,
        threads: a.threads,
        level: a.level,
        mappings: a.mapping,
        selection: Selection {
            steps: a.steps,
            ranks: a.ranks,
        },
    };
    let r = app::calibrate(&req, &Progress::for_stderr(a.quiet))?;
    for w in &r.warnings {
        say_err(&format!("probe: warning: {}", report::printable(w)));
    }
    if !a.quiet {
        say_out(&format!(
            "wrote {}: {} rules from {} tensors",
            report::printable(&r.path.display().to_string()),
            r.rules,
            r.tensors
        ));
        if req.reruns {
            if r.nondeterministic.is_empty() {
                say_out("no op's outputs differ from run to run");
            }
            for (p, e) in &r.nondeterministic {
                say_out(&format!(
                    "nondeterministic: {} (run-to-run error up to {e:.3e})",
                    report::printable(p)
                ));
            }
        }
    }
    Ok(EXIT_PASS)
}

#[derive(clap::Args)]
struct MergeArgs {
    /// The shard results: the -o folders of `probe compare --shard`.
    #[arg(value_name = "SHARD_OUT", required = true)]
    shards: Vec<PathBuf>,
    /// Output folder for the reports.
    #[arg(
        short = 'o',
        long = "out",
        value_name = "DIR",
        default_value = "probe-out"
    )]
    out: PathBuf,
    #[command(flatten)]
    verdict: VerdictArgs,
    /// Print nothing on stdout.
    #[arg(short, long)]
    quiet: bool,
}

/// A compare's (or merge's) warnings on stderr, its summary on stdout; its exit code.
fn print_compare(summary: &probe::schema::summary::Summary, quiet: bool) -> u8 {
    for w in &summary.warnings {
        say_err(&format!("probe: warning: {w}"));
    }
    if !quiet {
        stdout(&report::terminal_summary(summary));
    }
    summary.exit_code
}

fn run_merge(a: MergeArgs) -> Result<u8, ProbeError> {
    let req = app::MergeRequest {
        shards: a.shards,
        out: a.out,
        fail_on: a.verdict.fail_on,
        max_unmatched: a.verdict.max_unmatched,
        formats: a.verdict.format,
        xlsx_rows: a.verdict.xlsx_rows,
        row_memory_mb: a.verdict.row_memory,
    };
    let merged = app::merge(&req, &Progress::for_stderr(a.quiet))?;
    if let Some(why) = &merged.encoded_again {
        say_err(&format!(
            "probe: note: the parquet table was encoded again, not copied from the shards' ({why})"
        ));
    }
    Ok(print_compare(&merged.summary, a.quiet))
}

#[derive(clap::Args)]
struct ScanArgs {
    /// The dump to scan: a dump root, a step<S> or a rank<R> folder (probe or msprobe).
    #[arg(value_name = "DUMP")]
    dump: PathBuf,
    /// Output folder for scan.html, scan.xlsx, scan.parquet and summary.json.
    #[arg(
        short = 'o',
        long = "out",
        value_name = "DIR",
        default_value = "probe-scan"
    )]
    out: PathBuf,
    /// Exit 1 when the verdict reaches this level: error (NaN/Inf), warning (overflow risk,
    /// underflow) or never.
    #[arg(long, default_value = "error")]
    fail_on: FailOn,
    /// Report formats to write (comma separated): json, parquet, xlsx, html, junit, markdown.
    #[arg(long, value_delimiter = ',', default_value = "json,parquet,xlsx,html")]
    format: Vec<String>,
    /// Only these steps: numbers and ranges of the `step<N>` folders (`0,2,5-9`).
    #[arg(long, value_name = "LIST")]
    steps: Option<Numbers>,
    /// Only these ranks: numbers and ranges of the `rank<N>` folders (`0-7`).
    #[arg(long, value_name = "LIST")]
    ranks: Option<Numbers>,
    /// A finite |value| above the dtype's largest value divided by this is an overflow risk.
    #[arg(long, default_value_t = 16.0)]
    overflow_margin: f64,
    /// Print nothing on stdout, and no progress bars on stderr.
    #[arg(short, long)]
    quiet: bool,
}

fn run_scan(a: ScanArgs) -> Result<u8, ProbeError> {
    let monitor = probe::monitor::is_monitor(&a.dump);
    if monitor && (a.steps.is_some() || a.ranks.is_some()) {
        return Err(ProbeError::Usage(
            "--steps and --ranks apply to dumps, not to monitor folders".into(),
        ));
    }
    let req = app::ScanRequest {
        dump: a.dump,
        out: a.out,
        fail_on: a.fail_on,
        formats: a.format,
        options: probe::scan::ScanOptions {
            margin: a.overflow_margin,
            selection: Selection {
                steps: a.steps,
                ranks: a.ranks,
            },
        },
    };
    if monitor {
        let summary = app::monitor_scan(&req, &Progress::for_stderr(a.quiet))?;
        return Ok(print_monitor(&summary, a.quiet));
    }
    let summary = app::scan(&req, &Progress::for_stderr(a.quiet))?;
    for w in &summary.warnings {
        say_err(&format!("probe: warning: {w}"));
    }
    if !a.quiet {
        stdout(&report::scan_terminal_summary(&summary));
    }
    Ok(summary.exit_code)
}

#[derive(clap::Args)]
struct SynthArgs {
    /// Output folder; `bench/` and `cmp/` are written inside.
    #[arg(short = 'o', long = "out", value_name = "DIR")]
    out: PathBuf,
    /// tensor, statistics or checksum.
    #[arg(long, default_value = "tensor")]
    mode: String,
    #[arg(long, default_value_t = 3)]
    blocks: usize,
    #[arg(long, default_value_t = 16)]
    width: usize,
    #[arg(long, default_value_t = 4)]
    batch: usize,
    #[arg(long, default_value_t = 1)]
    steps: usize,
    #[arg(long, default_value_t = 1234)]
    seed: u64,
    /// Perturb the forward output of this op in the comparison run (e.g. Functional.gelu.1).
    #[arg(long, value_name = "OP")]
    inject: Option<String>,
    /// Relative size of the injected perturbation.
    #[arg(long, default_value_t = 0.05)]
    inject_scale: f32,
    /// Relative noise on every op output of the comparison run.
    #[arg(long, default_value_t = 0.0)]
    noise: f32,
    /// Comparison run in bfloat16.
    #[arg(long)]
    bf16: bool,
    /// Perturb the first weight of this block in the comparison run.
    #[arg(long, value_name = "BLOCK")]
    perturb_weight: Option<usize>,
    /// Put a NaN into the forward output of this op in the comparison run.
    #[arg(long, value_name = "OP")]
    nan: Option<String>,
    /// Data-parallel ranks; more than one adds collectives (all_reduce, DDP buckets). A
    /// step of every rank is held in memory: ranks² × (blocks + 1) at most 2^22 (1024
    /// ranks take up to 3 blocks), else a usage error.
    #[arg(long, default_value_t = 1)]
    ranks: usize,
    /// The rank of the comparison run that --perturb-op / --perturb-collective perturb.
    #[arg(long, value_name = "RANK")]
    perturb_rank: Option<usize>,
    /// Perturb the output of this op on --perturb-rank only (e.g. Functional.gelu.1).
    #[arg(long, value_name = "OP")]
    perturb_op: Option<String>,
    /// Perturb the forward all_reduce's output on --perturb-rank (inputs agree everywhere).
    #[arg(long)]
    perturb_collective: bool,
    /// Benchmark data instead of the model: this many tensors ...
    #[arg(long, value_name = "N")]
    bulk: Option<usize>,
    /// ... of this many f32 elements each.
    #[arg(long, default_value_t = 1 << 20)]
    bulk_elems: usize,
}

/// The dump options `probe compare` refuses with monitor folders (they would be ignored).
fn refuse_dump_options(a: &CompareArgs) -> Result<(), ProbeError> {
    let given = [
        ("--config", a.config.is_some()),
        ("--reference", a.reference.is_some()),
        ("--shard", a.shard.is_some()),
        ("--mapping", !a.mapping.is_empty()),
        ("--steps", a.steps.is_some()),
        ("--ranks", a.ranks.is_some()),
    ];
    match given.iter().find(|(_, g)| *g) {
        Some((name, _)) => Err(ProbeError::Usage(format!(
            "{name} applies to dumps, not to monitor folders"
        ))),
        None => Ok(()),
    }
}

/// `probe compare` of two monitor folders.
fn run_trend(a: CompareArgs) -> Result<u8, ProbeError> {
    for (side, path) in [("benchmark", &a.bench), ("comparison", &a.cmp)] {
        if !probe::monitor::is_monitor(path) {
            return Err(ProbeError::Usage(format!(
                "the {side} {} is not a monitor folder, the other is: compare two monitors or two dumps",
                path.display()
            )));
        }
    }
    refuse_dump_options(&a)?;
    let req = app::TrendRequest {
        bench: a.bench,
        cmp: a.cmp,
        out: a.out,
        options: probe::monitor::trend::TrendOptions {
            envelope: a.trend.envelope,
            calibration_steps: a.trend.calibration_steps,
            k: a.trend.trend_k,
        },
        fail_on: a.verdict.fail_on,
        formats: a.verdict.format,
        threads: a.threads,
    };
    let summary = app::trend(&req, &Progress::for_stderr(a.quiet))?;
    Ok(print_monitor(&summary, a.quiet))
}

/// Results on stdout: a stdout closed by its reader (`| head`) is the reader's choice, not
/// a failure of the run (`print!` would panic).
/// Text for stdout, every control character but the newline escaped (strings from the
/// inputs: op keys, module paths, file names); a closed stdout (`| head`) is the reader's
/// choice, not an error of the run.
fn stdout(text: &str) {
    use std::io::Write as _;
    let text = report::printable_lines(text);
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

/// One line on stdout, escaped as [`stdout`] escapes.
fn say_out(line: &str) {
    stdout(&format!("{line}\n"));
}

/// One line on stderr, escaped as [`stdout`] escapes.
fn say_err(line: &str) {
    use std::io::Write as _;
    let line = report::printable_lines(line);
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// A monitor compare's or scan's warnings on stderr, its headline on stdout; its exit code.
fn print_monitor(s: &probe::monitor::summary::MonitorSummary, quiet: bool) -> u8 {
    for w in &s.warnings {
        say_err(&format!("probe: warning: {}", report::printable(w)));
    }
    if !quiet {
        // A closed stdout (`| head`) is the reader's choice, not an error of the run.
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "{}: {}",
            s.verdict_name(),
            report::printable(&s.headline)
        );
        if let Some(r) = &s.recapture {
            let _ = writeln!(out, "recapture: {}", report::printable(r));
        }
        for (format, path) in &s.outputs {
            let _ = writeln!(out, "{format}: {}", report::printable(path));
        }
    }
    s.exit_code
}

fn run_compare(a: CompareArgs) -> Result<u8, ProbeError> {
    if probe::monitor::is_monitor(&a.bench) || probe::monitor::is_monitor(&a.cmp) {
        return run_trend(a);
    }
    let t = &a.trend;
    if t.envelope.is_some()
        || t.calibration_steps.is_some()
        || t.trend_k != probe::monitor::trend::DEFAULT_K
    {
        return Err(ProbeError::Usage(
            "--envelope, --calibration-steps and --trend-k apply to monitor folders, not to dumps"
                .into(),
        ));
    }
    let req = app::CompareRequest {
        bench: a.bench,
        cmp: a.cmp,
        out: a.out,
        config: a.config,
        reference: a.reference.map(|root| probe::compare::envelope::Reference {
            root,
            k: a.reference_k,
        }),
        fail_on: a.verdict.fail_on,
        formats: a.verdict.format,
        threads: a.threads,
        level: a.level,
        align: a.align,
        mappings: a.mapping,
        max_unmatched: a.verdict.max_unmatched,
        selection: Selection {
            steps: a.steps,
            ranks: a.ranks,
        },
        shard: a.shard,
        xlsx_rows: a.verdict.xlsx_rows,
        row_memory_mb: a.verdict.row_memory,
    };
    note_framework(a.framework.as_deref());
    let progress = Progress::for_stderr(a.quiet);
    if let Some(shard) = req.shard {
        let r = app::compare_shard(&req, shard, &progress)?;
        for w in &r.warnings {
            say_err(&format!("probe: warning: {w}"));
        }
        if !a.quiet {
            say_out(&format!(
                "shard {}: {} of {} step/rank pairs compared; shard result in {} (combine the shards with probe merge)",
                r.shard,
                r.units,
                r.planned,
                r.out.display()
            ));
        }
        return Ok(EXIT_PASS);
    }
    let summary = app::compare(&req, &progress)?;
    Ok(print_compare(&summary, a.quiet))
}

fn run_replay(req: probe::replay::ReplayRequest) -> Result<u8, ProbeError> {
    let done = probe::replay::replay(&req, &Progress::for_stderr(req.quiet))?;
    if !req.quiet {
        stdout(&done.message(&req.out));
    }
    Ok(done.exit_code())
}

fn run_synth(a: SynthArgs) -> Result<u8, ProbeError> {
    match a.bulk {
        Some(n) => synth::write_bulk(&a.out, &a.mode, n, a.bulk_elems, a.noise.max(1e-7), a.seed)?,
        None => {
            let o = synth::SynthOptions {
                mode: a.mode,
                blocks: a.blocks,
                width: a.width,
                batch: a.batch,
                seed: a.seed,
                inject: a.inject,
                inject_scale: a.inject_scale,
                noise: a.noise,
                cmp_bf16: a.bf16,
                perturb_weight: a.perturb_weight,
                nan: a.nan,
                steps: a.steps,
                ranks: a.ranks,
                perturb_rank: a.perturb_rank,
                perturb_op: a.perturb_op,
                perturb_collective: a.perturb_collective,
            };
            synth::write_pair(&a.out, &o)?;
        }
    }
    say_err(&format!(
        "probe: wrote {}/bench and {}/cmp",
        a.out.display(),
        a.out.display()
    ));
    Ok(EXIT_PASS)
}

fn main() -> ExitCode {
    probe::memory::small_pages_only();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                EXIT_INPUT
            } else {
                EXIT_PASS
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let outcome = match cli.cmd {
        Cmd::Compare(a) => run_compare(a),
        Cmd::Merge(a) => run_merge(a),
        Cmd::Calibrate(a) => run_calibrate(a),
        Cmd::Scan(a) => run_scan(a),
        Cmd::Synth(a) => run_synth(a),
        Cmd::ConfigCheck(a) => run_config_check(a),
        Cmd::ConfigPack(a) => run_config_pack(a),
        Cmd::CkptCompare(a) => run_ckpt_compare(a),
        Cmd::AgentKernel(a) => run_agent_kernel(a),
        Cmd::Replay(a) => run_replay(a),
        Cmd::Baseline(c) => probe::baseline::run(&c).map(|line| {
            stdout(&line);
            EXIT_PASS
        }),
        Cmd::Cost(a) => probe::cost::run(&a).map(|text| {
            stdout(&text);
            EXIT_PASS
        }),
    };
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            say_err(&format!("probe: error: {e}"));
            ExitCode::from(e.exit_code())
        }
    }
}
