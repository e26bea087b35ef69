"""``ConfigChecker``: the migration tutorial's config-check step, on top of :class:`ConfigPack`.

The tutorial writes ``ConfigChecker.apply_patches(fmk="pytorch")`` at the top of the
training script and ``ConfigChecker(model, output_zip_path="./gpu_config_pack.zip",
fmk="pytorch")`` once the model is built, then runs until the zip exists. In ConfigPack's
terms: ``apply_patches`` creates the pack early, so the seed calls that follow are recorded
(ConfigPack's own early hooks), not knowing its path yet; the constructor names the zip and
captures env, packages, determinism flags, hyperparameters (``argv``) and the model's
initial weights, then fingerprints the model's inputs and counts random draws for
``steps`` iterations. No optimizer is handed over: torch's global optimizer step post-hook
finds the first one that steps (its hyperparameters join the pack) and each of its steps
ends an iteration; until one steps, each forward of the model after the first does, as in
ConfigPack without an optimizer. The zip is written after ``steps`` iterations (3
optimizer steps by default), or at :meth:`save`, or at exit.

The global hook is not removed once the pack is written: removing a hook while the
optimizer runs its hooks would break that optimizer step, so it stays, inert (one test per
optimizer step).
"""

from __future__ import annotations

import weakref
from typing import Any, ClassVar, Optional

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from ..config import ConfigError
from .pack import ConfigPack


def _check_fmk(fmk: str) -> None:
    if fmk != "pytorch":
        raise ConfigError(f"fmk: {fmk!r} is not supported; probe captures PyTorch (fmk='pytorch')")


class ConfigChecker:
    """Writes a config pack of this run (``probe config-check`` compares two of them)."""

    #: The pack created by :meth:`apply_patches`, until a ConfigChecker names its zip.
    _early: ClassVar[Optional[ConfigPack]] = None

    @classmethod
    def apply_patches(cls, fmk: str = "pytorch") -> None:
        """Start recording seed calls now (call it before seeding, at the top of the
        script); the pack is written by the ConfigChecker made later. Without one nothing
        is written. Calling it twice changes nothing."""
        _check_fmk(fmk)
        if cls._early is None:
            cls._early = ConfigPack(None)

    def __init__(
        self,
        model: Any = None,
        output_zip_path: str = "./config_check_pack.zip",
        fmk: str = "pytorch",
        steps: int = 3,
    ) -> None:
        _check_fmk(fmk)
        early, ConfigChecker._early = ConfigChecker._early, None
        if early is None:
            self.pack = ConfigPack(output_zip_path, steps=steps)
        else:
            self.pack = early
            self.pack.path = str(output_zip_path)
        self._optimizer: Optional[weakref.ReferenceType[torch.optim.Optimizer]] = None
        self.pack.capture(model=model, steps=steps)
        if self.pack.saved is None:
            register_optimizer_step_post_hook(self._on_optimizer_step)

    def _on_optimizer_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        """Each step of the first optimizer seen ends an iteration of the pack (ConfigPack's
        methods are guarded: nothing here raises into the training step)."""
        pack = self.pack
        if pack.saved is not None:
            return
        first = self._optimizer() if self._optimizer is not None else None
        if first is None:
            self._optimizer = weakref.ref(optimizer)
            pack.use_optimizer(optimizer)
        elif first is not optimizer:
            return
        pack.step()

    @property
    def output_zip_path(self) -> Optional[str]:
        """Where the zip is (to be) written."""
        return self.pack.path

    def save(self) -> Optional[str]:
        """Write the zip now; returns its path, or None when it could not be written."""
        return self.pack.save()
