"""probe: capture PyTorch operator data in training, and the ``probe`` command that compares it.

Five lines::

    import probe
    dbg = probe.Debugger("probe.json")     # or probe.Debugger(None, dump_path="dump", level="mix")
    dbg.start(model)
    ...                                    # forward, backward, optimizer step
    dbg.stop(); dbg.step()

The migration tutorial's names work too (docs/tutorial.md): ``ConfigChecker`` (config
check) and ``ApiProfiler`` (dump, iterations counted by the agent).

The wheel also ships the Rust ``probe`` command (``python -m probe compare ...`` runs it;
:func:`binary` finds it). The names that need PyTorch are imported on first use, so the
command and ``import probe`` work in an environment without torch (an analysis box).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._cli import BinaryNotFound, binary
from ._version import __version__
from .config import CaptureConfig, ConfigError, load_config

if TYPE_CHECKING:
    from .capture import ApiProfiler, Debugger, seed_all
    from .config_pack import ConfigChecker, ConfigPack
    from .monitor import Monitor

# name -> submodule that defines it; these import torch.
_LAZY = {
    "Debugger": ".capture",
    "ApiProfiler": ".capture",
    "seed_all": ".capture",
    "Monitor": ".monitor",
    "ConfigPack": ".config_pack",
    "ConfigChecker": ".config_pack",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'probe' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module, __name__), name)
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise
        raise ModuleNotFoundError(
            f"probe.{name} needs PyTorch, which is not installed here: install the torch build"
            " of your platform (pip install torch, or your NPU vendor's torch for torch_npu)",
            name="torch",
        ) from None
    globals()[name] = value
    return value


__all__ = [
    "Debugger",
    "Monitor",
    "ApiProfiler",
    "seed_all",
    "ConfigPack",
    "ConfigChecker",
    "CaptureConfig",
    "ConfigError",
    "load_config",
    "binary",
    "BinaryNotFound",
    "__version__",
]
