#!/usr/bin/env python3
"""Cost of capture inside ``torch.compile`` graphs (issue 51). Not a test.

Times training steps of a model compiled with Inductor, bare and captured (statistics, API
level: the graphs' calls recorded with statistics computed by the graphs, capture/graphs.py),
in one process, alternating step by step so that both see the same machine; also the same
model eager, bare and captured, for scale. Prints the medians, the ratios, and the cost per
op record (captured minus bare, over the records a captured step wrote). Goal: compiled
capture of the example model <= 1.5x the compiled bare step on CPU.

    python bench/compile_bench.py [--model small|transformer] [--steps 10] [--device cpu]
                                  [--threads N]

``--threads``: PyTorch's intra-op threads (default: PyTorch's own choice, the cores). On a
2-core machine the two counts tell different stories: at 2 the compiled kernels share the
cores while the agent's per-call work runs on one (docs/performance.md).

Both variants of each graph (plain and instrumented) are compiled during the warm-up steps,
which are not timed. Four configurations: eager and compiled, each capturing the whole step
and capturing the model only (``stop()`` before ``opt.step()``: PyTorch's CPU optimizers step
one tensor at a time, eager calls that are most of the example's records).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any, Callable

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import probe  # noqa: E402

sys.path.insert(0, HERE)
from capture_overhead import Transformer, _load_example, _sync, transformer_data  # noqa: E402


def _model(name: str, device: torch.device) -> tuple[torch.nn.Module, Callable[[Any], Any], Any]:
    """The model, a loss of (model output, batch), and two batches."""
    if name == "small":
        ex = _load_example()
        probe.seed_all(0)
        model = ex.SmallNet().to(device)
        data = ex.make_data(2, 16, device)

        def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(out.float(), y)

        return model, loss, data
    probe.seed_all(0)
    model = Transformer().to(device)

    def tloss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    return model, tloss, transformer_data(2, device, seq=64)


def _time(
    name: str, compiled: bool, steps: int, device: torch.device, dump: str, model_only: bool
) -> dict[str, Any]:
    """Median bare and captured step of one configuration, alternating. ``model_only``:
    ``stop()`` before the optimizer's step (PyTorch's CPU optimizers step one tensor at a
    time, eager calls that are most of a small model's records)."""
    torch._dynamo.reset()
    model, loss_of, data = _model(name, device)
    run = torch.compile(model) if compiled else model
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    dbg = probe.Debugger(None, dump_path=dump, level="api", mode="statistics")
    times: dict[bool, list[float]] = {False: [], True: []}
    records = 0
    warm = 4
    for i in range(warm + 2 * steps):
        capture = i % 2 == 1
        x, y = data[i % len(data)]
        _sync(device)
        t0 = time.perf_counter()
        if capture:
            dbg.start(model)
        opt.zero_grad(set_to_none=True)
        loss_of(run(x), y).backward()
        if capture and model_only:
            dbg.stop()
        opt.step()
        if capture and not model_only:
            dbg.stop()
        _sync(device)
        dt = time.perf_counter() - t0
        dbg.step()
        if i >= warm:
            times[capture].append(dt)
    dbg.close()
    last = max((int(d[4:]) for d in os.listdir(dump) if d.startswith("step")), default=-1)
    ops = os.path.join(dump, f"step{last}", "rank0", "ops.jsonl")
    with open(ops) as fh:
        lines = [json.loads(line) for line in fh]
    records = len(lines)
    inside = sum(1 for r in lines if "graph" in r)
    bare, cap = statistics.median(times[False]), statistics.median(times[True])
    return {"bare": bare, "cap": cap, "records": records, "inside": inside}


def _tap_cost(n: int = 4096, calls: int = 20000) -> tuple[float, float]:
    """Host microseconds of one CPU tap of an ``n``-element float32 tensor: the kernel as
    Inductor's code calls it (``tap_ops.run_row``), and through the operator's dispatch
    (``probe::tap_stats``, as the other compilers' code calls it)."""
    from probe.capture import stats, tap_ops

    stats.use_native()
    x = torch.randn(n)
    out = []
    for f in (tap_ops.run_row, tap_ops._TAP_OP or tap_ops.run_row):
        f(x, tap_ops.COLUMNS)
        t0 = time.perf_counter()
        for _ in range(calls):
            f(x, tap_ops.COLUMNS)
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return out[0], out[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["small", "transformer"], default="small")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: PyTorch's)")
    a = ap.parse_args()
    if a.threads < 0:
        ap.error("--threads must be 0 (PyTorch's choice) or more")
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    warnings.simplefilter("ignore")
    print(
        f"model {a.model}, {a.steps} steps each, {device}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}"
    )
    print(
        f"{'run':<10} {'bare ms':>9} {'captured ms':>12} {'ratio':>7} {'records':>8} "
        f"{'in graphs':>10} {'us/record':>10}"
    )
    for compiled, model_only in ((False, False), (True, False), (False, True), (True, True)):
        with tempfile.TemporaryDirectory() as tmp:
            r = _time(a.model, compiled, a.steps, device, tmp, model_only)
        per = (r["cap"] - r["bare"]) / max(1, r["records"]) * 1e6
        name = ("compiled" if compiled else "eager") + (", model" if model_only else "")
        print(
            f"{name:<17} {r['bare'] * 1e3:>9.2f} {r['cap'] * 1e3:>12.2f} "
            f"{r['cap'] / r['bare']:>6.2f}x {r['records']:>8} {r['inside']:>10} {per:>10.1f}"
        )
    if device.type == "cpu":
        direct, dispatched = _tap_cost()
        print(
            f"per tap (host, 4K elements): {direct:.1f} us called from Inductor's code, "
            f"{dispatched:.1f} us through the operator's dispatch"
        )
    print("goal: compiled capture of the example model <= 1.5x the compiled bare step (CPU)")
    print("us/record: (captured - bare) / records; the in-graph records cost a share of it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
