"""The API wrappers: which callables are hooked (``api_list.json``), the wrappers put in
their place, and the one dispatch that routes a wrapped call to the capture running now.

Why apart from the capture of a call (api.py): the wrappers are process-wide (one
:data:`PATCHER`: wrapping twice would make two agents see each other's calls) and outlive
any one capture (they stay installed, inert, between captured steps), while what is
recorded of a call belongs to the running Debugger. The list is data so that it can be
reviewed and edited without touching code. Wrappers are installed by ``Debugger.start()``
and removed by ``stop()`` (through one :class:`~probe._patch.Patches` group), so steps that
are not captured run the original functions with zero added cost. Inside an installed
wrapper the fast path is a test that Dynamo is not tracing (compiled.py) and one
thread-local attribute test (threadstate.py): only the thread that called ``start()``
captures, and only while it is not already inside a captured op (the reentrancy guard that
keeps ``F.gelu`` from also reporting the ``torch`` calls it makes internally).

Besides the listed APIs the same group patches what the capture must see or must not see
around them: storage writes and allocations (for the dataflow), ``Work.wait`` and the
coalescing manager (waits.py), ``P2POp``'s check, printing and ``state_dict`` (not the
model's computation), and the scripting and tracing entry points (compiled.py).
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

import torch

from .._api_list import load_api_list
from .._op_key import api_name
from .._patch import Patches
from .compiled import compiler_call, compiler_memory, compiling, tracer_patches
from .forecast import AgentClock
from .inplace import Inplace, is_inplace
from .threadstate import graph_task_id, in_transform, tls
from .waits import Waits
from .waits import patches as wait_patches

if TYPE_CHECKING:
    from .context import HookContext


def _owners() -> dict[str, Any]:
    import torch.nn.functional as F

    owners: dict[str, Any] = {"Torch": torch, "Functional": F, "Tensor": torch.Tensor}
    vf = getattr(torch, "_VF", None)
    if vf is not None:
        owners["VF"] = vf
    try:
        import torch.distributed as dist

        if dist.is_available():
            owners["Distributed"] = dist
            # The collectives DTensor runs (tensor parallelism), as Distributed.<name>.
            owners["Funcol"] = importlib.import_module("torch.distributed._functional_collectives")
    except Exception:  # noqa: BLE001 - optional
        pass
    try:
        owners["NPU"] = importlib.import_module("torch_npu")
    except Exception:  # noqa: BLE001 - torch_npu only exists on Ascend hosts
        pass
    return owners


def _holder(owner: Any, name: str) -> tuple[Any, str]:
    """The object a listed name is an attribute of, and that attribute: ``linalg.vector_norm``
    under ``Torch`` is ``vector_norm`` of ``torch.linalg`` (msprobe's names for them)."""
    *path, attr = name.split(".")
    for part in path:
        owner = getattr(owner, part, None)
    return owner, attr


CallHandler = Callable[[Callable[..., Any], str, Inplace, tuple[Any, ...], dict[str, Any]], Any]


class Sink(Protocol):
    """What :data:`DISPATCH` routes the wrappers to: the running Debugger's API capture
    (``api.ApiCapture``)."""

    @property
    def ctx(self) -> HookContext:
        """The capture's context (whether API calls are captured now; transforms)."""
        ...

    @property
    def waits(self) -> Waits:
        """Its records that wait for a collective's result."""
        ...

    def call(
        self,
        orig: Callable[..., Any],
        api: str,
        inplace: Inplace,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run one call of a hooked API, capturing it when selected."""
        ...

    def memory_written(self, storage: Any) -> None:
        """A storage's bytes are about to change through the storage itself."""
        ...

    def tensors_written(self, written: list[Any]) -> None:
        """Tensors were written in place by an operator that bumps no version counter."""
        ...

    def memory_allocated(self, storage: Any, t: Optional[torch.Tensor]) -> None:
        """A storage (or ``t``'s) was just allocated, its bytes not written yet."""
        ...


def capturing() -> bool:
    """Whether this thread's calls of hooked APIs are captured now.

    Where a Debugger switched capture on (the thread that called ``start()``), its flag
    says. A thread it never switched captures while it runs a backward of the captured
    step: autograd runs an accelerator's backward on a device thread of its own (CUDA,
    NPU) while the thread that called ``backward()`` waits, and the calls made there (a
    checkpoint's recompute, a custom function's backward: a tensor-parallel layer's
    gradient all-reduce) are captured as the calling thread's are on CPU, where autograd
    runs the backward on it. Other threads (data loading) run no backward: not captured."""
    on = tls.active
    return bool(on) or (on is None and _backward_thread())


def _backward_thread() -> bool:
    """A backward runs on this thread while a Debugger captures API calls."""
    cap = DISPATCH.current
    return (
        cap is not None and cap.ctx.api_on and graph_task_id is not None and graph_task_id() != -1
    )


class ApiPatcher:
    """Installs and removes the wrappers. ``handler(orig, api, inplace, args, kwargs)`` runs
    a captured call; it is only reached when ``tls.active`` is set.

    There is one patcher per process (``PATCHER``): wrapping twice would make two agents
    see each other's calls. The running Debugger's ``api.ApiCapture`` registers itself as
    ``DISPATCH.current``.
    """

    def __init__(
        self, handler: CallHandler, api_list: Optional[dict[str, list[str]]] = None
    ) -> None:
        self._handler = handler
        self._api_list = api_list if api_list is not None else load_api_list()
        self._patches = Patches()
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
                holder, attr = _holder(owner, name)
                orig = getattr(holder, attr, None)
                if orig is None or not callable(orig) or isinstance(orig, type):
                    continue
                inplace: Inplace
                if api_type == "Funcol":  # functional: they return their result
                    api, inplace = api_name("Distributed", name), False
                else:
                    api, inplace = api_name(api_type, name), is_inplace(api_type, name)
                out.append((holder, attr, _make_wrapper(handler, orig, api, inplace)))
        out.extend(tracer_patches(self._unhooked))
        # Code that calls hooked APIs but is not the model's computation, each call of which
        # left a record: printing a tensor (``print(loss)``, ``repr``: reshape, isfinite,
        # masked_select, abs, min, max, ceil ..., some twenty calls) and taking a state
        # dict to save a checkpoint (a ``detach`` of every parameter and buffer).
        for owner, name in (
            (getattr(torch, "_tensor_str", None), "_str"),
            (torch.nn.Module, "state_dict"),
        ):
            orig = getattr(owner, name, None)
            if callable(orig):
                out.append((owner, name, _quiet(orig)))
        out.extend(_memory_patches())
        if "Distributed" in owners and "Distributed" in self._api_list:
            out.extend(wait_patches(_current_waits))
            out.extend(p2p_op_patches())
        return out

    def _unhooked(self, orig: Callable[..., Any]) -> Any:
        """``orig`` (a scripting or tracing entry point), run with the wrappers removed
        (compiled.py, :func:`~.compiled.tracer_patches`)."""

        def run(*args: Any, **kwargs: Any) -> Any:
            self.uninstall()
            try:
                return orig(*args, **kwargs)
            finally:
                self.install()

        functools.update_wrapper(run, orig)
        return run

    def hooks(self, api: str) -> bool:
        """Whether calls of ``api`` (``Functional.conv2d``) can be captured: it is in the
        list and exists in this PyTorch."""
        api_type, _, name = api.partition(".")
        owners = _owners()
        types = (api_type, "Funcol") if api_type == "Distributed" else (api_type,)
        return any(
            name in self._api_list.get(t, ())
            and callable(getattr(*_holder(owners.get(t), name), None))
            for t in types
        )

    def install(self) -> None:
        if self._patches:
            return
        if self._wrappers is None:
            self._wrappers = self._build()
        self._wrappers = [self._rewrapped(w) for w in self._wrappers]
        for owner, name, wrapper in self._wrappers:
            self._patches.replace(owner, name, wrapper)

    def _rewrapped(self, entry: tuple[Any, str, Any]) -> tuple[Any, str, Any]:
        """``entry``, or a wrapper of what its API is now when code replaced it since the
        wrapper was made (a library that patches ``F.silu`` or ``torch.rsqrt`` after a
        first Debugger session, a port's kernel swapped in between two runs of one
        process): the call made is the one captured."""
        owner, name, wrapper = entry
        orig = getattr(wrapper, "__probe_wrapped__", None)
        api = getattr(wrapper, "__probe_api__", None)
        now = getattr(owner, name, None)
        if (
            orig is None
            or api is None
            or now is None
            or now is orig
            or now is wrapper
            or not callable(now)
            or isinstance(now, type)
            or getattr(now, "__probe_wrapped__", None) is not None
        ):
            return entry
        return owner, name, _make_wrapper(self._handler, now, api, wrapper.__probe_inplace__)

    def uninstall(self) -> None:
        self._patches.remove_all()


def _quiet(orig: Callable[..., Any]) -> Any:
    """``orig``, run with capture off in this thread: what it calls is not the model's
    computation."""

    def run(*args: Any, **kwargs: Any) -> Any:
        was = tls.active
        tls.active = False
        try:
            return orig(*args, **kwargs)
        finally:
            tls.active = was

    functools.update_wrapper(run, orig)
    return run


#: The methods of a storage that change its bytes without a tensor's version counter
#: seeing it: FSDP (both) frees a gathered parameter's memory with ``resize_(0)`` after its
#: forward and allocates it again with ``resize_(n)`` before its backward.
_STORAGE_WRITES = ("resize_", "fill_", "copy_")
#: Operators that write tensors in place without bumping their version counters, with the
#: positions of the tensors (lists) they write: AMP's unscaling of the gradients (and its
#: ``found_inf``) before the optimizer step (``GradScaler.unscale_``), and the fused
#: Adam/AdamW steps (parameters, moments, steps). Without this, the optimizer's reads of the
#: gradients after unscaling were recorded with the statistics of the scaled gradients the
#: backward left, and ``found_inf`` with the zero it held before the check.
_UNVERSIONED_WRITES = (
    (torch, "_amp_foreach_non_finite_check_and_unscale_", (0, 1)),
    (torch, "_fused_adam_", (0, 2, 3, 4, 5)),
    (torch, "_fused_adamw_", (0, 2, 3, 4, 5)),
)
#: The calls that allocate memory and leave its bytes as they were (Dataflow.mark_unwritten).
_ALLOCATORS = (
    (torch, "empty"),
    (torch, "empty_like"),
    (torch, "empty_strided"),
    (torch.Tensor, "new_empty"),
    (torch.Tensor, "new_empty_strided"),
)


def _memory_patches() -> list[tuple[Any, str, Any]]:
    """Wrappers that tell the capturing Debugger's dataflow what the model does to memory
    outside the hooked APIs:

    - :data:`_STORAGE_WRITES` count as writes to the storage (``Dataflow.note_storage``),
      so the statistics kept of a tensor over it no longer stand for it. Without this,
      FSDP2's gathered parameters in backward were recorded with their forward
      statistics, while their memory held the bytes of a new allocation.
    - A storage grown by ``resize_``, and the result of an allocator in
      :data:`_ALLOCATORS`, is memory nothing wrote yet (``Dataflow.mark_unwritten``).
    """
    out: list[tuple[Any, str, Any]] = []
    storage_cls = getattr(torch, "UntypedStorage", None)
    for name in _STORAGE_WRITES:
        orig = getattr(storage_cls, name, None)
        if callable(orig):
            out.append((storage_cls, name, _storage_write(orig, name == "resize_")))
    for owner, name in _ALLOCATORS:
        orig = getattr(owner, name, None)
        if callable(orig):
            out.append((owner, name, _allocator(orig)))
    for owner, name, at in _UNVERSIONED_WRITES:
        orig = getattr(owner, name, None)
        if callable(orig):
            out.append((owner, name, _unversioned_write(orig, at)))
    return out


def _unversioned_write(orig: Callable[..., Any], at: tuple[int, ...]) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        out = orig(*args, **kwargs)
        cap = None if compiler_memory() else DISPATCH.current
        if cap is not None:
            cap.tensors_written([args[i] for i in at if i < len(args)])
        return out

    functools.update_wrapper(run, orig)
    run.__probe_wrapped__ = orig  # type: ignore[attr-defined]
    return run


def _storage_write(orig: Callable[..., Any], grows: bool) -> Any:
    def run(storage: Any, *args: Any, **kwargs: Any) -> Any:
        cap = None if compiler_memory(storage) else DISPATCH.current
        if cap is not None:
            cap.memory_written(storage)
        out = orig(storage, *args, **kwargs)
        if grows and cap is not None:
            cap.memory_allocated(storage, None)
        return out

    functools.update_wrapper(run, orig)
    run.__probe_wrapped__ = orig  # type: ignore[attr-defined]
    return run


def _allocator(orig: Callable[..., Any]) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        out = orig(*args, **kwargs)
        # Compiling first: Dynamo would turn a read of the flag into a guard (compiled.py).
        if compiling() or not capturing() or compiler_memory():
            return out
        cap = DISPATCH.current
        if cap is not None and isinstance(out, torch.Tensor):
            cap.memory_allocated(None, out)
        return out

    functools.update_wrapper(run, orig)
    run.__probe_wrapped__ = orig  # type: ignore[attr-defined]
    return run


def _current_waits() -> Any:
    """The capturing Debugger's records that wait for a collective's result (waits.py)."""
    cap = DISPATCH.current
    return cap.waits if cap is not None else None


def _make_wrapper(
    handler: CallHandler, orig: Callable[..., Any], api: str, inplace: Inplace
) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # Compiling first: Dynamo would turn a read of the flag into a guard (compiled.py).
        # (`capturing()`, inline: every call of a hooked API comes through here.)
        if compiling() or not (tls.active or (tls.active is None and _backward_thread())):
            return orig(*args, **kwargs)
        return handler(orig, api, inplace, args, kwargs)

    try:
        functools.update_wrapper(wrapper, orig)
    except Exception:  # noqa: BLE001 - some builtins lack attributes; cosmetic only
        pass
    wrapper.__probe_wrapped__ = orig  # type: ignore[attr-defined]
    wrapper.__probe_api__ = api  # type: ignore[attr-defined]
    wrapper.__probe_inplace__ = inplace  # type: ignore[attr-defined]
    return wrapper


class _Dispatch:
    """Routes captured calls to the Debugger that is running (at most one per process)."""

    current: Optional[Sink] = None
    #: Times the agent's share of each call during a step whose cost is measured
    #: (forecast.py); None otherwise.
    clock: Optional[AgentClock] = None

    def __call__(
        self,
        orig: Callable[..., Any],
        api: str,
        inplace: Inplace,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        cap = self.current
        if cap is None or compiler_call(args):  # (compiled.py)
            return orig(*args, **kwargs)
        if in_transform():
            cap.ctx.note_transform(api)
            return orig(*args, **kwargs)
        clock = self.clock
        if clock is not None and not api.startswith("Distributed."):
            return clock.call(cap.call, orig, api, inplace, args, kwargs)
        return cap.call(orig, api, inplace, args, kwargs)


DISPATCH = _Dispatch()
PATCHER = ApiPatcher(DISPATCH)


def p2p_op_patches() -> list[tuple[Any, str, Any]]:
    """``P2POp`` made while the API wrappers are in place gets torch's own function.

    ``dist.isend`` is then the agent's wrapper. ``P2POp(dist.isend, ...)`` checks its
    function against torch's ``isend``/``irecv`` (a ValueError stopped the user's pipeline
    schedule), and ``batch_isend_irecv`` tells sends from receives by identity. So P2POp's
    check and constructor see the function the wrapper wraps: ``(owner, name, new)``
    patches, installed and removed with the wrappers."""
    try:
        from torch.distributed import distributed_c10d as c10d
    except Exception:  # noqa: BLE001 - torch without distributed support
        return []
    out: list[tuple[Any, str, Any]] = []
    check = getattr(c10d, "_check_op", None)
    if callable(check):

        def _check_op(op: Any) -> Any:
            return check(_unwrapped(op))

        out.append((c10d, "_check_op", _check_op))
    p2p = getattr(c10d, "P2POp", None)
    init = vars(p2p).get("__init__") if isinstance(p2p, type) else None
    if callable(init):

        def __init__(self: Any, op: Any, *args: Any, **kwargs: Any) -> None:
            init(self, _unwrapped(op), *args, **kwargs)

        out.append((p2p, "__init__", __init__))
    return out


def _unwrapped(fn: Any) -> Any:
    """The function an API wrapper wraps (``__probe_wrapped__``), else ``fn``."""
    return getattr(fn, "__probe_wrapped__", fn)
