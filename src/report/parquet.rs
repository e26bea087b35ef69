//! `<stem>.parquet`: the document's full table ([`super::columns`]; for a compare, matched
//! tensors and unmatched ones with verdict `unmatched`), for pandas / polars / DuckDB users.
//! Snappy-compressed.
//!
//! Row groups start only where a part of the table starts (a step/rank pair's matched
//! tensors, its unmatched ones, a scanned unit's tensors), always where the step or the kind
//! of part changes, and at a pair once the row group holds [`MIN_GROUP`] rows; a part longer
//! than [`BATCH`] rows spans several. So a row group holds one step's pairs of one kind, its
//! step and rank statistics let a reader skip the others, and `probe merge` writes the run's
//! table by copying the row groups of the shards' tables in order ([`CopyPlan`]) instead of
//! encoding every row again.

use super::columns::{Cell, Column, Kind};
use super::{Document, ReportWriter, Table};
use crate::atomic;
use crate::error::{ProbeError, Result};
use arrow_array::builder::{BooleanBuilder, Float64Builder, StringBuilder, UInt64Builder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::{ArrowSchemaConverter, ArrowWriter};
use parquet::basic::Compression;
use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::{
    PageIndexPolicy, ParquetMetaData, ParquetMetaDataOptions, ParquetMetaDataReader,
};
use parquet::file::properties::WriterProperties;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `<stem>.parquet`.
pub struct ParquetTable;

/// Rows a row group holds at most (and rows encoded at once).
const BATCH: usize = 65_536;
/// Rows a row group holds before a new pair may start another: pairs of a few rows (small
/// dumps, many ranks) share row groups, whose metadata (~7 KB each with 49 columns) would
/// otherwise outweigh them.
const MIN_GROUP: usize = 8_192;

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

/// The writer every table is written with (the copy too, so that its file metadata is
/// the encoder's).
fn arrow_writer<W: std::io::Write + Send>(
    columns: &[&Column],
    w: W,
    path: &Path,
) -> Result<(ArrowWriter<W>, Arc<Schema>)> {
    let schema = schema(columns);
    // Row groups of at most one batch: the writer holds a row group's encoded columns until
    // it is full, so its memory stays bounded (the default, a million rows, grew with the run).
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(BATCH))
        .build();
    let writer =
        ArrowWriter::try_new(w, schema.clone(), Some(props)).map_err(|e| parquet_error(path, e))?;
    Ok((writer, schema))
}

fn parquet_error(path: &Path, e: impl std::fmt::Display) -> ProbeError {
    ProbeError::Output {
        path: path.to_path_buf(),
        msg: format!("parquet: {e}"),
    }
}

fn write_table<W: std::io::Write + Send>(table: Table, w: W, path: &Path) -> Result<()> {
    let columns = table.columns;
    let (mut writer, schema) = arrow_writer(&columns, w, path)?;
    let mut builders: Vec<Builder> = columns.iter().map(|c| Builder::new(c.kind)).collect();
    let mut len = 0usize;
    let flush = |writer: &mut ArrowWriter<W>, builders: &mut Vec<Builder>, len: &mut usize| {
        let cols: Vec<ArrayRef> = builders.iter_mut().map(Builder::finish).collect();
        *len = 0;
        let batch =
            RecordBatch::try_new(schema.clone(), cols).map_err(|e| parquet_error(path, e))?;
        writer.write(&batch).map_err(|e| parquet_error(path, e))
    };
    // The part of the last line, and its step.
    let mut part: Option<((usize, u8), String)> = None;
    (table.lines)(&mut |line| {
        let p = line.part();
        if part.as_ref().is_none_or(|(q, _)| *q != p) {
            let new_group = part.as_ref().is_some_and(|((_, kind), step)| {
                *kind != p.1 || step != line.step() || writer.in_progress_rows() + len >= MIN_GROUP
            });
            if new_group {
                if len > 0 {
                    flush(&mut writer, &mut builders, &mut len)?;
                }
                writer.flush().map_err(|e| parquet_error(path, e))?;
            }
            part = Some((p, line.step().to_string()));
        }
        for (b, c) in builders.iter_mut().zip(&columns) {
            b.push((c.value)(&line));
        }
        len += 1;
        if len >= BATCH {
            flush(&mut writer, &mut builders, &mut len)?;
        }
        Ok(())
    })?;
    if len > 0 {
        flush(&mut writer, &mut builders, &mut len)?;
    }
    writer.close().map_err(|e| parquet_error(path, e))?;
    Ok(())
}

