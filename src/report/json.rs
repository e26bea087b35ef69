//! `summary.json`: the machine-readable verdict (`schemas/probe-*-summary.v1.schema.json`).

use super::{Document, ReportWriter};
use crate::atomic;
use crate::error::Result;
use std::path::Path;

/// `summary.json`.
pub struct JsonSummary;

impl ReportWriter for JsonSummary {
    fn format(&self) -> &'static str {
        "json"
    }
    fn file_name(&self, _stem: &str) -> String {
        "summary.json".into()
    }
    fn write(&self, doc: &dyn Document, path: &Path) -> Result<()> {
        let mut text = doc
            .summary_json()
            .map_err(|msg| crate::ProbeError::Output {
                path: path.to_path_buf(),
                msg,
            })?;
        text.push('\n');
        atomic::write_bytes(path, text.as_bytes())
    }
}
