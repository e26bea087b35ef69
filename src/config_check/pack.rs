//! Config packs of both kinds, read into one model.
//!
//! * probe packs (`manifest.json` with `"format": "probe-config-pack"`), written by the
//!   Python `probe.ConfigPack` and by `probe config-pack`; see docs/config-check.md and
//!   schemas/probe-config-pack.v1.schema.json. The `*Doc` types below are that format.
//! * msprobe's `config_check_pack.zip` (`env`, `pip`, `hyperparameters/…`,
//!   `dataset/step{S}/rank{R}/dataset.json`, `weights/…/weight.json`, `random/rank{R}.json`).

use super::archive::Archive;
pub use super::secrets::is_secret_name;
use super::secrets::{self as sec, RedactMode};
use crate::error::{ProbeError, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Value of `format` in a probe pack's `manifest.json`.
pub(crate) const FORMAT: &str = "probe-config-pack";
/// The pack format version this probe writes: 2 adds `manifest.world_size` and
/// `random.generators` to version 1.
pub(crate) const VERSION: u32 = 2;
/// The oldest pack format version this probe reads.
pub(crate) const MIN_VERSION: u32 = 1;

// ---------------------------------------------------------------------------------------
// The probe pack format (v1), entry by entry.

/// `manifest.json`: what the pack is and who made it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ManifestDoc {
    /// Always `FORMAT`.
    pub format: String,
    /// Pack format version (`VERSION`).
    pub version: u32,
    /// What wrote the pack (`probe.ConfigPack`, `probe config-pack`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer: Option<String>,
    /// When the pack was written: UTC, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    /// `cpu`, `cuda` or `npu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Rank of the process that wrote the pack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u64>,
    /// Number of ranks of the job (version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u64>,
    /// Steps whose inputs and random draws were captured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
    /// Names of the pack's entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entries: Vec<String>,
    /// Collection failures (the training run went on).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// `env.json`: the environment variables.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct EnvDoc {
    /// Every environment variable; secret-looking ones hold `sha256:<hex>` of the value.
    pub vars: BTreeMap<String, String>,
    /// Names whose value was replaced by its digest.
    #[serde(default)]
    pub redacted: Vec<String>,
}

/// `packages.json`: interpreter, platform and installed distributions.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct PackagesDoc {
    /// The Python interpreter: `{version, implementation}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<Value>,
    /// Operating system fields (name → text or null).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<Value>,
    /// The CPU: `{model, count}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Value>,
    /// Installed distribution name → version.
    #[serde(default)]
    pub distributions: BTreeMap<String, String>,
    /// Accelerator stack: torch, torch_npu, CANN, CUDA, cuDNN, HIP, driver, device name and count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<Value>,
}

/// `determinism.json`: determinism and precision settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub(crate) struct DeterminismDoc {
    /// Setting (`torch.backends.cudnn.deterministic`, `autocast.cuda.dtype`, ...) → value.
    pub flags: BTreeMap<String, Value>,
}

/// One seed call in `random.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct SeedCallDoc {
    /// The seeding function (`torch.manual_seed`, `numpy.random.seed`, ...).
    pub function: String,
    /// The seed it was given.
    #[serde(default)]
    pub value: Value,
    /// Call site: `path:line in function`.
    #[serde(default)]
    pub site: String,
}

/// Random draws of one function from one call site, in `random.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct DrawSiteDoc {
    /// Call site: `path:line in function`.
    pub site: String,
    /// Number of draws during the captured steps.
    pub count: u64,
}

/// `random.json`: seed calls, random draws and RNG state hashes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub(crate) struct RandomDoc {
    /// Every seed call, in order.
    #[serde(default)]
    pub seed_calls: Vec<SeedCallDoc>,
    /// Random function → its draws per call site.
    #[serde(default)]
    pub draws: BTreeMap<String, Vec<DrawSiteDoc>>,
    /// Generator (`python`, `numpy`, `torch`, `cuda`/`npu`) → sha256 of its state at save time.
    #[serde(default)]
    pub state_hashes: BTreeMap<String, String>,
    /// Generator → whether it was seeded and drawn from while the pack listened (version 2).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub generators: BTreeMap<String, GeneratorDoc>,
}

