//! Golden baselines for the accuracy-regression gate (docs/ci.md, "Baselines"): a folder
//! holding the trusted benchmark dump, its config pack and calibration file when there are
//! ones, and `baseline.toml` saying what produced them, when and why they were accepted.
//!
//! ```text
//! BASELINE/
//!   baseline.toml      format, name, accepted (date), reason, probe_version, digest,
//!                      [previous] digest/accepted/reason, [dump] facts of the dump
//!   dump/              the benchmark dump (a copy)
//!   config_pack.zip    its config pack (optional)
//!   tolerances.toml    its calibration file (optional; `probe compare --config`)
//! ```
//!
//! [`accept`] (`probe baseline accept`) writes or replaces one, all or nothing, recording
//! the replaced baseline's digest (a killed one is rolled back by the next run, [`recover`]);
//! [`resolve`] lets `probe compare -b BASELINE` read the dump inside once the content still
//! has the recorded digest, which [`verify`] checks alone. A baseline may come from
//! anywhere (a checkout, an archive): it is read as plain files and folders only, never
//! through a link, never a device or FIFO.

use crate::error::{ProbeError, Result};
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The record's file name.
pub const FILE: &str = "baseline.toml";
/// The dump's folder inside a baseline.
pub const DUMP: &str = "dump";
/// The config pack's name inside a baseline.
pub const PACK: &str = "config_pack.zip";
/// The calibration file's name inside a baseline.
pub const CALIBRATION: &str = "tolerances.toml";
/// `format` of `baseline.toml`.
const FORMAT: &str = "probe-baseline";

/// The baseline accepted before this one, as `baseline.toml` records it.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct Previous {
    /// Its digest.
    pub digest: String,
    /// The day it was accepted.
    pub accepted: String,
    /// Why it was.
    pub reason: String,
}

/// What `baseline.toml` says of the dump.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
pub struct DumpFacts {
    /// The dump as given to `accept`.
    pub source: String,
    /// Capture mode (`tensor`, `statistics`, `checksum`), as its manifest says.
    #[serde(default)]
    pub mode: Option<String>,
    /// The framework and its version, the device, the capture's time, the producer, as
    /// its manifest says.
    #[serde(default)]
    pub framework: Option<String>,
    /// The framework's version.
    #[serde(default)]
    pub framework_version: Option<String>,
    /// The device the run used.
    #[serde(default)]
    pub device: Option<String>,
    /// When the dump was created.
    #[serde(default)]
    pub created: Option<String>,
    /// The program that wrote the dump.
    #[serde(default)]
    pub producer: Option<String>,
    /// Step/rank folders.
    #[serde(default)]
    pub units: Vec<String>,
}

/// The content of `baseline.toml`.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct Record {
    /// Always `probe-baseline`.
    pub format: String,
    /// 1.
    pub version: u32,
    /// Its name (the folder's, unless given).
    pub name: String,
    /// The day it was accepted (`YYYY-MM-DD`, UTC).
    pub accepted: String,
    /// Why it was.
    pub reason: String,
    /// The probe that accepted it.
    pub probe_version: String,
    /// `sha256:` of its content: the dump's files, the pack and the calibration file, by
    /// path ([`digest`]).
    pub digest: String,
    /// The baseline it replaced.
    #[serde(default)]
    pub previous: Option<Previous>,
    /// Whether a config pack is part of it.
    #[serde(default)]
    pub pack: bool,
    /// Whether a calibration file is part of it.
    #[serde(default)]
    pub calibration: bool,
    /// The dump's facts.
    pub dump: DumpFacts,
}

/// A baseline folder read.
#[derive(Debug, Clone)]
pub struct Baseline {
    /// The folder.
    pub dir: PathBuf,
    /// Its `baseline.toml`.
    pub record: Record,
}

impl Baseline {
    /// The dump inside.
    pub fn dump(&self) -> PathBuf {
        self.dir.join(DUMP)
    }

    /// Its calibration file, when it has one.
    pub fn calibration(&self) -> Option<PathBuf> {
        self.record.calibration.then(|| self.dir.join(CALIBRATION))
    }

