//! Progress bars on stderr for the long operations (reading dumps, measuring tensors,
//! writing reports, hashing weights).
//!
//! The command layer decides once whether bars are shown ([`Progress::new`]: only when
//! stderr is a terminal and `-q` was not given) and hands a [`Progress`] down by reference;
//! the library stages only say what they are doing (`Progress::stage`, `Stage::inc`).
//! A hidden `Progress` does nothing at all, so a run whose stderr is a file or a pipe (CI,
//! tests) writes exactly what it wrote before, and the stages stay deterministic. Bars are
//! cleared when their stage ends: what stays on the terminal is the summary.

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// What a stage counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Count {
    /// Things (units, tensors, files, reports).
    Items,
    /// Bytes (shown as KiB, MiB, ...).
    Bytes,
}

/// Where progress goes: bars on stderr, or nowhere.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    bars: Option<MultiProgress>,
}

impl Progress {
    /// Whether this one shows bars.
    #[cfg(test)]
    pub(crate) fn is_visible(&self) -> bool {
        self.bars.is_some()
    }

    /// Bars on stderr when `visible` is true (`Progress::visible` says when), else hidden.
    pub fn new(visible: bool) -> Progress {
        Progress {
            bars: visible.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr())),
        }
    }

    /// For a command: bars unless `quiet` or stderr is not a terminal.
    pub fn for_stderr(quiet: bool) -> Progress {
        Progress::new(Progress::visible(quiet, std::io::stderr().is_terminal()))
    }

    /// No bars: what library callers and tests pass.
    pub fn hidden() -> Progress {
        Progress { bars: None }
    }

    /// Whether bars are shown: only on a terminal, and never with `-q`.
    pub(crate) fn visible(quiet: bool, stderr_is_terminal: bool) -> bool {
        !quiet && stderr_is_terminal
    }

    /// A stage of `total` steps named `name`; its bar goes away when the stage is dropped.
    pub(crate) fn stage(&self, name: &str, total: u64, count: Count) -> Stage {
        let Some(multi) = &self.bars else {
            return Stage { bar: None };
        };
        let template = match count {
            Count::Items => "{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})",
            Count::Bytes => {
                "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {msg} ({elapsed})"
            }
        };
        let style = ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        let bar = multi.add(ProgressBar::new(total).with_style(style));
        bar.set_prefix(format!("probe: {name}"));
        Stage { bar: Some(bar) }
    }
}

/// One operation in progress. Cheap to update from many threads (`Sync`); every method
/// does nothing when progress is hidden.
#[derive(Debug)]
pub struct Stage {
    bar: Option<ProgressBar>,
}

impl Stage {
    /// Whether this one shows bars.
    #[cfg(test)]
    pub(crate) fn is_visible(&self) -> bool {
        self.bar.is_some()
    }

    /// `n` more steps done.
    pub(crate) fn inc(&self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    /// `done` steps done in all.
    pub(crate) fn set(&self, done: u64) {
        if let Some(b) = &self.bar {
            b.set_position(done);
        }
    }

    /// What the stage is doing now (shown after the counts).
    pub(crate) fn note(&self, msg: impl Into<String>) {
        if let Some(b) = &self.bar {
            // (a folder or file name from the inputs: no control character reaches the bar)
            let msg: String = msg
                .into()
                .chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .collect();
            b.set_message(msg);
        }
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_only_on_a_terminal_and_never_when_quiet() {
        assert!(Progress::visible(false, true));
        assert!(!Progress::visible(true, true), "-q hides bars");
        assert!(!Progress::visible(false, false), "not a terminal");
        assert!(!Progress::visible(true, false));
        assert!(!Progress::new(false).is_visible());
        assert!(Progress::new(true).is_visible());
    }

    #[test]
    fn hidden_progress_does_nothing() {
        let p = Progress::hidden();
        assert!(!p.is_visible());
        let s = p.stage("tensors", 10, Count::Items);
        assert!(!s.is_visible());
        s.inc(3);
        s.set(7);
        s.note("step0/rank0");
        drop(s);
        let b = p.stage("hash", 1 << 30, Count::Bytes);
        assert!(!b.is_visible());
    }

    #[test]
    fn a_visible_stage_counts_and_is_shared_between_threads() {
        // Drawn to a hidden target: the counting is real, nothing is printed.
        let p = Progress {
            bars: Some(MultiProgress::with_draw_target(ProgressDrawTarget::hidden())),
        };
        let s = p.stage("tensors", 100, Count::Items);
        std::thread::scope(|sc| {
            for _ in 0..4 {
                sc.spawn(|| (0..25).for_each(|_| s.inc(1)));
            }
        });
        assert_eq!(s.bar.as_ref().map(|b| b.position()), Some(100));
    }
}
