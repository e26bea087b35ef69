//! The CI gate (docs/ci.md): `--format junit` and `--format markdown` of compare, scan and
//! config-check, and golden baselines (`probe baseline accept`, `probe compare -b
//! BASELINE`), through the real binary on dumps made here. The JUnit files are parsed with
//! quick-xml (a tree of elements, entities resolved); python/tests/test_ci_gate.py checks
//! them against the JUnit schema too.

use crate::common;
use common::*;
use probe::schema::dump::OpRecord;
use quick_xml::events::Event;
use std::collections::BTreeMap;
use std::path::Path;

/// An element of a parsed XML document.
#[derive(Debug, Default, Clone)]
struct El {
    name: String,
    attrs: BTreeMap<String, String>,
    text: String,
    children: Vec<El>,
}

impl El {
    fn all<'a>(&'a self, name: &str, out: &mut Vec<&'a El>) {
        for c in &self.children {
            if c.name == name {
                out.push(c);
            }
            c.all(name, out);
        }
    }
    fn find(&self, name: &str) -> Vec<&El> {
        let mut v = Vec::new();
        self.all(name, &mut v);
        v
    }
    fn attr(&self, k: &str) -> &str {
        self.attrs.get(k).map_or("", String::as_str)
    }
}

/// An entity or character reference's character.
fn resolve(name: &str) -> char {
    match name {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "apos" => '\'',
        n => {
            let code = match n.strip_prefix("#x") {
                Some(h) => u32::from_str_radix(h, 16),
                None => n.trim_start_matches('#').parse(),
            };
            char::from_u32(code.expect("a character reference")).expect("a character")
        }
    }
}