    /// How a headline names it: `baseline NAME (accepted DATE, sha256:0123456789ab)`.
    pub fn said(&self) -> String {
        let short: String = self.record.digest.chars().take(19).collect();
        format!(
            "baseline {} (accepted {}, {short})",
            self.record.name, self.record.accepted
        )
    }
}

/// A TOML basic string.
fn quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Record {
    /// The record as `baseline.toml` (written by hand: the same record, the same bytes).
    pub fn toml(&self) -> String {
        let mut t = String::from(
            "# A probe baseline (docs/ci.md): `probe compare -b THIS_FOLDER` compares with the dump inside.\n",
        );
        let q = quoted;
        let _ = writeln!(t, "format = {}", q(&self.format));
        let _ = writeln!(t, "version = {}", self.version);
        let _ = writeln!(t, "name = {}", q(&self.name));
        let _ = writeln!(t, "accepted = {}", q(&self.accepted));
        let _ = writeln!(t, "reason = {}", q(&self.reason));
        let _ = writeln!(t, "probe_version = {}", q(&self.probe_version));
        let _ = writeln!(t, "digest = {}", q(&self.digest));
        let _ = writeln!(t, "pack = {}", self.pack);
        let _ = writeln!(t, "calibration = {}", self.calibration);
        if let Some(p) = &self.previous {
            t += "\n[previous]\n";
            let _ = writeln!(t, "digest = {}", q(&p.digest));
            let _ = writeln!(t, "accepted = {}", q(&p.accepted));
            let _ = writeln!(t, "reason = {}", q(&p.reason));
        }
        let d = &self.dump;
        t += "\n[dump]\n";
        let _ = writeln!(t, "source = {}", q(&d.source));
        for (k, v) in [
            ("mode", &d.mode),
            ("framework", &d.framework),
            ("framework_version", &d.framework_version),
            ("device", &d.device),
            ("created", &d.created),
            ("producer", &d.producer),
        ] {
            if let Some(v) = v {
                let _ = writeln!(t, "{k} = {}", q(v));
            }
        }
        let units: Vec<String> = d.units.iter().map(|u| q(u)).collect();
        let _ = writeln!(t, "units = [{}]", units.join(", "));
        t
    }

    /// Parses `baseline.toml` (`path` for messages).
    pub fn parse(text: &str, path: &Path) -> Result<Record> {
        let bad = |msg: String| ProbeError::BadConfig {
            path: path.to_path_buf(),
            msg: crate::config_file::printable(&msg),
        };
        let r: Record = toml::from_str(text).map_err(|e| bad(e.message().to_string()))?;
        if r.format != FORMAT || r.version != 1 {
            return Err(bad(format!(
                "not a baseline of this probe: format {:?} version {} (expected {FORMAT:?} version 1)",
                r.format, r.version
            )));
        }
        Ok(r)
    }
}

/// Reads the baseline in `dir`: its `baseline.toml` must parse and its dump be there, each
/// a plain file or folder, not a link.
pub fn read(dir: &Path) -> Result<Baseline> {
    let path = dir.join(FILE);
    if plain_file(&path)?.is_none() {
        return Err(ProbeError::NotFound(path));
    }
    let text = crate::config_file::read(&path)?;
    let record = Record::parse(&text, &path)?;
    match std::fs::symlink_metadata(dir.join(DUMP)) {
        Ok(m) if m.is_dir() => {}
        Ok(m) if m.file_type().is_symlink() => {
            return Err(not_plain(&dir.join(DUMP), m.file_type()))
        }
        _ => {
            return Err(ProbeError::BadConfig {
                path,
                msg: format!("the baseline's dump folder {DUMP}/ is missing beside it"),
            })
        }
    }
    if record.calibration && plain_file(&dir.join(CALIBRATION))?.is_none() {
        return Err(ProbeError::BadConfig {
            path,
            msg: format!("it names a calibration file and {CALIBRATION} is missing beside it"),
        });
    }
    Ok(Baseline {
        dir: dir.to_path_buf(),
        record,
    })
}

