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
        lt1: rel.iter().filter(|&&r| r < 0.001).count() as f64 / n,
        lt5: rel.iter().filter(|&&r| r < 0.005).count() as f64 / n,
    }
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    a == b || (a - b).abs() <= tol * a.abs().max(b.abs()).max(1e-300)
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn metrics_match_the_float64_reference((b, c) in vec_pair(3000)) {
        prop_assume!(b.iter().any(|&x| x != 0.0) && c.iter().any(|&x| x != 0.0));
        let m = metrics_f32(&b, &c);
        let r = reference(&b, &c);
        prop_assert!(close(m.cosine.unwrap(), r.cosine, 1e-12), "cos {:?} {}", m.cosine, r.cosine);
        prop_assert!(close(m.max_abs, r.max_abs, 1e-15));
        prop_assert!(close(m.max_rel, r.max_rel, 1e-12));
        prop_assert!(close(m.mean_abs, r.mean_abs, 1e-12));
        prop_assert!(close(m.euclid, r.euclid, 1e-12));
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
        prop_assert!(close(m1.cosine.unwrap(), m2.cosine.unwrap(), 1e-6));
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
