"""The CI recipes of docs/ci.md, tested as far as they can be without a CI service: the
workflow files parse and run examples/ci/gate.sh as documented; gate.sh, run on the example
model on CPU against a baseline accepted with `probe baseline accept`, passes on an equal run
and fails on a faulty one; its JUnit files are valid against the JUnit schema
(testdata/junit/junit.xsd, with xmlschema) and its Markdown names the culprit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import EXAMPLE, REPO, probe_bin

CI = Path(REPO) / "examples" / "ci"
XSD = Path(REPO) / "testdata" / "junit" / "junit.xsd"


def schema() -> Any:
    xmlschema = pytest.importorskip("xmlschema")
    return xmlschema.XMLSchema(str(XSD))


def valid_junit(path: Path) -> ET.Element:
    """The JUnit file, checked against the schema and parsed; its counts match its cases."""
    schema().validate(str(path))
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    for attr, tag in (("failures", "failure"), ("errors", "error"), ("skipped", "skipped")):
        n = sum(1 for c in cases if c.find(tag) is not None)
        assert suite.get(attr) == str(n) == root.get(attr), attr
    assert suite.get("tests") == str(len(cases))
    return suite


def test_the_workflows_parse_and_run_the_gate_script() -> None:
    gh = yaml.safe_load((CI / "github-actions.yml").read_text())
    steps = gh["jobs"]["gate"]["steps"]
    runs = [s.get("run", "") for s in steps]
    assert any("examples/ci/gate.sh" in r for r in runs)
    assert any("probe baseline accept" in r for r in runs)
    uses = {s.get("uses", "").split("@")[0] for s in steps}
    assert {"actions/checkout", "actions/upload-artifact"} <= uses
    junit = [s for s in steps if "junit" in s.get("uses", "")]
    assert junit and junit[0]["with"]["report_paths"] == "probe-gate/compare/compare.junit.xml"
    # PyYAML reads the key `on` as True (YAML 1.1); GitHub reads it as `on`.
    triggers = gh.get("on", gh.get(True))
    assert "pull_request" in triggers and "workflow_dispatch" in triggers
    # The reason reaches the shell through the environment, never pasted into the script.
    accept = next(s for s in steps if "probe baseline accept" in s.get("run", ""))
    assert "${{" not in accept["run"] and "$REASON" in accept["run"]

    gl = yaml.safe_load((CI / "gitlab-ci.yml").read_text())
    job = gl["accuracy-gate"]
    assert any("examples/ci/gate.sh" in line for line in job["script"])
    assert job["artifacts"]["reports"]["junit"] == "probe-gate/compare/compare.junit.xml"
    assert job["allow_failure"]["exit_codes"] == [4]
    assert any("probe baseline accept" in line for line in gl["accept-baseline"]["script"])


def gate(baseline: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.update(PROBE=probe_bin(), PYTHON=sys.executable, STEPS="1", DEVICE="cpu")
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "python"), env.get("PYTHONPATH", "")])
    env.pop("GITHUB_STEP_SUMMARY", None)
    return subprocess.run(
        ["bash", str(CI / "gate.sh"), str(baseline), str(out), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A baseline of the example model (1 step, statistics, its config pack), accepted."""
    d = tmp_path_factory.mktemp("baseline")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "python"), env.get("PYTHONPATH", "")])
    subprocess.run(
        [sys.executable, EXAMPLE, "--steps", "1", "--mode", "statistics", "--quiet"]
        + ["--dump", str(d / "dump"), "--config-pack", str(d / "pack.zip")],
        env=env,
        check=True,
        timeout=600,
    )
    base = d / "base"
    o = subprocess.run(
        [probe_bin(), "baseline", "accept", "--dump", str(d / "dump"), "--pack", str(d / "pack.zip")]
        + ["--reason", "the example model on CPU", "--date", "2024-05-01", "-o", str(base)],
        capture_output=True,
        text=True,
    )
    assert o.returncode == 0, o.stderr
    return base


