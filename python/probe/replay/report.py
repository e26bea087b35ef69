"""What a replay says: one verdict line per op, the headline, ``replay.json``, a README.

Why apart: the words and the file are read by people and by the ``probe`` binary
(``probe replay`` prints the lines and exits with the code); keeping them in one place keeps
the line, the JSON and the README saying the same thing. Every string that came from a dump
(op keys, paths) is made printable before it reaches a terminal.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from .engine import OpResult
from .folder import call_text
from .text import printable
from .verdict import (
    CANNOT,
    DOES_NOT_REPRODUCE,
    FLOOR,
    REPRODUCES,
    WITHIN,
    K,
    OutputJudgement,
    as_json,
)

FORMAT, VERSION = "probe-replay", 1
_RANK = {REPRODUCES: 0, DOES_NOT_REPRODUCE: 1, WITHIN: 2, CANNOT: 3}
_WORDS = {
    REPRODUCES: "REPRODUCES in isolation",
    DOES_NOT_REPRODUCE: "DOES NOT REPRODUCE",
    WITHIN: "WITHIN TOLERANCE",
    CANNOT: "CANNOT REPLAY",
}


def _e(err: Optional[dict[str, float]]) -> str:
    return "n/a" if err is None else f"{err['rel_l2']:.2e}"


def _worst(res: OpResult) -> OutputJudgement:
    """The output a line tells: the most off (reproduces) or the most different recorded."""
    assert res.judgement is not None

    def weight(o: OutputJudgement) -> float:
        if res.verdict == REPRODUCES:
            return _finite((o.replayed or {"rel_l2": 0.0})["rel_l2"] / max(o.tolerance, 1e-300))
        return _finite((o.cmp or {"rel_l2": 0.0})["rel_l2"])

    return max(res.judgement.outputs, key=lambda o: (weight(o), o.slot))


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 1e308


def line(res: OpResult, device: str) -> str:
    """The op's verdict in one line."""
    key = res.plan.key
    if res.verdict == CANNOT:
        return printable(f"{_WORDS[CANNOT]}: {key}: {res.reason}")
    o = _worst(res)
    where = f"{key} on {device} ({o.dtype}), {o.slot}"
    if res.verdict == REPRODUCES:
        text = (
            f"{where}: this device's kernel, on the benchmark's inputs, is off by {_e(o.replayed)}"
            f" (relative L2 vs float64) where the benchmark's device is off by {_e(o.bench)}"
            f" (tolerance {o.tolerance:.2e})"
        )
    elif res.verdict == DOES_NOT_REPRODUCE:
        text = (
            f"{where}: replayed, this device's kernel is off by {_e(o.replayed)} vs float64"
            f" (tolerance {o.tolerance:.2e}) while the comparison run recorded {_e(o.cmp)}:"
            f" the difference comes from outside this call ({_outside(res)})"
        )
    else:
        text = f"{where}: off by {_e(o.replayed)} vs float64 (tolerance {o.tolerance:.2e}); the comparison run recorded {_e(o.cmp)}"
    return printable(f"{_WORDS[res.verdict]}: {text}")


def _outside(res: OpResult) -> str:
    assert res.judgement is not None
    if res.plan.outside:
        return "; ".join(res.plan.outside)
    differ = res.judgement.inputs_differ
    if differ:
        parts = ", ".join(f"{s} by {d:.2e}" for s, d in differ[:3])
        return f"its recorded inputs differ from the benchmark's: {parts}"
    if not res.plan.cmp_in:
        return "the comparison dump holds no data of its inputs"
    return (
        "its recorded inputs equal the benchmark's: state, inputs not recorded, or nondeterminism"
    )


def exit_code(results: list[OpResult]) -> int:
    """1 when an op reproduces, 3 when none could be replayed, else 0."""
    if any(r.verdict == REPRODUCES for r in results):
        return 1
    if all(r.verdict == CANNOT for r in results):
        return 3
    return 0


def headline(results: list[OpResult], device: str) -> str:
    """The first line of stdout: the most telling op's line, with how many ops share it."""
    worst = min(results, key=lambda r: _RANK[r.verdict])
    same = sum(r.verdict == worst.verdict for r in results)
    text = line(worst, device)
    if len(results) > 1:
        text += f" [{same} of {len(results)} ops: {_WORDS[worst.verdict].lower()}]"
    if exit_code(results) == 3:
        text = "NOTHING REPLAYABLE: " + text
    return text


