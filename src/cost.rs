//! `probe cost DUMP`: what a dump cost, as the capture agent forecast it and as it is on
//! disk (docs/capture.md, "Forecast, dry run and budgets").
//!
//! The forecast is the manifest's optional `forecast` object (and `budget`, when a budget
//! was exceeded), written by the agent after the first captured step; the bytes are those
//! of every `step<S>/rank<R>` folder the dump holds, measured now. A dump without a
//! forecast (an older one, msprobe's) gets the bytes alone.

use crate::dump::{discover, RankLoc};
use crate::error::{ProbeError, Result};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// At most this many step/rank folders are listed one per line in the text output.
const LISTED: usize = 20;

/// `probe cost`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// The dump (its root, a step<S> folder or a rank folder).
    #[arg(value_name = "DUMP")]
    pub dump: PathBuf,
    /// `text` (default) or `json` (one object: units, totals, forecast, budget).
    #[arg(long, value_name = "FORMAT", default_value = "text")]
    pub format: OutFormat,
}

/// The output's format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutFormat {
    /// Lines for a person.
    Text,
    /// One JSON object.
    Json,
}

/// Bytes of one step/rank folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    /// `step1`.
    pub step: String,
    /// `rank0`.
    pub rank: String,
    /// Bytes of the files in it (and below it: msprobe's tensor folders).
    pub bytes: u64,
}

/// What `probe cost` found.
#[derive(Debug, Clone)]
pub struct Cost {
    /// The dump as given.
    pub path: PathBuf,
    /// Every step/rank folder, in step/rank order.
    pub units: Vec<Unit>,
    /// The manifest's `forecast` object, if any.
    pub forecast: Option<Value>,
    /// The manifest's `budget` object, if any.
    pub budget: Option<Value>,
}

/// Runs `probe cost`: the text it prints.
pub fn run(a: &Args) -> Result<String> {
    let cost = measure(&a.dump)?;
    Ok(match a.format {
        OutFormat::Text => text(&cost),
        OutFormat::Json => {
            let mut s =
                serde_json::to_string_pretty(&to_json(&cost)).map_err(|e| ProbeError::Output {
                    path: a.dump.clone(),
                    msg: e.to_string(),
                })?;
            s.push('\n');
            s
        }
    })
}

