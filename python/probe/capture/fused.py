"""All the statistics of a CUDA tensor in one kernel launch (Triton), no host sync.

PyTorch's reductions take one launch each: max and min (``aminmax``), the sum, the norm and
the two NaN/Inf count passes (``isnan`` + ``sum``, ``isinf`` + ``sum``) are seven launches a
floating-point tensor, and on a GPU each costs 10-20 us of the training thread's time (the
dispatcher, a TensorIterator, an output allocation, the launch), whatever the tensor's size.
Capture records a thousand tensors a step of a small transformer, so those launches, not the
GPU, set its cost. One Triton kernel reads the tensor once and writes
``[max, min, sum, norm, NaN count, Inf count]`` as float64 into a slot of a device buffer
(``Slab``) that is copied to the host as a whole at the stats buffer's next flush: one
launch for a tensor of up to ``_PER_PROGRAM`` elements, two past that (partials per block
of the tensor, then their reduction in a fixed order).

Accuracy and determinism: elements are widened to float32 exactly (bfloat16/float16) and
summed in float64 lanes, so the sum and the norm are more accurate than PyTorch's float32
reductions (docs/capture.md, "Statistics on CUDA"); max and min are exact. The lanes, the
blocks and the order of the final reduction depend only on the element count, so the same
tensor gives the same bits in every run. NaN follows PyTorch's rules: a tensor holding NaN
has NaN max, min, mean and norm (max and min set from the count, once the whole tensor is
reduced).

Used for float32/float16/bfloat16 CUDA tensors over dense memory (contiguous, or transposed
and permuted ones, read in memory order: ``stats.dense_span``) when Triton imports and
compiles (it ships with PyTorch's CUDA wheels on Linux); anything else, or
``PROBE_FUSED_STATS=0``, takes the PyTorch reductions (``stats.stat_vector``). A failure to compile or launch is
logged once and switches the fused path off for the process; it never stops capture.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Optional

import torch

log = logging.getLogger("probe")

#: Elements one program reduces (a multiple of ``_BLOCK``): a tensor up to this size is one
#: launch; a larger one is split into programs of this many elements (at most
#: ``_MAX_PROGRAMS``, larger parts beyond that), whose partials a second launch reduces.
_BLOCK = 1024
_PER_PROGRAM = 32 * _BLOCK
_MAX_PROGRAMS = 4096  # a power of two: the final reduction's width

_F64 = torch.float64
_empty = torch.empty


#: The launcher once built (None: not tried yet; False: unavailable in this process).
_launch: Any = None


def _build() -> Optional[Callable[[torch.Tensor, Any, int], None]]:
    """Compile nothing yet (Triton compiles at the first launch per dtype); return the
    launcher, or None where Triton is missing or switched off."""
    if os.environ.get("PROBE_FUSED_STATS", "1") == "0":
        return None
    try:
        import triton  # type: ignore[import-untyped]
        import triton.language as tl  # type: ignore[import-untyped]
    except Exception:  # noqa: BLE001 - no Triton: the PyTorch reductions
        return None

    @triton.jit(do_not_specialize=["n", "per_program", "slot"])  # type: ignore[untyped-decorator]
    def _part(x_ptr, n, per_program, out_ptr, slot, BLOCK: tl.constexpr, ROOT: tl.constexpr):  # type: ignore[no-untyped-def]
        pid = tl.program_id(0).to(tl.int64)
        start = pid * per_program
        end = tl.minimum(start + per_program, n)
        offs = tl.arange(0, BLOCK)
        mx = tl.full([BLOCK], float("-inf"), tl.float32)
        mn = tl.full([BLOCK], float("inf"), tl.float32)
        s = tl.zeros([BLOCK], tl.float64)
        q = tl.zeros([BLOCK], tl.float64)
        nn = tl.zeros([BLOCK], tl.int32)
        ni = tl.zeros([BLOCK], tl.int32)
        for i in range(start, end, BLOCK):
            idx = i + offs
            m = idx < end
            x = tl.load(x_ptr + idx, mask=m, other=0.0).to(tl.float32)
            isn = x != x
            nn += isn.to(tl.int32)
            ni += ((x == float("inf")) | (x == float("-inf"))).to(tl.int32)
            keep = m & (~isn)
            mx = tl.maximum(mx, tl.where(keep, x, float("-inf")))
            mn = tl.minimum(mn, tl.where(keep, x, float("inf")))
            xd = x.to(tl.float64)
            s += xd
            q += xd * xd
        out = out_ptr + (slot + pid) * 6
        mx_all = tl.max(mx, 0).to(tl.float64)
        mn_all = tl.min(mn, 0).to(tl.float64)
        if ROOT:  # PyTorch's rule: a tensor holding NaN has NaN max and min
            has_nan = tl.sum(nn, 0) > 0
            mx_all = tl.where(has_nan, float("nan"), mx_all)
            mn_all = tl.where(has_nan, float("nan"), mn_all)
        tl.store(out, mx_all)
        tl.store(out + 1, mn_all)
        tl.store(out + 2, tl.sum(s, 0))
        q_all = tl.sum(q, 0)
        if ROOT:  # the whole tensor: its norm; else a partial sum of squares
            q_all = tl.sqrt(q_all)
        tl.store(out + 3, q_all)
        tl.store(out + 4, tl.sum(nn, 0).to(tl.float64))
        tl.store(out + 5, tl.sum(ni, 0).to(tl.float64))

    @triton.jit(do_not_specialize=["p", "slot"])  # type: ignore[untyped-decorator]
    def _final(part_ptr, p, out_ptr, slot, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.arange(0, BLOCK)
        m = offs < p
        row = part_ptr + offs * 6
        out_ptr += slot * 6
        # Partials skip NaN in max and min; PyTorch's rule is applied once, here.
        has_nan = tl.sum(tl.load(row + 4, mask=m, other=0.0), 0) > 0
        mx_all = tl.max(tl.load(row, mask=m, other=float("-inf")), 0)
        mn_all = tl.min(tl.load(row + 1, mask=m, other=float("inf")), 0)
        tl.store(out_ptr, tl.where(has_nan, float("nan"), mx_all))
        tl.store(out_ptr + 1, tl.where(has_nan, float("nan"), mn_all))
        tl.store(out_ptr + 2, tl.sum(tl.load(row + 2, mask=m, other=0.0), 0))
        tl.store(out_ptr + 3, tl.sqrt(tl.sum(tl.load(row + 3, mask=m, other=0.0), 0)))
        tl.store(out_ptr + 4, tl.sum(tl.load(row + 4, mask=m, other=0.0), 0))
        tl.store(out_ptr + 5, tl.sum(tl.load(row + 5, mask=m, other=0.0), 0))

    compiled: dict[tuple[Any, ...], Any] = {}
    scratch: dict[tuple[int, int], torch.Tensor] = {}
    raw_stream = torch._C._cuda_getCurrentRawStream
    direct = [True]

    def run(fn: Any, grid: int, key: tuple[Any, ...], args: tuple[Any, ...], *consts: Any) -> None:
        """``fn[(grid,)](*args, *consts)``. Once a variant is compiled it is launched
        through its compiled kernel's runner: Triton's generic path (binding, specialising,
        the cache key) costs ~15 us a launch in Python, the runner a few. ``key`` holds all
        that Triton specialises on here (the tensor's dtype and 16-byte alignment, 32- or
        64-bit element counts, the constants; the output and scratch buffers are always
        aligned), so a runner is only handed arguments it was compiled for."""
        k = compiled.get(key)
        if k is not None and direct[0]:
            try:
                k[(grid, 1, 1)](*args, *consts, stream=raw_stream(key[-1]))
                return
            except Exception as exc:  # noqa: BLE001 - another Triton's runner: the generic path
                log.debug("probe: Triton's compiled-kernel runner refused (%r)", exc)
                direct[0] = False
        names = ("BLOCK", "ROOT")[: len(consts)]
        compiled[key] = fn[(grid,)](*args, **dict(zip(names, consts)))

    def launch(t: torch.Tensor, out: torch.Tensor, slot: int) -> None:
        dev = t.get_device()  # -1: a CPU tensor, under Triton's interpreter (the tests)
        n = t.numel()
        shape = (t.dtype, t.data_ptr() % 16 == 0, n > 0x7FFFFFFF, dev)
        if n <= _PER_PROGRAM:
            run(_part, 1, (0, *shape), (t, n, _PER_PROGRAM, out, slot), _BLOCK, True)
            return
        per = _PER_PROGRAM
        p = -(-n // per)
        if p > _MAX_PROGRAMS:
            per = -(-n // (_MAX_PROGRAMS * _BLOCK)) * _BLOCK
            p = -(-n // per)
        # Partials in a scratch buffer per stream: kernels of one stream run in order, so
        # the next tensor's partials are written after this one's final read them.
        stream = raw_stream(dev) if dev >= 0 else 0
        parts = scratch.get((dev, stream))
        if parts is None:
            parts = scratch[(dev, stream)] = _empty(_MAX_PROGRAMS * 6, dtype=_F64, device=t.device)
        run(_part, p, (1, *shape), (t, n, per, parts, 0), _BLOCK, False)
        # One width for every count of partials: one variant to compile, not one per
        # power of two.
        run(_final, 1, (2, dev), (parts, p, out, slot), _MAX_PROGRAMS)

    return launch


class Slab:
    """Device memory for the statistics of up to ``CAP`` tensors (6 float64 each), written
    by the kernels in place, and copied to the host as a whole once retired.

    The current slab of each device takes every fused tensor's statistics until the stats
    buffer's next flush retires it (``retire_open``): one non-blocking copy into pinned
    memory and an event per slab, instead of an output allocation per tensor and a
    concatenation per batch. A retired slab is never written again; whoever holds one of
    its slots reads it with :meth:`values`. (On the CPU, for tests, without pinning or
    event.)"""

    CAP = 1024
    __slots__ = ("device", "buf", "used", "host", "event", "_values")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.buf: Optional[torch.Tensor] = _empty(self.CAP * 6, dtype=_F64, device=device)
        self.used = 0
        self.host: Optional[torch.Tensor] = None
        self.event: Any = None
        self._values: Optional[list[float]] = None

    def retire(self) -> None:
        """Start the copy of the slots used to the host; the device memory goes back to
        the allocator (later kernels of the stream run after the copy)."""
        buf, self.buf = self.buf, None
        if buf is None:
            return
        used = buf[: self.used * 6]
        if self.device.type == "cuda":
            self.host = _empty(used.shape, dtype=_F64, pin_memory=True)
            self.host.copy_(used, non_blocking=True)
            self.event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self.event.record()
        else:
            self.host = used.clone()

    def landed(self) -> bool:
        """Whether the copy has reached the host (asks, never waits)."""
        return self.event is None or bool(self.event.query())

    def values(self) -> list[float]:
        """Every used slot's six numbers, waiting for the copy if it has not landed."""
        if self._values is None:
            if self.host is None:
                retire_open()  # still open (not reached through a flushed batch)
            if self.event is not None:
                self.event.synchronize()
            assert self.host is not None
            self._values = self.host.tolist()
        return self._values


