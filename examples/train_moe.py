#!/usr/bin/env python3
"""An expert-parallel mixture-of-experts layer (gloo, CPU), dumped with probe on every rank
(``DUMP/step<S>/rank<R>/``). Launch with torchrun:

    python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        examples/train_moe.py --dump /tmp/moe_bench
    python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        examples/train_moe.py --dump /tmp/moe_cmp --port scaled-expert --port-rank 1
    probe compare -b /tmp/moe_bench -c /tmp/moe_cmp -o /tmp/out

Each rank holds ``--experts`` experts of its own (expert parallelism, as DeepSeek-style and
Mixtral-style models are trained) and a replica of the router and the dense layers. Each
token goes to its top-1 expert: the tokens are sorted by expert, sent to the experts' ranks
with an ``all_to_all_single`` (the split sizes first, with one of their own), run through the
expert, sent back with a second ``all_to_all_single``, and put back in token order by index
into ``torch.empty`` (``out[order] = y``). The token all-to-alls are an autograd function, as
Megatron-style layers write them: the backward sends the gradients back the same way.
The replicated parameters' gradients are averaged with an ``all_reduce`` each.

``--port`` changes what rank ``--port-rank`` runs, as a port that differs in one expert
would: ``scaled-expert`` scales its experts' outputs by ``1 + --port-rel`` with an extra
multiply (a call the other run does not make); ``tanh-gelu`` runs its experts' GELU
with ``approximate="tanh"`` (the same call with another argument); ``grouped`` applies its
experts in batched matmuls instead of calling each expert module (the same numbers). ``--dtype bfloat16`` runs
the forward under autocast, as a port to bfloat16 would.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import probe


class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with its backward, as Megatron-style MoE layers write it: the
    gradients go back the way the tokens came."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> Any:
        ctx.splits = (out_splits, in_splits)
        out = x.new_empty(sum(out_splits), *x.shape[1:])
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        out_splits, in_splits = ctx.splits
        back = grad.new_empty(sum(in_splits), *grad.shape[1:])
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits)
        return back, None, None


class Expert(nn.Module):
    """A feed-forward expert."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        if approximate == "none":
            return self.down(F.gelu(self.up(x)))
        return self.down(F.gelu(self.up(x), approximate=approximate))


class MoE(nn.Module):
    """Top-1 routing over ``world * local`` experts, ``local`` of them on this rank."""

    def __init__(self, dim: int, local: int, world: int, rank: int, seed: int) -> None:
        super().__init__()
        self.local, self.world = local, world
        self.router = nn.Linear(dim, local * world)
        # The experts differ across ranks and agree across runs.
        g = torch.random.fork_rng()
        with g:
            torch.manual_seed(seed + 1000 + rank)
            self.experts = nn.ModuleList(Expert(dim, 2 * dim) for _ in range(local))
        #: (what the port changes, on this rank): "scaled-expert" or "tanh-gelu".
        self.port: str = "none"
        self.port_rel = 0.05

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x)
        weight, expert = torch.softmax(logits, -1).max(-1)
        order = torch.argsort(expert, stable=True)
        counts = torch.bincount(expert, minlength=self.local * self.world)
        # How many tokens go to each expert of each rank, and come from each rank.
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts)
        send = counts.view(self.world, self.local).sum(1).tolist()
        recv = recv_counts.view(self.world, self.local).sum(1).tolist()
        tokens = x[order]
        arrived = AllToAll.apply(tokens, recv, send)
        # Arrived tokens are grouped by source rank, each group sorted by expert.
        outs = []
        start = 0
        per = recv_counts.view(self.world, self.local).tolist()
        approximate = "tanh" if self.port == "tanh-gelu" else "none"
        if self.port == "grouped":
            done = self.grouped(arrived, per)
        else:
            for src in range(self.world):
                for e in range(self.local):
                    n = per[src][e]
                    y = self.experts[e](arrived[start : start + n], approximate)
                    if self.port == "scaled-expert":
                        y = y * (1 + self.port_rel)
                    outs.append(y)
                    start += n
            done = torch.cat(outs)
        back = AllToAll.apply(done, send, recv)
        out = torch.empty_like(back)
        out[order] = back
        return out * weight.unsqueeze(-1)

    def grouped(self, arrived: torch.Tensor, per: list[list[int]]) -> torch.Tensor:
        """The experts applied in batched matmuls, each token with its expert's weights
        (as ``transformers``' ``batched_mm`` experts, and ports onto grouped kernels, do):
        the same numbers as the loop over expert modules, other calls."""
        eid = torch.cat(
            [
                torch.full((per[src][e],), e, dtype=torch.long)
                for src in range(self.world)
                for e in range(self.local)
            ]
        )
        up_w = torch.stack([x.up.weight for x in self.experts])[eid]
        up_b = torch.stack([x.up.bias for x in self.experts])[eid]
        down_w = torch.stack([x.down.weight for x in self.experts])[eid]
        down_b = torch.stack([x.down.bias for x in self.experts])[eid]
        h = torch.bmm(up_w, arrived.unsqueeze(-1)).squeeze(-1) + up_b
        return torch.bmm(down_w, F.gelu(h).unsqueeze(-1)).squeeze(-1) + down_b