/// One generator's use in `random.json` (version 2): what the random rule needs to tell a
/// generator the job relies on from one it never touched.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct GeneratorDoc {
    /// A seed call for it was recorded (`random.seed`, `torch.manual_seed`, ...).
    #[serde(default)]
    pub seeded: bool,
    /// Its state at save time differs from its state when the pack started listening or
    /// after its last recorded seed call: something drew from it. None: not known (the
    /// generator appeared after the pack started, e.g. CUDA initialised later).
    #[serde(default)]
    pub drawn: Option<bool>,
}

/// A statistic: a number, or `"nan"`/`"inf"`/`"-inf"` (JSON has no non-finite numbers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat(pub f64);

/// Written and read as a dump statistic ([`crate::schema::dump::Stat`]): one parser for
/// statistics, whichever file they are in.
impl Serialize for Stat {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        crate::schema::dump::Stat(Some(self.0)).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Stat {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Stat, D::Error> {
        match crate::schema::dump::Stat::deserialize(d)?.0 {
            Some(v) => Ok(Stat(v)),
            None => Err(serde::de::Error::custom("statistic must be a number")),
        }
    }
}

/// A tensor's fingerprint: a hash answers "equal?", statistics "how different?".
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Fingerprint {
    /// Hex sha256 of the raw contiguous little-endian bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Element type (`float32`, `bfloat16`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// Size of each dimension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<u64>>,
    /// Number of elements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numel: Option<u64>,
    /// Largest element (statistics are computed in float64; None when empty).
    #[serde(default)]
    pub max: Option<Stat>,
    /// Smallest element.
    #[serde(default)]
    pub min: Option<Stat>,
    /// Mean of the elements.
    #[serde(default)]
    pub mean: Option<Stat>,
    /// L2 norm.
    #[serde(default)]
    pub norm: Option<Stat>,
}

/// One fingerprinted tensor in `dataset.json` or `weights.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RecordDoc {
    /// Step it was captured at (weights: 0 = before training).
    pub step: u64,
    /// Rank that captured it.
    pub rank: u64,
    /// Tensor name (`args.0`, `kwargs.x`, a parameter name).
    pub name: String,
    /// The tensor's fingerprint.
    pub fingerprint: Fingerprint,
}

/// `dataset.json` or `weights.json`: fingerprinted tensors.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct RecordsDoc {
    /// The tensors, one record each.
    pub records: Vec<RecordDoc>,
}

// ---------------------------------------------------------------------------------------
// The model both kinds are read into.

/// Which kind of pack was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PackKind {
    /// A probe pack (`manifest.json`).
    Probe,
    /// msprobe's `config_check_pack.zip`.
    Msprobe,
}

/// One seed call, from either kind of pack.
#[derive(Debug, Clone)]
pub struct SeedCall {
    /// Rank that made the call.
    pub rank: u64,
    /// The seeding function (`torch.manual_seed`, ...).
    pub function: String,
    /// None where the producer did not record values (msprobe).
    pub value: Option<String>,
    /// Call site as recorded (compared through `normalize_site`).
    pub site: String,
}

/// The random category of a pack.
#[derive(Debug, Clone, Default)]
pub struct RandomInfo {
    /// Every seed call, in order.
    pub seeds: Vec<SeedCall>,
    /// (rank, function) → (call site, count).
    pub draws: BTreeMap<(u64, String), Vec<(String, u64)>>,
    /// None where the producer did not record them.
    pub states: Option<BTreeMap<String, String>>,
    /// Per generator, seeded and drawn as the pack recorded them (version 2 packs); empty
    /// for older packs, whose use is inferred from the seed calls and draws.
    pub generators: BTreeMap<String, GeneratorDoc>,
}

