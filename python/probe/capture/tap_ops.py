"""The operators a compiled graph's taps call (``graph_taps.py`` puts them in the graph).

Why an operator of its own: traced as plain reductions, Inductor fused a tap into the kernel
that produces or reads its tensor, and that kernel's own code changed with it. In
train_small's SmallNet, the tap of the block's residual sum joined the kernel that computes
that sum, the final LayerNorm and the mean over tokens; the LayerNorm's reduction was
generated otherwise, and the logits of a captured step differed from the uncaptured run's
in the last bit (1.8e-7), then the gradients and every parameter after the update. Called as
an operator (``probe::tap_stats``), a tap only reads tensors the compiled code stored: what
the model's kernels compute is what they compute without the agent.

A gradient's row (:data:`GRAD_COLUMNS`) is one call too: the operator writes the 1 that
says the gradient came, instead of a ``cat`` kernel per gradient in the compiled backward.

Under Inductor the operator reads a tensor as the model's kernels stored it wherever they
fixed its layout (``tap_lowering.py``), not a copy in eager strides. Tried and not kept
(docs/performance.md): one call for the tensors of several API calls (no faster on the
example: the per-call cost is ~8 us now), and letting Inductor hand the operator any buffer
in any layout (Inductor then chose other layouts for the model's own buffers, and the
training's last bits moved).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from . import stats as _stats
from .stats import read_strided

# Bound before any wrapper exists: the graph copy must call PyTorch's own functions.
_amax = torch.amax
_amin = torch.amin
_sum = torch.sum
_sqrt = torch.sqrt
_where = torch.where
_abs = torch.abs
_stack = torch.stack
_cat = torch.cat
_ones = torch.ones
_zeros = torch.zeros
_mul = torch.mul
_ne = torch.ne
_eq = torch.eq
_to = torch.Tensor.to
_detach = torch.Tensor.detach
_view_as = torch.Tensor.view_as
_item = torch.Tensor.item
_clone = torch.Tensor.clone
_narrow = torch.Tensor.narrow
_unbind = torch.Tensor.unbind
_tensor = torch.tensor
_F64 = torch.float64
_F32 = torch.float32
_BOOL = torch.bool
_INF = float("inf")

#: Columns of a tap's row, as ``stats.stat_vector`` orders them.
COLUMNS = 6
#: Columns of a gradient's row of the sink: the statistics, then 1 where the gradient came.
GRAD_COLUMNS = COLUMNS + 1


def _reduce(x: torch.Tensor) -> torch.Tensor:
    """``[max, min, sum, norm, NaN count, Inf count]`` of ``x`` in float64: the statistics
    the eager agent records. Max and min are exact; the sum and the sum of squares
    accumulate in float64 (at least as accurate as the eager reductions); NaN and Inf are
    counted as sums of 0/1 in float64 (exact to 2**53), not by ``isnan(x).sum()``, whose
    bool-to-int64 reduction Inductor's CPU code does not vectorize. Only functions bound
    before the agent's wrappers exist, no Python operators: where the graph runs as Python
    (the ``eager`` backend), a gradient tap's backward runs while capturing, and ``d * d``
    was recorded as the model's ``Tensor.__mul__``."""
    if x.dtype is _BOOL:
        x = _to(x, _F32)  # max = any, min = all, as the eager statistics
    d = _to(x, _F64)
    return _stack(
        [
            _to(_amax(x), _F64),
            _to(_amin(x), _F64),
            _sum(d),
            _sqrt(_sum(_mul(d, d))),
            _sum(_to(_where(_ne(x, x), 1.0, 0.0), _F64)),
            _sum(_to(_where(_eq(_abs(x), _INF), 1.0, 0.0), _F64)),
        ]
    )


def _reduce_row(x: torch.Tensor, cols: int) -> torch.Tensor:
    """``x``'s row of ``cols`` columns (:func:`_reduce`; then a 1 when ``cols`` is
    :data:`GRAD_COLUMNS`): the operator on devices other than the CPU, and the tap itself
    where there is no operator."""
    out = _reduce(x)
    if cols > COLUMNS:
        out = _cat([out, _ones(1, dtype=_F64, device=out.device)])
    return out


#: Rows are made this many at a time (:func:`_row`), each row 64 bytes apart.
_ROWS = 256
_STRIDE = 8


def _template(cols: int) -> torch.Tensor:
    """:data:`_ROWS` blank rows of ``cols`` columns (zero counts, and the 1 of a gradient's
    row), :data:`_STRIDE` apart: made at import, before the agent's wrappers exist."""
    block = _zeros(_ROWS, _STRIDE, dtype=_F64)
    if cols > COLUMNS:
        block[:, COLUMNS] = 1.0
    return block


_TEMPLATES = {COLUMNS: _template(COLUMNS), GRAD_COLUMNS: _template(GRAD_COLUMNS)}


#: The blank rows not handed out yet, by column count.
_FREE: dict[int, list[torch.Tensor]] = {COLUMNS: [], GRAD_COLUMNS: []}


