"""probe capture agent: dump PyTorch operator data for ``probe compare``.

Five lines::

    import probe
    dbg = probe.Debugger("probe.json")     # or probe.Debugger(None, dump_path="dump", level="mix")
    dbg.start(model)
    ...                                    # forward, backward, optimizer step
    dbg.stop(); dbg.step()

The migration tutorial's names work too (docs/tutorial.md): ``ConfigChecker`` (config
check) and ``ApiProfiler`` (dump, iterations counted by the agent).
"""

from __future__ import annotations

from ._version import __version__
from .capture import ApiProfiler, Debugger, seed_all
from .config import CaptureConfig, ConfigError, load_config
from .config_pack import ConfigChecker, ConfigPack

__all__ = [
    "Debugger",
    "ApiProfiler",
    "seed_all",
    "ConfigPack",
    "ConfigChecker",
    "CaptureConfig",
    "ConfigError",
    "load_config",
    "__version__",
]