/// One tensor fingerprint: (step, rank, name).
pub(crate) type RecordKey = (u64, u64, String);

/// A pack of either kind, read into one model; a category is None when the pack lacks it.
#[derive(Debug, Clone)]
pub struct Pack {
    /// The pack file.
    pub path: PathBuf,
    /// Which kind of pack it is.
    pub kind: PackKind,
    /// Pack format version (None for msprobe packs).
    pub version: Option<u32>,
    /// What wrote the pack.
    pub producer: Option<String>,
    /// The rank that wrote it, where the pack says (a probe manifest's `rank`; an msprobe
    /// pack's single `rank<R>` folder).
    pub rank: Option<u64>,
    /// The job's number of ranks, where the pack says (`manifest.world_size`).
    pub world_size: Option<u64>,
    /// `cpu`, `cuda`, `npu` or `unknown`.
    pub device: String,
    /// Environment variables, secret-looking values redacted.
    pub env: Option<BTreeMap<String, String>>,
    /// Normalised distribution name → (name as written, version).
    pub distributions: Option<BTreeMap<String, (String, String)>>,
    /// `python.version`, `os.system`, `cpu.model`, `accelerator.torch`, ...
    pub platform: Option<BTreeMap<String, String>>,
    /// Determinism flag → value as text (msprobe packs have none).
    pub determinism: Option<BTreeMap<String, String>>,
    /// Seed calls, draws and RNG state hashes.
    pub random: Option<RandomInfo>,
    /// Fingerprints of the model inputs.
    pub dataset: Option<BTreeMap<RecordKey, Fingerprint>>,
    /// Fingerprints of the model weights.
    pub weights: Option<BTreeMap<RecordKey, Fingerprint>>,
    /// Flattened paths (`optimizer.param_groups.0.lr`) → value as text.
    pub hyperparameters: Option<BTreeMap<String, String>>,
}

impl Pack {
    /// `npu` when the pack was made with torch_npu, else `gpu` (CUDA, ROCm or CPU builds).
    pub(crate) fn family(&self) -> &'static str {
        let npu_pkg = self
            .distributions
            .as_ref()
            .is_some_and(|d| d.contains_key("torch-npu"));
        if self.device == "npu" || npu_pkg {
            "npu"
        } else {
            "gpu"
        }
    }
}

/// Lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    let mut s = String::with_capacity(64);
    for b in d {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The marker that replaces a secret value (`<redacted:sha256:XXXXXXXX>`).
pub fn redact(value: &str) -> String {
    sec::marker(value, RedactMode::Hash)
}

/// Earlier probe packs replaced secret values by `sha256:<64 hex>` of the value: the first 8
/// hex digits are today's marker of the same value, so old and new packs still compare.
fn legacy_marker(v: &str) -> Option<String> {
    let h = v.strip_prefix("sha256:")?;
    (h.len() == 64 && h.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')))
        .then(|| format!("<redacted:sha256:{}>", &h[..8]))
}

/// Environment variables as config-check shows them: any secret a pack still holds raw
/// (msprobe packs, packs from older probes) is redacted by the rules of [`sec`].
fn redact_env(vars: BTreeMap<String, String>) -> BTreeMap<String, String> {
    vars.into_iter()
        .map(|(k, v)| {
            let r =
                legacy_marker(&v).unwrap_or_else(|| sec::redact_named(&k, &v, RedactMode::Hash));
            (k, r)
        })
        .collect()
}

/// Hyperparameters as config-check shows them: `argv` joined after redaction, `args`,
/// `extra` (probe) and msprobe's trees redacted by the rules of [`sec`], then flattened.
fn hyperparameters_of(mut v: Value, out: &mut BTreeMap<String, String>) {
    if let Some(argv) = v.get("argv").and_then(|a| a.as_array()) {
        let argv: Vec<String> = argv.iter().map(value_text).collect();
        out.insert(
            "argv".to_string(),
            sec::redact_argv(&argv, RedactMode::Hash).join(" "),
        );
    }
    if let Some(o) = v.as_object_mut() {
        o.remove("argv");
        for key in ["args", "extra"] {
            if let Some(x) = o.get_mut(key) {
                sec::redact_tree(x, key, RedactMode::Hash);
            }
        }
    }
    flatten("", &v, out);
    out.remove("");
}

/// PEP 503 normalisation: lowercase, runs of `-_.` become `-`.
pub(crate) fn normalize_dist(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for ch in name.trim().chars() {
        if matches!(ch, '-' | '_' | '.') {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('-');
            }
            sep = false;
            out.extend(ch.to_lowercase());
        }
    }
    out
}

/// A JSON value as a short, canonical text (strings without quotes).
pub(crate) fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "null".into(),
        other => other.to_string(),
    }
}

