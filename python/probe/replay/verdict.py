"""Judging a replay: which outputs this device's kernel gets wrong, and what that proves.

Why these rules (docs/replay.md, "The verdict"): a replay runs the op on the benchmark's
recorded inputs three ways: in float64 on the CPU (the reference, with the callables as
they were before the prelude), with the CPU's own kernel in the comparison side's dtypes
(what a correct kernel's rounding costs on these very inputs: the *envelope*), and on
``--device`` after the prelude (the kernel under test). An output's tolerance is

    max(floor[dtype], K * max(benchmark recorded vs fp64, CPU same-dtype vs fp64))

with the floor compare's per-dtype warning threshold (or ``--rtol``): a kernel is off when
it is several times further from the exact answer than both the benchmark's device and a
correct kernel of the same precision. So a GPU whose float32 convolution uses TF32 is not
"off" when the benchmark ran on that GPU too, and bfloat16 rounding is never a fault.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .kernel import error

#: How many times the envelope a replayed error must exceed to count as the kernel's.
K = 4.0
#: Per dtype, the smallest tolerance (relative L2 vs float64): compare's warning thresholds
#: (docs/compare.md, "Verdict per tensor"); integers and bools must be exact.
FLOOR = {"float64": 1e-10, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}

REPRODUCES = "reproduces"
DOES_NOT_REPRODUCE = "does_not_reproduce"
WITHIN = "within_tolerance"
CANNOT = "cannot_replay"

Err = Optional[dict[str, float]]


@dataclass
class OutputJudgement:
    """One output: its errors (relative L2 and max abs) and whether the kernel is off."""

    slot: str
    dtype: str
    shape: list[int]
    tolerance: float
    bench: Err
    cmp: Err
    replayed: Err
    replayed_vs_cmp: Err
    envelope: Err
    off: bool
    cmp_off: bool


@dataclass
class Judgement:
    """An op's verdict and the outputs it rests on."""

    verdict: str
    outputs: list[OutputJudgement] = field(default_factory=list)
    inputs_differ: list[tuple[str, float]] = field(default_factory=list)


def tolerance(dtype: str, bench: Err, envelope: Err, rtol: Optional[float]) -> float:
    """The rule of the module docstring for one output."""
    if dtype not in FLOOR and rtol is None:
        return 0.0
    floor = rtol if rtol is not None else FLOOR[dtype]
    seen = [e["rel_l2"] for e in (bench, envelope) if e is not None and math.isfinite(e["rel_l2"])]
    return max([floor] + [K * s for s in seen])


def _err(got: Optional[torch.Tensor], ref: Optional[torch.Tensor], atol: float) -> Err:
    return None if got is None or ref is None else error(got, ref, atol)


def judge_output(
    slot: str,
    ref: torch.Tensor,
    got: torch.Tensor,
    recorded: dict[str, Optional[torch.Tensor]],
    dtype: str,
    limits: tuple[Optional[float], float],
) -> OutputJudgement:
    """One output: ``recorded`` holds the benchmark's, the comparison's and the CPU
    same-dtype (envelope) results (each may be None); ``limits`` is (rtol, atol)."""
    rtol, atol = limits
    bench = _err(recorded["bench"], ref, atol)
    env = _err(recorded["envelope"], ref, atol)
    cmp = _err(recorded["cmp"], ref, atol)
    tol = tolerance(dtype, bench, env, rtol)
    replayed = error(got, ref, atol)
    return OutputJudgement(
        slot=slot,
        dtype=dtype,
        shape=list(got.shape),
        tolerance=tol,
        bench=bench,
        cmp=cmp,
        replayed=replayed,
        replayed_vs_cmp=_err(got, recorded["cmp"], atol),
        envelope=env,
        off=not replayed["rel_l2"] <= tol,
        cmp_off=cmp is not None and not cmp["rel_l2"] <= tol,
    )


def verdict(outputs: list[OutputJudgement]) -> str:
    """Reproduces when the replayed kernel is off on an output; does not reproduce when it
    is not but the comparison run's recorded output is; else within tolerance."""
    if any(o.off for o in outputs):
        return REPRODUCES
    if any(o.cmp_off for o in outputs):
        return DOES_NOT_REPRODUCE
    return WITHIN


def inputs_differ(
    bench: dict[str, torch.Tensor], cmp: dict[str, torch.Tensor]
) -> list[tuple[str, float]]:
    """The inputs the comparison run recorded other values for than the benchmark's, with
    their relative L2 difference (dtypes aside: a bf16 copy of the same values differs by
    its rounding, which is reported too)."""
    out = []
    for slot in sorted(bench):
        other = cmp.get(slot)
        if other is None:
            continue
        if other.dtype == bench[slot].dtype and torch.equal(other, bench[slot]):
            continue
        out.append((slot, error(other, bench[slot])["rel_l2"]))
    return out


def as_json(e: Err) -> Any:
    """An error for replay.json: non-finite numbers as strings (docs/format.md)."""
    if e is None:
        return None
    return {k: v if math.isfinite(v) else str(v) for k, v in e.items()}
