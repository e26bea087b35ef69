"""probe capture agent: dump PyTorch operator data for ``probe compare``.

Five lines::

    import probe
    dbg = probe.Debugger("probe.json")     # or probe.Debugger(None, dump_path="dump", level="mix")
    dbg.start(model)
    ...                                    # forward, backward, optimizer step
    dbg.stop(); dbg.step()
"""

from __future__ import annotations

__version__ = "0.1.0"

from .config import CaptureConfig, ConfigError, load_config  # noqa: E402
from .debugger import Debugger, seed_all  # noqa: E402
from .config_pack import ConfigPack  # noqa: E402

__all__ = [
    "Debugger",
    "seed_all",
    "ConfigPack",
    "CaptureConfig",
    "ConfigError",
    "load_config",
    "__version__",
]
