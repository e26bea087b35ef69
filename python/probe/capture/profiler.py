"""``ApiProfiler``: the migration tutorial's dump step, on top of the :class:`Debugger`.

The tutorial writes ``profiler = ApiProfiler(); profiler.start()`` before the training loop
and ``profiler.stop(); profiler.save()`` after it, with the configuration found through the
``MSPROBE_PATH`` environment variable. There is no per-step call, so iterations are counted
by the agent (iterations.py) and ``dump_iter`` selects among them.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Union

import torch

from ..config import ConfigError
from .debugger import Debugger

#: The environment variable the tutorial's configuration is found through.
CONFIG_ENV = "MSPROBE_PATH"


class ApiProfiler:
    """Capture a whole training loop between :meth:`start` and :meth:`stop`.

    ``config``: a JSON file path or a dict in any shape the Debugger reads (probe's,
    msprobe's config.json, the tutorial's ``{"dump": ...}``); None = the file named by
    ``$MSPROBE_PATH``. ``model`` is optional: without it the first module called after
    :meth:`start` is taken as the model. Keyword overrides as for the Debugger.
    """

    def __init__(
        self,
        config: Union[str, os.PathLike[str], dict[str, Any], None] = None,
        model: Optional[torch.nn.Module] = None,
        **overrides: Any,
    ) -> None:
        if config is None:
            config = os.environ.get(CONFIG_ENV) or None
            if config is None:
                raise ConfigError(
                    f"ApiProfiler: no configuration: pass config= (a JSON path or dict) or "
                    f"set {CONFIG_ENV} to the JSON file"
                )
            if not os.path.isfile(config):
                raise ConfigError(f"{CONFIG_ENV}={config!r} is not a file")
        self.debugger = Debugger(config, model=model, **overrides)
        self.debugger._files.lazy = True
        self._counter = self.debugger._iteration_counter()
        self._active = False

    def start(self, model: Optional[torch.nn.Module] = None) -> None:
        """Begin capturing (hooks installed); iterations are counted from here on."""
        dbg = self.debugger
        if model is not None:
            dbg.model = model
        self._active = True
        if not dbg._explicit_steps:
            dbg._auto = self._counter
            self._counter.install()
        dbg.start()

    def stop(self) -> None:
        """End capturing; what was captured is on disk when this returns."""
        self._active = False
        self._counter.remove()
        self.debugger.stop()

    def step(self) -> None:
        """End this iteration and begin the next, by hand: automatic counting is off from
        the first call on (Debugger.step)."""
        self.debugger.step()
        if self._active:
            self.debugger.start()

    def save(self) -> None:
        """Make sure everything is written and closed (also done at interpreter exit)."""
        self._active = False
        self._counter.remove()
        self.debugger.close()
