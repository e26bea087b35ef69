//! One logical parameter of each side compared, a block of whole rows at a time: each
//! side's pieces are read (`pread`, both sides at once) into a buffer of at most
//! [`BLOCK_BYTES`] in logical order, the buffers compared byte for byte, and only when
//! they differ are the metrics computed (the float kernels of [`crate::metrics`]); the
//! blocks before the first differing one are then read again for them. Memory: two
//! blocks and a scatter buffer, whatever the checkpoint or tensor size.

use super::layout::{Logical, Piece};
use super::source::Checkpoint;
use crate::error::{ProbeError, Result};
use crate::metrics::{chunk_partial, Metrics, Partial, CHUNK};
use rayon::prelude::*;
use std::os::unix::fs::FileExt;

/// Bytes of logical rows gathered per side at a time.
const BLOCK_BYTES: usize = 8 << 20;

/// The outcome for one parameter pair.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Bit-identical (same dtype, same bytes).
    pub exact: bool,
    /// Metrics (for an exact pair: cosine 1, errors 0).
    pub metrics: Metrics,
    /// The pieces (side 0 bench, 1 cmp; index into the side's `pieces`) holding at least
    /// one differing element.
    pub differing_pieces: [Vec<usize>; 2],
    /// Replicas (index into the side's `replicas`) that are not equal to the copy compared.
    pub bad_replicas: [Vec<usize>; 2],
}

/// The buffers a run reuses from pair to pair: freeing and allocating blocks of
/// megabytes per parameter made the allocator hold several times the memory in use (a
/// 1B-parameter pair: 960 MB peak RSS) and fault the pages in again each time.
#[derive(Debug, Default)]
pub struct Buffers {
    /// Each side's block, then each side's scatter buffer.
    blocks: [Vec<u8>; 2],
    scatter: [Vec<u8>; 2],
}

impl Buffers {
    /// Reads logical rows `r0..r1` of both sides into the blocks, both at once.
    fn read(&mut self, a: &Side, b: &Side, r0: usize, r1: usize) -> Result<()> {
        let [ba, bb] = &mut self.blocks;
        let [ta, tb] = &mut self.scatter;
        let (ra, rb) = rayon::join(|| gather(a, r0, r1, ba, ta), || gather(b, r0, r1, bb, tb));
        ra.and(rb)
    }
}

/// One side of a pair.
pub struct Side<'a> {
    /// The checkpoint.
    pub ck: &'a Checkpoint,
    /// The parameter.
    pub p: &'a Logical,
}

/// Compares the two sides of a parameter (same shape, checked by the caller).
pub fn compare(a: &Side, b: &Side, bufs: &mut Buffers) -> Result<Measured> {
    let (rows, cols) = (a.p.rows, a.p.cols);
    let (sa, sb) = (a.p.dtype.size(), b.p.dtype.size());
    let block = (BLOCK_BYTES / (cols.max(1) * sa.max(sb))).max(1);
    let same_dtype = a.p.dtype == b.p.dtype;
    let mut parts: Vec<Partial> = Vec::new();
    let mut differs = false;
    let mut dp: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
    let mut r0 = 0;
    while r0 < rows {
        let r1 = (r0 + block).min(rows);
        bufs.read(a, b, r0, r1)?;
        let equal = same_dtype && bufs.blocks[0] == bufs.blocks[1];
        if !equal && !differs {
            differs = true;
            // Metrics from the first block on: the blocks read so far were equal.
            let mut redo = 0;
            while redo < r0 {
                let end = (redo + block).min(r0);
                bufs.read(a, b, redo, end)?;
                parts.push(partial(a, &bufs.blocks[0], b, &bufs.blocks[1]));
                redo = end;
            }
            bufs.read(a, b, r0, r1)?;
        }
        let [ba, bb] = &bufs.blocks;
        if differs {
            parts.push(partial(a, ba, b, bb));
        }
        if !equal {
            for (s, side) in [a, b].into_iter().enumerate() {
                mark_differing(side, r0, r1, [ba, bb], [sa, sb], same_dtype, &mut dp[s]);
            }
        }
        r0 = r1;
    }
    let metrics = if differs {
        let mut p = Partial::default();
        for q in &parts {
            p.merge(q);
        }
        Metrics::from(p)
    } else {
        exact_metrics(rows * cols)
    };
    let bad_replicas = [replicas(a, bufs)?, replicas(b, bufs)?];
    Ok(Measured {
        exact: !differs,
        metrics,
        differing_pieces: dp,
        bad_replicas,
    })
}

/// A buffer of exactly `n` bytes, reusing its allocation; the old bytes are left (the
/// caller overwrites them all).
fn sized(buf: &mut Vec<u8>, n: usize) {
    buf.truncate(n);
    buf.resize(n, 0);
}

/// The metrics of a bit-identical pair of `n` elements.
fn exact_metrics(n: usize) -> Metrics {
    Metrics {
        n: n as u64,
        cosine: (n > 1).then_some(1.0),
        one_thousandth: 1.0,
        five_thousandths: 1.0,
        ..Metrics::default()
    }
}

