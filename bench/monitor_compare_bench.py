#!/usr/bin/env python3
"""`probe compare` of two monitor folders at job scale, measured in one run: wall time and
peak memory for 1 rank and for R ranks of S steps x M modules (default 4 x 10,000 x 200),
and the ratios R ranks / 1 rank. A compare reads rank pairs in parallel and drops each
when judged, so peak memory should stay near (threads x one pair), not grow with the ranks.

    PYTHONPATH=python python bench/monitor_compare_bench.py [--ranks 4] [--steps 10000] [--modules 200]

Files are written by the agent's own writer (probe.monitor.table) with smooth fake curves;
the comparison's last rank has a fault from step S*3/4 in module 100, which the compare
must name.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from probe.monitor.table import METRICS, MonitorFile, StepRows


def write(folder: Path, ranks: int, steps: int, modules: int, fault_rank: int | None) -> None:
    names = [""] + [f"model.layers.{i // 10}.mlp.proj_{i % 10}" for i in range(modules - 1)]
    order = np.arange(modules, dtype=np.int32)[::-1].copy()
    base = 1.0 + np.arange(modules, dtype=np.float32)
    valid = np.ones(modules, dtype=bool)
    for rank in range(ranks):
        f = MonitorFile(
            str(folder),
            rank,
            names,
            json.dumps({"format": "probe.monitor", "version": 1, "rank": rank}),
        )
        f.start([])
        for s in range(steps):
            v = base * (1.0 + 0.1 * np.sin(s / 50.0))
            if rank == fault_rank and s >= steps * 3 // 4:
                v = v.copy()
                v[100:] *= 1.01
            metrics = {m: (v, valid) for m in METRICS}
            f.write(
                [StepRows(s, order, {"loss": float(v[0]), "loss_scale": None, "lr": 1e-4}, metrics)]
            )
        f.close()


def run(probe: str, bench: Path, cmp: Path, out: Path) -> tuple[float, float, dict[str, object]]:
    """Wall seconds, peak RSS in MB (the child's), summary."""
    t0 = time.perf_counter()
    p = subprocess.run(
        [probe, "compare", "-b", str(bench), "-c", str(cmp), "-o", str(out), "-q"],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if p.returncode not in (0, 1):
        raise SystemExit(f"probe compare failed ({p.returncode}): {p.stderr}")
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return wall, rss, json.loads((out / "summary.json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--modules", type=int, default=200)
    ap.add_argument("--probe", default=os.environ.get("PROBE_BIN", "probe"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        # One rank first (the child's peak RSS is a high-water mark over children: the
        # small run goes first so that the second number is the large run's).
        write(root / "b1", 1, a.steps, a.modules, None)
        write(root / "c1", 1, a.steps, a.modules, 0)
        w1, m1, s1 = run(a.probe, root / "b1", root / "c1", root / "o1")
        for side in ("b1", "c1"):
            for f in (root / side).iterdir():
                f.unlink()
        write(root / "bn", a.ranks, a.steps, a.modules, None)
        write(root / "cn", a.ranks, a.steps, a.modules, a.ranks - 1)
        size = sum(f.stat().st_size for f in (root / "bn").iterdir()) / a.ranks / 1e6
        wn, mn, sn = run(a.probe, root / "bn", root / "cn", root / "on")
    for s, ranks in ((s1, 1), (sn, a.ranks)):
        parting = s.get("parting") or {}
        print(f"{ranks} rank(s): {s['headline'][:110]}", file=sys.stderr)
        assert parting.get("step") == a.steps * 3 // 4, s["headline"]
    print(f"monitor compare, {a.steps} steps x {a.modules} modules, {size:.0f} MB a rank file")
    print(f"  1 rank:  {w1:.2f} s, peak {m1:.0f} MB")
    print(f"  {a.ranks} ranks: {wn:.2f} s, peak {mn:.0f} MB")
    print(f"  ratio {a.ranks} ranks / 1 rank: time {wn / w1:.2f}x, peak memory {mn / m1:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
