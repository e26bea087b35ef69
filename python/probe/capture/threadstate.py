"""What the capturing thread is doing now: the per-thread capture flag, and autograd's and
``torch.func``'s state as a hook sees it.

Why a module of its own, importing nothing else of the agent: every entry point reads the
flag first (the API wrappers on every call of a hooked API, the module and autograd hooks,
the writer thread at its start), so it sits below all of them. It lived in ``api.py``,
which made every hook module import the API capture for one attribute, and the API capture
import them back: most of the package was one import circle.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import torch


class _TLS(threading.local):
    """Per-thread capture flag: True while a thread's calls are captured, False while they
    are not (the agent's own work, a stopped Debugger), None on a thread the agent never
    set it on: its calls are captured only while it runs the captured step's backward
    (``patcher.capturing``). The class attribute is the default for such threads."""

    active: Optional[bool] = None


tls = _TLS()

#: The id of the backward graph autograd runs on this thread now (-1: none).
graph_task_id: Optional[Callable[[], int]] = getattr(torch._C, "_current_graph_task_id", None)

_peek_transform: Optional[Callable[[], Any]] = getattr(
    getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None
)


def in_backward() -> bool:
    """Whether autograd runs a backward graph on this thread now."""
    return graph_task_id is not None and graph_task_id() != -1


def in_transform() -> bool:
    """Whether a ``torch.func`` transform (``vmap``, ``grad``, ``jacrev``...) runs now. Its
    tensors are wrappers without storage of their own, holding one sample's view of a
    batch: calls made inside one are not captured (the Debugger says so once), where
    reading them switched capture off for the rest of the run."""
    return _peek_transform is not None and _peek_transform() is not None


def in_recompute() -> bool:
    """Whether a forward is being recomputed now (activation checkpointing): autograd runs
    a backward graph, with gradients on. A checkpoint recomputes with them on (it rebuilds
    the graph it then differentiates); a custom autograd function's backward runs with them
    off, and its calls (a tensor-parallel layer's gradient all-reduce) are not a recompute.
    A backward with ``create_graph=True`` (gradient penalties) runs with them on: calls in a
    custom backward there are marked as recomputed."""
    return graph_task_id is not None and graph_task_id() != -1 and torch.is_grad_enabled()
