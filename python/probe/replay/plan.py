"""What one op's replay works from: its call (a spec) and the recorded tensors of both runs.

Why a step of its own: everything here is read from the dumps before anything runs, and a
call that cannot be replayed is known here with its reason (statistics-mode dump, a
collective, a random op, a module whose construction the dump does not fix), so that the
run (engine.py) only executes and the verdict (verdict.py) only judges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .._op_key import BACKWARD, ParsedKey, forward_twin, parse_key
from . import collective
from .allowed import NotAnOperator
from .dump import InputError, RankDir, load_tensors
from .spec import CannotReplay, arguments, random_reason, target


@dataclass
class OpPlan:
    """One op to replay: its spec (None with ``reason`` when it cannot be replayed), the
    benchmark's tensors the call reads (inputs, parameters, ``grad.output.i`` gradients), the
    outputs each run recorded and the comparison run's recorded inputs, all by slot."""

    key: str
    spec: Optional[dict[str, Any]] = None
    reason: Optional[str] = None
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    bench_out: dict[str, torch.Tensor] = field(default_factory=dict)
    cmp_out: dict[str, torch.Tensor] = field(default_factory=dict)
    cmp_in: dict[str, torch.Tensor] = field(default_factory=dict)
    assumed_none: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: Where a difference entered from outside the call, when the plan can tell (a
    #: collective: the rank whose input differs, or the communication itself).
    outside: list[str] = field(default_factory=list)


def keys_needed(key: str) -> set[str]:
    """The records a replay of ``key`` reads: the key and, for a backward, its forward."""
    twin = forward_twin(key)
    return {key} | ({twin} if twin else set())


def plan(key: str, bench: RankDir, cmp: RankDir, b: dict[str, Any], c: dict[str, Any]) -> OpPlan:
    """The plan of one op from both runs' records (``b``/``c``: key -> record). An op the
    benchmark does not hold is an input error, and so is one that names no operator a replay
    may run (allowed.py: a hostile dump); one it holds but cannot replay gets a reason."""
    parsed = parse_key(key)
    if parsed is None:
        raise InputError(f"not an op key: {key!r}")
    if key not in b:
        raise InputError(f"op {key!r} is not in the benchmark dump {bench.path}")
    out = OpPlan(key)
    try:
        _fill(out, parsed.direction == BACKWARD, bench, cmp, b, c)
    except CannotReplay as e:
        out.spec, out.reason = None, str(e)
    except NotAnOperator as e:
        raise InputError(f"op {key}: {e}") from None
    return out


def _fill(
    out: OpPlan, backward: bool, bench: RankDir, cmp: RankDir, b: dict[str, Any], c: dict[str, Any]
) -> None:
    key = out.key
    parsed = parse_key(key)
    assert parsed is not None
    if collective.is_collective(parsed.prefix) and not backward:
        _fill_collective(out, parsed, bench, cmp, b, c)
        return
    fkey = forward_twin(key) if backward else key
    if fkey is None or fkey not in b:
        raise CannotReplay(f"its forward record {fkey} is not in the benchmark dump")
    fwd = b[fkey]
    shapes = {_slot(fkey, t): list(t["shape"]) for t in fwd["tensors"] if t["role"] == "parameter"}
    tgt = target(parsed, shapes)  # first: a name that is no operator is refused outright
    _has_data(bench, fwd)
    tensors = {s: t for s, t in load_tensors(bench, fwd).items() if not s.startswith("output.")}
    inputs = [_slot(fkey, t) for t in fwd["tensors"] if t["role"] == "input"]
    missing = [s for s in inputs if s not in tensors]
    if missing:
        raise CannotReplay(
            f"no data recorded for {', '.join(missing)} (leftover bytes or not written)"
        )
    args, kwargs, gaps = arguments(inputs, fwd.get("args") or {})
    api = f"{parsed.prefix}.{parsed.name}"
    why = random_reason(api, args, kwargs) if parsed.kind == "api" else None
    if why:
        raise CannotReplay(why)
    rec = b[key]
    if backward:
        grads = {s: t for s, t in load_tensors(bench, rec).items() if s.startswith("input.")}
        if not grads:
            raise CannotReplay("the backward record holds no gradient of the forward outputs")
        tensors.update({f"grad.output{s[5:]}": g for s, g in grads.items()})
    out.tensors = tensors
    out.bench_out = {s: t for s, t in load_tensors(bench, rec).items() if s.startswith("output.")}
    out.assumed_none = gaps
    out.spec = {
        "op": key,
        "target": tgt,
        "args": args,
        "kwargs": kwargs,
        "backward": backward,
        "grads": {
            "output" + s[len("grad.output") :]: s
            for s in sorted(tensors)
            if s.startswith("grad.output.")
        },
        "inplace": parsed.name.endswith("_") and not parsed.name.endswith("__"),
        "dtypes": _dtypes(out, fkey, b, c),
        "needs": ["torch_npu"] if parsed.prefix == "NPU" else [],
    }
    _comparison(out, cmp, c, fkey)


def _fill_collective(
    out: OpPlan,
    parsed: ParsedKey,
    bench: RankDir,
    cmp: RankDir,
    b: dict[str, Any],
    c: dict[str, Any],
) -> None:
    """An all-reduce: the reduction of every benchmark rank's recorded input, stacked in
    group order (collective.py); the comparison's output, and its ranks' inputs, beside."""
    rec = b[out.key]
    if parsed.name not in collective.REDUCTIONS:
        raise CannotReplay(
            "a collective other than an all-reduce: its result is other ranks' data, which"
            " one process cannot rerun"
        )
    _has_data(bench, rec)
    own = load_tensors(bench, rec).get("output.0")
    peers = collective.peer_inputs(bench, parsed.name, rec)
    if own is None or len({tuple(t.shape) for t in peers} | {tuple(own.shape)}) != 1:
        raise CannotReplay("the ranks' inputs and this rank's output do not share one shape")
    stacked = torch.stack(peers)
    op = collective.reduction(stacked, own)
    crec = c.get(out.key)
    cmp_out = load_tensors(cmp, crec).get("output.0") if crec else None
    cmp_peers: Optional[list[torch.Tensor]] = None
    if crec:
        try:
            cmp_peers = collective.peer_inputs(cmp, parsed.name, crec)
        except CannotReplay:
            cmp_peers = None
    if cmp_peers is not None and any(t.shape != stacked.shape[1:] for t in cmp_peers):
        cmp_peers = None
    dtype = str((cmp_peers[0] if cmp_peers else stacked).dtype).replace("torch.", "")
    out.tensors = {"input.0": stacked}
    out.bench_out = {"output.0": own}
    out.spec = collective.spec(out.key, op, dtype)
    if cmp_out is not None:
        out.cmp_out = {"output.0": cmp_out}
    if cmp_peers is not None:
        out.cmp_in = {"input.0": torch.stack(cmp_peers)}
    group = list(rec.get("group") or [])
    out.notes.append(f"replayed as the {op} of the inputs of ranks {group}, stacked in that order")
    found, out.outside = collective.notes(op, peers, cmp_peers, cmp_out, group)
    out.notes += found


def _slot(key: str, t: dict[str, Any]) -> str:
    name = str(t["name"])
    return name[len(key) + 1 :] if name.startswith(key + ".") else name


def _has_data(rank: RankDir, rec: dict[str, Any]) -> None:
    if any(isinstance(t.get("file"), str) for t in rec["tensors"]):
        return
    mode = (rank.manifest or {}).get("mode", "statistics or checksum")
    raise CannotReplay(
        f"the benchmark dump holds no tensor data for it (mode {mode}): capture that step in"
        " tensor mode; `probe compare` writes a recapture.json for it"
    )


def _dtypes(out: OpPlan, fkey: str, b: dict[str, Any], c: dict[str, Any]) -> dict[str, str]:
    """The dtype of each tensor slot as the comparison run recorded it (the benchmark's where
    the comparison dump lacks the record or the slot)."""
    dtypes = {s: str(t.dtype).replace("torch.", "") for s, t in out.tensors.items()}
    side = c if fkey in c else b
    if fkey not in c:
        out.notes.append("the comparison dump lacks this call: replayed in the benchmark's dtypes")
    for t in side[fkey]["tensors"]:
        s = _slot(fkey, t)
        if s in dtypes and t["role"] != "output":
            dtypes[s] = str(t["dtype"])
    if out.key != fkey and out.key in c:
        for t in c[out.key]["tensors"]:
            s = f"grad.output{_slot(out.key, t)[5:]}"
            if t["role"] == "input" and s in dtypes:
                dtypes[s] = str(t["dtype"])
    return dtypes


def _comparison(out: OpPlan, cmp: RankDir, c: dict[str, Any], fkey: str) -> None:
    """The comparison run's recorded outputs and inputs, where its dump holds their data."""
    if out.key in c:
        rec = load_tensors(cmp, c[out.key])
        out.cmp_out = {s: t for s, t in rec.items() if s.startswith("output.")}
        if out.key != fkey:
            out.cmp_in.update(
                {f"grad.output{s[5:]}": t for s, t in rec.items() if s.startswith("input.")}
            )
    if fkey in c:
        rec = load_tensors(cmp, c[fkey])
        out.cmp_in.update({s: t for s, t in rec.items() if not s.startswith("output.")})
    if not out.cmp_out:
        out.notes.append("the comparison dump holds no data of this call's outputs")
