"""Backward level: gradient hooks that complete the backward records of captured calls.

A captured call's backward record (``X.backward``) receives the gradient w.r.t. each
forward output as ``input`` and w.r.t. each forward input as ``output`` (msprobe's roles).
They are taken by autograd node pre-hooks, which see the gradient w.r.t. exactly the tensor
version the op produced or consumed (tensor hooks cannot guarantee that after in-place
ops). A record is written once all its gradients arrived, or at ``stop()`` with what
arrived. Parameter gradients are taken by post-accumulate-grad hooks, kept per module, and
written at ``stop()`` as ``Module.{path}.{Class}.parameters_grad``: the last accumulated
value of the step.
"""

from __future__ import annotations

import weakref
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from .api import tls
from .compiled import compiling
from .records import Captured, Known, OpRecord

if TYPE_CHECKING:
    from .debugger import Debugger


class BackwardHooks:
    """The gradient hooks of one Debugger, and its backward records still waiting."""

    def __init__(self, dbg: Debugger) -> None:
        self._dbg = dbg
        self._ref = weakref.ref(dbg)  # what autograd's hooks hold: never keep it alive
        #: Backward records with hooked gradients, until they are complete or stop() comes.
        self.pending: list[OpRecord] = []
        # Module base name -> parameter name -> (gradient, its captured stats and data).
        self._param_grads: dict[str, dict[str, tuple[torch.Tensor, Captured, Optional[Known]]]] = {}
        # Module base name -> parameter name -> parameter whose gradient was kept (DDP
        # takes them again once reduced: retake_param_grads).
        self._params: dict[str, dict[str, torch.Tensor]] = {}

    def watch(self, bwd: OpRecord, node: Any, index: int, name: str, role: str) -> None:
        """Hook autograd node ``node`` so ``bwd`` receives the gradient at ``index``.

        The hook is a ``partial`` of one module-level function, not a closure: a closure
        here is eight objects for the garbage collector (itself, six cells, their tuple),
        and the hooks live as long as the graph, past the collections that promote what is
        alive to older generations (docs/capture.md, "eighth pass")."""
        node.register_prehook(
            partial(_grad_hook, self._ref, self._dbg._session, bwd, index, name, role)
        )
        bwd.expect += 1

    def param_grad_hook(self, base: str, pname: str) -> Callable[[torch.Tensor], None]:
        """A post-accumulate-grad hook keeping parameter ``pname`` of module ``base``'s
        latest gradient (a partial, as in :meth:`watch`)."""
        return partial(self._param_grad, self._dbg._session, base, pname)

    def _param_grad(self, session: int, base: str, pname: str, p: torch.Tensor) -> None:
        if compiling():
            return
        dbg = self._dbg
        if dbg._guard.failed or dbg._session != session or p.grad is None:
            return
        was = tls.active
        tls.active = False
        try:
            with dbg._lock, torch.no_grad():
                # Keep the latest (fully accumulated) gradient's stats and data now:
                # zero_grad() may clear it before stop() emits the record.
                self._param_grads.setdefault(base, {})[pname] = dbg.keep_gradient(p.grad)
                self._params.setdefault(base, {})[pname] = p
        except Exception as exc:  # noqa: BLE001
            dbg._guard.fail(exc, f"gradient hook of {base}.{pname}")
        finally:
            tls.active = was and dbg._api_on

    def retake_param_grads(self) -> None:
        """Under DDP, at the end of backward: keep the reduced gradients of the parameters
        seen so far instead of the local ones (distributed.py)."""
        dbg = self._dbg
        for base, params in self._params.items():
            grads = self._param_grads.setdefault(base, {})
            for pname, p in params.items():
                if p.grad is not None:
                    grads[pname] = dbg.keep_gradient(p.grad, reduced=True)

    def finish_step(self) -> None:
        """At ``stop()``: write the backward records that got some of their gradients, and
        one ``parameters_grad`` record per module with gradients."""
        dbg = self._dbg
        for op in self.pending:
            if not op.done and op.got:
                dbg._finish(op)
        self.pending.clear()
        self._params.clear()
        if not self._param_grads:
            return
        folder = dbg._files.folder
        for base, grads in self._param_grads.items():
            path = base.split(".", 1)[1].rsplit(".", 1)[0]
            op = OpRecord(f"{base}.parameters_grad", "parameters_grad", "backward", path, folder)
            for pname, (g, pre, same) in grads.items():
                dbg._add_tensor(op, f"{op.key}.{pname}", "parameter", g, True, pre, same)
            dbg._finish(op)
        self._param_grads.clear()


def _grad_hook(
    ref: weakref.ReferenceType[Debugger],
    session: int,
    bwd: OpRecord,
    index: int,
    name: str,
    role: str,
    grad_outputs: tuple[Optional[torch.Tensor], ...],
) -> None:
    """An autograd node pre-hook of :meth:`BackwardHooks.watch`: ``bwd`` receives the
    gradient at ``index`` as tensor ``name`` in ``role``. ``ref``: the Debugger, held
    weakly (autograd's hooks must never keep it alive); ``session``: the ``start()`` the
    hook belongs to (a late gradient of a closed step is dropped)."""
    if compiling():  # compiled autograd traces it: stay out (compiled.py)
        return None
    dbg = ref()
    if dbg is None or dbg._guard.failed or bwd.done or dbg._session != session:
        return None
    was = tls.active
    tls.active = False
    try:
        with dbg._lock:
            g = grad_outputs[index] if index < len(grad_outputs) else None
            if g is not None:
                # The gradient of an op's output is, tensor for tensor, the one the op
                # that consumed it recorded for that input: reduced once.
                flow = dbg._flow if dbg._dataflow else None
                same, mem = flow.find(g) if flow is not None else (None, None)
                dbg._add_tensor(bwd, name, role, g, same_as=same)
                if same is None and flow is not None:
                    flow.remember(g, bwd.entries[-1], mem)
            bwd.got += 1
            if bwd.got >= bwd.expect and not bwd.done:
                dbg._finish(bwd)
    except Exception as exc:  # noqa: BLE001
        dbg._guard.fail(exc, f"backward hook of {bwd.key}")
    finally:
        tls.active = was and dbg._api_on
    return None