#: Per device index: the slab taking statistics now. Slabs filled up before a flush wait
#: in ``_full`` to be retired with it.
_open: dict[int, Slab] = {}
_full: list[Slab] = []


def slot(device: torch.device) -> tuple[Slab, int]:
    """A free slot of ``device``'s current slab (a new slab when it is full)."""
    idx = device.index if device.index is not None else -1
    slab = _open.get(idx)
    if slab is None or slab.used == Slab.CAP:
        if slab is not None:
            _full.append(slab)
        slab = _open[idx] = Slab(device)
    i = slab.used
    slab.used = i + 1
    return slab, i


def retire_open() -> None:
    """Retire every slab written since the last call (the stats buffer's flush): each
    slot taken before now gets its numbers copied to the host."""
    for slab in _full:
        slab.retire()
    _full.clear()
    for slab in _open.values():
        slab.retire()
    _open.clear()


#: What a fused tensor's statistics are until read: its slab and slot.
Ref = tuple[Slab, int]


def fused_stats(t: torch.Tensor) -> Optional[Ref]:
    """Launch the statistics ``[max, min, sum, norm, nan, inf]`` of the contiguous
    float32/16/bfloat16 CUDA tensor ``t`` (or the span of a transposed one) into a slot of
    the device's slab; None where the fused path is unavailable (the caller then uses
    PyTorch's reductions)."""
    global _launch
    if _launch is None:
        _launch = _build() or False
    if _launch is False or t.get_device() != torch.cuda.current_device():
        return None  # kernels are loaded for the current GPU: PyTorch's reductions here
    slab, i = slot(t.device)
    try:
        _launch(t, slab.buf, i)
    except Exception as exc:  # noqa: BLE001 - a compile or launch failure: fall back for good
        log.warning("probe: fused CUDA statistics unavailable (%r); using PyTorch reductions", exc)
        slab.used -= 1
        _launch = False
        return None
    return slab, i
