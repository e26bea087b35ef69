//! Accuracy metrics between a benchmark tensor `b` and a comparison tensor `c`.
//!
//! Definitions follow msprobe's (docs/msprobe.md lists them) so numbers agree with what
//! users know, plus the relative L2 error and the scaled max error that probe's verdicts
//! use. Everything is accumulated in f64. Data is cut into fixed chunks of [`CHUNK`]
//! elements; each chunk yields a [`Partial`], and partials are combined in chunk order, so
//! the result is bit-identical for any thread count.

use crate::dtype::DType;
use crate::dump::Stats;
use crate::error::Result;
use crate::tensor::TensorData;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Elements per partial result. Fixed: changing it changes the last bits of the sums.
pub const CHUNK: usize = 1 << 16;
/// Elements decoded to f64 at a time (stays in L1 cache).
const BLOCK: usize = 1024;
/// Elements per window of bytes fetched from disk (a multiple of CHUNK).
const WINDOW: usize = 64 * CHUNK;

/// Sums and extremes over a run of elements.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Partial {
    /// Elements counted.
    pub n: u64,
    /// Σ b·c over finite pairs.
    pub dot: f64,
    /// Σ b² over finite pairs.
    pub bb: f64,
    /// Σ c² over finite pairs.
    pub cc: f64,
    /// Σ (c − b)² over finite pairs.
    pub dd: f64,
    /// Σ |c − b| over finite pairs.
    pub sum_abs: f64,
    /// Largest |c − b|.
    pub max_abs: f64,
    /// Largest relative error (msprobe's, `eps` where b is zero).
    pub max_rel: f64,
    /// Largest |b|, the scale for the scaled max error.
    pub max_abs_b: f64,
    /// Elements with a relative error below 0.001 (or the same non-finite value).
    pub lt1: u64,
    /// Elements with a relative error below 0.005 (or the same non-finite value).
    pub lt5: u64,
    /// NaN/Inf elements on the benchmark side.
    pub nonfinite_b: u64,
    /// NaN/Inf elements on the comparison side.
    pub nonfinite_c: u64,
    /// Positions where exactly one side is non-finite, or both are but of another kind.
    pub nonfinite_mismatch: u64,
}

impl Partial {
    /// Adds another run's sums and counts and keeps the larger extremes.
    pub fn merge(&mut self, o: &Partial) {
        self.n += o.n;
        self.dot += o.dot;
        self.bb += o.bb;
        self.cc += o.cc;
        self.dd += o.dd;
        self.sum_abs += o.sum_abs;
        self.max_abs = self.max_abs.max(o.max_abs);
        self.max_rel = self.max_rel.max(o.max_rel);
        self.max_abs_b = self.max_abs_b.max(o.max_abs_b);
        self.lt1 += o.lt1;
        self.lt5 += o.lt5;
        self.nonfinite_b += o.nonfinite_b;
        self.nonfinite_c += o.nonfinite_c;
        self.nonfinite_mismatch += o.nonfinite_mismatch;
    }
}

/// Relative error of one element pair, msprobe's way: where `b` is zero both sides get `eps`.
#[inline(always)]
fn rel_err(b: f64, c: f64, eps: f64) -> f64 {
    let z = b == 0.0;
    let bb = if z { eps } else { b };
    let cc = if z { c + eps } else { c };
    (cc - bb).abs() / bb.abs()
}

