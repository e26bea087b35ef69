#!/usr/bin/env python3
"""What probe.Monitor costs: step time on the CPU, and disk per step (issue 49).

Why this shape: the monitor is meant to stay on for a whole run, so its cost is a ratio of
step times (goal: at most 1.03x) and a file size (goal: 10,000 steps x 200 modules in at
most 200 MB). Step times drift on a shared machine, so bare and monitored blocks of steps
alternate in one process (two copies of the same model, same data; by default blocks of one
step, 150 of each) and the ratio reported is that of the median block times: wall-clock,
and CPU time (the process's, one thread), which does not count the time another job on the
machine takes; a median of many short blocks ignores the blocks another job interrupted.

    PYTHONPATH=python python bench/monitor_bench.py [--blocks 150] [--block-steps 1]

Models: examples/train_small.py's SmallNet, and a 4-layer LLaMA from transformers (random
init, nothing downloaded; skipped without transformers), batch 8, Adam, one thread.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import probe  # noqa: E402
from probe.monitor.table import METRICS, MonitorFile, StepRows  # noqa: E402

Step = Callable[[torch.nn.Module, Any], torch.Tensor]


def small_net(device: torch.device) -> tuple[torch.nn.Module, Any, Step]:
    from train_small import SmallNet, make_data

    x, y = make_data(1, 8, device)[0]

    def loss(model: torch.nn.Module, _: Any) -> torch.Tensor:
        return F.cross_entropy(model(x), y)

    return SmallNet(), None, loss


def llama(device: torch.device) -> tuple[torch.nn.Module, Any, Step]:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=1000,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
    )
    ids = torch.randint(0, 1000, (8, 32), generator=torch.Generator().manual_seed(0)).to(device)

    def loss(model: torch.nn.Module, _: Any) -> torch.Tensor:
        return model(input_ids=ids, labels=ids).loss

    return LlamaForCausalLM(cfg), None, loss


def ratio(
    make: Callable[[torch.device], tuple[torch.nn.Module, Any, Step]],
    device: torch.device,
    blocks: int,
    steps: int,
    **kw: Any,
) -> tuple[float, float]:
    """(median monitored block time) / (median bare block time), the blocks alternating:
    wall-clock, and CPU time (on CUDA a block ends when the device is done). ``kw``: the
    Monitor's options."""
    torch.manual_seed(0)
    bare, _, loss_fn = make(device)
    bare = bare.to(device)
    watched = copy.deepcopy(bare)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    opts = {id(m): torch.optim.Adam(m.parameters(), lr=1e-4) for m in (bare, watched)}
    with tempfile.TemporaryDirectory() as d:
        mon = probe.Monitor(d, watched, opts[id(watched)], **kw)

        def block(model: torch.nn.Module, monitored: bool) -> tuple[float, float]:
            opt = opts[id(model)]
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(steps):
                loss = loss_fn(model, None)
                loss.backward()
                opt.step()
                opt.zero_grad()
                if monitored:
                    mon.step(loss)
            sync()
            return time.perf_counter() - t0, time.process_time() - c0

        for _ in range(3):  # warm-up
            block(bare, False), block(watched, True)
        bare_t, watched_t = [], []
        for _ in range(blocks):
            bare_t.append(block(bare, False))
            watched_t.append(block(watched, True))
        rows = len(mon.module_names)
        mon.close()
        floor_ms = floor(bare, opts[id(bare)], loss_fn, sync)
    wall, cpu = (
        statistics.median(t[k] for t in watched_t) / statistics.median(t[k] for t in bare_t)
        for k in (0, 1)
    )
    bare_wall, bare_cpu = (statistics.median(t[k] for t in bare_t) / steps * 1e3 for k in (0, 1))
    print(f"  {rows} monitored modules, bare step {bare_wall:.2f} ms wall, {bare_cpu:.2f} ms CPU")
    print(
        f"  floor: the reads every step's metrics need (one norm of each gradient, parameter "
        f"and state tensor; the update's copy, subtraction and norm) take {floor_ms:.3f} ms "
        f"= {floor_ms / bare_wall:.3f} of a bare step"
    )
    return wall, cpu


