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

/// Where a compare's memory goes: with `PROBE_TRACE_MEMORY` set, prints the resident and
/// peak resident memory after each stage (`stage`) on stderr, one line each. A diagnostic
/// for benchmarks and bug reports (docs/performance.md); without the variable, nothing.
pub(crate) fn trace(stage: &str) {
    if std::env::var_os("PROBE_TRACE_MEMORY").is_none() {
        return;
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mb = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .map_or_else(|| "?".to_string(), |kb| (kb / 1024).to_string())
    };
    eprintln!(
        "probe: memory after {stage}: {} MB resident, peak {} MB",
        mb("VmRSS:"),
        mb("VmHWM:")
    );
}
