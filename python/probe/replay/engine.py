"""Running the replays: references first, then the prelude, then the kernel under test.

Why this order: the prelude replaces kernels process-wide (that is how a patched or faulty
kernel is installed, and how the tests model one), so the float64 reference and the CPU
same-dtype envelope of every op are computed before it runs, with the callables as PyTorch
shipped them; only a callable that does not exist before the prelude (a custom op it
registers) has its reference computed after it, which replay.json says
(``reference: "after_prelude"``). Every run gets its own copies of the inputs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from . import allowed, kernel
from .dump import InputError
from .plan import OpPlan
from .verdict import CANNOT, Judgement, inputs_differ, judge_output, verdict


@dataclass
class OpResult:
    """One op's outcome: its verdict, or why it could not be replayed."""

    plan: OpPlan
    verdict: str
    reason: Optional[str] = None
    judgement: Optional[Judgement] = None
    reference: str = "before_prelude"


Results = dict[str, torch.Tensor]


def _attempt(
    spec: dict[str, Any], tensors: Results, device: str, dtypes: Optional[dict[str, str]]
) -> tuple[Optional[Results], Optional[str]]:
    """``kernel.run`` of the callable the allow-list resolves, or why it failed (one line)."""
    try:
        return kernel.run(spec, tensors, device, dtypes, allowed.resolve), None
    except Exception as exc:  # noqa: BLE001 - any failure of the op is this op's reason
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _missing_callable(spec: dict[str, Any]) -> bool:
    """Whether the callable exists only after the prelude; an InputError when the spec names
    no operator a replay may run (the plan refuses those first: this is the second guard)."""
    try:
        for module in spec.get("needs", []):
            importlib.import_module(module)
        allowed.resolve(spec["target"])
    except (ImportError, AttributeError):
        return True
    except allowed.NotAnOperator as e:
        raise InputError(f"op {spec['op']}: {e}") from None
    return False


def check_device(device: str) -> None:
    """An InputError when ``device`` does not exist here (after the prelude)."""
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise InputError(f"--device {device}: {e}") from None
    if dev.type == "npu":
        try:
            importlib.import_module("torch_npu")
        except ImportError as e:
            raise InputError(f"--device npu: torch_npu is not importable here ({e})") from None
    mod = getattr(torch, dev.type, None)
    if dev.type != "cpu" and not (mod is not None and mod.is_available()):
        raise InputError(f"--device {device}: no such device on this machine")


def run_all(
    plans: list[OpPlan],
    device: str,
    prelude: Optional[str],
    limits: tuple[Optional[float], float],
    say: Callable[[str], None],
) -> list[OpResult]:
    """Replay every plan; ``limits`` is (rtol, atol)."""
    results = {p.key: OpResult(p, CANNOT, p.reason) for p in plans}
    refs: dict[str, Optional[Results]] = {}
    envs: dict[str, Optional[Results]] = {}
    for p in plans:
        if p.spec is None:
            continue
        if _missing_callable(p.spec):
            results[p.key].reference = "after_prelude"
            continue
        say(f"reference: {p.key} in float64 on cpu")
        refs[p.key], why = _attempt(p.spec, p.tensors, "cpu", None)
        envs[p.key] = _attempt(p.spec, p.tensors, "cpu", p.spec["dtypes"])[0]
        if why:
            results[p.key].reason = f"the float64 reference on the CPU failed: {why}"
    _prelude(prelude, say)
    check_device(device)
    for p in plans:
        res = results[p.key]
        if p.spec is None or res.reason:
            continue
        if p.key not in refs:
            refs[p.key], res.reason = _attempt(p.spec, p.tensors, "cpu", None)
            envs[p.key] = None
            if res.reason:
                continue
        say(f"replay: {p.key} on {device}")
        if not prelude and torch.device(device).type == "cpu" and envs.get(p.key) is not None:
            got, why = envs[p.key], None  # the same call as the envelope's: run once
        else:
            got, why = _attempt(p.spec, p.tensors, device, p.spec["dtypes"])
        if got is None:
            res.reason = f"the call failed on {device}: {why}"
            continue
        env = envs.get(p.key)
        _judge(res, refs[p.key] or {}, got, env or {}, limits)
    return [results[p.key] for p in plans]


def _prelude(prelude: Optional[str], say: Callable[[str], None]) -> None:
    if not prelude:
        return
    say(f"prelude: {prelude}")
    try:
        kernel.run_prelude(prelude)
    except Exception as exc:  # noqa: BLE001 - the user's file: one line, exit 2
        raise InputError(f"--prelude {prelude} failed: {type(exc).__name__}: {exc}") from None


def _judge(
    res: OpResult,
    ref: dict[str, torch.Tensor],
    got: dict[str, torch.Tensor],
    env: dict[str, torch.Tensor],
    limits: tuple[Optional[float], float],
) -> None:
    p = res.plan
    assert p.spec is not None
    for slot, t in p.bench_out.items():
        if slot in got and got[slot].shape != t.shape:
            res.reason = _shape_reason(slot, got[slot], t, p.assumed_none)
            return
    slots = sorted(set(got) & set(ref))
    if not slots:
        res.reason = "the call returned no tensor to compare"
        return
    outputs = []
    for slot in slots:
        recorded = {
            "bench": p.bench_out.get(slot),
            "cmp": p.cmp_out.get(slot),
            "envelope": env.get(slot),
        }
        dtype = str(got[slot].dtype).replace("torch.", "")
        outputs.append(judge_output(slot, ref[slot], got[slot], recorded, dtype, limits))
    p.spec["tolerance"] = {o.slot: o.tolerance for o in outputs}
    p.spec["atol"] = limits[1]
    res.judgement = Judgement(verdict(outputs), outputs, inputs_differ(p.tensors, p.cmp_in))
    res.verdict = res.judgement.verdict


def _shape_reason(slot: str, got: torch.Tensor, rec: torch.Tensor, gaps: list[str]) -> str:
    why = f"the replayed {slot} has shape {list(got.shape)}, the recorded {list(rec.shape)}"
    if gaps:
        why += f": an argument the dump does not record ({', '.join(gaps)} passed as None)"
    return why
