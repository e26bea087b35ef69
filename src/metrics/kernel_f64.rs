//! The float64 kernel: sums and extremes of decoded element pairs in f64 lanes, msprobe's
//! relative error and NaN/Inf rule. Every dtype that is not exactly a float32 goes through
//! it, and the float32 kernel redoes its rare blocks (NaN/Inf, tiny, huge) with it.

use super::Partial;

/// Relative error of one element pair, msprobe's way: where `b` is zero both sides get `eps`.
#[inline(always)]
pub(super) fn rel_err(b: f64, c: f64, eps: f64) -> f64 {
    let z = b == 0.0;
    let bb = if z { eps } else { b };
    let cc = if z { c + eps } else { c };
    (cc - bb).abs() / bb.abs()
}

/// Accumulates one block of decoded values. The fast path assumes finite data and checks
/// afterwards; a block holding NaN/Inf is redone element by element.
#[inline(always)]
pub(super) fn block(b: &[f64], c: &[f64], eps: f64, p: &mut Partial) {
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
pub(super) fn element(x: f64, y: f64, eps: f64, q: &mut Partial) {
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
