//! Settings of the process's memory, made once when the command starts.

/// Turns transparent huge pages off for this process (Linux; elsewhere nothing to do).
///
/// Why: mimalloc asks the kernel for huge pages on its arenas (`MADV_HUGEPAGE`, which the
/// common `madvise` setting grants; the `always` setting gives them unasked), and a compare
/// fills fresh heap with every record and row it holds, so each first touch faulted in and
/// zeroed a whole 2 MiB page. On the 1,000,000-tensor statistics pair that was 3.3–3.6 s of
/// system time in ~10.5 s of CPU (`clear_page_erms` under `do_huge_pmd_anonymous_page`, a
/// third of a `perf` profile); with small pages 1.3–1.4 s, the same outputs and about the
/// same peak memory (docs/performance.md). A kernel or sandbox that refuses the call leaves
/// things as they were: it changes speed, never a result.
pub fn small_pages_only() {
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}