/// A part of a compare's table: one step/rank pair's matched tensors, or its unmatched ones.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TablePart {
    /// The pair's step label.
    pub step: String,
    /// The pair's rank label.
    pub rank: String,
    /// Its unmatched tensors (else its matched ones).
    pub unmatched: bool,
}

/// Row groups of compare tables this writer wrote (the shards' `compare.parquet`) that make
/// a run's table when copied in order: what `probe merge` writes instead of encoding its
/// rows again. Made by [`CopyPlan::new`], which checks the files first.
#[derive(Debug)]
pub struct CopyPlan {
    files: Vec<PathBuf>,
    /// (file, row group), in the table's order.
    groups: Vec<(usize, usize)>,
}

impl CopyPlan {
    /// The plan for a table of `columns` whose parts come in `order`, from `files`: each a
    /// path and the parts it holds in its order, with their line counts (parts without lines
    /// left out). Why not, when a file is missing or unreadable, was written with other
    /// columns, holds other rows than its parts (another shard's table: each row group's
    /// step and rank statistics must name its parts, and its `matched_by` cells be all empty
    /// for unmatched tensors and all set for matched ones), or when the run's order cuts one
    /// of its row groups (a table written before row groups followed parts).
    pub fn new(
        columns: &[&Column],
        files: &[(PathBuf, Vec<(TablePart, usize)>)],
        order: &[TablePart],
    ) -> std::result::Result<CopyPlan, String> {
        let expected = ArrowSchemaConverter::new()
            .convert(&schema(columns))
            .map_err(|e| e.to_string())?;
        let column = |name: &str| {
            expected
                .columns()
                .iter()
                .position(|c| c.name() == name)
                .ok_or_else(|| format!("no {name} column"))
        };
        let (step, rank, matched_by) = (column("step")?, column("rank")?, column("matched_by")?);
        // Each part: its file and its lines there; each file: where its row groups start.
        let mut at: HashMap<&TablePart, (usize, std::ops::Range<usize>)> = HashMap::new();
        let mut starts: Vec<HashMap<usize, usize>> = Vec::new();
        let mut ends: Vec<HashMap<usize, usize>> = Vec::new();
        for (fi, (path, parts)) in files.iter().enumerate() {
            let bad = |why: &str| format!("{}: {why}", path.display());
            let meta = read_metadata(path).map_err(|e| bad(&e))?;
            if meta.file_metadata().schema_descr().root_schema() != expected.root_schema() {
                return Err(bad("other columns"));
            }
            let mut line = 0usize;
            let mut bounds = Vec::with_capacity(parts.len());
            for (part, lines) in parts {
                at.insert(part, (fi, line..line + lines));
                bounds.push((line..line + lines, part));
                line += lines;
            }
            let (mut first, mut p) = (0usize, 0usize);
            let (mut s, mut e) = (HashMap::new(), HashMap::new());
            for (g, group) in meta.row_groups().iter().enumerate() {
                let n = usize::try_from(group.num_rows()).unwrap_or(usize::MAX);
                let end = first.saturating_add(n);
                // The parts this row group holds rows of: one step, one kind.
                while p < bounds.len() && bounds[p].0.end <= first {
                    p += 1;
                }
                let held: Vec<&TablePart> = bounds[p..]
                    .iter()
                    .take_while(|(r, _)| r.start < end)
                    .map(|(_, part)| *part)
                    .collect();
                let stats = |c: usize| group.column(c).statistics();
                let one = |c: usize, want: &str| {
                    stats(c).is_some_and(|s| {
                        s.min_bytes_opt() == Some(want.as_bytes())
                            && s.max_bytes_opt() == Some(want.as_bytes())
                    })
                };
                let among = |v: Option<&[u8]>| held.iter().any(|h| v == Some(h.rank.as_bytes()));
                let fits = held.first().is_some_and(|h0| {
                    held.iter()
                        .all(|h| h.step == h0.step && h.unmatched == h0.unmatched)
                        && one(step, &h0.step)
                        && stats(rank)
                            .is_some_and(|s| among(s.min_bytes_opt()) && among(s.max_bytes_opt()))
                        && stats(matched_by).and_then(|s| s.null_count_opt())
                            == Some(if h0.unmatched { n as u64 } else { 0 })
                });
                if !fits {
                    return Err(bad(&format!(
                        "row group {g} does not hold the pairs its shard lists"
                    )));
                }
                s.insert(first, g);
                e.insert(end, g);
                first = end;
            }
            if first != line {
                return Err(bad(&format!("{first} rows where its pairs have {line}")));
            }
            starts.push(s);
            ends.push(e);
        }
        // The run's order as runs of consecutive lines of one file, each a span of whole row
        // groups.
        let mut runs: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
        for part in order {
            let (fi, range) = at
                .get(part)
                .ok_or_else(|| format!("no shard's table holds {}/{}", part.step, part.rank))?;
            match runs.last_mut() {
                Some((f, r)) if f == fi && r.end == range.start => r.end = range.end,
                _ => runs.push((*fi, range.clone())),
            }
        }
        let mut groups = Vec::new();
        for (fi, r) in runs {
            let (Some(&a), Some(&b)) = (starts[fi].get(&r.start), ends[fi].get(&r.end)) else {
                return Err(format!(
                    "{}: a row group spans pairs the run does not keep together",
                    files[fi].0.display()
                ));
            };
            groups.extend((a..=b).map(|g| (fi, g)));
        }
        Ok(CopyPlan {
            files: files.iter().map(|(p, _)| p.clone()).collect(),
            groups,
        })
    }
}

