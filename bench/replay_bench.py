#!/usr/bin/env python3
"""Wall time of one ``probe replay`` run, start-up included (the binary finds the Python,
which replays), on an op whose inputs are 64 MB, on the CPU (issue 50's goal: at most 3 s);
without a ``probe`` binary (``$PROBE_BIN``, or a cargo build of this checkout), of
``python -m probe.replay`` alone.

Why a synthetic dump: the figure is about reading 64 MB of inputs from a shard and running
the call three ways (float64 reference, CPU same-dtype envelope, the device), not about any
model; the dump is written by probe's own agent (tensor mode), one ``F.gelu`` call on a
float32 tensor of 16 Mi elements.

    PYTHONPATH=python python bench/replay_bench.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

GOAL_S = 3.0

DUMP = """
import sys, torch, torch.nn.functional as F, probe
dbg = probe.Debugger(None, dump_path=sys.argv[1], level="api", mode="tensor")
x = torch.randn(4096, 4096, generator=torch.Generator().manual_seed(0))  # 64 MiB of float32
dbg.start()
with torch.no_grad():
    F.gelu(x)
dbg.stop(); dbg.step(); dbg.close()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.path.join(here, "python"))
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "dump")
        subprocess.run([sys.executable, "-c", DUMP, dump], check=True, env=env)
        binary = probe_binary(here)
        if binary:
            cmd = [binary, "replay", "--python", sys.executable]
        else:
            cmd = [sys.executable, "-m", "probe.replay"]
        cmd += ["-b", dump, "-c", dump, "--op", "Functional.gelu.0.forward"]
        times = []
        for k in range(args.repeat):
            t = time.perf_counter()
            out = ["-o", os.path.join(tmp, f"out{k}")]
            r = subprocess.run(cmd + out, env=env, capture_output=True, text=True)
            times.append(time.perf_counter() - t)
            if r.returncode != 0:
                print(r.stdout + r.stderr, file=sys.stderr)
                return 1
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True, env=env)
        torch_s = time.perf_counter() - start
    best = min(times)
    what = "probe replay" if binary else "python -m probe.replay"
    print(f"{what} of one op, 64 MiB of inputs, CPU: best {best:.2f} s of {args.repeat}")
    print(
        f"(runs: {', '.join(f'{t:.2f}' for t in times)} s; `import torch` alone: {torch_s:.2f} s)"
    )
    print(f"ratio to the {GOAL_S:.0f} s goal: {best / GOAL_S:.2f}")
    return 0


def probe_binary(repo: str) -> str:
    """$PROBE_BIN, else this checkout's release or debug build, else ""."""
    found = os.environ.get("PROBE_BIN", "")
    for rel in ("target/release/probe", "target/debug/probe"):
        path = os.path.join(repo, rel)
        if not found and os.access(path, os.X_OK):
            found = path
    return found


if __name__ == "__main__":
    sys.exit(main())
