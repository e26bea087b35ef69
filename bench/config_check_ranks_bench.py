#!/usr/bin/env python3
"""What `probe config-check` costs on folders of per-rank packs (issue 52): wall time and peak
resident memory for N packs a side (goal: 1,024 packs a side within a minute).

Each pack is testdata/config_check/base.zip (a real pack of the example model: 138
distributions, 17 determinism flags, 4 weight tensors, 3 inputs, 48 hyperparameters) with its
rank's manifest and variables; rank 37 of cmp has another numpy and NCCL_ALGO, so the run
reports one rank against its peers and against bench. The packs are written once into a
temporary folder (not timed); then the command is timed, and its peak RSS read from the
kernel's accounting of the child (``ru_maxrss``).

    PYTHONPATH=python python bench/config_check_ranks_bench.py [--ranks 1024] [--runs 3]
    PROBE_BIN=target/release/probe python bench/config_check_ranks_bench.py

Without PROBE_BIN the release build of this checkout (``target/release/probe``) is used.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = os.path.join(ROOT, "testdata", "config_check", "base.zip")
ODD = 37


def load() -> dict[str, Any]:
    with zipfile.ZipFile(BASE) as z:
        return {n: json.loads(z.read(n)) for n in z.namelist()}


def write_pack(path: str, docs: dict[str, Any], rank: int, world: int, job: str, odd: bool) -> None:
    d = json.loads(json.dumps(docs))
    d["manifest.json"].update(rank=rank, world_size=world)
    env = d["env.json"]["vars"]
    env.update(RANK=str(rank), LOCAL_RANK=str(rank % 8), WORLD_SIZE=str(world))
    env["TORCHELASTIC_RUN_ID"] = job
    for name in ("dataset.json", "weights.json"):
        for r in d[name]["records"]:
            r["rank"] = rank
    if odd:
        env["NCCL_ALGO"] = "Ring"
        d["packages.json"]["distributions"]["numpy"] = "9.9.9"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, doc in sorted(d.items()):
            z.writestr(name, json.dumps(doc, indent=1, sort_keys=True))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    probe = os.environ.get("PROBE_BIN") or os.path.join(ROOT, "target", "release", "probe")
    docs = load()
    with tempfile.TemporaryDirectory() as tmp:
        for side in ("bench", "cmp"):
            os.makedirs(os.path.join(tmp, side))
            for r in range(a.ranks):
                odd = side == "cmp" and r == ODD % a.ranks
                write_pack(os.path.join(tmp, side, f"rank{r}.zip"), docs, r, a.ranks, side, odd)
        size = sum(
            os.path.getsize(os.path.join(tmp, "cmp", f))
            for f in os.listdir(os.path.join(tmp, "cmp"))
        )
        times = []
        for i in range(a.runs):
            out = os.path.join(tmp, f"out{i}")
            cmd = [
                probe,
                "config-check",
                os.path.join(tmp, "bench"),
                os.path.join(tmp, "cmp"),
                "-o",
                out,
                "-q",
            ]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            times.append(time.perf_counter() - t0)
            if proc.returncode != 1:
                print(proc.stdout, proc.stderr, file=sys.stderr)
                return 2
        rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        with open(os.path.join(tmp, "out0", "config_check.json")) as f:
            result = json.load(f)
        headline = result["ranks"]["headline"][0]
    print(
        f"config-check, {a.ranks} packs a side ({size / a.ranks / 1024:.0f} KiB each): "
        f"median {statistics.median(times):.2f} s of {a.runs} (min {min(times):.2f}), "
        f"peak RSS {rss_mb:.0f} MB, {os.cpu_count()} CPUs"
    )
    print(f"  headline: {headline}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
