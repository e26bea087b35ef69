"""Writing a dump: the manifest, the append-only op log and the background shard writer.

The op log is appended one line per op and flushed per step, never rewritten (msprobe
rewrites its whole dump.json on every flush, which is quadratic and loses everything on a
crash). Tensors go through a bounded queue to one writer thread, so the training thread only
pays for the host copy; the bound keeps memory in check when the disk is slower than training,
and the thread streams each tensor into its shard file as it arrives. On a CPU run with no
core to spare for that thread, the training thread writes each tensor itself, from the
tensor's own memory (``TensorWriter``, ``inline``).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import queue
import sys
import threading
import time
from typing import Any, Callable, Optional, Protocol

import torch

from .._runtime import model_device, world_size
from .._version import __version__
from ..config import CaptureConfig
from .stats import PLAIN, raw_bytes, wait_for_copy
from .threadstate import tls

log = logging.getLogger("probe")

# safetensors dtype codes, and the rank of each in the safetensors library's dtype order:
# the library lays a file out by descending rank, then by name, which puts wider elements
# first so every tensor starts aligned to its element size. Writing the same layout keeps
# our shards indistinguishable from the library's (and mmap-friendly for readers).
_ST_DTYPES: dict[torch.dtype, tuple[str, int]] = {
    torch.bool: ("BOOL", 0),
    torch.uint8: ("U8", 1),
    torch.int8: ("I8", 2),
    torch.int16: ("I16", 3),
    torch.float16: ("F16", 4),
    torch.bfloat16: ("BF16", 5),
    torch.int32: ("I32", 6),
    torch.float32: ("F32", 7),
    torch.float64: ("F64", 8),
    torch.int64: ("I64", 9),
}

# Bound at import, before the API wrappers exist: the writer's own tensor calls must not
# pay for (or be seen by) the wrappers installed while a step is captured.
_view = torch.Tensor.view
_detach = torch.Tensor.detach
_copy = torch.Tensor.copy_
_empty = torch.empty
_zero = torch.Tensor.zero_
#: Host copies up to this size are queued in batches, not one by one (DumpFiles.push)...
_SMALL = 64 * 1024
#: ...of this many copies or bytes, whichever comes first, checked at the end of each op.
_OUTBOX_ITEMS = 64
_OUTBOX_BYTES = 1 << 20
try:  # a declared dependency (pyproject.toml); json below if an environment lacks it
    import orjson

    _orjson_dumps: Optional[Callable[..., bytes]] = orjson.dumps
    _ORJSON_OPTS = orjson.OPT_APPEND_NEWLINE
except ImportError:  # pragma: no cover - the fallback is tested by setting _orjson_dumps to None
    _orjson_dumps = None
    _ORJSON_OPTS = 0
# The standard library's encoder, made once (json.dumps with options builds one per call),
# without the circular-reference check: records are trees the agent builds.
_json_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False, check_circular=False).encode


def _encode_record(record: dict[str, Any]) -> bytes:
    """One ``ops.jsonl`` line, newline included.

    orjson encodes an op record in ~2 us against ~20 us for the json module, which was the
    largest share of statistics capture after the reductions (docs/capture.md, "Overhead").
    The two write numbers differently (``1e-05`` / ``0.00001``) but every float round-trips
    exactly either way, so readers see the same values. What orjson refuses (an integer
    argument beyond 64 bits) falls back to json for that record.
    """
    if _orjson_dumps is not None:
        try:
            return _orjson_dumps(record, option=_ORJSON_OPTS)
        except TypeError:  # orjson.JSONEncodeError is a TypeError
            pass
    return (_json_encode(record) + "\n").encode("utf-8")


def write_safetensors(path: str, tensors: dict[str, torch.Tensor]) -> None:
    """Write ``tensors`` (contiguous CPU tensors) as one safetensors file, temp + rename.

    ``safetensors.torch.save_file`` does several Python passes per tensor (shared-storage
    detection, dtype checks, a ``bytes`` copy of every tensor) while holding the GIL, on a
    thread that competes with training for it; this writes the same file with one small
    header computation and one buffered write per tensor, and the writes release the GIL.
    Layout as the library's: 8-byte little-endian header length, compact JSON header of
    name -> {dtype, shape, data_offsets} in data order, padded with spaces to a multiple
    of 8 bytes, then the data contiguous in offset order.
    """
    if sys.byteorder != "little":  # the format is little-endian; let the library swap
        from safetensors.torch import save_file

        tmp = path + ".tmp"
        save_file(tensors, tmp)
        os.replace(tmp, path)
        return
    order = sorted(tensors.items(), key=lambda kv: (-_ST_DTYPES[kv[1].dtype][1], kv[0]))
    header: dict[str, Any] = {}
    datas: list[Any] = []
    offset = 0
    for name, t in order:
        raw = raw_bytes(t)
        end = offset + raw.nbytes
        header[name] = {
            "dtype": _ST_DTYPES[t.dtype][0],
            "shape": list(t.shape),
            "data_offsets": [offset, end],
        }
        datas.append(raw)
        offset = end
    head = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    head += b" " * (-len(head) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb", buffering=1 << 20) as fh:
        fh.write(len(head).to_bytes(8, "little"))
        fh.write(head)
        for raw in datas:
            if raw.nbytes:
                fh.write(raw)
    os.replace(tmp, path)


def atomic_write_text(path: str, text: str) -> None:
    """Write a small file via temp + rename so readers never see half of it."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


