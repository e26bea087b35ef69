"""Monkey-patching with undo: the one way the agent replaces attributes of other modules.

The capture agent wraps about 1,200 PyTorch callables while a step is captured, and a config
pack wraps the seed and random-draw functions of ``random``, numpy and torch. Both must put
back exactly what was there, in any order of installation, so both go through
:class:`Patches`. An attribute that a class only inherits (most ``torch.Tensor`` methods
live on ``TensorBase``) is restored by deleting the override rather than by pinning the
inherited value on the subclass.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("probe")


class Patch:
    """One replaced attribute: a handle whose :meth:`remove` puts back what was there."""

    __slots__ = ("_delete", "_previous", "name", "owner")

    def __init__(self, owner: Any, name: str, new: Any) -> None:
        self.owner = owner
        self.name = name
        if isinstance(owner, type):
            # An inherited attribute is restored by deleting the override; an own one from
            # the class dict (the descriptor itself: staticmethod, ...), not through getattr.
            self._delete = name not in owner.__dict__
            self._previous = None if self._delete else owner.__dict__[name]
        else:
            self._delete = False
            self._previous = getattr(owner, name)
        setattr(owner, name, new)

    def remove(self) -> None:
        if self._delete:
            delattr(self.owner, self.name)
        else:
            setattr(self.owner, self.name, self._previous)


class Patches:
    """A group of patches installed and removed together, at most one per attribute."""

    def __init__(self) -> None:
        self._live: dict[tuple[Any, str], Patch] = {}

    def replace(self, owner: Any, name: str, new: Any) -> Patch:
        """Set ``owner.name = new``; raises what ``setattr`` raises (nothing is recorded),
        and ValueError when this group already patched the attribute."""
        if (owner, name) in self._live:
            raise ValueError(f"{name} is already patched")
        patch = Patch(owner, name, new)
        self._live[(owner, name)] = patch
        return patch

    def __contains__(self, key: tuple[Any, str]) -> bool:
        """Whether ``(owner, name)`` is patched by this group."""
        return key in self._live

    def __bool__(self) -> bool:
        return bool(self._live)

    def remove_all(self) -> None:
        """Undo every patch, newest first; one that cannot be undone is logged, the rest
        are still undone."""
        while self._live:
            _, patch = self._live.popitem()
            try:
                patch.remove()
            except Exception as exc:  # noqa: BLE001 - keep restoring the rest
                log.warning("probe: could not restore %s: %s", patch.name, exc)