/// The partial sums of two gathered blocks, chunk by chunk in order (deterministic).
fn partial(a: &Side, ba: &[u8], b: &Side, bb: &[u8]) -> Partial {
    let (da, db) = (a.p.dtype, b.p.dtype);
    let n = ba.len() / da.size();
    let eps = da.rel_eps().min(db.rel_eps());
    let parts: Vec<Partial> = (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .map(|k| {
            let s = k * CHUNK;
            let m = CHUNK.min(n - s);
            chunk_partial(
                da,
                &ba[s * da.size()..(s + m) * da.size()],
                db,
                &bb[s * db.size()..(s + m) * db.size()],
                m,
                eps,
            )
        })
        .collect();
    let mut p = Partial::default();
    for q in &parts {
        p.merge(q);
    }
    p
}

/// The part of piece `pc` inside logical rows `r0..r1`: (first logical row, rows).
fn overlap(pc: &Piece, r0: usize, r1: usize) -> Option<(usize, usize)> {
    let s = pc.row.max(r0);
    let e = (pc.row + pc.rows).min(r1);
    (s < e).then(|| (s, e - s))
}

/// Reads logical rows `r0..r1` of a side into `buf` (row-major, the side's dtype). Every
/// byte is written: the pieces tile the parameter (checked by `layout`).
fn gather(side: &Side, r0: usize, r1: usize, buf: &mut Vec<u8>, tmp: &mut Vec<u8>) -> Result<()> {
    let p = side.p;
    let es = p.dtype.size();
    let row_bytes = p.cols * es;
    sized(buf, (r1 - r0) * row_bytes);
    for pc in &p.pieces {
        let Some((s, n)) = overlap(pc, r0, r1) else {
            continue;
        };
        let t = &side.ck.tensors[pc.src];
        let (file_path, file) = &side.ck.files[t.file];
        let (_, src_cols) = t.rows_cols();
        let src_row_bytes = src_cols * es;
        let at = t.offset + ((pc.src_row + s - pc.row) * src_row_bytes) as u64;
        let io = |e: std::io::Error| ProbeError::io(file_path, e);
        if src_cols == p.cols {
            let dst = &mut buf[(s - r0) * row_bytes..(s - r0 + n) * row_bytes];
            file.read_exact_at(dst, at).map_err(io)?;
        } else {
            sized(tmp, n * src_row_bytes);
            file.read_exact_at(tmp, at).map_err(io)?;
            for (i, row) in tmp.chunks_exact(src_row_bytes).enumerate() {
                let d = (s - r0 + i) * row_bytes + pc.col * es;
                buf[d..d + src_row_bytes].copy_from_slice(row);
            }
        }
    }
    Ok(())
}

/// Marks the pieces of `side` whose part in rows `r0..r1` differs between the blocks
/// (`sizes`: each block's element size).
fn mark_differing(
    side: &Side,
    r0: usize,
    r1: usize,
    [ba, bb]: [&[u8]; 2],
    [sa, sb]: [usize; 2],
    same: bool,
    out: &mut Vec<usize>,
) {
    let cols = side.p.cols;
    for (i, pc) in side.p.pieces.iter().enumerate() {
        if out.contains(&i) {
            continue;
        }
        let Some((s, n)) = overlap(pc, r0, r1) else {
            continue;
        };
        let (_, w) = side.ck.tensors[pc.src].rows_cols();
        let differs = !same
            || (0..n).any(|k| {
                let base = (s - r0 + k) * cols + pc.col;
                ba[base * sa..(base + w) * sa] != bb[base * sb..(base + w) * sb]
            });
        if differs {
            out.push(i);
        }
    }
}

/// The replicas of a side's parameter not byte-equal to the copy compared.
fn replicas(side: &Side, bufs: &mut Buffers) -> Result<Vec<usize>> {
    let mut bad = Vec::new();
    let Some(first) = side.p.pieces.first() else {
        return Ok(bad);
    };
    let main = &side.ck.tensors[first.src];
    let len = main.numel() * main.dtype.size();
    let [x, y] = &mut bufs.blocks;
    for (i, &r) in side.p.replicas.iter().enumerate() {
        let t = &side.ck.tensors[r];
        let (fm, ft) = (&side.ck.files[main.file], &side.ck.files[t.file]);
        let mut off = 0;
        while off < len {
            let n = BLOCK_BYTES.min(len - off);
            sized(x, n);
            sized(y, n);
            fm.1.read_exact_at(x, main.offset + off as u64)
                .map_err(|e| ProbeError::io(&fm.0, e))?;
            ft.1.read_exact_at(y, t.offset + off as u64)
                .map_err(|e| ProbeError::io(&ft.0, e))?;
            if x != y {
                bad.push(i);
                break;
            }
            off += n;
        }
    }
    Ok(bad)
}
