"""Tensor statistics, checksums and dtype names.

Statistics are computed on the tensor's own device into a small vector so that all the
numbers of one op can be concatenated and brought to the host in a single transfer: one
device sync per op instead of one per number is what keeps capture cheap on accelerators.
"""

from __future__ import annotations

import ctypes
import math
import sys
import zlib
from typing import TYPE_CHECKING, Any, Optional, Union

import torch

from . import native
from .fused import fused_stats

if TYPE_CHECKING:
    from typing_extensions import TypedDict

    from .fused import Ref

    Number = Union[float, str, None]  # non-finite values are strings in JSON

    class Stats(TypedDict):
        """A tensor's statistics as written (docs/format.md)."""

        max: Number
        min: Number
        mean: Number
        norm: Number
        nan: int
        inf: int


#: Statistics of one tensor, ``[max, min, sum, norm(, nan, inf)]``: numbers read on the
#: host (CPU tensors; ``Recorder.capture`` makes them the record's finished ``stats``
#: dict), one float64 vector still on an accelerator, or the slab slot that the fused CUDA
#: kernel writes them to (:func:`stat_vector`).
StatVector = Union[list[Any], dict[str, Any], torch.Tensor, "Ref", None]

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float64: "float64",
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
}

# dtypes safetensors can store and compare can read (docs/format.md).
STORABLE = frozenset(DTYPE_NAMES)

# The originals, bound at import (before any wrapper is installed): the agent's own calls
# must not pay for, or be seen by, the API wrappers that are installed while it captures.
_aminmax = torch.aminmax
_amax = torch.amax
_amin = torch.amin
_sum = torch.sum
_vector_norm = torch.linalg.vector_norm
_isnan = torch.isnan
_isinf = torch.isinf
_stack = torch.stack
_to = torch.Tensor.to
_float = torch.Tensor.float
_detach = torch.Tensor.detach
_clone = torch.Tensor.clone
_contiguous = torch.Tensor.contiguous
_view = torch.Tensor.view
_reshape = torch.reshape
_narrow = torch.narrow
_hypot = torch.hypot
_CONTIGUOUS = torch.contiguous_format
_F32 = torch.float32
_F64 = torch.float64
_F16 = torch.float16
_BF16 = torch.bfloat16
_BOOL = torch.bool
#: The tensor types whose own memory is read (the native kernel; the inline tensor writer):
#: a subclass (``DTensor``, a fake or wrapper tensor) may have no data of its own, and keeps
#: PyTorch's reductions and a host copy.
PLAIN = (torch.Tensor, torch.nn.Parameter)


#: A float32 CPU norm of more elements than this is taken in parts (``_norm``)...
_NORM_WHOLE = 1 << 16
#: ...of this many elements each (a contiguous tensor's rows).
_NORM_PART = 4096


def _norm(tf: torch.Tensor, n: int) -> torch.Tensor:
    """The L2 norm of the CPU tensor ``tf`` (float32 or float64, ``n`` elements), as
    ``vector_norm`` but accurate at any size.

    PyTorch's CPU kernel accumulates a whole float32 tensor in float32 lanes, so its relative
    error grows faster than the size: 2e-7 at 65,536 elements, 1e-5 at 1M, 1e-4 at 4M, 8e-4
    at 16M. That is past float32's warning and error tolerances (1e-5, 1e-4): a CPU
    benchmark's norm could fail against an accelerator's for the same values. Past 65,536
    elements the norm is taken in parts -- rows of 4,096 elements of a contiguous tensor, or
    a strided tensor's lines along its unit-stride dimension -- whose norms are combined in
    float64: ~1e-8 at any size, as fast for a contiguous tensor. float64 accumulates in
    float64 and is left as it is; accelerator kernels reduce in a tree, and their tensors
    never come here.
    """
    norm: torch.Tensor
    if n <= _NORM_WHOLE or tf.dtype is not _F32:
        norm = _vector_norm(tf)
        return norm
    if not tf.is_contiguous():
        stride, shape = tf.stride(), tf.shape
        # The dimension laid out contiguously (an expanded tensor's others have stride 0).
        d = next((i for i in range(tf.dim()) if stride[i] == 1 and shape[i] > 1), -1)
        if d >= 0 and 64 <= shape[d] <= _NORM_WHOLE:
            # Lines along the unit-stride dimension: read in memory order, no copy of tf.
            norm = _vector_norm(_to(_vector_norm(tf, dim=d), _F64))
            return norm
        tf = _contiguous(tf)
    flat = _reshape(tf, (-1,))
    rows = n // _NORM_PART
    body = _view(_narrow(flat, 0, 0, rows * _NORM_PART), (rows, _NORM_PART))
    norm = _vector_norm(_to(_vector_norm(body, dim=1), _F64))
    rest = n - rows * _NORM_PART
    if rest:
        norm = _hypot(norm, _to(_vector_norm(_narrow(flat, 0, rows * _NORM_PART, rest)), _F64))
    return norm