def document(
    results: list[OpResult], run: dict[str, Any], folders: dict[str, str]
) -> dict[str, Any]:
    """replay.json (schemas/probe-replay.v1.schema.json), keys in a fixed order."""
    device = run["device"]
    rest = {k: v for k, v in run.items() if k not in ("rtol", "atol")}
    return {
        "format": FORMAT,
        "version": VERSION,
        "headline": headline(results, device),
        "exit_code": exit_code(results),
        **rest,
        "tolerance": {
            "k": K,
            "floor": dict(FLOOR),
            "rtol": run.get("rtol"),
            "atol": run.get("atol", 0.0),
        },
        "ops": [_op(r, folders.get(r.plan.key), device) for r in results],
    }


def _op(res: OpResult, folder: Optional[str], device: str) -> dict[str, Any]:
    p = res.plan
    spec = p.spec
    j = res.judgement
    return {
        "op": p.key,
        "verdict": res.verdict,
        "line": line(res, device),
        "reason": res.reason if res.verdict == CANNOT else None,
        "call": call_text(spec) if spec else None,
        "reference": res.reference,
        "repro": folder,
        "assumed_none": list(p.assumed_none),
        "notes": list(p.notes),
        "inputs": [
            {
                "slot": s,
                "dtype": str(t.dtype).replace("torch.", ""),
                "replay_dtype": (spec or {}).get("dtypes", {}).get(s),
                "shape": list(t.shape),
            }
            for s, t in sorted(p.tensors.items())
        ],
        "inputs_differ": [
            {"slot": s, "rel_l2": d if math.isfinite(d) else str(d)}
            for s, d in (j.inputs_differ if j else [])
        ],
        "outputs": [_output(o) for o in (j.outputs if j else [])],
    }


def _output(o: OutputJudgement) -> dict[str, Any]:
    return {
        "slot": o.slot,
        "dtype": o.dtype,
        "shape": o.shape,
        "tolerance": o.tolerance,
        "off": o.off,
        "bench_vs_fp64": as_json(o.bench),
        "cmp_vs_fp64": as_json(o.cmp),
        "replayed_vs_fp64": as_json(o.replayed),
        "replayed_vs_cmp": as_json(o.replayed_vs_cmp),
        "cpu_same_dtype_vs_fp64": as_json(o.envelope),
    }


def readme(res: OpResult, device: str) -> str:
    """The repro folder's README: the op, shapes, dtypes and the errors seen."""
    p = res.plan
    assert p.spec is not None and res.judgement is not None
    key = printable(p.key)
    ins = ", ".join(
        f"`{s}` {list(t.shape)} {str(t.dtype).replace('torch.', '')} (replayed in {p.spec['dtypes'].get(s)})"
        for s, t in sorted(p.tensors.items())
    )
    rows = "\n".join(
        f"| `{o.slot}` | {o.shape} | {o.dtype} | {_e(o.bench)} | {_e(o.cmp)} | {_e(o.replayed)} |"
        f" {_e(o.replayed_vs_cmp)} | {o.tolerance:.2e} |"
        for o in res.judgement.outputs
    )
    return (
        f"# Replay of `{key}`\n\n"
        f"{line(res, device)}\n\n"
        f"The call, `{printable(call_text(p.spec))}`, reads {ins}. "
        f"Replayed on `{device}` on the benchmark run's recorded inputs; errors are relative L2"
        " distances to the same call computed in float64 on the CPU:\n\n"
        "| output | shape | dtype | benchmark recorded | comparison recorded | replayed | replayed vs comparison | tolerance |\n"
        "|---|---|---|---|---|---|---|---|\n"
        f"{rows}\n\n"
        "Run it anywhere with PyTorch (torch_npu for an NPU op), no probe needed:\n\n"
        "    python repro.py --device cpu            # or cuda, npu\n"
        "    python repro.py --prelude patched.py    # run a file first (import torch_npu, a patched kernel)\n\n"
        "It exits 1 when an output is off by more than its tolerance, 0 when within, 2 when it cannot run.\n"
    )
