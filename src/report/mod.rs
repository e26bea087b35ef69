//! Reports of a compare: the JSON summary (the CI contract, `schemas/`), the parquet table,
//! the xlsx workbook and the terminal summary. Rendering only: every number comes from the
//! [`CompareRun`] and the [`Summary`]; the tabular formats share one column table
//! ([`columns`]).
//!
//! Every file format implements [`ReportWriter`]; adding one means one new file here and
//! one line in [`writers`]. Files are written atomically (see [`crate::atomic`]).

pub mod columns;
mod json;
mod parquet;
mod terminal;
pub(crate) mod xlsx;

use crate::compare::CompareRun;
use crate::error::Result;
use crate::schema::summary::Summary;
use std::path::Path;

pub use json::JsonSummary;
pub use parquet::ParquetTable;
pub use terminal::terminal_summary;
pub use xlsx::XlsxWorkbook;

/// A report format.
pub trait ReportWriter: Sync {
    /// The format's name on the command line (`--format`).
    fn format(&self) -> &'static str;
    /// The file written into the output folder.
    fn file_name(&self) -> &'static str;
    /// Writes the report to `path` (atomically).
    fn write(&self, run: &CompareRun, summary: &Summary, path: &Path) -> Result<()>;
}

/// All report formats, in the order they are written.
pub fn writers() -> Vec<Box<dyn ReportWriter>> {
    vec![
        Box::new(JsonSummary),
        Box::new(ParquetTable),
        Box::new(XlsxWorkbook),
    ]
}
