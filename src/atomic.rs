//! Atomic output files: write to a temporary file in the destination folder, then rename;
//! and sets of files written all or nothing (`Staging`).
//!
//! A CI job that reads `summary.json` while probe is still writing, or after probe was
//! killed, must never see half a file, nor a new `summary.json` beside the previous run's
//! workbook.

use crate::error::{ProbeError, Result};
use std::io::Write;
use std::path::Path;

/// Writes a file atomically; `fill` receives a buffered writer on the temporary file.
pub(crate) fn write_with<F>(path: &Path, fill: F) -> Result<()>
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
pub(crate) fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    write_with(path, |w| w.write_all(bytes).map_err(|e| e.to_string()))
}

/// The temporary name used next to `path` (same folder, so the rename cannot cross devices).
pub(crate) fn temp_path(path: &Path) -> std::path::PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// Checks before the long work that `dir` exists (creating it) and is writable.
pub(crate) fn prepare_output_dir(dir: &Path) -> Result<()> {
    let err = |msg: String| ProbeError::Output {
        path: dir.to_path_buf(),
        msg,
    };
    if dir.exists() && !dir.is_dir() {
        return Err(err("exists and is not a directory".into()));
    }
    std::fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
    // A crafted `.probe-current` is refused before the long work, not after it.
    current_version(dir)?;
    let probe_file = dir.join(scratch_name("write-test", ""));
    std::fs::write(&probe_file, b"").map_err(|e| err(format!("not writable: {e}")))?;
    let _ = std::fs::remove_file(&probe_file);
    sweep(dir);
    Ok(())
}

/// The link in an output folder that names the folder holding its current set of files:
/// every file of the set is a link `NAME -> .probe-current/NAME`, so renaming one new link
/// over this one switches the whole set at once.
pub(crate) const CURRENT: &str = ".probe-current";
/// The prefix of the hidden folders that hold a set (`.probe-reports-HOST-PID-NANOS`).
const VERSION_PREFIX: &str = ".probe-reports-";

/// Whether `name` is exactly a version folder's name as [`Staging::new`] makes it,
/// `.probe-reports-HOST-PID-NANOS` (HOST of [`host`]'s characters): one path component, so
/// neither `/` nor `..` can take it out of the output folder.
fn version_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(VERSION_PREFIX) else {
        return false;
    };
    let mut parts = rest.rsplitn(3, '-');
    let (Some(nanos), Some(pid), Some(host)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(nanos)
        && digits(pid)
        && !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
}

/// The version folder [`CURRENT`] names in `out` (None: no link, as in a folder of an older
/// probe or a new one, or a link to a folder that is gone). The link is data of the folder,
/// which may come from anywhere (a checkout, an archive), and the folder it names is removed
/// at the next switch: a target that is not exactly a name of [`version_name`]'s form, or
/// that is not a real folder (a link, a file), is refused, so that nothing outside `out` is
/// ever removed.
pub(crate) fn current_version(out: &Path) -> Result<Option<String>> {
    let at = out.join(CURRENT);
    let Ok(meta) = std::fs::symlink_metadata(&at) else {
        return Ok(None);
    };
    let refused = |msg: String| ProbeError::Refused {
        path: at.clone(),
        msg: format!("{msg}; probe removes nothing through it: remove it by hand"),
    };
    if !meta.file_type().is_symlink() {
        return Err(refused("not the link probe makes".into()));
    }
    let target = std::fs::read_link(&at).map_err(|e| ProbeError::io(&at, e))?;
    let Some(name) = target.to_str().filter(|n| version_name(n)) else {
        return Err(refused(format!(
            "it points to {}, not a report folder of probe's naming ({VERSION_PREFIX}HOST-PID-N)",
            target.to_string_lossy()
        )));
    };
    match std::fs::symlink_metadata(out.join(name)) {
        Err(_) => Ok(None),
        Ok(m) if m.is_dir() => Ok(Some(name.to_string())),
        Ok(_) => Err(refused(format!(
            "it points to {name}, which is not a folder (a link or a file)"
        ))),
    }
}

