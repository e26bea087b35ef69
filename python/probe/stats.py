"""Tensor statistics, checksums and dtype names.

Statistics are computed on the tensor's own device into a small vector so that all the
numbers of one op can be concatenated and brought to the host in a single transfer: one
device sync per op instead of one per number is what keeps capture cheap on accelerators.
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Optional

import torch

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float64: "float64",
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
}

# dtypes safetensors can store and compare can read (docs/format.md).
STORABLE = frozenset(DTYPE_NAMES)

_LOW_FLOAT = (torch.float16, torch.bfloat16, torch.float32)


def dtype_name(dtype: torch.dtype) -> str:
    """Name a dtype as docs/format.md does (``float32``), falling back to torch's name."""
    name = DTYPE_NAMES.get(dtype)
    if name is None:
        name = str(dtype).replace("torch.", "")
    return name


def stat_vector(t: torch.Tensor, counts: bool) -> Optional[list[torch.Tensor]]:
    """Return ``[max, min, sum, norm(, nan, inf)]`` as 0-d tensors on ``t``'s device.

    Three reductions per tensor (``aminmax``, ``sum``, ``vector_norm``; ``var_mean`` would
    save one but is an order of magnitude slower on CPU). The caller stacks the parts of every tensor of
    an op and transfers them at once (stack promotes dtypes). ``counts`` adds NaN/Inf counts
    eagerly; otherwise they are computed only when a value is non-finite (rare). Returns
    None for empty tensors and dtypes without meaningful statistics. Run with grad mode off.
    """
    dt = t.dtype
    if dt not in STORABLE or t.numel() == 0:
        return None
    if dt is torch.float32 or dt is torch.float64:
        tf = t
    elif dt is torch.float16 or dt is torch.bfloat16:
        tf = t.float()  # low-precision accumulators would distort mean and norm
    else:
        # bool: max = any, min = all (as 1/0); integers: exact in float64 up to 2**53.
        tf = t.to(torch.float32 if dt is torch.bool else torch.float64)
    mn, mx = torch.aminmax(tf)
    parts = [mx, mn, torch.sum(tf), torch.linalg.vector_norm(tf)]
    if counts:
        if t.is_floating_point():
            parts.append(torch.isnan(t).sum())
            parts.append(torch.isinf(t).sum())
        else:
            parts.append(torch.zeros((), dtype=torch.int64, device=t.device))
            parts.append(torch.zeros((), dtype=torch.int64, device=t.device))
    return parts


def _num(v: float) -> Any:
    """JSON has no non-finite numbers: docs/format.md spells them as strings."""
    if math.isfinite(v):
        return v
    if math.isnan(v):
        return "nan"
    return "inf" if v > 0 else "-inf"


def null_stats() -> dict[str, Any]:
    """Stats of an empty or unsupported tensor."""
    return {"max": None, "min": None, "mean": None, "norm": None, "nan": 0, "inf": 0}


def finish_stats(values: list[float], numel: int, tensor: Optional[torch.Tensor]) -> dict[str, Any]:
    """Turn a host-side stat vector ``[max, min, sum, norm(, nan, inf)]`` into ``stats``.

    With 4 values, NaN/Inf counts are zero when every value is finite (a NaN or Inf element
    makes max, min or the sum non-finite); otherwise they are counted now from ``tensor``.
    """
    mx, mn, total, norm = values[0], values[1], values[2], values[3]
    if len(values) >= 6:
        n_nan, n_inf = int(values[4]), int(values[5])
    elif math.isfinite(mx) and math.isfinite(mn) and math.isfinite(total):
        n_nan = n_inf = 0
    elif tensor is not None and tensor.is_floating_point():
        with torch.no_grad():
            n_nan = int(torch.isnan(tensor).sum().item())
            n_inf = int(torch.isinf(tensor).sum().item())
    else:
        n_nan = n_inf = 0
    return {
        "max": _num(mx),
        "min": _num(mn),
        "mean": _num(total / numel),
        "norm": _num(norm),
        "nan": n_nan,
        "inf": n_inf,
    }


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU copy that later in-place ops on ``t`` cannot change."""
    d = t.detach()
    if d.device.type == "cpu":
        return d.contiguous().clone() if d.is_contiguous() else d.contiguous()
    return d.to("cpu").contiguous()


def crc32_of(host: torch.Tensor) -> str:
    """``crc32:xxxxxxxx`` of the raw little-endian C-contiguous bytes of a CPU tensor."""
    raw = host.contiguous().reshape(-1).view(torch.uint8).numpy()
    return "crc32:%08x" % (zlib.crc32(memoryview(raw)) & 0xFFFFFFFF)
