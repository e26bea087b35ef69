//! probe dump op logs: one `ops.jsonl` line → `OpRecord` → the reader's conversion, and the
//! whole file (line splitting, cut-short last line, seq order, duplicate names).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let dir = Path::new("/nonexistent/step0/rank0");
    if let Err(e) = probe::dump::parse_op_record(&String::from_utf8_lossy(data), dir) {
        assert!(!e.contains('\n'), "{e:?}");
    }
    let path = dir.join("ops.jsonl");
    if let Err(e) = probe::dump::parse_op_log(std::io::Cursor::new(data), &path, dir) {
        assert!(!e.to_string().contains('\n'), "{e}");
    }
});
