"""API level: the capture of one call of a hooked API (the wrappers are patcher.py's).

A captured call becomes a forward record (inputs before the call, outputs after) and, when
autograd is on, a backward record fed by gradient hooks (backward.py): inputs that require
grad reach the call as autograd aliases whose nodes are hooked. What each tensor becomes is
the recorder's (recorder.py); this module decides which tensors of a call are recorded,
under which names, and when: an in-place call's written argument before the call
(inplace.py), a collective's result once it is in place (waits.py), the sends and
receives of a ``batch_isend_irecv`` one by one.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from .._op_key import api_backward, api_key, api_name
from .backward import BackwardHooks, alias_of
from .context import HookContext
from .inplace import DIST_WRITE_ONLY, Inplace, as_seen, result_of, target
from .modules import ModuleHooks
from .records import NESTED, UNWRITTEN, OpRecord, json_args, named_tensors, results, walk
from .stats import PLAIN, nonfinite_result
from .threadstate import in_recompute, tls
from .waits import Waits

if TYPE_CHECKING:
    from .writer import RankFolder

#: Views whose leaf input is never replaced by an autograd alias. ``p.expand_as(p)
#: .grad_fn.next_functions[0][0]`` is how FSDP, DeepSpeed, Megatron-LM and Apex reach a
#: parameter's gradient accumulator to hook it: through an alias they hooked the alias's
#: node, which no backward runs, and their gradient reduction never happened (FSDP's
#: gradients were None). Such a call's backward record lacks that leaf's gradient.
_LEAF_VIEWS = frozenset({"Tensor.expand_as", "Tensor.expand", "Tensor.view_as", "Tensor.view"})


#: Frames of the agent between a hooked API's caller and ``ApiCapture._forward_record``: the
#: wrapper, the dispatch, ``ApiCapture.call``, ``_pre`` or ``_plain_pre``, and
#: ``_forward_record`` itself (stacks.py steps over them).
_API_FRAMES = 5


def _after(was: Optional[bool], ctx: HookContext) -> Optional[bool]:
    """What this thread's flag returns to once a captured call's own work is done: the
    capture's API flag where it was set (a call may stop or start the Debugger), unset
    again on a thread that captures only while it runs a backward (``patcher.capturing``)."""
    return None if was is None else ctx.api_on


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

    def __init__(self, ctx: HookContext, modules: ModuleHooks, backward: BackwardHooks) -> None:
        #: The capture's context (patcher.Sink).
        self.ctx = ctx
        c = ctx.config
        rec = ctx.recorder
        self._rec = rec
        self._select = ctx.select
        self._collectives = ctx.collectives
        self._files = rec.files
        self._modules = modules
        self._backward = backward
        self._stacks = rec.stacks
        self._flow = rec.flow
        # What the recorder does, fixed for the capture's life: read on every call.
        self._overflow, self._dataflow = rec.overflow, rec.dataflow
        self._call_stacks = rec.call_stacks
        #: ``id``s of the tensors a write-only collective is about to fill (:meth:`_pre`).
        self._write_only: frozenset[int] = frozenset()
        # The configuration, read on every call: plain attributes, not its properties.
        self._forward, self._bwd = c.forward, c.backward
        self._inputs, self._outputs = c.inputs, c.outputs
        #: Whether calls without a backward record take the plain path (:meth:`call`; never
        #: in overflow mode, which has its own).
        self._plain = not self._select.listed
        #: Records of collectives whose result arrives after the call (waits.py).
        self.waits = Waits(ctx)

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
        ctx = self.ctx
        plain = False
        if not (self._bwd and torch.is_grad_enabled()):
            if self._overflow:
                return self._call_checked(orig, api, inplace, args, kwargs)
            plain = self._plain and not api.startswith("Distributed.")
        # (not on the plain path, which takes no collective: the optimizer's calls)
        if not plain and api == _BATCH_P2P and not self._overflow:
            return self._batch_p2p(orig, args, kwargs)
        was = tls.active
        tls.active = False
        pending: Optional[_Pending] = None
        fwd: Optional[OpRecord] = None  # a plain call's record
        try:
            with ctx.lock:
                if plain:
                    fwd = self._plain_pre(api, args, kwargs)
                else:
                    pending = self._pre(api, inplace, args, kwargs)
                    if api.startswith("Distributed."):
                        meta = self._collectives.meta(api, orig, args, kwargs)
                        if pending is not None and meta is not None:
                            pending[0].group, pending[0].coll_seq = meta
            if pending is not None and pending[2] is not None:
                args, kwargs = pending[2]
        except Exception as exc:  # noqa: BLE001
            ctx.guard.fail(exc, f"capturing inputs of {api}")
            pending = fwd = None
        try:
            out = orig(*args, **kwargs)
        finally:
            tls.active = _after(was, ctx)
        if pending is None and fwd is None:
            return out
        tls.active = False
        try:
            with ctx.lock:
                if fwd is not None:
                    self._plain_post(fwd, inplace, args, kwargs, out)
                elif pending is not None and self.waits.later(api, pending[4], out):
                    self.waits.defer(api, out, functools.partial(self._post, pending, args, kwargs))
                else:
                    assert pending is not None
                    out = self._post(pending, args, kwargs, out)
        except Exception as exc:  # noqa: BLE001
            ctx.guard.fail(exc, f"capturing outputs of {api}")
        finally:
            tls.active = _after(was, ctx)
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
        ctx = self.ctx
        was = tls.active
        tls.active = False
        sends: list[tuple[_Pending, tuple[Any, ...], dict[str, Any]]] = []
        recvs: list[tuple[int, str, _Pending, tuple[Any, ...], dict[str, Any]]] = []
        ops: list[Any] = []
        try:
            with ctx.lock:
                ops = list(args[0] if args else kwargs.get("p2p_op_list", ()))
                for i, op in enumerate(ops):
                    fn = getattr(op.op, "__probe_wrapped__", op.op)
                    name = "isend" if "send" in getattr(fn, "__name__", "") else "irecv"
                    api = api_name("Distributed", name)
                    a = (op.tensor,)
                    k = {"dst" if name == "isend" else "src": int(op.peer)}
                    pending = self._pre(api, name == "irecv", a, k)
                    if pending is None:
                        continue
                    meta = self._collectives.meta(api, fn, a, k)
                    if meta is not None:
                        pending[0].group, pending[0].coll_seq = meta
                    if name == "isend":
                        sends.append((pending, a, k))
                    else:
                        recvs.append((i, api, pending, a, k))
        except Exception as exc:  # noqa: BLE001
            ctx.guard.fail(exc, f"capturing inputs of {_BATCH_P2P}")
            sends, recvs = [], []
        try:
            out = orig(*args, **kwargs)
        finally:
            tls.active = _after(was, ctx)
        if not (sends or recvs):
            return out
        tls.active = False
        try:
            with ctx.lock:
                for pending, a, k in sends:
                    self._post(pending, a, k, None)
                works = list(out) if isinstance(out, (list, tuple)) else []
                finish = [
                    (i, api, functools.partial(self._post, pending, a, k))
                    for i, api, pending, a, k in recvs
                ]
                if works and len(works) == len(ops):  # a handle per op (gloo)
                    for i, api, done in finish:
                        self.waits.defer(api, works[i], done)
                elif finish:  # coalesced: the receives wait for every handle
                    self.waits.coalesced([(api, done) for _, api, done in finish], _Works(works))
        except Exception as exc:  # noqa: BLE001
            ctx.guard.fail(exc, f"capturing outputs of {_BATCH_P2P}")
        finally:
            tls.active = _after(was, ctx)
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
        produced = result_of(out, inplace, args, kwargs)
        folder = self._files.folder
        assert folder is not None
        keep = self._forward and self._outputs
        if isinstance(produced, torch.Tensor):  # most results: no walk for them
            self._record_output(fwd, folder, keep, "output.0", produced)
        else:
            for name, t in named_tensors(results(produced), "output"):
                self._record_output(fwd, folder, keep, name, t)
        if self._forward:
            self._rec.finish(fwd)

    def _forward_record(self, api: str) -> Optional[OpRecord]:
        """A selected call's forward record: numbered, in its module, with its stack; None
        when the call is not selected (it is counted either way)."""
        mods = self._modules.stack
        module = mods[-1] if mods else None
        call = self._select.api_call(api, module)
        if call is None:
            return None
        folder = self._files.folder
        fwd = OpRecord(api_key(api, call), "api", "forward", module, folder)
        fwd.recompute = in_recompute()
        if self._call_stacks:
            fwd.stack = self._stacks.stack_id(folder, _API_FRAMES)
        return fwd

    def memory_written(self, storage: Any) -> None:
        """A storage's bytes are about to change through the storage itself
        (``patcher._memory_patches``)."""
        if self._dataflow:
            self._flow.note_storage(storage)

    def tensors_written(self, written: list[Any]) -> None:
        """The tensors in ``written`` (lists of them) were written in place by an operator
        that bumps no version counter (``patcher._UNVERSIONED_WRITES``)."""
        if self._dataflow:
            self._flow.note_write(written)

    def memory_allocated(self, storage: Any, t: Optional[torch.Tensor]) -> None:
        """``storage`` (or ``t``'s) was just allocated, its bytes not written yet
        (``patcher._memory_patches``)."""
        if self._dataflow:
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
            first = args[0] if args and inplace is True else target(args, kwargs, inplace)[1]
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
        rec = self._rec.add_tensor(fwd, f"{fwd.key}.{name}", "input", t, False, pre, same)
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
        rec = self._rec.add_tensor(fwd, f"{fwd.key}.{name}", "output", t, False, pre, same)
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
        ctx = self.ctx
        was = tls.active
        tls.active = False
        call: Optional[int] = None
        meta: Optional[tuple[list[int], int]] = None
        try:
            with ctx.lock:
                if api.startswith("Distributed."):
                    meta = self._collectives.meta(api, orig, args, kwargs)
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
                    lists = not api.startswith("Distributed.")
                    seen = as_seen(self._rec.snapshot, args, kwargs, inplace, lists)
        except Exception as exc:  # noqa: BLE001
            ctx.guard.fail(exc, f"capturing inputs of {api}")
            call = None
        try:
            out = orig(*args, **kwargs)
        finally:
            tls.active = _after(was, ctx)
        if call is None:
            return out
        tls.active = False
        try:
            with ctx.lock:
                if self.waits.later(api, inplace, out):
                    check = functools.partial(
                        self._check, api, call, module, folder, meta, seen, kwargs, inplace, args
                    )
                    self.waits.defer(api, out, check)
                else:
                    self._check(api, call, module, folder, meta, seen, kwargs, inplace, args, out)
        except Exception as exc:  # noqa: BLE001
            ctx.guard.fail(exc, f"capturing outputs of {api}")
        finally:
            tls.active = _after(was, ctx)
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
        produced = result_of(out, inplace, args, kwargs)
        if (
            folder is not None
            and folder is self._files.folder
            and self._rec.overflow_left != 0
            and nonfinite_result(produced)
        ):
            fwd = OpRecord(api_key(api, call), "api", "forward", module, folder)
            fwd.recompute = in_recompute()
            if meta is not None:
                fwd.group, fwd.coll_seq = meta
            fwd.call_args = seen if seen is not None else (args, kwargs)
            fwd.call_out = produced
            self._rec.finish(fwd)

    def _pre(
        self, api: str, inplace: Inplace, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Optional[_Pending]:
        fwd = self._forward_record(api)
        if fwd is None:
            return None
        forward, backward = self._forward, self._bwd
        if self._select.listed:
            f, b = self._select.list_directions(api, fwd.module)
            forward, backward = forward and f, backward and b
        if not inplace and kwargs and kwargs.get("inplace") is True:
            inplace = True
        bwd: Optional[OpRecord] = None
        if backward and torch.is_grad_enabled():
            # Api.name.N.backward, beside the forward record's key.
            bwd = OpRecord(api_backward(fwd.key), "api", "backward", fwd.module, fwd.folder)
            bwd.stack = fwd.stack
        aliases: dict[int, tuple[torch.Tensor, str]] = {}  # id(alias) -> (input, its slot)
        made: dict[int, torch.Tensor] = {}  # id(input) -> its alias
        # Overflow mode records inputs only once the op is known to have overflowed.
        want_fwd_in = forward and self._inputs and not self._overflow
        # Inputs that get an autograd alias, so that the backward sees their gradients.
        alias_in = bwd is not None and self._outputs and not api.startswith("Distributed.")
        keep_leaves = api in _LEAF_VIEWS
        bkey = bwd.key if bwd is not None else ""
        watch = self._backward.watch

        def on_input(name: str, t: torch.Tensor) -> torch.Tensor:
            if want_fwd_in:  # (never in overflow mode: the dataflow is on)
                self._record_input(fwd, name, t)
            # What an in-place call writes keeps its object: its first argument, or every
            # tensor of it when that is a list (``torch._foreach_mul_(grads, c)``). An alias
            # took the write instead, and the tensors written left no backward record.
            first = inplace and (name == "input.0" or name.startswith("input.0."))
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
            if inplace and api.startswith("Distributed.") and api[12:] in DIST_WRITE_ONLY:
                written = target(args, kwargs, inplace)[1]
                self._write_only = frozenset(
                    id(t)
                    for _, t in named_tensors(written, "")  # (a tensor or lists of them)
                )
                try:
                    self._record_inputs(fwd, args, kwargs)
                finally:
                    self._write_only = frozenset()
            else:
                self._record_inputs(fwd, args, kwargs)
        if self._overflow:
            # The value an in-place op saw, kept in case it overflows (it changes in place).
            fwd.call_args = (
                as_seen(
                    self._rec.snapshot, args, kwargs, inplace, not api.startswith("Distributed.")
                )
                if inplace
                else (args, kwargs)
            )
        elif want_fwd_in:
            fwd.args = json_args(args, kwargs)
        if bwd is not None and bwd.expect:
            return (fwd, bwd, new, aliases, inplace, forward)
        return (fwd, bwd, None, aliases, inplace, forward)

    def _post(
        self, pending: _Pending, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
    ) -> Any:
        fwd, bwd, _, aliases, inplace, forward = pending
        folder = self._files.folder
        flow = self._flow if self._dataflow else None
        if flow is not None:
            self._note_writes(inplace, args, kwargs)
        ident = None  # the input slot an identity op returns
        if aliases and isinstance(out, torch.Tensor) and id(out) in aliases:
            out, ident = aliases[id(out)]  # identity ops (x.float() on float) return their input
        result = out
        out = result_of(out, inplace, args, kwargs)
        want_out = forward and self._outputs and not self._overflow
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
        if self._overflow:
            fwd.call_out = out
        if forward:
            self._rec.finish(fwd)
        if bwd is not None and bwd.expect:
            self._backward.pending.append(bwd)
        return result
