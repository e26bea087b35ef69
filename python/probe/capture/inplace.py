"""In-place calls: which argument a call writes, and what holds its result.

Why: an in-place call (``x.add_(y)``, ``F.relu(x, inplace=True)``, ``x[i] = v``, a collective
that fills its first argument) is recorded differently from a functional one: the tensor it
writes is read before the call (its input statistics would otherwise be its output's), it
must not be replaced by an autograd alias (the write would land in the alias), its output is
that argument when the call returns None, and overflow mode keeps a copy of it as the call
saw it. The API wrappers (which calls are in place), the API capture (what to record) and
the records waiting for a collective (whose result arrives later) all ask the same
questions; they are answered here, from the names alone.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch

# Distributed collectives that write their result into their first argument.
_DIST_INPLACE = {
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather_coalesced",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "_all_gather_base",
    "_reduce_scatter_base",
    "all_to_all",
    "all_to_all_single",
    "recv",
    "irecv",
    "scatter",
    "gather",
}


#: The collectives among them that only write that argument: what it held before is not
#: their input (a gather's output buffer, often just allocated). The others read it too.
DIST_WRITE_ONLY = frozenset(
    _DIST_INPLACE - {"all_reduce", "all_reduce_coalesced", "broadcast", "reduce"}
)


class Writes:
    """Where an in-place call writes, when that is not its first argument: ``dist.gather``
    fills ``gather_list``, its second (on the destination rank; it is None elsewhere). Its
    output was recorded as the tensor it sends, the gathered values were not. Passed as
    the call's ``inplace``, which it is (truthy)."""

    __slots__ = ("index", "key")

    def __init__(self, index: int, key: str) -> None:
        self.index = index
        self.key = key


#: ``True`` (the first argument), a :class:`Writes`, or ``False``: what an API writes.
Inplace = Union[bool, Writes]

#: The collectives that write another argument than their first.
_DIST_WRITES_AT = {"gather": Writes(1, "gather_list")}


def _holds_result(first: Any) -> bool:
    """Whether an in-place call's first argument can hold its result: a tensor, or a list
    of tensors (or of lists of tensors: all_gather_coalesced)."""
    if isinstance(first, torch.Tensor):
        return True
    return (
        isinstance(first, (list, tuple))
        and bool(first)
        and all(
            isinstance(x, torch.Tensor) or (isinstance(x, (list, tuple)) and _holds_result(x))
            for x in first
        )
    )


#: The names an in-place call's first parameter (the argument it writes) has, for calls
#: that pass it by keyword, as FSDP2 calls ``reduce_scatter_single(output=..., input=...)``.
_TARGET_KEYS = (
    "tensor",
    "output",
    "output_tensor",
    "tensor_list",
    "output_tensor_list",
    "tensors",
    "output_tensor_lists",
)


def target(
    args: tuple[Any, ...], kwargs: dict[str, Any], inplace: Inplace = True
) -> tuple[Optional[str], Any]:
    """The argument an in-place call writes (its first, unless ``inplace`` says where),
    and the keyword it was passed by (None: by position; ``(None, None)``: not given)."""
    if type(inplace) is Writes:
        if len(args) > inplace.index:
            return None, args[inplace.index]
        return (inplace.key, kwargs[inplace.key]) if inplace.key in kwargs else (None, None)
    if args:
        return None, args[0]
    if kwargs:
        for key in _TARGET_KEYS:
            if key in kwargs:
                return key, kwargs[key]
    return None, None


def as_seen(
    snapshot: Callable[[torch.Tensor], torch.Tensor],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    inplace: Inplace = True,
    lists: bool = False,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """An in-place call's arguments as it saw them: the tensor it writes replaced by a
    snapshot (overflow mode keeps these in case the call overflows).

    ``lists``: a list of tensors it writes is replaced by a list of their snapshots (the
    multi-tensor ops, ``torch._foreach_add_``: without them an update that made NaN was
    recorded reading the NaN it wrote, as if it came from upstream). Collectives pass
    False: a gather's output list holds no input, and copying it would read leftovers."""
    key, first = target(args, kwargs, inplace)
    if type(inplace) is Writes:
        return args, kwargs
    if isinstance(first, torch.Tensor):
        seen: Any = snapshot(first)
    elif lists and isinstance(first, list) and all(isinstance(t, torch.Tensor) for t in first):
        seen = [snapshot(t) for t in first]
    else:
        return args, kwargs
    if key is None:
        return (seen, *args[1:]), kwargs
    return args, {**kwargs, key: seen}


def result_of(out: Any, inplace: Inplace, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What holds a call's result: what it returned, or for an in-place call returning None
    (``__setitem__``, collectives) the argument it writes, when that can hold one (a list of
    tensors for all_gather and the _coalesced variants)."""
    if out is None and inplace:
        first = target(args, kwargs, inplace)[1]
        if first is not None and _holds_result(first):
            return first
    return out


def is_inplace(api_type: str, name: str) -> Inplace:
    """In-place ops modify their first argument (or the one a :class:`Writes` names): its
    input stats must be taken before the call, and it must not be replaced by an autograd
    alias."""
    if api_type == "Distributed":
        return _DIST_WRITES_AT.get(name) or name in _DIST_INPLACE
    if name.startswith("__"):
        return name.startswith("__i") and name not in ("__invert__",) or name == "__setitem__"
    return name.endswith("_")