/// Accumulates one block of decoded values. The fast path assumes finite data and checks
/// afterwards; a block holding NaN/Inf is redone element by element.
#[inline(always)]
fn block(b: &[f64], c: &[f64], eps: f64, p: &mut Partial) {
    const L: usize = 4;
    let mut dot = [0.0; L];
    let mut bb = [0.0; L];
    let mut cc = [0.0; L];
    let mut dd = [0.0; L];
    let mut sa = [0.0; L];
    let mut ma = [0.0f64; L];
    // The largest relative error per lane, kept as a fraction rn/rd: comparing fractions by
    // cross-multiplication spares a division per element (the kernel's slowest instruction).
    let mut rn = [0.0f64; L];
    let mut rd = [1.0f64; L];
    let mut mb = [0.0f64; L];
    let mut l1 = [0u64; L];
    let mut l5 = [0u64; L];
    let bc = b.chunks_exact(L);
    let cch = c.chunks_exact(L);
    let (br, cr) = (bc.remainder(), cch.remainder());
    for (x, y) in bc.zip(cch) {
        for i in 0..L {
            let d = y[i] - x[i];
            let ad = d.abs();
            dot[i] += x[i] * y[i];
            bb[i] += x[i] * x[i];
            cc[i] += y[i] * y[i];
            dd[i] += d * d;
            sa[i] += ad;
            ma[i] = ma[i].max(ad);
            mb[i] = mb[i].max(x[i].abs());
            // msprobe's relative error num/den: where b is zero both sides get eps.
            let z = x[i] == 0.0;
            let den = if z { eps } else { x[i].abs() };
            let num = if z { ((y[i] + eps) - eps).abs() } else { ad };
            let better = num * rd[i] > rn[i] * den;
            rn[i] = if better { num } else { rn[i] };
            rd[i] = if better { den } else { rd[i] };
            l1[i] += (num < 0.001 * den) as u64;
            l5[i] += (num < 0.005 * den) as u64;
        }
    }
    // The remainder is counted by `element` below.
    let mut q = Partial {
        n: (b.len() - br.len()) as u64,
        ..Partial::default()
    };
    for i in 0..L {
        q.dot += dot[i];
        q.bb += bb[i];
        q.cc += cc[i];
        q.dd += dd[i];
        q.sum_abs += sa[i];
        q.max_abs = q.max_abs.max(ma[i]);
        q.max_rel = q.max_rel.max(rn[i] / rd[i]);
        q.max_abs_b = q.max_abs_b.max(mb[i]);
        q.lt1 += l1[i];
        q.lt5 += l5[i];
    }
    for (&x, &y) in br.iter().zip(cr) {
        element(x, y, eps, &mut q);
    }
    let finite = (q.dot + q.bb + q.cc + q.dd + q.sum_abs + q.max_rel).is_finite();
    if !finite {
        q = Partial::default();
        for (&x, &y) in b.iter().zip(c) {
            element(x, y, eps, &mut q);
        }
    }
    p.merge(&q);
}

/// One element, with msprobe's NaN/Inf rule: where both sides hold the same non-finite
/// value the pair counts as equal (zeroed); elsewhere a non-finite value is a mismatch.
#[inline]
fn element(x: f64, y: f64, eps: f64, q: &mut Partial) {
    q.n += 1;
    let (fx, fy) = (x.is_finite(), y.is_finite());
    if !(fx && fy) {
        q.nonfinite_b += !fx as u64;
        q.nonfinite_c += !fy as u64;
        let same = (x.is_nan() && y.is_nan()) || x == y;
        if same {
            q.lt1 += 1;
            q.lt5 += 1;
        } else {
            q.nonfinite_mismatch += 1;
        }
        return;
    }
    let d = y - x;
    let ad = d.abs();
    q.dot += x * y;
    q.bb += x * x;
    q.cc += y * y;
    q.dd += d * d;
    q.sum_abs += ad;
    q.max_abs = q.max_abs.max(ad);
    q.max_abs_b = q.max_abs_b.max(x.abs());
    let r = rel_err(x, y, eps);
    q.max_rel = q.max_rel.max(r);
    q.lt1 += (r < 0.001) as u64;
    q.lt5 += (r < 0.005) as u64;
}

/// The partial of one chunk given as raw little-endian bytes of both sides.
///
/// On x86-64 CPUs with AVX2 the same code is compiled a second time for AVX2 and picked at
/// run time. Results are bit-identical either way: the lanes and the order of every
/// operation are spelled out in [`block`], and Rust never contracts or reorders float math.
pub fn chunk_partial(bd: DType, b: &[u8], cd: DType, c: &[u8], n: usize, eps: f64) -> Partial {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { chunk_partial_avx2(bd, b, cd, c, n, eps) };
        }
    }
    chunk_partial_portable(bd, b, cd, c, n, eps)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn chunk_partial_avx2(
    bd: DType,
    b: &[u8],
    cd: DType,
    c: &[u8],
    n: usize,
    eps: f64,
) -> Partial {
    chunk_partial_portable(bd, b, cd, c, n, eps)
}

