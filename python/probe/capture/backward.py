"""Backward level: gradient hooks that complete the backward records of captured calls.

A captured call's backward record (``X.backward``) receives the gradient w.r.t. each
forward output as ``input`` and w.r.t. each forward input as ``output`` (msprobe's roles).
They are taken by autograd node pre-hooks, which see the gradient w.r.t. exactly the tensor
version the op produced or consumed (tensor hooks cannot guarantee that after in-place
ops). A record is written once all its gradients arrived, or at ``stop()`` with what
arrived. Parameter gradients are taken by post-accumulate-grad hooks, kept per module, and
written at ``stop()`` as ``Module.{path}.{Class}.parameters_grad``: the last accumulated
value of the step.

The API capture hands a call's inputs to the op as autograd aliases (:data:`alias_of`) and
hooks each alias's node here (:meth:`BackwardHooks.watch`): that is how an input's gradient
reaches the call's backward record. The module capture cannot: an alias of a module's input
gathers the gradients of all the module's uses of it into one sum before autograd adds the
uses outside the module, and float addition is not associative, so the training computed
other bits than without the agent (a LLaMA's RMSNorm reads its input twice, its residual
once more). It hooks, after each node inside the module that uses the input, the gradient
that node hands it (:meth:`BackwardHooks.watch_uses`), and adds them up itself: the graph
is the one the model built.
"""

from __future__ import annotations

import weakref
from functools import partial
from typing import Any, Callable, Optional

import torch

from .._op_key import parameters_grad_key
from .compiled import compiling
from .context import HookContext
from .recorder import Recorder
from .records import Captured, Known, OpRecord
from .threadstate import tls

#: An autograd alias of a tensor, through which an input's gradient reaches a hook: the
#: ``aten::alias`` view, whose backward hands the gradient on as it comes. ``view_as``'s
#: reshapes it, which a sparse gradient (``F.embedding(..., sparse=True)``) cannot do: the
#: user's backward raised. An operator, not a hooked API: the wrappers never see it.
alias_of: Callable[[torch.Tensor], torch.Tensor] = torch.ops.aten.alias.default

#: A module's gradients kept until ``stop()``: parameter name -> (gradient, its captured
#: stats and data, what is known of it already).
_Grads = dict[str, tuple[torch.Tensor, Captured, Optional[Known]]]


class BackwardHooks:
    """The gradient hooks of one Debugger, and its backward records still waiting."""

    def __init__(self, ctx: HookContext) -> None:
        self._ctx = ctx
        self._rec = ctx.recorder
        self._ref = weakref.ref(ctx)  # what autograd's hooks hold: never keep it alive
        #: Backward records with hooked gradients, until they are complete or stop() comes.
        self.pending: list[OpRecord] = []
        # (Module path, module base name) -> its parameters' gradients.
        self._param_grads: dict[tuple[str, str], _Grads] = {}
        # (Module path, base name) -> parameter name -> parameter whose gradient was kept
        # (DDP takes them again once reduced: retake_param_grads).
        self._params: dict[tuple[str, str], dict[str, torch.Tensor]] = {}

    def watch(self, bwd: OpRecord, node: Any, index: int, name: str, role: str) -> None:
        """Hook autograd node ``node`` so ``bwd`` receives the gradient at ``index``.

        The hook is a ``partial`` of one module-level function, not a closure: a closure
        here is eight objects for the garbage collector (itself, six cells, their tuple),
        and the hooks live as long as the graph, past the collections that promote what is
        alive to older generations (docs/capture.md, "eighth pass")."""
        node.register_prehook(
            partial(_grad_hook, self._ref, self._ctx.session, bwd, index, name, role)
        )
        bwd.expect += 1

    def watch_uses(self, bwd: OpRecord, uses: list[tuple[Any, tuple[int, ...]]], name: str) -> None:
        """Hook the autograd nodes that use a module's input inside the module (``uses``:
        each node and the positions of its ``next_functions`` that lead to the input), so
        that ``bwd`` receives the sum of the gradients they hand the input, as its tensor
        ``name`` in role ``output``. Post-hooks that return nothing: they neither change a
        gradient nor add a node (the module capture's reason, module docstring)."""
        acc = _Uses(bwd, name, sum(len(ix) for _, ix in uses))
        for node, ix in uses:
            node.register_hook(partial(_use_hook, self._ref, self._ctx.session, acc, ix))
        bwd.expect += 1

    def param_grad_hook(self, path: str, base: str, pname: str) -> Callable[[torch.Tensor], None]:
        """A post-accumulate-grad hook keeping the latest gradient of parameter ``pname`` of
        module ``base`` (at ``path``) (a partial, as in :meth:`watch`)."""
        return partial(self._param_grad, self._ctx.session, (path, base), pname)

    def _param_grad(
        self, session: int, module: tuple[str, str], pname: str, p: torch.Tensor
    ) -> None:
        if compiling():
            return
        ctx = self._ctx
        if ctx.guard.failed or ctx.session != session or p.grad is None:
            return
        was = tls.active
        tls.active = False
        try:
            with ctx.lock, torch.no_grad():
                # Keep the latest (fully accumulated) gradient's stats and data now:
                # zero_grad() may clear it before stop() emits the record.
                kept = self._rec.keep_gradient(p.grad)
                self._param_grads.setdefault(module, {})[pname] = kept
                self._params.setdefault(module, {})[pname] = p
        except Exception as exc:  # noqa: BLE001
            ctx.guard.fail(exc, f"gradient hook of {module[1]}.{pname}")
        finally:
            tls.active = was and ctx.api_on

    def retake_param_grads(self) -> None:
        """Under DDP, at the end of backward: keep the reduced gradients of the parameters
        seen so far instead of the local ones (ddp.py)."""
        rec = self._rec
        for module, params in self._params.items():
            grads = self._param_grads.setdefault(module, {})
            for pname, p in params.items():
                if p.grad is not None:
                    grads[pname] = rec.keep_gradient(p.grad, reduced=True)

    def finish_step(self) -> None:
        """At ``stop()``: write the backward records that got some of their gradients, and
        one ``parameters_grad`` record per module with gradients."""
        rec = self._rec
        for op in self.pending:
            if not op.done and op.got:
                rec.finish(op)
        self.pending.clear()
        self._params.clear()
        if not self._param_grads:
            return
        folder = rec.files.folder
        for (path, base), grads in self._param_grads.items():
            key = parameters_grad_key(base)
            op = OpRecord(key, "parameters_grad", "backward", path, folder)
            for pname, (g, pre, same) in grads.items():
                rec.add_tensor(op, f"{key}.{pname}", "parameter", g, True, pre, same)
            rec.finish(op)
        self._param_grads.clear()