class _ShardStream:
    """One shard being written as its tensors arrive, so closing it costs only the header.

    The data goes to ``<path>.tmp`` in arrival order, after room left for the header; at
    close the header is written into that room, padded with spaces (the safetensors format
    allows trailing whitespace in the header), and the file renamed. Offsets are contiguous
    in arrival order, which the format requires and readers check; the library's own
    layout (sorted by dtype then name) cannot be streamed, as it needs every tensor first.
    When the header outgrows the room, or a key repeats, the shard is rewritten instead
    (``write_safetensors`` from the temp file), which is correct but costs a copy.
    """

    def __init__(self, path: str, reserve: int) -> None:
        self.path = path
        self.tmp = path + ".stream.tmp"  # not write_safetensors' temp name (the rewrite)
        self.reserve = reserve  # bytes before the data: 8-byte length + padded header
        self.header: dict[str, Any] = {}
        self.offset = 0
        self.duplicate = False
        self.fh = open(self.tmp, "wb", buffering=1 << 20)
        # A provisional header first (no tensors, padded to the reserved room), so that a
        # shard a crash leaves as ``.stream.tmp`` still says where its data starts: the
        # op records' ``data_offsets`` then locate each tensor (docs/format.md, "After a
        # crash"). The file is written strictly in order, so any data on disk comes after it.
        head = b'{"__metadata__":{"probe":"streaming"}}'
        if reserve >= 8 + len(head):
            self.fh.write((reserve - 8).to_bytes(8, "little"))
            self.fh.write(head + b" " * (reserve - 8 - len(head)))
        else:  # too small to say anything (never, with the writer's reserves): length 0
            self.fh.write(bytes(reserve))

    def add(self, key: str, tensor: torch.Tensor) -> None:
        raw = raw_bytes(tensor)
        end = self.offset + raw.nbytes
        if key in self.header:
            # The earlier one is set apart for the rewrite to drop: the last one wins.
            self.duplicate = True
            self.header["\0dup%d" % end] = self.header.pop(key)
        self.header[key] = {
            "dtype": _ST_DTYPES[tensor.dtype][0],
            "shape": list(tensor.shape),
            "data_offsets": [self.offset, end],
        }
        if raw.nbytes:
            self.fh.write(raw)
        self.offset = end

    def close(self) -> int:
        """Finish the file (temp + rename); returns the header room the shard needed."""
        head = json.dumps(self.header, separators=(",", ":"), ensure_ascii=False).encode()
        need = 8 + len(head) + (-len(head) % 8)
        if need <= self.reserve and not self.duplicate and sys.byteorder == "little":
            self.fh.seek(0)
            self.fh.write((self.reserve - 8).to_bytes(8, "little"))
            self.fh.write(head)
            self.fh.write(b" " * (self.reserve - 8 - len(head)))
            self.fh.close()
            os.replace(self.tmp, self.path)
            return need
        self.fh.close()
        self._rewrite()
        return need

    def _rewrite(self) -> None:
        """Write the shard again from the temp file's data, with a header that fits."""
        import numpy as np

        data = torch.from_numpy(np.fromfile(self.tmp, dtype=np.uint8, offset=self.reserve))
        rev = {code: dt for dt, (code, _) in _ST_DTYPES.items()}
        tensors: dict[str, torch.Tensor] = {}
        for key, ent in self.header.items():
            if not key.startswith("\0dup"):
                lo, hi = ent["data_offsets"]
                part = _view(data[lo:hi].clone(), rev[ent["dtype"]])
                tensors[key] = part.reshape(ent["shape"])
        write_safetensors(self.path, tensors)
        os.remove(self.tmp)

    def abandon(self) -> None:
        """Drop a shard that cannot be finished (after an error)."""
        try:
            self.fh.close()
        finally:
            if os.path.exists(self.tmp):
                os.remove(self.tmp)