#[inline(always)]
fn chunk_partial_portable(bd: DType, b: &[u8], cd: DType, c: &[u8], n: usize, eps: f64) -> Partial {
    let mut p = Partial::default();
    let mut xb = [0.0f64; BLOCK];
    let mut xc = [0.0f64; BLOCK];
    let (sb, sc) = (bd.size(), cd.size());
    let mut i = 0;
    while i < n {
        let k = BLOCK.min(n - i);
        bd.decode(&b[i * sb..(i + k) * sb], &mut xb[..k]);
        cd.decode(&c[i * sc..(i + k) * sc], &mut xc[..k]);
        block(&xb[..k], &xc[..k], eps, &mut p);
        i += k;
    }
    p
}

/// Final metrics of a tensor pair.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Metrics {
    /// Element pairs compared.
    pub n: u64,
    /// None where msprobe calls it unsupported (a single element).
    pub cosine: Option<f64>,
    /// Largest absolute error, max |c − b|.
    pub max_abs: f64,
    /// Largest relative error |c − b| / |b| (msprobe's, `eps` where b is zero).
    pub max_rel: f64,
    /// Mean absolute error, Σ |c − b| / n.
    pub mean_abs: f64,
    /// Euclidean distance ‖c − b‖₂.
    pub euclid: f64,
    /// ‖b‖₂, the benchmark's norm.
    pub norm_b: f64,
    /// ‖c − b‖ / ‖b‖: the error measure probe's verdicts use.
    pub rel_l2: f64,
    /// max |c − b| / max |b|: catches a few wild elements that barely move the L2 error.
    pub max_abs_scaled: f64,
    /// Fraction of elements with a relative error below 0.001 (msprobe's One Thousandth Err Ratio).
    pub one_thousandth: f64,
    /// Fraction of elements with a relative error below 0.005 (msprobe's Five Thousandths Err Ratio).
    pub five_thousandths: f64,
    /// NaN/Inf elements on the benchmark side.
    pub nonfinite_b: u64,
    /// NaN/Inf elements on the comparison side.
    pub nonfinite_c: u64,
    /// Positions where the NaN/Inf of the two sides disagree; any makes the numeric metrics NaN.
    pub nonfinite_mismatch: u64,
}

impl Metrics {
    /// Whether NaN/Inf sit at the same positions with the same values on both sides.
    pub fn nan_inf_agree(&self) -> bool {
        self.nonfinite_mismatch == 0
    }
}

impl From<Partial> for Metrics {
    fn from(p: Partial) -> Metrics {
        let nb = p.bb.sqrt();
        let nc = p.cc.sqrt();
        // As msprobe: a norm below float64's machine epsilon counts as zero (its workbooks
        // give NaN for a 1e-18-norm benchmark against a 1e-11-norm comparison).
        let zero = |x: f64| x < f64::EPSILON;
        let cosine = if p.n <= 1 {
            None
        } else if zero(nb) && zero(nc) {
            Some(1.0)
        } else if zero(nb) || zero(nc) {
            Some(f64::NAN)
        } else {
            Some(p.dot / (p.bb * p.cc).sqrt())
        };
        let euclid = p.dd.sqrt();
        let ratio = |num: f64, den: f64| {
            if num == 0.0 {
                0.0
            } else if den == 0.0 {
                f64::INFINITY
            } else {
                num / den
            }
        };
        let n = p.n.max(1) as f64;
        let mut m = Metrics {
            n: p.n,
            cosine,
            max_abs: p.max_abs,
            max_rel: p.max_rel,
            mean_abs: p.sum_abs / n,
            euclid,
            norm_b: nb,
            rel_l2: ratio(euclid, nb),
            max_abs_scaled: ratio(p.max_abs, p.max_abs_b),
            one_thousandth: p.lt1 as f64 / n,
            five_thousandths: p.lt5 as f64 / n,
            nonfinite_b: p.nonfinite_b,
            nonfinite_c: p.nonfinite_c,
            nonfinite_mismatch: p.nonfinite_mismatch,
        };
        if p.nonfinite_mismatch > 0 {
            // As msprobe: NaN/Inf in different places make the numeric metrics meaningless.
            let nan = f64::NAN;
            m.cosine = m.cosine.map(|_| nan);
            (m.max_abs, m.max_rel, m.mean_abs, m.euclid) = (nan, nan, nan, nan);
            (m.one_thousandth, m.five_thousandths) = (nan, nan);
            (m.rel_l2, m.max_abs_scaled) = (f64::INFINITY, f64::INFINITY);
        }
        m
    }
}

/// Combines per-chunk partials in order (the deterministic reduction).
fn reduce(parts: &[Partial]) -> Partial {
    let mut p = Partial::default();
    for q in parts {
        p.merge(q);
    }
    p
}

