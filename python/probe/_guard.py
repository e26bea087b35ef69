"""Never fail the training run: the one boundary between training code and the agent.

The agent runs inside someone else's training loop, where an exception from a debugging
tool would cost a run of hours. So every entry point from PyTorch or user code into the
agent (API wrappers, module and autograd hooks, the seed and draw hooks, the public
methods) catches what it raises and hands it to its feature's :class:`Guard`. A guard
reports the first failure once, with the context it happened in (later ones would only
repeat it), and calls its owner's ``on_failure`` for every one. What switching the feature
off means is the owner's to say: the capture agent removes every hook and stays off for the
rest of the run; a config pack notes the error in its manifest and carries on with what
still works.

Hot paths use ``try: ... except Exception as exc: guard.fail(exc, context)`` inline (a
context manager per captured op would cost more than the rest of the bookkeeping); colder
methods use the :func:`guarded` decorator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional, Protocol, TypeVar

if TYPE_CHECKING:
    from typing_extensions import Concatenate, ParamSpec

    P = ParamSpec("P")

R = TypeVar("R")
Handler = Callable[[BaseException, str], None]


class Guard:
    """The failure state of one feature.

    ``report(exc, context)`` tells the user about the first failure; ``on_failure(exc,
    context)`` runs for every failure, before the report, and must not raise.
    """

    __slots__ = ("_on_failure", "_report", "failed")

    def __init__(self, report: Handler, on_failure: Optional[Handler] = None) -> None:
        self.failed = False
        self._report = report
        self._on_failure = on_failure

    def fail(self, exc: BaseException, context: str) -> None:
        """Record a failure that was caught in ``context`` (e.g. ``"stop()"``)."""
        first = not self.failed
        self.failed = True
        if self._on_failure is not None:
            self._on_failure(exc, context)
        if first:
            self._report(exc, context)


class Guarded(Protocol):
    """An object whose methods are guarded by its ``_guard``."""

    @property
    def _guard(self) -> Guard: ...


S = TypeVar("S", bound=Guarded)


def guarded(
    context: str,
) -> Callable[[Callable[Concatenate[S, P], R]], Callable[Concatenate[S, P], Optional[R]]]:
    """Decorator for a method of a :class:`Guarded` object: it never raises; a failure goes
    to ``self._guard`` with ``context`` and the method returns None."""

    def deco(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], Optional[R]]:
        def inner(self: S, /, *args: P.args, **kwargs: P.kwargs) -> Optional[R]:
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - must never fail the training run
                self._guard.fail(exc, context)
                return None

        inner.__name__ = method.__name__
        inner.__doc__ = method.__doc__
        return inner

    return deco