/// `probe compare -b PATH`: the baseline at `PATH` when it is one (None: a dump), put
/// right first if an `accept` was killed in it ([`recover`]), and its content checked
/// against the digest it records: a baseline changed since it was accepted is refused, not
/// compared with under its old name. A folder holding `dump/` without `baseline.toml` is an
/// error, not a dump.
pub fn resolve(path: &Path) -> Result<Option<Baseline>> {
    recover(path)?;
    if std::fs::symlink_metadata(path.join(FILE)).is_ok() {
        let b = read(path)?;
        checked(&b)?;
        return Ok(Some(b));
    }
    if path.join(DUMP).is_dir() && !path.join("manifest.json").exists() {
        return Err(ProbeError::BadConfig {
            path: path.join(FILE),
            msg: format!(
                "missing: {} holds a {DUMP}/ folder like a baseline but no {FILE} (probe baseline accept writes one; give -b {}/{DUMP} to compare with the dump alone)",
                path.display(),
                path.display()
            ),
        });
    }
    Ok(None)
}

/// Every file under `dir`, as paths relative to `base`, sorted. A baseline is plain files
/// in folders: a symbolic link (through which `accept` would copy, and `verify` read, what
/// lies outside the dump) or a device, FIFO or socket (which `verify` would read without
/// end) is refused, never followed.
fn files_under(dir: &Path, base: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| ProbeError::io(dir, e))?;
    for e in entries {
        let e = e.map_err(|e| ProbeError::io(dir, e))?;
        let p = e.path();
        let kind = e.file_type().map_err(|e| ProbeError::io(&p, e))?;
        if kind.is_dir() {
            files_under(&p, base, out)?;
        } else if !kind.is_file() {
            return Err(not_plain(&p, kind));
        } else if let Ok(rel) = p.strip_prefix(base) {
            out.push(rel.to_path_buf());
        }
    }
    out.sort();
    Ok(())
}

/// The error for an entry of a baseline that is not a plain file or folder.
fn not_plain(path: &Path, kind: std::fs::FileType) -> ProbeError {
    let what = if kind.is_symlink() {
        "a symbolic link"
    } else {
        "not a plain file (a device, FIFO or socket)"
    };
    ProbeError::Refused {
        path: path.to_path_buf(),
        msg: format!("{what}: a baseline holds plain files and folders only; probe neither follows nor reads it"),
    }
}

/// The length of the plain file `path` (None: absent), its kind checked before anything
/// opens it: opening a FIFO blocks, and a device reads without end.
fn plain_file(path: &Path) -> Result<Option<u64>> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ProbeError::io(path, e)),
        Ok(m) if m.is_file() => Ok(Some(m.len())),
        Ok(m) => Err(not_plain(path, m.file_type())),
    }
}

/// `sha256:` of a baseline's content in `dir`: each file of `dump/`, the pack and the
/// calibration file (those present), in path order, as its relative path (`/`-separated),
/// a NUL, its length (8 bytes, little-endian) and its bytes.
pub fn digest(dir: &Path) -> Result<String> {
    let mut files = Vec::new();
    files_under(&dir.join(DUMP), dir, &mut files)?;
    for name in [PACK, CALIBRATION] {
        if plain_file(&dir.join(name))?.is_some() {
            files.push(PathBuf::from(name));
        }
    }
    files.sort();
    let mut h = Sha256::new();
    for rel in &files {
        let path = dir.join(rel);
        let name: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        h.update(name.join("/").as_bytes());
        h.update([0u8]);
        let len = plain_file(&path)?.ok_or_else(|| ProbeError::NotFound(path.clone()))?;
        h.update(len.to_le_bytes());
        // At most the length checked above is read, whatever the file turned into since.
        let f = std::fs::File::open(&path).map_err(|e| ProbeError::io(&path, e))?;
        let mut f = std::io::Read::take(f, len);
        let mut buf = vec![0u8; 1 << 20];
        let mut seen = 0u64;
        loop {
            let n = std::io::Read::read(&mut f, &mut buf).map_err(|e| ProbeError::io(&path, e))?;
            let Some(chunk) = buf.get(..n).filter(|c| !c.is_empty()) else {
                break;
            };
            h.update(chunk);
            seen += n as u64;
        }
        if seen != len {
            return Err(ProbeError::BadConfig {
                path,
                msg: format!("{len} bytes listed, {seen} read: it changed while it was read"),
            });
        }
    }
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("sha256:{hex}"))
}

