//! `compare.parquet`: every row with every metric, for pandas / polars / duckdb users.
//! Unmatched tensors are rows too, with verdict `unmatched`. Snappy-compressed.

use super::{number_values, ReportWriter, Summary, NUMBER_COLUMNS};
use crate::atomic;
use crate::compare::{CompareResult, Row, Side, Unmatched};
use crate::error::{ProbeError, Result};
use arrow_array::builder::{BooleanBuilder, Float64Builder, StringBuilder, UInt64Builder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use std::path::Path;
use std::sync::Arc;

pub struct ParquetTable;

const BATCH: usize = 65_536;

const STR_COLS: &[&str] = &[
    "step",
    "rank",
    "op",
    "direction",
    "role",
    "tensor",
    "dtype_bench",
    "dtype_cmp",
    "shape_bench",
    "shape_cmp",
    "compared_by",
    "verdict",
    "reason",
];
const BOOL_COLS: &[&str] = &["nan_inf_agree", "checksum_equal", "external_input"];

struct Builders {
    seq: UInt64Builder,
    s: Vec<StringBuilder>,
    f: Vec<Float64Builder>,
    b: Vec<BooleanBuilder>,
    len: usize,
}

fn shape(s: &[usize]) -> String {
    format!("{s:?}")
}

impl Builders {
    fn new() -> Self {
        Builders {
            seq: UInt64Builder::new(),
            s: STR_COLS.iter().map(|_| StringBuilder::new()).collect(),
            f: NUMBER_COLUMNS
                .iter()
                .map(|_| Float64Builder::new())
                .collect(),
            b: BOOL_COLS.iter().map(|_| BooleanBuilder::new()).collect(),
            len: 0,
        }
    }

    fn push(
        &mut self,
        seq: u64,
        s: [Option<&str>; 13],
        f: [Option<f64>; NUMBER_COLUMNS.len()],
        b: [Option<bool>; 3],
    ) {
        self.seq.append_value(seq);
        for (bld, v) in self.s.iter_mut().zip(s) {
            bld.append_option(v);
        }
        for (bld, v) in self.f.iter_mut().zip(f) {
            bld.append_option(v);
        }
        for (bld, v) in self.b.iter_mut().zip(b) {
            bld.append_option(v);
        }
        self.len += 1;
    }

    fn row(&mut self, step: &str, rank: &str, r: &Row) {
        let m = r.metrics;
        let (sb, sc) = (shape(&r.shape_b), shape(&r.shape_c));
        self.push(
            r.seq,
            [
                Some(step),
                Some(rank),
                Some(&r.op),
                Some(r.direction.name()),
                Some(r.role.name()),
                Some(&r.name),
                Some(&r.dtype_b),
                Some(&r.dtype_c),
                Some(&sb),
                Some(&sc),
                Some(r.kind.name()),
                Some(r.verdict.name()),
                Some(&r.reason),
            ],
            number_values(r),
            [
                m.map(|m| m.nan_inf_agree()),
                r.checksum_equal,
                Some(r.external),
            ],
        );
    }

    fn unmatched(&mut self, step: &str, rank: &str, u: &Unmatched) {
        let sh = shape(&u.shape);
        let (dtb, dtc, shb, shc, why) = match u.side {
            Side::Bench => (
                Some(u.dtype.as_str()),
                None,
                Some(sh.as_str()),
                None,
                "only in bench",
            ),
            Side::Cmp => (
                None,
                Some(u.dtype.as_str()),
                None,
                Some(sh.as_str()),
                "only in cmp",
            ),
        };
        let dir = if u.op.contains(".backward") || u.op.ends_with("parameters_grad") {
            "backward"
        } else {
            "forward"
        };
        self.push(
            u.seq,
            [
                Some(step),
                Some(rank),
                Some(&u.op),
                Some(dir),
                Some(u.role.name()),
                Some(&u.name),
                dtb,
                dtc,
                shb,
                shc,
                Some("none"),
                Some("unmatched"),
                Some(why),
            ],
            [None; NUMBER_COLUMNS.len()],
            [None; 3],
        );
    }

    fn finish(&mut self, schema: &Arc<Schema>) -> std::result::Result<RecordBatch, String> {
        let mut cols: Vec<ArrayRef> = vec![Arc::new(self.seq.finish())];
        cols.extend(self.s.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
        cols.extend(self.f.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
        cols.extend(self.b.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
        self.len = 0;
        RecordBatch::try_new(schema.clone(), cols).map_err(|e| e.to_string())
    }
}

fn schema() -> Arc<Schema> {
    let mut fields = vec![Field::new("seq", DataType::UInt64, false)];
    fields.extend(
        STR_COLS
            .iter()
            .map(|n| Field::new(*n, DataType::Utf8, true)),
    );
    fields.extend(
        NUMBER_COLUMNS
            .iter()
            .map(|(n, _)| Field::new(*n, DataType::Float64, true)),
    );
    fields.extend(
        BOOL_COLS
            .iter()
            .map(|n| Field::new(*n, DataType::Boolean, true)),
    );
    Arc::new(Schema::new(fields))
}

impl ReportWriter for ParquetTable {
    fn format(&self) -> &'static str {
        "parquet"
    }
    fn file_name(&self) -> &'static str {
        "compare.parquet"
    }
    fn write(&self, res: &CompareResult, _summary: &Summary, path: &Path) -> Result<()> {
        let schema = schema();
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build();
        atomic::write_with(path, |w| {
            let mut writer =
                ArrowWriter::try_new(w, schema.clone(), Some(props)).map_err(|e| e.to_string())?;
            let mut b = Builders::new();
            let mut flush = |b: &mut Builders, force: bool| -> std::result::Result<(), String> {
                if b.len >= BATCH || (force && b.len > 0) {
                    let batch = b.finish(&schema)?;
                    writer.write(&batch).map_err(|e| e.to_string())?;
                }
                Ok(())
            };
            for r in &res.rows {
                let p = &res.pairs[r.pair];
                b.row(&p.step, &p.rank, r);
                flush(&mut b, false)?;
            }
            for u in &res.unmatched {
                let p = &res.pairs[u.pair];
                b.unmatched(&p.step, &p.rank, u);
                flush(&mut b, false)?;
            }
            flush(&mut b, true)?;
            writer.close().map_err(|e| e.to_string())?;
            Ok(())
        })
        .map_err(|e| match e {
            ProbeError::Output { path, msg } => ProbeError::Output {
                path,
                msg: format!("parquet: {msg}"),
            },
            other => other,
        })
    }
}
