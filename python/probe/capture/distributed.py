"""Distributed runs: collective metadata on ``Distributed.*`` records, and DDP's gradient
all-reduce, which the C++ reducer runs out of sight of the API wrappers.

Collective metadata (docs/format.md): every ``Distributed.<name>.<call>.forward`` record
gets ``group`` (the global ranks of its process group, ascending; the default group gives
all ranks) and ``coll_seq`` (the position of this collective among the collectives of that
group in the step, from 0). Every rank of a group issues the group's collectives in the
same order (torch.distributed requires it), so the same ``coll_seq`` names the same
collective on every rank of the group. Point-to-point calls (``send``, ``recv``, ``isend``,
``irecv``) get ``group`` = ``[sender, receiver]`` and a sequence per ordered rank pair, so
that a send and its matching receive carry the same ``group`` and ``coll_seq``.

DDP: :class:`DdpHooks` registers a communication hook on a ``DistributedDataParallel``
model that runs torch's default all-reduce hook and records each bucket as
``Distributed.ddp_bucket_allreduce.<bucket>.forward`` (input: the bucket's flat local
gradient, output: the reduced one), and has the step's ``parameters_grad`` records taken
again once DDP has written the reduced gradients back into ``param.grad``.
"""

from __future__ import annotations

import inspect
import logging
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from .api import tls
from .records import OpRecord

if TYPE_CHECKING:
    from .debugger import Debugger

log = logging.getLogger("probe")

_P2P = {"send", "recv", "isend", "irecv"}
#: The API calls that carry no collective metadata (a list of P2POp: each op has its own
#: peer and group; the batch as a whole has neither).
_NO_META = {"batch_isend_irecv"}


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def group_ranks(group: Any) -> Optional[list[int]]:
    """The global ranks of ``group`` (None: the default group), ascending, or None when
    torch.distributed is not initialised."""
    dist = _dist()
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    if isinstance(group, list) and all(isinstance(r, int) for r in group):
        return sorted(group)  # (the functional collectives take ranks too)
    if not isinstance(group, dist.ProcessGroup):
        # A functional collective's (mesh, dim), a 1-D DeviceMesh or a group's name.
        try:
            from torch.distributed import _functional_collectives as funcol
            from torch.distributed import distributed_c10d as c10d

            resolve = c10d._resolve_process_group  # type: ignore[attr-defined]
            group = resolve(funcol._resolve_group_name(group))
        except Exception:  # noqa: BLE001 - a form this PyTorch does not resolve: no group
            return None
    return sorted(int(r) for r in dist.get_process_group_ranks(group))


