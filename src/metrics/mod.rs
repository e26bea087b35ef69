//! Accuracy metrics between a benchmark tensor `b` and a comparison tensor `c`.
//!
//! Definitions follow msprobe's (docs/msprobe.md lists them) so numbers agree with what
//! users know, plus the relative L2 error and the scaled max error that probe's verdicts
//! use. Data is cut into fixed chunks of `CHUNK` elements; each chunk yields a `Partial`,
//! and partials are combined in chunk order, so the result is bit-identical for any thread
//! count.
//!
//! Two kernels: where both sides widen exactly to f32 (f32, f16, bf16, in any mix) the sums
//! run in f32 lanes over short blocks flushed to f64 (`kernel_f32`): half the bytes per
//! value of f64 lanes, twice the lanes per register, so the pass runs at memory speed. Its
//! error bound is stated in docs/compare.md ("Accuracy of the float32 kernel"). Everything
//! else (f64, integers, bool) is decoded to f64 and accumulated in f64 (`kernel_f64`).
//! This file holds what both share: the chunks, their partials and the final [`Metrics`];
//! `stats` the differences of recorded statistics, for dumps without tensor bytes.

use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::TensorData;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

mod kernel_f32;
mod kernel_f64;
mod stats;

use kernel_f32::{chunk_f32, F32Like};
use kernel_f64::block;
pub use stats::{stat_diff, StatDiff};

/// Elements per partial result. Fixed: changing it changes the last bits of the sums.
pub(crate) const CHUNK: usize = 1 << 16;
/// Elements decoded to f64 at a time (stays in L1 cache).
const BLOCK: usize = 1024;
/// Elements per window of bytes fetched from disk (a multiple of CHUNK).
const WINDOW: usize = 64 * CHUNK;

