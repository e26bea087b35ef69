//! Layout evidence (docs/format.md, "Layout"; docs/compare.md, "Layout evidence"): the
//! reader takes a tensor record's optional `stride`, `offset`, `storage` and `format`, old
//! records without them still read, and compare tells a layout difference at the op it
//! names, in summary.json, the headline and the reports; not one a kernel cannot see.

use crate::common;
use common::*;
use probe::dump::{parse_op_record, Layout};
use probe::schema::dump::OpRecord;
use std::path::Path;

const LINE: &str = r#"{"seq": 0, "op": "Tensor.matmul.0.forward", "kind": "api", "direction": "forward", "tensors": [
  {"name": "Tensor.matmul.0.forward.input.0", "role": "input", "dtype": "float32", "shape": [4, 4], "stride": [1, 4], "offset": 2, "storage": 0, "format": 29, "stats": null},
  {"name": "Tensor.matmul.0.forward.input.1", "role": "input", "dtype": "float32", "shape": [4, 4], "storage": 1, "format": "NC1HWC0", "stats": null},
  {"name": "Tensor.matmul.0.forward.output.0", "role": "output", "dtype": "float32", "shape": [4, 4], "stats": null}]}"#;

#[test]
fn the_reader_takes_layouts_and_reads_records_without_them() {
    let op = parse_op_record(&LINE.replace('\n', ""), Path::new(".")).unwrap();
    let layouts: Vec<Option<Layout>> = op.tensors.iter().map(|t| t.layout.clone()).collect();
    assert_eq!(
        layouts,
        [
            Some(Layout {
                stride: Some(vec![1, 4]),
                offset: 2,
                storage: Some(0),
                format: Some("29".into()),
            }),
            Some(Layout {
                storage: Some(1),
                format: Some("NC1HWC0".into()),
                ..Layout::default()
            }),
            // An old record: nothing known, not "contiguous".
            None,
        ]
    );
}