_as_strided = torch.as_strided


def memory_runs(t: torch.Tensor, permuted: bool = True) -> list[tuple[int, int]]:
    """The memory ``t`` reads, as (stride, length) runs: its (stride, size) pairs without
    dimensions of size 1 (they read nothing more), a dimension merged into the next when
    the two read one run. ``permuted``: the pairs sorted first (a transposed or permuted
    tensor reads the same locations in another order); else innermost first, in the order
    C-contiguous bytes are read. Equal runs at equal offsets of one storage read the same
    elements (in the same order when not ``permuted``)."""
    n = t.numel()
    if n > 1 and t.is_contiguous():
        # What the loop below gives a contiguous tensor, in a tenth of its ~2 us (most
        # captured tensors are contiguous; the layout key asks for every large one).
        return [(1, n)]
    dims = [(st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1]
    if permuted:
        dims.sort()
    else:
        dims.reverse()
    runs: list[tuple[int, int]] = []
    for st, sz in dims:
        if runs and runs[-1][0] * runs[-1][1] == st:
            runs[-1] = (runs[-1][0], runs[-1][1] * sz)
        else:
            runs.append((st, sz))
    return runs


def dense_span(t: torch.Tensor) -> Optional[torch.Tensor]:
    """The memory of ``t`` as a contiguous 1-D view when ``t`` covers it exactly once -- a
    transposed or permuted layout of dense memory (attention heads, channels-last) -- else
    None (slices with gaps, expanded dimensions). Statistics do not depend on the order of
    the elements, so such a tensor is reduced in its memory order, like a contiguous one."""
    runs = memory_runs(t)
    if runs and runs != [(1, t.numel())]:
        return None
    return _as_strided(t, (t.numel(),), (1,))


#: ``c_int64`` arrays by length, for a view's sizes and strides.
_DIMS = [ctypes.c_int64 * n for n in range(9)]
#: The kernel's arguments for a view's (shape, strides): its dimension count and its sizes
#: and strides in memory order, as ``c_int64`` arrays. Made once per layout (~8 us: the
#: sort and two ctypes arrays), as the same layouts come back every step; bounded.
_LAYOUTS: dict[tuple[Any, ...], tuple[int, Any, Any]] = {}
_LAYOUTS_MAX = 4096


def _layout_args(size: Any, stride: tuple[int, ...]) -> tuple[int, Any, Any]:
    order = sorted(range(len(stride)), key=stride.__getitem__, reverse=True)
    n = len(order)
    dims = _DIMS[n] if n < len(_DIMS) else ctypes.c_int64 * n
    if len(_LAYOUTS) >= _LAYOUTS_MAX:
        _LAYOUTS.clear()
    got = _LAYOUTS[(size, stride)] = (
        n,
        dims(*[size[d] for d in order]),
        dims(*[stride[d] for d in order]),
    )
    return got


def read_strided(t: torch.Tensor, out: Any) -> int:
    """Max, min, sum and norm of ``t`` (float32 or bfloat16, CPU, a tensor that is not
    contiguous: permuted, or with gaps in its memory) into ``out`` (a ``_RESULT`` or an
    address) by the native kernel, which reads it in place in memory order (its dimensions
    by decreasing stride; dense memory as one run): two views of the same elements in
    other orders (a slice, and its transpose) read the same sequence, so give the same
    statistics to the last bit, as PyTorch's reductions, which also walk memory order.
    1 when done; 0 when not (no kernel, NaN/Inf: the caller then reduces)."""
    kernel = STRIDED.get(t.dtype) if STRIDED is not None else None
    if kernel is None:
        return 0
    size, stride = t.shape, t.stride()
    args = _LAYOUTS.get((size, stride))
    if args is None:
        args = _layout_args(size, stride)
    return kernel(t.data_ptr(), args[0], args[1], args[2], out)


def dtype_name(dtype: torch.dtype) -> str:
    """Name a dtype as docs/format.md does (``float32``), falling back to torch's name."""
    name = DTYPE_NAMES.get(dtype)
    if name is None:
        name = str(dtype).replace("torch.", "")
    return name


#: Whether statistics of CPU tensors are read on the host at once (the fast path). Tests
#: turn it off to run the accelerator path (0-d tensors stacked and read per batch) on CPU.
READ_ON_CPU = True

#: The native one-pass kernels for CPU float32/bfloat16 tensors by dtype (``native.py``),
#: once :func:`use_native` found them; None: PyTorch's reductions.
NATIVE: Optional[dict[torch.dtype, native.Kernel]] = None
#: The same kernels for views with gaps in their memory, read in place (:func:`read_strided`;
#: a 16K-element slice of a convolution's channels: ~10 us, against ~16 us for a copy
#: and a read, and ~500 us for PyTorch's reductions on the view).
STRIDED: Optional[dict[torch.dtype, native.StridedKernel]] = None
_native_tried = False
_RESULT = ctypes.c_double * 4


def use_native() -> None:
    """Load the native kernels the first time (``Debugger.start()``); later calls keep
    what the first found, so a test can set :data:`NATIVE` to None for PyTorch's path."""
    global NATIVE, STRIDED, _native_tried
    if not _native_tried:
        _native_tried = True
        found = native.load()
        if found is not None:
            NATIVE, STRIDED = found.plain, found.strided


def stat_vector(t: torch.Tensor) -> StatVector:
    """Return ``[max, min, sum, norm(, nan, inf)]``: Python numbers for a CPU tensor, a
    float64 vector on ``t``'s device for an accelerator's, or for a floating-point CUDA
    tensor over dense memory (contiguous, or transposed/permuted: ``dense_span``) the slab
    slot its fused kernel writes (``fused.py``). A float32/bfloat16 CPU tensor over dense
    memory is read once by the ``probe`` binary's kernel when it loaded (``native.py``).

    Otherwise three reductions per tensor (``aminmax``, ``sum``, the norm -- ``_norm`` on CPU;
    ``var_mean`` would save one but is an order of magnitude slower on CPU). NaN/Inf counts are taken now
    whenever they can be non-zero, so the tensor itself is never read again. On CPU the
    values are read at once: a 0-d CPU read costs ~0.3 us and syncs nothing, less than
    stacking the 0-d tensors with the others of their batch (~0.4 us each) and reading them
    back; and a finite sum -- which proves there is no NaN/Inf -- skips the two count passes,
    which cost several times the three reductions. On an accelerator nothing is read here
    (no host sync): floating-point tensors get their two counts on the device, the numbers
    are stacked into one float64 vector, and the caller hands it to
    :class:`~probe.capture.buffer.StatsBuffer`, which concatenates those of many ops and
    reads them in one transfer. So a
    tensor about to change in place needs nothing more than any other. Returns None for
    empty tensors and dtypes without meaningful statistics. Run with grad mode off.
    """
    dt = t.dtype
    n = t.numel()
    if dt not in STORABLE or n == 0:
        return None
    if t.is_cpu:
        if READ_ON_CPU:
            if n == 1:
                # A loss, a step counter, a scale: its one value is every statistic,
                # exactly as the reductions give them, for a read instead of three
                # reductions (~1 us, not ~10). (A sum starts from +0.0: -0.0 sums to 0.0.)
                v = float(t.item())
                if v - v == 0.0:
                    return [v, v, v + 0.0, abs(v)]
                return [v, v, v, abs(v), 1.0 if v != v else 0.0, 0.0 if v != v else 1.0]
            if NATIVE is not None and (dt is _F32 or dt is _BF16) and type(t) in PLAIN:
                # One pass over the memory instead of three reductions (native.py); a
                # tensor with NaN/Inf is refused and takes the reductions below, which
                # count them.
                res = _RESULT()
                if t.is_contiguous():
                    if NATIVE[dt](t.data_ptr(), n, res):
                        return res[:]
                elif read_strided(t, res):  # permuted, or a slice with gaps: in place
                    return res[:]
    elif t.is_cuda and (dt is _F32 or dt is _BF16 or dt is _F16):
        flat = t if t.is_contiguous() else dense_span(t)
        if flat is not None:
            ref = fused_stats(flat)  # one launch instead of seven (fused.py)
            if ref is not None:
                return ref
    if dt is _F32 or dt is _F64:
        tf = t
    elif dt is _F16 or dt is _BF16:
        tf = _float(t)  # low-precision accumulators would distort mean and norm
    else:
        # bool: max = any, min = all (as 1/0); integers: exact in float64 up to 2**53.
        tf = _to(t, _F32 if dt is _BOOL else _F64)
    if tf.is_contiguous():
        mn, mx = _aminmax(tf)
    else:
        # aminmax walks a non-contiguous tensor element by element: 4-30x slower than on
        # the same data contiguous (3.8 ms for a 1M-element channels-last activation, 0.6 ms
        # for a transposed attention tensor). amax and amin take the strided fast path,
        # exact like aminmax (only a tie between -0.0 and 0.0 may pick the other zero).
        mx, mn = _amax(tf), _amin(tf)
    total = _sum(tf)
    if t.is_cpu:
        # A finite sum means no NaN/Inf: 4 values, fill_stats reads zero counts. Integers
        # and bools (converted, so tf is not t) are always finite.
        s = total.item()
        vec = [mx, mn, total, _norm(tf, n)]
        if not math.isfinite(s) and (tf is t or dt is _F16 or dt is _BF16):
            vec += (_sum(_isnan(t), dtype=_F64), _sum(_isinf(t), dtype=_F64))
        if not READ_ON_CPU:
            return _to(_stack(vec), _F64)
        host = [mx.item(), mn.item(), s, *[v.item() for v in vec[3:]]]
        if tf.dtype is _F32 and not (s - s == 0.0 and host[3] - host[3] == 0.0):
            if len(host) == 4 or host[4] == host[5] == 0.0:
                # Finite values whose float32 sum or sum of squares overflowed (|x| past
                # ~1.8e19 is enough for the norm): the record's numbers are float64, so they
                # are taken in float64 instead of written as "inf" for a finite tensor.
                x = _to(tf, _F64)
                return [host[0], host[1], _sum(x).item(), _vector_norm(x).item()]
        return host
    if t.is_floating_point():
        parts = [mx, mn, total, _vector_norm(tf), _sum(_isnan(t), dtype=_F64)]
        parts.append(_sum(_isinf(t), dtype=_F64))
    else:  # integers and bools are always finite
        parts = [mx, mn, total, _vector_norm(tf)]
    out: torch.Tensor = _stack(parts)  # float64 where counts are (exact past 2**24)
    return out if out.dtype is _F64 else _to(out, _F64)


def _num(v: float) -> Any:
    """JSON has no non-finite numbers: docs/format.md spells them as strings."""
    if v - v == 0.0:  # finite (inf - inf and nan - nan are nan)
        return v
    if v != v:
        return "nan"
    return "inf" if v > 0 else "-inf"


def nested_shape(t: torch.Tensor) -> tuple[int, ...]:
    """A nested tensor's shape for its record: it has no sizes (strided layout) or a
    symbolic ragged one (jagged), and recording it as-is raised, which switched capture off
    (the eval path of ``nn.TransformerEncoder`` with a padding mask makes them; its
    statistics are those of its elements). Strided layout: the padded form's shape, each
    dimension its largest. Jagged: the ragged dimension is the total over the components
    (the length of the packed values), the others as they are."""
    nt: Any = t
    if t.layout is _STRIDED:  # one row of sizes per component
        rows = nt._nested_tensor_size()
        tail = rows.amax(0).tolist() if rows.numel() else [0] * max(t.dim() - 1, 0)
        return (int(t.size(0)), *(int(v) for v in tail))
    ragged = int(nt.values().shape[0])
    return tuple(s if type(s) is int else ragged for s in t.shape)


def dtensor_local(t: torch.Tensor) -> Optional[tuple[torch.Tensor, dict[str, Any]]]:
    """A ``DTensor``'s local shard and what places it, or None for any other tensor.

    A DTensor (tensor parallelism, FSDP2's parameters and gradients) reports its global
    shape, but reading it in PyTorch's reductions gave the local shard's max, min and norm
    and the local sum over the global count for the mean: statistics of no tensor at all.
    Reducing it globally would run collectives from inside the agent, which hang when the
    ranks do not capture alike (a rank filter, an op list). So a record holds the shard this
    rank computed with, and ``dtensor`` says how it sits in the whole: the global shape, the
    placement on each mesh dimension (``Shard(dim=0)``, ``Replicate()``, ``Partial(sum)``:
    a partial shard is this rank's addend), and the mesh's ranks."""
    mod = sys.modules.get("torch.distributed.tensor")  # no DTensor exists before its import
    cls = getattr(mod, "DTensor", None) if mod is not None else None
    if cls is None or not isinstance(t, cls):
        return None
    d: Any = t
    mesh = d.device_mesh
    meta = {
        "shape": [int(s) for s in t.shape],
        "placements": [str(p) for p in d.placements],
        "mesh": [int(r) for r in mesh.mesh.flatten().tolist()],
        "mesh_shape": [int(s) for s in mesh.mesh.shape],
    }
    local: torch.Tensor = d._local_tensor
    return local, meta


def null_stats() -> Stats:
    """Stats of an empty or unsupported tensor."""
    return {"max": None, "min": None, "mean": None, "norm": None, "nan": 0, "inf": 0}


def finish_stats(values: list[float], numel: int, tensor: Optional[torch.Tensor]) -> Stats:
    """Turn a host-side stat vector ``[max, min, sum, norm(, nan, inf)]`` into ``stats``
    (more values after the counts are ignored: a compiled graph's gradient row ends with
    the 1 that says it came).

    With 4 values, NaN/Inf counts are zero when every value is finite (a NaN or Inf element
    makes max, min or the sum non-finite), and the common case -- four finite numbers -- is
    built in one expression; otherwise they are counted now from ``tensor`` (``stat_vector``
    takes them eagerly, so this is only a fallback for other callers).
    """
    n = len(values)
    if n == 4 or (n >= 6 and values[4] == 0.0 and values[5] == 0.0):
        mx, mn, total, norm = values[0], values[1], values[2], values[3]
        if mx - mx == 0.0 and mn - mn == 0.0 and total - total == 0.0 and norm - norm == 0.0:
            return {"max": mx, "min": mn, "mean": total / numel, "norm": norm, "nan": 0, "inf": 0}
    out: Stats = {"max": None, "min": None, "mean": None, "norm": None, "nan": 0, "inf": 0}
    fill_stats(out, values, 0, n, numel, tensor)
    return out


def fill_stats(
    out: Any,
    flat: list[float],
    pos: int,
    n: int,
    numel: int,
    tensor: Optional[torch.Tensor] = None,
) -> None:
    """Fill the (empty, or null-valued) stats dict ``out`` from ``flat[pos:pos + n]``, in the
    dump's key order: what :func:`finish_stats` returns, without slicing a list per tensor."""
    mx, mn, total, norm = flat[pos], flat[pos + 1], flat[pos + 2], flat[pos + 3]
    if n >= 6:
        n_nan, n_inf = int(flat[pos + 4]), int(flat[pos + 5])
    elif mx - mx == 0.0 and mn - mn == 0.0 and total - total == 0.0:
        n_nan = n_inf = 0
    elif tensor is not None and tensor.is_floating_point():
        with torch.no_grad():
            n_nan = int(torch.isnan(tensor).sum().item())
            n_inf = int(torch.isinf(tensor).sum().item())
    else:
        n_nan = n_inf = 0
    mean = total / numel
    out["max"] = mx if mx - mx == 0.0 else _num(mx)
    out["min"] = mn if mn - mn == 0.0 else _num(mn)
    out["mean"] = mean if mean - mean == 0.0 else _num(mean)
    out["norm"] = norm if norm - norm == 0.0 else _num(norm)
    out["nan"] = n_nan
    out["inf"] = n_inf


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU copy that later in-place ops on ``t`` cannot change.

    Exactly one copy whatever the strides (``to``/``clone`` with a contiguous memory
    format copy straight into a contiguous buffer; ``.to("cpu").contiguous()`` copied a
    strided device tensor twice), through the original methods so the API wrappers
    installed during capture are not paid for.
    """
    d = _detach(t)
    if d.is_cpu:
        return _clone(d, memory_format=_CONTIGUOUS)
    return _to(d, "cpu", memory_format=_CONTIGUOUS)


def checksum(t: torch.Tensor) -> str:
    """``crc32_of`` the tensor's current bytes. A CPU tensor is read where it lies: the
    checksum is taken at once, so unlike a stored tensor it needs no protective copy (the
    copy was most of checksum mode's cost on CPU)."""
    d = t.detach()
    return crc32_of(d if d.is_cpu else d.to("cpu"))


def checksum_later(t: torch.Tensor, copy: Any) -> Union[str, torch.Tensor]:
    """The checksum of ``t`` now on the CPU; for an accelerator's tensor (and on the CPU
    with ``READ_ON_CPU`` off, for tests) the host copy it is taken of, made by ``copy`` (on
    CUDA non-blocking, into pinned memory, with an event): :func:`crc32_of_copy` reads it
    once the stats buffer's batch has landed, so checksum mode makes no host sync per
    tensor."""
    if t.is_cpu and READ_ON_CPU:
        return checksum(t)
    return copy(t)  # type: ignore[no-any-return]


def wait_for_copy(host: torch.Tensor) -> None:
    """Wait until a host copy made without blocking (``writer.HostPool.copy``, on CUDA) has
    landed: the event it carries. Copies made otherwise are complete already."""
    ready = getattr(host, "_probe_ready", None)
    if ready is not None:
        ready.synchronize()


def crc32_of_copy(host: torch.Tensor) -> str:
    """The checksum of a copy made by :func:`checksum_later`, once (a record that reuses
    another's pending checksum holds the same copy)."""
    crc: Optional[str] = getattr(host, "_probe_crc", None)
    if crc is None:
        wait_for_copy(host)  # landed already when its batch has: no wait
        crc = crc32_of(host)
        host._probe_crc = crc  # type: ignore[attr-defined]
    return crc


def crc32_of(host: torch.Tensor) -> str:
    """``crc32:xxxxxxxx`` of the raw little-endian C-contiguous bytes of a CPU tensor."""
    c = _contiguous(host)  # (held here while its bytes are read)
    return "crc32:%08x" % (zlib.crc32(raw_bytes(c)) & 0xFFFFFFFF)


def raw_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, read where they lie, for use before ``t`` can
    change or go. Not through ``numpy()``: exporting a tensor to numpy makes its storage
    unresizable for good, and FSDP, which resizes the storage of gathered parameters,
    then failed on a CPU run captured in tensor or checksum mode."""
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B")


_isfinite = torch.isfinite
_all = torch.Tensor.all
_STRIDED = torch.strided
_LOW = (_F16, _BF16)
_FLOATS = frozenset((_F64, _F32, *_LOW))


def any_nonfinite(tensors: list[torch.Tensor]) -> bool:
    """Whether any floating-point tensor of ``tensors`` holds NaN or Inf (overflow mode).

    One reduction per tensor and one host read: a sum is finite exactly when no element is
    NaN/Inf, except when finite values sum past the dtype's range, so only a non-finite sum
    (rare) pays for the exact ``isfinite`` test. Half-precision sums are taken in float32,
    which also keeps them from overflowing.
    """
    tensors = [t.values() if t.is_nested else t for t in tensors]  # (their elements)
    tensors = [t for t in tensors if t.dtype in _FLOATS and t.layout is _STRIDED and not t.is_meta]
    if not tensors:
        return False
    prev = torch.is_grad_enabled()
    if prev:
        torch._C._set_grad_enabled(False)
    try:
        parts = [_sum(t, dtype=_F32) if t.dtype in _LOW else _sum(t) for t in tensors]
        total = parts[0] if len(parts) == 1 else _sum(_stack(parts))
        if math.isfinite(total.item()):
            return False
        return not all(bool(_all(_isfinite(t))) for t in tensors)
    finally:
        if prev:
            torch._C._set_grad_enabled(True)


def nonfinite_result(out: Any) -> bool:
    """Whether the result of a call (a tensor, or tensors nested in tuples, lists and
    dicts) holds NaN or Inf. A single float32 tensor outside autograd, the common case,
    is checked here without building a list or switching grad mode."""
    if isinstance(out, torch.Tensor):
        if (
            out.dtype is _F32
            and out.layout is _STRIDED
            and not out.requires_grad
            and not out.is_meta
            and not out.is_nested
        ):
            if math.isfinite(_sum(out).item()):
                return False
        return any_nonfinite([out])
    tensors: list[torch.Tensor] = []
    _collect(out, tensors)
    return any_nonfinite(tensors) if tensors else False


def _collect(obj: Any, into: list[torch.Tensor]) -> None:
    if isinstance(obj, torch.Tensor):
        into.append(obj)
        return
    if isinstance(obj, (tuple, list)):  # named tuples, torch.return_types included
        for v in obj:
            _collect(v, into)
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect(v, into)