class Collectives:
    """Per-step sequence numbers of collectives, per process group and per p2p rank pair."""

    def __init__(self) -> None:
        self._seq: dict[tuple[Any, ...], int] = {}
        self._sigs: dict[Callable[..., Any], Optional[inspect.Signature]] = {}

    def new_step(self) -> None:
        self._seq.clear()

    def next_seq(self, key: tuple[Any, ...]) -> int:
        n = self._seq.get(key, 0)
        self._seq[key] = n + 1
        return n

    def _bind(
        self, name: str, orig: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        # By function: torch.distributed's all_reduce and the functional one share a name.
        if orig not in self._sigs:
            try:
                self._sigs[orig] = inspect.signature(orig)
            except (TypeError, ValueError):
                self._sigs[orig] = None
        sig = self._sigs[orig]
        if sig is None:
            return dict(kwargs)
        try:
            return dict(sig.bind_partial(*args, **kwargs).arguments)
        except TypeError:
            return dict(kwargs)

    def meta(
        self, api: str, orig: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Optional[tuple[list[int], int]]:
        """``(group, coll_seq)`` of one call of ``Distributed.<name>`` (None: none known)."""
        name = api.split(".", 1)[1]
        if name in _NO_META:
            return None
        bound = self._bind(name, orig, args, kwargs)
        group = bound.get("group")
        dist = _dist()
        if not (dist.is_available() and dist.is_initialized()):
            return None
        if name in _P2P:
            me = int(dist.get_rank())
            sends = name in ("send", "isend")
            peer = bound.get("dst" if sends else "src")
            gpeer = bound.get("group_dst" if sends else "group_src")
            if peer is None and gpeer is not None and group is not None:
                peer = dist.get_global_rank(group, int(gpeer))
            if peer is None:
                # recv from any source: the sender is only known afterwards.
                return [me], self.next_seq(("p2p", None, me))
            # [sender, receiver], numbered per ordered pair: a send and the recv that
            # matches it (point-to-point messages between two ranks arrive in order) get
            # the same group and coll_seq on the two ranks.
            pair = [me, int(peer)] if sends else [int(peer), me]
            return pair, self.next_seq(("p2p", *pair))
        ranks = group_ranks(group)
        if ranks is None:
            return None
        return ranks, self.next_seq(("group", *ranks))


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


def is_ddp(model: Any) -> bool:
    try:
        from torch.nn.parallel import DistributedDataParallel
    except Exception:  # noqa: BLE001 - torch without distributed support
        return False
    return isinstance(model, DistributedDataParallel)


class DdpHooks:
    """The DDP communication hook of one Debugger (registered once per model)."""

    def __init__(self, dbg: Debugger) -> None:
        self._ref = weakref.ref(dbg)
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
            dbg = ref()
            op: Optional[OpRecord] = None
            was = tls.active
            # The agent's own work, and the default hook's div_ and all_reduce (DDP's, not
            # the user's calls), are not captured as API calls.
            tls.active = False
            if dbg is not None and dbg._running and not dbg._guard.failed:
                try:
                    with dbg._lock:
                        op = self._bucket_input(dbg, state, bucket)
                except Exception as exc:  # noqa: BLE001
                    dbg._guard.fail(exc, "recording a DDP bucket")
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
                d = ref()
                if d is not None and not d._guard.failed:
                    active = tls.active  # inline when the future was already complete
                    tls.active = False
                    try:
                        with d._lock:
                            d._add_tensor(rec, f"{rec.key}.output.0", "output", out, True)
                    except Exception as exc:  # noqa: BLE001
                        d._guard.fail(exc, "recording a reduced DDP bucket")
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

    def _bucket_input(self, dbg: Debugger, state: Any, bucket: Any) -> Optional[OpRecord]:
        folder = dbg._files.folder
        if folder is None:
            return None
        index = int(bucket.index())
        api = "Distributed.ddp_bucket_allreduce"
        call = dbg._select.api_call(api, None)
        ranks = group_ranks(state)
        seq = dbg._collectives.next_seq(("group", *ranks)) if ranks is not None else None
        if index == 0:
            # DDP launches its buckets in index order: bucket 0 opens each backward.
            _queue_after_backward(dbg)
        if call is None or not dbg.config.forward:
            return None
        op = OpRecord(f"{api}.{index}.forward", "api", "forward", None, folder)
        op.group = ranks
        op.coll_seq = seq
        op.args = {"bucket": index, "last": bool(bucket.is_last())}
        if dbg.config.inputs:
            # Stats now: the default hook divides the buffer in place, then reduces it.
            dbg._add_tensor(op, f"{op.key}.input.0", "input", bucket.buffer(), True)
        self.inflight.append(op)
        return op

    def flush(self, dbg: Debugger) -> None:
        """Write this backward's bucket records, in launch order (at the end of backward;
        at ``stop()`` whatever is left, e.g. a future that never completed)."""
        ops, self.inflight = self.inflight, []
        for op in ops:
            if not op.done:
                dbg._finish(op)


def _queue_after_backward(dbg: Debugger) -> None:
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
    ref = weakref.ref(dbg)
    session = dbg._session
    engine = torch.autograd.Variable._execution_engine

    def retake() -> None:
        d = ref()
        if d is None or d._guard.failed or d._session != session:
            return
        was = tls.active
        tls.active = False
        try:
            with d._lock, torch.no_grad():
                d._ddp.flush(d)
                if d.config.module and d.config.backward:
                    d._backward.retake_param_grads()
        except Exception as exc:  # noqa: BLE001
            d._guard.fail(exc, "taking reduced DDP gradients")
        finally:
            tls.active = was

    def after_ddp() -> None:
        try:
            engine.queue_callback(retake)
        except Exception as exc:  # noqa: BLE001
            d = ref()
            if d is not None:
                d._guard.fail(exc, "queueing the reduced DDP gradients")

    engine.queue_callback(after_ddp)


def _warn_own_hook() -> None:
    msg = (
        "probe: this DDP model already has a communication hook (yours); it is kept, and "
        "DDP's gradient buckets are not recorded (parameters_grad stays the local gradient)"
    )
    log.warning(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=4)