def floor(
    model: torch.nn.Module, opt: torch.optim.Optimizer, loss_fn: Step, sync: Callable[[], None]
) -> float:
    """The median wall time (ms) of the tensor work no monitor of these metrics can skip,
    with torch's own fused calls and nothing else (no hooks, no host side): what is left of
    the goal once it is paid."""
    params = [p for p in model.parameters()]
    buf = [torch.empty_like(p) for p in params]
    loss_fn(model, None).backward()
    grads = [p.grad for p in params if p.grad is not None]
    states = [v for p in params for v in opt.state[p].values() if v.shape == p.shape]
    times = []
    with torch.no_grad():
        for _ in range(30):
            sync()
            t0 = time.perf_counter()
            torch._foreach_norm(grads + params + states, 2, dtype=torch.float32)
            torch._foreach_copy_(buf, params)
            torch._foreach_sub_(buf, params)
            torch._foreach_norm(buf, 2, dtype=torch.float32)
            sync()
            times.append(time.perf_counter() - t0)
    opt.zero_grad()
    return statistics.median(times) * 1e3


def disk_mb(steps: int, modules: int) -> float:
    """Size of the real writer's file for ``steps`` x ``modules`` (fake values, Adam's two
    state columns)."""
    rng = np.random.default_rng(0)
    names = [""] + [f"layers.{i // 4}.m{i % 4}" for i in range(modules - 1)]
    every = np.ones(modules, dtype=bool)
    with tempfile.TemporaryDirectory() as d:
        f = MonitorFile(d, 0, names, "{}")
        f.start(["exp_avg", "exp_avg_sq"])
        for s in range(steps):
            metrics = {n: (rng.random(modules, dtype=np.float32), every) for n in METRICS}
            for key in ("exp_avg", "exp_avg_sq"):
                metrics[f"state_{key}_norm"] = (rng.random(modules, dtype=np.float32), every)
            order = np.arange(modules, dtype=np.int32)
            f.write([StepRows(s, order, {"loss": 1.0, "loss_scale": None, "lr": 1e-4}, metrics)])
        f.close()
        return os.path.getsize(f.path) / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--blocks", type=int, default=150)
    ap.add_argument("--block-steps", type=int, default=1)
    ap.add_argument("--disk-steps", type=int, default=10_000)
    ap.add_argument("--device", default="cpu", help="cpu (goal 1.03x) or cuda (goal 1.05x)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: the goal's)")
    ap.add_argument(
        "--no-update-norm", action="store_true", help="Monitor(update_norm=False): no copy"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    goal = "1.05x" if device.type == "cuda" else "1.03x"
    models: list[tuple[str, Callable[[torch.device], tuple[torch.nn.Module, Any, Step]]]] = [
        ("train_small SmallNet", small_net)
    ]
    try:
        import transformers  # noqa: F401

        models.append(("LLaMA 4 layers (transformers)", llama))
    except ImportError:
        print("(transformers not installed: the LLaMA model is skipped)")
    for name, make in models:
        print(f"{name}, batch 8, {device}, {args.threads} CPU thread(s):")
        kw = {"update_norm": False} if args.no_update_norm else {}
        r, c = ratio(make, device, args.blocks, args.block_steps, **kw)
        print(f"  monitored/bare step time: {r:.3f}x wall, {c:.3f}x CPU (goal <= {goal})")
    t0 = time.perf_counter()
    mb = disk_mb(args.disk_steps, 200)
    dt = time.perf_counter() - t0
    print(
        f"disk: {args.disk_steps} steps x 200 modules = {mb:.1f} MB (goal <= 200 MB), "
        f"written in {dt:.1f} s ({dt / args.disk_steps * 1e6:.0f} us/step)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