/// The digest of baseline `b`'s content, an error when it is not the one it records.
fn checked(b: &Baseline) -> Result<String> {
    let found = digest(&b.dir)?;
    if found != b.record.digest {
        return Err(ProbeError::BadConfig {
            path: b.dir.join(FILE),
            msg: format!(
                "the baseline changed since it was accepted: {} recorded, {found} found (accept it again, or restore it)",
                crate::config_file::printable(&b.record.digest)
            ),
        });
    }
    Ok(found)
}

/// `probe baseline verify`: the baseline in `dir` (put right first if an `accept` was
/// killed in it) still has the digest it records; that digest.
pub fn verify(dir: &Path) -> Result<String> {
    recover(dir)?;
    checked(&read(dir)?)
}

/// Copies the files `files` (relative paths, [`files_under`]'s) of folder `from` to `to`.
fn copy_tree(from: &Path, to: &Path, files: &[PathBuf]) -> Result<()> {
    std::fs::create_dir_all(to).map_err(|e| ProbeError::Output {
        path: to.to_path_buf(),
        msg: e.to_string(),
    })?;
    for rel in files {
        let dest = to.join(rel);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(|e| ProbeError::Output {
                path: parent.to_path_buf(),
                msg: e.to_string(),
            })?;
        }
        std::fs::copy(from.join(rel), &dest).map_err(|e| ProbeError::Output {
            path: dest.clone(),
            msg: e.to_string(),
        })?;
    }
    Ok(())
}

