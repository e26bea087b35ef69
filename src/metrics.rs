//! Accuracy metrics between a benchmark tensor `b` and a comparison tensor `c`.
//!
//! Definitions follow msprobe's (docs/msprobe.md lists them) so numbers agree with what
//! users know, plus the relative L2 error and the scaled max error that probe's verdicts
//! use. Data is cut into fixed chunks of [`CHUNK`] elements; each chunk yields a [`Partial`],
//! and partials are combined in chunk order, so the result is bit-identical for any thread
//! count.
//!
//! Two kernels: where both sides widen exactly to f32 (f32, f16, bf16, in any mix) the sums
//! run in f32 lanes over short blocks flushed to f64 (`chunk_f32`): half the bytes per
//! value of f64 lanes, twice the lanes per register, so the pass runs at memory speed. Its
//! error bound is stated in docs/compare.md ("Accuracy of the float32 kernel"). Everything
//! else (f64, integers, bool) is decoded to f64 and accumulated in f64 (`block`).

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

/// float32 lanes per accumulator in the f32 kernel: one AVX2 register or two SSE/NEON ones.
/// Ten accumulators of 8 lanes fit the 16 vector registers; 16 lanes spilled to the stack.
const LANES: usize = 8;
/// Elements per f32 block. Each lane sums `FBLOCK / LANES` = 16 products in float32 before
/// the block is flushed to float64, which bounds the rounding error (docs/compare.md,
/// "Accuracy of the float32 kernel"). Fixed: changing it changes the last bits of the sums.
const FBLOCK: usize = 128;
/// Below this sum of squares in a block (2⁻¹⁰⁰), float32 squares and products could have lost
/// precision to underflow, so such a block (unless its values are all zero) is redone in
/// float64. Above it the underflow error (≤ FBLOCK · 2⁻¹⁵⁰) is below 2⁻⁴³ of the sum.
const TINY: f64 = 7.888_609_052_210_118e-31; // 2^-100
/// Relative error thresholds of the thousandth counters, widened by 2⁻²⁰ on each side: a
/// float32 ratio below `LO` is certainly below the threshold in float64, one at or above `HI`
/// certainly not (its rounding is below 2⁻²²); a block with a ratio in between is recounted
/// in float64.
const LO1: f32 = 0.001 * (1.0 - 1.0 / 1048576.0);
const HI1: f32 = 0.001 * (1.0 + 1.0 / 1048576.0);
const LO5: f32 = 0.005 * (1.0 - 1.0 / 1048576.0);
const HI5: f32 = 0.005 * (1.0 + 1.0 / 1048576.0);

/// Dtypes whose every value is exactly a float32, and so can take the f32 kernel.
#[derive(Clone, Copy)]
enum F32Like {
    F32,
    F16,
    BF16,
}

impl F32Like {
    fn of(d: DType) -> Option<F32Like> {
        match d {
            DType::F32 => Some(F32Like::F32),
            DType::F16 => Some(F32Like::F16),
            DType::BF16 => Some(F32Like::BF16),
            _ => None,
        }
    }
}

/// Exact widening of one little-endian element to float32, resolved at compile time so that
/// the kernel reads the bytes straight into registers (no decode buffer).
trait Widen {
    /// Bytes per element.
    const SIZE: usize;
    /// The value of the first `SIZE` bytes.
    fn get(b: &[u8]) -> f32;
}

struct WF32;
struct WF16;
struct WBF16;

