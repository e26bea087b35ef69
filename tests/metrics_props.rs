//! Metrics against an independent float64 reference, and their invariants.

use probe::dtype::DType;
use probe::metrics::{compare_bytes, Metrics};
use proptest::prelude::*;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn metrics_f32(b: &[f32], c: &[f32]) -> Metrics {
    compare_bytes(
        DType::F32,
        &f32_bytes(b),
        DType::F32,
        &f32_bytes(c),
        b.len(),
    )
}

/// The reference: straightforward float64 formulas, written independently of the kernel
/// (normalise first, then dot; relative errors collected into a vector, then reduced).
struct Reference {
    cosine: f64,
    max_abs: f64,
    max_rel: f64,
    mean_abs: f64,
    euclid: f64,
    rel_l2: f64,
    /// A norm below float64's ε: msprobe's cosine rule applies instead of the formula.
    tiny_norm: bool,
    lt1: f64,
    lt5: f64,
}

fn reference(b: &[f32], c: &[f32]) -> Reference {
    let b: Vec<f64> = b.iter().map(|&x| x as f64).collect();
    let c: Vec<f64> = c.iter().map(|&x| x as f64).collect();
    let nb = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nc = c.iter().map(|x| x * x).sum::<f64>().sqrt();
    let cosine = b
        .iter()
        .zip(&c)
        .map(|(x, y)| (x / nb) * (y / nc))
        .sum::<f64>();
    let diffs: Vec<f64> = b.iter().zip(&c).map(|(x, y)| (y - x).abs()).collect();
    let eps = f32::EPSILON as f64;
    let rel: Vec<f64> = b
        .iter()
        .zip(&c)
        .map(|(&x, &y)| {
            if x == 0.0 {
                ((y + eps) - eps).abs() / eps
            } else {
                (y - x).abs() / x.abs()
            }
        })
        .collect();
    let n = b.len() as f64;
    Reference {
        cosine,
        max_abs: diffs.iter().cloned().fold(0.0, f64::max),
        max_rel: rel.iter().cloned().fold(0.0, f64::max),
        mean_abs: diffs.iter().sum::<f64>() / n,
        euclid: diffs.iter().map(|d| d * d).sum::<f64>().sqrt(),
        rel_l2: diffs.iter().map(|d| d * d).sum::<f64>().sqrt() / nb,
        tiny_norm: nb < f64::EPSILON || nc < f64::EPSILON,
        lt1: rel.iter().filter(|&&r| r < 0.001).count() as f64 / n,
        lt5: rel.iter().filter(|&&r| r < 0.005).count() as f64 / n,
    }
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    a == b || (a - b).abs() <= tol * a.abs().max(b.abs()).max(1e-300)
}

/// float32's unit roundoff, 2⁻²⁴.
const U: f64 = 1.0 / 16_777_216.0;
/// γₖ = k·u / (1 − k·u): the bound on k float32 roundings in a row.
fn gamma(k: f64) -> f64 {
    k * U / (1.0 - k * U)
}
/// The stated bounds of the f32 kernel (docs/compare.md, "Accuracy of the float32 kernel"),
/// plus 1e-12 for the float64 sums of the flushed blocks and the reference's own rounding.
/// Σb², Σc², Σ|c − b| relative: γ₁₆; Σ(c − b)²: γ₁₈.
fn sum_tol() -> f64 {
    gamma(18.0) + 1e-12
}
/// Cosine, absolute: 2γ₁₆.
fn cos_tol() -> f64 {
    2.0 * gamma(16.0) + 1e-12
}

fn vec_pair(max_len: usize) -> impl Strategy<Value = (Vec<f32>, Vec<f32>)> {
    (2..max_len).prop_flat_map(|n| {
        (
            proptest::collection::vec(-1e3f32..1e3, n),
            proptest::collection::vec(-1e-2f32..1e-2, n),
            proptest::collection::vec(0u8..10, n),
        )
            .prop_map(|(b, noise, zeros)| {
                let b: Vec<f32> = b
                    .into_iter()
                    .zip(&zeros)
                    .map(|(x, z)| if *z == 0 { 0.0 } else { x })
                    .collect();
                let c = b
                    .iter()
                    .zip(&noise)
                    .map(|(x, e)| x * (1.0 + e) + e)
                    .collect();
                (b, c)
            })
    })
}

