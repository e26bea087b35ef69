"""Re-executing one recorded call: the part of a replay that needs only PyTorch.

Why a module of its own, importing nothing but the standard library and torch: it is also
the body of every ``repro.py`` a replay writes (``probe.replay.repro`` copies this file's
source after the call's ``SPEC``), so the script that runs on a machine that never saw probe
and the replay that judged the op execute the same code, line for line. It must therefore
not import probe, numpy or safetensors (``test_replay.py`` runs a repro in an environment
holding torch alone).

A call is described by a *spec*, a dict of Python literals (docs/replay.md, "The spec"):
the callable's dotted path, its arguments with tensors named by their slot (``{"tensor":
"input.0"}``), the dtypes the comparison side recorded, and for a backward the recorded
gradients of the forward outputs. Tensors live in one safetensors file keyed by slot.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import struct
import sys
import types
import weakref
from typing import Any, Callable, Optional

import torch

#: safetensors dtype codes <-> torch dtypes (the ten the dump format knows).
CODES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
DTYPE_NAMES: dict[str, torch.dtype] = {str(d).replace("torch.", ""): d for d in CODES.values()}

#: Values and calls a spec holds: the modules a callable's dotted path may start from.
_ROOTS = ("torch_npu", "torch")


def read_safetensors(path: str) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, located by the header's offsets (data may be in
    any order and the header padded with spaces: both valid). Raises ValueError on a file
    that is cut short or whose header is not safetensors."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its header length)")
        (n,) = struct.unpack("<Q", raw)
        if n > 100_000_000:
            raise ValueError(f"{path}: not a safetensors file (header length {n})")
        header = json.loads(fh.read(n).decode("utf-8"))
        data = bytearray(fh.read())
    out: dict[str, torch.Tensor] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        out[name] = _tensor_at(path, name, meta, data)
    return out


def _tensor_at(path: str, name: str, meta: dict[str, Any], data: bytearray) -> torch.Tensor:
    """One tensor of a safetensors data section (a copy: it outlives the buffer)."""
    dtype = CODES.get(meta.get("dtype", ""))
    if dtype is None:
        raise ValueError(f"{path}: {name}: dtype {meta.get('dtype')!r} is not supported")
    begin, end = meta["data_offsets"]
    shape = [int(s) for s in meta["shape"]]
    count = math.prod(shape)
    size = torch.empty((), dtype=dtype).element_size()
    if end > len(data) or end - begin != count * size:
        raise ValueError(f"{path}: {name}: data cut short or inconsistent with its shape")
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(data, dtype=torch.uint8, count=end - begin, offset=begin)
    return flat.clone().view(dtype).reshape(shape)


def resolve(target: dict[str, Any]) -> Callable[..., Any]:
    """The callable a spec's ``target`` names: a dotted path from ``torch`` or
    ``torch_npu`` (``torch.nn.functional.gelu``, ``torch.Tensor.add_``,
    ``torch.ops.aten.add.Tensor``), or a ``torch.nn`` module class. Looked up when called:
    a prelude that replaced the attribute is what runs (that is the kernel under test).

    The walk goes only through torch's own namespaces: a module whose name is the path
    walked so far (``torch.os`` is ``os``, not a submodule: refused), ``torch.Tensor``, or
    an ATen ``OpOverloadPacket``; a part starting with ``__`` only as a ``Tensor`` operator
    method (``__add__``). The path is data (a dump's op key): the replay also allows only
    the operators on its list (``probe.replay.allowed``); this guards the repro too."""
    path = str(target["path"])
    parts = path.split(".")
    obj: Any = None
    if parts[0] in _ROOTS and len(parts) > 1 and all(p.isidentifier() for p in parts):
        obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        if obj is None or not _namespace(obj, ".".join(parts[:i])):
            break
        if part.startswith("__") and obj is not torch.Tensor:
            break
        obj = getattr(obj, part)
    else:
        if obj is not None and callable(obj) and not isinstance(obj, types.ModuleType):
            fn: Callable[..., Any] = obj
            return fn
    raise ValueError(f"not a torch or torch_npu operator: {path:.200}")


def _namespace(obj: Any, walked: str) -> bool:
    """Whether ``obj`` (reached by the path ``walked``) is one of torch's namespaces."""
    if isinstance(obj, types.ModuleType):
        return obj.__name__ == walked
    return obj is torch.Tensor or isinstance(obj, torch._ops.OpOverloadPacket)


def decode(value: Any, tensors: dict[str, torch.Tensor], device: torch.device) -> Any:
    """A spec argument as the call receives it: ``{"tensor": slot}`` the tensor,
    ``{"dtype": name}`` a torch dtype, ``{"device": d}`` the device the call runs on,
    ``{"float": "nan"}`` a non-finite float, ``{"dict": {...}}`` a dict, lists as lists."""
    if isinstance(value, list):
        return [decode(v, tensors, device) for v in value]
    if not isinstance(value, dict):
        return value
    if "tensor" in value:
        return tensors[value["tensor"]]
    if "dtype" in value:
        return DTYPE_NAMES[value["dtype"]]
    if "device" in value:
        return device
    if "float" in value:
        return float(value["float"])
    return {k: decode(v, tensors, device) for k, v in value["dict"].items()}


def prepare(
    tensors: dict[str, torch.Tensor],
    device: torch.device,
    dtypes: Optional[dict[str, str]],
    grad: bool,
) -> dict[str, torch.Tensor]:
    """Copies of the recorded tensors for one run: floating ones in ``dtypes[slot]`` (the
    comparison side's) or, with ``dtypes`` None, all in float64 (the reference); on
    ``device``; requiring grad when a backward is replayed (not the recorded gradients).
    Always copies, so an in-place call never writes into what another run reads."""
    out: dict[str, torch.Tensor] = {}
    for slot, t in tensors.items():
        dtype = t.dtype
        if t.is_floating_point():
            dtype = torch.float64 if dtypes is None else DTYPE_NAMES[dtypes.get(slot, _name(t))]
        c = t.to(device=device, dtype=dtype, copy=True)
        if grad and c.is_floating_point() and not slot.startswith("grad."):
            c.requires_grad_(True)
        out[slot] = c
    return out


def _name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def flatten(obj: Any, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors of a result by the agent's names: a tuple or list as ``output.i``, one
    value as ``output.0``, nested lists ``.i`` and dicts ``.key`` (records.py)."""
    out: dict[str, torch.Tensor] = {}
    items = obj if isinstance(obj, (tuple, list)) else (obj,)
    _walk(items, prefix, out)
    return out


def _walk(obj: Any, prefix: str, out: dict[str, torch.Tensor]) -> None:
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            _walk(v, f"{prefix}.{i}", out)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk(v, f"{prefix}.{k}", out)


def _module(cls: Any, target: dict[str, Any], t: dict[str, torch.Tensor]) -> Any:
    """A ``torch.nn`` module of class ``cls`` (the target's) with the recorded parameters."""
    with torch.device("meta"):
        mod = cls(*target.get("args", []), **target.get("kwargs", {}))
    for slot, p in t.items():
        if slot.startswith("parameters."):
            name = slot[len("parameters.") :]
            mod._parameters[name] = torch.nn.Parameter(p, requires_grad=p.requires_grad)
    return mod


#: How a target becomes a callable: :func:`resolve`, or the replay's allow-list in front of
#: it (``probe.replay.allowed.resolve``).
Lookup = Callable[[dict[str, Any]], Callable[..., Any]]


def call(
    spec: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    device: torch.device,
    lookup: Lookup = resolve,
) -> dict[str, torch.Tensor]:
    """Run the spec's call once on prepared tensors; its results by the agent's names. A
    backward spec runs the forward under autograd and returns the gradients w.r.t. the
    floating inputs, named as the backward record names them (``output.<input slot>``).
    The callable is ``lookup(spec["target"])``, looked up before any argument is built."""
    fn = lookup(spec["target"])
    # Under autograd a leaf that requires grad cannot be written in place (``add_``,
    # ``relu(inplace=True)``): the call gets copies through which gradients still flow.
    given = {s: t.clone() if t.requires_grad else t for s, t in tensors.items()}
    args = decode(spec["args"], given, device)
    kwargs = {k: decode(v, given, device) for k, v in spec.get("kwargs", {}).items()}
    with torch.enable_grad() if spec.get("backward") else torch.no_grad():
        if spec["target"]["kind"] == "module":
            result = _module(fn, spec["target"], given)(*args, **kwargs)
        else:
            result = fn(*args, **kwargs)
    outs = flatten(result, "output")
    if not spec.get("backward"):
        return {k: v.detach() for k, v in outs.items()}
    return _gradients(spec, tensors, outs)


def _gradients(
    spec: dict[str, Any], tensors: dict[str, torch.Tensor], outs: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Gradients w.r.t. the inputs, fed the recorded gradients of the outputs."""
    pairs = [(outs[o], tensors[g]) for o, g in spec["grads"].items() if o in outs]
    pairs = [(o, g.to(o.dtype)) for o, g in pairs if o.requires_grad]
    wrt = [(s, t) for s, t in tensors.items() if t.requires_grad and s.startswith("input.")]
    if not pairs or not wrt:
        raise ValueError("nothing to differentiate: no output needs a gradient")
    grads = torch.autograd.grad(
        [o for o, _ in pairs], [t for _, t in wrt], [g for _, g in pairs], allow_unused=True
    )
    return {f"output{s[5:]}": g.detach() for (s, _), g in zip(wrt, grads) if g is not None}


def run(
    spec: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    device: str,
    dtypes: Optional[dict[str, str]],
    lookup: Lookup = resolve,
) -> dict[str, torch.Tensor]:
    """One replay: the recorded tensors prepared for ``device`` in ``dtypes`` (None: the
    float64 reference), the call (``lookup``'s) run, its results copied to the CPU."""
    dev = torch.device(device)
    prepared = prepare(tensors, dev, dtypes, bool(spec.get("backward")))
    return {k: v.to("cpu") for k, v in call(spec, prepared, dev, lookup).items()}


def error(got: torch.Tensor, ref: torch.Tensor, atol: float = 0.0) -> dict[str, float]:
    """How far ``got`` is from ``ref``: the relative L2 error ``|max(|d| - atol, 0)|_2 /
    |ref|_2`` (floating tensors; NaN/Inf where both have them are left out, elsewhere they
    make the error infinite) and the largest absolute difference; for integers and bools
    the fraction of elements that differ."""
    if got.shape != ref.shape:
        return {"rel_l2": math.inf, "max_abs": math.inf}
    if not (got.is_floating_point() or ref.is_floating_point()):
        n = max(got.numel(), 1)
        differ = float((got.to("cpu") != ref.to("cpu")).sum().item())
        return {"rel_l2": differ / n, "max_abs": differ}
    a, b = got.to("cpu").reshape(-1), ref.to("cpu").reshape(-1)
    squares, max_abs = 0.0, 0.0
    buf = torch.empty(min(CHUNK, a.numel()), dtype=torch.float64)
    for at in range(0, a.numel(), CHUNK):  # in float64, a chunk at a time: no 2x-size copy
        d = buf[: min(CHUNK, a.numel() - at)]
        torch.sub(a[at : at + CHUNK], b[at : at + CHUNK], out=d)
        d.abs_()
        max_abs = max(max_abs, float(d.max()))
        if not math.isfinite(max_abs):  # NaN or Inf in either (NaN - x is NaN)
            return _error_nonfinite(a.to(torch.float64), b.to(torch.float64), atol)
        if atol > 0:
            d.sub_(atol).clamp_min_(0.0)
        squares += float(torch.dot(d, d))
    return _relative(math.sqrt(squares), ref.to("cpu"), max_abs)


#: Elements per chunk of :func:`error`'s float64 differences (2 MB: in cache).
CHUNK = 1 << 18


#: The last reference whose norm was taken, and that norm: one output is measured against
#: the same reference four times (weakly held: it may be large).
_LAST_REF: list[Any] = [None, 0.0]


def _relative(num: float, ref: torch.Tensor, max_abs: float) -> dict[str, float]:
    last = _LAST_REF[0]() if _LAST_REF[0] is not None else None
    if last is not ref:
        _LAST_REF[:] = [weakref.ref(ref), float(torch.linalg.vector_norm(ref))]
    den = float(_LAST_REF[1])
    rel = num / den if den > 0 else (0.0 if num == 0 else math.inf)
    return {"rel_l2": rel, "max_abs": max_abs}


def _error_nonfinite(a: torch.Tensor, b: torch.Tensor, atol: float) -> dict[str, float]:
    """:func:`error` where NaN or Inf appear: equal non-finite values on both sides are
    left out, any other makes the error infinite."""
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    same_nonfinite = (~fa & ~fb) & ((a == b) | (a.isnan() & b.isnan()))
    if bool(((~fa | ~fb) & ~same_nonfinite).any()):
        return {"rel_l2": math.inf, "max_abs": math.inf}
    keep = fa & fb
    zero = torch.zeros((), dtype=a.dtype)
    d = torch.where(keep, (a - b).abs(), zero)
    max_abs = float(d.max().item()) if d.numel() else 0.0
    d = (d - atol).clamp_min(0.0)
    return _relative(float(torch.linalg.vector_norm(d).item()), torch.where(keep, b, zero), max_abs)


def run_prelude(path: Optional[str]) -> None:
    """Run a prelude file (import torch_npu, register custom ops, install a patched
    kernel) as a script of its own, after the float64 reference is computed."""
    if not path:
        return
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    code = compile(source, path, "exec")
    exec(code, {"__name__": "__probe_prelude__", "__file__": path})  # noqa: S102


def main(spec: dict[str, Any], argv: Optional[list[str]] = None) -> int:
    """The repro script: reference in float64 on the CPU, then (after ``--prelude``) the
    call on ``--device`` in the comparison side's dtypes; exit 1 when an output is off by
    more than its tolerance, 0 otherwise, 2 when it cannot run."""
    ap = argparse.ArgumentParser(description=f"Replay {spec['op']} on its recorded inputs.")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or npu (default cpu)")
    ap.add_argument("--prelude", default=None, help="a Python file to run first")
    ap.add_argument("--inputs", default=None, help="default: inputs.safetensors beside this")
    args = ap.parse_args(argv)
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    try:
        tensors = read_safetensors(args.inputs or os.path.join(here, "inputs.safetensors"))
        for module in spec.get("needs", []):
            importlib.import_module(module)
        ref = run(spec, tensors, "cpu", None)
        run_prelude(args.prelude)
        if args.device.startswith("npu"):
            importlib.import_module("torch_npu")
        got = run(spec, tensors, args.device, spec["dtypes"])
    except Exception as exc:  # noqa: BLE001 - a repro says why it cannot run, in one line
        print(f"repro: cannot run: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return _report(spec, ref, got)


def _report(spec: dict[str, Any], ref: dict[str, Any], got: dict[str, Any]) -> int:
    off = False
    for name, tol in sorted(spec["tolerance"].items()):
        if name not in got or name not in ref:
            print(f"{name}: missing from the result")
            off = True
            continue
        e = error(got[name], ref[name], float(spec.get("atol", 0.0)))
        bad = not e["rel_l2"] <= tol
        off = off or bad
        print(
            f"{name}: relative L2 error vs float64 {e['rel_l2']:.3e} (max abs {e['max_abs']:.3e}),"
            f" tolerance {tol:.3e}: {'OFF' if bad else 'ok'}"
        )
    print(f"{spec['op']}: {'the kernel is off' if off else 'within tolerance'}")
    return 1 if off else 0