/// Flattens nested objects and arrays into `a.b.0.c` paths.
pub(crate) fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, String>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&p, x, out);
            }
        }
        Value::Array(a) if !a.is_empty() && a.iter().any(|x| x.is_object() || x.is_array()) => {
            for (i, x) in a.iter().enumerate() {
                flatten(&format!("{prefix}.{i}"), x, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), value_text(other));
        }
    }
}

/// `basename:line in function` for both probe sites (`/a/b.py:31 in main`) and msprobe
/// stack lines (`File /a/b.py, line 31, in main, code`): paths differ between machines.
pub(crate) fn normalize_site(site: &str) -> String {
    let s = site.trim();
    if let Some(rest) = s.strip_prefix("File ") {
        let mut parts = rest.splitn(4, ", ");
        let file = parts.next().unwrap_or("");
        let line = parts
            .next()
            .and_then(|l| l.strip_prefix("line "))
            .unwrap_or("?");
        let func = parts
            .next()
            .and_then(|f| f.strip_prefix("in "))
            .unwrap_or("?");
        return format!("{}:{line} in {func}", basename(file));
    }
    match s.split_once(" in ") {
        Some((loc, func)) => {
            let (file, line) = loc.rsplit_once(':').unwrap_or((loc, "?"));
            format!("{}:{line} in {func}", basename(file))
        }
        None => basename(s).to_string(),
    }
}

fn basename(p: &str) -> &str {
    p.rsplit(['/', '\\']).next().unwrap_or(p)
}

// ---------------------------------------------------------------------------------------
// Loading

/// Reads a pack of either kind.
pub(crate) fn load(path: &Path) -> Result<Pack> {
    from_archive(&super::archive::read(path)?)
}

/// Reads a pack of either kind from its archive, already read safely
/// ([`super::archive::read`], or [`super::archive::from_bytes`] for bytes in memory).
pub fn from_archive(ar: &Archive) -> Result<Pack> {
    if ar.get("manifest.json").is_some() {
        load_probe(ar)
    } else if ar.get("env").is_some()
        || ar.get("pip").is_some()
        || ar.entries.keys().any(|k| {
            k.starts_with("dataset/")
                || k.starts_with("weights/")
                || k.starts_with("random/")
                || k.starts_with("hyperparameters/")
        })
    {
        load_msprobe(ar)
    } else {
        Err(ar.bad(
            "-",
            "not a config pack (no manifest.json, nor msprobe's env/pip/dataset/weights/random entries)",
        ))
    }
}

fn records(ar: &Archive, entry: &str) -> Result<Option<BTreeMap<RecordKey, Fingerprint>>> {
    let doc: Option<RecordsDoc> = ar.json(entry)?;
    Ok(doc.map(|d| {
        d.records
            .into_iter()
            .map(|r| ((r.step, r.rank, r.name), r.fingerprint))
            .collect()
    }))
}

