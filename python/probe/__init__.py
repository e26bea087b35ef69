"""probe capture agent: dump PyTorch operator data for ``probe compare``.

Five lines::

    import probe
    dbg = probe.Debugger("probe.json")     # or probe.Debugger(None, dump_path="dump", level="mix")
    dbg.start(model)
    ...                                    # forward, backward, optimizer step
    dbg.stop(); dbg.step()
"""

from __future__ import annotations

from ._version import __version__
from .capture import Debugger, seed_all
from .config import CaptureConfig, ConfigError, load_config
from .config_pack import ConfigPack

__all__ = [
    "Debugger",
    "seed_all",
    "ConfigPack",
    "CaptureConfig",
    "ConfigError",
    "load_config",
    "__version__",
]
