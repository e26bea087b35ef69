"""Module level: forward hooks on every submodule, and the module path API calls run in.

The hooks are installed on every submodule even at api level, where they only keep the
stack of module paths that ``include_modules``/``exclude_modules`` select API calls by; at
module and mix level they also record ``Module.{path}.{Class}.forward.{n}`` (inputs,
parameters, outputs), its backward, and, through parameter gradient hooks (backward.py),
``Module.{path}.{Class}.parameters_grad``. They never replace a module's arguments or
results: the backward record's gradients are taken by hooks on the autograd nodes the
forward made (:meth:`ModuleHooks._watch_inputs`), so the graph, and the bits it computes,
are those of the run without the agent ("Transparency" in docs/capture.md). The root module has no record: its path would
be empty; its submodules cover it.

A forward that raises (activation checkpointing stops a recompute that way once it has what
it needs) still leaves its module: the post hook is always called, pops the module path and
drops the call's pending records, so later calls are not attributed to it.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from .._op_key import BACKWARD, FORWARD, module_base, module_key
from .backward import BackwardHooks
from .compiled import compiling, module_tree, traced
from .context import HookContext
from .records import UNWRITTEN, Captured, Dataflow, Known, OpRecord, results, walk
from .threadstate import in_recompute, in_transform, tls

_is_lazy: Callable[[Any], bool] = getattr(torch.nn.parameter, "is_lazy", lambda p: False)

#: The sequence number autograd gives its next node (per thread, rising): every node a
#: module's forward makes has one at least as high as this was when the forward started.
#: Absent from some older PyTorch releases: the inputs' own nodes then bound the search.
_next_sequence_nr: Optional[Callable[[], int]] = getattr(torch.autograd, "_get_sequence_nr", None)

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

    from .records import TensorRecord

# A module input whose gradient the backward record takes: its name ("input.0"), the
# tensor, and the autograd edge it is (its grad_fn, None for a leaf, and output_nr).
_Input = tuple[str, torch.Tensor, Any, int]

# A selected module call's forward record, backward record (None without autograd), whether
# the forward record is written (an api_list entry may select the backward only), the
# inputs whose gradients its backward record takes, and the first autograd sequence number
# its forward could give a node.
_Pending = tuple[OpRecord, Optional[OpRecord], bool, list[_Input], int]


def _leftover(
    flow: Optional[Dataflow], t: torch.Tensor, same: Optional[Known]
) -> Optional[Captured]:
    """:data:`UNWRITTEN` for a module's input or output over memory nothing has written yet
    (as an API call's: ``api.ApiCapture``), else None."""
    if flow is not None and same is None and flow.fresh and flow.unwritten(t):
        return UNWRITTEN
    return None


class ModuleHooks:
    """The module hooks of one Debugger between ``start()`` and ``stop()``."""

    def __init__(self, ctx: HookContext, backward: BackwardHooks) -> None:
        self._ctx = ctx
        self._rec = ctx.recorder
        self._backward = backward
        self._handles: list[RemovableHandle] = []
        #: Paths of the modules whose forward is running, innermost last.
        self.stack: list[str] = []
        # The pending records of the running selected module calls, innermost last.
        self._pending: list[Optional[_Pending]] = []
        #: Modules whose parameters are not materialized yet (lazy modules before their
        #: first forward), by path: their gradient hooks are registered once they are.
        self._lazy: dict[str, tuple[str, torch.nn.Module]] = {}

    def install(
        self,
        model: torch.nn.Module,
        tree: Optional[list[tuple[str, torch.nn.Module]]] = None,
        is_traced: Optional[bool] = None,
    ) -> None:
        """Hook every submodule of ``model`` (a compiled one's under its eager path);
        ``tree`` and ``is_traced``: its ``module_tree`` and ``traced``, when the caller
        walked it already (``compiled.survey``)."""
        c = self._ctx.config
        track_only = not c.module
        # Dynamo guards a traced module call on the ids of its always-called hooks: new
        # ones at every start() made each captured step of a compiled model recompile it,
        # and after 8 it ran uncompiled. In a model Dynamo traces, the post hooks are
        # plain ones (an eager forward that raises, as checkpointing's early stop of a
        # recompute does, may then leave its path on the stack).
        always = not (traced(model) if is_traced is None else is_traced)
        for path, mod in module_tree(model) if tree is None else tree:
            if not path:
                continue  # the root: its path would be empty; its submodules cover it
            cls = type(mod).__name__
            # Partials of two methods, not closures: a closure is several objects for the
            # garbage collector (its cells), alive all step (see BackwardHooks.watch).
            self._handles.append(
                mod.register_forward_pre_hook(
                    partial(self._pre_hook, path, cls, track_only), with_kwargs=True
                )
            )
            self._handles.append(
                _register_post_hook(mod, partial(self._post_hook, path, track_only), always)
            )
            if c.module and c.backward:
                params = dict(mod.named_parameters(recurse=False))
                if params and self._ctx.select.module_parameters(path, cls):
                    base = module_base(path, cls)
                    if any(_is_lazy(p) for p in params.values()):
                        self._lazy[path] = (base, mod)
                    else:
                        self._hook_grads(path, base, params)

    def _hook_grads(self, path: str, base: str, params: dict[str, torch.nn.Parameter]) -> None:
        """Gradient hooks on a module's parameters, for its ``parameters_grad`` record."""
        backward = self._backward
        for pname, p in params.items():
            if p.requires_grad:
                self._handles.append(
                    p.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
                        backward.param_grad_hook(path, base, pname)
                    )
                )

    def _materialized(self, path: str) -> None:
        """A lazy module's forward starts: the lazy module's own pre-hook, which runs before
        the agent's, has made its parameters now, and they get their gradient hooks.
        Hooking an uninitialised parameter raised, and capture was off for the run."""
        base, mod = self._lazy[path]
        params = dict(mod.named_parameters(recurse=False))
        if not any(_is_lazy(p) for p in params.values()):
            del self._lazy[path]
            self._hook_grads(path, base, params)

    def remove(self) -> None:
        self.stack.clear()
        self._pending.clear()
        self._lazy.clear()
        while self._handles:
            h = self._handles.pop()
            try:
                h.remove()
            except Exception:  # noqa: BLE001
                pass

    def _pre_hook(
        self,
        path: str,
        cls: str,
        track_only: bool,
        mod: torch.nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """The forward pre-hook of module ``path`` (class ``cls``)."""
        if compiling():  # before any read of the agent's state (compiled.py)
            return None
        ctx = self._ctx
        if not ctx.running:
            return None
        was = tls.active
        tls.active = False
        try:
            self.stack.append(path)
            if self._lazy and path in self._lazy:
                self._materialized(path)
            if track_only:
                return None
            if in_transform():  # (threadstate.in_transform) its post hook pops the None
                ctx.note_transform(module_base(path, cls))
                self._pending.append(None)
                return None
            with ctx.lock:
                pending = self._pre(mod, path, cls, args, kwargs)
            self._pending.append(pending)
            return None
        except Exception as exc:  # noqa: BLE001
            ctx.guard.fail(exc, f"forward pre-hook of module {path}")
            return None
        finally:
            tls.active = was and ctx.api_on

    def _post_hook(
        self,
        path: str,
        track_only: bool,
        mod: torch.nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
    ) -> Any:
        """The forward hook of module ``path``: also called when the forward raised."""
        if compiling():
            return None
        ctx = self._ctx
        if not ctx.running:
            return None
        was = tls.active
        tls.active = False
        try:
            if self.stack and self.stack[-1] == path:
                self.stack.pop()
            if track_only or not self._pending:
                return None
            pending = self._pending.pop()
            if output is None and sys.exc_info()[1] is not None:
                return None  # the forward raised: no output to record
            if pending is not None:
                with ctx.lock:
                    self._post(pending, output)
            return None
        except Exception as exc:  # noqa: BLE001
            ctx.guard.fail(exc, f"forward hook of module {path}")
            return None
        finally:
            tls.active = was and ctx.api_on

    def _pre(
        self,
        mod: torch.nn.Module,
        path: str,
        cls: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Optional[_Pending]:
        """Records the inputs and parameters of a selected module call; returns its
        pending records. The call's arguments stay as they are: an autograd alias of an
        input (as an API call's) would change the sums of its gradients ("Transparency"
        in docs/capture.md); the gradient w.r.t. an input is taken after the forward, at
        the nodes inside the module that use it (:meth:`_post`)."""
        ctx = self._ctx
        rec = self._rec
        select = ctx.select
        base = module_base(path, cls)
        call = select.module_call(base, path, cls)
        if call is None:
            return None
        c = ctx.config
        forward, backward = c.forward, c.backward
        if select.listed:
            f, b = select.list_directions(None, path)
            forward, backward = forward and f, backward and b
        folder = rec.files.folder
        fwd = OpRecord(module_key(base, FORWARD, call), "module", "forward", path, folder)
        fwd.recompute = in_recompute()
        bwd: Optional[OpRecord] = None
        if backward and torch.is_grad_enabled():
            bwd = OpRecord(module_key(base, BACKWARD, call), "module", "backward", path, folder)
        if rec.call_stacks:
            fwd.stack = rec.stacks.stack_id(folder)
            if bwd is not None:
                bwd.stack = fwd.stack
        want_in = forward and c.inputs
        flow = rec.flow if rec.dataflow else None
        grads_out = bwd is not None and c.outputs
        inputs: list[_Input] = []

        def on_input(name: str, t: torch.Tensor) -> torch.Tensor:
            if want_in:
                src, same, mem = flow.source(t) if flow is not None else (None, None, None)
                added = rec.add_tensor(
                    fwd, f"{fwd.key}.{name}", "input", t, True, _leftover(flow, t, same), same
                )
                if src is not None:
                    added["src"] = src
                if same is None and flow is not None:
                    flow.remember(t, fwd.entries[-1], mem)
            if grads_out and t.requires_grad and t.layout == torch.strided:
                inputs.append((name, t, t.grad_fn, t.output_nr))
            return t

        walk(args, "input", on_input)
        for k, v in kwargs.items():
            walk(v, f"input.{k}", on_input)
        if forward:
            for pname, p in mod.named_parameters(recurse=False):
                same, mem = flow.find(p) if flow is not None else (None, None)
                rec.add_tensor(fwd, f"{fwd.key}.parameters.{pname}", "parameter", p, same_as=same)
                if same is None and flow is not None:
                    flow.remember(p, fwd.entries[-1], mem)
        start = -1
        if inputs:
            if _next_sequence_nr is not None:
                start = _next_sequence_nr()
            else:
                nodes = [n for _, _, n, _ in inputs if n is not None]
                start = 1 + max((n._sequence_nr() for n in nodes), default=-1)
        return (fwd, bwd, forward, inputs, start)

    def _post(self, pending: _Pending, output: Any) -> None:
        fwd, bwd, forward, inputs, start = pending
        rec = self._rec
        c = self._ctx.config
        folder = rec.files.folder
        want_out = forward and c.outputs
        flow = rec.flow if rec.dataflow else None
        watch = self._backward.watch
        roots: list[tuple[Any, int]] = []  # the outputs' autograd edges: grad_fn, output_nr

        def on_output(name: str, t: torch.Tensor) -> torch.Tensor:
            if want_out:
                assert folder is not None
                # Mix level: the output of the op inside that made it has its stats already.
                same, mem = flow.find(t) if flow is not None else (None, None)
                added: TensorRecord = rec.add_tensor(
                    fwd, f"{fwd.key}.{name}", "output", t, False, _leftover(flow, t, same), same
                )
                if flow is not None:
                    added["id"] = flow.register(t, folder, fwd.entries[-1], mem)
            if bwd is not None and t.requires_grad and t.grad_fn is not None:
                if c.inputs:
                    watch(bwd, t.grad_fn, t.output_nr, f"{bwd.key}.input{name[6:]}", "input")
                roots.append((t.grad_fn, t.output_nr))
            return t

        walk(results(output), "output", on_output)
        if forward:
            rec.finish(fwd)
        if bwd is not None and inputs:
            self._watch_inputs(bwd, inputs, start, roots)
        if bwd is not None and bwd.expect:
            self._backward.pending.append(bwd)

    def _watch_inputs(
        self, bwd: OpRecord, inputs: list[_Input], start: int, roots: list[tuple[Any, int]]
    ) -> None:
        """Hook the gradients w.r.t. a module call's ``inputs`` for ``bwd``: at the autograd
        nodes its forward made (sequence number ``start`` or later) that use them, found
        from the outputs' nodes ``roots``. A tensor passed twice is one input, under its
        first name (as an API call's). An input the module returns as it is (``nn.Identity``,
        a dropout off) has its gradient taken at its node, where the output's is: an
        identity's are the same."""
        watch = self._backward.watch
        edges: dict[tuple[int, int], int] = {}  # (id(grad_fn), output_nr) -> index in keep
        leaves: dict[int, int] = {}  # id(leaf tensor) -> index in keep
        keep: list[_Input] = []
        for inp in inputs:
            _, t, node, nr = inp
            if node is None:
                if id(t) not in leaves:
                    leaves[id(t)] = len(keep)
                    keep.append(inp)
            elif (id(node), nr) not in edges:
                edges[(id(node), nr)] = len(keep)
                keep.append(inp)
        returned = set()
        for node, nr in roots:
            k = edges.get((id(node), nr))
            if k is not None and k not in returned:
                returned.add(k)
                name = keep[k][0]
                watch(bwd, node, nr, f"{bwd.key}.output{name[5:]}", "output")
        uses = _uses([n for n, _ in roots], edges, leaves, start, len(keep))
        for k, found in enumerate(uses):
            if found and k not in returned:
                self._backward.watch_uses(bwd, found, f"{bwd.key}.output{keep[k][0][5:]}")


def _uses(
    roots: list[Any], edges: dict[tuple[int, int], int], leaves: dict[int, int], start: int, n: int
) -> list[list[tuple[Any, tuple[int, ...]]]]:
    """The autograd nodes made since sequence number ``start`` that use each of ``n``
    inputs (``edges``: by their grad_fn and output_nr; ``leaves``: by the leaf tensor), with
    the positions of their ``next_functions`` that lead to it: a search back from the
    module's outputs' nodes ``roots`` through the nodes its forward made, which stops at
    older ones (the graph before the module is not walked)."""
    found: list[list[tuple[Any, tuple[int, ...]]]] = [[] for _ in range(n)]
    seen: dict[int, Any] = {}  # id -> node, kept alive so that ids stay unique
    stack = []
    for r in roots:
        if id(r) not in seen and r._sequence_nr() >= start:
            seen[id(r)] = r
            stack.append(r)
    while stack:
        node = stack.pop()
        hits: dict[int, list[int]] = {}
        for i, (nxt, nr) in enumerate(node.next_functions):
            if nxt is None:
                continue
            k = edges.get((id(nxt), nr))
            if k is None and leaves:
                v = getattr(nxt, "variable", None)  # an AccumulateGrad's leaf
                if v is not None:
                    k = leaves.get(id(v))
            if k is not None:
                hits.setdefault(k, []).append(i)
            elif id(nxt) not in seen and nxt._sequence_nr() >= start:
                seen[id(nxt)] = nxt
                stack.append(nxt)
        for k, ix in hits.items():
            found[k].append((node, tuple(ix)))
    return found


def _register_post_hook(
    mod: torch.nn.Module, hook: Callable[..., Any], always: bool
) -> RemovableHandle:
    """``hook`` as a forward hook with kwargs; with ``always``, one that also runs when the
    forward raises (``always_call``, PyTorch >= 2.1; without it a raising forward leaves
    its path on the stack)."""
    if not always:
        return mod.register_forward_hook(hook, with_kwargs=True)
    try:
        return mod.register_forward_hook(hook, with_kwargs=True, always_call=True)
    except TypeError:
        return mod.register_forward_hook(hook, with_kwargs=True)
