//! Issue 70 items 3 to 5, from outside (the binary, real files in temp dirs): a monitor
//! file with one changed byte, pickles and DCP metadata that expand far beyond their size,
//! and monitor compares with nothing (or not everything) compared.

mod common;
use common::*;

#[test]
fn a_monitor_file_with_a_buffer_offset_changed_is_refused_in_one_line() {
    // One byte of a record batch's buffer offset (found by mutating the file): arrow-ipc
    // sliced past the message's body and the binary panicked (exit 101, a backtrace).
    let t = tempfile::tempdir().unwrap();
    let cmp = t.path().join("cmp");
    copy_dir(&root().join("testdata/monitor/cmp"), &cmp);
    let file = cmp.join("rank0.arrows");
    let mut bytes = std::fs::read(&file).unwrap();
    assert_eq!(bytes[17611], 0);
    bytes[17611] = 32;
    std::fs::write(&file, &bytes).unwrap();
    let bench = root().join("testdata/monitor/bench");
    let o = compare_paths(&bench, &cmp, &t.path().join("out"), &[]);
    assert_input_error(
        &o,
        2,
        "rank0.arrows: bad monitor file: byte 17288: buffer 0",
    );
    let written = std::fs::read_dir(t.path().join("out")).map_or(0, |d| d.count());
    assert_eq!(written, 0, "no report for a refused input");
}
