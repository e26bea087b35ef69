"""Checks of the fused CUDA statistics kernel run by Triton's interpreter on CPU tensors.

Run by ``test_fused_kernel.py`` in a subprocess with ``TRITON_INTERPRET=1`` (the variable
must be set before Triton is imported, and must not reach the other tests of a session).
Exits 0 when every case matches float64, else prints the cases that do not.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch

from probe.capture import fused
from probe.capture.stats import dense_span, finish_stats


def reference(t: torch.Tensor) -> dict[str, Any]:
    """max, min, mean, norm, nan, inf of ``t`` in float64 on the CPU (NaN: PyTorch's rules),
    and the scale of its sum (Σ|x| of the finite elements) for tolerances."""
    d = t.detach().to("cpu", torch.float64).reshape(-1)
    nan = int(torch.isnan(d).sum())
    fin = d[torch.isfinite(d)]
    return {
        "max": math.nan if nan else float(d.max()),
        "min": math.nan if nan else float(d.min()),
        "mean": float(d.sum()) / d.numel(),
        "norm": float(torch.linalg.vector_norm(d)),
        "nan": nan,
        "inf": int(torch.isinf(d).sum()),
        "scale": float(fin.abs().sum()) if fin.numel() else 0.0,
    }


def same(got: Any, want: float, tol: float) -> bool:
    """``got`` (a number from a record) equals ``want`` within ``tol``; non-finite exactly."""
    g = float(got)  # non-finite values are written as "nan", "inf", "-inf"
    if math.isnan(want) or math.isinf(want):
        return (math.isnan(g) and math.isnan(want)) or g == want
    return abs(g - want) <= tol


def _check(launch: Any, name: str, t: torch.Tensor, slot: int = 2) -> list[str]:
    """The kernel's six numbers for ``t`` in ``slot`` of a buffer, against float64."""
    out = torch.full((6 * (slot + 2),), -7.0, dtype=torch.float64)
    launch(t, out, slot)
    values = out.tolist()
    errors = []
    if values[: 6 * slot] != [-7.0] * (6 * slot) or values[6 * slot + 6 :] != [-7.0] * 6:
        errors.append(f"{name}: wrote outside its slot: {values}")
    got = finish_stats(values[6 * slot : 6 * slot + 6], t.numel(), None)
    want = reference(t)
    ok = (got["nan"], got["inf"]) == (want["nan"], want["inf"])
    ok = ok and same(got["max"], want["max"], 0.0) and same(got["min"], want["min"], 0.0)
    ok = ok and same(got["mean"], want["mean"], 1e-13 * max(1.0, want["scale"]) / t.numel())
    ok = ok and same(got["norm"], want["norm"], 1e-13 * max(1.0, want["norm"]))
    if not ok:
        errors.append(f"{name}: got {got}, want {want}")
    return errors


def main() -> int:
    # Programs of 2,048 elements (small tensors take the partials path) and at most 4 of
    # them (the cap is reached at 8,193 elements).
    fused._PER_PROGRAM = 2048
    fused._MAX_PROGRAMS = 4
    launch = fused._build()
    if launch is None:
        print("SKIP: Triton is unavailable")
        return 0
    errors: list[str] = []
    cases = 0
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for n in (1, 7, 1024, 2048, 2049, 8192, 8193, 30001):
            for poison in (None, "nan", "inf", "both"):
                t = (torch.randn(n, generator=torch.Generator().manual_seed(n)) * 3 + 0.25).to(
                    dtype
                )
                if poison in ("nan", "both"):
                    t[n // 2] = math.nan
                if poison in ("inf", "both"):
                    t[n // 3] = -math.inf
                    t[n - 1] = math.inf
                errors += _check(launch, f"{dtype} n={n} {poison}", t)
                cases += 1
    for name, t in (
        ("all nan", torch.full((5000,), math.nan)),
        ("all inf", torch.full((3000,), math.inf)),
        ("-inf and one", torch.tensor([-math.inf] * 7 + [1.0])),
    ):
        errors += _check(launch, name, t)
        cases += 1
    base = torch.randn(3, 8, 20, 30, generator=torch.Generator().manual_seed(1))
    base.view(-1)[4321] = math.inf
    for name, t in (
        ("channels-last", base.permute(0, 2, 3, 1)),
        ("attention heads", base.transpose(1, 2)),
        ("past the start", base[1:].transpose(0, 3)),
    ):
        span = dense_span(t)
        if span is None:
            errors.append(f"{name}: no dense span")
            continue
        errors += _check(launch, name, span)  # against the span's own float64 reduction
        want, got = reference(t), reference(span)  # ... which is the tensor's
        if (want["max"], want["min"], want["inf"]) != (got["max"], got["min"], got["inf"]):
            errors.append(f"{name}: the span holds other values than the tensor")
        cases += 1
    for e in errors:
        print(e)
    print(f"{cases} cases, {len(errors)} errors")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
