"""What is captured: steps, ranks, op and module filters, the ``api_list``, the scope window,
and call counts.

Selection decides per call, on the hot path, so the common case (no filters) costs one
counter update: op keys carry a per-step call index (``Functional.gelu.0``), which is also
what patterns match against. Counters and the scope window restart every step.

The ``api_list`` (the tutorial's selection) is a union, unlike include/exclude: an op is
selected when any entry names its API or a module it runs inside (the module itself and
everything below it), and its directions are those of the entries that matched.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Optional

from ..config import (
    CaptureConfig,
    module_candidates,
    module_path_match,
    op_candidates,
    pattern_match,
)

#: Forward and backward wanted.
Directions = tuple[bool, bool]

_BEFORE, _INSIDE, _AFTER = 0, 1, 2  # where this step is relative to the scope window


class Selection:
    """The capture configuration's selection, with this step's counters."""

    def __init__(self, config: CaptureConfig) -> None:
        self._c = config
        self.filtered = bool(
            config.include
            or config.exclude
            or config.include_modules
            or config.exclude_modules
            or config.scope
            or config.api_list
        )
        #: The api_list by API name, and its module paths (resolved against the model by
        #: :meth:`resolve_modules`), each with its directions.
        self.listed = bool(config.api_list)
        self._list_apis: dict[str, Directions] = {}
        self._list_modules: list[tuple[str, bool, bool]] = []
        for e in config.api_list:
            if e.api is not None:
                f, b = self._list_apis.get(e.api, (False, False))
                self._list_apis[e.api] = (f or e.forward, b or e.backward)
            elif e.module is not None:
                self._list_modules.append((e.module, e.forward, e.backward))
        self._api_calls: dict[str, int] = {}
        self._module_calls: dict[str, int] = {}
        self._scope = _BEFORE
        #: Nothing more is captured in this run (overflow mode recorded ``overflow_nums``).
        self.closed = False

    def step(self, step: int) -> bool:
        """Whether step ``step`` is captured."""
        return not self.closed and (self._c.steps is None or step in self._c.steps)

    def rank(self, rank: int) -> bool:
        """Whether rank ``rank`` captures."""
        return self._c.ranks is None or rank in self._c.ranks

    def new_step(self) -> None:
        self._api_calls.clear()
        self._module_calls.clear()
        self._scope = _BEFORE

    def api_call(self, api: str, module: Optional[str]) -> Optional[int]:
        """Count a call of ``api`` (made inside module ``module``); its call index if it
        is selected, else None."""
        call = self._api_calls.get(api, 0)
        self._api_calls[api] = call + 1
        if self.closed:
            return None
        if self.filtered and not self._selected(op_candidates(api, call), module, api):
            return None
        return call

    def module_call(self, base: str, path: str, cls: str) -> Optional[int]:
        """Count a call of module ``base`` (``Module.{path}.{cls}``); its call index if it
        is selected, else None."""
        call = self._module_calls.get(base, 0)
        self._module_calls[base] = call + 1
        if self.closed:
            return None
        if self.filtered and not self._selected(module_candidates(path, cls, call), path):
            return None
        return call

    def module_parameters(self, path: str, cls: str) -> bool:
        """Whether a module's parameter gradients are captured (the filters, no scope)."""
        if self.listed and not self.list_directions(None, path)[1]:
            return False
        return self._filters_ok(module_candidates(path, cls, 0), path)

    def list_directions(self, api: Optional[str], module_path: Optional[str]) -> Directions:
        """The directions the api_list selects for a call of ``api`` (None: a module
        record) running in module ``module_path``."""
        fwd = bwd = False
        if api is not None:
            fwd, bwd = self._list_apis.get(api, (False, False))
        if module_path is not None:
            for path, f, b in self._list_modules:
                if (f and not fwd or b and not bwd) and module_path_match((path,), module_path):
                    fwd, bwd = fwd or f, bwd or b
        return fwd, bwd

    def resolve_modules(self, paths: Collection[str]) -> list[str]:
        """Match the api_list's module paths against the model's (``paths``): a path that is
        none of them but is one without its first component (``my_model.layer1`` ->
        ``layer1``, the model's variable name as the tutorial writes it) becomes that one.
        Returns the entries that match no module."""
        unmatched: list[str] = []
        resolved: list[tuple[str, bool, bool]] = []
        for path, f, b in self._list_modules:
            if path not in paths:
                rest = path.partition(".")[2]
                if rest in paths:
                    path = rest
                else:
                    unmatched.append(path)
            resolved.append((path, f, b))
        self._list_modules = resolved
        return unmatched

    def _selected(
        self, names: tuple[str, ...], module_path: Optional[str], api: Optional[str] = None
    ) -> bool:
        c = self._c
        if c.scope is not None:
            first, last = c.scope
            if self._scope == _BEFORE:
                if not pattern_match((first,), names):
                    return False
                self._scope = _INSIDE
            if self._scope == _AFTER:
                return False
            if last is not None and pattern_match((last,), names):
                self._scope = _AFTER
        if self.listed and self.list_directions(api, module_path) == (False, False):
            return False
        return self._filters_ok(names, module_path)

    def _filters_ok(self, names: tuple[str, ...], module_path: Optional[str]) -> bool:
        """The include/exclude filters on op names and module paths (no scope state)."""
        c = self._c
        if c.include and not pattern_match(c.include, names):
            return False
        if c.exclude and pattern_match(c.exclude, names):
            return False
        if c.include_modules and not module_path_match(c.include_modules, module_path):
            return False
        if c.exclude_modules and module_path_match(c.exclude_modules, module_path):
            return False
        return True
