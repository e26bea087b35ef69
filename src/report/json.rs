//! `summary.json`: the machine-readable verdict (schemas/probe-compare-summary.v1.schema.json).

use super::{ReportWriter, Summary};
use crate::atomic;
use crate::compare::CompareRun;
use crate::error::Result;
use std::path::Path;

/// `summary.json`.
pub struct JsonSummary;

impl ReportWriter for JsonSummary {
    fn format(&self) -> &'static str {
        "json"
    }
    fn file_name(&self) -> &'static str {
        "summary.json"
    }
    fn write(&self, _run: &CompareRun, summary: &Summary, path: &Path) -> Result<()> {
        let mut text =
            serde_json::to_string_pretty(summary).map_err(|e| crate::ProbeError::Output {
                path: path.to_path_buf(),
                msg: e.to_string(),
            })?;
        text.push('\n');
        atomic::write_bytes(path, text.as_bytes())
    }
}
