//! One-pass statistics of a CPU tensor, for the capture agent (`python/probe/capture/native.py`).
//!
//! Why here: the agent's statistics of a CPU tensor were three PyTorch reductions (`aminmax`,
//! `sum`, a norm), three reads of the tensor and seven dispatcher calls, ~10 us for a small
//! tensor and ~260 us for a 1M-element one on two threads: all of the statistics-mode
//! overhead of a CPU transformer step (docs/capture.md, "sixth pass"). This reads the tensor
//! once, at memory speed, for ~2 us of call overhead.
//!
//! How it reaches the agent: maturin ships one program (`bindings = "bin"`) and no extension
//! module, so `build.rs` compiles this same file a second time as a C-ABI shared library
//! (no dependencies, ~1 s), the `probe` binary embeds it, `probe agent-kernel` writes it to a
//! cache folder, and the agent loads it with `ctypes`. Without it (another OS, a failed
//! build, `PROBE_NATIVE_STATS=0`) the agent keeps the PyTorch reductions.
//!
//! Numbers: elements are read in memory order into 16 float32 lanes; max and min are exact;
//! each lane sums 16 elements (and 16 squares) in float32 before adding them to its float64
//! total, so the sum and the sum of squares carry a relative error of at most ~1e-6 of
//! Σ|x| (and Σx²) whatever the size, typically ~1e-7, against PyTorch's float32 norm that
//! drifts to 1e-4 at 4M elements. The lanes are combined in a fixed order: the same bytes
//! give the same bits on every run (the vector width the compiler picks does not change
//! which element goes to which lane). One thread: more would compete with PyTorch's own
//! (their OpenMP workers spin between parallel regions), measured slower on two cores. A tensor holding NaN or Inf, or
//! whose sum or sum of squares overflows, is reported as not handled: the agent then takes
//! PyTorch's reductions, which give NaN/Inf the meaning the dump format defines, and the
//! counts.

/// The interface version the agent checks before it calls anything.
pub(crate) const ABI: u32 = 1;

const LANES: usize = 16;
/// Elements a lane adds in float32 before flushing to its float64 total.
const BLOCK: usize = 16;

/// Per-lane extremes and float64 totals.
struct Lanes {
    mx: [f32; LANES],
    mn: [f32; LANES],
    s: [f64; LANES],
    q: [f64; LANES],
}

impl Lanes {
    const EMPTY: Lanes = Lanes {
        mx: [f32::NEG_INFINITY; LANES],
        mn: [f32::INFINITY; LANES],
        s: [0.0; LANES],
        q: [0.0; LANES],
    };

    /// Max, min, sum and norm; None when any is not finite. NaN never wins a comparison,
    /// so it shows in the sum; an Inf makes the sum non-finite too.
    fn finish(&self) -> Option<[f64; 4]> {
        let (mut max, mut min, mut sum, mut sq) = (f32::NEG_INFINITY, f32::INFINITY, 0f64, 0f64);
        for k in 0..LANES {
            max = if self.mx[k] > max { self.mx[k] } else { max };
            min = if self.mn[k] < min { self.mn[k] } else { min };
            sum += self.s[k];
            sq += self.q[k];
        }
        let out = [f64::from(max), f64::from(min), sum, sq.sqrt()];
        out.iter().all(|v| v.is_finite()).then_some(out)
    }
}

/// The lanes of the values that `load` widens to float32.
#[inline(always)]
fn lanes<T: Copy>(x: &[T], load: impl Fn(T) -> f32) -> Lanes {
    let mut l = Lanes::EMPTY;
    for block in x.chunks(LANES * BLOCK) {
        let mut fs = [0f32; LANES];
        let mut fq = [0f32; LANES];
        let mut rows = block.chunks_exact(LANES);
        for row in &mut rows {
            for k in 0..LANES {
                let v = load(row[k]);
                l.mx[k] = if v > l.mx[k] { v } else { l.mx[k] };
                l.mn[k] = if v < l.mn[k] { v } else { l.mn[k] };
                fs[k] += v;
                fq[k] += v * v;
            }
        }
        for (k, &e) in rows.remainder().iter().enumerate() {
            let v = load(e);
            l.mx[k] = if v > l.mx[k] { v } else { l.mx[k] };
            l.mn[k] = if v < l.mn[k] { v } else { l.mn[k] };
            fs[k] += v;
            fq[k] += v * v;
        }
        for k in 0..LANES {
            l.s[k] += f64::from(fs[k]);
            l.q[k] += f64::from(fq[k]);
        }
    }
    l
}

#[inline(always)]
fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// The statistics of float32 values (see the module doc), or None when empty or not all
/// finite.
pub(crate) fn stats_f32(x: &[f32]) -> Option<[f64; 4]> {
    stats(x, lanes_f32)
}

/// The statistics of bfloat16 values (their bits), widened to float32 exactly.
pub(crate) fn stats_bf16(x: &[u16]) -> Option<[f64; 4]> {
    stats(x, lanes_bf16)
}

fn stats<T>(x: &[T], read: fn(&[T]) -> Lanes) -> Option<[f64; 4]> {
    if x.is_empty() {
        return None;
    }
    read(x).finish()
}

fn lanes_f32(x: &[f32]) -> Lanes {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { lanes_f32_avx2(x) };
    }
    lanes(x, |v| v)
}

fn lanes_bf16(x: &[u16]) -> Lanes {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { lanes_bf16_avx2(x) };
    }
    lanes(x, bf16_to_f32)
}

