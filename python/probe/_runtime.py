"""Where this process runs: its distributed rank and its device.

The capture agent selects ranks and names dump folders by rank, and a config pack records
the rank and device it was taken on; both must agree on what "the rank" is, so it is decided
here once: ``torch.distributed`` when a process group is up, else ``$RANK`` (set by
``torchrun`` before the group exists), else 0.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

DEVICES = ("cpu", "cuda", "npu")


def _from_job(what: str, env: str, default: int) -> int:
    """``torch.distributed``'s ``get_<what>()`` when a process group is up, else ``$<env>``
    (set by ``torchrun`` before the group exists), else ``default``."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(getattr(dist, f"get_{what}")())
    except Exception:  # noqa: BLE001 - a broken or partial torch.distributed: fall back
        pass
    try:
        return int(os.environ.get(env, str(default)))
    except ValueError:
        return default


def current_rank() -> int:
    """This process's rank: the process group's, else ``$RANK``, else 0."""
    return _from_job("rank", "RANK", 0)


def world_size() -> int:
    """The job's number of ranks, by the same rule as :func:`current_rank`: the process
    group's, else ``$WORLD_SIZE``, else 1."""
    return max(1, _from_job("world_size", "WORLD_SIZE", 1))


def device_kind() -> str:
    """The host's accelerator: ``npu`` (torch_npu loaded and a device present), ``cuda``,
    else ``cpu``. Never imports torch or torch_npu itself."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return "cpu"
    try:
        if "torch_npu" in sys.modules and torch.npu.is_available():
            return "npu"
    except Exception:  # noqa: BLE001
        pass
    try:
        if torch.cuda.is_available():
            return "cuda"
    except Exception:  # noqa: BLE001
        pass
    return "cpu"


def model_device(configured: Optional[str], model: Any) -> str:
    """The device a dump says it was taken on: the configured one, else the device type of
    the model's first parameter, else (and for any other type) ``cpu``."""
    device = configured
    if device is None and model is not None:
        p = next(model.parameters(), None)
        device = p.device.type if p is not None else None
    if device is None or device not in DEVICES:
        return "cpu"
    return device