def test_the_gate_passes_an_equal_run_with_valid_junit_and_markdown(baseline: Path, tmp_path: Path) -> None:
    o = gate(baseline, tmp_path / "out")
    assert o.returncode == 0, o.stdout + o.stderr
    compare = tmp_path / "out" / "compare"
    for f in ("compare.html", "compare.xlsx", "summary.json", "compare.junit.xml", "summary.md"):
        assert (compare / f).is_file(), f
    suite = valid_junit(compare / "compare.junit.xml")
    assert [c.get("name") for c in suite.findall("testcase")] == ["step0/rank0"]
    assert suite.get("failures") == "0"
    md = (compare / "summary.md").read_text()
    assert md.startswith("### probe compare: passed (pass, exit 0)")
    assert "baseline base \\(accepted 2024-05-01" in md
    cc = valid_junit(tmp_path / "out" / "config-check" / "config_check.junit.xml")
    assert {c.get("name") for c in cc.findall("testcase")} >= {"env", "packages", "weights"}
    # The run's dump and pack are there for `probe baseline accept`.
    assert (tmp_path / "out" / "run" / "dump" / "manifest.json").is_file()
    assert (tmp_path / "out" / "run" / "config_pack.zip").is_file()


def test_the_gate_fails_a_faulty_run_naming_the_culprit(baseline: Path, tmp_path: Path) -> None:
    o = gate(baseline, tmp_path / "out", "--inject", "Functional.gelu.0")
    assert o.returncode == 1, o.stdout + o.stderr
    compare = tmp_path / "out" / "compare"
    suite = valid_junit(compare / "compare.junit.xml")
    failure = suite.find("testcase/failure")
    assert failure is not None
    assert "Functional.gelu.0.forward" in (failure.get("message") or "")
    assert "Functional.gelu.0.forward" in (failure.text or "")
    md = (compare / "summary.md").read_text()
    assert md.startswith("### probe compare: failed (error, exit 1)")
    assert "Functional.gelu.0.forward" in md


def test_hostile_strings_keep_the_junit_valid(tmp_path: Path) -> None:
    """Op keys and modules holding markup and control characters (a hostile dump): the
    JUnit is still valid against the schema, and the strings read back escaped."""
    for side, y in (("bench", 1.0), ("cmp", 5.0)):
        rank = tmp_path / side / "step0" / "rank0"
        rank.mkdir(parents=True)
        (tmp_path / side / "manifest.json").write_text(
            json.dumps({"format": "probe-dump", "version": 1, "mode": "statistics"})
        )
        key = "Functional.ev\x1b[31m<b>&\"|`.0.forward"
        stats = lambda v: {"max": v, "min": v, "mean": v, "norm": abs(v), "nan": 0, "inf": 0}  # noqa: E731
        record = {
            "seq": 0,
            "op": key,
            "kind": "api",
            "direction": "forward",
            "module": "m]]><x>\x00",
            "tensors": [
                {"name": key + ".input.0", "role": "input", "dtype": "float32", "shape": [1], "stats": stats(1.0)},
                {"name": key + ".output.0", "role": "output", "dtype": "float32", "shape": [1], "stats": stats(y)},
            ],
        }
        (rank / "ops.jsonl").write_text(json.dumps(record) + "\n")
    out = tmp_path / "out"
    o = subprocess.run(
        [probe_bin(), "compare", "-b", str(tmp_path / "bench"), "-c", str(tmp_path / "cmp")]
        + ["-o", str(out), "--format", "json,junit,markdown", "-q"],
        capture_output=True,
        text=True,
    )
    assert o.returncode == 1, o.stderr
    suite = valid_junit(out / "compare.junit.xml")
    failure = suite.find("testcase/failure")
    assert failure is not None and failure.text is not None
    assert 'Functional.ev\\u{1b}[31m<b>&"|`.0.forward' in failure.text
