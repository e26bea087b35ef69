"""End to end: two runs of the example (one with an injected fault), then probe compare."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import warm

from conftest import REPO, probe_bin, read_ops

INJECT = "Functional.gelu.0"



def _run_example(dump: str, *extra: str) -> None:
    cmd = [
        sys.executable,
        os.path.join(REPO, "examples", "train_small.py"),
        "--dump",
        dump,
        "--mode",
        "tensor",
        "--steps",
        "1",
        "--quiet",
        *extra,
    ]
    r = warm.run(cmd[1:], timeout=300)
    assert r.returncode == 0, r.stderr


def test_compare_names_injected_op(tmp_path: Any) -> None:
    exe = probe_bin()
    bench, cmp_, out = str(tmp_path / "bench"), str(tmp_path / "cmp"), str(tmp_path / "out")
    _run_example(bench)
    _run_example(cmp_, "--inject", INJECT)
    ops = read_ops(os.path.join(cmp_, "step0", "rank0"))
    assert f"{INJECT}.forward" in [o["op"] for o in ops]
    r = subprocess.run(
        [exe, "compare", "-b", bench, "-c", cmp_, "-o", out],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["first_divergent"]["forward"]["op"] == f"{INJECT}.forward", json.dumps(
        summary.get("first_divergent"), indent=1
    )


def test_identical_runs_compare_clean(tmp_path: Any) -> None:
    exe = probe_bin()
    a, b, out = str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "out")
    _run_example(a)
    _run_example(b)
    r = subprocess.run(
        [exe, "compare", "-b", a, "-c", b, "-o", out],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
