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
//!
//! A view whose elements do not cover one span of memory (a slice of channels, a chunk of a
//! fused projection) is read in place by the `_strided` entry points: the caller gives its
//! dimensions in memory order (by decreasing stride), and the elements are gathered in that
//! order into a small buffer, a whole number of blocks at a time, and read as above. Every
//! element meets the same lane, and every addition comes in the same order, as in a
//! contiguous copy of the view in that order: the same bits as the agent's copy-then-read,
//! without the copy's tensor and PyTorch's copy kernel (a 16K-element slice of a
//! convolution's channels: 10 us, against 16 us copied and read, and 3 us for the same
//! elements contiguous) and at any size.

/// The interface version the agent checks before it calls anything.
pub(crate) const ABI: u32 = 2;

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

/// Adds the values of `x` that `load` widens to float32 to the lanes `l`, which hold a whole
/// number of blocks so far: `x` then meets the lanes as it would at that position of one
/// long slice.
#[inline(always)]
fn add_lanes<T: Copy>(l: &mut Lanes, x: &[T], load: impl Fn(T) -> f32) {
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
    let mut l = Lanes::EMPTY;
    add_f32(&mut l, x);
    l
}

fn lanes_bf16(x: &[u16]) -> Lanes {
    let mut l = Lanes::EMPTY;
    add_bf16(&mut l, x);
    l
}

fn add_f32(l: &mut Lanes, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { add_f32_avx2(l, x) };
    }
    add_lanes(l, x, |v| v)
}

fn add_bf16(l: &mut Lanes, x: &[u16]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { add_bf16_avx2(l, x) };
    }
    add_lanes(l, x, bf16_to_f32)
}

// The same code compiled for 8-wide vectors: the lanes and the order of every addition are
// the ones above, so both give the same bits (Rust never fuses a multiply and an add).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn add_f32_avx2(l: &mut Lanes, x: &[f32]) {
    add_lanes(l, x, |v| v)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn add_bf16_avx2(l: &mut Lanes, x: &[u16]) {
    add_lanes(l, x, bf16_to_f32)
}

/// Elements gathered before they are read: a whole number of blocks, so that each batch
/// meets the lanes as the same elements of one contiguous copy would.
const GATHER: usize = 16 * LANES * BLOCK;

