"""The tests' fork server (warm.py) runs a script as a fresh ``python`` would: what the
end-to-end tests read of a run (exit status, streams, argv, folder, environment, threads,
a timeout, a torchrun job's ranks) must not depend on how it was started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import warm

SCRIPT = """
import json, os, sys
import torch
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "x": os.environ.get("X"),
                  "threads": torch.get_num_threads(), "path0": sys.path[0],
                  "main": __name__, "dynamo": "torch._dynamo" in sys.modules}))
print("to stderr", file=sys.stderr)
if sys.argv[1:2] == ["fail"]:
    raise ValueError("boom")
if sys.argv[1:2] == ["exit"]:
    sys.exit(3)
if sys.argv[1:2] == ["sleep"]:
    import time
    time.sleep(60)
"""


def _both(args: list[str], **kw: object) -> tuple[subprocess.CompletedProcess[str], ...]:
    """The same run warm and fresh."""
    fresh = subprocess.run([sys.executable, *args], capture_output=True, text=True, **kw)
    return warm.run(args, **kw), fresh


@pytest.mark.skipif(not warm.enabled(), reason="the warm server is off (PROBE_TEST_WARM=0)")
def test_a_warm_run_reads_as_a_fresh_one(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, X="1", OMP_NUM_THREADS="1")
    for argv in (["ok", "a b"], ["fail"], ["exit"]):
        w, f = _both([str(script), *argv], env=env, cwd=str(tmp_path))
        assert (w.returncode, w.stdout) == (f.returncode, f.stdout), (w, f)
        assert w.stderr.splitlines()[0] == "to stderr"
        assert w.stderr.splitlines()[-1:] == f.stderr.splitlines()[-1:]
    assert '"threads": 1' in w.stdout and '"dynamo": false' in w.stdout
    w, f = _both(["-c", SCRIPT, "ok"], env=env, cwd=str(tmp_path))
    assert (w.returncode, w.stdout) == (f.returncode, f.stdout)
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run([str(script), "sleep"], timeout=3)
    assert warm.run(["-c", "print(2)"]).stdout == "2\n"  # (the server goes on)


DDP = """
import os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(2) * (rank + 1)
dist.all_reduce(t)
print("rank", rank, t.tolist(), flush=True)
dist.destroy_process_group()
if sys.argv[1] == "fail" and rank == 1:
    sys.exit(5)
"""


@pytest.mark.skipif(not warm.enabled(), reason="the warm server is off (PROBE_TEST_WARM=0)")
def test_a_torchrun_jobs_ranks_are_forked_and_their_failure_is_the_jobs(tmp_path: Path) -> None:
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    ok = warm.run([*torchrun, str(script), "ok"], env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert sorted(ok.stdout.split("\n")[:2]) == ["rank 0 [3.0, 3.0]", "rank 1 [3.0, 3.0]"]
    bad = warm.run([*torchrun, str(script), "fail"], env=env, timeout=120)
    assert bad.returncode == 1 and "exitcode  : 5" in bad.stderr, bad.stderr[-2000:]
