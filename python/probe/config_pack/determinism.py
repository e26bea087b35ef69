"""Determinism flags: the torch and backend switches that decide which kernels run.

TF32, reduced-precision reductions, cuDNN benchmarking, deterministic algorithms, autocast
and thread counts each change results in the last bits; a pack records every one this torch
knows, as it is when the pack is captured.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

from .fingerprint import jsonable


def collect_determinism() -> dict[str, Any]:
    """The ``determinism`` section: every flag this torch has that changes kernel choice."""
    import torch

    flags: dict[str, Any] = {}

    def put(name: str, fn: Callable[[], Any]) -> None:
        try:
            flags[name] = jsonable(fn())
        except Exception:  # noqa: BLE001 - a flag this torch does not have
            pass

    put("torch.are_deterministic_algorithms_enabled", torch.are_deterministic_algorithms_enabled)
    put(
        "torch.is_deterministic_algorithms_warn_only_enabled",
        torch.is_deterministic_algorithms_warn_only_enabled,
    )
    put("torch.backends.cudnn.enabled", lambda: torch.backends.cudnn.enabled)
    put("torch.backends.cudnn.deterministic", lambda: torch.backends.cudnn.deterministic)
    put("torch.backends.cudnn.benchmark", lambda: torch.backends.cudnn.benchmark)
    put("torch.backends.cudnn.allow_tf32", lambda: torch.backends.cudnn.allow_tf32)
    put("torch.backends.cuda.matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32)
    put(
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
        lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
    )
    put(
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
        lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    )
    put("torch.get_float32_matmul_precision", torch.get_float32_matmul_precision)
    put("torch.get_default_dtype", torch.get_default_dtype)
    put("torch.backends.mkldnn.enabled", lambda: torch.backends.mkldnn.enabled)
    put("torch.get_num_threads", torch.get_num_threads)
    for dev in ("cpu", "cuda"):
        put(f"autocast.{dev}.enabled", functools.partial(_autocast_enabled, torch, dev))
        put(f"autocast.{dev}.dtype", functools.partial(_autocast_dtype, torch, dev))
    if "torch_npu" in sys.modules:
        npu: Any = getattr(torch, "npu", None)  # added by torch_npu; a missing flag is skipped
        put("torch.npu.matmul.allow_hf32", lambda: npu.matmul.allow_hf32)
        put("torch.npu.conv.allow_hf32", lambda: npu.conv.allow_hf32)
        put("autocast.npu.enabled", lambda: torch.is_autocast_enabled("npu"))
    return {"flags": flags}


# Autocast's state by device: torch >= 2.4 takes the device as an argument; before it, one
# function per device (the GPU's named "gpu", without an argument). Both are read, so that
# packs of two torch versions record the same flags.


def _autocast_enabled(torch: Any, dev: str) -> bool:
    if hasattr(torch, "get_autocast_dtype"):  # the device-argument API came with it (2.4)
        return bool(torch.is_autocast_enabled(dev))
    return bool(torch.is_autocast_cpu_enabled() if dev == "cpu" else torch.is_autocast_enabled())


def _autocast_dtype(torch: Any, dev: str) -> Any:
    if hasattr(torch, "get_autocast_dtype"):
        return torch.get_autocast_dtype(dev)
    return torch.get_autocast_cpu_dtype() if dev == "cpu" else torch.get_autocast_gpu_dtype()