/// The lanes of a strided view: `sizes` and `strides` (in elements) outermost first, the
/// order its elements are read in; `base` its first element. `add` reads each gathered
/// batch. None when a size or stride is negative (never a valid view).
///
/// # Safety
/// Every element the view addresses (`base` + Σ index·stride) must be readable.
unsafe fn strided_lanes<T: Copy + Default>(
    base: *const T,
    sizes: &[i64],
    strides: &[i64],
    add: fn(&mut Lanes, &[T]),
) -> Option<Lanes> {
    let dims: Vec<(usize, isize)> = sizes
        .iter()
        .zip(strides)
        .map(|(&n, &s)| Some((usize::try_from(n).ok()?, isize::try_from(s).ok()?)))
        .collect::<Option<_>>()?;
    if dims.iter().any(|&(_, s)| s < 0) {
        return None;
    }
    let mut l = Lanes::EMPTY;
    if dims.iter().any(|&(n, _)| n == 0) {
        return Some(l); // no elements: empty lanes, which `finish` refuses
    }
    // A dimension whose step is the whole of the next one's extent continues it: merged,
    // the runs are longer (the same elements in the same order).
    let dims = dims.into_iter().filter(|&(n, _)| n != 1).fold(
        Vec::new(),
        |mut merged: Vec<(usize, isize)>, (n, s)| {
            match merged.last_mut() {
                Some(last) if last.1 == s * n as isize => *last = (last.0 * n, s),
                _ => merged.push((n, s)),
            }
            merged
        },
    );
    // The innermost dimension is read as a run (one element for a single value); the
    // others are counted by `index`.
    let (&(run, step), outer) = dims.split_last().unwrap_or((&(1, 1), &[]));
    if outer.is_empty() && step == 1 {
        // Dense memory (contiguous, or a transposed or permuted view of it): one run, read
        // in place as the contiguous kernel reads it, with no gathering.
        // SAFETY: the caller vouches for every element of the view.
        add(&mut l, unsafe { std::slice::from_raw_parts(base, run) });
        return Some(l);
    }
    let mut index = vec![0usize; outer.len()];
    let mut buf = [T::default(); GATHER];
    let mut filled = 0;
    let mut at: isize = 0; // offset of the current run's first element
    loop {
        let mut done = 0;
        while done < run {
            let take = (run - done).min(GATHER - filled);
            let first = at + done as isize * step;
            let dst = &mut buf[filled..filled + take];
            if step == 1 {
                // SAFETY: the caller vouches for every element of the view.
                let src = unsafe { std::slice::from_raw_parts(base.offset(first), take) };
                dst.copy_from_slice(src);
            } else {
                for (j, d) in dst.iter_mut().enumerate() {
                    // SAFETY: as above.
                    *d = unsafe { *base.offset(first + j as isize * step) };
                }
            }
            filled += take;
            done += take;
            if filled == GATHER {
                add(&mut l, &buf);
                filled = 0;
            }
        }
        // The next run: the odometer over the outer dimensions, innermost first.
        let mut k = outer.len();
        loop {
            if k == 0 {
                add(&mut l, &buf[..filled]);
                return Some(l);
            }
            k -= 1;
            index[k] += 1;
            at += outer[k].1;
            if index[k] < outer[k].0 {
                break;
            }
            at -= outer[k].1 * index[k] as isize;
            index[k] = 0;
        }
    }
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

/// Writes `[max, min, sum, norm]` of the view at `x` (`ndim` sizes and strides, in
/// elements, in the order to read it) to `out`; 1 when done, 0 when not handled (as
/// [`export`], or a negative size or stride).
unsafe fn export_strided<T: Copy + Default>(
    x: *const T,
    ndim: usize,
    sizes: *const i64,
    strides: *const i64,
    out: *mut f64,
    add: fn(&mut Lanes, &[T]),
) -> i32 {
    if x.is_null() || out.is_null() || x.align_offset(align_of::<T>()) != 0 {
        return 0;
    }
    if ndim > 0 && (sizes.is_null() || strides.is_null()) {
        return 0;
    }
    let (sizes, strides) = if ndim == 0 {
        (&[][..], &[][..])
    } else {
        // SAFETY: the caller passes `ndim` sizes and `ndim` strides.
        unsafe {
            (
                std::slice::from_raw_parts(sizes, ndim),
                std::slice::from_raw_parts(strides, ndim),
            )
        }
    };
    // SAFETY: the caller passes a live view of its tensor, which it holds for the call.
    let lanes = unsafe { strided_lanes(x, sizes, strides, add) };
    match lanes.and_then(|l| l.finish()) {
        Some(v) => {
            // SAFETY: the caller passes room for four float64 values.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out, 4) };
            1
        }
        None => 0,
    }
}

/// `[max, min, sum, norm]` of a strided float32 view (see [`export_strided`]); the same
/// bits as [`probe_stats_f32`] on a copy of the view read in the given order.
///
/// # Safety
/// `x` must be the view's first element, `sizes` and `strides` hold `ndim` values each,
/// every element they address be readable, and `out` have room for four float64.
#[no_mangle]
pub(crate) unsafe extern "C" fn probe_stats_f32_strided(
    x: *const f32,
    ndim: usize,
    sizes: *const i64,
    strides: *const i64,
    out: *mut f64,
) -> i32 {
    // SAFETY: as this function's contract.
    unsafe { export_strided(x, ndim, sizes, strides, out, add_f32) }
}

/// As [`probe_stats_f32_strided`] for bfloat16 values (their 16-bit patterns).
///
/// # Safety
/// As [`probe_stats_f32_strided`].
#[no_mangle]
pub(crate) unsafe extern "C" fn probe_stats_bf16_strided(
    x: *const u16,
    ndim: usize,
    sizes: *const i64,
    strides: *const i64,
    out: *mut f64,
) -> i32 {
    // SAFETY: as this function's contract.
    unsafe { export_strided(x, ndim, sizes, strides, out, add_bf16) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lanes of `x` read without the vector code path.
    fn lanes<T: Copy>(x: &[T], load: impl Fn(T) -> f32) -> Lanes {
        let mut l = Lanes::EMPTY;
        add_lanes(&mut l, x, load);
        l
    }

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

    /// A strided view's statistics, read in place, and a copy of its elements in the
    /// same order, read contiguously.
    fn strided_and_copied(x: &[f32], offset: usize, sizes: &[i64], strides: &[i64]) -> [i32; 2] {
        let mut copy = Vec::new();
        let mut index = vec![0i64; sizes.len()];
        'all: loop {
            let at: i64 = index.iter().zip(strides).map(|(i, s)| i * s).sum();
            copy.push(x[offset + at as usize]);
            let mut k = sizes.len();
            loop {
                if k == 0 {
                    break 'all;
                }
                k -= 1;
                index[k] += 1;
                if index[k] < sizes[k] {
                    break;
                }
                index[k] = 0;
            }
        }
        let (mut a, mut b) = ([0f64; 4], [0f64; 4]);
        // SAFETY: every index the view addresses lies inside `x`.
        let done = unsafe {
            probe_stats_f32_strided(
                x[offset..].as_ptr(),
                sizes.len(),
                sizes.as_ptr(),
                strides.as_ptr(),
                a.as_mut_ptr(),
            )
        };
        // SAFETY: a live vector and its length.
        let want = unsafe { probe_stats_f32(copy.as_ptr(), copy.len(), b.as_mut_ptr()) };
        assert_eq!(a, b, "sizes {sizes:?} strides {strides:?}");
        [done, want]
    }

    #[test]
    fn a_strided_view_gives_the_bits_of_its_copy() {
        let x = values(300_000, 11);
        // A slice of channels of a channels-last activation (runs of 64 of 192).
        assert_eq!(
            strided_and_copied(&x, 64, &[8, 32, 16, 64], &[32_768, 1024, 192, 1]),
            [1, 1]
        );
        // The same with runs longer than a gather batch, and a transposed inner step.
        assert_eq!(strided_and_copied(&x, 5, &[3, 9000], &[90_000, 1]), [1, 1]);
        assert_eq!(strided_and_copied(&x, 0, &[700, 300], &[1, 701]), [1, 1]);
        // Dense memory in one run (a permuted view, its dimensions by decreasing stride):
        // read in place, without gathering.
        assert_eq!(
            strided_and_copied(&x, 3, &[19, 100, 150], &[15_000, 150, 1]),
            [1, 1]
        );
        // Expanded (stride 0) and one-element dimensions, and a 0-d view.
        assert_eq!(strided_and_copied(&x, 7, &[5, 1, 4000], &[0, 9, 2]), [1, 1]);
        assert_eq!(strided_and_copied(&x, 9, &[], &[]), [1, 1]);
        let b: Vec<u16> = x.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        let (mut got, mut want) = ([0f64; 4], [0f64; 4]);
        let every_other: Vec<u16> = b.iter().step_by(2).copied().take(5000).collect();
        // SAFETY: 5000 elements two apart lie inside `b`; a live vector and its length.
        unsafe {
            assert_eq!(
                probe_stats_bf16_strided(
                    b.as_ptr(),
                    1,
                    [5000].as_ptr(),
                    [2].as_ptr(),
                    got.as_mut_ptr()
                ),
                1
            );
            assert_eq!(
                probe_stats_bf16(every_other.as_ptr(), 5000, want.as_mut_ptr()),
                1
            );
        }
        assert_eq!(got, want);
    }

    #[test]
    fn a_strided_view_refuses_what_the_contiguous_read_refuses() {
        let mut x = values(4000, 2);
        x[2002] = f32::NAN;
        let mut out = [0f64; 4];
        // SAFETY: 2000 elements two apart lie inside `x`.
        let read = |x: &[f32], n: i64, s: i64, out: &mut [f64; 4]| unsafe {
            probe_stats_f32_strided(x.as_ptr(), 1, [n].as_ptr(), [s].as_ptr(), out.as_mut_ptr())
        };
        assert_eq!(
            read(&x, 2000, 2, &mut out),
            0,
            "NaN at an element of the view"
        );
        assert_eq!(
            read(&x[1..], 1999, 2, &mut out),
            1,
            "NaN between the view's elements"
        );
        assert_eq!(read(&x, 0, 2, &mut out), 0, "no elements");
        assert_eq!(read(&x, 10, -1, &mut out), 0, "a negative stride");
        // SAFETY: null pointers are refused before any read.
        assert_eq!(
            unsafe {
                probe_stats_f32_strided(
                    x.as_ptr(),
                    1,
                    std::ptr::null(),
                    std::ptr::null(),
                    out.as_mut_ptr(),
                )
            },
            0
        );
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