/// The kernel against the float64 reference, within the bounds stated in docs/compare.md.
fn check_bounds(m: &Metrics, r: &Reference) -> Result<(), TestCaseError> {
    if let Some(cos) = m.cosine {
        if !r.tiny_norm {
            prop_assert!(
                (cos - r.cosine).abs() <= cos_tol(),
                "cosine {} vs {}",
                cos,
                r.cosine
            );
        }
    }
    // max |c − b|: one float32 rounding of the difference (exact when the sides are within
    // a factor of two).
    prop_assert!(
        close(m.max_abs, r.max_abs, U),
        "max abs {} vs {}",
        m.max_abs,
        r.max_abs
    );
    // max relative error: two roundings (the difference, the quotient); where b = 0 msprobe's
    // (c + ε) − ε rounds c to a multiple of 2⁻⁷⁵, hence the absolute 2⁻⁵².
    prop_assert!(
        (m.max_rel - r.max_rel).abs() <= 2.0 * U * r.max_rel + f64::EPSILON,
        "max rel {} vs {}",
        m.max_rel,
        r.max_rel
    );
    prop_assert!(
        close(m.mean_abs, r.mean_abs, gamma(16.0) + 1e-12),
        "mean abs {} vs {}",
        m.mean_abs,
        r.mean_abs
    );
    // √ halves the relative error of Σ(c − b)²; the relative L2 error adds Σb²'s.
    prop_assert!(
        close(m.euclid, r.euclid, sum_tol() / 2.0),
        "euclid {} vs {}",
        m.euclid,
        r.euclid
    );
    if r.rel_l2.is_finite() {
        prop_assert!(
            close(m.rel_l2, r.rel_l2, sum_tol()),
            "rel L2 {} vs {}",
            m.rel_l2,
            r.rel_l2
        );
    }
    // The counters are exact.
    prop_assert_eq!(m.one_thousandth, r.lt1);
    prop_assert_eq!(m.five_thousandths, r.lt5);
    Ok(())
}