def _row(cols: int) -> torch.Tensor:
    """A blank row the native kernel writes its four numbers into: a view of a block made
    :data:`_ROWS` at a time (one copy and one ``unbind`` for them all: ~1 us less a tap
    than a copy of a blank row each), 64-byte aligned as Inductor assumes of an
    operator's result. A row is handed out once; its block lives while any of its rows
    does."""
    free = _FREE[cols]
    try:
        return free.pop()
    except IndexError:
        # (Only functions bound before the agent's wrappers exist: a tap of a compiled
        # backward runs while the step is captured.)
        rows = list(_unbind(_narrow(_clone(_TEMPLATES[cols]), 1, 0, cols)))
        row = rows.pop()
        free.extend(rows)  # (atomic under the GIL: a row goes to one caller)
        return row


def run_row(x: torch.Tensor, cols: int) -> torch.Tensor:
    """``probe::tap_stats`` on CPU (run eagerly, when the compiled graph calls it): a
    float32 or bfloat16 tensor is read once by the eager agent's native kernel
    (``stats.NATIVE``; a slice with gaps in its memory is read in place,
    ``stats.read_strided``), which writes max, min, sum and norm straight into the result
    (the counts stay 0: the kernel refuses a tensor with NaN or Inf); a one-element tensor
    is read as its value; any other takes :func:`_reduce`. Only functions bound
    before the agent's wrappers exist: a compiled backward runs while the step is captured
    (``out[6] = 1`` was recorded as the model's ``Tensor.__setitem__``). (Six eager
    reductions per tap made a captured compiled step of the example 6.0x its bare step,
    the native kernel 2.5x.)"""
    # (As stats.stat_vector reads a tensor, which keeps it inline: a shared helper cost
    # the eager hot path ~0.5 us a tensor, a quarter of a small tensor's statistics.)
    n = x.numel()
    if n == 1 and not x.is_complex():
        # A step counter, a scale, a loss: its one value is every statistic (as
        # stats.stat_vector takes it), one read instead of six reductions (~200 us).
        v = float(_item(x))
        row = [v, v, v + 0.0, abs(v)]
        row += [0.0, 0.0] if v - v == 0.0 else [1.0 if v != v else 0.0, 0.0 if v != v else 1.0]
        return _tensor(row + [1.0] if cols > COLUMNS else row, dtype=_F64)
    native = _stats.NATIVE
    kernel = native.get(x.dtype) if native is not None else None
    if kernel is not None and n > 0:
        out = _row(cols) if cols in _FREE else _zeros(cols, dtype=_F64)
        if x.is_contiguous():
            if kernel(x.data_ptr(), n, out.data_ptr()):
                return out
        elif read_strided(x, out.data_ptr()):  # (permuted, or with gaps: as stat_vector)
            return out
    return _reduce_row(x, cols)


def _opaque() -> Optional[Any]:
    """``probe::tap_stats(Tensor x, int cols) -> Tensor``, the row of ``cols`` numbers of
    ``x``, an operator compilers call as it is instead of fusing it into the kernels around
    it (module docstring); None where this PyTorch cannot register its fake (shape)
    function (before 2.4: the taps are then traced as plain reductions).

    Defined with ``torch.library.Library`` (a kernel per dispatch key), not
    ``torch.library.custom_op``, whose Python autograd layers cost ~10 us more a call. A
    tap reads detached tensors, so it needs no autograd kernel."""
    register_fake = getattr(torch.library, "register_fake", None)
    if register_fake is None:
        return None
    ops = getattr(torch.ops, "probe", None)
    existing = getattr(ops, "tap_stats", None) if ops is not None else None
    if existing is not None:
        return existing.default  # (this module loaded again: the operator is the process's)
    lib: Any = torch.library.Library("probe", "FRAGMENT")  # type: ignore[no-untyped-call]
    lib.define("tap_stats(Tensor x, int cols) -> Tensor")
    lib.impl("tap_stats", run_row, "CPU")
    lib.impl("tap_stats", _reduce_row, "CompositeExplicitAutograd")

    def fake(x: torch.Tensor, cols: int) -> torch.Tensor:
        return x.new_empty((cols,), dtype=_F64)

    register_fake("probe::tap_stats", fake, lib=lib)
    _LIBRARIES.append(lib)  # (the registrations live as long as the Library object)
    return torch.ops.probe.tap_stats.default


#: The Library objects that hold the operator's registrations.
_LIBRARIES: list[Any] = []

_TAP_OP = _opaque()


def tap(x: torch.Tensor, cols: int = COLUMNS) -> torch.Tensor:
    """The statistics of ``x`` (:func:`_reduce`), traced into the compiled graph as one
    call of the opaque operator (:func:`_opaque`): the compiled code stores ``x`` (as it
    does for most tensors a recorded call reads or produces) and the operator reads it in
    its own kernels, after the model's."""
    x = _detach(x)
    out: torch.Tensor = _TAP_OP(x, cols) if _TAP_OP is not None else _reduce_row(x, cols)
    return out


class _GradTap(torch.autograd.Function):
    """The identity forward; backward hands the gradient on and gives ``row`` (a row of the
    graph's ``probe_sink`` input) the gradient's statistics and a 1 that says it ran: the
    sink's gradient is the statistics of every tapped gradient, computed by the compiled
    backward graph."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        return _view_as(x, x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return g, tap(g, GRAD_COLUMNS)


def grad_tap(x: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    """``x``, whose gradient's statistics reach ``row``'s gradient (:class:`_GradTap`); a
    function, as FX graphs name their targets."""
    out: torch.Tensor = _GradTap.apply(x, row)
    return out