#[test]
fn layouts_that_contradict_their_record_are_bad_records() {
    let line = LINE.replace('\n', "");
    let bad = line.replace(r#""stride": [1, 4]"#, r#""stride": [1, 4, 16]"#);
    let e = parse_op_record(&bad, Path::new(".")).unwrap_err();
    assert!(e.contains("stride of 3 dimensions for a shape of 2"), "{e}");
    let bad = line.replace(r#""storage": 1,"#, r#""storage": 4294967295,"#);
    let e = parse_op_record(&bad, Path::new(".")).unwrap_err();
    assert!(e.contains("storage id 4294967295"), "{e}");
    let bad = line.replace(r#""format": 29"#, r#""format": [29]"#);
    assert!(parse_op_record(&bad, Path::new(".")).is_err());
}

/// A linear that agrees, then a matmul whose output differs: in the comparison run its
/// first input is a transposed view (`layout` on), or recorded as `bench` has it.
fn dump(dir: &Path, layouts: bool, view: bool) {
    let x = vec![1.0f32; 16];
    let mut lin = op_record(
        "Functional.linear.0.forward",
        &[
            ("input.0", "input", x.clone()),
            ("output.0", "output", x.clone()),
        ],
    );
    let out = if view {
        vec![3.0f32; 16]
    } else {
        vec![2.0; 16]
    };
    let mut mm = op_record(
        "Tensor.matmul.0.forward",
        &[
            ("input.0", "input", x.clone()),
            ("input.1", "input", x),
            ("output.0", "output", out),
        ],
    );
    for t in lin.tensors.iter_mut().chain(mm.tensors.iter_mut()) {
        t.shape = vec![4, 4];
    }
    if layouts {
        // The matmul reads the linear's output (a view of it in the comparison run), and
        // writes where its second input is: in place, on both sides.
        for (t, id) in lin
            .tensors
            .iter_mut()
            .chain(&mut mm.tensors)
            .zip([0, 1, 1, 2, 2])
        {
            t.storage = Some(id);
        }
        if view {
            mm.tensors[0].stride = Some(vec![1, 4]);
        }
        // Strides of a size-1 dimension: no kernel reads them, not told.
        lin.tensors[0].shape = vec![16, 1];
        lin.tensors[1].shape = vec![16, 1];
        lin.tensors[0].stride = Some(vec![1, if view { 7 } else { 16 }]);
    }
    write_op_log(dir, vec![lin, mm]);
}

fn compare_dumps(layouts: (bool, bool)) -> (Out, serde_json::Value, tempfile::TempDir) {
    let d = tempfile::tempdir().unwrap();
    dump(&d.path().join("bench"), layouts.0, false);
    dump(&d.path().join("cmp"), layouts.1, true);
    let o = compare_paths(
        &d.path().join("bench"),
        &d.path().join("cmp"),
        &d.path().join("out"),
        &["--format", "json,xlsx,html,junit,markdown"],
    );
    let s = summary(d.path());
    (o, s, d)
}

const SAID: &str = "cmp input.0 is a non-contiguous view (stride [1, 4]) where bench is contiguous";

#[test]
fn compare_tells_the_layout_difference_at_the_op_it_names() {
    let (o, s, d) = compare_dumps((true, true));
    let f = &s["first_divergent"]["forward"];
    assert_eq!(f["op"], "Tensor.matmul.0.forward", "{s:#}");
    assert_eq!(f["layout"], serde_json::json!([SAID]), "{f:#}");
    assert!(f["explanation"].as_str().unwrap().contains(SAID), "{f:#}");
    assert!(s["headline"].as_str().unwrap().contains(SAID), "{s:#}");
    assert!(o.stdout.contains(SAID), "{}", o.stdout);
    // Every report where a finding's explanation is.
    let out = d.path().join("out");
    for file in ["compare.html", "summary.md", "compare.junit.xml"] {
        let text = std::fs::read_to_string(out.join(file)).unwrap_or_else(|e| {
            panic!(
                "{file}: {e}: {:?}",
                std::fs::read_dir(&out)
                    .unwrap()
                    .map(|e| e.unwrap().file_name())
                    .collect::<Vec<_>>()
            )
        });
        assert!(text.contains("is a non-contiguous view"), "{file}");
    }
    // Nothing said of the linear (its stride differs only over a size-1 dimension), nor
    // of the matmul's output sharing its second input's storage (on both sides).
    let all = s.to_string();
    assert!(!all.contains("shares its storage"), "{all}");
}

#[test]
fn no_layout_is_told_where_a_dump_does_not_record_them() {
    for sides in [(false, true), (true, false), (false, false)] {
        let (o, s, _d) = compare_dumps(sides);
        let f = &s["first_divergent"]["forward"];
        assert_eq!(f["op"], "Tensor.matmul.0.forward", "{s:#}");
        assert!(f.get("layout").is_none(), "{sides:?} {f:#}");
        assert!(!o.stdout.contains("non-contiguous"), "{}", o.stdout);
    }
}

#[test]
fn a_storage_shared_on_one_side_only_is_told() {
    let d = tempfile::tempdir().unwrap();
    let write = |dir: &Path, alias: bool| {
        let mut recs: Vec<OpRecord> = Vec::new();
        let mut mm = op_record(
            "Tensor.add.0.forward",
            &[
                ("input.0", "input", vec![1.0f32; 4]),
                ("output.0", "output", vec![if alias { 5.0 } else { 2.0 }; 4]),
            ],
        );
        mm.tensors[0].storage = Some(0);
        mm.tensors[1].storage = Some(if alias { 0 } else { 1 });
        recs.push(mm);
        write_op_log(dir, recs);
    };
    write(&d.path().join("bench"), false);
    write(&d.path().join("cmp"), true);
    compare_paths(
        &d.path().join("bench"),
        &d.path().join("cmp"),
        &d.path().join("out"),
        &[],
    );
    let s = summary(d.path());
    let f = &s["first_divergent"]["forward"];
    assert_eq!(
        f["layout"],
        serde_json::json!([
            "cmp output.0 shares its storage with input.0 (a view of it, or written in place) \
             where bench's does not"
        ]),
        "{s:#}"
    );
}
