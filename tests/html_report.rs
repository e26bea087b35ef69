//! The html pages (`compare.html`, `scan.html`, `config_check.html`) read back as text:
//! what they show, that dump-derived text is escaped, that they are self-contained and
//! deterministic, and that a large run gives a bounded page. scripts/check_html.sh renders
//! them in a real browser.

use crate::common;
use common::*;
use std::path::Path;

fn page(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join("out").join(name)).expect("the html page")
}

/// Nothing is fetched from elsewhere: no external script, style, image or link.
fn assert_self_contained(html: &str) {
    for bad in ["<link", " src=", "https://", "@import", "url("] {
        assert!(!html.contains(bad), "page refers to {bad}");
    }
    // The SVG namespace is the only URL.
    assert_eq!(
        html.matches("http://").count(),
        html.matches("http://www.w3.org/2000/svg").count()
    );
}

#[test]
fn demo_page_shows_the_plot_the_culprit_and_the_modules() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--inject", "Functional.gelu.1"]);
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let s = summary(t.path());
    let listed = s["outputs"]["html"].as_str().expect("html in outputs");
    assert!(listed.ends_with("compare.html"));
    let html = page(t.path(), "compare.html");
    assert_self_contained(&html);
    for needle in [
        "<svg id=\"plot\"",
        "class=\"pt forward\"",
        "class=\"pt backward\"",
        "class=\"tol\"",
        "class=\"band\"",
        "<g class=\"culprit\" data-op=\"Functional.gelu.1.forward\"",
        "id=\"culprit\"",
        "id=\"modules\"",
        "<code>blocks.1</code>",
        "DIVERGENCE",
        "Every tensor is drawn",
    ] {
        assert!(html.contains(needle), "page lacks {needle}");
    }
    // Deterministic: the same compare into another folder gives the same bytes.
    let again = t.path().join("again");
    let o = compare_to(t.path(), "again", &["-q"]);
    assert_eq!(o.code, 1);
    assert_eq!(
        std::fs::read_to_string(again.join("compare.html")).unwrap(),
        html
    );
}

#[test]
fn html_can_be_left_out() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &[]);
    compare(t.path(), &["--format", "json"]);
    assert!(!t.path().join("out/compare.html").exists());
    let o = compare(t.path(), &["--format", "json,htm"]);
    assert_input_error(&o, 2, "html");
}

#[test]
fn op_names_from_the_dump_are_escaped() {
    let t = tempfile::tempdir().unwrap();
    let key = "Functional.<script>alert(1)</script>\"x'.0.forward";
    for (side, scale) in [("bench", 1.0f32), ("cmp", 1.5)] {
        write_op_log(
            &t.path().join(side),
            vec![
                op_record(
                    "Functional.relu.0.forward",
                    &[("output.0", "output", vec![1.0, 2.0, 3.0])],
                ),
                op_record(
                    key,
                    &[
                        ("input.0", "input", vec![1.0, 2.0, 3.0]),
                        ("output.0", "output", vec![scale, 2.0 * scale, 3.0]),
                    ],
                ),
            ],
        );
    }
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let html = page(t.path(), "compare.html");
    assert!(!html.contains("<script>alert"), "unescaped op name");
    assert!(!html.contains("\"x'"), "unescaped quotes");
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;x&#39;"));
    // The page's own script is the only one.
    assert_eq!(html.matches("<script>").count(), 1);
}

#[test]
fn a_large_run_gives_a_bounded_page() {
    let t = tempfile::tempdir().unwrap();
    // 30k tensors, every one out of tolerance: past the cap of points drawn one by one.
    synth(
        t.path(),
        &[
            "--bulk",
            "30000",
            "--bulk-elems",
            "4",
            "--noise",
            "0.01",
            "--mode",
            "statistics",
        ],
    );
    let o = compare(t.path(), &["--format", "json,html", "-q"]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let html = page(t.path(), "compare.html");
    assert!(html.len() < 2_000_000, "{} bytes", html.len());
    let elements = html.matches('<').count() - html.matches("</").count();
    assert!(elements <= 20_000, "{elements} elements");
    assert!(html.contains("30000 tensors"));
    assert!(
        html.contains("were bucketed into"),
        "the page says it bucketed"
    );
}

#[test]
fn scan_writes_a_page_too() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--nan", "Functional.gelu.1"]);
    let cmp = t.path().join("cmp");
    let out = t.path().join("out");
    let o = scan(&cmp, &out, &["-q"]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let html = page(t.path(), "scan.html");
    assert_self_contained(&html);
    assert!(html.contains("Functional.gelu.1.forward"));
}

#[test]
fn config_check_page_lists_what_differs() {
    let t = tempfile::tempdir().unwrap();
    let td = root().join("testdata/config_check");
    let out = t.path().join("out");
    let o = probe(&[
        "config-check",
        td.join("base.zip").to_str().unwrap(),
        td.join("env.zip").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "-q",
    ]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let html = page(t.path(), "config_check.html");
    assert_self_contained(&html);
    assert!(html.contains("CUDA_LAUNCH_BLOCKING"));
    assert!(html.contains("id=\"cat-env\" open"));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config_check.json")).unwrap())
            .unwrap();
    assert!(json["outputs"]["html"]
        .as_str()
        .unwrap()
        .ends_with("config_check.html"));
}
