"""API-level hooking: wrap the public callables listed in ``api_list.json``.

The list is data so that it can be reviewed and edited without touching code. Wrappers are
installed by ``Debugger.start()`` and removed by ``stop()``, so steps that are not captured
run the original functions with zero added cost. Inside an installed wrapper the fast path
is one thread-local attribute test: only the thread that called ``start()`` captures, and
only while it is not already inside a captured op (the reentrancy guard that keeps
``F.gelu`` from also reporting the ``torch`` calls it makes internally).
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import os
import threading
from typing import Any, Callable, Optional

log = logging.getLogger("probe")

_LIST_PATH = os.path.join(os.path.dirname(__file__), "api_list.json")


class _TLS(threading.local):
    """Per-thread capture flag. Class attribute = default for threads that never set it."""

    active: bool = False


tls = _TLS()

# Distributed collectives that write their result into their first argument.
_DIST_INPLACE = {
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "recv",
    "irecv",
    "scatter",
    "gather",
}


def load_api_list(path: Optional[str] = None) -> dict[str, list[str]]:
    """Read the hooked API list ({ApiType: [names]})."""
    with open(path or _LIST_PATH, encoding="utf-8") as fh:
        data = json.load(fh)
    return {k: list(v) for k, v in data.items() if not k.startswith("_")}


def is_inplace(api_type: str, name: str) -> bool:
    """In-place ops modify their first argument: its input stats must be taken before the
    call, and it must not be replaced by an autograd alias."""
    if api_type == "Distributed":
        return name in _DIST_INPLACE
    if name.startswith("__"):
        return name.startswith("__i") and name not in ("__invert__",) or name == "__setitem__"
    return name.endswith("_")


def _owners() -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    owners: dict[str, Any] = {"Torch": torch, "Functional": F, "Tensor": torch.Tensor}
    try:
        import torch.distributed as dist

        if dist.is_available():
            owners["Distributed"] = dist
    except Exception:  # noqa: BLE001 - optional
        pass
    try:
        owners["NPU"] = importlib.import_module("torch_npu")
    except Exception:  # noqa: BLE001 - torch_npu only exists on Ascend hosts
        pass
    return owners


CallHandler = Callable[[Callable[..., Any], str, bool, tuple, dict], Any]


class ApiPatcher:
    """Installs and removes the wrappers. ``handler(orig, api, inplace, args, kwargs)`` runs
    a captured call; it is only reached when ``tls.active`` is set.

    There is one patcher per process (``PATCHER``): wrapping twice would make two agents
    see each other's calls. The running Debugger registers itself as ``current``.
    """

    def __init__(self, handler: CallHandler, api_list: Optional[dict[str, list[str]]] = None):
        self._handler = handler
        self._api_list = api_list if api_list is not None else load_api_list()
        self._saved: list[tuple[Any, str, Any, bool]] = []
        self._wrappers: Optional[list[tuple[Any, str, Any]]] = None

    def _build(self) -> list[tuple[Any, str, Any]]:
        owners = _owners()
        out: list[tuple[Any, str, Any]] = []
        handler = self._handler
        for api_type, names in self._api_list.items():
            owner = owners.get(api_type)
            if owner is None:
                continue
            for name in names:
                orig = getattr(owner, name, None)
                if orig is None or not callable(orig) or isinstance(orig, type):
                    continue
                out.append(
                    (
                        owner,
                        name,
                        _make_wrapper(
                            handler, orig, f"{api_type}.{name}", is_inplace(api_type, name)
                        ),
                    )
                )
        return out

    def install(self) -> None:
        if self._saved:
            return
        if self._wrappers is None:
            self._wrappers = self._build()
        for owner, name, wrapper in self._wrappers:
            own = isinstance(owner, type) and name in owner.__dict__
            prev = owner.__dict__[name] if own else getattr(owner, name)
            self._saved.append((owner, name, prev, own or not isinstance(owner, type)))
            setattr(owner, name, wrapper)

    def uninstall(self) -> None:
        while self._saved:
            owner, name, prev, restore = self._saved.pop()
            try:
                if restore:
                    setattr(owner, name, prev)
                else:
                    delattr(owner, name)  # the method was inherited (TensorBase)
            except Exception as exc:  # noqa: BLE001 - keep restoring the rest
                log.warning("probe: could not restore %s: %s", name, exc)

    @property
    def installed(self) -> bool:
        return bool(self._saved)


def _make_wrapper(handler: CallHandler, orig: Callable[..., Any], api: str, inplace: bool) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not tls.active:
            return orig(*args, **kwargs)
        return handler(orig, api, inplace, args, kwargs)

    try:
        functools.update_wrapper(wrapper, orig)
    except Exception:  # noqa: BLE001 - some builtins lack attributes; cosmetic only
        pass
    wrapper.__probe_wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


class _Dispatch:
    """Routes captured calls to the Debugger that is running (at most one per process)."""

    current: Any = None

    def __call__(
        self, orig: Callable[..., Any], api: str, inplace: bool, args: tuple, kwargs: dict
    ) -> Any:
        dbg = self.current
        if dbg is None:
            return orig(*args, **kwargs)
        return dbg._api_call(orig, api, inplace, args, kwargs)


DISPATCH = _Dispatch()
PATCHER = ApiPatcher(DISPATCH)
