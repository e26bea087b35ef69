//! `<stem>.parquet`: the document's full table ([`super::columns`]; for a compare, matched
//! tensors and unmatched ones with verdict `unmatched`), for pandas / polars / DuckDB users.
//! Snappy-compressed.

use super::columns::{Cell, Column, Kind};
use super::{Document, ReportWriter, Table};
use crate::atomic;
use crate::error::{ProbeError, Result};
use arrow_array::builder::{BooleanBuilder, Float64Builder, StringBuilder, UInt64Builder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use std::path::Path;
use std::sync::Arc;

/// `<stem>.parquet`.
pub struct ParquetTable;

const BATCH: usize = 65_536;

/// One array builder per column.
enum Builder {
    Text(StringBuilder),
    Count(UInt64Builder),
    Number(Float64Builder),
    Flag(BooleanBuilder),
}

impl Builder {
    fn new(kind: Kind) -> Builder {
        match kind {
            Kind::Text | Kind::OptText => Builder::Text(StringBuilder::new()),
            Kind::Count => Builder::Count(UInt64Builder::new()),
            Kind::Number => Builder::Number(Float64Builder::new()),
            Kind::Flag => Builder::Flag(BooleanBuilder::new()),
        }
    }

    fn push(&mut self, cell: Cell) {
        match (self, cell) {
            (Builder::Text(b), Cell::Text(s)) => b.append_value(s),
            (Builder::Text(b), Cell::OptText(s)) => b.append_option(s),
            (Builder::Count(b), Cell::Count(v)) => b.append_value(v),
            (Builder::Number(b), Cell::Number(v)) => b.append_option(v),
            (Builder::Flag(b), Cell::Flag(v)) => b.append_option(v),
            // A column's cells always have the column's kind (see COLUMNS).
            (Builder::Text(b), _) => b.append_null(),
            (Builder::Count(b), _) => b.append_null(),
            (Builder::Number(b), _) => b.append_null(),
            (Builder::Flag(b), _) => b.append_null(),
        }
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Builder::Text(b) => Arc::new(b.finish()),
            Builder::Count(b) => Arc::new(b.finish()),
            Builder::Number(b) => Arc::new(b.finish()),
            Builder::Flag(b) => Arc::new(b.finish()),
        }
    }
}

fn schema(columns: &[&Column]) -> Arc<Schema> {
    let fields: Vec<Field> = columns
        .iter()
        .map(|c| {
            let (t, nullable) = match c.kind {
                Kind::Text => (DataType::Utf8, true),
                Kind::OptText => (DataType::Utf8, true),
                Kind::Count => (DataType::UInt64, false),
                Kind::Number => (DataType::Float64, true),
                Kind::Flag => (DataType::Boolean, true),
            };
            Field::new(c.name, t, nullable)
        })
        .collect();
    Arc::new(Schema::new(fields))
}

fn write_table<W: std::io::Write + Send>(table: Table, w: W, path: &Path) -> Result<()> {
    let out = |msg: String| ProbeError::Output {
        path: path.to_path_buf(),
        msg: format!("parquet: {msg}"),
    };
    let schema = schema(&table.columns);
    // Row groups of one batch: the writer holds a row group's encoded columns until it is
    // full, so its memory stays bounded (the default, a million rows, grew with the run).
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(BATCH))
        .build();
    let mut writer =
        ArrowWriter::try_new(w, schema.clone(), Some(props)).map_err(|e| out(e.to_string()))?;
    let columns = table.columns;
    let mut builders: Vec<Builder> = columns.iter().map(|c| Builder::new(c.kind)).collect();
    let mut len = 0usize;
    let mut flush = |builders: &mut Vec<Builder>, len: &mut usize| {
        let cols: Vec<ArrayRef> = builders.iter_mut().map(Builder::finish).collect();
        *len = 0;
        let batch = RecordBatch::try_new(schema.clone(), cols).map_err(|e| out(e.to_string()))?;
        writer.write(&batch).map_err(|e| out(e.to_string()))
    };
    (table.lines)(&mut |line| {
        for (b, c) in builders.iter_mut().zip(&columns) {
            b.push((c.value)(&line));
        }
        len += 1;
        if len >= BATCH {
            flush(&mut builders, &mut len)?;
        }
        Ok(())
    })?;
    if len > 0 {
        flush(&mut builders, &mut len)?;
    }
    writer.close().map_err(|e| out(e.to_string()))?;
    Ok(())
}

impl ReportWriter for ParquetTable {
    fn format(&self) -> &'static str {
        "parquet"
    }
    fn file_name(&self, stem: &str) -> String {
        format!("{stem}.parquet")
    }
    fn write(&self, doc: &dyn Document, path: &Path) -> Result<()> {
        // The table's own error (an unreadable parked row, a parquet failure) is the one
        // reported; write_with only carries its text.
        let mut failed = None;
        let written = atomic::write_with(path, |w| {
            write_table(doc.table(), w, path).map_err(|e| {
                let msg = e.to_string();
                failed = Some(e);
                msg
            })
        });
        match (written, failed) {
            (Err(_), Some(e)) => Err(e),
            (Err(ProbeError::Output { path, msg }), None) => Err(ProbeError::Output {
                path,
                msg: format!("parquet: {msg}"),
            }),
            (r, _) => r,
        }
    }
}