fn load_probe(ar: &Archive) -> Result<Pack> {
    let m: ManifestDoc = ar
        .json("manifest.json")?
        .ok_or_else(|| ar.bad("manifest.json", "missing"))?;
    if m.format != FORMAT {
        return Err(ar.bad(
            "manifest.json",
            format!("format is {:?}, expected {FORMAT:?}", m.format),
        ));
    }
    if !(MIN_VERSION..=VERSION).contains(&m.version) {
        return Err(ProbeError::Unsupported {
            path: ar.path.clone(),
            msg: format!(
                "config pack version {} (this probe reads versions {MIN_VERSION} to {VERSION})",
                m.version
            ),
        });
    }
    let env: Option<EnvDoc> = ar.json("env.json")?;
    let pk: Option<PackagesDoc> = ar.json("packages.json")?;
    let det: Option<DeterminismDoc> = ar.json("determinism.json")?;
    let rnd: Option<RandomDoc> = ar.json("random.json")?;
    let hp: Option<Value> = ar.json("hyperparameters.json")?;
    let rank = m.rank.unwrap_or(0);

    let (distributions, platform) = match pk {
        None => (None, None),
        Some(p) => {
            let d = p
                .distributions
                .into_iter()
                .map(|(n, v)| (normalize_dist(&n), (n, v)))
                .collect();
            let mut plat = BTreeMap::new();
            for (k, v) in [
                ("python", &p.python),
                ("os", &p.os),
                ("cpu", &p.cpu),
                ("accelerator", &p.accelerator),
            ] {
                if let Some(v) = v {
                    flatten(k, v, &mut plat);
                }
            }
            plat.retain(|_, v| v != "null");
            (Some(d), Some(plat))
        }
    };
    let random = rnd.map(|r| RandomInfo {
        seeds: r
            .seed_calls
            .into_iter()
            .map(|s| SeedCall {
                rank,
                function: s.function,
                value: Some(value_text(&s.value)),
                site: s.site,
            })
            .collect(),
        draws: r
            .draws
            .into_iter()
            .map(|(f, sites)| {
                (
                    (rank, f),
                    sites.into_iter().map(|d| (d.site, d.count)).collect(),
                )
            })
            .collect(),
        states: Some(r.state_hashes),
        generators: r.generators,
    });
    let hyperparameters = match hp {
        None => None,
        Some(v) => {
            if !v.is_object() {
                return Err(ar.bad("hyperparameters.json", "expected a JSON object"));
            }
            let mut out = BTreeMap::new();
            hyperparameters_of(v, &mut out);
            Some(out)
        }
    };
    Ok(Pack {
        path: ar.path.clone(),
        kind: PackKind::Probe,
        version: Some(m.version),
        producer: m.producer,
        rank: m.rank,
        world_size: m.world_size,
        device: m.device.unwrap_or_else(|| "unknown".into()),
        env: env.map(|e| redact_env(e.vars)),
        distributions,
        platform,
        determinism: det.map(|d| {
            d.flags
                .iter()
                .map(|(k, v)| (k.clone(), value_text(v)))
                .collect()
        }),
        random,
        dataset: records(ar, "dataset.json")?,
        weights: records(ar, "weights.json")?,
        hyperparameters,
    })
}

/// `dataset/step3/rank0/dataset.json` → (3, 0).
fn step_rank(name: &str, prefix: &str, file: &str) -> Option<(u64, u64)> {
    let rest = name.strip_prefix(prefix)?.strip_suffix(file)?;
    let mut it = rest.trim_matches('/').split('/');
    let s = it.next()?.strip_prefix("step")?.parse().ok()?;
    let r = it.next()?.strip_prefix("rank")?.parse().ok()?;
    if it.next().is_some() {
        return None;
    }
    Some((s, r))
}

#[derive(Deserialize)]
struct MsStats {
    #[serde(default)]
    max: Option<Stat>,
    #[serde(default)]
    min: Option<Stat>,
    #[serde(default)]
    mean: Option<Stat>,
    #[serde(default)]
    norm: Option<Stat>,
}

