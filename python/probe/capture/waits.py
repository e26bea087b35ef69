"""Collectives whose result arrives after the call returns, and the records that wait for it.

An in-place collective's record holds the tensor it writes before (input) and after
(output) the call. Two kinds of calls return before that tensor holds the result:

- a call with ``async_op=True``, and ``irecv``: they return a ``Work`` handle, and the result
  is in place once ``Work.wait()`` returns;
- a collective inside ``torch.distributed._coalescing_manager`` (Megatron's distributed
  optimizer gathers parameters and reduce-scatters gradients in one): it is only queued,
  and runs as one coalesced call when the manager exits; with ``async_ops=True`` its result
  is in place once the handles the manager collects (``cm.works``, ``cm.wait()``) are
  waited on.

Reading the output at the call recorded the tensor as it was before the collective: a wrong
output, or none at all. The agent never waits itself (msprobe waits inside the call, which
deadlocks two ranks that each post a receive before their send on a backend that blocks the
host, such as gloo). Instead, while it captures it wraps ``Work.wait`` and
``_coalescing_manager`` (:func:`patches`), and :class:`Waits` finishes each such call's
record when its result is in place: the record takes its place in the dump there. A record
whose handle is not waited on through ``Work.wait()`` before ``stop()`` (waited through
``get_future()``, or later) is finished at ``stop()`` without outputs, and the user is told
once.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from .context import HookContext
from .inplace import Inplace
from .threadstate import tls

#: What finishes a waiting record, given the call's result: None (in place now) or
#: :data:`UNWAITED`.
Finish = Callable[[Any], Any]

#: The result of a call whose handle was never waited on: no tensor, so its record gets no
#: outputs.
UNWAITED = object()


def work_type() -> Optional[type]:
    """torch.distributed's ``Work``: the handle an asynchronous collective returns."""
    try:
        import torch.distributed as dist

        work = getattr(dist, "Work", None) if dist.is_available() else None
    except Exception:  # noqa: BLE001 - optional
        return None
    return work if isinstance(work, type) else None


_WORK = work_type()


class Waits:
    """The records of one Debugger that wait for their collective's result."""

    def __init__(self, ctx: HookContext) -> None:
        self._ctx = ctx
        #: By the id of the handle they wait for: the API, the handle (held, so that its id
        #: stays its own) and what finishes the record.
        self.handles: dict[int, tuple[str, Any, Finish]] = {}
        #: The coalescing managers open now, innermost last: the calls queued in each.
        self.coalescing: list[list[tuple[str, Finish]]] = []

    def later(self, api: str, inplace: Inplace, out: Any) -> bool:
        """Whether a call of ``api`` that returned ``out`` has its result later: an in-place
        collective inside a coalescing manager, or one that returned a handle."""
        return (
            bool(inplace)
            and api.startswith("Distributed.")
            and (bool(self.coalescing) or (_WORK is not None and isinstance(out, _WORK)))
        )

    def defer(self, api: str, out: Any, finish: Finish) -> None:
        """Finish the record of a call for which :meth:`later` holds once its result is in
        place (called with the Debugger's lock held)."""
        if self.coalescing:
            self.coalescing[-1].append((api, finish))
        else:
            self.handles[id(out)] = (api, out, finish)

    def waited(self, work: Any) -> None:
        """``work.wait()`` returned: the record waiting for it is finished."""
        entry = self.handles.pop(id(work), None)
        if entry is not None:
            self._run(entry[0], entry[2], None)

    def coalesced(self, calls: list[tuple[str, Finish]], manager: Any) -> None:
        """A coalescing manager exited. Without handles (``async_ops=False``: it waited)
        its calls' results are in place; with them, they are once every handle is waited
        on. ``manager`` None: it failed, and the calls get no outputs."""
        if not calls:
            return
        works = list(getattr(manager, "works", None) or ()) if manager is not None else []
        if manager is None or not works:
            for api, finish in calls:
                self._run(api, finish, UNWAITED if manager is None else None)
            return
        left = {id(w) for w in works}

        def finish_all(work_id: int, out: Any) -> None:
            if not left:
                return  # (finished already: without outputs, at stop())
            left.discard(work_id)
            if left and out is not UNWAITED:
                return
            left.clear()
            for _, finish in calls:
                finish(out)

        name = calls[0][0]
        for w in works:
            self.handles[id(w)] = (name, w, functools.partial(finish_all, id(w)))

    def settle(self) -> None:
        """At ``stop()``: records whose handle was not waited on are finished without
        outputs, and the user is told once (their result may not be in place yet)."""
        while self.handles:
            _, (api, _, finish) = self.handles.popitem()
            self._run(api, finish, UNWAITED)
            self._ctx.tell_once(
                "unwaited",
                f"probe: {api} ran asynchronously and its handle was not waited on "
                f"(Work.wait()) before stop() at step {self._ctx.current_step}: its result is "
                "not recorded",
                stacklevel=4,  # the caller of stop()
            )

    def clear(self) -> None:
        """Capture is off for good: nothing waits any more."""
        self.handles.clear()
        self.coalescing.clear()

    def _run(self, api: str, finish: Finish, out: Any) -> None:
        ctx = self._ctx
        was = tls.active
        tls.active = False
        try:
            with ctx.lock:
                finish(out)
        except Exception as exc:  # noqa: BLE001
            ctx.guard.fail(exc, f"capturing outputs of {api}")
        finally:
            tls.active = was