/// Sums and extremes over a run of elements.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Partial {
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
    pub(crate) fn merge(&mut self, o: &Partial) {
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

/// The partial of one chunk given as raw little-endian bytes of both sides.
///
/// On x86-64 CPUs with AVX2 the same code is compiled a second time for AVX2 and picked at
/// run time. Results are bit-identical either way: the lanes and the order of every
/// operation are spelled out in `block`, and Rust never contracts or reorders float math.
pub(crate) fn chunk_partial(
    bd: DType,
    b: &[u8],
    cd: DType,
    c: &[u8],
    n: usize,
    eps: f64,
) -> Partial {
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
    if let (Some(bk), Some(ck)) = (F32Like::of(bd), F32Like::of(cd)) {
        return chunk_f32(bk, b, ck, c, n, eps);
    }
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
            // Rounding of the sums (float32 blocks: up to 2γ₁₆, docs/compare.md) can push a
            // cosine of nearly equal tensors past 1; the true value never is.
            Some((p.dot / (p.bb * p.cc).sqrt()).clamp(-1.0, 1.0))
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
pub(crate) fn compare_tensors(b: &TensorData, c: &TensorData) -> Result<Metrics> {
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

#[cfg(test)]
mod tests {
    use super::kernel_f32::FBLOCK;
    use super::kernel_f64::{block, element};
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

    fn bytes_of(d: DType, v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|&x| match d {
                DType::BF16 => half::bf16::from_f32(x).to_le_bytes().to_vec(),
                DType::F16 => half::f16::from_f32(x).to_le_bytes().to_vec(),
                _ => x.to_le_bytes().to_vec(),
            })
            .collect()
    }

    /// Data that visits every path of the f32 kernel: plain blocks, zeros in b, a block of
    /// tiny values (float64 redo), one that overflows float32 squares (float64 redo), one
    /// with ratios within rounding of 0.001 (counters recounted), and a tail.
    fn kernel_paths(n: usize) -> (Vec<f32>, Vec<f32>) {
        let b: Vec<f32> = (0..n)
            .map(|i| match (i / FBLOCK) % 7 {
                _ if i % 11 == 0 => 0.0,
                3 => ((i * 31) % 97) as f32 * 1e-22,
                5 => ((i * 31) % 97) as f32 * 1e20,
                _ => ((i * 7919) % 1013) as f32 * 0.37 - 150.0,
            })
            .collect();
        let c = b
            .iter()
            .enumerate()
            .map(|(i, &x)| match (i / FBLOCK) % 7 {
                _ if x == 0.0 => (i % 3) as f32 * 1e-9,
                6 => x * (1.0 + 0.001) + f32::EPSILON * x * ((i % 5) as f32 - 2.0),
                _ => x * (1.0 + (i % 9) as f32 * 1e-3) + 1e-6,
            })
            .collect();
        (b, c)
    }

    #[test]
    fn portable_f32_kernel_equals_the_dispatched_one_bit_for_bit() {
        let n = 7 * FBLOCK * 3 + 77;
        let (b, c) = kernel_paths(n);
        let eps = f32::EPSILON as f64;
        let kinds = [DType::F32, DType::BF16, DType::F16];
        for bd in kinds {
            for cd in kinds {
                let (xb, mut xc) = (bytes_of(bd, &b), bytes_of(cd, &c));
                let a = chunk_partial(bd, &xb, cd, &xc, n, eps);
                let p = chunk_partial_portable(bd, &xb, cd, &xc, n, eps);
                assert_eq!(format!("{a:?}"), format!("{p:?}"), "{bd:?} {cd:?}");
                assert_eq!(a.n, n as u64);
                // (float16 turns the 1e20 block into Inf: mismatches unless both are f16.)
                let before = a.nonfinite_mismatch;
                // A NaN in one block: that block is redone element by element.
                let at = (FBLOCK + 5) * cd.size();
                let nan = bytes_of(cd, &[f32::NAN]);
                xc[at..at + cd.size()].copy_from_slice(&nan);
                let a = chunk_partial(bd, &xb, cd, &xc, n, eps);
                let p = chunk_partial_portable(bd, &xb, cd, &xc, n, eps);
                assert_eq!(a.nonfinite_mismatch, before + 1);
                assert_eq!(format!("{a:?}"), format!("{p:?}"), "{bd:?} {cd:?} NaN");
            }
        }
    }

    #[test]
    fn f32_kernel_counts_exactly_what_float64_counts() {
        // Pairs whose ratio is on one side of 0.001 (0.005) in float32 and on the other in
        // float64: the kernel must count them as float64 does.
        let eps = f32::EPSILON as f64;
        let (mut b, mut c) = (vec![], vec![]);
        let mut x = 1.0f32;
        while b.len() < 2 * FBLOCK {
            x = f32::from_bits(x.to_bits() + 1);
            for (t, t64) in [(0.001f32, 0.001f64), (0.005, 0.005)] {
                let y0 = x + x * t;
                for k in -3i32..=3 {
                    let y = f32::from_bits((y0.to_bits() as i32 + k) as u32);
                    let (r32, r64) = ((y - x) / x, (y as f64 - x as f64) / x as f64);
                    if (r32 < t) != (r64 < t64) {
                        b.push(x);
                        c.push(y);
                    }
                }
            }
        }
        let (xb, xc) = (bytes_of(DType::F32, &b), bytes_of(DType::F32, &c));
        let p = chunk_partial(DType::F32, &xb, DType::F32, &xc, b.len(), eps);
        let mut want = Partial::default();
        for (&x, &y) in b.iter().zip(&c) {
            element(x as f64, y as f64, eps, &mut want);
        }
        assert_eq!((p.lt1, p.lt5), (want.lt1, want.lt5));
        assert_eq!(p.n, b.len() as u64);
    }

    #[test]
    fn f32_kernel_redoes_tiny_and_huge_blocks_in_float64() {
        // Squares of 1e-22 underflow float32 and those of 1e20 overflow it: both blocks must
        // give the float64 kernel's sums.
        let eps = f32::EPSILON as f64;
        for scale in [1e-22f32, 1e20] {
            let b: Vec<f32> = (0..FBLOCK).map(|i| (i + 1) as f32 * scale).collect();
            let c: Vec<f32> = b.iter().map(|x| x * 1.5).collect();
            let (xb, xc) = (bytes_of(DType::F32, &b), bytes_of(DType::F32, &c));
            let p = chunk_partial(DType::F32, &xb, DType::F32, &xc, FBLOCK, eps);
            let mut want = Partial::default();
            let wb: Vec<f64> = b.iter().map(|&x| x as f64).collect();
            let wc: Vec<f64> = c.iter().map(|&x| x as f64).collect();
            block(&wb, &wc, eps, &mut want);
            assert_eq!(format!("{p:?}"), format!("{want:?}"), "scale {scale}");
            assert!(p.bb > 0.0 && p.bb.is_finite());
        }
    }

    #[test]
    fn a_one_ulp_difference_is_never_lost() {
        // `euclid == 0` is what makes a pair "identical" in the verdicts: one element one ulp
        // off must leave Σ(c − b)² positive at any scale, including where float32 squares
        // underflow (the block is then redone in float64) and among exact zeros.
        let n = 3 * FBLOCK + 5;
        for scale in [1.0f32, 1e-3, 1e-20, 1e-38, 1e15] {
            for at in [0, FBLOCK + 7, n - 1] {
                let b: Vec<f32> = (0..n)
                    .map(|i| {
                        if i % 3 == 0 {
                            0.0
                        } else {
                            (1 + i % 17) as f32 * scale
                        }
                    })
                    .collect();
                let mut c = b.clone();
                c[at] = f32::from_bits(c[at].to_bits() + 1);
                let (xb, xc) = (bytes_of(DType::F32, &b), bytes_of(DType::F32, &c));
                let m = compare_bytes(DType::F32, &xb, DType::F32, &xc, n);
                let d = (c[at] as f64 - b[at] as f64).abs();
                assert_eq!(m.max_abs, d, "scale {scale} at {at}");
                assert!(m.euclid > 0.0, "scale {scale} at {at}");
                assert!((m.euclid - d).abs() <= 1e-6 * d, "scale {scale} at {at}");
                let same = compare_bytes(DType::F32, &xb, DType::F32, &xb, n);
                assert_eq!((same.euclid, same.max_abs), (0.0, 0.0));
            }
        }
    }

    #[test]
    fn f32_results_do_not_depend_on_threads_and_merge_in_chunk_order() {
        let n = 5 * CHUNK + 3 * FBLOCK + 9;
        let (b, c) = kernel_paths(n);
        let (xb, xc) = (bytes_of(DType::F32, &b), bytes_of(DType::BF16, &c));
        let run = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .map(|pool| pool.install(|| compare_bytes(DType::F32, &xb, DType::BF16, &xc, n)))
                .ok()
        };
        let one = run(1).map(|m| format!("{m:?}"));
        assert!(one.is_some());
        assert_eq!(one, run(4).map(|m| format!("{m:?}")));
        // The same as merging each chunk's partial by hand, in order.
        let eps = f32::EPSILON as f64;
        let mut p = Partial::default();
        for k in 0..n.div_ceil(CHUNK) {
            let (s, e) = (k * CHUNK, ((k + 1) * CHUNK).min(n));
            p.merge(&chunk_partial(
                DType::F32,
                &xb[4 * s..4 * e],
                DType::BF16,
                &xc[2 * s..2 * e],
                e - s,
                eps,
            ));
        }
        assert_eq!(one, Some(format!("{:?}", Metrics::from(p))));
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
