"""The floor of API-level capture: the least work any agent writing probe's records must do
per call, for ``bench/capture_overhead.py --floor``. Not an agent: it writes nothing
readable, and it leaves out what the records need beyond the tensors' facts.

Why: the agent's Python per call is spread over many small pieces (docs/capture.md, "Issue
15, tenth pass"), and compiling it unchanged gained nothing ("eleventh pass"). A native
per-call path can only remove what lies above a floor that no implementation escapes. These
are the three floors, each timed in the same run as the agent:

1. ``wrappers``: the agent's own wrappers on every API of its list (``patcher.PATCHER``, which
   routes a call to whichever capture is ``patcher.DISPATCH.current``: the floor, while it runs),
   and a handler that counts each call per API. Every record needs this count for its key.
2. ``facts``: the wrappers, plus for every tensor argument and result, what a record reads
   of a tensor however it is written:
   - dtype, shape, element count, storage address, version and identity;
   - statistics by the probe binary's one-pass kernel (contiguous float32 and bfloat16;
     one read for a single element), on the CPU only: on an accelerator this floor takes
     none, so it is a lower floor there than the agent's device-side statistics;
   - one tuple per call kept until ``stop()``, then serialised by orjson once.
3. ``hooks``: the facts, plus a gradient hook on each result that requires grad, and on an
   autograd alias of each top-level input that requires grad (what the agent does so that
   the input's gradient reaches the backward record); a hook takes the same facts of its
   gradient.

What the floor leaves out, and the agent does: the names of the tensors and the JSON record
of each; the dataflow links (``src``/``id``) and the statistics reused through them; the
stack of each call; the aliases of inputs nested in lists; and PyTorch's reductions for the
dtypes the kernel does not read (the example's integer targets). The gap between a floor and
the agent is what a native per-call path could win at most.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import orjson
import torch

from probe.capture.backward import alias_of
from probe.capture.patcher import DISPATCH, PATCHER
from probe.capture.records import results
from probe.capture.stats import DTYPE_NAMES
from probe.capture.threadstate import tls

#: (level, name) of each floor, in the order of the module doc.
LEVELS = ((1, "wrappers"), (2, "facts"), (3, "hooks"))

Facts = tuple[Any, ...]


class FloorAgent:
    """One floor, started and stopped around a step as a Debugger is."""

    def __init__(
        self, level: int, kernels: Optional[dict[torch.dtype, Any]], turns: bool = False
    ) -> None:
        """``turns``: other agents' wrappers take turns with this checkout's (``--baseline``),
        so the wrappers come out at ``stop()``, as the agents' then do."""
        import ctypes

        self.level = level
        self._turns = turns
        self._kernels = kernels or {}
        self._out = (ctypes.c_double * 4)()
        self._calls: dict[str, int] = {}
        self._returned = 0  # calls that returned: a call that raises writes no record
        self._kept: list[tuple[Any, ...]] = []
        #: Calls that returned in the last step stopped: the forward records an agent writes
        #: (a call that raises, as a checkpoint's recompute does when it stops early, has
        #: taken its number but writes nothing).
        self.calls = 0

    def start(self, model: Any) -> None:
        PATCHER.install()  # once: the wrappers stay between steps, as the agent leaves them
        DISPATCH.current = self  # type: ignore[assignment]
        tls.active = True

    def stop(self) -> None:
        tls.active = False
        DISPATCH.current = None
        if self._turns:
            PATCHER.uninstall()
        self.calls = self._returned
        orjson.dumps(self._kept)  # the writing an agent does, timed with the step
        self._kept = []
        self._calls = {}
        self._returned = 0

    def _facts(self, t: torch.Tensor) -> Facts:
        dt = t.dtype
        n = t.numel()
        stats: Optional[list[float]] = None
        if t.is_cpu:  # an accelerator's tensor is not read: no host sync, no statistics
            kernel = self._kernels.get(dt)
            if n == 1:
                v = float(t.item())
                stats = [v, v, v, abs(v)]
            elif kernel is not None and n and t.is_contiguous():
                if kernel(t.data_ptr(), n, self._out):
                    stats = self._out[:]
        return (
            DTYPE_NAMES.get(dt, ""),
            tuple(t.shape),
            n,
            t.untyped_storage().data_ptr(),
            t._version,
            id(t),
            stats,
        )

    def _tensors(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Facts]:
        facts = self._facts
        out = []
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor):
                out.append(facts(a))
            elif isinstance(a, (list, tuple)):
                out.extend(facts(x) for x in a if isinstance(x, torch.Tensor))
        return out

    def call(
        self,
        orig: Callable[..., Any],
        api: str,
        inplace: bool,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        tls.active = False
        try:
            calls = self._calls
            n = calls.get(api, 0)
            calls[api] = n + 1
            if self.level < 2:
                out = orig(*args, **kwargs)
                self._returned += 1
                return out
            ins = self._tensors(args, kwargs)
            hooks = self.level >= 3 and torch.is_grad_enabled()
            if hooks:
                args = tuple(self._alias(a, api, n, inplace and i == 0) for i, a in enumerate(args))
            out = orig(*args, **kwargs)
            produced = results(out)
            outs = [self._facts(o) for o in produced if isinstance(o, torch.Tensor)]
            if hooks:
                for o in produced:
                    if isinstance(o, torch.Tensor) and o.requires_grad and o.grad_fn is not None:
                        o.register_hook(functools.partial(self._gradient, api, n))
            self._kept.append((api, n, ins, outs))
            self._returned += 1
            return out
        finally:
            tls.active = True

    def _alias(self, a: Any, api: str, n: int, written: bool) -> Any:
        """An input that requires grad, as an autograd alias with a hook: the only way its
        gradient reaches the op's backward record (the agent's way, ``api.ApiCapture._pre``).
        An input the op writes in place keeps its object."""
        if written or not isinstance(a, torch.Tensor) or not a.requires_grad:
            return a
        alias = alias_of(a)
        alias.register_hook(functools.partial(self._gradient, api, n))
        return alias

    def _gradient(self, api: str, n: int, g: torch.Tensor) -> None:
        active, tls.active = tls.active, False  # the hook's own calls are not the model's
        try:
            self._kept.append((api, n, self._facts(g)))
        finally:
            tls.active = active
