"""Automatic iteration counting: ``step<S>`` folders and ``steps``/``dump_iter`` without a
per-step call.

The migration tutorial starts its profiler once before the training loop and stops it once
after, so the agent must see the iterations itself. An iteration ends at each
``optimizer.step()``: torch's global optimizer step post-hook, so no optimizer has to be
handed over. With several optimizers only the first one seen counts (a GAN's two steps are
one iteration). Loops without an optimizer (evaluation) are counted by the model's forward
calls instead: while no optimizer step has been seen, a second forward of the model in the
same iteration begins the next one. A run whose first optimizer step comes after several
forwards (gradient accumulation) has had those first iterations counted by forwards: that is
reported once, since only explicit ``step()`` calls can say where such iterations end.

The model is the one given to the Debugger, or else the first module called after
``start()`` (a training loop calls its model first); its module hooks are installed then.

An explicit ``Debugger.step()`` removes this counter for good (explicit calls take
precedence). The first one, when it comes right after a boundary of this counter (no
forward of the model since: ``step()`` at the end of the loop, after ``optimizer.step()``,
as msprobe users write it), is taken as that same boundary, so the numbering does not
shift by one. Every hook is guarded: a failure switches capture off, never training. The
optimizer hook is never removed from inside an optimizer step (torch iterates its hooks
then, and removing one would break that step): it goes inert, and is removed by the next
:meth:`IterationCounter.remove` made outside one.
"""

from __future__ import annotations

import logging
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook

from .._guard import Guard
from .compiled import compiling

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

log = logging.getLogger("probe")


class IterationCounter:
    """Advances one Debugger's step at each iteration boundary, while installed.

    ``model``: the Debugger's model (None: not known yet); ``advance``: end this iteration
    and begin the next (stop, step, start); ``adopt``: take the first module called as the
    model; ``guard``: the Debugger's, which a failure goes to."""

    def __init__(
        self,
        model: Callable[[], Optional[torch.nn.Module]],
        advance: Callable[[], None],
        adopt: Callable[[torch.nn.Module], None],
        guard: Guard,
    ) -> None:
        self._model = model
        self._advance_step = advance
        self._adopt = adopt
        self._guard = guard
        self._optimizer_hook: Optional[RemovableHandle] = None
        self._forward_hook: Optional[RemovableHandle] = None
        #: The optimizer whose steps count (the first one seen).
        self._optimizer: Optional[weakref.ReferenceType[torch.optim.Optimizer]] = None
        #: Forwards of the model in this iteration; iterations ended by a forward.
        self._forwards = 0
        self._by_forward = 0
        #: Installed and counting; False: the hooks, if still there, do nothing.
        self._on = False
        self._in_optimizer_hook = False
        #: An iteration was just ended here, and the model has not run since.
        self.fresh = False

    def install(self) -> None:
        if self._on:
            return
        self._on = True
        if self._optimizer_hook is None:
            self._optimizer_hook = register_optimizer_step_post_hook(self._on_optimizer_step)
        model = self._model()
        if model is None:
            self._forward_hook = register_module_forward_pre_hook(self._on_first_module)
        else:
            self._forward_hook = model.register_forward_pre_hook(self._on_model_forward)

    def remove(self) -> None:
        """Stop counting and remove the hooks (never raises: also called while capture is
        switched off); inside an optimizer step its hook only goes inert."""
        self._on = False
        try:
            self._drop_forward_hook()
            if self._optimizer_hook is not None and not self._in_optimizer_hook:
                self._optimizer_hook.remove()
                self._optimizer_hook = None
        except Exception:  # noqa: BLE001
            pass

    def _drop_forward_hook(self) -> None:
        if self._forward_hook is not None:
            self._forward_hook.remove()
            self._forward_hook = None

    def _on_first_module(self, module: torch.nn.Module, args: Any) -> None:
        """The global forward pre-hook, until the first module call: that module is the
        model. Later forwards are watched on it alone (no cost for other modules); they
        count iterations only until an optimizer step is seen."""
        if compiling() or not self._on:  # compiling first (compiled.py)
            return
        try:
            self._drop_forward_hook()
            self._adopt(module)
            self._forward_hook = module.register_forward_pre_hook(self._on_model_forward)
            # The hook just registered does not run for the call already under way.
            self._count_forward()
        except Exception as exc:  # noqa: BLE001 - never fail the training run
            self._guard.fail(exc, "iteration counting (first forward)")

    def _on_model_forward(self, module: torch.nn.Module, args: Any) -> None:
        if compiling() or not self._on:
            return
        try:
            self._count_forward()
        except Exception as exc:  # noqa: BLE001
            self._guard.fail(exc, "iteration counting (forward)")

    def _count_forward(self) -> None:
        self.fresh = False
        if self._optimizer is not None:
            return
        if self._forwards > 0:
            self._by_forward += 1
            self._advance()
        self._forwards += 1

    def _on_optimizer_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        if compiling() or not self._on:
            return
        self._in_optimizer_hook = True
        try:
            first = self._optimizer() if self._optimizer is not None else None
            if first is None:
                # The first optimizer seen (or a new one after the first was freed).
                self._optimizer = weakref.ref(optimizer)
                if self._by_forward:
                    self._report_forward_counting()
            elif first is not optimizer:
                return
            self._advance()
        except Exception as exc:  # noqa: BLE001
            self._guard.fail(exc, "iteration counting (optimizer step)")
        finally:
            self._in_optimizer_hook = False

    def _advance(self) -> None:
        self._forwards = 0
        self._advance_step()
        self.fresh = True

    def _report_forward_counting(self) -> None:
        msg = (
            f"probe: {self._by_forward} iteration(s) were ended by a forward call of the "
            "model, as no optimizer.step() had come yet; from now on each optimizer step "
            "ends an iteration. With gradient accumulation, end each "
            "iteration explicitly (profiler.step() / debugger.step())."
        )
        log.warning(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