/// Parses an XML document (panics where it is not well-formed), and checks it holds no
/// character XML 1.0 forbids.
fn parse_xml(xml: &str) -> El {
    for c in xml.chars() {
        let ok = matches!(c, '\t' | '\n' | '\r') || !(c.is_control() || c == '\u{fffe}');
        assert!(ok, "character {:?} not allowed in XML 1.0", c);
    }
    let v = quick_xml::XmlVersion::Implicit1_0;
    let mut r = quick_xml::Reader::from_str(xml);
    let mut stack = vec![El::default()];
    let el = |e: &quick_xml::events::BytesStart| El {
        name: e.name().as_ref().to_string(),
        attrs: e
            .attributes()
            .map(|a| {
                let a = a.expect("a well-formed attribute");
                let k = a.key.as_ref().to_string();
                let val = a.normalized_value(v).expect("attribute value").into_owned();
                (k, val)
            })
            .collect(),
        ..El::default()
    };
    loop {
        match r.read_event().expect("well-formed XML") {
            Event::Start(e) => stack.push(el(&e)),
            Event::Empty(e) => {
                let x = el(&e);
                stack.last_mut().unwrap().children.push(x);
            }
            Event::End(_) => {
                let x = stack.pop().unwrap();
                stack.last_mut().expect("balanced").children.push(x);
            }
            Event::Text(t) => stack.last_mut().unwrap().text += &t.xml_content(v),
            Event::GeneralRef(g) => stack.last_mut().unwrap().text.push(resolve(&g)),
            Event::Decl(_) => {}
            Event::Eof => break,
            other => panic!("unexpected XML: {other:?}"),
        }
    }
    assert_eq!(stack.len(), 1, "unclosed elements");
    let root = stack.pop().unwrap();
    assert_eq!(root.children.len(), 1, "one root element");
    root.children[0].clone()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The suite of a JUnit file, with its counts checked against its cases.
fn junit(path: &Path) -> El {
    let root = parse_xml(&read(path));
    assert_eq!(root.name, "testsuites");
    let suites = root.find("testsuite");
    assert_eq!(suites.len(), 1);
    let s = suites[0].clone();
    let cases = s.find("testcase");
    let count = |tag: &str| cases.iter().filter(|c| !c.find(tag).is_empty()).count();
    for (attr, n) in [
        ("tests", cases.len()),
        ("failures", count("failure")),
        ("errors", count("error")),
        ("skipped", count("skipped")),
    ] {
        assert_eq!(s.attr(attr), n.to_string(), "{attr}");
        assert_eq!(root.attr(attr), n.to_string(), "{attr} of testsuites");
    }
    s
}

fn demo(dir: &Path, inject: bool, extra: &[&str]) {
    let mut args: Vec<&str> = DEMO_SYNTH_ARGS.to_vec();
    if !inject {
        args.drain(..2);
    }
    args.extend_from_slice(extra);
    synth(dir, &args);
}

#[test]
fn a_divergence_fails_its_step_rank_case_with_the_headline_culprit_and_evidence() {
    let d = tempfile::tempdir().unwrap();
    demo(d.path(), true, &[]);
    let o = compare(d.path(), &["--format", "json,junit,markdown,html"]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let s = summary(d.path());
    let suite = junit(&d.path().join("out/compare.junit.xml"));
    let cases = suite.find("testcase");
    assert_eq!(cases.len(), s["pairs"].as_array().unwrap().len());
    assert_eq!(cases[0].attr("name"), "step0/rank0");
    assert_eq!(cases[0].attr("classname"), "probe.compare");
    let failure = cases[0].find("failure")[0];
    let headline = s["headline"].as_str().unwrap();
    assert_eq!(failure.attr("message"), headline);
    assert_eq!(failure.attr("type"), "error");
    let culprit = &s["first_divergent"]["forward"];
    assert!(failure.text.contains(culprit["op"].as_str().unwrap()));
    for e in culprit["evidence"].as_array().unwrap() {
        assert!(failure.text.contains(e.as_str().unwrap()), "{e}");
    }
    let top = culprit["stack"].as_array().unwrap().last().unwrap();
    assert!(failure.text.contains(top.as_str().unwrap()));
    let props: BTreeMap<&str, &str> = suite
        .find("property")
        .iter()
        .map(|p| (p.attr("name"), p.attr("value")))
        .collect();
    assert_eq!(props["headline"], headline);
    assert_eq!(props["exit_code"], "1");
    assert_eq!(props["verdict"], "error");

    // The Markdown: verdict, headline, culprit with module and frame, worst ops, links.
    let md = read(&d.path().join("out/summary.md"));
    assert!(
        md.starts_with("### probe compare: failed (error, exit 1)"),
        "{md}"
    );
    assert!(md.contains("Functional.gelu.1.forward"), "{md}");
    assert!(md.contains("- module: blocks.1"), "{md}");
    assert!(md.contains("- at: File \"model.py\", line 20"), "{md}");
    assert!(md.contains("[compare.html](compare.html)"), "{md}");
    assert!(!md.contains("summary.md"), "no link to itself: {md}");
    let worst = s["worst_ops"].as_array().unwrap().len();
    let rows = md
        .lines()
        .filter(|l| l.starts_with("| step0/rank0 |"))
        .count();
    assert_eq!(rows, worst.min(10), "{md}");
    assert!(md.lines().count() < 60, "PR-sized: {md}");
}

#[test]
fn a_clean_compare_passes_every_case_and_the_output_is_the_same_bytes_again() {
    let d = tempfile::tempdir().unwrap();
    demo(d.path(), false, &["--ranks", "2", "--steps", "2"]);
    let run = || {
        let o = compare(d.path(), &["--format", "json,junit,markdown"]);
        assert_eq!(o.code, 0, "{}", o.stderr);
        (
            read(&d.path().join("out/compare.junit.xml")),
            read(&d.path().join("out/summary.md")),
        )
    };
    let first = run();
    let suite = junit(&d.path().join("out/compare.junit.xml"));
    let names: Vec<&str> = suite
        .find("testcase")
        .iter()
        .map(|c| c.attr("name"))
        .collect();
    assert_eq!(
        names,
        ["step0/rank0", "step0/rank1", "step1/rank0", "step1/rank1"]
    );
    assert_eq!(suite.attr("failures"), "0");
    assert!(
        first
            .1
            .starts_with("### probe compare: passed (pass, exit 0)"),
        "{}",
        first.1
    );
    assert_eq!(run(), first, "deterministic");
}

#[test]
fn the_cases_follow_fail_on() {
    let d = tempfile::tempdir().unwrap();
    demo(d.path(), true, &[]);
    let o = compare(d.path(), &["--format", "junit", "--fail-on", "never"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let suite = junit(&d.path().join("out/compare.junit.xml"));
    assert_eq!((suite.attr("failures"), suite.attr("errors")), ("0", "0"));
}

#[test]
fn a_rank_only_one_run_has_is_an_incomplete_error_case() {
    let d = tempfile::tempdir().unwrap();
    demo(d.path(), false, &["--ranks", "2"]);
    std::fs::remove_dir_all(d.path().join("cmp/step0/rank1")).unwrap();
    let o = compare(d.path(), &["--format", "json,junit,markdown"]);
    assert_eq!(o.code, 4, "{}", o.stderr);
    let suite = junit(&d.path().join("out/compare.junit.xml"));
    assert_eq!((suite.attr("failures"), suite.attr("errors")), ("0", "1"));
    let cases = suite.find("testcase");
    assert_eq!(cases.len(), 2);
    assert!(cases[0].find("error").is_empty());
    let e = cases[1].find("error")[0];
    assert_eq!(cases[1].attr("name"), "step0/rank1");
    assert_eq!(e.attr("type"), "incomplete");
    assert!(
        e.attr("message").contains("not compared"),
        "{}",
        e.attr("message")
    );
    let md = read(&d.path().join("out/summary.md"));
    assert!(
        md.starts_with("### probe compare: could not judge (incomplete, exit 4)"),
        "{md}"
    );
}

#[test]
fn a_monitor_compare_is_one_case_failing_with_the_gate() {
    let d = tempfile::tempdir().unwrap();
    let m = root().join("testdata/monitor");
    let out = d.path().join("m");
    let o = compare_paths(
        &m.join("bench"),
        &m.join("cmp"),
        &out,
        &["--format", "json,junit,markdown"],
    );
    let s: serde_json::Value = serde_json::from_str(&read(&out.join("summary.json"))).unwrap();
    assert_eq!(
        o.code as u64,
        s["exit_code"].as_u64().unwrap(),
        "{}",
        o.stderr
    );
    assert_eq!(o.code, 1, "the bundled pair parts");
    let suite = junit(&out.join("monitor.junit.xml"));
    let cases = suite.find("testcase");
    assert_eq!(cases.len(), 1);
    assert_eq!(
        cases[0].find("failure")[0].attr("message"),
        s["headline"].as_str().unwrap()
    );
    let md = read(&out.join("summary.md"));
    assert!(md.starts_with("### probe monitor: failed"), "{md}");
}

/// A one-op statistics dump whose op key, module and values make hostile strings.
fn hostile(dir: &Path, y: f32) {
    let key = "Functional.ev\u{1b}[31m<b>&\"|`*_.0.forward";
    let mut r: OpRecord = op_record(
        key,
        &[
            ("input.0", "input", vec![1.0, 2.0]),
            ("output.0", "output", vec![y, 2.0]),
        ],
    );
    r.module = Some("m|`<script>`\u{0}]]>".into());
    write_op_log(dir, vec![r]);
}

#[test]
fn hostile_strings_are_escaped_in_junit_and_markdown() {
    let d = tempfile::tempdir().unwrap();
    hostile(&d.path().join("bench"), 1.0);
    hostile(&d.path().join("cmp"), 5.0);
    let o = compare(d.path(), &["--format", "json,junit,markdown"]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let xml = read(&d.path().join("out/compare.junit.xml"));
    let suite = junit(&d.path().join("out/compare.junit.xml"));
    let failure = suite.find("failure")[0];
    // Read back, the op key is there with its markup characters and its ESC written out.
    assert!(
        failure
            .text
            .contains("Functional.ev\\u{1b}[31m<b>&\"|`*_.0.forward"),
        "{}",
        failure.text
    );
    assert!(!xml.contains('\u{1b}') && !xml.contains('\u{0}'));
    assert!(!xml.contains("<b>") && !xml.contains("<script>"));
    let md = read(&d.path().join("out/summary.md"));
    assert!(!md.contains('\u{1b}') && !md.contains('\u{0}'), "{md}");
    assert!(!md.contains("<script>") && !md.contains("<b>"), "{md}");
    // Every table row has its columns: no pipe of the input split a cell.
    for row in md.lines().filter(|l| l.starts_with("| step0")) {
        let cells = row.replace("\\|", "").matches('|').count();
        assert_eq!(cells, 6, "{row}");
    }
    assert!(
        md.contains("ev\\u{1b}\\[31m\\<b\\>\\&\"\\|\\`\\*\\_.0.forward"),
        "{md}"
    );
}

#[test]
fn scan_writes_one_case_per_step_rank_and_fails_where_nan_is_made() {
    let d = tempfile::tempdir().unwrap();
    demo(
        d.path(),
        false,
        &["--nan", "Functional.gelu.1", "--ranks", "2"],
    );
    let out = d.path().join("scan");
    let o = scan(
        &d.path().join("cmp"),
        &out,
        &["--format", "json,junit,markdown"],
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    let s: serde_json::Value = serde_json::from_str(&read(&out.join("summary.json"))).unwrap();
    let suite = junit(&out.join("scan.junit.xml"));
    let cases = suite.find("testcase");
    let units = s["units"].as_array().unwrap();
    assert_eq!(cases.len(), units.len());
    for (c, u) in cases.iter().zip(units) {
        assert_eq!(
            c.attr("name"),
            format!(
                "{}/{}",
                u["step"].as_str().unwrap(),
                u["rank"].as_str().unwrap()
            )
        );
        let nan = u["nonfinite"].as_u64().unwrap() > 0;
        assert_eq!(!c.find("failure").is_empty(), nan, "{}", c.attr("name"));
    }
    let first = s["first_nonfinite"]["forward"]["op"].as_str().unwrap();
    assert!(suite.find("failure")[0].attr("message").contains(first));
    let md = read(&out.join("summary.md"));
    assert!(
        md.starts_with("### probe scan: failed (error, exit 1)"),
        "{md}"
    );
    assert!(
        md.contains("[scan.html](scan.html)") || !md.contains("scan.html"),
        "{md}"
    );
}

#[test]
fn an_unknown_format_is_refused_and_lists_the_formats() {
    let d = tempfile::tempdir().unwrap();
    demo(d.path(), false, &[]);
    let o = compare(d.path(), &["--format", "pdf"]);
    assert_input_error(&o, 2, "json, parquet, xlsx, html, junit, markdown");
}

// ---- baselines -------------------------------------------------------------------------

fn accept(dump: &Path, out: &Path, reason: &str, date: &str, extra: &[&str]) -> Out {
    let mut a = vec![
        "baseline",
        "accept",
        "--dump",
        dump.to_str().unwrap(),
        "--reason",
        reason,
        "--date",
        date,
        "-o",
        out.to_str().unwrap(),
    ];
    a.extend_from_slice(extra);
    probe(&a)
}

fn toml_of(dir: &Path) -> toml::Value {
    toml::from_str(&read(&dir.join("baseline.toml"))).expect("baseline.toml parses")
}

/// sha256 of a baseline's content as docs/ci.md says it is made, computed here.
fn digest_of(dir: &Path) -> String {
    use sha2::{Digest, Sha256};
    fn walk(d: &Path, base: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, base, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().to_str().unwrap().to_string());
            }
        }
    }
    let mut files = Vec::new();
    walk(&dir.join("dump"), dir, &mut files);
    for f in ["config_pack.zip", "tolerances.toml"] {
        if dir.join(f).is_file() {
            files.push(f.into());
        }
    }
    files.sort();
    let mut h = Sha256::new();
    for f in files {
        let bytes = std::fs::read(dir.join(&f)).unwrap();
        h.update(f.as_bytes());
        h.update([0]);
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

#[test]
fn a_baseline_is_accepted_compared_against_and_replaced_with_the_previous_digest() {
    let d = tempfile::tempdir().unwrap();
    demo(d.path(), true, &[]);
    let base = d.path().join("baseline");
    let o = accept(
        &d.path().join("bench"),
        &base,
        "first trusted run",
        "2024-05-01",
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let t = toml_of(&base);
    assert_eq!(t["format"].as_str(), Some("probe-baseline"));
    assert_eq!(t["name"].as_str(), Some("baseline"));
    assert_eq!(t["accepted"].as_str(), Some("2024-05-01"));
    assert_eq!(t["reason"].as_str(), Some("first trusted run"));
    assert_eq!(t["probe_version"].as_str(), Some(env!("CARGO_PKG_VERSION")));
    assert_eq!(t["dump"]["mode"].as_str(), Some("tensor"));
    assert_eq!(t["dump"]["units"].as_array().unwrap().len(), 1);
    assert!(t.get("previous").is_none());
    let first = digest_of(&base);
    assert_eq!(t["digest"].as_str(), Some(first.as_str()));
    assert!(o.stdout.contains(&first), "{}", o.stdout);

    // The same run against the baseline passes; the headline names the baseline.
    let pass = compare_paths(&base, &d.path().join("bench"), &d.path().join("o1"), &[]);
    assert_eq!(pass.code, 0, "{}", pass.stderr);
    let s: serde_json::Value =
        serde_json::from_str(&read(&d.path().join("o1/summary.json"))).unwrap();
    let said = format!(
        "benchmark: baseline baseline (accepted 2024-05-01, {}",
        &first[..19]
    );
    assert!(
        s["headline"].as_str().unwrap().starts_with(&said),
        "{}",
        s["headline"]
    );
    assert_eq!(s["bench"].as_str(), base.join("dump").to_str());
    // The faulty run fails against it.
    let fail = compare_paths(
        &base,
        &d.path().join("cmp"),
        &d.path().join("o2"),
        &["--format", "json,markdown"],
    );
    assert_eq!(fail.code, 1, "{}", fail.stderr);
    let md = read(&d.path().join("o2/summary.md"));
    assert!(
        md.contains("baseline baseline \\(accepted 2024-05-01"),
        "{md}"
    );

    // Accepting another run records the replaced baseline's digest, date and reason.
    let o = accept(
        &d.path().join("cmp"),
        &base,
        "new CANN: gelu changed on purpose",
        "2024-06-02",
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let t = toml_of(&base);
    assert_eq!(t["previous"]["digest"].as_str(), Some(first.as_str()));
    assert_eq!(t["previous"]["accepted"].as_str(), Some("2024-05-01"));
    assert_eq!(t["previous"]["reason"].as_str(), Some("first trusted run"));
    let second = digest_of(&base);
    assert_ne!(second, first);
    assert_eq!(t["digest"].as_str(), Some(second.as_str()));
    let leftovers: Vec<String> = std::fs::read_dir(&base)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // Now the faulty run is the baseline: it passes, the old benchmark fails.
    let o = compare_paths(
        &base,
        &d.path().join("cmp"),
        &d.path().join("o3"),
        &["--format", "json"],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = compare_paths(
        &base,
        &d.path().join("bench"),
        &d.path().join("o4"),
        &["--format", "json"],
    );
    assert_eq!(o.code, 1, "{}", o.stderr);

    // verify: the digest holds until a file of the dump changes.
    let v = probe(&["baseline", "verify", base.to_str().unwrap()]);
    assert_eq!(v.code, 0, "{}", v.stderr);
    let ops = base.join("dump/step0/rank0/ops.jsonl");
    let mut text = read(&ops);
    text.push('\n');
    std::fs::write(&ops, text).unwrap();
    let v = probe(&["baseline", "verify", base.to_str().unwrap()]);
    assert_input_error(&v, 2, "changed since it was accepted");
}

#[test]
fn a_baseline_carries_its_pack_and_calibration_file() {
    let d = tempfile::tempdir().unwrap();
    demo(d.path(), true, &[]);
    let cal = d.path().join("tolerances.toml");
    // A calibration file loose enough to pass the injected error.
    std::fs::write(
        &cal,
        "[dtype.float32]\nwarning = 0.5\nerror = 1.0\nmax_abs = 10.0\n",
    )
    .unwrap();
    let pack = d.path().join("pack.zip");
    std::fs::write(&pack, b"PK\x05\x06\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0").unwrap();
    let base = d.path().join("b");
    let o = accept(
        &d.path().join("bench"),
        &base,
        "with its pack",
        "2024-05-01",
        &[
            "--pack",
            pack.to_str().unwrap(),
            "--calibration",
            cal.to_str().unwrap(),
            "--name",
            "nightly",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(read(&base.join("tolerances.toml")), read(&cal));
    assert_eq!(
        std::fs::read(base.join("config_pack.zip")).unwrap(),
        std::fs::read(&pack).unwrap()
    );
    let t = toml_of(&base);
    assert_eq!(
        (t["pack"].as_bool(), t["calibration"].as_bool()),
        (Some(true), Some(true))
    );
    assert_eq!(t["name"].as_str(), Some("nightly"));
    assert_eq!(
        t["digest"].as_str().map(String::from),
        Some(digest_of(&base))
    );
    // Without the baseline's tolerances the run fails; with them (read from the baseline) it
    // passes, unless --config names others.
    let strict = compare(d.path(), &["--format", "json"]);
    assert_eq!(strict.code, 1, "{}", strict.stderr);
    let loose = compare_paths(
        &base,
        &d.path().join("cmp"),
        &d.path().join("o"),
        &["--format", "json"],
    );
    let s: serde_json::Value =
        serde_json::from_str(&read(&d.path().join("o/summary.json"))).unwrap();
    assert_ne!(s["verdict"], "error", "{}", s["headline"]);
    assert_eq!(loose.code, 0, "{}", loose.stderr);
}

#[test]
fn a_corrupt_or_missing_baseline_toml_is_a_one_line_error() {
    let d = tempfile::tempdir().unwrap();
    demo(d.path(), false, &[]);
    let base = d.path().join("base");
    assert_eq!(
        accept(&d.path().join("bench"), &base, "ok", "2024-05-01", &[]).code,
        0
    );
    let cmp = d.path().join("cmp");
    let run = |name: &str| compare_paths(&base, &cmp, &d.path().join(name), &["--format", "json"]);
    std::fs::write(
        base.join("baseline.toml"),
        "format = \"probe-baseline\"\nversion = [\u{1b}",
    )
    .unwrap();
    let o = run("o1");
    assert_input_error(&o, 2, "baseline.toml");
    assert!(!o.stderr.contains('\u{1b}'));
    std::fs::write(
        base.join("baseline.toml"),
        "format = \"other\"\nversion = 1\n",
    )
    .unwrap();
    assert_input_error(&run("o2"), 2, "baseline.toml");
    std::fs::remove_file(base.join("baseline.toml")).unwrap();
    assert_input_error(&run("o3"), 2, "baseline.toml");
    // Accepting over a folder of other files is refused; so are an empty reason and a bad date.
    std::fs::create_dir_all(d.path().join("other")).unwrap();
    std::fs::write(d.path().join("other/x.txt"), "keep").unwrap();
    let o = accept(
        &d.path().join("bench"),
        &d.path().join("other"),
        "r",
        "2024-05-01",
        &[],
    );
    assert_input_error(&o, 2, "no baseline.toml");
    assert_eq!(read(&d.path().join("other/x.txt")), "keep");
    assert_input_error(
        &accept(
            &d.path().join("bench"),
            &d.path().join("n1"),
            " ",
            "2024-05-01",
            &[],
        ),
        2,
        "--reason",
    );
    assert_input_error(
        &accept(
            &d.path().join("bench"),
            &d.path().join("n2"),
            "r",
            "2024-5-1",
            &[],
        ),
        2,
        "--date",
    );
    assert!(!d.path().join("n1").exists() && !d.path().join("n2").exists());
}

/// `probe ARGS` stopped after `secs` seconds (`timeout`): a hang fails the test, not the
/// machine.
fn probe_timed(secs: u32, args: &[&str]) -> Out {
    let o = std::process::Command::new("timeout")
        .arg(secs.to_string())
        .arg(env!("CARGO_BIN_EXE_probe"))
        .args(args)
        .output()
        .expect("run timeout");
    Out::from(o)
}

#[test]
fn a_baseline_changed_since_it_was_accepted_is_refused_by_compare() {
    let d = tempfile::tempdir().unwrap();
    demo(d.path(), true, &[]);
    let base = d.path().join("baseline");
    let o = accept(&d.path().join("bench"), &base, "r", "2024-05-01", &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let recorded = digest_of(&base);
    // The benchmark's ops rewritten as the faulty run's: a compare against it would pass.
    std::fs::copy(
        d.path().join("cmp/step0/rank0/ops.jsonl"),
        base.join("dump/step0/rank0/ops.jsonl"),
    )
    .unwrap();
    let out = d.path().join("o");
    let o = compare_paths(&base, &d.path().join("cmp"), &out, &["--format", "json"]);
    assert_input_error(&o, 2, "changed since it was accepted");
    let found = digest_of(&base);
    assert!(
        o.stderr.contains(&recorded) && o.stderr.contains(&found),
        "{}",
        o.stderr
    );
    assert!(!out.join("summary.json").exists(), "a report was written");
}

#[test]
fn links_and_special_files_in_a_baseline_are_never_followed_or_read() {
    let d = tempfile::tempdir().unwrap();
    demo(d.path(), true, &[]);
    let secret = d.path().join("secret.txt");
    std::fs::write(&secret, "outside the dump").unwrap();
    // accept: a dump holding a link to a file outside it is refused, nothing written.
    let dump = d.path().join("linked");
    copy_dir(&d.path().join("bench"), &dump);
    std::os::unix::fs::symlink(&secret, dump.join("step0/rank0/extra.txt")).unwrap();
    let base = d.path().join("baseline");
    let o = accept(&dump, &base, "r", "2024-05-01", &[]);
    assert_input_error(&o, 2, "symbolic link");
    assert!(o.stderr.contains("extra.txt"), "{}", o.stderr);
    assert!(!base.exists(), "accept wrote something");

    // verify and compare -b: a link to /dev/zero, a FIFO, a linked dump folder; each an
    // error at once (bounded by `timeout`).
    let o = accept(&d.path().join("bench"), &base, "r", "2024-05-01", &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let rank = base.join("dump/step0/rank0");
    let zero = rank.join("zero.bin");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let b = base.to_str().unwrap();
    let v = probe_timed(20, &["baseline", "verify", b]);
    assert_input_error(&v, 2, "symbolic link");
    let out = d.path().join("o");
    let c = d.path().join("cmp");
    let (c, o_) = (c.to_str().unwrap(), out.to_str().unwrap());
    let args = ["compare", "-b", b, "-c", c, "-o", o_];
    assert_input_error(&probe_timed(20, &args), 2, "symbolic link");
    std::fs::remove_file(&zero).unwrap();
    let fifo = rank.join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let v = probe_timed(20, &["baseline", "verify", b]);
    assert_input_error(&v, 2, "not a plain file");
    std::fs::remove_file(&fifo).unwrap();
    std::fs::rename(base.join("dump"), d.path().join("real-dump")).unwrap();
    std::os::unix::fs::symlink(d.path().join("real-dump"), base.join("dump")).unwrap();
    let v = probe_timed(20, &["baseline", "verify", b]);
    assert_input_error(&v, 2, "symbolic link");
    assert!(!out.join("summary.json").exists());
}

#[test]
fn a_killed_accept_is_put_right_by_the_next_run() {
    let d = tempfile::tempdir().unwrap();
    demo(d.path(), true, &[]);
    // The old and the new baseline, whole, to lay out a killed accept's states from.
    let (old, new) = (d.path().join("old"), d.path().join("new"));
    assert_eq!(
        accept(&d.path().join("bench"), &old, "old", "2024-05-01", &[]).code,
        0
    );
    assert_eq!(
        accept(&d.path().join("cmp"), &new, "new", "2024-06-01", &[]).code,
        0
    );
    let (old_digest, new_digest) = (digest_of(&old), digest_of(&new));
    let (host, dead) = (scratch_host(), dead_pid());
    // Named as an accept of this machine that was killed (a process that is gone).
    let aside_names = [
        format!(".probe-replaced-{host}-{dead}"),
        format!(".probe-replaced-{dead}"), // an older probe's name
    ];
    // (what a state holds: the old files moved aside, the new ones moved in; the baseline a
    // reader must find)
    let states: [(&[&str], &[&str], &str); 5] = [
        (&[], &[], &old_digest),
        (&["baseline.toml"], &[], &old_digest),
        (&["baseline.toml", "dump"], &[], &old_digest),
        (&["baseline.toml", "dump"], &["dump"], &old_digest),
        (
            &["baseline.toml", "dump"],
            &["dump", "baseline.toml"],
            &new_digest,
        ),
    ];
    for (i, (aside, moved_in, expected)) in states.iter().enumerate() {
        for (j, aside_name) in aside_names.iter().enumerate() {
            for reader in ["verify", "compare", "accept"] {
                let base = d.path().join(format!("b{i}-{j}-{reader}"));
                copy_dir(&old, &base);
                let a = base.join(aside_name);
                std::fs::create_dir(&a).unwrap();
                for n in *aside {
                    std::fs::rename(base.join(n), a.join(n)).unwrap();
                }
                for n in *moved_in {
                    let from = new.join(n);
                    if from.is_dir() {
                        copy_dir(&from, &base.join(n));
                    } else {
                        std::fs::copy(&from, base.join(n)).unwrap();
                    }
                }
                let b = base.to_str().unwrap();
                let case = format!("state {i}, {aside_name}, {reader}");
                match reader {
                    "verify" => {
                        let v = probe(&["baseline", "verify", b]);
                        assert_eq!(v.code, 0, "{case}: {}", v.stderr);
                        assert_eq!(v.stdout.trim(), format!("ok: {expected}"), "{case}");
                    }
                    "compare" => {
                        let out = d.path().join(format!("o{i}-{j}"));
                        let o = compare_paths(&base, &d.path().join("bench"), &out, &[]);
                        let code = if *expected == old_digest { 0 } else { 1 };
                        assert_eq!(o.code, code, "{case}: {}", o.stderr);
                    }
                    _ => {
                        let o = accept(&d.path().join("bench"), &base, "again", "2024-07-01", &[]);
                        assert_eq!(o.code, 0, "{case}: {}", o.stderr);
                        let t = toml_of(&base);
                        assert_eq!(t["previous"]["digest"].as_str(), Some(*expected), "{case}");
                        assert_eq!(digest_of(&base), old_digest, "{case}");
                    }
                }
                assert!(!a.exists(), "{case}: {aside_name} left");
                if reader != "accept" {
                    assert_eq!(digest_of(&base), *expected, "{case}");
                }
            }
        }
    }
    // A first accept into an empty folder, killed with half its dump moved in: the folder
    // is emptied and the next accept goes through.
    let base = d.path().join("first");
    std::fs::create_dir_all(base.join(&aside_names[0])).unwrap();
    copy_dir(&new.join("dump"), &base.join("dump"));
    let o = accept(&d.path().join("bench"), &base, "first", "2024-05-01", &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(toml_of(&base).get("previous").is_none());
    assert_eq!(digest_of(&base), old_digest);
    // The folder of an accept still running (this process) is left alone and named.
    let base = d.path().join("live");
    copy_dir(&old, &base);
    let live = base.join(format!(".probe-replaced-{host}-{}", std::process::id()));
    std::fs::create_dir(&live).unwrap();
    std::fs::rename(base.join("baseline.toml"), live.join("baseline.toml")).unwrap();
    let v = probe(&["baseline", "verify", base.to_str().unwrap()]);
    assert_input_error(&v, 2, "under way");
    assert!(live.join("baseline.toml").is_file());
}

// ---- config-check ----------------------------------------------------------------------

#[test]
fn config_check_writes_one_case_per_category() {
    let d = tempfile::tempdir().unwrap();
    let packs = root().join("testdata/config_check");
    let (bench, cmp) = (packs.join("base.zip"), packs.join("env.zip"));
    let out = d.path().join("cc");
    let o = probe(&[
        "config-check",
        bench.to_str().unwrap(),
        cmp.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--format",
        "json,junit,markdown",
    ]);
    let r: serde_json::Value = serde_json::from_str(&read(&out.join("config_check.json"))).unwrap();
    assert_eq!(
        o.code as u64,
        r["exit_code"].as_u64().unwrap(),
        "{}",
        o.stderr
    );
    assert!(
        !out.join("config_check.xlsx").exists(),
        "only the chosen formats"
    );
    let suite = junit(&out.join("config_check.junit.xml"));
    let cases = suite.find("testcase");
    let cats = r["categories"].as_array().unwrap();
    assert_eq!(cases.len(), cats.len());
    for (c, cat) in cases.iter().zip(cats) {
        assert_eq!(c.attr("name"), cat["name"].as_str().unwrap());
        let failed = !c.find("failure").is_empty();
        assert_eq!(failed, cat["pass_check"] == false, "{}", c.attr("name"));
        assert_eq!(!c.find("skipped").is_empty(), cat["pass_check"].is_null());
    }
    let md = read(&out.join("config_check.md"));
    assert!(md.starts_with("### probe config-check: "), "{md}");
    assert_eq!(
        md.lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| category"))
            .count(),
        cats.len()
    );
}
