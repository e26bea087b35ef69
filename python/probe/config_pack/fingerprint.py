"""How values enter a config pack: JSON-safe copies, and tensors as exact fingerprints.

Two environments are compared by what they recorded, so a value must be written the same
way on both sides whatever it is (argparse namespaces, tensors, sets in any order), and a
tensor is recorded by a digest of its bytes (equal weights or batches are equal, bit for
bit) plus a few statistics that say how far apart unequal ones are.
"""

from __future__ import annotations

import hashlib
import math
import sys
from typing import Any


def jsonable(v: Any, depth: int = 0) -> Any:
    """A JSON-safe copy of ``v``: tuples become lists, tensors scalars or summaries,
    non-finite floats strings, anything else its repr."""
    if depth > 8:
        return repr(v)
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    if isinstance(v, dict):
        return {str(k): jsonable(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v
        return [jsonable(x, depth + 1) for x in items]
    torch: Any = sys.modules.get("torch")
    if torch is not None and isinstance(v, torch.Tensor):
        if v.numel() == 1:
            return jsonable(v.detach().cpu().item(), depth + 1)
        return {"tensor": list(v.shape), "dtype": dtype_name(v.dtype)}
    if torch is not None and isinstance(v, torch.dtype):
        return dtype_name(v)
    if hasattr(v, "__dict__") and type(v).__name__ == "Namespace":
        return jsonable(vars(v), depth + 1)
    item = getattr(v, "item", None)
    if callable(item) and getattr(v, "shape", None) == ():
        try:
            return jsonable(item(), depth + 1)
        except Exception:  # noqa: BLE001 - a repr is good enough
            pass
    return repr(v)


def dtype_name(dt: Any) -> str:
    """``float32`` for ``torch.float32`` (and any other dtype's name without the module)."""
    s = str(dt)
    return s.removeprefix("torch.")


def tensor_fingerprint(t: Any) -> dict[str, Any]:
    """sha256 of the tensor's raw bytes (contiguous, little-endian) plus dtype, shape and
    statistics in float64 (max, min, mean, L2 norm; null when empty or not real)."""
    import torch

    x = t.detach()
    if x.device.type != "cpu":
        x = x.cpu()
    x = x.contiguous()
    flat = x.reshape(-1)
    try:
        raw = flat.view(torch.uint8).numpy().tobytes()
    except Exception:  # noqa: BLE001 - dtypes numpy cannot view (e.g. some fp8)
        raw = bytes(flat.untyped_storage())[: flat.numel() * flat.element_size()]
    fp: dict[str, Any] = {
        "sha256": hashlib.sha256(raw).hexdigest(),
        "dtype": dtype_name(x.dtype),
        "shape": list(x.shape),
        "numel": int(flat.numel()),
        "max": None,
        "min": None,
        "mean": None,
        "norm": None,
    }
    if flat.numel() > 0 and not x.is_complex():
        try:
            d = flat.to(torch.float64)
            for k, v in (
                ("max", d.max()),
                ("min", d.min()),
                ("mean", d.mean()),
                ("norm", torch.linalg.vector_norm(d)),
            ):
                f = float(v)
                fp[k] = f if math.isfinite(f) else repr(f)
        except Exception:  # noqa: BLE001 - statistics are optional
            pass
    return fp


def add_tensor_records(
    out: list[dict[str, Any]], obj: Any, prefix: str, step: int, rank: int
) -> None:
    """Append one ``{step, rank, name, fingerprint}`` record per tensor in a nested
    structure to ``out``; names follow the nesting (``args.0``, ``kwargs.mask``)."""
    found: list[tuple[str, Any]] = []
    _walk_tensors(obj, prefix, found)
    for name, t in found:
        out.append({"step": step, "rank": rank, "name": name, "fingerprint": tensor_fingerprint(t)})


def _walk_tensors(obj: Any, prefix: str, out: list[tuple[str, Any]], depth: int = 0) -> None:
    torch: Any = sys.modules.get("torch")
    if depth > 6 or torch is None:
        return
    if isinstance(obj, torch.Tensor):
        out.append((prefix, obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk_tensors(v, f"{prefix}.{k}", out, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _walk_tensors(v, f"{prefix}.{i}", out, depth + 1)