def patches(current: Callable[[], Optional[Waits]]) -> list[tuple[Any, str, Any]]:
    """``(owner, name, new)``: ``Work.wait`` and ``_coalescing_manager`` wrapped to tell
    the capturing Debugger's :class:`Waits` (``current()``), installed with the API
    wrappers."""
    if _WORK is None:
        return []
    from torch.distributed import distributed_c10d as c10d

    work: Any = _WORK
    out: list[tuple[Any, str, Any]] = [(work, "wait", _wait(work.wait, current))]
    manager = getattr(c10d, "_coalescing_manager", None)
    if callable(manager):
        wrapped = _coalescing(manager, current)
        out.append((c10d, "_coalescing_manager", wrapped))
        import torch.distributed as dist

        if getattr(dist, "_coalescing_manager", None) is manager:
            out.append((dist, "_coalescing_manager", wrapped))
    return out


def _wait(orig: Callable[..., Any], current: Callable[[], Optional[Waits]]) -> Any:
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        done = orig(self, *args, **kwargs)
        waits = current()
        if waits is not None and waits.handles:
            waits.waited(self)
        return done

    functools.update_wrapper(wait, orig)
    return wait


def _coalescing(orig: Callable[..., Any], current: Callable[[], Optional[Waits]]) -> Any:
    def _coalescing_manager(*args: Any, **kwargs: Any) -> _Coalescing:
        return _Coalescing(orig(*args, **kwargs), current())

    functools.update_wrapper(_coalescing_manager, orig)
    return _coalescing_manager


class _Coalescing:
    """One ``_coalescing_manager`` context: the calls made inside it wait for its exit."""

    def __init__(self, cm: Any, waits: Optional[Waits]) -> None:
        self._cm = cm
        self._waits = waits
        self._calls: list[tuple[str, Finish]] = []
        self._manager: Any = None

    def __enter__(self) -> Any:
        self._manager = self._cm.__enter__()
        if self._waits is not None:
            self._waits.coalescing.append(self._calls)
        return self._manager

    def __exit__(self, *exc: Any) -> Any:
        waits = self._waits
        if waits is not None and waits.coalescing and waits.coalescing[-1] is self._calls:
            waits.coalescing.pop()
        try:
            suppress = self._cm.__exit__(*exc)
        except BaseException:
            if waits is not None:
                waits.coalesced(self._calls, None)
            raise
        if waits is not None:
            waits.coalesced(self._calls, self._manager if exc[0] is None else None)
        return suppress