/// Pairs of the shapes where float32 accumulation could go wrong: a wide dynamic range,
/// values near zero (float32 squares underflow), sides a few ulps apart (1 − cosine far below
/// float32's resolution), identical sides, bf16 rounding of the other side (autocast), plus
/// zeros in the benchmark.
fn hard_pair(max_len: usize) -> impl Strategy<Value = (u8, Vec<f32>, Vec<f32>)> {
    (0u8..6, 2..max_len).prop_flat_map(|(kind, n)| {
        (
            Just(kind),
            proptest::collection::vec(-1.0f32..1.0, n),
            proptest::collection::vec(-30i32..30, n),
            proptest::collection::vec(-4i32..5, n),
            proptest::collection::vec(0u8..12, n),
        )
            .prop_map(|(kind, m, e, ulps, z)| {
                let b: Vec<f32> = m
                    .iter()
                    .zip(&e)
                    .zip(&z)
                    .map(|((&m, &e), &z)| match (kind, z) {
                        (_, 0) => 0.0,
                        (0, _) => m * 10f32.powi(e), // 1e-30 .. 1e30
                        (1, _) => m * 10f32.powi(e / 3 - 15), // 1e-25 .. 1e-5
                        _ => m * 10f32.powi(e / 10), // 1e-3 .. 1e2
                    })
                    .collect();
                let c = b
                    .iter()
                    .zip(&ulps)
                    .zip(&m)
                    .map(|((&x, &u), &m)| match kind {
                        2 => f32::from_bits((x.to_bits() as i32).wrapping_add(u) as u32),
                        3 => x,
                        4 => half::bf16::from_f32(x).to_f32(),
                        _ => x * (1.0 + m * 1e-3) + u as f32 * 1e-7,
                    })
                    .collect();
                (kind, b, c)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn f32_kernel_is_within_its_stated_bound((kind, b, c) in hard_pair(3000)) {
        prop_assume!(b.iter().all(|x| x.is_finite()) && c.iter().all(|x| x.is_finite()));
        // bf16 on the comparison side (the values are exact in bf16 for kind 4).
        let cd = if kind == 4 { DType::BF16 } else { DType::F32 };
        let cb: Vec<u8> = match cd {
            DType::BF16 => c.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect(),
            _ => f32_bytes(&c),
        };
        let m = compare_bytes(DType::F32, &f32_bytes(&b), cd, &cb, b.len());
        let r = reference(&b, &c);
        prop_assert_eq!(m.nonfinite_mismatch, 0);
        check_bounds(&m, &r)?;
        if kind == 3 {
            prop_assert_eq!(m.euclid, 0.0);
        }
    }

    #[test]
    fn metrics_match_the_float64_reference((b, c) in vec_pair(3000)) {
        prop_assume!(b.iter().any(|&x| x != 0.0) && c.iter().any(|&x| x != 0.0));
        let m = metrics_f32(&b, &c);
        let r = reference(&b, &c);
        check_bounds(&m, &r)?;
        prop_assert_eq!(m.one_thousandth, r.lt1);
        prop_assert_eq!(m.five_thousandths, r.lt5);
        prop_assert_eq!(m.nonfinite_mismatch, 0);
    }

    #[test]
    fn identical_tensors_have_cosine_one_and_zero_error((b, _c) in vec_pair(2000)) {
        prop_assume!(b.iter().any(|&x| x != 0.0));
        let m = metrics_f32(&b, &b);
        prop_assert_eq!(m.cosine, Some(1.0));
        prop_assert_eq!(m.rel_l2, 0.0);
        prop_assert_eq!(m.max_abs, 0.0);
        prop_assert_eq!(m.one_thousandth, 1.0);
    }

    #[test]
    fn cosine_ignores_positive_scaling((b, c) in vec_pair(2000), k in 0.01f32..100.0) {
        let m1 = metrics_f32(&b, &c);
        let scaled: Vec<f32> = c.iter().map(|x| x * k).collect();
        let m2 = metrics_f32(&b, &scaled);
        // Each cosine is within 2γ₁₆ of the exact one.
        prop_assert!((m1.cosine.unwrap() - m2.cosine.unwrap()).abs() <= 2.0 * cos_tol());
    }

    #[test]
    fn relative_l2_of_a_uniform_scale_is_the_scale(b in proptest::collection::vec(-10f32..10.0, 2..500), k in 1e-4f64..1e-1) {
        prop_assume!(b.iter().any(|&x| x != 0.0));
        let bd: Vec<f64> = b.iter().map(|&x| x as f64).collect();
        let cd: Vec<f64> = bd.iter().map(|x| x * (1.0 + k)).collect();
        let bytes = |v: &[f64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let m = compare_bytes(DType::F64, &bytes(&bd), DType::F64, &bytes(&cd), bd.len());
        prop_assert!(close(m.rel_l2, k, 1e-9), "{} vs {}", m.rel_l2, k);
    }
}

#[test]
fn thread_count_does_not_change_a_bit() {
    let n = 1_000_003;
    let b: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 * 0.013 - 6.0)
        .collect();
    let c: Vec<f32> = b
        .iter()
        .enumerate()
        .map(|(i, x)| x + (i % 13) as f32 * 1e-4)
        .collect();
    let (bb, cb) = (f32_bytes(&b), f32_bytes(&c));
    let run = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| compare_bytes(DType::F32, &bb, DType::F32, &cb, n))
    };
    let (m1, m2, m5) = (run(1), run(2), run(5));
    assert_eq!(format!("{m1:?}"), format!("{m2:?}"));
    assert_eq!(format!("{m1:?}"), format!("{m5:?}"));
}

#[test]
fn nan_inf_policy() {
    // Same non-finite values at the same positions: zeroed, the rest is compared.
    let b = [1.0, f32::NAN, 3.0, f32::INFINITY];
    let c = [1.0, f32::NAN, 3.0, f32::INFINITY];
    let m = metrics_f32(&b, &c);
    assert_eq!(m.nonfinite_mismatch, 0);
    assert_eq!(m.nonfinite_b, 2);
    assert_eq!(m.cosine, Some(1.0));
    assert_eq!(m.max_abs, 0.0);
    assert_eq!(m.one_thousandth, 1.0);
    // NaN where the benchmark is finite, or +inf against -inf: metrics are NaN, flagged.
    for c in [
        [1.0, 2.0, f32::NAN, 4.0],
        [1.0, 2.0, 3.0, f32::NEG_INFINITY],
    ] {
        let b = [1.0, 2.0, 3.0, f32::INFINITY];
        let m = metrics_f32(&b, &c);
        assert!(m.nonfinite_mismatch > 0);
        assert!(m.cosine.unwrap().is_nan());
        assert!(m.max_abs.is_nan());
        assert!(!m.nan_inf_agree());
    }
}

#[test]
fn zero_norm_and_single_element_rules() {
    let m = metrics_f32(&[0.0, 0.0], &[0.0, 0.0]);
    assert_eq!(m.cosine, Some(1.0));
    let m = metrics_f32(&[0.0, 0.0], &[1.0, 0.0]);
    assert!(m.cosine.unwrap().is_nan());
    assert_eq!(m.rel_l2, f64::INFINITY);
    let m = metrics_f32(&[2.0], &[2.5]);
    assert_eq!(m.cosine, None, "a single element has no cosine");
    assert_eq!(m.max_abs, 0.5);
}

#[test]
fn mixed_dtypes_compare_in_float64() {
    let b = [1.0f32, -2.0, 3.5, 0.15625];
    let c16: Vec<u8> = b
        .iter()
        .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
        .collect();
    let m = compare_bytes(DType::F32, &f32_bytes(&b), DType::BF16, &c16, 4);
    assert_eq!(m.max_abs, 0.0, "these values are exact in bf16");
    let c: Vec<u8> = [1.0f64, -2.0, 3.5, 0.15625 + 1e-9]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let m = compare_bytes(DType::F32, &f32_bytes(&b), DType::F64, &c, 4);
    assert!(close(m.max_abs, 1e-9, 1e-6), "{}", m.max_abs);
}
