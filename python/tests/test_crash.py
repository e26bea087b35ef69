"""A crashed run stays comparable (docs/compare.md, "What is guaranteed after a crash").

The example is killed by SIGKILL at a deterministic point (its hidden ``--crash-after-ops``
/ ``--crash-after-bytes`` flags: the process kills itself, as a dying job would, with no
cleanup), then ``probe compare`` against a complete run must compare what was written,
name the incomplete step/rank pairs and exit 4, with no error line. A full disk is a small
tmpfs (root only; skipped otherwise).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from conftest import EXAMPLE, REPO, load_example, probe_bin

EXIT_INCOMPLETE = 4


def _args(dump: str, mode: str, steps: int) -> list[str]:
    return ["--dump", dump, "--mode", mode, "--steps", str(steps), "--batch", "4", "--quiet"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Complete runs (in-process: no second torch import), then the three killed runs
    (subprocesses, in parallel)."""
    base = tmp_path_factory.mktemp("crash")
    det = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    ex = load_example()
    paths = {
        k: str(base / k)
        for k in ("stats", "tensor", "stats_crash", "tensor_crash_thread", "tensor_crash_inline")
    }
    try:
        assert ex.main(_args(paths["stats"], "statistics", 3)) == 0
        assert ex.main(_args(paths["tensor"], "tensor", 2)) == 0
    finally:
        torch.use_deterministic_algorithms(det, warn_only=warn_only)
    ops_per_step = sum(1 for _ in open(os.path.join(paths["stats"], "step0/rank0/ops.jsonl")))
    step0_bytes = os.path.getsize(os.path.join(paths["tensor"], "step0/rank0/ops.jsonl"))
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    procs = [
        # Statistics: killed in the middle of step 1, before its op log was ever flushed.
        subprocess.Popen(
            [sys.executable, EXAMPLE, *_args(paths["stats_crash"], "statistics", 3)]
            + ["--crash-after-ops", str(ops_per_step + ops_per_step // 2)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        ),
    ]
    for writer in ("thread", "inline"):
        # Tensor mode: killed in step 1 after its op log spilled mid-record, its shard
        # still a .stream.tmp being written (by the writer thread, or inline).
        procs.append(
            subprocess.Popen(
                [sys.executable, EXAMPLE, *_args(paths[f"tensor_crash_{writer}"], "tensor", 2)]
                + ["--crash-after-bytes", str(step0_bytes + step0_bytes // 2)]
                + ["--tensor-writer", writer],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == -signal.SIGKILL, err.decode()
    yield paths


def _compare(bench: str, cmp_: str, out: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    r = subprocess.run(
        [probe_bin(), "compare", "-b", bench, "-c", cmp_, "-o", out],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "error" not in r.stderr, r.stderr
    assert "panicked" not in r.stderr, r.stderr
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as fh:
        summary = json.load(fh)
    try:
        import jsonschema
    except ImportError:
        return r, summary
    with open(os.path.join(REPO, "schemas", "probe-compare-summary.v2.schema.json")) as fh:
        jsonschema.validate(summary, json.load(fh))
    return r, summary


def _units(s: Any) -> dict[str, Any]:
    return {f"{u['step']}/{u['rank']}": u for u in s["incomplete_units"]}


def test_killed_statistics_run_compares_its_complete_steps(runs: dict[str, str], tmp_path: Any) -> None:
    r, s = _compare(runs["stats"], runs["stats_crash"], str(tmp_path / "out"))
    assert r.returncode == EXIT_INCOMPLETE, r.stdout + r.stderr
    assert s["exit_code"] == EXIT_INCOMPLETE and s["partial"] is True
    units = _units(s)
    # step1 was cut before its op log was flushed; step2 never started.
    assert set(units) == {"step1/rank0", "step2/rank0"}, units
    assert units["step1/rank0"]["side"] == "cmp" and not units["step1/rank0"]["compared"]
    assert s["counts"]["pairs"] == 1 and s["counts"]["error"] == 0
    assert s["headline"].startswith("INCOMPLETE"), s["headline"]
    assert "step1/rank0" in r.stdout


@pytest.mark.parametrize("writer", ["thread", "inline"])
def test_killed_tensor_run_compares_up_to_its_last_record(
    runs: dict[str, str], tmp_path: Any, writer: str
) -> None:
    crashed = os.path.join(runs[f"tensor_crash_{writer}"], "step1", "rank0")
    assert any(f.endswith(".stream.tmp") for f in os.listdir(crashed)), os.listdir(crashed)
    r, s = _compare(runs["tensor"], runs[f"tensor_crash_{writer}"], str(tmp_path / "out"))
    assert r.returncode == EXIT_INCOMPLETE, r.stdout + r.stderr
    assert s["partial"] is True and s["counts"]["error"] == 0
    unit = _units(s)["step1/rank0"]
    assert unit["compared"] and unit["side"] == "cmp"
    assert "op log cut short" in unit["reason"], unit
    # One warning for the cut record; tensors read back from the unfinished shard.
    assert r.stderr.count("last line is incomplete") == 1, r.stderr
    assert s["counts"]["compared_by"].get("tensor", 0) > 0
    assert s["counts"]["unmatched_bench"] == 0


def _mount_tmpfs(where: str, size: str) -> None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("a full disk needs a tmpfs mount: not root")
    os.makedirs(where)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", f"probe-test-{uuid.uuid4().hex[:8]}", where],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")


@pytest.mark.parametrize("writer", ["thread", "inline"])
def test_full_disk_and_read_only_dump(
    runs: dict[str, str], tmp_path: Any, caplog: pytest.LogCaptureFixture, writer: str
) -> None:
    disk = str(tmp_path / "disk")
    _mount_tmpfs(disk, "2m")
    try:
        dump = os.path.join(disk, "dump")
        det = torch.are_deterministic_algorithms_enabled()
        warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        try:
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                # Training goes on: the agent switches itself off with one line.
                args = [*_args(dump, "tensor", 2), "--tensor-writer", writer]
                assert load_example().main(args) == 0
        finally:
            torch.use_deterministic_algorithms(det, warn_only=warn_only)
        msgs = [str(x.message) for x in w if "probe:" in str(x.message)]
        assert len(msgs) == 1 and "No space left on device" in msgs[0], msgs
        assert "\n" not in msgs[0] and disk in msgs[0], msgs
        assert not any(rec.exc_info for rec in caplog.records if rec.name == "probe")
        # Read back from a read-only folder: reading writes nothing.
        subprocess.run(["mount", "-o", "remount,ro", disk], check=True)
        r, s = _compare(runs["tensor"], dump, str(tmp_path / "out"))
        assert r.returncode == EXIT_INCOMPLETE, r.stdout + r.stderr
        assert s["partial"] is True and s["counts"]["tensors"] > 0
        assert "compared by statistics" in r.stderr, r.stderr
        units = _units(s)
        assert units["step0/rank0"]["compared"] and "step1/rank0" in units, units
    finally:
        subprocess.run(["umount", disk], check=False)
