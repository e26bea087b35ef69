"""DDP's gradient all-reduce, which the C++ reducer runs out of sight of the API wrappers.

:class:`DdpHooks` registers a communication hook on a ``DistributedDataParallel`` model that
runs torch's default all-reduce hook and records each bucket as
``Distributed.ddp_bucket_allreduce.<bucket>.forward`` (input: the bucket's flat local
gradient, output: the reduced one; ``group``/``coll_seq`` as for any collective:
collectives.py), and has the step's ``parameters_grad`` records taken again once DDP has
written the reduced gradients back into ``param.grad``.
"""

from __future__ import annotations

import logging
import warnings
import weakref
from typing import Any, Callable, Optional

import torch

from .._op_key import api_key
from .backward import BackwardHooks
from .collectives import group_ranks
from .context import HookContext
from .records import OpRecord
from .threadstate import tls

log = logging.getLogger("probe")

#: The API name of a DDP bucket's all-reduce in op keys.
_BUCKET_API = "Distributed.ddp_bucket_allreduce"


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def is_ddp(model: Any) -> bool:
    try:
        from torch.nn.parallel import DistributedDataParallel
    except Exception:  # noqa: BLE001 - torch without distributed support
        return False
    return isinstance(model, DistributedDataParallel)


class DdpHooks:
    """The DDP communication hook of one Debugger (registered once per model)."""

    def __init__(self, ctx: HookContext, backward: BackwardHooks) -> None:
        # Held weakly: the hook lives as long as the model, which may outlive the Debugger.
        self._ref = weakref.ref(ctx)
        self._backward = weakref.ref(backward)
        self._seen: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        #: This backward's bucket records, in launch order, written together once DDP has
        #: waited for all of them (futures complete in any order, on gloo/NCCL threads).
        self.inflight: list[OpRecord] = []

    def attach(self, model: torch.nn.Module) -> None:
        """Register the recording hook on a DDP model, once. A model that already has a
        communication hook (the user's) keeps it: one warning, its buckets are not seen."""
        if model in self._seen:
            return
        self._seen.add(model)
        if getattr(model, "_comm_hooks", None):
            _warn_own_hook()
            return
        state = getattr(model, "process_group", None)
        try:
            model.register_comm_hook(state, self._make_hook())  # type: ignore[operator]
        except RuntimeError as exc:
            if "once" in str(exc):
                _warn_own_hook()
                return
            raise

    def _make_hook(self) -> Callable[[Any, Any], torch.futures.Future[torch.Tensor]]:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ref = self._ref

        def hook(state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
            ctx = ref()
            op: Optional[OpRecord] = None
            was = tls.active
            # The agent's own work, and the default hook's div_ and all_reduce (DDP's, not
            # the user's calls), are not captured as API calls.
            tls.active = False
            if ctx is not None and ctx.running and not ctx.guard.failed:
                try:
                    with ctx.lock:
                        op = self._bucket_input(ctx, state, bucket)
                except Exception as exc:  # noqa: BLE001
                    ctx.guard.fail(exc, "recording a DDP bucket")
                    op = None
            try:
                # Looked up at call time: the module's function, whatever it is now.
                fut = default_hooks.allreduce_hook(state, bucket)
            finally:
                tls.active = was
            if op is None:
                return fut
            rec = op

            def done(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
                out = f.value()
                c = ref()
                if c is not None and not c.guard.failed:
                    active = tls.active  # inline when the future was already complete
                    tls.active = False
                    try:
                        with c.lock:
                            c.recorder.add_tensor(rec, f"{rec.key}.output.0", "output", out, True)
                    except Exception as exc:  # noqa: BLE001
                        c.guard.fail(exc, "recording a reduced DDP bucket")
                    finally:
                        tls.active = active
                return out

            return fut.then(done)

        # DDP checks the hook's annotations, which this module's postponed evaluation
        # made strings: give it the real types.
        hook.__annotations__ = {
            "state": object,
            "bucket": _dist().GradBucket,
            "return": torch.futures.Future[torch.Tensor],
        }
        return hook

    def _bucket_input(self, ctx: HookContext, state: Any, bucket: Any) -> Optional[OpRecord]:
        rec = ctx.recorder
        folder = rec.files.folder
        if folder is None:
            return None
        index = int(bucket.index())
        call = ctx.select.api_call(_BUCKET_API, None)
        ranks = group_ranks(state)
        seq = ctx.collectives.next_seq(("group", *ranks)) if ranks is not None else None
        if index == 0:
            # DDP launches its buckets in index order: bucket 0 opens each backward.
            self._queue_after_backward(ctx)
        if call is None or not ctx.config.forward:
            return None
        # The key's call index is the bucket's: the same bucket pairs across runs and ranks.
        op = OpRecord(api_key(_BUCKET_API, index), "api", "forward", None, folder)
        op.group = ranks
        op.coll_seq = seq
        op.args = {"bucket": index, "last": bool(bucket.is_last())}
        if ctx.config.inputs:
            # Stats now: the default hook divides the buffer in place, then reduces it.
            rec.add_tensor(op, f"{op.key}.input.0", "input", bucket.buffer(), True)
        self.inflight.append(op)
        return op

    def flush(self) -> None:
        """Write this backward's bucket records, in launch order (at the end of backward;
        at ``stop()`` whatever is left, e.g. a future that never completed)."""
        ctx = self._ref()
        ops, self.inflight = self.inflight, []
        if ctx is None:
            return
        for op in ops:
            if not op.done:
                ctx.recorder.finish(op)

    def _queue_after_backward(self, ctx: HookContext) -> None:
        """Once this backward is over: write its bucket records (in launch order, so that the
        op log's order does not depend on which future completed first) and have
        ``parameters_grad`` taken again.

        Why there: DDP's reducer queues its end-of-backward callback (finalize_backward: wait for
        every bucket's future, copy the reduced buckets into ``param.grad``) on the autograd
        engine once the last bucket is launched, i.e. after this hook returns. A callback queued
        now runs before it; that one queues a second callback, which the engine runs after
        DDP's (final callbacks queued while they run are run too, in order), still inside
        ``loss.backward()``. So it sees the reduced gradients and nothing else yet (no
        optimizer step, no zero_grad), which neither the last bucket's future (the copy-back
        comes after it) nor ``stop()`` (after the optimizer step) guarantee.
        """
        ref = self._ref
        session = ctx.session
        engine = torch.autograd.Variable._execution_engine

        def retake() -> None:
            c = ref()
            if c is None or c.guard.failed or c.session != session:
                return
            was = tls.active
            tls.active = False
            try:
                with c.lock, torch.no_grad():
                    self.flush()
                    backward = self._backward()
                    if backward is not None and c.config.module and c.config.backward:
                        backward.retake_param_grads()
            except Exception as exc:  # noqa: BLE001
                c.guard.fail(exc, "taking reduced DDP gradients")
            finally:
                tls.active = was

        def after_ddp() -> None:
            try:
                engine.queue_callback(retake)
            except Exception as exc:  # noqa: BLE001
                c = ref()
                if c is not None:
                    c.guard.fail(exc, "queueing the reduced DDP gradients")

        engine.queue_callback(after_ddp)


def _warn_own_hook() -> None:
    msg = (
        "probe: this DDP model already has a communication hook (yours); it is kept, and "
        "DDP's gradient buckets are not recorded (parameters_grad stays the local gradient)"
    )
    log.warning(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=4)