impl Widen for WF32 {
    const SIZE: usize = 4;
    #[inline(always)]
    fn get(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl Widen for WBF16 {
    const SIZE: usize = 2;
    #[inline(always)]
    fn get(b: &[u8]) -> f32 {
        // bf16 is the top half of a float32: a shift is the exact conversion.
        f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)
    }
}

impl Widen for WF16 {
    const SIZE: usize = 2;
    #[inline(always)]
    fn get(b: &[u8]) -> f32 {
        half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
    }
}

/// `max` as one compare-and-select (what `maxps` does), not `f32::max`'s NaN handling:
/// blocks with NaN are redone in float64 anyway, and this vectorises to one instruction.
#[inline(always)]
fn mx(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// The largest of the lanes, as a fixed tree (vectorises; the max is exact in any order).
#[inline(always)]
fn hmax(a: &[f32; LANES]) -> f32 {
    let mut h = *a;
    let mut w = LANES / 2;
    while w > 0 {
        for i in 0..w {
            h[i] = mx(h[i], h[i + w]);
        }
        w /= 2;
    }
    h[0]
}

/// Lane sums and extremes of one f32 block.
struct FBlock {
    dot: [f32; LANES],
    bb: [f32; LANES],
    cc: [f32; LANES],
    dd: [f32; LANES],
    sa: [f32; LANES],
    ma: [f32; LANES],
    mb: [f32; LANES],
    mr: [f32; LANES],
    /// Ratios below LO1 (low 16 bits) and below HI1 (high 16 bits): two counters in one
    /// register (a lane counts at most 16 per block).
    n1: [u32; LANES],
    /// The same for LO5 and HI5.
    n5: [u32; LANES],
}

/// One block in float32 lanes, read straight from the bytes of both sides, assuming finite,
/// not tiny data ([`chunk_f32`] checks afterwards).
///
/// The relative error is a division here (not the f64 kernel's fraction trick): in float32
/// the cross products of the trick overflow and underflow, the quotient only overflows (then
/// the block is redone), and it gives the counters their band test for free.
#[inline(always)]
fn fblock<B: Widen, C: Widen>(b: &[u8], c: &[u8], eps: f32) -> FBlock {
    // Plain local arrays (not struct fields) so that each stays in one register.
    let z = [0.0f32; LANES];
    let (mut dot, mut bb, mut cc, mut dd, mut sa) = (z, z, z, z, z);
    let (mut ma, mut mb, mut mr) = (z, z, z);
    let (mut n1, mut n5) = ([0u32; LANES], [0u32; LANES]);
    for (xs, ys) in b
        .chunks_exact(LANES * B::SIZE)
        .zip(c.chunks_exact(LANES * C::SIZE))
    {
        for i in 0..LANES {
            let x = B::get(&xs[i * B::SIZE..(i + 1) * B::SIZE]);
            let y = C::get(&ys[i * C::SIZE..(i + 1) * C::SIZE]);
            // Exact when the sides are within a factor of two (Sterbenz), so Σd² keeps its
            // meaning for nearly equal tensors while Σbc, Σb², Σc² round.
            let d = y - x;
            let ad = d.abs();
            let ax = x.abs();
            dot[i] += x * y;
            bb[i] += x * x;
            cc[i] += y * y;
            dd[i] += d * d;
            sa[i] += ad;
            ma[i] = mx(ma[i], ad);
            mb[i] = mx(mb[i], ax);
            // msprobe's relative error; where b is zero it is ((c + ε) − ε)/ε, and
            // (c + ε) − ε is c (= d here) in float64 for every float32 c that matters.
            let den = if x == 0.0 { eps } else { ax };
            let r = ad / den;
            mr[i] = mx(mr[i], r);
            n1[i] += (r < LO1) as u32 + (((r < HI1) as u32) << 16);
            n5[i] += (r < LO5) as u32 + (((r < HI5) as u32) << 16);
        }
    }
    FBlock {
        dot,
        bb,
        cc,
        dd,
        sa,
        ma,
        mb,
        mr,
        n1,
        n5,
    }
}

/// Float64 lane accumulators of the f32 kernel over one chunk, and its running extremes.
struct Acc {
    dot: [f64; LANES],
    bb: [f64; LANES],
    cc: [f64; LANES],
    dd: [f64; LANES],
    sa: [f64; LANES],
    ma: [f32; LANES],
    mb: [f32; LANES],
    mr: [f32; LANES],
}

/// The partial of one chunk whose sides both widen exactly to float32.
#[inline(always)]
fn chunk_f32(bk: F32Like, b: &[u8], ck: F32Like, c: &[u8], n: usize, eps: f64) -> Partial {
    use F32Like as K;
    match (bk, ck) {
        (K::F32, K::F32) => chunk_f32_as::<WF32, WF32>(b, c, n, eps),
        (K::F32, K::BF16) => chunk_f32_as::<WF32, WBF16>(b, c, n, eps),
        (K::BF16, K::F32) => chunk_f32_as::<WBF16, WF32>(b, c, n, eps),
        (K::BF16, K::BF16) => chunk_f32_as::<WBF16, WBF16>(b, c, n, eps),
        (K::F32, K::F16) => chunk_f32_as::<WF32, WF16>(b, c, n, eps),
        (K::F16, K::F32) => chunk_f32_as::<WF16, WF32>(b, c, n, eps),
        (K::F16, K::F16) => chunk_f32_as::<WF16, WF16>(b, c, n, eps),
        (K::F16, K::BF16) => chunk_f32_as::<WF16, WBF16>(b, c, n, eps),
        (K::BF16, K::F16) => chunk_f32_as::<WBF16, WF16>(b, c, n, eps),
    }
}

/// The f32 kernel over one chunk: blocks of [`FBLOCK`] elements in float32 lanes, flushed to
/// float64 lanes after each block. A block holding NaN/Inf, one that overflows float32, or
/// one whose values are so small that float32 products underflow, is redone by the float64
/// kernel [`block`]; a block with a relative error within float32 rounding of 0.001 or 0.005
/// has its counters recounted in float64, so the counters are exactly those of msprobe's
/// float64 definition.
#[inline(always)]
fn chunk_f32_as<B: Widen, C: Widen>(b: &[u8], c: &[u8], n: usize, eps: f64) -> Partial {
    let eps32 = eps as f32;
    let zd = [0.0f64; LANES];
    let zf = [0.0f32; LANES];
    let mut a = Acc {
        dot: zd,
        bb: zd,
        cc: zd,
        dd: zd,
        sa: zd,
        ma: zf,
        mb: zf,
        mr: zf,
    };
    // Blocks redone in float64, and the counts of all blocks.
    let mut p = Partial::default();
    let mut i = 0;
    while i < n {
        let k = FBLOCK.min(n - i);
        let (xb, xc) = (
            &b[i * B::SIZE..(i + k) * B::SIZE],
            &c[i * C::SIZE..(i + k) * C::SIZE],
        );
        i += k;
        if k < FBLOCK {
            // The tail of a tensor: too short for lanes.
            f64_block::<B, C>(xb, xc, eps, &mut p);
            continue;
        }
        let q = fblock::<B, C>(xb, xc, eps32);
        let mut bad = false;
        for l in 0..LANES {
            let t = q.dot[l] + q.bb[l] + q.cc[l] + q.dd[l] + q.sa[l] + q.mr[l];
            // NaN or Inf in any sum or quotient (including an overflow of float32) shows here.
            bad |= !t.is_finite();
        }
        let sum = |v: &[f32; LANES]| v.iter().map(|&x| x as f64).sum::<f64>();
        // A small sum of squares is fine when it is exact: all those values are zero.
        let tiny = |s: f64, v: &[u8]| s < TINY && v.iter().any(|&x| x != 0);
        if bad
            || tiny(sum(&q.bb), xb)
            || tiny(sum(&q.cc), xc)
            || (sum(&q.dd) < TINY && hmax(&q.ma) > 0.0)
        {
            f64_block::<B, C>(xb, xc, eps, &mut p);
            continue;
        }
        for l in 0..LANES {
            a.dot[l] += q.dot[l] as f64;
            a.bb[l] += q.bb[l] as f64;
            a.cc[l] += q.cc[l] as f64;
            a.dd[l] += q.dd[l] as f64;
            a.sa[l] += q.sa[l] as f64;
            a.ma[l] = mx(a.ma[l], q.ma[l]);
            a.mb[l] = mx(a.mb[l], q.mb[l]);
            a.mr[l] = mx(a.mr[l], q.mr[l]);
        }
        p.n += FBLOCK as u64;
        let count = |v: &[u32; LANES]| {
            let s = v.iter().map(|&x| x as u64).sum::<u64>();
            (s & 0xffff, s >> 16) // never carries: at most 128 per half
        };
        let ((lo1, hi1), (lo5, hi5)) = (count(&q.n1), count(&q.n5));
        if lo1 == hi1 && lo5 == hi5 {
            p.lt1 += lo1;
            p.lt5 += lo5;
        } else {
            for (x, y) in xb.chunks_exact(B::SIZE).zip(xc.chunks_exact(C::SIZE)) {
                let r = rel_err(B::get(x) as f64, C::get(y) as f64, eps);
                p.lt1 += (r < 0.001) as u64;
                p.lt5 += (r < 0.005) as u64;
            }
        }
    }
    let mut q = Partial {
        max_abs: hmax(&a.ma) as f64,
        max_abs_b: hmax(&a.mb) as f64,
        max_rel: hmax(&a.mr) as f64,
        ..Partial::default()
    };
    for l in 0..LANES {
        q.dot += a.dot[l];
        q.bb += a.bb[l];
        q.cc += a.cc[l];
        q.dd += a.dd[l];
        q.sum_abs += a.sa[l];
    }
    p.merge(&q);
    p
}

/// Widens a block to float64 and runs the float64 kernel on it. Kept out of line: it is the
/// rare path, and the float64 kernel gives the same bits in either build.
#[inline(never)]
fn f64_block<B: Widen, C: Widen>(b: &[u8], c: &[u8], eps: f64, p: &mut Partial) {
    let mut wb = [0.0f64; FBLOCK];
    let mut wc = [0.0f64; FBLOCK];
    let mut k = 0;
    for ((x, y), (ob, oc)) in b
        .chunks_exact(B::SIZE)
        .zip(c.chunks_exact(C::SIZE))
        .zip(wb.iter_mut().zip(wc.iter_mut()))
    {
        *ob = B::get(x) as f64;
        *oc = C::get(y) as f64;
        k += 1;
    }
    block(&wb[..k], &wc[..k], eps, p);
}

/// The partial of one chunk given as raw little-endian bytes of both sides.
///
/// On x86-64 CPUs with AVX2 the same code is compiled a second time for AVX2 and picked at
/// run time. Results are bit-identical either way: the lanes and the order of every
/// operation are spelled out in `block`, and Rust never contracts or reorders float math.
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
    let (b_mean, b_norm) = (b.comparable_mean(), b.comparable_norm());
    let (dmax, dmin, dmean, dnorm) = (
        diff(b.max(), c.max()),
        diff(b.min(), c.min()),
        diff(b_mean, c.comparable_mean()),
        diff(b_norm, c.comparable_norm()),
    );
    StatDiff {
        max_diff: dmax,
        min_diff: dmin,
        mean_diff: dmean,
        norm_diff: dnorm,
        max_rel_pct: pct(dmax, b.max()),
        min_rel_pct: pct(dmin, b.min()),
        mean_rel_pct: pct(dmean, b_mean),
        norm_rel_pct: pct(dnorm, b_norm),
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
        let norm = b.comparable_norm();
        let rms = norm.map(|n| n / root_n);
        let scale = [b.max().map(f64::abs), b.min().map(f64::abs), rms]
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
                norm.map(f64::abs).unwrap_or(0.0),
                atol * root_n,
            ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A norm (or mean) of inf with finite max and min is a float32 accumulator that
    /// overflowed on finite values (msprobe's norm, PyTorch's float32 reductions): it is not
    /// compared, and does not make the tensor non-finite, with or without NaN/Inf counts.
    #[test]
    fn an_overflowed_norm_is_not_a_difference() {
        use crate::dump::StatsFields;
        let stats = |max: f64, mean: f64, norm: f64, counts: Option<u64>| -> Stats {
            StatsFields {
                max: Some(max),
                min: Some(1e20),
                mean: Some(mean),
                norm: Some(norm),
                nan: counts,
                inf: counts,
            }
            .into()
        };
        let b = stats(1.2e20, 1.1e20, 8.8e20, Some(0));
        for counts in [Some(0), None] {
            let c = stats(1.2e20, f64::INFINITY, f64::INFINITY, counts);
            assert_eq!(c.nonfinite().unwrap_or(0), 0);
            let d = stat_diff(&b, &c);
            assert_eq!((d.mean_diff, d.norm_diff), (None, None));
            assert_eq!(d.scaled_err(&b, 64, 0.0), 0.0);
            let d = stat_diff(&c, &b);
            assert_eq!((d.mean_diff, d.norm_diff), (None, None));
            assert_eq!(d.scaled_err(&c, 64, 0.0), 0.0);
            // The extremes are still compared.
            let far = stats(2.4e20, f64::INFINITY, f64::INFINITY, counts);
            assert!(stat_diff(&b, &far).scaled_err(&b, 64, 0.0) > 0.4);
        }
        // An infinite element reaches max: that norm is a real infinity.
        let inf = stats(f64::INFINITY, f64::INFINITY, f64::INFINITY, None);
        assert_eq!(inf.nonfinite(), Some(1));
        assert_eq!(stat_diff(&b, &inf).norm_diff, Some(f64::INFINITY));
    }

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
