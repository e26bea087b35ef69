#!/usr/bin/env python3
"""The example model of train_small.py under DistributedDataParallel (gloo, CPU), dumped
with probe on every rank (``DUMP/step<S>/rank<R>/``). Launch with torchrun:

    python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        examples/train_ddp.py --dump /tmp/ddp_bench --level mix
    python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        examples/train_ddp.py --dump /tmp/ddp_cmp --level mix --inject Functional.gelu.0 --inject-rank 1
    probe compare -b /tmp/ddp_bench -c /tmp/ddp_cmp -o /tmp/out

Each rank trains on its own slice of the batch. Every step, besides DDP's gradient
all-reduce (``Distributed.ddp_bucket_allreduce.<bucket>``), the loop makes a few explicit
collectives so that their records can be checked: an ``all_reduce`` of the loss (default
group), with 4+ ranks an ``all_reduce`` in a pair group ({0,1}, {2,3}, ...), a ring exchange
(``isend`` to the next rank, ``irecv`` from the previous) and a ``barrier``. ``--fsdp``
shards the model with FSDP2 instead of DDP: its parameter all-gathers and gradient
reduce-scatters are then ``Distributed.*`` calls.

``--inject OP --inject-rank R`` multiplies the output of OP (as train_small.py's ``--inject``)
on rank R only. ``--inject-collective NAME --inject-rank R`` multiplies the result of a
collective on rank R only, as a faulty communication library would: ``ddp_bucket_allreduce``
(every bucket; ``ddp_bucket_allreduce.0``: bucket 0) or ``all_reduce`` (the loss all-reduce).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from train_small import (  # noqa: E402
    Fault,
    SmallNet,
    make_data,
    mixed_precision,
    resolve_device,
    update,
)

import probe  # noqa: E402


def perturb_collective(spec: str, rel: float) -> None:
    """Make collective ``spec`` return a result multiplied by ``1 + rel`` on this rank."""
    name, _, index = spec.partition(".")
    which = int(index) if index.isdigit() else None
    if name == "ddp_bucket_allreduce":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        orig_hook = default_hooks.allreduce_hook

        def hook(state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
            fut = orig_hook(state, bucket)
            if which is not None and bucket.index() != which:
                return fut

            def bump(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
                out = f.value()
                out.mul_(1.0 + rel)
                return out

            return fut.then(bump)

        default_hooks.allreduce_hook = hook  # type: ignore[assignment]
    elif name == "all_reduce":
        orig = dist.all_reduce
        calls = {"n": 0}

        def all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            out = orig(tensor, *args, **kwargs)
            if tensor.dim() != 0:
                return out  # DDP's own bucket all-reduces: only the loss's is perturbed
            if which is None or calls["n"] == which:
                tensor.mul_(1.0 + rel)
            calls["n"] += 1
            return out

        dist.all_reduce = all_reduce
    else:
        raise SystemExit(
            f"--inject-collective: ddp_bucket_allreduce[.N] or all_reduce, not {spec!r}"
        )


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", choices=["cpu", "cuda", "npu"], default="cpu")
    ap.add_argument(
        "--backend",
        default="gloo",
        help="the process group's backend: gloo (CPU, and CUDA tensors with every rank on "
        "one GPU), nccl (a GPU per rank), hccl (an NPU per rank)",
    )
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8, help="per rank")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dump", default="./probe_dump")
    ap.add_argument("--no-dump", action="store_true")
    ap.add_argument(
        "--monitor",
        "--monitor-dir",
        dest="monitor",
        default=None,
        metavar="DIR",
        help="also record every step with probe.Monitor (DIR/rank<R>.arrows, docs/monitor.md); "
        "under torchrun write --monitor-dir (torchrun takes --monitor for its --monitor-interval)",
    )
    ap.add_argument("--level", choices=["api", "module", "mix"], default="mix")
    ap.add_argument("--mode", choices=["statistics", "tensor", "checksum"], default="statistics")
    ap.add_argument("--inject", default=None, help="op to perturb, e.g. Functional.gelu.0")
    ap.add_argument(
        "--inject-collective", default=None, help="ddp_bucket_allreduce[.N] | all_reduce"
    )
    ap.add_argument("--inject-rank", type=int, default=0, help="the rank that is perturbed")
    ap.add_argument("--inject-rel", type=float, default=0.05)
    ap.add_argument(
        "--inject-from-step",
        type=int,
        default=0,
        metavar="N",
        help="--inject acts from step N on (a fault that appears late: docs/monitor.md)",
    )
    ap.add_argument(
        "--bucket-cap-mb",
        type=float,
        default=0.05,
        help="DDP bucket size (small: several buckets from step 1 on, once DDP rebuilt them)",
    )
    ap.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default="float32",
        help="bfloat16 runs forward under autocast; float16 too, with AMP's GradScaler",
    )
    ap.add_argument(
        "--optimizer",
        choices=["loop", "foreach", "fused"],
        default="loop",
        help="Adam per parameter (loop), multi-tensor (foreach, PyTorch's default on GPUs: "
        "its _foreach_ ops are hooked) or one fused kernel (fused: not hooked, so the update "
        "is not in the dump)",
    )
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument(
        "--compile",
        default=None,
        metavar="BACKEND",
        help="torch.compile the DDP model with this backend (inductor, aot_eager): DDP's "
        "compiler splits the graph at its gradient buckets, and the agent records the calls "
        "inside the compiled graphs (docs/capture.md)",
    )
    ap.add_argument(
        "--dump-ranks",
        default=None,
        help="the ranks to dump, e.g. 0,1 (the config's ranks; default: every rank)",
    )
    ap.add_argument(
        "--no-collectives",
        action="store_true",
        help="capture everything but Distributed.* records (bench/distributed_capture.sh)",
    )
    ap.add_argument(
        "--time", action="store_true", help="rank 0 prints the mean step time after step 0"
    )
    ap.add_argument(
        "--fsdp",
        action="store_true",
        help="shard the model with FSDP2 (fully_shard, PyTorch >= 2.6) instead of DDP: its "
        "all-gathers and reduce-scatters are recorded as Distributed.* calls",
    )
    args = ap.parse_args(argv)

    device = resolve_device(args.device)
    if device.type != "cpu":
        # A device per local rank (nccl, hccl); with gloo every rank shares the first.
        backend_mod: Any = torch.cuda if device.type == "cuda" else torch.npu
        local = int(os.environ.get("LOCAL_RANK", "0"))
        index = 0 if args.backend == "gloo" else local % backend_mod.device_count()
        device = torch.device(device.type, index)
        backend_mod.set_device(device)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    # Pair groups ({0,1}, {2,3}, ...): every rank creates every group, in the same order.
    pairs = [dist.new_group([r, r + 1]) for r in range(0, world - 1, 2)] if world >= 4 else []
    my_pair = pairs[rank // 2] if rank // 2 < len(pairs) else None

    probe.seed_all(args.seed)
    # The buckets DDP rebuilds after step 0 take --bucket-cap-mb in recent torch; torch 2.1
    # gives the first of them its module default (1 MiB: the whole model) unless that is set.
    cap = int(args.bucket_cap_mb * 1024 * 1024)
    dist._DEFAULT_FIRST_BUCKET_BYTES = min(dist._DEFAULT_FIRST_BUCKET_BYTES, cap)  # type: ignore[attr-defined]
    model: torch.nn.Module
    if args.fsdp:
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            print("train_ddp.py: --fsdp needs PyTorch >= 2.6 (fully_shard)", file=sys.stderr)
            return 2
        model = SmallNet().to(device)
        for sub in model.children():
            if any(True for _ in sub.parameters()):
                fully_shard(sub)
        fully_shard(model)
    else:
        model = DistributedDataParallel(SmallNet().to(device), bucket_cap_mb=args.bucket_cap_mb)
    run: Any = torch.compile(model, backend=args.compile) if args.compile else model
    opt = torch.optim.Adam(
        model.parameters(),
        lr=1e-3,
        foreach=args.optimizer == "foreach",
        fused=args.optimizer == "fused" or None,
    )
    data = [
        (
            x[rank * args.batch : (rank + 1) * args.batch],
            y[rank * args.batch : (rank + 1) * args.batch],
        )
        for x, y in make_data(args.steps, args.batch * world, device)
    ]
    faults = []
    if rank == args.inject_rank:
        if args.inject:
            faults.append(Fault(args.inject, args.inject_rel))
        if args.inject_collective:
            perturb_collective(args.inject_collective, args.inject_rel)

    dbg = (
        None
        if args.no_dump
        else probe.Debugger(
            None,
            dump_path=args.dump,
            level=args.level,
            mode=args.mode,
            **({"exclude": ["Distributed.*"]} if args.no_collectives else {}),
            **({"ranks": [int(r) for r in args.dump_ranks.split(",")]} if args.dump_ranks else {}),
        )
    )
    amp, scaler = mixed_precision(args.dtype, device)
    monitor = probe.Monitor(args.monitor, model, opt, scaler=scaler) if args.monitor else None
    t0 = 0.0
    for step, (x, y) in enumerate(data):
        if step == 1:
            t0 = time.perf_counter()
        for fault in faults:
            fault.new_step(active=step >= args.inject_from_step)
        if dbg is not None:
            dbg.start(model)
        opt.zero_grad(set_to_none=True)
        with amp:
            loss = F.cross_entropy(run(x), y)
        update(loss, opt, scaler)
        if monitor is not None:
            monitor.step(loss)
        with torch.no_grad():
            total = loss.detach().clone()
            dist.all_reduce(total)
            if my_pair is not None:
                dist.all_reduce(loss.detach().clone(), group=my_pair)
            # (gloo sends host memory only)
            p2p = torch.device("cpu") if args.backend == "gloo" else device
            got = torch.zeros(1, device=p2p)
            reqs = [
                dist.isend(loss.detach().reshape(1).to(p2p), (rank + 1) % world),
                dist.irecv(got, (rank - 1) % world),
            ]
            for r in reqs:
                r.wait()
        dist.barrier()
        if dbg is not None:
            dbg.stop()
            dbg.step()
        if not args.quiet and rank == 0:
            print(f"step {step}: mean loss {total.item() / world:.6f}")
    if args.time and rank == 0 and len(data) > 1:
        ms = (time.perf_counter() - t0) * 1e3 / (len(data) - 1)
        print(f"ms/step {ms:.2f}")
    if monitor is not None:
        monitor.close()
    if dbg is not None:
        dbg.close()
    # Every rank done with its files before any closes its connections: a rank whose peer
    # had already torn its gloo pairs down was seen to abort at exit on a loaded machine
    # ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
