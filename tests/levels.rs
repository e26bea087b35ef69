//! Runs captured at different levels: a kind of record one side lacks altogether (module
//! records of a `level="mix"` run against an `"api"` run, or msprobe's L1) has nothing to
//! pair with. Those records are left out as `-l` would, with a warning, instead of making
//! the comparison incomplete; sides with no kind in common say why nothing pairs.

use crate::common;
use common::dumps::linear_at_levels as linear;
use common::*;
use probe::schema::dump::OpRecord;
use std::path::Path;

fn run(dir: &Path, bench: Vec<OpRecord>, cmp: Vec<OpRecord>) -> (Out, serde_json::Value) {
    write_op_log(&dir.join("bench"), bench);
    write_op_log(&dir.join("cmp"), cmp);
    let o = compare(dir, &[]);
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    (o, summary(dir))
}

fn warnings(s: &serde_json::Value) -> Vec<&str> {
    s["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect()
}

#[test]
fn module_records_of_one_side_only_are_left_out_with_a_warning() {
    let t = tempfile::tempdir().unwrap();
    let (o, s) = run(t.path(), linear(true, true, 1.0), linear(true, false, 1.0));
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert_eq!(s["counts"]["tensors"], 2, "{s:#}");
    assert_eq!(s["counts"]["unmatched_bench"], 0, "{s:#}");
    let said = "the comparison run has no module records (captured at another level): the \
                benchmark run's module records are left out, as `-l api` does";
    assert_eq!(warnings(&s), [said], "{s:#}");
    assert!(o.stderr.contains(said), "{}", o.stderr);
    // What is left is compared as before: a differing output is still found.
    let (o, s) = run(t.path(), linear(true, true, 1.0), linear(true, false, 1.5));
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    assert_eq!(
        s["first_divergent"]["forward"]["op"], "Functional.linear.0.forward",
        "{s:#}"
    );
}

#[test]
fn api_records_of_one_side_only_are_left_out_with_a_warning() {
    let t = tempfile::tempdir().unwrap();
    let (o, s) = run(t.path(), linear(false, true, 1.0), linear(true, true, 1.0));
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert_eq!(s["counts"]["tensors"], 2, "{s:#}");
    assert_eq!(s["counts"]["unmatched_cmp"], 0, "{s:#}");
    assert_eq!(
        warnings(&s),
        [
            "the benchmark run has no API records (captured at another level): the \
          comparison run's API records are left out, as `-l module` does"
        ],
        "{s:#}"
    );
}

#[test]
fn sides_with_no_kind_in_common_say_why_nothing_pairs() {
    let t = tempfile::tempdir().unwrap();
    let (o, s) = run(t.path(), linear(false, true, 1.0), linear(true, false, 1.0));
    assert_eq!(o.code, 3, "{}{}", o.stdout, o.stderr); // nothing comparable
    assert_eq!(
        warnings(&s),
        [
            "the benchmark run has only module records, the comparison run only API records \
          (captured at other levels): nothing can pair; capture both runs at the same level"
        ],
        "{s:#}"
    );
}

#[test]
fn sides_with_the_same_kinds_and_a_chosen_level_say_nothing_of_levels() {
    let t = tempfile::tempdir().unwrap();
    let (o, s) = run(t.path(), linear(true, true, 1.0), linear(true, true, 1.0));
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert_eq!(s["counts"]["tensors"], 4, "{s:#}");
    assert!(warnings(&s).is_empty(), "{s:#}");
    // `-l` chooses: no inference, no warning.
    write_op_log(&t.path().join("cmp"), linear(true, false, 1.0));
    let o = compare(t.path(), &["-l", "api"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(warnings(&summary(t.path())).is_empty());
}