/// `probe baseline`'s subcommands. (Their arguments are declared here rather than in
/// `main.rs`, which is at its size limit.)
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Write or replace the baseline folder -o: the dump (and its pack and calibration
    /// file) copied in, and baseline.toml saying what it is, when and why it was accepted,
    /// and the digest of the baseline it replaces. All or nothing.
    Accept(AcceptRequest),
    /// Check that a baseline's content still has the digest its baseline.toml records
    /// (exit 2 when not).
    Verify {
        /// The baseline folder.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

/// Runs a `probe baseline` subcommand; the line it prints.
pub fn run(cmd: &Command) -> Result<String> {
    match cmd {
        Command::Accept(req) => {
            let r = accept(req)?;
            let replaced = r.previous.as_ref().map_or(String::new(), |p| {
                format!("; it replaces {} (accepted {})", p.digest, p.accepted)
            });
            Ok(format!(
                "accepted {} as baseline {} on {}: {}{replaced}\n",
                crate::config_file::printable(&req.out.display().to_string()),
                crate::config_file::printable(&r.name),
                r.accepted,
                r.digest
            ))
        }
        Command::Verify { dir } => Ok(format!("ok: {}\n", verify(dir)?)),
    }
}

/// What `probe baseline accept` was asked to do.
#[derive(Debug, Clone, clap::Args)]
pub struct AcceptRequest {
    /// The benchmark dump to keep (copied into DIR/dump).
    #[arg(long, value_name = "DUMP")]
    pub dump: PathBuf,
    /// Its config pack (copied into DIR/config_pack.zip).
    #[arg(long, value_name = "PACK.zip")]
    pub pack: Option<PathBuf>,
    /// Its calibration file (probe calibrate's; copied into DIR/tolerances.toml, and used
    /// by `probe compare -b DIR` unless --config is given).
    #[arg(long, value_name = "FILE")]
    pub calibration: Option<PathBuf>,
    /// Why it is accepted (recorded in baseline.toml).
    #[arg(long)]
    pub reason: String,
    /// Its name (default: the folder's).
    #[arg(long)]
    pub name: Option<String>,
    /// The day of acceptance, YYYY-MM-DD (default: today, UTC).
    #[arg(long, value_name = "YYYY-MM-DD")]
    pub date: Option<String>,
    /// The baseline folder to write or replace.
    #[arg(short = 'o', long = "out", value_name = "DIR")]
    pub out: PathBuf,
}

/// Days since 1970-01-01 as a civil date (UTC), `YYYY-MM-DD`.
fn civil(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The day of acceptance: `date` checked, or today (UTC).
fn day(date: Option<&str>) -> Result<String> {
    let Some(d) = date else {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        return Ok(civil(i64::try_from(secs / 86_400).unwrap_or(0)));
    };
    let parts: Vec<&str> = d.split('-').collect();
    let ok = match parts.as_slice() {
        [y, m, dd] => {
            let num = |s: &str, len: usize| {
                (s.len() == len && s.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| s.parse::<u32>().ok())
                    .flatten()
            };
            matches!((num(y, 4), num(m, 2), num(dd, 2)),
                (Some(_), Some(m), Some(dd)) if (1..=12).contains(&m) && (1..=31).contains(&dd))
        }
        _ => false,
    };
    if !ok {
        return Err(ProbeError::Usage(format!(
            "--date {}: give a day as YYYY-MM-DD",
            crate::config_file::printable(d)
        )));
    }
    Ok(d.to_string())
}

/// The dump's facts: its step/rank folders and its manifest's.
fn facts(dump: &Path) -> Result<DumpFacts> {
    let set = crate::dump::discover(dump)?;
    if set.ranks.is_empty() {
        return Err(ProbeError::EmptyDump(dump.to_path_buf()));
    }
    let manifest = dump.join("manifest.json");
    let m = if manifest.is_file() {
        crate::dump::read_manifest(&manifest)?;
        let bytes = std::fs::read(&manifest).map_err(|e| ProbeError::io(&manifest, e))?;
        serde_json::from_slice::<crate::schema::dump::ManifestRecord>(&bytes).ok()
    } else {
        None
    };
    let text = |s: &str| (!s.is_empty()).then(|| s.to_string());
    Ok(DumpFacts {
        source: dump.display().to_string(),
        mode: m.as_ref().map(|m| m.mode.clone()),
        framework: m.as_ref().and_then(|m| text(&m.framework)),
        framework_version: m.as_ref().and_then(|m| m.framework_version.clone()),
        device: m.as_ref().and_then(|m| text(&m.device)),
        created: m.as_ref().and_then(|m| text(&m.created)),
        producer: m.as_ref().and_then(|m| m.producer.clone()),
        units: set
            .ranks
            .iter()
            .map(|r| format!("{}/{}", r.step, r.rank))
            .collect(),
    })
}

/// The baseline `out` replaces (None: a new or empty folder); a folder with other files
/// and no `baseline.toml`, or a corrupt one, is refused.
fn replaced(out: &Path) -> Result<Option<Previous>> {
    if out.exists() && !out.is_dir() {
        return Err(ProbeError::Usage(format!(
            "-o {}: not a folder",
            out.display()
        )));
    }
    if out.join(FILE).is_file() {
        let old = read(out)?;
        return Ok(Some(Previous {
            digest: old.record.digest,
            accepted: old.record.accepted,
            reason: old.record.reason,
        }));
    }
    let has_files = out.is_dir()
        && std::fs::read_dir(out)
            .map_err(|e| ProbeError::io(out, e))?
            .next()
            .is_some();
    if has_files {
        return Err(ProbeError::Usage(format!(
            "-o {}: a folder with other files and no {FILE}: not replaced (give a new or empty folder, or a baseline's)",
            out.display()
        )));
    }
    Ok(None)
}

/// Moves the staged baseline into `out`, the replaced one's files out of the way first
/// (`baseline.toml` first, so that a reader meanwhile finds no baseline rather than a
/// mixed one; the new `baseline.toml` last). On a failure the old files are put back.
fn swap(staged: &Path, out: &Path) -> Result<()> {
    let aside = out.join(crate::atomic::scratch_name(ASIDE, ""));
    let _ = std::fs::remove_dir_all(&aside);
    let err = |path: &Path, e: std::io::Error| ProbeError::Output {
        path: path.to_path_buf(),
        msg: e.to_string(),
    };
    std::fs::create_dir(&aside).map_err(|e| err(&aside, e))?;
    let names = [FILE, DUMP, PACK, CALIBRATION];
    let mut moved = Vec::new();
    let mut result = Ok(());
    for name in names {
        if out.join(name).exists() {
            if let Err(e) = std::fs::rename(out.join(name), aside.join(name)) {
                result = Err(err(&out.join(name), e));
                break;
            }
            moved.push(name);
        }
    }
    if result.is_ok() {
        for name in [DUMP, PACK, CALIBRATION, FILE] {
            if staged.join(name).exists() {
                if let Err(e) = std::fs::rename(staged.join(name), out.join(name)) {
                    result = Err(err(&out.join(name), e));
                    break;
                }
            }
        }
    }
    if result.is_err() {
        for name in [FILE, DUMP, PACK, CALIBRATION] {
            if staged.join(name).exists() || !out.join(name).exists() {
                continue;
            }
            let _ = std::fs::rename(out.join(name), staged.join(name));
        }
        for name in moved {
            let _ = std::fs::rename(aside.join(name), out.join(name));
        }
    }
    let _ = std::fs::remove_dir_all(&aside);
    result
}

/// The kind of the scratch folder [`swap`] moves the replaced baseline's files into:
/// `.probe-replaced-HOST-PID` ([`crate::atomic::scratch_name`]; `.probe-replaced-PID` before
/// issue 70).
const ASIDE: &str = "replaced";

/// Puts right what a killed `accept` left in `dir` (its files moved aside and the new ones
/// partly in), so that readers and the next `accept` find a whole baseline, the old or the
/// new one. Only folders of [`ASIDE`]'s naming of this machine's processes that are gone
/// are touched; another one is refused (an `accept` under way, or one of another machine).
fn recover(dir: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let prefix = format!(".probe-{ASIDE}-");
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with(&prefix) {
            continue;
        }
        let aside = e.path();
        let refused = |msg: &str| ProbeError::Refused {
            path: aside.clone(),
            msg: msg.into(),
        };
        if !crate::atomic::left_by_dead_process(&name, ASIDE) {
            return Err(refused("an accept of this baseline is under way, or was killed on another machine: run again once it is over, or put it right by hand"));
        }
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            return Err(refused(
                "not a folder: not what an accept leaves; remove it by hand",
            ));
        }
        roll_back(dir, &aside)?;
    }
    Ok(())
}

/// Rolls a killed [`swap`] back. It moved the old baseline's files into `aside`, [`FILE`]
/// first, then the new ones in, [`FILE`] last; where it stopped follows from what lies where:
/// [`FILE`] in `dir`: nothing was moved yet, or all was, and `dir` holds a whole baseline;
/// else, no [`FILE`] in `aside` either: there was no old baseline, and what `dir` holds of
/// the new one goes; [`DUMP`] in both: the old files were all aside and the new ones partly
/// in, which go (the dump last). Then what `aside` holds moves back ([`FILE`] last) and
/// `aside` goes. Each step leaves one of these states, so a kill during it is put right by
/// the next run too.
fn roll_back(dir: &Path, aside: &Path) -> Result<()> {
    let here = |name: &str| std::fs::symlink_metadata(dir.join(name)).is_ok();
    let there = |name: &str| std::fs::symlink_metadata(aside.join(name)).is_ok();
    let err = |path: PathBuf, e: std::io::Error| ProbeError::Output {
        path,
        msg: e.to_string(),
    };
    if !here(FILE) {
        if !there(FILE) || (there(DUMP) && here(DUMP)) {
            for name in [CALIBRATION, PACK, DUMP] {
                let p = dir.join(name);
                let removed = match std::fs::symlink_metadata(&p) {
                    Err(_) => Ok(()),
                    Ok(m) if m.is_dir() => std::fs::remove_dir_all(&p),
                    Ok(_) => std::fs::remove_file(&p),
                };
                removed.map_err(|e| err(p, e))?;
            }
        }
        for name in [DUMP, PACK, CALIBRATION, FILE] {
            if !there(name) {
                continue;
            }
            if here(name) {
                return Err(ProbeError::Refused {
                    path: dir.join(name),
                    msg: format!(
                        "also in {}: which baseline it belongs to is unclear; put it right by hand",
                        aside.display()
                    ),
                });
            }
            std::fs::rename(aside.join(name), dir.join(name))
                .map_err(|e| err(dir.join(name), e))?;
        }
    }
    std::fs::remove_dir_all(aside).map_err(|e| err(aside.to_path_buf(), e))
}

/// `probe baseline accept`: copies the dump (and the pack and calibration file) into
/// `out` with a `baseline.toml` recording what it is, when and why it was accepted, and
/// the digest of the baseline it replaces; all or nothing. Returns the record written.
pub fn accept(req: &AcceptRequest) -> Result<Record> {
    let reason = req.reason.trim();
    if reason.is_empty() {
        return Err(ProbeError::Usage(
            "--reason must say why this baseline is accepted".into(),
        ));
    }
    let accepted = day(req.date.as_deref())?;
    let dump = facts(&req.dump)?;
    let mut listed = Vec::new();
    files_under(&req.dump, &req.dump, &mut listed)?;
    for f in [&req.pack, &req.calibration].into_iter().flatten() {
        if !f.is_file() {
            return Err(ProbeError::NotFound(f.clone()));
        }
    }
    crate::atomic::refuse_inside(&req.out, &[&req.dump])?;
    recover(&req.out)?;
    let previous = replaced(&req.out)?;
    crate::atomic::prepare_output_dir(&req.out)?;
    let staging = crate::atomic::Staging::new(&req.out)?;
    let staged = staging.path("");
    copy_tree(&req.dump, &staging.path(DUMP), &listed)?;
    for (from, name) in [(&req.pack, PACK), (&req.calibration, CALIBRATION)] {
        if let Some(from) = from {
            std::fs::copy(from, staging.path(name)).map_err(|e| ProbeError::Output {
                path: staging.path(name),
                msg: e.to_string(),
            })?;
        }
    }
    let name = match &req.name {
        Some(n) => n.clone(),
        None => std::path::absolute(&req.out)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "baseline".into()),
    };
    let record = Record {
        format: FORMAT.into(),
        version: 1,
        name,
        accepted,
        reason: reason.to_string(),
        probe_version: env!("CARGO_PKG_VERSION").into(),
        digest: digest(&staged)?,
        previous,
        pack: req.pack.is_some(),
        calibration: req.calibration.is_some(),
        dump,
    };
    crate::atomic::write_bytes(&staging.path(FILE), record.toml().as_bytes())?;
    swap(&staged, &req.out)?;
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_are_civil_dates() {
        assert_eq!(civil(0), "1970-01-01");
        assert_eq!(civil(19_723), "2024-01-01");
        assert_eq!(civil(19_782), "2024-02-29");
        assert_eq!(civil(-1), "1969-12-31");
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let r = Record {
            format: FORMAT.into(),
            version: 1,
            name: "n \"q\" \\ \u{1b}".into(),
            accepted: "2024-05-01".into(),
            reason: "new CANN\nline".into(),
            probe_version: "0.1.0".into(),
            digest: "sha256:00".into(),
            previous: Some(Previous {
                digest: "sha256:11".into(),
                accepted: "2024-04-01".into(),
                reason: "first".into(),
            }),
            pack: true,
            calibration: false,
            dump: DumpFacts {
                source: "d".into(),
                mode: Some("tensor".into()),
                units: vec!["step0/rank0".into()],
                ..DumpFacts::default()
            },
        };
        let back = Record::parse(&r.toml(), Path::new("baseline.toml")).expect("parses");
        assert_eq!(back, r);
    }

    #[test]
    fn dates_are_checked() {
        assert!(day(Some("2024-13-01")).is_err());
        assert!(day(Some("24-01-01")).is_err());
        assert_eq!(day(Some("2024-01-31")).ok(), Some("2024-01-31".into()));
    }
}
