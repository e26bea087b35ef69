"""The JSON contracts of `probe compare`, validated with a real JSON Schema validator.

Runs the Rust binary on the bundled demo pair and on an identical pair, and checks that
`summary.json` follows `schemas/probe-compare-summary.v2.schema.json`, and that the demo's
dump files follow the dump schemas.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, probe_bin

jsonschema = pytest.importorskip("jsonschema")



def _schema(name: str) -> Any:
    return json.loads((Path(REPO) / "schemas" / name).read_text())


@pytest.mark.parametrize("cmp_side", ["cmp", "bench"])
def test_summary_follows_its_schema(tmp_path: Path, cmp_side: str) -> None:
    demo = Path(REPO) / "testdata" / "demo"
    out = tmp_path / "out"
    proc = subprocess.run(
        [probe_bin(), "compare", "-b", str(demo / "bench"), "-c", str(demo / cmp_side), "-o", str(out), "-q"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == (1 if cmp_side == "cmp" else 0), proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    jsonschema.validate(summary, _schema("probe-compare-summary.v2.schema.json"))
    assert summary["exit_code"] == proc.returncode


def test_demo_dump_follows_the_dump_schemas() -> None:
    demo = Path(REPO) / "testdata" / "demo"
    op_schema = _schema("probe-dump-op.v1.schema.json")
    stack_schema = _schema("probe-dump-stack.v1.schema.json")
    for side in ("bench", "cmp"):
        jsonschema.validate(
            json.loads((demo / side / "manifest.json").read_text()),
            _schema("probe-dump-manifest.v1.schema.json"),
        )
        rank = demo / side / "step0" / "rank0"
        for line in (rank / "ops.jsonl").read_text().splitlines():
            jsonschema.validate(json.loads(line), op_schema)
        for line in (rank / "stacks.jsonl").read_text().splitlines():
            jsonschema.validate(json.loads(line), stack_schema)


@pytest.mark.parametrize("dump", ["nonfinite_cmp", "nonfinite_bench"])
def test_scan_summary_follows_its_schema(tmp_path: Path, dump: str) -> None:
    out = tmp_path / "out"
    path = Path(REPO) / "testdata" / "msprobe" / dump
    proc = subprocess.run(
        [probe_bin(), "scan", str(path), "-o", str(out), "-q"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == (1 if dump == "nonfinite_cmp" else 0), proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    jsonschema.validate(summary, _schema("probe-scan-summary.v1.schema.json"))
    assert summary["exit_code"] == proc.returncode


@pytest.mark.parametrize("shard", ["0/2", "1/2", "all"])
def test_shard_result_follows_its_schema(tmp_path: Path, shard: str) -> None:
    demo = Path(REPO) / "testdata" / "demo"
    out = tmp_path / "shard"
    proc = subprocess.run(
        [probe_bin(), "compare", "-b", str(demo / "bench"), "-c", str(demo / "cmp"), "-o", str(out), "-q", "--shard", shard],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    header = json.loads((out / "shard.json").read_text())
    jsonschema.validate(header, _schema("probe-compare-shard.v1.schema.json"))
    assert header["shard"] == shard
    # The demo has one rank: part 0 (and all) holds it, part 1 of 2 is empty.
    assert [u["unit"] for u in header["units"]] == ([] if shard == "1/2" else ["step0/rank0"])
    assert (out / header["results"]).is_file() and (out / "compare.parquet").is_file()