impl From<MsStats> for Fingerprint {
    fn from(s: MsStats) -> Fingerprint {
        Fingerprint {
            max: s.max,
            min: s.min,
            mean: s.mean,
            norm: s.norm,
            ..Fingerprint::default()
        }
    }
}

#[derive(Deserialize)]
struct MsDataset {
    #[serde(default)]
    args: BTreeMap<String, Option<MsStats>>,
    #[serde(default)]
    kwargs: BTreeMap<String, Option<MsStats>>,
}

#[derive(Deserialize)]
struct MsRandomSite {
    #[serde(default)]
    count: u64,
    #[serde(default)]
    stack: Vec<String>,
}

fn load_msprobe(ar: &Archive) -> Result<Pack> {
    let env = match ar.get("env") {
        None => None,
        Some(_) => {
            let v: Value = ar.json("env")?.unwrap_or(Value::Null);
            let obj = v
                .as_object()
                .ok_or_else(|| ar.bad("env", "expected a JSON object of variables"))?;
            Some(redact_env(
                obj.iter()
                    .map(|(k, v)| (k.clone(), value_text(v)))
                    .collect(),
            ))
        }
    };
    let distributions = match ar.get("pip") {
        None => None,
        Some(bytes) => {
            let text = std::str::from_utf8(bytes).map_err(|_| ar.bad("pip", "not UTF-8 text"))?;
            ar.take_items("pip", text.lines().count())?;
            let mut d = BTreeMap::new();
            for (i, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let (n, v) = line
                    .split_once("==")
                    .or_else(|| line.split_once('='))
                    .ok_or_else(|| {
                        ar.bad("pip", format!("line {}: expected Name=version", i + 1))
                    })?;
                d.insert(
                    normalize_dist(n),
                    (n.trim().to_string(), v.trim().to_string()),
                );
            }
            Some(d)
        }
    };
    let mut hyper: Option<BTreeMap<String, String>> = None;
    for (entry, prefix) in [
        ("hyperparameters/hyperparameters_static.json", "args"),
        ("hyperparameters/hyperparameters_dynamic.json", "dynamic"),
    ] {
        if let Some(mut v) = ar.json::<Value>(entry)? {
            if !v.is_object() {
                return Err(ar.bad(entry, "expected a JSON object"));
            }
            sec::redact_tree(&mut v, prefix, RedactMode::Hash);
            flatten(prefix, &v, hyper.get_or_insert_with(BTreeMap::new));
        }
    }
    let mut dataset: Option<BTreeMap<RecordKey, Fingerprint>> = None;
    let mut weights: Option<BTreeMap<RecordKey, Fingerprint>> = None;
    let mut random: Option<RandomInfo> = None;
    let mut ranks = std::collections::BTreeSet::new();
    for name in ar.entries.keys() {
        if let Some((s, r)) = step_rank(name, "dataset/", "dataset.json") {
            ranks.insert(r);
            let d: MsDataset = ar.json(name)?.unwrap_or(MsDataset {
                args: BTreeMap::new(),
                kwargs: BTreeMap::new(),
            });
            let out = dataset.get_or_insert_with(BTreeMap::new);
            for (part, m) in [("args", d.args), ("kwargs", d.kwargs)] {
                for (k, st) in m {
                    let fp = st.map(Fingerprint::from).unwrap_or_default();
                    out.insert((s, r, format!("{part}.{k}")), fp);
                }
            }
        } else if let Some((s, r)) = step_rank(name, "weights/", "weight.json") {
            ranks.insert(r);
            let w: BTreeMap<String, Option<MsStats>> = ar.json(name)?.unwrap_or_default();
            let out = weights.get_or_insert_with(BTreeMap::new);
            for (k, st) in w {
                out.insert((s, r, k), st.map(Fingerprint::from).unwrap_or_default());
            }
        } else if let Some(r) = name
            .strip_prefix("random/rank")
            .and_then(|x| x.strip_suffix(".json"))
            .and_then(|x| x.parse::<u64>().ok())
        {
            ranks.insert(r);
            let m: BTreeMap<String, Vec<MsRandomSite>> = ar.json(name)?.unwrap_or_default();
            let info = random.get_or_insert_with(RandomInfo::default);
            for (func, sites) in m {
                let is_seed = func.rsplit('.').next().is_some_and(|l| l.contains("seed"));
                for s in sites {
                    let site = s.stack.last().cloned().unwrap_or_default();
                    if is_seed {
                        for _ in 0..s.count.min(10_000) {
                            info.seeds.push(SeedCall {
                                rank: r,
                                function: func.clone(),
                                value: None,
                                site: site.clone(),
                            });
                        }
                    } else {
                        info.draws
                            .entry((r, func.clone()))
                            .or_default()
                            .push((site, s.count));
                    }
                }
            }
        }
    }
    let device = match &distributions {
        Some(d) if d.contains_key("torch-npu") => "npu",
        _ => "unknown",
    };
    Ok(Pack {
        path: ar.path.clone(),
        kind: PackKind::Msprobe,
        version: None,
        producer: Some("msprobe config_check".into()),
        rank: ranks.first().copied().filter(|_| ranks.len() == 1),
        world_size: None,
        device: device.into(),
        env,
        distributions,
        platform: None,
        determinism: None,
        random,
        dataset,
        weights,
        hyperparameters: hyper,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dist_names() {
        assert_eq!(normalize_dist("Torch_NPU"), "torch-npu");
        assert_eq!(normalize_dist("typing_extensions"), "typing-extensions");
        assert_eq!(normalize_dist("zope.interface"), "zope-interface");
    }

    #[test]
    fn sites() {
        assert_eq!(
            normalize_site("/a/b/train.py:31 in main"),
            "train.py:31 in main"
        );
        assert_eq!(
            normalize_site("File /a/b/train.py, line 31, in main, torch.manual_seed(1)"),
            "train.py:31 in main"
        );
    }

    #[test]
    fn secrets() {
        assert!(is_secret_name("HF_TOKEN"));
        assert!(is_secret_name("aws_secret_access_key"));
        assert!(!is_secret_name("PATH"));
        assert!(!is_secret_name("PWD"));
        assert_eq!(redact("x").len(), "<redacted:sha256:>".len() + 8);
        let old = format!("sha256:{}", sha256_hex(b"x"));
        assert_eq!(legacy_marker(&old), Some(redact("x")));
        assert_eq!(legacy_marker("sha256:xyz"), None);
    }

    #[test]
    fn step_rank_paths() {
        assert_eq!(
            step_rank(
                "dataset/step3/rank1/dataset.json",
                "dataset/",
                "dataset.json"
            ),
            Some((3, 1))
        );
        assert_eq!(
            step_rank("dataset/x/dataset.json", "dataset/", "dataset.json"),
            None
        );
    }

    #[test]
    fn record_doc_round_trip() {
        let r = RecordsDoc {
            records: vec![RecordDoc {
                step: 0,
                rank: 0,
                name: "w".into(),
                fingerprint: Fingerprint {
                    sha256: Some("ab".into()),
                    dtype: Some("float32".into()),
                    shape: Some(vec![2]),
                    numel: Some(2),
                    max: Some(Stat(f64::NAN)),
                    min: Some(Stat(-1.0)),
                    mean: None,
                    norm: Some(Stat(f64::INFINITY)),
                },
            }],
        };
        let s = serde_json::to_string(&r).unwrap();
        assert!(s.contains("\"nan\"") && s.contains("\"inf\""));
        let back: RecordsDoc = serde_json::from_str(&s).unwrap();
        assert_eq!(back.records[0].fingerprint.min, Some(Stat(-1.0)));
        assert!(back.records[0].fingerprint.max.unwrap().0.is_nan());
    }
}
