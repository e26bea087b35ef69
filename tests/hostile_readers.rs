//! Issue 70 items 3 to 5, from outside (the binary, real files in temp dirs): a monitor
//! file with one changed byte, pickles and DCP metadata that expand far beyond their size,
//! and monitor compares with nothing (or not everything) compared.

use crate::common;
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

/// A pickle of `levels` lists, each holding ten memo references to the one before (the
/// first holds ten `None`): a few hundred bytes standing for 10^levels values.
fn memo_fan_out(levels: u8) -> Vec<u8> {
    let mut p = b"\x80\x02(".to_vec();
    p.extend([b'N'; 10]);
    p.extend(b"lq\x00");
    for i in 1..levels {
        p.push(b'(');
        for _ in 0..10 {
            p.extend([b'h', i - 1]);
        }
        p.extend([b'l', b'q', i]);
    }
    p.push(b'.');
    p
}

/// Runs probe under a 2 GiB address-space limit and a 60 s wall clock, so that a reader
/// that expands its input fails the test instead of the machine.
fn probe_bounded(args: &[&str]) -> (Out, std::time::Duration) {
    let mut script = format!(
        "ulimit -v {}; exec timeout 60 {}",
        2 << 20,
        env!("CARGO_BIN_EXE_probe")
    );
    for a in args {
        script += &format!(" '{}'", a.replace('\'', r"'\''"));
    }
    let t = std::time::Instant::now();
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg(&script)
        .output()
        .expect("run sh");
    let out = Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    };
    (out, t.elapsed())
}

#[test]
fn a_checkpoint_pickle_of_memo_fan_out_is_refused_small_and_fast() {
    // 280 bytes standing for 10^12 values: the tree of a checkpoint's pickle copied each
    // shared value at each reference, up to a fixed 67 M values (7 GB, 10 s).
    let t = tempfile::tempdir().unwrap();
    let pkl = memo_fan_out(12);
    assert!(pkl.len() < 300, "{}", pkl.len());
    let pt = t.path().join("bomb.pt");
    let mut z = zip::ZipWriter::new(std::fs::File::create(&pt).unwrap());
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    z.start_file("archive/data.pkl", opts).unwrap();
    std::io::Write::write_all(&mut z, &pkl).unwrap();
    z.finish().unwrap();
    // The same pickle as a DCP folder's metadata.
    let dcp = t.path().join("dcp");
    std::fs::create_dir(&dcp).unwrap();
    std::fs::write(dcp.join(".metadata"), &pkl).unwrap();
    for input in [&pt, &dcp] {
        let input = input.to_str().unwrap();
        let out = t.path().join("out");
        let (o, took) = probe_bounded(&["ckpt-compare", input, input, "-o", out.to_str().unwrap()]);
        assert_input_error(&o, 2, "builds more than 16 MiB of values");
        assert!(took.as_secs() < 10, "{input}: took {took:?}");
    }
}
