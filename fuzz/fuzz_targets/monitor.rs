//! A monitor file (`rank<R>.arrows`, an Arrow IPC stream): the frames, every record
//! batch's buffers, and the rows laid out dense.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = probe::monitor::parse_rank(Path::new("rank0.arrows"), data, 0) {
        let e = e.to_string();
        assert!(!e.contains('\n'), "{e}");
    }
});
