"""Replaying a collective from every rank's recorded inputs (docs/replay.md, "Collectives").

Why: a collective's result is other ranks' data, which one process cannot rerun, but an
all-reduce's result is a plain reduction of the inputs the ranks recorded, and the dumps
hold every rank's. So the replay stacks the benchmark ranks' inputs and reduces them (the
reduction the benchmark's own output shows: sum, mean, max, min or product), and the
verdict reads as for any op: this device's reduction of the benchmark's inputs against
float64. Where the comparison run's output differs while this reduction does not, the
difference came from outside the arithmetic; the notes say where: a rank whose recorded
input differs from the benchmark's (the divergence entered there), or a comparison output
that is no reduction of its own ranks' inputs (the communication itself, or a rank's
buffer).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Optional

import torch

from .dump import RankDir, load_tensors
from .spec import CannotReplay
from .text import printable

#: The collectives replayed: the API after ``Distributed.`` -> whether every rank's output
#: is the reduction of every rank's input (all-reduce) or only the destination's.
REDUCTIONS = {"all_reduce": True, "ddp_bucket_allreduce": True}

#: The reductions tried against the benchmark's own output, in this order of preference.
OPS = {
    "sum": "torch.sum",
    "mean": "torch.mean",
    "max": "torch.amax",
    "min": "torch.amin",
    "product": "torch.prod",
}

#: How close (relative L2, float64) the benchmark's output must be to a reduction of its
#: ranks' inputs for that reduction to be the one the call ran.
MATCH = 1e-2


def is_collective(prefix: str) -> bool:
    return prefix == "Distributed"


def peer_inputs(rank: RankDir, api: str, rec: dict[str, Any]) -> list[torch.Tensor]:
    """``input.0`` of the same collective on every rank of its group, in group order: the
    record of each peer's folder (``rank<R>`` beside this one) with the same API, group and
    ``coll_seq``."""
    group, seq = rec.get("group"), rec.get("coll_seq")
    if not isinstance(group, list) or not isinstance(seq, int):
        raise CannotReplay("a collective recorded without its process group: not replayable")
    _check_group(group, rank.manifest)
    step = os.path.dirname(rank.path)
    out = []
    for r in group:
        folder = RankDir(os.path.join(step, f"rank{r}"), rank.step, r, rank.manifest)
        peer = _find(folder, api, group, seq)
        if peer is None:
            raise CannotReplay(
                f"rank {r}'s record of this collective is not in {step}: its reduction needs"
                " every rank's input (dump every rank of the group)"
            )
        t = load_tensors(folder, peer).get("input.0")
        if t is None:
            raise CannotReplay(f"rank {r} recorded no data of its input to this collective")
        out.append(t)
    return out


#: Past this many ranks a group without a manifest's world size is not believed (as the
#: compare's job list, src/compare/run.rs).
MAX_RANKS = 1 << 20


def _check_group(group: list[Any], manifest: Optional[dict[str, Any]]) -> None:
    """The group's members name the peers' folders (``rank<R>``), so each must be a rank of
    the job: a whole number below the manifest's world size, each once. Anything else (a
    string such as ``../x``, a negative or huge number) is the dump's error, never a path."""
    world = (manifest or {}).get("world_size")
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        world = MAX_RANKS
    for r in group:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < world:
            raise CannotReplay(
                f"the collective's group names {printable(repr(r))[:40]}, not a rank of the job"
                f" (0 to {world - 1}): not replayable"
            )
    if len(set(group)) != len(group):
        raise CannotReplay("the collective's group names a rank twice: not replayable")


def _find(rank: RankDir, api: str, group: list[Any], seq: int) -> Optional[dict[str, Any]]:
    path = os.path.join(rank.path, "ops.jsonl")
    if not os.path.isfile(path):
        return None
    needle = f'"Distributed.{api}.'
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if needle not in line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a crashed run's last line
            if (
                isinstance(rec, dict)
                and str(rec.get("op", "")).startswith(needle[1:])
                and str(rec.get("op", "")).endswith(".forward")
                and rec.get("group") == group
                and rec.get("coll_seq") == seq
            ):
                return rec
    return None


def reduction(inputs: torch.Tensor, output: torch.Tensor) -> str:
    """The reduction (a key of :data:`OPS`) whose float64 result over the stacked inputs is
    the recorded output; CannotReplay when none is."""
    ref = output.to(torch.float64)
    den = float(torch.linalg.vector_norm(ref)) or 1.0
    best, err = "", math.inf
    for name, path in OPS.items():
        fn = getattr(torch, path.split(".", 1)[1])
        got = fn(inputs.to(torch.float64), dim=0)
        e = float(torch.linalg.vector_norm(got - ref)) / den
        if e < err:
            best, err = name, e
    if not err <= MATCH:
        raise CannotReplay(
            "the benchmark's output of this collective is no sum, mean, max, min or product"
            f" of its ranks' recorded inputs (closest: {best}, off by {err:.2e})"
        )
    return best


def spec(key: str, op: str, dtype: str) -> dict[str, Any]:
    """The call a collective's replay runs: the reduction over the stacked inputs."""
    return {
        "op": key,
        "target": {"kind": "api", "path": OPS[op]},
        "args": [{"tensor": "input.0"}],
        "kwargs": {"dim": 0},
        "backward": False,
        "grads": {},
        "inplace": False,
        "dtypes": {"input.0": dtype},
        "needs": [],
    }


def notes(
    op: str,
    bench: list[torch.Tensor],
    cmp: Optional[list[torch.Tensor]],
    cmp_out: Optional[torch.Tensor],
    group: list[Any],
) -> tuple[list[str], list[str]]:
    """Where a difference of the comparison run's output came from: (every finding, the
    findings that are differences): the ranks whose input differs from the benchmark's,
    and whether that output is the reduction of its own ranks' inputs."""
    if cmp is None:
        return ["the comparison dump lacks a rank's input to this collective"], []
    found, differ = [], []
    for r, (b, c) in zip(group, zip(bench, cmp)):
        if b.shape != c.shape or not torch.equal(b.to(c.dtype), c):
            differ.append(f"rank {r}'s input differs from the benchmark's by {_rel(c, b):.2e}")
    if cmp_out is not None:
        fn = getattr(torch, OPS[op].split(".", 1)[1])
        e = _rel(cmp_out, fn(torch.stack(cmp).to(torch.float64), dim=0))
        if e <= MATCH:
            found.append(f"the comparison run's output is the {op} of its ranks' inputs ({e:.2e})")
        else:
            differ.append(
                f"the comparison run's output is not the {op} of its ranks' recorded inputs"
                f" (off by {e:.2e}): the collective itself (the communication, or a rank's buffer)"
            )
    return found + differ, differ


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return math.inf
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    den = float(torch.linalg.vector_norm(b64))
    num = float(torch.linalg.vector_norm(a64 - b64))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)