/// This machine's name as it enters scratch names: letters, digits, `_` and `.` only (no
/// `-`: the pid follows the first one), at most 64 of them.
fn host() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let h: String = raw
        .trim()
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '.' => c,
            _ => '_',
        })
        .take(64)
        .collect();
    if h.is_empty() {
        "host".into()
    } else {
        h
    }
}

/// The owner part of this process's scratch names: `HOST-PID`.
pub(crate) fn owner() -> String {
    format!("{}-{}", host(), std::process::id())
}

/// A scratch name of this process in an output folder: `.probe-KIND-HOST-PID` and `rest`
/// (which starts with `-` or `.`, or is empty). A later run removes it once this process is
/// gone ([`sweep`]).
pub(crate) fn scratch_name(kind: &str, rest: &str) -> String {
    format!(".probe-{kind}-{}{rest}", owner())
}

/// Whether process `pid` of this machine may still be running. Where that cannot be known
/// (no `/proc`), always yes: nothing is removed.
fn alive(pid: u32) -> bool {
    if pid == std::process::id() || !Path::new("/proc/self").exists() {
        return true;
    }
    Path::new("/proc").join(pid.to_string()).exists()
}

/// The kinds of scratch entries probe leaves in an output folder while it works.
const SCRATCH_KINDS: [&str; 5] = ["reports", "staging", "rows", "write-test", "link"];

/// Of a scratch name, whether a process of this machine wrote it that is gone: its entry
/// is left over from a killed run. Names of probe before issue 53 (`.probe-staging-PID`,
/// `.probe-rows-PID-N.msgpack`: no host) count as this machine's.
fn orphaned(name: &str, here: &str, kinds: &[&str]) -> bool {
    let Some(rest) = name.strip_prefix(".probe-") else {
        return false;
    };
    let Some((_, tail)) = kinds
        .iter()
        .find_map(|k| Some((*k, rest.strip_prefix(k)?.strip_prefix('-')?)))
    else {
        return false;
    };
    let mut parts = tail.splitn(3, '-');
    let first = parts.next().unwrap_or_default();
    let (owner_host, pid) = match first.parse::<u32>() {
        Ok(pid) => (here, Some(pid)),
        Err(_) => (first, parts.next().and_then(|p| p.parse::<u32>().ok())),
    };
    owner_host == here && pid.is_some_and(|p| !alive(p))
}

/// Whether `name` is a scratch name of `kind` ([`scratch_name`]) of a process of this
/// machine that is gone: what a killed run left, which the caller may put right.
pub(crate) fn left_by_dead_process(name: &str, kind: &str) -> bool {
    orphaned(name, &host(), &[kind])
}

/// Removes what killed runs of this machine left in `dir`: staging and version folders no
/// link names, parked rows, write tests. Entries of live processes, of other machines (a
/// shared file system) and the folder [`CURRENT`] names are kept. Errors are ignored: this
/// only frees space.
pub(crate) fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let current = std::fs::read_link(dir.join(CURRENT)).ok();
    let here = host();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !orphaned(&name, &here, &SCRATCH_KINDS) || current.as_deref() == Some(Path::new(&name)) {
            continue;
        }
        let p = e.path();
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        let _ = if is_dir {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
    }
}

/// Where a test stops the process as a kill would (no destructor runs): `PROBE_TEST_CRASH_AT`
/// naming the point, read by debug builds only.
fn crash_point(at: &str) {
    if cfg!(debug_assertions) && std::env::var("PROBE_TEST_CRASH_AT").as_deref() == Ok(at) {
        std::process::abort();
    }
}

/// A new version folder's name: `.probe-reports-HOST-PID-NANOS`.
fn version_folder_name() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    scratch_name("reports", &format!("-{nanos}"))
}