class Net(nn.Module):
    def __init__(self, dim: int, local: int, world: int, rank: int, seed: int) -> None:
        super().__init__()
        self.inp = nn.Linear(dim, dim)
        self.moe = MoE(dim, local, world, rank, seed)
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.inp(x))
        return self.head(h + self.moe(h))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32, help="per rank")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--experts", type=int, default=2, help="per rank")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dump", default="./probe_dump")
    ap.add_argument("--level", choices=["api", "module", "mix"], default="api")
    ap.add_argument("--mode", choices=["statistics", "tensor", "checksum"], default="statistics")
    ap.add_argument(
        "--port", choices=["none", "scaled-expert", "tanh-gelu", "grouped"], default="none"
    )
    ap.add_argument("--port-rank", type=int, default=1)
    ap.add_argument("--port-rel", type=float, default=0.05)
    ap.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="bfloat16: the forward under autocast, as a port to bfloat16 runs it",
    )
    ap.add_argument(
        "--monitor",
        "--monitor-dir",
        dest="monitor",
        default=None,
        metavar="DIR",
        help="also record every step with probe.Monitor (DIR/rank<R>.arrows, docs/monitor.md); "
        "under torchrun write --monitor-dir (torchrun takes --monitor for its --monitor-interval)",
    )
    ap.add_argument("--no-dump", action="store_true", help="train without the agent")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(a.seed)  # the replicated layers agree across ranks
    model = Net(a.dim, a.experts, world, rank, a.seed)
    if rank == a.port_rank:
        model.moe.port, model.moe.port_rel = a.port, a.port_rel
    replicated = [p for n, p in model.named_parameters() if ".experts." not in n]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(a.seed + 1 + rank)
    dbg = None if a.no_dump else probe.Debugger(None, dump_path=a.dump, level=a.level, mode=a.mode)
    # The optimizer's step hooks read the gradients before the zero_grad() below.
    monitor = probe.Monitor(a.monitor, model, opt) if a.monitor else None
    for step in range(a.steps):
        x = torch.randn(a.tokens, a.dim, generator=g)
        target = torch.randn(a.tokens, 1, generator=g)
        if dbg is not None:
            dbg.start(model)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bfloat16"):
            out = model(x)
        loss = F.mse_loss(out.float(), target)
        loss.backward()
        for p in replicated:
            assert p.grad is not None
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        opt.zero_grad()
        if monitor is not None:
            monitor.step(loss)
        if dbg is not None:
            dbg.stop()
            dbg.step()
        if not a.quiet:
            print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)
    if monitor is not None:
        monitor.close()
    if dbg is not None:
        dbg.close()
    dist.destroy_process_group()
    sys.stdout.flush()
    # PyTorch's gloo teardown at interpreter exit aborts now and then after a job whose
    # backward ran collectives ("terminate called without an active exception", 2 runs of
    # 8 here): everything is written and closed, so leave without it.
    os._exit(0)


if __name__ == "__main__":
    main()
