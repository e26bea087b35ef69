"""API level: wrap the public callables listed in ``api_list.json`` and capture their calls.

The list is data so that it can be reviewed and edited without touching code. Wrappers are
installed by ``Debugger.start()`` and removed by ``stop()`` (through one
:class:`~probe._patch.Patches` group), so steps that are not captured run the original
functions with zero added cost. Inside an installed wrapper the fast path is a test that
Dynamo is not tracing (compiled.py) and one thread-local attribute test: only the thread
that called ``start()`` captures, and only
while it is not already inside a captured op (the reentrancy guard that keeps ``F.gelu``
from also reporting the ``torch`` calls it makes internally). A captured call becomes a
forward record (inputs before the call, outputs after) and, when autograd is on, a backward
record fed by gradient hooks (backward.py).
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import torch

from .._patch import Patches
from .compiled import compiler_call, compiling, tracer_patches
from .records import NESTED, UNWRITTEN, OpRecord, json_args, named_tensors, results, walk
from .stats import PLAIN, nonfinite_result

if TYPE_CHECKING:
    from .debugger import Debugger
    from .writer import RankFolder

# Data of the probe package (python/probe/api_list.json), not of this subpackage.
_LIST_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "api_list.json")


class _TLS(threading.local):
    """Per-thread capture flag: True while a thread's calls are captured, False while they
    are not (the agent's own work, a stopped Debugger), None on a thread the agent never
    set it on: its calls are captured only while it runs the captured step's backward
    (:func:`capturing`). The class attribute is the default for such threads."""

    active: Optional[bool] = None


tls = _TLS()

# Distributed collectives that write their result into their first argument.
_DIST_INPLACE = {
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather_coalesced",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "_all_gather_base",
    "_reduce_scatter_base",
    "all_to_all",
    "all_to_all_single",
    "recv",
    "irecv",
    "scatter",
    "gather",
}


#: The collectives among them that only write that argument: what it held before is not
#: their input (a gather's output buffer, often just allocated). The others read it too.
_DIST_WRITE_ONLY = frozenset(
    _DIST_INPLACE - {"all_reduce", "all_reduce_coalesced", "broadcast", "reduce"}
)


class Writes:
    """Where an in-place call writes, when that is not its first argument: ``dist.gather``
    fills ``gather_list``, its second (on the destination rank; it is None elsewhere). Its
    output was recorded as the tensor it sends, the gathered values were not. Passed as
    the call's ``inplace``, which it is (truthy)."""

    __slots__ = ("index", "key")

    def __init__(self, index: int, key: str) -> None:
        self.index = index
        self.key = key


#: ``True`` (the first argument), a :class:`Writes`, or ``False``: what an API writes.
Inplace = Union[bool, Writes]

#: The collectives that write another argument than their first.
_DIST_WRITES_AT = {"gather": Writes(1, "gather_list")}


def _holds_result(first: Any) -> bool:
    """Whether an in-place call's first argument can hold its result: a tensor, or a list
    of tensors (or of lists of tensors: all_gather_coalesced)."""
    if isinstance(first, torch.Tensor):
        return True
    return (
        isinstance(first, (list, tuple))
        and bool(first)
        and all(
            isinstance(x, torch.Tensor) or (isinstance(x, (list, tuple)) and _holds_result(x))
            for x in first
        )
    )


#: Views whose leaf input is never replaced by an autograd alias. ``p.expand_as(p)
#: .grad_fn.next_functions[0][0]`` is how FSDP, DeepSpeed, Megatron-LM and Apex reach a
#: parameter's gradient accumulator to hook it: through an alias they hooked the alias's
#: node, which no backward runs, and their gradient reduction never happened (FSDP's
#: gradients were None). Such a call's backward record lacks that leaf's gradient.
_LEAF_VIEWS = frozenset({"Tensor.expand_as", "Tensor.expand", "Tensor.view_as", "Tensor.view"})

#: The names an in-place call's first parameter (the argument it writes) has, for calls
#: that pass it by keyword, as FSDP2 calls ``reduce_scatter_single(output=..., input=...)``.
_TARGET_KEYS = (
    "tensor",
    "output",
    "output_tensor",
    "tensor_list",
    "output_tensor_list",
    "tensors",
    "output_tensor_lists",
)


def _target(
    args: tuple[Any, ...], kwargs: dict[str, Any], inplace: Inplace = True
) -> tuple[Optional[str], Any]:
    """The argument an in-place call writes (its first, unless ``inplace`` says where),
    and the keyword it was passed by (None: by position; ``(None, None)``: not given)."""
    if type(inplace) is Writes:
        if len(args) > inplace.index:
            return None, args[inplace.index]
        return (inplace.key, kwargs[inplace.key]) if inplace.key in kwargs else (None, None)
    if args:
        return None, args[0]
    if kwargs:
        for key in _TARGET_KEYS:
            if key in kwargs:
                return key, kwargs[key]
    return None, None


def _as_seen(
    snapshot: Callable[[torch.Tensor], torch.Tensor],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    inplace: Inplace = True,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """An in-place call's arguments as it saw them: the tensor it writes replaced by a
    snapshot (overflow mode keeps these in case the call overflows)."""
    key, first = _target(args, kwargs, inplace)
    if not isinstance(first, torch.Tensor) or type(inplace) is Writes:
        return args, kwargs
    if key is None:
        return (snapshot(first), *args[1:]), kwargs
    return args, {**kwargs, key: snapshot(first)}


def _result_of(out: Any, inplace: Inplace, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What holds a call's result: what it returned, or for an in-place call returning None
    (``__setitem__``, collectives) the argument it writes, when that can hold one (a list of
    tensors for all_gather and the _coalesced variants)."""
    if out is None and inplace:
        first = _target(args, kwargs, inplace)[1]
        if first is not None and _holds_result(first):
            return first
    return out


def load_api_list(path: Optional[str] = None) -> dict[str, list[str]]:
    """Read the hooked API list ({ApiType: [names]})."""
    with open(path or _LIST_PATH, encoding="utf-8") as fh:
        data = json.load(fh)
    return {k: list(v) for k, v in data.items() if not k.startswith("_")}


def is_inplace(api_type: str, name: str) -> Inplace:
    """In-place ops modify their first argument (or the one a :class:`Writes` names): its
    input stats must be taken before the call, and it must not be replaced by an autograd
    alias."""
    if api_type == "Distributed":
        return _DIST_WRITES_AT.get(name) or name in _DIST_INPLACE
    if name.startswith("__"):
        return name.startswith("__i") and name not in ("__invert__",) or name == "__setitem__"
    return name.endswith("_")


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
#: An autograd alias of a tensor, through which an input's gradient reaches a hook: the
#: ``aten::alias`` view, whose backward hands the gradient on as it comes. ``view_as``'s
#: reshapes it, which a sparse gradient (``F.embedding(..., sparse=True)``) cannot do: the
#: user's backward raised. An operator, not a hooked API: the wrappers never see it.
alias_of: Callable[[torch.Tensor], torch.Tensor] = torch.ops.aten.alias.default
_graph_task_id: Optional[Callable[[], int]] = getattr(torch._C, "_current_graph_task_id", None)


#: Frames of the agent between a hooked API's caller and ``ApiCapture._forward_record``: the
#: wrapper, the dispatch, ``ApiCapture.call``, ``_pre`` or ``_plain_pre``, and
#: ``_forward_record`` itself (stacks.py steps over them).
_API_FRAMES = 5


_peek_transform: Optional[Callable[[], Any]] = getattr(
    getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None
)


def in_transform() -> bool:
    """Whether a ``torch.func`` transform (``vmap``, ``grad``, ``jacrev``...) runs now. Its
    tensors are wrappers without storage of their own, holding one sample's view of a
    batch: calls made inside one are not captured (the Debugger says so once), where
    reading them switched capture off for the rest of the run."""
    return _peek_transform is not None and _peek_transform() is not None


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
        cap is not None
        and cap._dbg._api_on
        and _graph_task_id is not None
        and _graph_task_id() != -1
    )


def _after(was: Optional[bool], dbg: Debugger) -> Optional[bool]:
    """What this thread's flag returns to once a captured call's own work is done: the
    Debugger's API capture where it was set (a call may stop or start the Debugger), unset
    again on a thread that captures only while it runs a backward (:func:`capturing`)."""
    return None if was is None else dbg._api_on


def in_recompute() -> bool:
    """Whether a forward is being recomputed now (activation checkpointing): autograd runs
    a backward graph, with gradients on. A checkpoint recomputes with them on (it rebuilds
    the graph it then differentiates); a custom autograd function's backward runs with them
    off, and its calls (a tensor-parallel layer's gradient all-reduce) are not a recompute.
    A backward with ``create_graph=True`` (gradient penalties) runs with them on: calls in a
    custom backward there are marked as recomputed."""
    return _graph_task_id is not None and _graph_task_id() != -1 and torch.is_grad_enabled()


class ApiPatcher:
    """Installs and removes the wrappers. ``handler(orig, api, inplace, args, kwargs)`` runs
    a captured call; it is only reached when ``tls.active`` is set.

    There is one patcher per process (``PATCHER``): wrapping twice would make two agents
    see each other's calls. The running Debugger's :class:`ApiCapture` registers itself as
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
                    api, inplace = f"Distributed.{name}", False
                else:
                    api, inplace = f"{api_type}.{name}", is_inplace(api_type, name)
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
            from .distributed import p2p_op_patches
            from .waits import patches

            out.extend(patches(_current_waits))
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
        for owner, name, wrapper in self._wrappers:
            self._patches.replace(owner, name, wrapper)

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
        cap = None if compiling() else DISPATCH.current
        if cap is not None:
            cap.tensors_written([args[i] for i in at if i < len(args)])
        return out

    functools.update_wrapper(run, orig)
    run.__probe_wrapped__ = orig  # type: ignore[attr-defined]
    return run


def _storage_write(orig: Callable[..., Any], grows: bool) -> Any:
    def run(storage: Any, *args: Any, **kwargs: Any) -> Any:
        cap = None if compiling() else DISPATCH.current
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
        if compiling() or not capturing():
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
    return wrapper


class _Dispatch:
    """Routes captured calls to the Debugger that is running (at most one per process)."""

    current: Optional[ApiCapture] = None

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
            cap._dbg._note_transform(api)
            return orig(*args, **kwargs)
        return cap.call(orig, api, inplace, args, kwargs)


DISPATCH = _Dispatch()
PATCHER = ApiPatcher(DISPATCH)

# What the input side of a captured call hands to the output side: forward record,
# backward record (None without autograd), the (args, kwargs) that replace the call's own
# with autograd aliases (None when unchanged), the aliases by id, whether it is in place,
# whether its forward record is written (an api_list entry may select the backward only).
_Pending = tuple[
    OpRecord,
    Optional[OpRecord],
    Optional[tuple[tuple[Any, ...], dict[str, Any]]],
    dict[int, tuple[torch.Tensor, str]],
    Inplace,
    bool,
]


#: Recorded as the sends and receives it runs (:meth:`ApiCapture._batch_p2p`).
_BATCH_P2P = "Distributed.batch_isend_irecv"


class _Works:
    """The handles a coalesced batch of receives waits for, as ``Waits.coalesced`` reads a
    coalescing manager's."""

    def __init__(self, works: list[Any]) -> None:
        self.works = works


class ApiCapture:
    """Captures the calls of hooked APIs for one Debugger (reached only while
    ``tls.active``)."""

    def __init__(self, dbg: Debugger) -> None:
        self._dbg = dbg
        c = dbg.config
        self._select = dbg._select
        self._files = dbg._files
        self._modules = dbg._modules
        self._backward = dbg._backward
        self._stacks = dbg._stacks
        self._flow = dbg._flow
        #: ``id``s of the tensors a write-only collective is about to fill (:meth:`_pre`).
        self._write_only: frozenset[int] = frozenset()
        # The configuration, read on every call: plain attributes, not its properties.
        self._forward, self._bwd = c.forward, c.backward
        self._inputs, self._outputs = c.inputs, c.outputs
        #: Whether calls without a backward record take the plain path (:meth:`call`; never
        #: in overflow mode, which has its own).
        self._plain = not self._select.listed
        from .waits import Waits

        #: Records of collectives whose result arrives after the call (waits.py).
        self.waits = Waits(dbg)

    def call(
        self,
        orig: Callable[..., Any],
        api: str,
        inplace: Inplace,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run one call of a hooked API, capturing it when selected.

        A call that gets no backward record (grad mode off, as in an optimizer's step and
        ``no_grad`` code, or no backward captured) is *plain*: nothing replaces its
        arguments, so :meth:`_plain_pre` and :meth:`_plain_post` record it without the
        closures and argument walks of :meth:`_pre` and :meth:`_post`, which only calls
        whose inputs may become autograd aliases need. Most calls of a CPU training step are
        plain (docs/capture.md, "twelfth pass"). Both paths write the same records, byte for
        byte (``test_capture.py`` runs both). Overflow mode, an api_list (which may select
        one direction only) and collectives take the general path."""
        dbg = self._dbg
        plain = False
        if not (self._bwd and torch.is_grad_enabled()):
            if dbg._overflow:
                return self._call_checked(orig, api, inplace, args, kwargs)
            plain = self._plain and not api.startswith("Distributed.")
        # (not on the plain path, which takes no collective: the optimizer's calls)
        if not plain and api == _BATCH_P2P and not dbg._overflow:
            return self._batch_p2p(orig, args, kwargs)
        was = tls.active
        tls.active = False
        ctx: Optional[_Pending] = None
        fwd: Optional[OpRecord] = None  # a plain call's record
        try:
            with dbg._lock:
                if plain:
                    fwd = self._plain_pre(api, args, kwargs)
                else:
                    ctx = self._pre(api, inplace, args, kwargs)
                    if api.startswith("Distributed."):
                        meta = dbg._collectives.meta(api, orig, args, kwargs)
                        if ctx is not None and meta is not None:
                            ctx[0].group, ctx[0].coll_seq = meta
            if ctx is not None and ctx[2] is not None:
                args, kwargs = ctx[2]
        except Exception as exc:  # noqa: BLE001
            dbg._guard.fail(exc, f"capturing inputs of {api}")
            ctx = fwd = None
        try:
            out = orig(*args, **kwargs)
        finally:
            tls.active = _after(was, dbg)
        if ctx is None and fwd is None:
            return out
        tls.active = False
        try:
            with dbg._lock:
                if fwd is not None:
                    self._plain_post(fwd, inplace, args, kwargs, out)
                elif ctx is not None and self.waits.later(api, ctx[4], out):
                    self.waits.defer(api, out, functools.partial(self._post, ctx, args, kwargs))
                else:
                    assert ctx is not None
                    out = self._post(ctx, args, kwargs, out)
        except Exception as exc:  # noqa: BLE001
            dbg._guard.fail(exc, f"capturing outputs of {api}")
        finally:
            tls.active = _after(was, dbg)
        return out

    def _batch_p2p(
        self, orig: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """``batch_isend_irecv(ops)``: each ``P2POp`` is recorded as the ``isend`` or
        ``irecv`` it runs, with its tensor and the ``group``/``coll_seq`` of its rank pair,
        so that what a pipeline stage sends is paired with what the next one receives
        (compare's cross-rank analysis) as it is for single sends. The batch itself has no
        tensors to record. A receive's record is finished once its handle is waited on;
        when the backend coalesces the batch into fewer handles, once all of them are."""
        dbg = self._dbg
        was = tls.active
        tls.active = False
        sends: list[tuple[_Pending, tuple[Any, ...], dict[str, Any]]] = []
        recvs: list[tuple[int, str, _Pending, tuple[Any, ...], dict[str, Any]]] = []
        ops: list[Any] = []
        try:
            with dbg._lock:
                ops = list(args[0] if args else kwargs.get("p2p_op_list", ()))
                for i, op in enumerate(ops):
                    fn = getattr(op.op, "__probe_wrapped__", op.op)
                    name = "isend" if "send" in getattr(fn, "__name__", "") else "irecv"
                    api = f"Distributed.{name}"
                    a = (op.tensor,)
                    k = {"dst" if name == "isend" else "src": int(op.peer)}
                    ctx = self._pre(api, name == "irecv", a, k)
                    if ctx is None:
                        continue
                    meta = dbg._collectives.meta(api, fn, a, k)
                    if meta is not None:
                        ctx[0].group, ctx[0].coll_seq = meta
                    if name == "isend":
                        sends.append((ctx, a, k))
                    else:
                        recvs.append((i, api, ctx, a, k))
        except Exception as exc:  # noqa: BLE001
            dbg._guard.fail(exc, f"capturing inputs of {_BATCH_P2P}")
            sends, recvs = [], []
        try:
            out = orig(*args, **kwargs)
        finally:
            tls.active = _after(was, dbg)
        if not (sends or recvs):
            return out
        tls.active = False
        try:
            with dbg._lock:
                for ctx, a, k in sends:
                    self._post(ctx, a, k, None)
                works = list(out) if isinstance(out, (list, tuple)) else []
                finish = [
                    (i, api, functools.partial(self._post, ctx, a, k))
                    for i, api, ctx, a, k in recvs
                ]
                if works and len(works) == len(ops):  # a handle per op (gloo)
                    for i, api, done in finish:
                        self.waits.defer(api, works[i], done)
                elif finish:  # coalesced: the receives wait for every handle
                    self.waits.coalesced([(api, done) for _, api, done in finish], _Works(works))
        except Exception as exc:  # noqa: BLE001
            dbg._guard.fail(exc, f"capturing outputs of {_BATCH_P2P}")
        finally:
            tls.active = _after(was, dbg)
        return out

    def _plain_pre(
        self, api: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Optional[OpRecord]:
        """A plain call's record with its inputs (:meth:`call`), or None when the call is
        not selected."""
        fwd = self._forward_record(api)
        if fwd is None:
            return None
        if self._forward and self._inputs:
            self._record_inputs(fwd, args, kwargs)
            fwd.args = json_args(args, kwargs)
        return fwd

    def _plain_post(
        self,
        fwd: OpRecord,
        inplace: Inplace,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        out: Any,
    ) -> None:
        """A plain call's outputs, and its record finished (:meth:`call`)."""
        inplace = inplace or kwargs.get("inplace") is True
        self._note_writes(inplace, args, kwargs)
        produced = _result_of(out, inplace, args, kwargs)
        folder = self._files.folder
        assert folder is not None
        keep = self._forward and self._outputs
        if isinstance(produced, torch.Tensor):  # most results: no walk for them
            self._record_output(fwd, folder, keep, "output.0", produced)
        else:
            for name, t in named_tensors(results(produced), "output"):
                self._record_output(fwd, folder, keep, name, t)
        if self._forward:
            self._dbg._finish(fwd)

    def _forward_record(self, api: str) -> Optional[OpRecord]:
        """A selected call's forward record: numbered, in its module, with its stack; None
        when the call is not selected (it is counted either way)."""
        mods = self._modules.stack
        module = mods[-1] if mods else None
        call = self._select.api_call(api, module)
        if call is None:
            return None
        folder = self._files.folder
        fwd = OpRecord(f"{api}.{call}.forward", "api", "forward", module, folder)
        fwd.recompute = in_recompute()
        if self._dbg._call_stacks:
            fwd.stack = self._stacks.stack_id(folder, _API_FRAMES)
        return fwd

    def memory_written(self, storage: Any) -> None:
        """A storage's bytes are about to change through the storage itself
        (:func:`_memory_patches`)."""
        if self._dbg._dataflow:
            self._flow.note_storage(storage)

    def tensors_written(self, written: list[Any]) -> None:
        """The tensors in ``written`` (lists of them) were written in place by an operator
        that bumps no version counter (:data:`_UNVERSIONED_WRITES`)."""
        if self._dbg._dataflow:
            self._flow.note_write(written)

    def memory_allocated(self, storage: Any, t: Optional[torch.Tensor]) -> None:
        """``storage`` (or ``t``'s) was just allocated, its bytes not written yet
        (:func:`_memory_patches`)."""
        if self._dbg._dataflow:
            try:
                if t is not None:
                    if t.layout is not torch.strided or t.is_nested or type(t) not in PLAIN:
                        return
                    storage = t.untyped_storage()
                self._flow.mark_unwritten(storage, t)
            except Exception:  # noqa: BLE001 - a tensor without storage
                return

    def _note_writes(self, inplace: Inplace, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """What a call wrote in place, through whichever tensor object: records kept of
        tensors sharing that storage no longer stand for them (``Dataflow.note_write``)."""
        if inplace:
            # (most in-place calls write their first positional argument: no lookup)
            first = args[0] if args and inplace is True else _target(args, kwargs, inplace)[1]
            if first is not None:
                self._flow.note_write(first)
        if kwargs and "out" in kwargs:
            self._flow.note_write(kwargs["out"])

    def _record_inputs(self, fwd: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Record the tensor arguments of a call that keeps them (no autograd alias replaces
        any, as :meth:`_pre` does for a call with a backward record)."""
        for key, a in (*enumerate(args), *kwargs.items()):
            if isinstance(a, torch.Tensor):  # most arguments: no walk for them
                self._record_input(fwd, f"input.{key}", a)
            elif isinstance(a, NESTED):
                for name, t in named_tensors(a, f"input.{key}"):
                    self._record_input(fwd, name, t)

    def _record_input(self, fwd: OpRecord, name: str, t: torch.Tensor) -> None:
        """One input tensor, linked to the captured output it came from (``src``); a tensor
        captured before as it is now reuses that record's statistics (``Dataflow``)."""
        flow = self._flow
        src, same, mem = flow.source(t)
        pre = None
        if same is None and flow.fresh and flow.unwritten(t, id(t) in self._write_only):
            pre = UNWRITTEN
        rec = self._dbg._add_tensor(fwd, f"{fwd.key}.{name}", "input", t, False, pre, same)
        if src is not None:
            rec["src"] = src
        if same is None:
            flow.remember(t, fwd.entries[-1], mem)

    def _record_output(
        self, fwd: OpRecord, folder: RankFolder, keep: bool, name: str, t: torch.Tensor
    ) -> None:
        """One output tensor: recorded when ``keep`` (outputs are captured) with the id
        later inputs link to, else only given that id. An output that is an input (``x.float()``
        on float) reuses its statistics."""
        flow = self._flow
        if not keep:
            flow.register(t, folder)
            return
        same, mem = flow.find(t)
        pre = UNWRITTEN if same is None and flow.fresh and flow.unwritten(t) else None
        rec = self._dbg._add_tensor(fwd, f"{fwd.key}.{name}", "output", t, False, pre, same)
        rec["id"] = flow.register(t, folder, fwd.entries[-1], mem)

    def _call_checked(
        self,
        orig: Callable[..., Any],
        api: str,
        inplace: Inplace,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Overflow mode, a call without a backward record (grad off, as in optimizer
        steps, or no backward direction): run it, check what it produced, and only build
        its record when that holds NaN/Inf. Most calls of a step take this path, so it
        allocates nothing but an in-place op's snapshot of its first argument."""
        dbg = self._dbg
        was = tls.active
        tls.active = False
        call: Optional[int] = None
        meta: Optional[tuple[list[int], int]] = None
        try:
            with dbg._lock:
                if api.startswith("Distributed."):
                    meta = dbg._collectives.meta(api, orig, args, kwargs)
                mods = self._modules.stack
                module = mods[-1] if mods else None
                call = self._select.api_call(api, module)
                if call is not None:
                    if not self._forward or (
                        self._select.listed and not self._select.list_directions(api, module)[0]
                    ):
                        call = None
                    elif not inplace and kwargs.get("inplace") is True:
                        inplace = True
                folder = self._files.folder
                seen = None  # (the call's own arguments)
                if call is not None and inplace:
                    # The value the op saw, kept in case it overflows (it changes in place).
                    seen = _as_seen(dbg._snapshot, args, kwargs, inplace)
        except Exception as exc:  # noqa: BLE001
            dbg._guard.fail(exc, f"capturing inputs of {api}")
            call = None
        try:
            out = orig(*args, **kwargs)
        finally:
            tls.active = _after(was, dbg)
        if call is None:
            return out
        tls.active = False
        try:
            with dbg._lock:
                if self.waits.later(api, inplace, out):
                    check = functools.partial(
                        self._check, api, call, module, folder, meta, seen, kwargs, inplace, args
                    )
                    self.waits.defer(api, out, check)
                else:
                    self._check(api, call, module, folder, meta, seen, kwargs, inplace, args, out)
        except Exception as exc:  # noqa: BLE001
            dbg._guard.fail(exc, f"capturing outputs of {api}")
        finally:
            tls.active = _after(was, dbg)
        return out

    def _check(
        self,
        api: str,
        call: int,
        module: Optional[str],
        folder: Optional[RankFolder],
        meta: Optional[tuple[list[int], int]],
        seen: Optional[tuple[tuple[Any, ...], dict[str, Any]]],
        kwargs: dict[str, Any],
        inplace: Inplace,
        args: tuple[Any, ...],
        out: Any,
    ) -> None:
        """Overflow mode: the record of a call (:meth:`_call_checked`) when its result holds
        NaN/Inf."""
        dbg = self._dbg
        produced = _result_of(out, inplace, args, kwargs)
        if (
            folder is not None
            and folder is self._files.folder
            and dbg._overflow_left != 0
            and nonfinite_result(produced)
        ):
            fwd = OpRecord(f"{api}.{call}.forward", "api", "forward", module, folder)
            fwd.recompute = in_recompute()
            if meta is not None:
                fwd.group, fwd.coll_seq = meta
            fwd.call_args = seen if seen is not None else (args, kwargs)
            fwd.call_out = produced
            dbg._finish(fwd)

    def _pre(
        self, api: str, inplace: Inplace, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Optional[_Pending]:
        fwd = self._forward_record(api)
        if fwd is None:
            return None
        dbg = self._dbg
        forward, backward = self._forward, self._bwd
        if self._select.listed:
            f, b = self._select.list_directions(api, fwd.module)
            forward, backward = forward and f, backward and b
        if not inplace and kwargs and kwargs.get("inplace") is True:
            inplace = True
        bwd: Optional[OpRecord] = None
        if backward and torch.is_grad_enabled():
            # Api.name.N.backward, beside the forward record's key.
            key = f"{fwd.key.rpartition('.')[0]}.backward"
            bwd = OpRecord(key, "api", "backward", fwd.module, fwd.folder)
            bwd.stack = fwd.stack
        aliases: dict[int, tuple[torch.Tensor, str]] = {}  # id(alias) -> (input, its slot)
        made: dict[int, torch.Tensor] = {}  # id(input) -> its alias
        # Overflow mode records inputs only once the op is known to have overflowed.
        want_fwd_in = forward and self._inputs and not dbg._overflow
        # Inputs that get an autograd alias, so that the backward sees their gradients.
        alias_in = bwd is not None and self._outputs and not api.startswith("Distributed.")
        keep_leaves = api in _LEAF_VIEWS
        bkey = bwd.key if bwd is not None else ""
        watch = self._backward.watch

        def on_input(name: str, t: torch.Tensor) -> torch.Tensor:
            if want_fwd_in:  # (never in overflow mode: the dataflow is on)
                self._record_input(fwd, name, t)
            first = inplace and name == "input.0"
            if (
                alias_in
                and not first
                and t.requires_grad
                and t.layout == torch.strided
                and not (keep_leaves and t.is_leaf)
            ):
                assert bwd is not None
                # One alias per tensor: a tensor passed twice is one object to the op too
                # (attention takes a packed projection when ``query is key``). Its gradient
                # is then the total over its positions, under the first one's name.
                alias = made.get(id(t))
                if alias is None:
                    alias = made[id(t)] = alias_of(t)
                    aliases[id(alias)] = (t, name)
                    watch(bwd, alias.grad_fn, 0, f"{bkey}.output{name[5:]}", "output")
                return alias
            return t

        new: Optional[tuple[tuple[Any, ...], dict[str, Any]]] = None
        if alias_in:
            # Inputs may be replaced by aliases: the call gets the rebuilt arguments.
            new_args = walk(args, "input", on_input) if args else args
            new_kwargs = (
                {k: walk(v, f"input.{k}", on_input) for k, v in kwargs.items()}
                if kwargs
                else kwargs
            )
            new = (tuple(new_args), new_kwargs)
        elif want_fwd_in:
            if inplace and api.startswith("Distributed.") and api[12:] in _DIST_WRITE_ONLY:
                target = _target(args, kwargs, inplace)[1]
                self._write_only = frozenset(
                    id(t)
                    for _, t in named_tensors(target, "")  # (a tensor or lists of them)
                )
                try:
                    self._record_inputs(fwd, args, kwargs)
                finally:
                    self._write_only = frozenset()
            else:
                self._record_inputs(fwd, args, kwargs)
        if dbg._overflow:
            # The value an in-place op saw, kept in case it overflows (it changes in place).
            fwd.call_args = (
                _as_seen(dbg._snapshot, args, kwargs, inplace) if inplace else (args, kwargs)
            )
        elif want_fwd_in:
            fwd.args = json_args(args, kwargs)
        if bwd is not None and bwd.expect:
            return (fwd, bwd, new, aliases, inplace, forward)
        return (fwd, bwd, None, aliases, inplace, forward)

    def _post(self, ctx: _Pending, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        fwd, bwd, _, aliases, inplace, forward = ctx
        dbg = self._dbg
        folder = self._files.folder
        flow = self._flow if dbg._dataflow else None
        if flow is not None:
            self._note_writes(inplace, args, kwargs)
        ident = None  # the input slot an identity op returns
        if aliases and isinstance(out, torch.Tensor) and id(out) in aliases:
            out, ident = aliases[id(out)]  # identity ops (x.float() on float) return their input
        result = out
        out = _result_of(out, inplace, args, kwargs)
        want_out = forward and self._outputs and not dbg._overflow
        grads_in = bwd is not None and self._inputs
        if flow is not None or grads_in:
            bkey = bwd.key if bwd is not None else ""
            watch = self._backward.watch

            assert folder is not None
            for name, t in named_tensors(results(out), "output"):
                if flow is not None:  # (outputs are recorded only when it is: want_out)
                    self._record_output(fwd, folder, want_out, name, t)
                if grads_in and t.requires_grad and t.grad_fn is not None:
                    assert bwd is not None
                    watch(bwd, t.grad_fn, t.output_nr, f"{bkey}.input{name[6:]}", "input")
        if ident is not None and bwd is not None and result.grad_fn is not None:
            # The op returned its input, not the alias whose gradient was to reach the
            # record: that one never comes. The input's gradient through an identity is
            # its output's, so it is taken there, as a cast that copies would give it (a
            # float32 run's x.float() against a bfloat16 run's then pair call for call).
            bwd.expect -= 1
            self._backward.watch(
                bwd, result.grad_fn, result.output_nr, f"{bwd.key}.output{ident[5:]}", "output"
            )
        if dbg._overflow:
            fwd.call_out = out
        if forward:
            dbg._finish(fwd)
        if bwd is not None and bwd.expect:
            self._backward.pending.append(bwd)
        return result