/// A set of output files written all or nothing, across a kill too: the files are written
/// into a new hidden version folder inside the output folder (`.probe-reports-HOST-PID-N`);
/// [`Staging::commit`] makes each file of the set a link `NAME -> .probe-current/NAME` (once:
/// it stays from run to run) and then switches the one link [`CURRENT`] to the new folder by
/// a rename: a reader sees the whole previous set or the whole new one, never a mix, whenever
/// the process is killed. Dropped without a commit (an error on the way), the version folder
/// is removed and the output folder keeps what it had.
#[derive(Debug)]
pub(crate) struct Staging {
    out: std::path::PathBuf,
    dir: std::path::PathBuf,
    committed: bool,
}

impl Staging {
    /// Creates the version folder inside `out` (which must exist), after removing what
    /// killed runs left there.
    pub fn new(out: &Path) -> Result<Staging> {
        sweep(out);
        let dir = out.join(version_folder_name());
        std::fs::create_dir(&dir).map_err(|e| ProbeError::Output {
            path: dir.clone(),
            msg: e.to_string(),
        })?;
        Ok(Staging {
            out: out.to_path_buf(),
            dir,
            committed: false,
        })
    }

    /// Where to write the file `name` of the set.
    pub(crate) fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.join(name)
    }

    /// Makes the staged files the output folder's set: one rename of [`CURRENT`]. Files of
    /// the previous set this one lacks are removed after the switch; `names` lists the set
    /// (their order only matters where links cannot be made: then the files are moved one by
    /// one in this order, the one readers look at first last). Nothing changes if a
    /// destination is a directory, or if [`CURRENT`] is not what probe makes
    /// ([`current_version`]).
    pub(crate) fn commit(mut self, names: &[String]) -> Result<()> {
        let err = |path: std::path::PathBuf, e: std::io::Error| ProbeError::Output {
            path,
            msg: e.to_string(),
        };
        for n in names {
            let p = self.out.join(n);
            if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
                return Err(ProbeError::Output {
                    path: p,
                    msg: "is a directory".into(),
                });
            }
        }
        let version = self
            .dir
            .file_name()
            .map(std::path::PathBuf::from)
            .unwrap_or_default();
        let previous = current_version(&self.out)?;
        let tmp = self.out.join(scratch_name("link", ""));
        let _ = std::fs::remove_file(&tmp);
        if link(&version, &tmp).is_err() {
            return self.move_one_by_one(names);
        }
        let previous = self.adopt_plain_files(names, previous)?;
        // Each name a link through CURRENT: unchanged where it already is one; a file (now
        // also in the previous set) replaced by a link that resolves to the same bytes.
        for n in names {
            let to = Path::new(CURRENT).join(n);
            let at = self.out.join(n);
            if std::fs::read_link(&at).ok().as_deref() == Some(to.as_path()) {
                continue;
            }
            let t = self.out.join(scratch_name("link", &format!("-{n}")));
            let _ = std::fs::remove_file(&t);
            link(&to, &t).map_err(|e| err(t.clone(), e))?;
            std::fs::rename(&t, &at).map_err(|e| err(at.clone(), e))?;
        }
        crash_point("before-switch");
        std::fs::rename(&tmp, self.out.join(CURRENT))
            .map_err(|e| err(self.out.join(CURRENT), e))?;
        self.committed = true;
        crash_point("after-switch");
        // The previous set's folder (checked again: a real folder of its own name, never a
        // link), and its links this set does not have.
        if let Some(prev) = previous.filter(|p| Path::new(p) != version) {
            let at = self.out.join(prev);
            if std::fs::symlink_metadata(&at).is_ok_and(|m| m.is_dir()) {
                let _ = std::fs::remove_dir_all(at);
            }
        }
        self.unlink_dangling();
        Ok(())
    }

    /// Plain files where the set's links go (an older probe's reports, which had no
    /// [`CURRENT`]) are first put into the version folder [`CURRENT`] names (hard-linked,
    /// else copied), one made for them and [`CURRENT`] pointed at it when there is none:
    /// replaced by its link, each name then reads the same bytes until the switch, whenever
    /// the process is killed. Returns the version folder [`CURRENT`] names.
    fn adopt_plain_files(
        &self,
        names: &[String],
        previous: Option<String>,
    ) -> Result<Option<String>> {
        let plain: Vec<&String> = names
            .iter()
            .filter(|n| std::fs::symlink_metadata(self.out.join(n)).is_ok_and(|m| m.is_file()))
            .collect();
        if plain.is_empty() {
            return Ok(previous);
        }
        let err = |path: std::path::PathBuf, e: std::io::Error| ProbeError::Output {
            path,
            msg: e.to_string(),
        };
        let fresh = previous.is_none();
        let name = previous.unwrap_or_else(version_folder_name);
        let dir = self.out.join(&name);
        if fresh {
            std::fs::create_dir(&dir).map_err(|e| err(dir.clone(), e))?;
        }
        for n in plain {
            let (from, to) = (self.out.join(n), dir.join(n));
            let _ = std::fs::remove_file(&to);
            if std::fs::hard_link(&from, &to).is_err() {
                std::fs::copy(&from, &to).map_err(|e| err(to.clone(), e))?;
            }
        }
        if fresh {
            let tmp = self.out.join(scratch_name("link", ".adopted"));
            let _ = std::fs::remove_file(&tmp);
            link(Path::new(&name), &tmp).map_err(|e| err(tmp.clone(), e))?;
            let at = self.out.join(CURRENT);
            std::fs::rename(&tmp, &at).map_err(|e| err(at, e))?;
        }
        Ok(Some(name))
    }

    /// Removes the links through [`CURRENT`] that name no file of the current set.
    fn unlink_dangling(&self) {
        let Ok(entries) = std::fs::read_dir(&self.out) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let ours = std::fs::read_link(&p).is_ok_and(|t| t.starts_with(CURRENT));
            if ours && !p.exists() {
                let _ = std::fs::remove_file(&p);
            }
        }
    }

    /// Where links cannot be made (a file system without them): every staged file moved
    /// into the output folder, one by one in the order given.
    fn move_one_by_one(mut self, names: &[String]) -> Result<()> {
        for name in names {
            let (from, to) = (self.dir.join(name), self.out.join(name));
            std::fs::rename(&from, &to).map_err(|e| ProbeError::Output {
                path: to.clone(),
                msg: e.to_string(),
            })?;
        }
        self.committed = false; // the emptied folder goes
        Ok(())
    }
}

/// A symbolic link `at -> to` (relative targets: the folder can move).
fn link(to: &Path, at: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(to, at)
    }
    #[cfg(not(unix))]
    {
        let _ = (to, at);
        Err(std::io::Error::other("no symbolic links here"))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The absolute form of `p`, resolving symbolic links as far as the path exists.
fn resolved(p: &Path) -> std::path::PathBuf {
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    };
    let mut existing = abs.as_path();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => break,
        }
    }
    let mut out = std::fs::canonicalize(existing).unwrap_or_else(|_| existing.to_path_buf());
    for name in rest.into_iter().rev() {
        out.push(name);
    }
    out
}

/// Refuses an output folder inside one of the input dumps: reports would be written among
/// the dump's files (and read back as part of it by the next compare).
pub(crate) fn refuse_inside(out: &Path, inputs: &[&Path]) -> Result<()> {
    let o = resolved(out);
    for input in inputs {
        let i = resolved(input);
        if i.is_dir() && o.starts_with(&i) {
            return Err(ProbeError::Usage(format!(
                "-o {} is inside the input dump {}: choose an output folder outside it",
                out.display(),
                input.display()
            )));
        }
    }
    Ok(())
}