fn read_metadata(path: &Path) -> std::result::Result<ParquetMetaData, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    // The pages' encoding statistics in full (not the reader's default bitmask), as the
    // copy writes them again.
    let options = ParquetMetaDataOptions::new().with_encoding_stats_as_mask(false);
    ParquetMetaDataReader::new()
        .with_metadata_options(Some(options))
        .with_page_index_policy(PageIndexPolicy::Optional)
        .parse_and_finish(&file)
        .map_err(|e| e.to_string())
}

/// Writes the table of `plan` by copying its row groups, column chunk by column chunk.
fn copy_table<W: std::io::Write + Send>(
    columns: &[&Column],
    plan: &CopyPlan,
    w: W,
    path: &Path,
) -> Result<()> {
    let (writer, _) = arrow_writer(columns, w, path)?;
    let (mut writer, _) = writer
        .into_serialized_writer()
        .map_err(|e| parquet_error(path, e))?;
    let mut opened = Vec::with_capacity(plan.files.len());
    for p in &plan.files {
        let source = |e: String| parquet_error(path, format!("{}: {e}", p.display()));
        let file = std::fs::File::open(p).map_err(|e| source(e.to_string()))?;
        opened.push((file, read_metadata(p).map_err(source)?));
    }
    for &(fi, g) in &plan.groups {
        let (file, meta) = &opened[fi];
        // The plan read these files' footers; one changed since cannot be copied from.
        let group = meta.row_groups().get(g).ok_or_else(|| {
            parquet_error(
                path,
                format!("{} changed while merging", plan.files[fi].display()),
            )
        })?;
        let index = meta.page_index_for_row_group(g);
        let mut out = writer
            .next_row_group()
            .map_err(|e| parquet_error(path, e))?;
        for (c, chunk) in group.columns().iter().enumerate() {
            let close = ColumnCloseResult {
                bytes_written: u64::try_from(chunk.compressed_size()).unwrap_or(0),
                rows_written: u64::try_from(group.num_rows()).unwrap_or(0),
                metadata: chunk.clone(),
                bloom_filter: None,
                column_index: index.column_index(c).cloned(),
                offset_index: index.offset_index(c).cloned(),
            };
            out.append_column(file, close)
                .map_err(|e| parquet_error(path, e))?;
        }
        out.close().map_err(|e| parquet_error(path, e))?;
    }
    writer.close().map_err(|e| parquet_error(path, e))?;
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
            let table = doc.table();
            match doc.parquet_copy() {
                Some(plan) => copy_table(&table.columns, plan, w, path),
                None => write_table(table, w, path),
            }
            .map_err(|e| {
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
