//! The float32 kernel: where both sides widen exactly to f32 (f32, f16, bf16, in any mix)
//! the sums run in f32 lanes over short blocks flushed to f64, read straight from the
//! bytes: half the bytes per value of f64 lanes, twice the lanes per register, so the pass
//! runs at memory speed. Blocks it cannot do exactly are redone by the float64 kernel, and
//! counters within rounding of a threshold are recounted, so it gives msprobe's float64
//! counts (error bound: docs/compare.md, "Accuracy of the float32 kernel").

use super::kernel_f64::{block, rel_err};
use super::Partial;
use crate::dtype::DType;

/// float32 lanes per accumulator in the f32 kernel: one AVX2 register or two SSE/NEON ones.
/// Ten accumulators of 8 lanes fit the 16 vector registers; 16 lanes spilled to the stack.
const LANES: usize = 8;
/// Elements per f32 block. Each lane sums `FBLOCK / LANES` = 16 products in float32 before
/// the block is flushed to float64, which bounds the rounding error (docs/compare.md,
/// "Accuracy of the float32 kernel"). Fixed: changing it changes the last bits of the sums.
pub(super) const FBLOCK: usize = 128;
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
pub(super) enum F32Like {
    F32,
    F16,
    BF16,
}

impl F32Like {
    pub(super) fn of(d: DType) -> Option<F32Like> {
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
pub(super) fn chunk_f32(
    bk: F32Like,
    b: &[u8],
    ck: F32Like,
    c: &[u8],
    n: usize,
    eps: f64,
) -> Partial {
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
