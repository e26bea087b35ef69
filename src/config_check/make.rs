//! `probe config-pack`: a pack made from outside a training process (no Python needed):
//! this process's environment, the package list of a given Python interpreter, and
//! fingerprints of safetensors weight files. Same format as the Python `ConfigPack`.

use super::pack::{
    self, EnvDoc, Fingerprint, ManifestDoc, PackagesDoc, RecordDoc, RecordsDoc, Stat,
};
use super::secrets::{self, RedactMode};
use crate::atomic;
use crate::dtype::DType;
use crate::error::{ProbeError, Result};
use crate::progress::{Count, Progress};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What to put into the pack.
#[derive(Debug, Clone, Default)]
pub struct MakeOptions {
    /// Path of the pack zip to write (`-o`).
    pub out: PathBuf,
    /// Interpreter whose installed distributions are listed.
    pub python: Option<PathBuf>,
    /// safetensors files fingerprinted as step 0 of the pack's rank.
    pub weights: Vec<PathBuf>,
    /// What replaces secret values in `env.json` (`--redact`).
    pub redact: RedactMode,
    /// The pack's rank (`--rank`); else the launcher's `$RANK`; else 0.
    pub rank: Option<u64>,
    /// The job's number of ranks (`--world-size`); else the launcher's `$WORLD_SIZE`.
    pub world_size: Option<u64>,
}