// The same code compiled for 8-wide vectors: the lanes and the order of every addition are
// the ones above, so both give the same bits (Rust never fuses a multiply and an add).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn lanes_f32_avx2(x: &[f32]) -> Lanes {
    lanes(x, |v| v)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn lanes_bf16_avx2(x: &[u16]) -> Lanes {
    lanes(x, bf16_to_f32)
}

/// Writes `[max, min, sum, norm]` of `n` values at `x` to `out`; 1 when done, 0 when not
/// handled (NaN/Inf, overflow, none, or a pointer not aligned for its type).
fn export<T>(x: *const T, n: usize, out: *mut f64, f: fn(&[T]) -> Option<[f64; 4]>) -> i32 {
    if x.is_null() || out.is_null() || n == 0 || x.align_offset(align_of::<T>()) != 0 {
        return 0;
    }
    // SAFETY: the caller (the agent) passes the data pointer and element count of a live,
    // contiguous CPU tensor of this element type, which it holds for the call.
    let data = unsafe { std::slice::from_raw_parts(x, n) };
    match f(data) {
        Some(v) => {
            // SAFETY: the caller passes room for four float64 values.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out, 4) };
            1
        }
        None => 0,
    }
}

/// The interface version ([`ABI`]).
#[no_mangle]
pub(crate) extern "C" fn probe_stats_abi() -> u32 {
    ABI
}

/// `[max, min, sum, norm]` of `n` float32 values at `x` into `out`; 1 done, 0 not handled.
///
/// # Safety
/// `x` must point to `n` readable float32 values and `out` to room for four float64.
#[no_mangle]
pub(crate) unsafe extern "C" fn probe_stats_f32(x: *const f32, n: usize, out: *mut f64) -> i32 {
    export(x, n, out, stats_f32)
}

/// As [`probe_stats_f32`] for bfloat16 values (`n` of them, as their 16-bit patterns).
///
/// # Safety
/// `x` must point to `n` readable bfloat16 values and `out` to room for four float64.
#[no_mangle]
pub(crate) unsafe extern "C" fn probe_stats_bf16(x: *const u16, n: usize, out: *mut f64) -> i32 {
    export(x, n, out, stats_bf16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The float64 reference: exact max/min, sums in float64 of the exact values.
    fn reference(x: &[f32]) -> [f64; 4] {
        let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let min = x.iter().fold(f32::INFINITY, |m, &v| m.min(v));
        let sum: f64 = x.iter().map(|&v| f64::from(v)).sum();
        let sq: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        [f64::from(max), f64::from(min), sum, sq.sqrt()]
    }

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.3) * 8.0
            })
            .collect()
    }

    #[test]
    fn matches_the_float64_reference_at_every_size() {
        for n in [1, 2, 15, 16, 17, 255, 256, 257, 4099, 65_536, 1_000_003] {
            let x = values(n, n as u64);
            let got = stats_f32(&x).unwrap();
            let want = reference(&x);
            assert_eq!(got[0], want[0], "max, n={n}");
            assert_eq!(got[1], want[1], "min, n={n}");
            let abs: f64 = x.iter().map(|&v| f64::from(v.abs())).sum();
            assert!(
                (got[2] - want[2]).abs() <= 1e-6 * abs,
                "sum, n={n}: {got:?} {want:?}"
            );
            assert!((got[3] - want[3]).abs() <= 1e-6 * want[3], "norm, n={n}");
        }
    }

    #[test]
    fn the_vector_path_and_the_plain_path_give_the_same_bits() {
        let x = values(100_001, 3);
        assert_eq!(stats_f32(&x), lanes(&x, |v| v).finish());
        let b: Vec<u16> = x.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        assert_eq!(stats_bf16(&b), lanes(&b, bf16_to_f32).finish());
    }

    #[test]
    fn bfloat16_is_widened_exactly() {
        let b: Vec<u16> = [1.0f32, -2.5, 3.0, 0.5]
            .iter()
            .map(|v| (v.to_bits() >> 16) as u16)
            .collect();
        assert_eq!(
            stats_bf16(&b),
            Some([3.0, -2.5, 2.0, (1.0f64 + 6.25 + 9.0 + 0.25).sqrt()])
        );
    }

    #[test]
    fn non_finite_values_and_overflow_are_not_handled() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x = values(1000, 9);
            x[517] = bad;
            assert_eq!(stats_f32(&x), None, "{bad}");
        }
        // Finite values whose float32 block sum overflows.
        assert_eq!(stats_f32(&[3e38, 3e38, 1.0]), None);
        assert_eq!(stats_f32(&[]), None);
    }

    #[test]
    fn the_c_entry_points_refuse_null_and_misaligned_pointers() {
        let x = values(64, 1);
        let mut out = [0f64; 4];
        // SAFETY: valid pointers and length.
        assert_eq!(
            unsafe { probe_stats_f32(x.as_ptr(), x.len(), out.as_mut_ptr()) },
            1
        );
        assert_eq!(out, stats_f32(&x).unwrap());
        // SAFETY: null pointers are refused before any read.
        assert_eq!(
            unsafe { probe_stats_f32(std::ptr::null(), 4, out.as_mut_ptr()) },
            0
        );
        let bytes = [0u8; 64];
        let odd = bytes[1..].as_ptr().cast::<f32>();
        // SAFETY: a misaligned pointer is refused before any read.
        assert_eq!(unsafe { probe_stats_f32(odd, 4, out.as_mut_ptr()) }, 0);
        assert_eq!(probe_stats_abi(), ABI);
    }
}