def _grad_hook(
    ref: weakref.ReferenceType[HookContext],
    session: int,
    bwd: OpRecord,
    index: int,
    name: str,
    role: str,
    grad_outputs: tuple[Optional[torch.Tensor], ...],
) -> None:
    """An autograd node pre-hook of :meth:`BackwardHooks.watch`: ``bwd`` receives the
    gradient at ``index`` as tensor ``name`` in ``role``. ``ref``: the capture's context,
    held weakly (autograd's hooks must never keep it alive); ``session``: the ``start()``
    the hook belongs to (a late gradient of a closed step is dropped)."""
    if compiling():  # compiled autograd traces it: stay out (compiled.py)
        return None
    ctx = ref()
    if ctx is None or ctx.guard.failed or bwd.done or ctx.session != session:
        return None
    was = tls.active
    tls.active = False
    try:
        with ctx.lock:
            rec = ctx.recorder
            g = grad_outputs[index] if index < len(grad_outputs) else None
            # The gradient of an op's output is, tensor for tensor, the one the op that
            # consumed it recorded for that input: reduced once.
            _arrived(rec, bwd, name, role, g)
    except Exception as exc:  # noqa: BLE001
        ctx.guard.fail(exc, f"backward hook of {bwd.key}")
    finally:
        tls.active = was and ctx.api_on
    return None


def _arrived(rec: Recorder, bwd: OpRecord, name: str, role: str, g: Optional[torch.Tensor]) -> None:
    """One gradient ``bwd`` waits for has come (None: autograd passed none): recorded as
    ``name`` (as a tensor the dataflow already holds, if it is one), and ``bwd`` finished
    once all it waits for have come."""
    if g is not None:
        flow = rec.flow if rec.dataflow else None
        same, mem = flow.find(g) if flow is not None else (None, None)
        rec.add_tensor(bwd, name, role, g, same_as=same)
        if same is None and flow is not None:
            flow.remember(g, bwd.entries[-1], mem)
    bwd.got += 1
    if bwd.got >= bwd.expect and not bwd.done:
        rec.finish(bwd)


class _Uses:
    """The gradients a module's input receives from its uses inside the module, summed as
    they come (:meth:`BackwardHooks.watch_uses`)."""

    __slots__ = ("bwd", "name", "left", "total", "owned")

    def __init__(self, bwd: OpRecord, name: str, left: int) -> None:
        self.bwd = bwd
        self.name = name
        self.left = left  # the uses whose gradient has not come yet
        self.total: Optional[torch.Tensor] = None  # the sum so far
        self.owned = False  # whether ``total`` is the agent's tensor, not autograd's


def _use_hook(
    ref: weakref.ReferenceType[HookContext],
    session: int,
    acc: _Uses,
    index: tuple[int, ...],
    grad_inputs: tuple[Optional[torch.Tensor], ...],
    grad_outputs: tuple[Optional[torch.Tensor], ...],
) -> None:
    """An autograd node post-hook of :meth:`BackwardHooks.watch_uses`: the node's gradients
    at ``index`` (what it hands the module's input) are added to ``acc``; the last one
    completes the tensor in ``acc.bwd``. Autograd's gradients are only read: sums are new
    tensors (an in-place add would change the gradient autograd goes on with)."""
    if compiling():  # (as _grad_hook)
        return None
    ctx = ref()
    bwd = acc.bwd
    if ctx is None or ctx.guard.failed or bwd.done or ctx.session != session or acc.left <= 0:
        return None
    was = tls.active
    tls.active = False
    try:
        with ctx.lock, torch.no_grad():
            for i in index:
                acc.left -= 1
                g = grad_inputs[i] if i < len(grad_inputs) else None
                if g is None:
                    continue
                if acc.total is None:
                    acc.total, acc.owned = g, False
                else:  # in the order autograd's own sum would take: earlier + later
                    acc.total, acc.owned = acc.total + g, True
            if acc.left > 0:
                if acc.total is not None and not acc.owned:
                    # Kept past this hook: a copy, which a later in-place accumulation
                    # into the same gradient (a leaf's .grad) cannot change.
                    acc.total, acc.owned = acc.total.clone(), True
                return None
            total, acc.total = acc.total, None
            # A lone use's gradient may be one captured already (as _grad_hook's).
            _arrived(ctx.recorder, bwd, acc.name, "output", total)
    except Exception as exc:  # noqa: BLE001
        ctx.guard.fail(exc, f"backward hook of {bwd.key}")
    finally:
        tls.active = was and ctx.api_on
    return None