/// The pack's rank and the job's world size: the flags, else the variables torchrun (and
/// most launchers) set, `RANK` and `WORLD_SIZE`, so that one `probe config-pack` per rank
/// makes a folder config-check reads as a job. `LOCAL_RANK` is not read: it is the rank
/// within a node, and packs of two nodes would both claim rank 0. A value that is not a
/// whole number, or a rank past the world size, is a usage error: a pack with a wrong rank
/// would be compared with the wrong peer.
pub fn job_position(
    rank: Option<u64>,
    world_size: Option<u64>,
    var: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<(u64, Option<u64>)> {
    let from_env = |name: &str, least: u64| -> Result<Option<u64>> {
        let Some(v) = var(name) else {
            return Ok(None);
        };
        match v.to_str().and_then(|t| t.trim().parse::<u64>().ok()) {
            Some(n) if n >= least => Ok(Some(n)),
            _ => Err(ProbeError::Usage(format!(
                "${name}={}: not a {} (give --{})",
                crate::config_file::printable(&format!("{v:?}")),
                if least == 0 {
                    "rank (a whole number from 0)"
                } else {
                    "world size (a whole number from 1)"
                },
                name.to_ascii_lowercase().replace('_', "-"),
            ))),
        }
    };
    let rank = match rank {
        Some(r) => r,
        None => from_env("RANK", 0)?.unwrap_or(0),
    };
    let world = match world_size {
        Some(0) => {
            return Err(ProbeError::Usage(
                "--world-size 0: must be 1 or more".into(),
            ))
        }
        Some(w) => Some(w),
        None => from_env("WORLD_SIZE", 1)?,
    };
    if let Some(w) = world.filter(|&w| rank >= w) {
        return Err(ProbeError::Usage(format!(
            "rank {rank} is not below the world size {w} (ranks count from 0)"
        )));
    }
    Ok((rank, world))
}

const LIST_SCRIPT: &str = r#"
import json, platform, importlib.metadata as md
d = {}
for x in md.distributions():
    try:
        n = x.metadata["Name"]
    except Exception:
        n = None
    if n and n not in d:
        d[n] = x.version
print(json.dumps({"python": {"version": platform.python_version(),
                             "implementation": platform.python_implementation()},
                  "distributions": d}))
"#;

fn python_packages(py: &Path) -> Result<(Value, BTreeMap<String, String>)> {
    let ext = |msg: String| ProbeError::External {
        program: py.to_path_buf(),
        msg,
    };
    let out = std::process::Command::new(py)
        .arg("-I")
        .arg("-c")
        .arg(LIST_SCRIPT)
        .output()
        .map_err(|e| ext(format!("cannot run: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or("").to_string();
        return Err(ext(format!(
            "listing packages failed ({}): {last}",
            out.status
        )));
    }
    #[derive(serde::Deserialize)]
    struct Listing {
        python: Value,
        distributions: BTreeMap<String, String>,
    }
    let l: Listing = serde_json::from_slice(&out.stdout)
        .map_err(|e| ext(format!("unexpected package listing: {e}")))?;
    Ok((l.python, l.distributions))
}

fn read_key(paths: &[PathBuf], key: Option<&str>) -> Option<String> {
    for p in paths {
        let Ok(text) = std::fs::read_to_string(p) else {
            continue;
        };
        match key {
            None => return text.lines().next().map(|l| l.trim().to_string()),
            Some(k) => {
                for line in text.lines() {
                    if let Some((a, b)) = line.split_once('=') {
                        if a.trim().eq_ignore_ascii_case(k) {
                            return Some(b.trim().trim_matches('"').to_string());
                        }
                    }
                }
            }
        }
    }
    None
}

/// CANN version from the Ascend toolkit's version info, when installed.
fn cann_version() -> Option<String> {
    let mut roots: Vec<PathBuf> = vec![];
    for var in ["ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            roots.push(PathBuf::from(v));
        }
    }
    roots.push("/usr/local/Ascend/ascend-toolkit/latest".into());
    roots.push("/usr/local/Ascend/cann".into());
    let mut files = vec![];
    for r in &roots {
        files.push(r.join("version.cfg"));
        files.push(r.join("version.info"));
        files.push(
            r.join(format!("{}-linux", std::env::consts::ARCH))
                .join("ascend_toolkit_install.info"),
        );
    }
    ["version", "toolkit_installed_version"]
        .iter()
        .find_map(|k| read_key(&files, Some(k)))
}

fn platform_info() -> (Value, Value, Value) {
    let os = json!({
        "system": match std::env::consts::OS { "linux" => "Linux", "macos" => "Darwin", "windows" => "Windows", o => o },
        "release": read_key(&["/proc/sys/kernel/osrelease".into()], None),
        "machine": std::env::consts::ARCH,
    });
    let cpu = json!({
        "model": read_key(&["/proc/cpuinfo".into()], Some("model name")),
        "count": std::thread::available_parallelism().map(|n| n.get()).ok(),
    });
    let driver = read_key(
        &["/usr/local/Ascend/driver/version.info".into()],
        Some("Version"),
    )
    .or_else(|| read_key(&["/proc/driver/nvidia/version".into()], None));
    let acc = json!({ "cann": cann_version(), "driver": driver });
    (os, cpu, acc)
}

/// Decoded statistics (f64) and the sha256 of a tensor's raw little-endian bytes.
pub(crate) fn fingerprint_bytes(dtype: &str, shape: &[usize], data: &[u8]) -> Fingerprint {
    let numel: usize = shape.iter().product();
    let mut fp = Fingerprint {
        sha256: Some(pack::sha256_hex(data)),
        dtype: Some(DType::parse(dtype).map_or_else(|| dtype.to_lowercase(), |d| d.to_string())),
        shape: Some(shape.iter().map(|&x| x as u64).collect()),
        numel: Some(numel as u64),
        ..Fingerprint::default()
    };
    if let Some(dt) = DType::parse(dtype) {
        if numel > 0 && data.len() >= numel * dt.size() {
            let (mut mx, mut mn, mut sum, mut sq) =
                (f64::NEG_INFINITY, f64::INFINITY, 0.0f64, 0.0f64);
            let mut nan = false;
            let mut buf = vec![0f64; 4096];
            for chunk in data[..numel * dt.size()].chunks(4096 * dt.size()) {
                let n = chunk.len() / dt.size();
                dt.decode(chunk, &mut buf[..n]);
                for &v in &buf[..n] {
                    nan |= v.is_nan();
                    mx = mx.max(v);
                    mn = mn.min(v);
                    sum += v;
                    sq += v * v;
                }
            }
            let nanned = |v: f64| Some(Stat(if nan { f64::NAN } else { v }));
            fp.max = nanned(mx);
            fp.min = nanned(mn);
            fp.mean = nanned(sum / numel as f64);
            fp.norm = nanned(sq.sqrt());
        }
    }
    fp
}

/// Fingerprints every tensor of `files`; `progress` counts the bytes hashed (the files'
/// sizes in all: a safetensors header is passed over as its file ends).
fn weight_records(files: &[PathBuf], rank: u64, progress: &Progress) -> Result<Vec<RecordDoc>> {
    let mut out: Vec<RecordDoc> = vec![];
    let multi = files.len() > 1;
    let sizes: Vec<u64> = files
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .collect();
    let stage = progress.stage("hash weights", sizes.iter().sum(), Count::Bytes);
    let mut done = 0u64;
    for (path, size) in files.iter().zip(&sizes) {
        stage.note(path.display().to_string());
        let file = std::fs::File::open(path).map_err(|e| ProbeError::io(path, e))?;
        // SAFETY: read-only map of a file we do not modify; a concurrent writer could only
        // change the bytes we hash, not memory safety of the slice reads.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ProbeError::io(path, e))?;
        let st =
            safetensors::SafeTensors::deserialize(&mmap).map_err(|e| ProbeError::BadShard {
                path: path.clone(),
                msg: e.to_string(),
            })?;
        let mut names: Vec<String> = st.names().into_iter().map(|s| s.to_string()).collect();
        names.sort();
        for name in names {
            let t = st.tensor(&name).map_err(|e| ProbeError::BadShard {
                path: path.clone(),
                msg: format!("{name}: {e}"),
            })?;
            let fp = fingerprint_bytes(&format!("{:?}", t.dtype()), t.shape(), t.data());
            stage.inc(t.data().len() as u64);
            let stem = path.file_name().map(|f| f.to_string_lossy().into_owned());
            let full = match (multi, stem) {
                (true, Some(s)) if out.iter().any(|r| r.name == name) => format!("{s}:{name}"),
                _ => name,
            };
            out.push(RecordDoc {
                step: 0,
                rank,
                name: full,
                fingerprint: fp,
            });
        }
        done += size;
        stage.set(done);
    }
    Ok(out)
}

fn put<T: Serialize>(
    z: &mut zip::ZipWriter<std::io::Cursor<Vec<u8>>>,
    name: &str,
    doc: &T,
) -> std::result::Result<(), String> {
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .unix_permissions(0o644);
    z.start_file(name, opts).map_err(|e| e.to_string())?;
    let bytes = serde_json::to_vec_pretty(doc).map_err(|e| e.to_string())?;
    z.write_all(&bytes).map_err(|e| e.to_string())
}

fn created_now() -> String {
    // RFC 3339 in UTC without a date crate: days since the epoch to a civil date.
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Writes a probe config pack to `opts.out` (atomically) and returns its path. `progress`
/// shows the weight hashing (see [`crate::progress`]).
pub fn make_pack(opts: &MakeOptions, progress: &Progress) -> Result<PathBuf> {
    let (rank, world_size) = job_position(opts.rank, opts.world_size, |k| std::env::var_os(k))?;
    let vars: BTreeMap<String, String> = std::env::vars_os()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect();
    let mut redacted = vec![];
    let vars = vars
        .into_iter()
        .map(|(k, v)| {
            let r = secrets::redact_named(&k, &v, opts.redact);
            if r != v {
                redacted.push(k.clone());
            }
            (k, r)
        })
        .collect();
    let env = EnvDoc { vars, redacted };
    let (os, cpu, mut acc) = platform_info();
    let mut packages = PackagesDoc {
        os: Some(os),
        cpu: Some(cpu),
        ..PackagesDoc::default()
    };
    if let Some(py) = &opts.python {
        let (pyinfo, dists) = python_packages(py)?;
        let find = |n: &str| {
            dists
                .iter()
                .find(|(k, _)| pack::normalize_dist(k) == n)
                .map(|(_, v)| v.clone())
        };
        if let Some(o) = acc.as_object_mut() {
            o.insert("torch".into(), json!(find("torch")));
            o.insert("torch_npu".into(), json!(find("torch-npu")));
        }
        packages.python = Some(pyinfo);
        packages.distributions = dists;
    }
    packages.accelerator = Some(acc);
    let weights = weight_records(&opts.weights, rank, progress)?;
    let device = if packages
        .distributions
        .keys()
        .any(|k| pack::normalize_dist(k) == "torch-npu")
    {
        "npu"
    } else {
        "cpu"
    };
    let mut entries = vec!["env.json", "manifest.json", "packages.json"];
    if !weights.is_empty() {
        entries.push("weights.json");
    }
    let manifest = ManifestDoc {
        format: pack::FORMAT.into(),
        version: pack::VERSION,
        producer: Some(format!("probe {} (config-pack)", env!("CARGO_PKG_VERSION"))),
        created: Some(created_now()),
        device: Some(device.into()),
        rank: Some(rank),
        world_size,
        steps: Some(0),
        entries: entries.iter().map(|s| s.to_string()).collect(),
        errors: vec![],
    };
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let written = (|| -> std::result::Result<Vec<u8>, String> {
        put(&mut z, "env.json", &env)?;
        put(&mut z, "manifest.json", &manifest)?;
        put(&mut z, "packages.json", &packages)?;
        if !weights.is_empty() {
            put(&mut z, "weights.json", &RecordsDoc { records: weights })?;
        }
        Ok(z.finish().map_err(|e| e.to_string())?.into_inner())
    })();
    let bytes = written.map_err(|msg| ProbeError::Output {
        path: opts.out.clone(),
        msg,
    })?;
    if let Some(dir) = opts.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| ProbeError::Output {
            path: dir.to_path_buf(),
            msg: e.to_string(),
        })?;
    }
    atomic::write_bytes(&opts.out, &bytes)?;
    Ok(opts.out.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_f32() {
        let data: Vec<u8> = [1.0f32, -2.0, 3.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let fp = fingerprint_bytes("F32", &[3], &data);
        assert_eq!(fp.dtype.as_deref(), Some("float32"));
        assert_eq!(fp.max, Some(Stat(3.0)));
        assert_eq!(fp.min, Some(Stat(-2.0)));
        assert!((fp.norm.unwrap().0 - 14f64.sqrt()).abs() < 1e-12);
    }

    #[test]
    fn date() {
        let s = created_now();
        assert_eq!(s.len(), 20);
        assert!(s.ends_with('Z'));
    }
}
