#!/usr/bin/env python3
"""The monitor's cost (issue 49's goals), measured in one run:

- step time monitored / bare, on the example model (examples/train_small.py's) and on a
  4-layer transformer, batch 8, on CPU: blocks of bare and monitored steps alternate in one
  process (the same warm caches and threads), the median block of each is compared. Goal:
  at most 1.03.
- disk: 10,000 steps x 200 modules written by the monitor's own writer (fake values), in MB.
  Goal: at most 200 MB per rank.

    PYTHONPATH=python python bench/monitor_bench.py [--blocks 7] [--steps 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import probe  # noqa: E402
from probe.monitor import arrow_ipc  # noqa: E402


def transformer() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True)
    model = nn.Sequential(
        nn.TransformerEncoder(layer, 4, enable_nested_tensor=False), nn.Linear(128, 16)
    )
    x = torch.randn(8, 64, 128)
    y = torch.randint(0, 16, (8 * 64,))
    return model, lambda: F.cross_entropy(model(x).reshape(-1, 16), y)


def example() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    import train_small  # type: ignore[import-not-found]

    torch.manual_seed(0)
    model = train_small.SmallNet()
    x = torch.randn(8, 3, 32, 32)
    y = torch.randint(0, 10, (8,))
    return model, lambda: F.cross_entropy(model(x), y)


def ratio(
    make: Callable[[], tuple[nn.Module, Callable[[], torch.Tensor]]], blocks: int, steps: int
) -> float:
    model, loss_of = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def block(mon: Optional[probe.Monitor]) -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = loss_of()
            loss.backward()
            opt.step()
            opt.zero_grad()
            if mon is not None:
                mon.step(loss)
        return time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as d:
        block(None)  # warm up
        bare, watched = [], []
        for _ in range(blocks):
            bare.append(block(None))
            mon = probe.Monitor(d, model, opt)
            watched.append(block(mon))
            mon.close()
    return statistics.median(watched) / statistics.median(bare)


def disk_mb(steps: int = 10_000, modules: int = 200) -> float:
    names = [""] + [f"model.layers.{i // 10}.mlp.proj_{i % 10}" for i in range(modules - 1)]
    cols = [
        arrow_ipc.Column("step", "int32", nullable=False),
        arrow_ipc.Column("module", "dict_utf8", nullable=False),
        arrow_ipc.Column("order", "int32"),
        arrow_ipc.Column("loss", "float64"),
        arrow_ipc.Column("loss_scale", "float64"),
        arrow_ipc.Column("lr", "float64"),
    ] + [
        arrow_ipc.Column(m, "float32")
        for m in (
            "output_norm",
            "output_nonfinite",
            "grad_norm",
            "grad_nonfinite",
            "param_norm",
            "update_norm",
            "state_exp_avg_norm",
            "state_exp_avg_sq_norm",
        )
    ]
    rng = np.random.default_rng(0)
    root = np.zeros(modules, dtype=bool)
    root[0] = True
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "rank0.arrows")
        with open(path, "wb") as f:
            f.write(arrow_ipc.schema_message(cols, {"probe.monitor": "{}"}))
            f.write(arrow_ipc.dictionary_message(names))
            for s in range(steps):
                data = [
                    (np.full(modules, s, dtype=np.int32), None),
                    (np.arange(modules, dtype=np.int32), None),
                    (np.arange(modules, dtype=np.int32), None),
                    (np.full(modules, 2.0), root),
                    (np.full(modules, 65536.0), root),
                    (np.full(modules, 1e-4), root),
                ] + [(rng.random(modules, dtype=np.float32), None) for _ in range(8)]
                f.write(arrow_ipc.record_batch_message(cols, data))
        return os.path.getsize(path) / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--blocks", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    for name, make in (("example model", example), ("4-layer transformer", transformer)):
        print(
            f"monitor / bare step time, {name}, batch 8, CPU: {ratio(make, a.blocks, a.steps):.3f}x (goal <= 1.03)"
        )
    print(f"disk, 10,000 steps x 200 modules: {disk_mb():.0f} MB per rank (goal <= 200)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
