#!/usr/bin/env python3
"""Wall time of one ``python -m probe.replay`` run, start-up included, on an op whose inputs
are 64 MB, on the CPU (issue 50's goal: at most 3 s).

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
        cmd = [sys.executable, "-m", "probe.replay", "-b", dump, "-c", dump]
        cmd += ["--op", "Functional.gelu.0.forward", "-o", os.path.join(tmp, "out")]
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            times.append(time.perf_counter() - t)
            if r.returncode != 0:
                print(r.stdout + r.stderr, file=sys.stderr)
                return 1
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True, env=env)
        torch_s = time.perf_counter() - start
    best = min(times)
    print(f"replay of one op, 64 MiB of inputs, CPU: best {best:.2f} s of {args.repeat}")
    print(
        f"(runs: {', '.join(f'{t:.2f}' for t in times)} s; `import torch` alone: {torch_s:.2f} s)"
    )
    print(f"ratio to the {GOAL_S:.0f} s goal: {best / GOAL_S:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
