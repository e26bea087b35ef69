//! `compare.parquet`: every row with every metric, for pandas / polars / duckdb users.
//! Unmatched tensors are rows too, with verdict `unmatched`. Snappy-compressed.

use super::{ReportWriter, Summary};
use crate::atomic;
use crate::compare::{CompareResult, Row, Side, Unmatched};
use crate::dump::Stats;
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
const F64_COLS: &[&str] = &[
    "err",
    "tolerance",
    "needed",
    "cosine",
    "max_abs_err",
    "max_rel_err",
    "mean_abs_err",
    "euclidean",
    "rel_l2",
    "max_abs_scaled",
    "one_thousandth_ratio",
    "five_thousandths_ratio",
    "bench_max",
    "bench_min",
    "bench_mean",
    "bench_norm",
    "cmp_max",
    "cmp_min",
    "cmp_mean",
    "cmp_norm",
    "max_diff",
    "min_diff",
    "mean_diff",
    "norm_diff",
    "max_rel_diff_pct",
    "min_rel_diff_pct",
    "mean_rel_diff_pct",
    "norm_rel_diff_pct",
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

fn stats4(s: &Option<Stats>) -> [Option<f64>; 4] {
    match s {
        Some(s) => [s.max, s.min, s.mean, s.norm],
        None => [None; 4],
    }
}

impl Builders {
    fn new() -> Self {
        Builders {
            seq: UInt64Builder::new(),
            s: STR_COLS.iter().map(|_| StringBuilder::new()).collect(),
            f: F64_COLS.iter().map(|_| Float64Builder::new()).collect(),
            b: BOOL_COLS.iter().map(|_| BooleanBuilder::new()).collect(),
            len: 0,
        }
    }

    fn push(
        &mut self,
        seq: u64,
        s: [Option<&str>; 13],
        f: [Option<f64>; 28],
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
        let sd = r.stat_diff;
        let [bmax, bmin, bmean, bnorm] = stats4(&r.stats_b);
        let [cmax, cmin, cmean, cnorm] = stats4(&r.stats_c);
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
            [
                Some(r.err),
                Some(r.tol_error),
                Some(r.needed),
                m.and_then(|m| m.cosine),
                m.map(|m| m.max_abs),
                m.map(|m| m.max_rel),
                m.map(|m| m.mean_abs),
                m.map(|m| m.euclid),
                m.map(|m| m.rel_l2),
                m.map(|m| m.max_abs_scaled),
                m.map(|m| m.one_thousandth),
                m.map(|m| m.five_thousandths),
                bmax,
                bmin,
                bmean,
                bnorm,
                cmax,
                cmin,
                cmean,
                cnorm,
                sd.and_then(|d| d.max_diff),
                sd.and_then(|d| d.min_diff),
                sd.and_then(|d| d.mean_diff),
                sd.and_then(|d| d.norm_diff),
                sd.and_then(|d| d.max_rel_pct),
                sd.and_then(|d| d.min_rel_pct),
                sd.and_then(|d| d.mean_rel_pct),
                sd.and_then(|d| d.norm_rel_pct),
            ],
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
            [None; 28],
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
        F64_COLS
            .iter()
            .map(|n| Field::new(*n, DataType::Float64, true)),
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