/// The epsilon for relative errors: float32's when both sides are at most float32.
fn eps_for(bd: DType, cd: DType) -> f64 {
    bd.rel_eps().min(cd.rel_eps())
}

/// Metrics of two in-memory byte slices holding `n` elements each.
pub fn compare_bytes(bd: DType, b: &[u8], cd: DType, c: &[u8], n: usize) -> Metrics {
    let eps = eps_for(bd, cd);
    let chunks = n.div_ceil(CHUNK);
    let parts: Vec<Partial> = (0..chunks)
        .into_par_iter()
        .map(|k| {
            let s = k * CHUNK;
            let m = CHUNK.min(n - s);
            chunk_partial(
                bd,
                &b[s * bd.size()..(s + m) * bd.size()],
                cd,
                &c[s * cd.size()..(s + m) * cd.size()],
                m,
                eps,
            )
        })
        .collect();
    reduce(&parts).into()
}

/// Metrics of two tensors on disk, read window by window (bounded memory).
pub fn compare_tensors(b: &TensorData, c: &TensorData) -> Result<Metrics> {
    let n = b.numel.min(c.numel);
    let eps = eps_for(b.dtype, c.dtype);
    let mut parts: Vec<Partial> = Vec::with_capacity(n.div_ceil(CHUNK));
    if n == 0 {
        return Ok(Partial::default().into());
    }
    let mut start = 0;
    while start < n {
        let count = WINDOW.min(n - start);
        let window_parts = b.with_window(start, count, |bw| {
            c.with_window(start, count, |cw| {
                if count <= CHUNK {
                    return vec![chunk_partial(b.dtype, bw, c.dtype, cw, count, eps)];
                }
                let (sb, sc) = (b.dtype.size(), c.dtype.size());
                bw.par_chunks(CHUNK * sb)
                    .zip(cw.par_chunks(CHUNK * sc))
                    .map(|(x, y)| chunk_partial(b.dtype, x, c.dtype, y, x.len() / sb, eps))
                    .collect::<Vec<_>>()
            })
        })??;
        parts.extend(window_parts);
        start += count;
    }
    Ok(reduce(&parts).into())
}

/// Differences of recorded statistics (statistics-only dumps).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct StatDiff {
    /// Comparison max − benchmark max (None when a side lacks it).
    pub max_diff: Option<f64>,
    /// Comparison min − benchmark min.
    pub min_diff: Option<f64>,
    /// Comparison mean − benchmark mean.
    pub mean_diff: Option<f64>,
    /// Comparison L2 norm − benchmark L2 norm.
    pub norm_diff: Option<f64>,
    /// msprobe's relative differences, in percent: |diff / b| · 100.
    pub max_rel_pct: Option<f64>,
    /// |Δmin / b.min| · 100.
    pub min_rel_pct: Option<f64>,
    /// |Δmean / b.mean| · 100.
    pub mean_rel_pct: Option<f64>,
    /// |Δnorm / b.norm| · 100.
    pub norm_rel_pct: Option<f64>,
}

/// Statistics differences, msprobe's way (comparison − benchmark, and relative to the
/// benchmark in percent).
pub fn stat_diff(b: &Stats, c: &Stats) -> StatDiff {
    let diff = |x: Option<f64>, y: Option<f64>| match (x, y) {
        // Equal values, equal infinities and NaN on both sides are no difference.
        (Some(x), Some(y)) if x == y || (x.is_nan() && y.is_nan()) => Some(0.0),
        (Some(x), Some(y)) => Some(y - x),
        _ => None,
    };
    let pct = |d: Option<f64>, x: Option<f64>| match (d, x) {
        (Some(0.0), Some(_)) => Some(0.0),
        (Some(d), Some(x)) => Some((d / x).abs() * 100.0),
        _ => None,
    };
    let (dmax, dmin, dmean, dnorm) = (
        diff(b.max, c.max),
        diff(b.min, c.min),
        diff(b.mean, c.mean),
        diff(b.norm, c.norm),
    );
    StatDiff {
        max_diff: dmax,
        min_diff: dmin,
        mean_diff: dmean,
        norm_diff: dnorm,
        max_rel_pct: pct(dmax, b.max),
        min_rel_pct: pct(dmin, b.min),
        mean_rel_pct: pct(dmean, b.mean),
        norm_rel_pct: pct(dnorm, b.norm),
    }
}

