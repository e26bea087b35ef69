"""bench/capture_overhead.py prints what a captured step wrote and where its cost went.

The bench is not a test and its timings are not checked here; what it counts is. The records
it reports for a configuration must be the op records one captured step of the same
training loop writes, counted here from a dump of that loop; ``--optimizer-outside`` must
leave exactly the optimizer's calls out; the phase table must have the configuration's row.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

import probe
import pytest
import warm
import torch
import torch.nn.functional as F

from conftest import REPO, load_example, probe_bin, read_ops

BENCH = os.path.join(REPO, "bench", "capture_overhead.py")


def _bench(*flags: str) -> str:
    env = dict(os.environ, PROBE_BIN=probe_bin())
    done = warm.run(
        [BENCH, "--steps", "1", "--threads", "1", "--modes", "statistics"]
        + ["--levels", "api", *flags],
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _row(out: str, first: str) -> list[str]:
    rows = [line.split() for line in out.splitlines() if line.startswith(first)]
    assert len(rows) >= 1, out
    return rows[0]


def _ops_of_one_step(tmp: Any, optimizer_inside: bool) -> list[dict[str, Any]]:
    """Op records of the second captured step of the bench's loop (the example model,
    PyTorch's default Adam, batch 16), written by this test's own loop."""
    ex = load_example()
    probe.seed_all(0)
    model = ex.SmallNet()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)  # on CPU: one tensor at a time
    data = ex.make_data(2, 16, torch.device("cpu"))
    dump = str(tmp / ("inside" if optimizer_inside else "outside"))
    dbg = probe.Debugger(None, dump_path=dump, mode="statistics", level="api")
    for i in range(2):
        x, y = data[i]
        dbg.start(model)
        opt.zero_grad(set_to_none=True)
        out = model(x)
        F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)).backward()
        if not optimizer_inside:
            dbg.stop()
        opt.step()
        if optimizer_inside:
            dbg.stop()
        dbg.step()
    dbg.close()
    return read_ops(os.path.join(dump, "step1", "rank0"))


def test_bench_counts_the_records_of_a_captured_step(tmp_path: Any) -> None:
    whole = len(_ops_of_one_step(tmp_path, optimizer_inside=True))
    outside = len(_ops_of_one_step(tmp_path, optimizer_inside=False))
    assert 0 < outside < whole

    out = _bench()
    row = _row(out, "probe statistics api")
    # configuration (3 words), ms/step, ratio, mean ms, gc ms, full, records, us/rec
    assert int(row[8]) == whole
    ms, bare_ms = float(row[3]), float(_row(out, "bare")[1])
    # us/rec is the overhead over the records, from unrounded times (ms are printed to 0.1)
    assert float(row[9]) == pytest.approx((ms - bare_ms) / whole * 1e3, abs=100 / whole + 0.1)
    phases = _row(out.split("overhead by phase", 1)[1], "probe statistics api")
    assert len(phases) == 6 and all(re.fullmatch(r"-?\d+\.\d", v) for v in phases[3:])
    assert "issue 15 goal, small cpu statistics api" in out

    out = _bench("--optimizer-outside")
    assert int(_row(out, "probe statistics api")[8]) == outside
    assert "optimizer not captured" in out
    assert "issue 15 goal" not in out


def test_bench_floors_count_the_calls_the_agent_records(tmp_path: Any) -> None:
    """``--floor``: each floor goes through the agent's own wrappers and counts every call
    the agent would record, so its count is the forward records of a captured step; the
    floors' shares of the agent's overhead are printed."""
    ops = _ops_of_one_step(tmp_path, optimizer_inside=True)
    forward = sum(1 for op in ops if op["direction"] == "forward")
    assert 0 < forward < len(ops)

    out = _bench("--floor")
    # the agent's row is unchanged by the floors timed beside it
    assert int(_row(out, "probe statistics api")[8]) == len(ops)
    for what in ("wrappers", "facts", "hooks"):
        row = _row(out, f"floor {what}")
        # configuration (2 words), ms/step, ratio, mean ms, gc ms, full, records, us/rec
        assert int(row[7]) == forward, what
        # a share, not checked: one step is too few to time (it may even be negative)
        assert re.search(
            rf"^floor {what}: -?\d+% of the overhead of probe statistics api$", out, re.M
        )


def test_bench_ablations_leave_out_their_part_only(tmp_path: Any) -> None:
    """``--ablate``: each part's configuration dumps beside the whole agent, whose records
    stay as they are. Leaving out ``records`` drops exactly the forward records of API calls
    (the backward records stay); every other part keeps the number of records. Each
    configuration's share of the overhead is printed, and an unknown part (or an order for a
    paired run without one) is refused before anything runs."""
    ops = _ops_of_one_step(tmp_path, optimizer_inside=True)
    forward_api = sum(1 for op in ops if op["kind"] == "api" and op["direction"] == "forward")
    assert 0 < forward_api < len(ops)

    out = _bench("--ablate", "all")
    assert int(_row(out, "probe statistics api ")[8]) == len(ops)
    for part in ("records", "facts", "dataflow", "args", "stacks", "none"):
        row = _row(out, f"probe statistics api -{part} ")
        # configuration (4 words), ms/step, ratio, mean ms, gc ms, full, records, us/rec
        want = len(ops) - forward_api if part == "records" else len(ops)
        assert int(row[9]) == want, part
        assert re.search(
            rf"^probe statistics api -{part}: overhead -?\d+\.\d ms = -?\d+\.\d{{3}} of "
            r"probe statistics api's",
            out,
            re.M,
        ), part

    env = dict(os.environ, PROBE_BIN=probe_bin())
    for flags, says in (
        (["--ablate", "stacks,bogus"], "unknown part 'bogus'"),
        (["--baseline-first"], "--baseline-first orders a paired run: it needs --baseline"),
    ):
        done = warm.run(
            [BENCH, *flags],
            timeout=120,
            env=env,
        )
        assert done.returncode == 2 and says in done.stderr, flags
        assert done.stdout == ""


@pytest.mark.parametrize("first", [False, True])
def test_bench_pairs_a_baseline_made_in_either_order(tmp_path: Any, first: bool) -> None:
    """``--baseline DIR``: the other checkout's agent (here this one, copied) dumps the same
    records beside this one's, and the paired line says whose configuration was made first
    (``--baseline-first``: the baseline's)."""
    ops = _ops_of_one_step(tmp_path, optimizer_inside=True)
    out = _bench("--baseline", REPO, *(["--baseline-first"] if first else []))
    for tag in ("probe", "base"):
        assert int(_row(out, f"{tag} statistics api")[8]) == len(ops), tag
    # The table lists configurations in the order they were made.
    table = out.split("overhead by phase", 1)[0].splitlines()
    made = [line.split()[0] for line in table if line.split()[:1] in (["probe"], ["base"])]
    assert made == (["base", "probe"] if first else ["probe", "base"]), made
    whose = "the baseline's" if first else "this checkout's"
    assert re.search(
        rf"^overhead of this checkout / of {re.escape(REPO)}, statistics api: .* = \d+\.\d{{3}} "
        rf"\({whose} configuration made first\)$",
        out,
        re.M,
    ), out


def test_floor_counts_what_a_checkpointed_step_records(tmp_path: Any) -> None:
    """Under activation checkpointing PyTorch stops the recompute early by raising inside
    the first call it no longer needs: that call has its number but no record, and the
    floor must not count it either (the agent's records and the floor's count agree on the
    example's recomputed block, with SDPA and a hand-written RMSNorm)."""
    sys.path.insert(0, os.path.join(REPO, "bench"))
    try:
        from floor_agent import FloorAgent
    finally:
        sys.path.remove(os.path.join(REPO, "bench"))
    from probe.capture import stats

    ex = load_example()
    counts = []
    for agent in ("probe", "floor"):
        probe.seed_all(0)
        model = ex.SmallNet(checkpoint=True, attention="sdpa", norm="rms-manual")
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = ex.make_data(1, 16, torch.device("cpu"))[0]
        if agent == "probe":
            dbg = probe.Debugger(None, dump_path=str(tmp_path), mode="statistics", level="api")
            start, stop = dbg.start, dbg.stop
        else:
            stats.use_native()
            floor = FloorAgent(3, stats.NATIVE)
            start, stop = floor.start, floor.stop
        start(model)
        opt.zero_grad(set_to_none=True)
        out = model(x)
        F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)).backward()
        opt.step()
        stop()
        if agent == "probe":
            dbg.close()
            ops = read_ops(os.path.join(str(tmp_path), "step0", "rank0"))
            assert any(op["recompute"] for op in ops)
            counts.append(sum(1 for op in ops if op["direction"] == "forward"))
        else:
            counts.append(floor.calls)
    assert counts[0] == counts[1]


def test_bench_profile_lists_what_capture_added() -> None:
    """``--profile`` prints, after the captured step's own table, what capture added to a
    bare step op by op: each row an op, its extra calls and its extra time. The agent hangs
    its backward records on aliases of each call's differentiable inputs (docs/capture.md),
    which a bare step never makes, so ``aten::alias`` is among the rows with calls added."""
    out = _bench("--profile")
    assert "added by probe statistics api against the bare step" in out, out
    table = out.split("against the bare step", 1)[1].split("\nmodel ", 1)[0]
    rows = [line.rsplit(None, 2) for line in table.splitlines()[1:] if line.startswith("  ")]
    assert rows and all(
        re.fullmatch(r"[+-]\d+", r[1]) and re.fullmatch(r"[+-]\d+\.\d{3}", r[2]) for r in rows
    ), table
    alias = [r for r in rows if r[0].strip() == "aten::alias"]
    assert alias and int(alias[0][1]) > 0, table
