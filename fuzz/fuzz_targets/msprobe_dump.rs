//! msprobe `dump.json` (and `stack.json`), as the msprobe reader parses them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let dir = Path::new("/nonexistent/step0/rank0");
    if let Err(e) = probe::dump::msprobe::parse_dump(data, dir) {
        assert!(!e.contains('\n'), "{e:?}");
    }
    if let Err(e) = probe::dump::msprobe::parse_stacks(data) {
        assert!(!e.contains('\n'), "{e:?}");
    }
});