impl StatDiff {
    /// The largest statistic difference relative to the tensor's scale (probe's verdict
    /// measure): Δmax, Δmin and Δmean against max(|max|, |min|, norm/√n) of the benchmark
    /// `b`, Δnorm against its norm. The first `atol` of each difference (`atol·√n` of Δnorm)
    /// is forgiven, as in allclose (see [`crate::compare::tolerance::Tol::atol`]), so tensors
    /// that are zero up to rounding compare as equal.
    pub fn scaled_err(&self, b: &Stats, numel: usize, atol: f64) -> f64 {
        let root_n = (numel.max(1) as f64).sqrt();
        let rms = b.norm.map(|n| n / root_n);
        let scale = [b.max.map(f64::abs), b.min.map(f64::abs), rms]
            .into_iter()
            .flatten()
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max);
        let rel = |d: Option<f64>, s: f64, slack: f64| match d {
            None => 0.0,
            Some(d) if d.abs() <= slack => 0.0,
            Some(d) if s == 0.0 || !d.is_finite() => f64::INFINITY,
            Some(d) => (d.abs() - slack) / s,
        };
        rel(self.max_diff, scale, atol)
            .max(rel(self.min_diff, scale, atol))
            .max(rel(self.mean_diff, scale, atol))
            .max(rel(
                self.norm_diff,
                b.norm.map(f64::abs).unwrap_or(0.0),
                atol * root_n,
            ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatched_kernel_equals_the_portable_one_bit_for_bit() {
        let n = 3 * BLOCK + 7;
        let b: Vec<u8> = (0..n)
            .flat_map(|i| (((i * 7919) % 1013) as f32 * 0.37 - 150.0).to_le_bytes())
            .collect();
        let mut c: Vec<u8> = (0..n)
            .flat_map(|i| {
                let x = ((i * 7919) % 1013) as f32 * 0.37 - 150.0;
                half::bf16::from_f32(x * (1.0 + (i % 5) as f32 * 1e-3)).to_le_bytes()
            })
            .collect();
        let eps = f32::EPSILON as f64;
        let a = chunk_partial(DType::F32, &b, DType::BF16, &c, n, eps);
        let p = chunk_partial_portable(DType::F32, &b, DType::BF16, &c, n, eps);
        assert_eq!(format!("{a:?}"), format!("{p:?}"));
        // And through the slow path for non-finite values.
        c[2 * BLOCK * 2..2 * BLOCK * 2 + 2].copy_from_slice(&half::bf16::NAN.to_le_bytes());
        let a = chunk_partial(DType::F32, &b, DType::BF16, &c, n, eps);
        let p = chunk_partial_portable(DType::F32, &b, DType::BF16, &c, n, eps);
        assert_eq!(a.nonfinite_mismatch, 1);
        assert_eq!(format!("{a:?}"), format!("{p:?}"));
    }

    #[test]
    fn windowed_reads_from_disk_equal_the_in_memory_result() {
        // More than one window (and a partial last chunk), at an unaligned file offset, with
        // mixed dtypes: the on-disk path must give the very same bits as the in-memory one.
        let n = WINDOW + 3 * CHUNK + 12_345;
        let b: Vec<u8> = (0..n)
            .flat_map(|i| (((i * 7919) % 10_007) as f32 * 1e-3 - 5.0).to_le_bytes())
            .collect();
        let c: Vec<u8> = (0..n)
            .flat_map(|i| {
                let x = ((i * 7919) % 10_007) as f32 * 1e-3 - 5.0;
                half::bf16::from_f32(x).to_le_bytes()
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let (pb, pc) = (dir.path().join("b.bin"), dir.path().join("c.bin"));
        std::fs::write(&pb, [&[7u8; 3][..], &b].concat()).unwrap();
        std::fs::write(&pc, [&[7u8; 5][..], &c].concat()).unwrap();
        let tb = TensorData::in_file(&pb, 3, n, DType::F32).unwrap();
        let tc = TensorData::in_file(&pc, 5, n, DType::BF16).unwrap();
        let on_disk = compare_tensors(&tb, &tc).unwrap();
        let in_memory = compare_bytes(DType::F32, &b, DType::BF16, &c, n);
        assert_eq!(format!("{on_disk:?}"), format!("{in_memory:?}"));
        assert_eq!(on_disk.n, n as u64);
    }
}