/// Reads the dump's forecast and measures its folders.
pub fn measure(path: &Path) -> Result<Cost> {
    let set = discover(path)?;
    let units = set
        .ranks
        .iter()
        .map(|loc| {
            Ok(Unit {
                step: loc.step.clone(),
                rank: loc.rank.clone(),
                bytes: unit_bytes(loc)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let (forecast, budget) = match manifest_of(path) {
        Some(m) => read_cost(&m)?,
        None => (None, None),
    };
    Ok(Cost {
        path: path.to_path_buf(),
        units,
        forecast,
        budget,
    })
}

/// The manifest that describes `path`: at the root given, or above a step or rank folder.
fn manifest_of(path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .take(3)
        .map(|d| d.join("manifest.json"))
        .find(|m| m.is_file())
}

/// The manifest's `forecast` and `budget`, which must be objects when present.
fn read_cost(manifest: &Path) -> Result<(Option<Value>, Option<Value>)> {
    let bad = |msg: String| ProbeError::BadManifest {
        path: manifest.to_path_buf(),
        msg,
    };
    let text = std::fs::read_to_string(manifest).map_err(|e| ProbeError::io(manifest, e))?;
    let text = crate::json::accept_nonfinite_str(&text);
    let v: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let take = |key: &str| match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(o @ Value::Object(_)) => Ok(Some(o.clone())),
        Some(_) => Err(bad(format!("{key} is not an object"))),
    };
    let forecast = take("forecast")?;
    let budget = take("budget")?;
    if let Some(f) = &forecast {
        if f.get("bytes_per_step").and_then(Value::as_u64).is_none() {
            return Err(bad("forecast.bytes_per_step is not a byte count".into()));
        }
    }
    Ok((forecast, budget))
}

/// Bytes of the regular files of a rank folder and its subfolders (msprobe keeps tensors
/// in `dump_tensor_data/`); symbolic links are not followed.
fn unit_bytes(loc: &RankLoc) -> Result<u64> {
    let mut total = 0u64;
    let mut todo = vec![loc.dir.clone()];
    while let Some(dir) = todo.pop() {
        let rd = std::fs::read_dir(&dir).map_err(|e| ProbeError::io(&dir, e))?;
        for ent in rd {
            let ent = ent.map_err(|e| ProbeError::io(&dir, e))?;
            let meta = ent
                .path()
                .symlink_metadata()
                .map_err(|e| ProbeError::io(ent.path(), e))?;
            if meta.is_dir() {
                todo.push(ent.path());
            } else if meta.is_file() {
                total = total.saturating_add(meta.len());
            }
        }
    }
    Ok(total)
}

fn total(units: &[Unit]) -> u64 {
    units.iter().map(|u| u.bytes).fold(0, u64::saturating_add)
}

fn mean(units: &[Unit]) -> Option<u64> {
    u64::try_from(units.len())
        .ok()
        .filter(|n| *n > 0)
        .map(|n| total(units) / n)
}

/// `probe cost --format json`.
pub fn to_json(c: &Cost) -> Value {
    let units: Vec<Value> = c
        .units
        .iter()
        .map(|u| json!({"step": u.step, "rank": u.rank, "bytes": u.bytes}))
        .collect();
    json!({
        "dump": c.path.display().to_string(),
        "units": units,
        "bytes_total": total(&c.units),
        "bytes_per_unit_mean": mean(&c.units),
        "forecast": c.forecast,
        "budget": c.budget,
    })
}

/// A byte count for people: `123.4 KB`.
pub fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut size = n as f64;
    let mut unit = 0;
    while size >= 1024.0 && unit + 1 < UNITS.len() {
        size /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{size:.1} {}", UNITS[unit])
    }
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

/// A forecast figure (`time_per_step_s`, `overhead`, a ratio) with `decimals` places; `?` when
/// missing or negative, and in scientific notation from a million on, so that a manifest
/// claiming `1e308` seconds prints `1.000e308` rather than a 309-digit number. The forecast
/// is the dump's data, not the user's arguments: absurd values are shown, not refused.
fn figure(x: Option<f64>, decimals: usize) -> String {
    match x {
        Some(x) if (0.0..1e6).contains(&x) => format!("{x:.decimals$}"),
        Some(x) if x >= 1e6 => format!("{x:.3e}"),
        _ => "?".into(),
    }
}

fn word(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "?".into(),
        Some(other) => other.to_string(),
    }
}

/// `probe cost`'s text: the bytes on disk, then the forecast and how it compares.
pub fn text(c: &Cost) -> String {
    let mut out = String::new();
    let steps: std::collections::BTreeSet<&str> = c.units.iter().map(|u| &*u.step).collect();
    let _ = writeln!(
        out,
        "dump {}: {} step/rank folders ({} steps), {} on disk",
        c.path.display(),
        c.units.len(),
        steps.len(),
        human(total(&c.units))
    );
    for u in c.units.iter().take(LISTED) {
        let _ = writeln!(out, "  {}/{}: {}", u.step, u.rank, human(u.bytes));
    }
    if c.units.len() > LISTED {
        let _ = writeln!(out, "  ... {} more", c.units.len() - LISTED);
    }
    let on_disk = mean(&c.units);
    match &c.forecast {
        None => out.push_str("forecast: none in the manifest (an older or msprobe dump)\n"),
        Some(f) => forecast_lines(&mut out, f, on_disk),
    }
    if let Some(b) = &c.budget {
        let exceeded = b
            .get("exceeded")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_string))
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "budget exceeded ({exceeded}): {} from step {}",
            word(b, "action"),
            word(b, "from_step")
        );
    }
    out
}

fn forecast_lines(out: &mut String, f: &Value, on_disk: Option<u64>) {
    let per_step = f.get("bytes_per_step").and_then(Value::as_u64).unwrap_or(0);
    let _ = writeln!(
        out,
        "forecast (from step {}, rank {}): {} s per captured step, {}x bare (bare from {}), \
         {} per step and rank, host memory {}",
        word(f, "measured_on_step"),
        word(f, "rank"),
        figure(num(f, "time_per_step_s"), 3),
        figure(num(f, "overhead"), 2),
        word(f, "bare_from").replace('_', " "),
        human(per_step),
        human(
            f.get("host_memory_bytes")
                .and_then(Value::as_u64)
                .unwrap_or(0)
        ),
    );
    match f.get("bytes_total").and_then(Value::as_u64) {
        Some(t) => {
            let _ = writeln!(
                out,
                "forecast total: {} for {} steps x {} ranks",
                human(t),
                word(f, "steps"),
                word(f, "ranks")
            );
        }
        None => out.push_str("forecast total: none (steps open-ended: per-step figures only)\n"),
    }
    if let Some(Value::String(note)) = f.get("note") {
        let _ = writeln!(out, "forecast note: {note}");
    }
    if let Some(d) = on_disk.filter(|d| *d > 0) {
        let _ = writeln!(
            out,
            "on disk: {} per step and rank on average, {}x the forecast",
            human(d),
            figure(Some(d as f64 / per_step.max(1) as f64), 2)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human(12), "12 B");
        assert_eq!(human(2048), "2.0 KB");
        assert_eq!(human(3 << 30), "3.0 GB");
    }
}