class HostPool:
    """Host buffers for tensor mode's copies, handed back by the writer thread once written.

    A fresh host copy of a large tensor costs an order of magnitude more than the copy itself:
    its pages are new, so each one faults and is zeroed by the kernel (a 2 MB tensor: ~0.7 ms
    fresh, ~0.05 ms into a buffer that was used before). A training step dumps the same shapes
    every step, so buffers of the same byte size come back and are reused. Free buffers are
    bounded by ``cap`` bytes (more are dropped, to the allocator); buffers for CUDA tensors
    are pinned, which speeds the device-to-host copy and lets it run without a host sync.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._free: dict[tuple[int, torch.dtype, bool], list[torch.Tensor]] = {}
        self._bytes = 0
        self._any_pinned = False
        self._lock = threading.Lock()
        #: Bytes of the buffers made (in use or free), and their peak since
        #: :meth:`reset_peak`: the agent's host memory in the forecast (forecast.py).
        self.held = 0
        self.peak = 0
        #: Time spent making fresh buffers (their pages fault and are zeroed: ~10x a copy
        #: into a reused one) while ``measuring``: the first captured step pays it, later
        #: ones reuse the buffers (forecast.py). A fresh buffer is zeroed then, so that the
        #: faults are timed apart from the copy, which every step pays.
        self.fresh_ns = 0
        self.measuring = False

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        """A contiguous CPU copy of ``t`` (detached): a view of a pooled 1-D buffer of the
        same dtype (its ``_base``), which :meth:`give` takes back.

        Buffers are keyed by byte size *and dtype*: a buffer viewed as another dtype is a
        new base for autograd's view tracking (its ``_base`` is not the buffer), so such
        copies could never be recognised and handed back."""
        d = _detach(t)
        n = d.numel()
        if n == 0:
            return _empty(d.shape, dtype=d.dtype)
        pinned = not d.is_cpu and torch.cuda.is_available() and d.device.type == "cuda"
        key = (n * d.element_size(), d.dtype, pinned)
        buf: Optional[torch.Tensor] = None
        with self._lock:
            free = self._free.get(key)
            if free:
                buf = free.pop()
                self._bytes -= key[0]
        if buf is None:
            fresh = time.perf_counter_ns() if self.measuring else 0
            buf = _empty(n, dtype=d.dtype, pin_memory=pinned)
            if fresh:
                _zero(buf)
                self.fresh_ns += time.perf_counter_ns() - fresh
            self._any_pinned = self._any_pinned or pinned
            self.held += key[0]
            self.peak = max(self.peak, self.held)
        host = _view(buf, d.shape)
        if pinned:
            # No host sync: the copy is queued behind the ops that made ``t`` (so later
            # in-place changes cannot reach it), and the writer thread waits for its event
            # before reading the buffer (``TensorWriter._tensor``).
            _copy(host, d, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record()
            host._probe_ready = event  # type: ignore[attr-defined]
        else:
            _copy(host, d)
        return host

    def give(self, host: torch.Tensor) -> None:
        """A copy whose data is on disk (writer thread): its buffer is kept for reuse if
        under the cap. Copies not made by :meth:`copy` (no 1-D base of their size) are left
        alone."""
        buf = host._base
        if buf is None or buf.dim() != 1 or buf.numel() != host.numel():
            return
        nbytes = buf.numel() * buf.element_size()
        with self._lock:
            if self._bytes + nbytes <= self.cap:
                key = (nbytes, buf.dtype, buf.is_pinned() if self._any_pinned else False)
                self._free.setdefault(key, []).append(buf)
                self._bytes += nbytes
            else:
                self.held -= nbytes  # dropped, to the allocator

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self.held -= self._bytes
            self._bytes = 0

    def reset_peak(self) -> None:
        """Start measuring the peak and fresh buffers anew (at a measured step's
        ``start()``; :meth:`one_time_s` ends it)."""
        self.peak = self.held
        self.fresh_ns = 0
        self.measuring = True

    def one_time_s(self) -> float:
        """Of the time spent on fresh buffers since :meth:`reset_peak`, the share later
        steps will not pay again: all of it when the pool keeps every buffer (its peak
        within the cap), else the cap's share of the peak (the rest is made anew each
        step)."""
        self.measuring = False
        share = 1.0 if self.peak <= self.cap else self.cap / self.peak
        return self.fresh_ns * share / 1e9


class TensorWriter:
    """Writes safetensors shards: on one background thread, or ``inline`` on the caller's.

    Each tensor is written to its shard's temp file as soon as it is taken, so when the
    producer closes a shard (at its size limit or at ``stop()``) only the header is left to
    write: ``stop()`` never waits for a whole step's data, and a shard is never held in
    memory.

    On the thread, tensors arrive as host copies through a bounded queue, whose bound is
    the back-pressure when the disk is slower than training. That pays for itself when a
    core is free to run the thread beside training, which is what an accelerator run has:
    the copy is the device-to-host transfer it needs anyway, and it is made without a host
    sync. When no core is free -- a CPU run whose torch threads take every core -- the
    thread's writes compete with training for the cores, and the copy moves every byte
    through memory twice. ``inline`` then writes each tensor from its own memory, on the
    training thread, before the op that produced it returns (so no later change can reach
    the bytes): on the 2-core bench box, a 4-layer transformer dumping 3,958 MB a step
    spent 4.2 s on it against 5.6 s through the thread (docs/capture.md, "ninth pass").

    Errors are kept in ``error`` for the training thread to notice in both ways; the thread
    keeps draining the queue so a producer can never block forever on a dead writer.
    """

    # Header room reserved in a new shard; grows to what shards needed (steps repeat).
    _MIN_RESERVE = 64 * 1024

    def __init__(
        self,
        queue_size: int,
        on_thread_start: Callable[[], None],
        pool: Optional[HostPool] = None,
        inline: bool = False,
    ) -> None:
        self._q: queue.Queue[tuple[Any, ...]] = queue.Queue(maxsize=queue_size)
        self._pool = pool
        self._open: dict[str, _ShardStream] = {}
        self._reserve = self._MIN_RESERVE
        #: Time spent rewriting shards whose header outgrew the room reserved (the first
        #: step's, until the reserve has grown to what a step needs): one-time (forecast.py).
        self.rewrite_ns = 0
        self.error: Optional[BaseException] = None
        #: Written on the caller's thread, as each item is given (no thread, no queue).
        self.inline = inline
        self._on_thread_start = on_thread_start
        if not inline:
            self._thread = threading.Thread(target=self._run, name="probe-writer", daemon=True)
            self._thread.start()

    def put(self, shard_path: str, key: str, tensor: torch.Tensor) -> None:
        """Write ``tensor`` to the shard (queued, or now when inline); a pooled copy's
        buffer is handed back to the pool once its data is written."""
        self._give(("t", shard_path, key, tensor))

    def close_shard(self, shard_path: str) -> None:
        self._give(("c", shard_path))

    def sync(self, timeout: Optional[float] = None) -> None:
        """Wait until everything given so far is on disk (inline: it is)."""
        if self.inline:
            return
        done = threading.Event()
        self._q.put(("s", done))
        done.wait(timeout)

    def put_many(self, items: list[tuple[Any, ...]]) -> None:
        """Give several ``("t", shard_path, key, tensor)`` items as one (small tensors of
        one op: one queue transfer instead of one each)."""
        self._give(("m", items))

    def _give(self, item: tuple[Any, ...]) -> None:
        if self.inline:
            self._do(item)
        else:
            self._q.put(item)

    def _run(self) -> None:
        self._on_thread_start()
        while True:
            item = self._q.get()
            try:
                self._do(item)
            finally:
                self._q.task_done()

    def _do(self, item: tuple[Any, ...]) -> None:
        try:
            kind = item[0]
            if kind == "t":
                self._tensor(item)
            elif kind == "m":
                for sub in item[1]:
                    self._tensor(sub)
            elif kind == "c":
                shard = self._open.pop(item[1], None)
                if shard is not None and self.error is None:
                    t0 = time.perf_counter_ns()
                    need = shard.close()
                    if need > shard.reserve:  # rewritten (_ShardStream.close)
                        self.rewrite_ns += time.perf_counter_ns() - t0
                    # Room for the header the next shard most likely needs, plus slack.
                    grown = need + need // 4 + 4096
                    self._reserve = max(self._reserve, grown + (-grown % 8))
            elif kind == "s":
                item[1].set()
        except BaseException as exc:  # noqa: BLE001 - must never kill the thread
            self.error = exc
            for shard in self._open.values():
                try:
                    shard.abandon()
                except BaseException:  # noqa: BLE001
                    pass
            self._open.clear()

    def _tensor(self, item: tuple[Any, ...]) -> None:
        try:
            wait_for_copy(item[3])  # the copy from the GPU (HostPool.copy); GIL released
            if self.error is None:
                shard = self._open.get(item[1])
                if shard is None:
                    shard = self._open[item[1]] = _ShardStream(item[1], self._reserve)
                shard.add(item[2], item[3])
        finally:
            # Only the pool's own copies go back to it (``give`` knows them by their
            # buffer); a tensor written inline from its own memory is left alone.
            if self._pool is not None:
                self._pool.give(item[3])


class RankFolder:
    """The files of one ``step<S>/rank<R>`` folder: ops.jsonl, stacks.jsonl, shard names.

    ``lazy`` (overflow mode): nothing is created on disk until the first op is written, so
    a step in which no op overflowed leaves no folder at all; stacks seen before that are
    kept in memory and written then.
    """

    def __init__(self, path: str, shard_bytes: int, lazy: bool = False) -> None:
        self.path = path
        self._ops: Optional[Any] = None
        self._stacks: Optional[Any] = None
        self._held_stacks: list[str] = []
        self.seq = 0
        self.next_id = 0
        self.shard_index = 0
        self.shard_used = 0
        self.shard_data = 0  # exact bytes streamed into the current shard so far
        self.shard_bytes = shard_bytes
        self.stack_ids: dict[tuple[int, ...], int] = {}
        # Code objects named (by id) in stack_ids' keys, held so that no id is reused.
        self.stack_codes: list[tuple[Any, ...]] = []
        if not lazy:
            self.materialize()

    def materialize(self) -> None:
        """Create the folder and open its op log (at once, or at the first op if lazy)."""
        if self._ops is not None:
            return
        path = self.path
        os.makedirs(path, exist_ok=True)
        stale = [
            f
            for f in os.listdir(path)
            if f in ("ops.jsonl", "stacks.jsonl") or f.endswith(".safetensors")
        ]
        if stale:
            # A previous run wrote here; appending to its log would mix two runs.
            log.warning("probe: replacing an earlier dump in %s", path)
            for f in stale:
                os.remove(os.path.join(path, f))
        self._ops = open(os.path.join(path, "ops.jsonl"), "ab", buffering=1 << 20)
        held, self._held_stacks = self._held_stacks, []
        for line in held:
            self._write_stack_line(line)

    def write_op(self, record: dict[str, Any]) -> None:
        if self._ops is None:
            self.materialize()
            assert self._ops is not None
        record["seq"] = self.seq
        self.seq += 1
        self._ops.write(_encode_record(record))

    def write_stack_json(self, sid: int, frames_json: str) -> None:
        """Append one stack whose ``frames`` array is already JSON (cached across steps)."""
        line = '{"id": %d, "frames": %s}\n' % (sid, frames_json)
        if self._ops is None:
            self._held_stacks.append(line)
        else:
            self._write_stack_line(line)

    def _write_stack_line(self, line: str) -> None:
        if self._stacks is None:
            self._stacks = open(os.path.join(self.path, "stacks.jsonl"), "a", encoding="utf-8")
        self._stacks.write(line)

    def shard_for(self, nbytes: int) -> tuple[str, int, Optional[str]]:
        """Assign a tensor to the current shard; returns (file name, offset of its data in
        the shard's data as streamed, shard to close or None).

        Shard assignment happens here, in the training thread, so the op record can name
        its ``file`` (and ``data_offsets``) immediately; the writer thread streams tensors
        of a shard in the same order, so the offsets are those of the ``.stream.tmp``. A
        shard is closed once it passes the size limit.
        """
        name = "tensors-%05d.safetensors" % self.shard_index
        offset = self.shard_data
        self.shard_data += nbytes
        self.shard_used += max(nbytes, 1)
        to_close = None
        if self.shard_used >= self.shard_bytes:
            to_close = name
            self.shard_index += 1
            self.shard_used = 0
            self.shard_data = 0
        return name, offset, to_close

    def take_open_shard(self) -> Optional[str]:
        """Close the shard being filled (at stop/step end); the next tensor starts a new one."""
        if self.shard_used == 0:
            return None
        name = "tensors-%05d.safetensors" % self.shard_index
        self.shard_index += 1
        self.shard_used = 0
        self.shard_data = 0
        return name

    def flush(self) -> None:
        if self._ops is not None:
            self._ops.flush()
        if self._stacks is not None:
            self._stacks.flush()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self._ops is not None:
                self._ops.close()
            if self._stacks is not None:
                self._stacks.close()


class Holder(Protocol):
    """Where step folders go instead of the disk: the flight recorder (flight.py) makes each
    step's folder in memory and keeps the closed ones until a trigger writes them."""

    def make(self, path: str, shard_bytes: int, step: int, rank: int, lazy: bool) -> RankFolder:
        """The folder of ``step``/``rank`` (its records stay in memory)."""
        ...

    def keep(self, folder: RankFolder) -> None:
        """A closed step folder, complete: held until a trigger, or dropped."""
        ...


class DumpFiles:
    """The files one Debugger writes: the manifest (once), the ``step<S>/rank<R>`` folder
    of the step being captured, and the tensor writer (tensor mode).

    With a ``holder`` (the flight recorder) nothing reaches the disk by itself: step folders
    are the holder's, and the manifest waits for :meth:`write_manifest`."""

    def __init__(self, config: CaptureConfig) -> None:
        self._c = config
        self.folder: Optional[RankFolder] = None
        self.writer: Optional[TensorWriter] = None
        #: Reused host buffers of tensor mode (bounded by one shard's size, 64-512 MiB).
        self.pool = HostPool(min(max(config.shard_bytes, 64 << 20), 512 << 20))
        #: Small host copies held back and queued together (:meth:`push`).
        self._outbox: list[tuple[Any, ...]] = []
        self._outbox_bytes = 0
        self._manifest_done = False
        #: Compiled code ran while a step was captured (:meth:`mark_compiled`), and the
        #: compiled graphs whose API calls were captured in forward (graphs.py).
        self._compiled = False
        self._compiled_capture: Optional[dict[str, Any]] = None
        #: The device the manifest names (the model's, once known).
        self._device = ""
        #: Step folders appear at their first written op, as in overflow mode. Set when the
        #: agent counts iterations (ApiProfiler): the iteration opened by the last optimizer
        #: step may never run, and must not leave an empty folder behind.
        self.lazy = False
        #: The flight recorder, when steps are written only on a trigger (:class:`Holder`).
        self.holder: Optional[Holder] = None
        #: The manifest's ``forecast`` and ``budget`` objects (forecast.py), once known.
        self.cost: dict[str, Any] = {}

    def open(self, step: int, rank: int, model: Optional[torch.nn.Module]) -> None:
        """Make sure the manifest, this step's folder and the writer exist."""
        c = self._c
        holder = self.holder
        if not self._manifest_done:
            if holder is None:
                os.makedirs(c.dump_path, exist_ok=True)
                self._write_manifest(model)
                self._manifest_done = True
            elif not self._device:
                self._device = model_device(c.device, model)
        if self.folder is None:
            path = os.path.join(c.dump_path, f"step{step}", f"rank{rank}")
            lazy = self.lazy or c.mode == "overflow"
            if holder is not None:
                self.folder = holder.make(path, c.shard_bytes, step, rank, lazy)
            else:
                self.folder = RankFolder(path, c.shard_bytes, lazy=lazy)
        if c.mode in ("tensor", "overflow") and self.writer is None:
            inline = write_inline(c.tensor_writer, model_device(c.device, model))
            self.writer = TensorWriter(c.queue_size, _writer_thread_init, self.pool, inline)

    @property
    def dump_path(self) -> str:
        """The dump root (``manifest.json``, ``step<S>/``)."""
        return self._c.dump_path

    def model_known(self, model: torch.nn.Module) -> None:
        """The model became known after the manifest was written (ApiProfiler finds it at
        its first forward): write the manifest again, for the model's device."""
        if self._manifest_done:
            self._write_manifest(model)
        elif self.holder is not None:
            self._device = model_device(self._c.device, model)

    def write_manifest(self) -> None:
        """Write the manifest now, if it is not written yet (the flight recorder's first
        trigger: a run that never triggers leaves nothing behind)."""
        if not self._manifest_done:
            os.makedirs(self._c.dump_path, exist_ok=True)
            self._dump_manifest()
            self._manifest_done = True

    def mark_compiled(
        self, missing: bool, graphs: int = 0, forward: bool = True, backward: bool = True
    ) -> None:
        """Compiled code ran while a step was captured: the manifest says whether some of it
        is missing from the dump (``compiled``, so that ``probe compare`` can tell why the
        other run's calls there have no counterpart) and how many graphs had their calls
        captured, in which directions (``compiled_capture``). Rewritten when that changes."""
        capture = {"graphs": graphs, "forward": forward, "backward": backward} if graphs else None
        if (missing and not self._compiled) or capture != self._compiled_capture:
            self._compiled = self._compiled or missing
            self._compiled_capture = capture
            if self._manifest_done:
                self._dump_manifest()

    def note_cost(self, key: str, value: dict[str, Any]) -> None:
        """The manifest's ``forecast`` or ``budget`` (docs/format.md): written now if the
        manifest is, else with it."""
        self.cost[key] = value
        if self._manifest_done:
            self._dump_manifest()

    def _write_manifest(self, model: Optional[torch.nn.Module]) -> None:
        self._device = model_device(self._c.device, model)
        self._dump_manifest()

    def _dump_manifest(self) -> None:
        c = self._c
        manifest: dict[str, Any] = {
            "format": "probe-dump",
            "version": 1,
            "framework": "pytorch",
            "framework_version": torch.__version__.split("+")[0],
            "device": self._device,
            # Overflow mode writes what tensor mode writes, for the ops it records.
            "mode": "tensor" if c.mode == "overflow" else c.mode,
            "level": c.level,
            "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            # The job's, not what this dump holds: a dump of some ranks, or one that lost a
            # rank's folder, is not a job of another size (compare's world-size warning).
            "world_size": world_size(),
            "producer": f"probe-agent {__version__}",
            "config": json.loads(json.dumps(c.raw, default=str)),
        }
        if self._compiled:
            manifest["compiled"] = True
        if self._compiled_capture:
            manifest["compiled_capture"] = self._compiled_capture
        if c.mode == "overflow":
            # Readers must know that absent ops are finite ones, not missing ones.
            manifest["overflow"] = {"overflow_nums": c.overflow_nums}
        manifest.update(self.cost)
        atomic_write_text(
            os.path.join(c.dump_path, "manifest.json"), json.dumps(manifest, indent=2) + "\n"
        )

    def stage(self, t: torch.Tensor) -> torch.Tensor:
        """What :meth:`store`, called next, is to write for ``t``: a host copy
        (:meth:`HostPool.copy`), or with an inline writer a plain contiguous CPU tensor as
        it is (detached), since its bytes are written before the op returns. A tensor kept
        longer before it is stored (a parameter's gradient, until ``stop()``) must be
        copied instead: it may change meanwhile."""
        w = self.writer
        if w is not None and w.inline and t.is_cpu and type(t) in PLAIN and t.is_contiguous():
            return _detach(t)
        return self.pool.copy(t)

    def store(self, folder: RankFolder, key: str, host: torch.Tensor) -> tuple[str, list[int]]:
        """Write ``host`` (:meth:`stage`) to the folder's current shard: queued for the
        writer thread, or written now by an inline writer. Returns the shard's file name
        and the tensor's ``data_offsets`` in it (as streamed)."""
        writer = self.writer
        assert writer is not None
        folder.materialize()  # a lazy folder, before the writer opens a shard in it
        nbytes = host.numel() * host.element_size()
        fname, offset, to_close = folder.shard_for(nbytes)
        path = os.path.join(folder.path, fname)
        if writer.inline:
            # Now: ``host`` may be the tensor itself, which the next op may change.
            writer.put(path, key, host)
        elif nbytes <= _SMALL:
            self._outbox.append(("t", path, key, host))
            self._outbox_bytes += nbytes
        else:
            if self._outbox:
                self.push()
            writer.put(path, key, host)
        if to_close is not None:
            self.push()
            writer.close_shard(os.path.join(folder.path, to_close))
        return fname, [offset, offset + nbytes]

    def push(self, full_only: bool = False) -> None:
        """Queue the small host copies held back by :meth:`store`: before anything else is
        queued (the writer sees every item in order), at ``sync()``, and at the end of an op
        once they add up to a batch (``full_only``: :data:`_OUTBOX_ITEMS` copies or
        :data:`_OUTBOX_BYTES`). Each queue item wakes the writer thread, whose Python then
        competes with training for the GIL; one item per op cost more than the copies."""
        if self._outbox and (
            not full_only
            or len(self._outbox) >= _OUTBOX_ITEMS
            or self._outbox_bytes >= _OUTBOX_BYTES
        ):
            items, self._outbox = self._outbox, []
            self._outbox_bytes = 0
            assert self.writer is not None
            self.writer.put_many(items)

    def check(self) -> None:
        """Raise the tensor writer's error, if it had one (a file-system error as itself,
        so that it is reported with the file it names)."""
        if self.writer is not None and self.writer.error is not None:
            err = self.writer.error
            if isinstance(err, OSError):
                raise err
            raise OSError(f"tensor writer failed: {err!r}")

    def sync(self) -> None:
        """Close the open shard and wait until everything of this step is on disk."""
        folder = self.folder
        if folder is None:
            return
        if self.writer is not None:
            self.push()
            shard = folder.take_open_shard()
            if shard is not None:
                self.writer.close_shard(os.path.join(folder.path, shard))
            self.writer.sync()
            if self.writer.error is not None:
                # The op log is flushed first: its records are readable without the data.
                try:
                    folder.flush()
                finally:
                    err = self.writer.error
                    if isinstance(err, OSError):
                        raise err
                    raise OSError(f"writing tensors to {folder.path}: {err!r}")
        folder.flush()

    def close_step(self) -> None:
        """Close this step's folder (the next step opens its own)."""
        folder, self.folder = self.folder, None
        if folder is not None:
            folder.close()
            if self.holder is not None:
                self.holder.keep(folder)


def write_inline(choice: str, device: str) -> bool:
    """Whether tensor data is written inline (``TensorWriter``): as ``tensor_writer`` says,
    or for ``auto`` on a CPU run (no accelerator in use) whose torch threads leave no core
    to the writer thread."""
    if choice != "auto":
        return choice == "inline"
    if device != "cpu" or _accelerator_in_use():
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    return cores <= torch.get_num_threads()


def _accelerator_in_use() -> bool:
    """Whether this process has started CUDA or an Ascend NPU (``torch_npu``)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return True
    npu = getattr(torch, "npu", None)
    try:
        return bool(npu is not None and npu.is_initialized())
    except Exception:  # noqa: BLE001 - a partial torch_npu: take it as in use
        return True


def _writer_thread_init() -> None:
    """The writer thread must never be captured by the wrappers (its own torch calls)."""
    tls.active = False
