"""The path every captured tensor takes: tensor -> record -> statistics -> writer.

Why one owner: a hook (API wrapper, module hook, autograd hook, DDP's communication hook)
decides *which* tensors of a call are recorded and under which names; what happens to each
of them is the same for all hooks and must stay so, byte for byte: its record (dtype,
shape, a DTensor's placement), its statistics (on the device until their batch is read),
its data (tensor mode) or checksum, what the dataflow already knows of it (``src``/``id``,
statistics reused), and at the end the record handed to the stats buffer in order. That
was the Debugger's (``_add_tensor``, ``_capture``, ``_finish``), and the hook modules
called back up into it; it is this class's now, and the Debugger only opens and closes the
step it records into.

Overflow mode (``mode: overflow``) checks every captured op for NaN/Inf and records only
those that produced some: what only a recorded op needs (statistics, data, stacks, dataflow
ids, non-tensor arguments) is taken in :meth:`Recorder.finish`, once the op is known to be
one.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import torch

from ..config import CaptureConfig
from .buffer import Fill, StatsBuffer
from .records import (
    UNWRITTEN,
    Captured,
    Dataflow,
    Known,
    OpRecord,
    TensorEntry,
    json_args,
    results,
    walk,
)
from .selection import Selection
from .stacks import StackTable
from .stats import (
    DTYPE_NAMES,
    PLAIN,
    STORABLE,
    StatVector,
    any_nonfinite,
    checksum_later,
    dtensor_local,
    dtype_name,
    finish_stats,
    nested_shape,
    nonfinite_result,
    null_stats,
    stat_vector,
)
from .writer import DumpFiles

if TYPE_CHECKING:
    from .records import TensorRecord

_STRIDED = torch.strided
# Bound before any wrapper exists: the agent's own calls skip the API wrappers.
_clone = torch.Tensor.clone
_detach = torch.Tensor.detach


def _storable(t: torch.Tensor) -> bool:
    """Whether tensor mode stores ``t``'s data: a dense tensor of a dtype safetensors holds
    (sparse and nested tensors get their record and statistics only)."""
    return t.dtype in STORABLE and t.layout is _STRIDED and not t.is_nested


class Recorder:
    """Turns one Debugger's captured tensors into records and its finished records into
    ``ops.jsonl`` lines (through the stats buffer). Not thread-safe: hooks call it with the
    capture's lock held."""

    def __init__(self, config: CaptureConfig, files: DumpFiles, select: Selection) -> None:
        self.config = config
        #: The step's files: stage/store tensor data, the open folder records go to.
        self.files = files
        self._select = select
        self.mode = config.mode
        #: Overflow mode: only ops that produced NaN/Inf are recorded.
        self.overflow = config.mode == "overflow"
        #: Overflow mode: ops producing NaN/Inf still to record (negative: no limit).
        self.overflow_left = config.overflow_nums
        #: Stacks taken when an op is called (overflow mode: when it is recorded).
        self.call_stacks = config.stack and not self.overflow
        #: Dataflow ids (``id``/``src``): meaningless when most ops are not recorded.
        self.dataflow = not self.overflow
        self.stacks = StackTable()
        # A checksum is of the bytes in C order: it is shared only in the same order.
        self.flow = Dataflow(permuted=config.mode != "checksum")
        #: ``torch_npu.get_npu_format`` once torch_npu is imported (a tensor's ``format``).
        self.npu_format: Optional[Callable[[torch.Tensor], Any]] = _npu_format()
        #: Finished records whose statistics are still on the device (buffer.py).
        self.pending = StatsBuffer()

    def new_step(self) -> None:
        """A new step: no tensor of the last one is known any more."""
        self.flow.clear()
        if self.npu_format is None:
            self.npu_format = _npu_format()

    def flush(self) -> None:
        """Write every finished record (at ``stop()``: the step's op log is complete)."""
        self.pending.flush(wait=True)

    def discard(self) -> None:
        """Forget the finished records not written yet (a failure made them unwritable)."""
        self.pending.discard()

    # ------------------------------------------------------------------ tensor -> record

    def capture(self, t: torch.Tensor, held: bool = False) -> Captured:
        """Statistics, plus the data to store (tensor mode: ``DumpFiles.stage``; a host copy
        when ``held``, kept before it is stored) or checksum.

        Statistics read on the host (a CPU tensor's) come back as the record's finished
        ``stats`` dict; an accelerator's stay on the device until their batch is read
        (buffer.py). Grad mode is switched off only where a reduction could be recorded
        (a tensor that requires grad): the switch costs two calls per tensor."""
        nested = t.is_nested
        if nested:
            t = t.values()  # its elements, packed: their statistics, and no data stored
        if t.layout is not _STRIDED or t.is_meta:
            return None, None, None
        prev = t.requires_grad and torch.is_grad_enabled()
        if prev:
            torch._C._set_grad_enabled(False)
        try:
            vec: StatVector = stat_vector(t)
            if type(vec) is list:
                vec = finish_stats(vec, t.numel() or 1, None)  # type: ignore[assignment]
            mode = self.mode
            if mode == "statistics" or nested or t.dtype not in STORABLE:
                return vec, None, None
            if mode == "checksum":
                return vec, None, checksum_later(t, self.files.pool.copy)
            files = self.files
            return vec, files.pool.copy(t) if held else files.stage(t), None
        finally:
            if prev:
                torch._C._set_grad_enabled(True)

    def add_tensor(
        self,
        op: OpRecord,
        name: str,
        role: str,
        t: torch.Tensor,
        counts: bool = False,
        pre: Optional[Captured] = None,
        same_as: Optional[Known] = None,
    ) -> TensorRecord:
        """Record one tensor: metadata now, stats as a device vector, data to the writer.

        ``counts``: the tensor is about to change in place (overflow mode then keeps a copy
        of it as the op saw it; the statistics take their NaN/Inf counts now in every case).
        ``pre``: what :meth:`capture` already took of it (parameter gradients).
        ``same_as``: the record and statistics of a tensor captured before that this
        tensor *is* (same object, version and storage writes: ``Dataflow``). A finished
        record's stats/checksum are reused; an unfinished one's statistics too (a module's
        parameter met again inside it at mix level). Only data is stored again.
        A ``DTensor`` is recorded as its local shard (``dtensor_local``).
        """
        placed = None
        if type(t) not in PLAIN:
            local = dtensor_local(t)
            if local is not None:
                t, placed = local
        if self.overflow:
            # Nothing is computed until finish() knows whether the op overflowed (most do
            # not, and then write nothing; dtype and shape are filled in then); a tensor
            # about to change in place is kept as a device copy, as the value the op saw.
            if counts and pre is None:
                t = self.snapshot(t)
            rec: TensorRecord = {"name": name, "role": role, "dtype": "", "shape": ()}
            if placed is not None:
                rec["dtensor"] = placed
            op.entries.append((rec, None, t))
            return rec
        dt = t.dtype
        nested = t.is_nested
        # The shape as a tuple, not a list: a tuple of ints leaves the garbage collector's
        # watch at its first pass, a list never does, and the records a step keeps
        # (Dataflow) live through several collections into the oldest generation, whose
        # full collections they bring on (docs/capture.md, "eighth pass").
        rec = {
            "name": name,
            "role": role,
            "dtype": DTYPE_NAMES.get(dt) or dtype_name(dt),
            "shape": tuple(t.shape) if not nested else nested_shape(t),
        }
        if placed is not None:
            rec["dtensor"] = placed
        if not nested:
            self.flow.layout(rec, t, self.npu_format)
        vec: StatVector
        host: Optional[torch.Tensor]
        crc: Union[str, torch.Tensor, None]
        if same_as is None:
            vec, host, crc = pre if pre is not None else self.capture(t)
            if pre is UNWRITTEN:
                rec["unwritten"] = True
        else:
            mode = self.mode
            known, known_vec, _ = same_as
            if "unwritten" in known:  # the same memory, still not written
                rec["unwritten"] = True
                op.entries.append((rec, None, None))
                return rec
            if "stats" in known:
                rec["stats"] = known["stats"]
                if mode != "tensor":
                    if "checksum" in known:
                        rec["checksum"] = known["checksum"]
                    op.entries.append((rec, None, None))
                    return rec
                vec, host, crc = None, self.files.stage(t) if _storable(t) else None, None
            elif known_vec is not None and mode != "checksum":
                # Its record is not finished (no stats yet), its statistics are reduced.
                host = self.files.stage(t) if mode == "tensor" and _storable(t) else None
                vec, crc = known_vec, None
            else:
                vec, host, crc = pre if pre is not None else self.capture(t)
        if crc is not None:
            # A host copy stands in for the checksum until its batch lands (finish()).
            rec["checksum"] = crc  # type: ignore[typeddict-item]
        if host is not None:
            folder = op.folder or self.files.folder
            assert folder is not None
            rec["file"], rec["data_offsets"] = self.files.store(folder, name, host)
        op.entries.append((rec, vec, None))
        return rec

    @staticmethod
    def snapshot(t: torch.Tensor) -> torch.Tensor:
        """Overflow mode: a device copy of a tensor about to change, which is all that is
        taken of it unless its op turns out to overflow."""
        if t.layout is not _STRIDED or t.is_meta or t.is_nested:
            return t
        return _clone(_detach(t))

    def keep_gradient(
        self, g: torch.Tensor, reduced: bool = False
    ) -> tuple[torch.Tensor, Captured, Optional[Known]]:
        """What a parameter-gradient hook keeps until ``stop()`` writes the record: the
        gradient and its stats/data taken now (zero_grad may clear it before), or in
        overflow mode a device copy, checked and recorded at ``stop()``.

        In statistics mode a gradient that a backward record already holds (the one
        autograd accumulated into ``.grad``) is not reduced again: the third value is what
        is known of it, for :meth:`add_tensor`'s ``same_as``. ``reduced``: taken again after
        a collective wrote it (DDP), which is reduced anew. A gradient reduced here is
        remembered, so that the optimizer ops reading it reuse its statistics."""
        if self.overflow:
            return self.snapshot(g), (None, None, None), None
        flow = self.flow if self.dataflow else None
        mem = None
        if flow is not None and not reduced and self.mode == "statistics":
            same, mem = flow.find(g)
            if same is not None and ("stats" in same[0] or same[1] is not None):
                return g, (None, None, None), same
        local = dtensor_local(g) if type(g) not in PLAIN else None
        captured = self.capture(g if local is None else local[0], held=True)
        if flow is not None and captured[0] is not None:
            # Its record is made at stop(); until then the statistics stand for it.
            record: TensorRecord = {"name": "", "role": "parameter", "dtype": "", "shape": ()}
            flow.remember(g, (record, captured[0], None), mem)
        return g, captured, None

    # ------------------------------------------------------------------ record -> dump

    def finish(self, op: OpRecord) -> None:
        """Hand the record and its tensors' statistics (still on their devices) to the stats
        buffer, which brings those of many ops to the host in one transfer and writes the
        records in order (buffer.py): no host read per op."""
        op.done = True
        folder = op.folder or self.files.folder
        if folder is None or folder is not self.files.folder:
            return  # the step this op belonged to is already closed
        if self.overflow:
            if self.overflow_left == 0 or not _produced_nonfinite(op):
                return
            self._take_overflow(op)
        entries = op.entries
        if op.direction == "backward" and len(entries) > 1:
            # Gradients arrive in autograd order; store them in name order for readers.
            entries.sort(key=lambda e: (e[0]["role"], e[0]["name"]))
        parts: list[Any] = []
        fills: list[Fill] = []
        tensors: list[TensorRecord] = []
        later: list[TensorRecord] = []  # checksums of host copies on their way
        for rec, vec, _ in entries:
            tensors.append(rec)
            crc = rec.get("checksum")
            if crc is not None and type(crc) is not str:
                later.append(rec)
            if type(vec) is dict:
                # Read on the host already (a CPU tensor's): in place now, last, so that
                # the key order is the dump's.
                rec["stats"] = vec  # type: ignore[typeddict-item]
                continue
            if vec is None:
                if "stats" not in rec:
                    # Leftover bytes have no statistics, not even NaN/Inf counts.
                    rec["stats"] = None if "unwritten" in rec else null_stats()
                continue
            # In place now, so that the key order is the dump's, and so that an input
            # reusing this output's stats shares them. Filled when the buffer reads the
            # numbers: a vector is concatenated with the rest of its batch's, a slab slot
            # read from its slab (buffer.py). No grad-mode switch needed there: vectors
            # were made with grad off, so cat records nothing.
            stats: Any = {}
            rec["stats"] = stats
            numel = max(1, _numel(rec["shape"]))
            parts.append(vec)
            if isinstance(vec, tuple):  # a slot of a fused slab
                fills.append((stats, 6, numel, vec[0].device))
            else:
                assert isinstance(vec, torch.Tensor)
                fills.append((stats, vec.shape[0], numel, vec.device))
        self.pending.add(folder, op.to_json(tensors), fills, parts, later)
        self.files.push(full_only=True)
        self.files.check()

    def _take_overflow(self, op: OpRecord) -> None:
        """Overflow mode: capture an op that produced NaN/Inf as tensor mode would (stats
        and data of every tensor it kept), and count it against ``overflow_nums``; the last
        one allowed ends capture for the rest of the run."""
        folder = op.folder
        assert folder is not None
        c = self.config
        if op.call_args is not None:
            # An API forward call: its tensors are recorded now, the inputs first.
            args, kwargs = op.call_args
            key = op.key

            def add(role: str) -> Callable[[str, torch.Tensor], torch.Tensor]:
                def fn(name: str, t: torch.Tensor) -> torch.Tensor:
                    self.add_tensor(op, f"{key}.{name}", role, t)
                    return t

                return fn

            if c.inputs:
                walk(args, "input", add("input"))
                for k, v in kwargs.items():
                    walk(v, f"input.{k}", add("input"))
                op.args = json_args(args, kwargs)
            if c.outputs:
                out = op.call_out
                walk(results(out), "output", add("output"))
        if c.stack and op.direction == "forward":
            # Still inside the op's call: the same user frames as when it was called. A
            # backward record is made in autograd's frames, so it has no stack here.
            op.stack = self.stacks.stack_id(folder)
        entries: list[TensorEntry] = []
        for rec, _, t in op.entries:
            if t is None:
                entries.append((rec, None, None))
                continue
            rec["dtype"] = dtype_name(t.dtype)
            rec["shape"] = tuple(t.shape)
            if not t.is_nested:
                self.flow.layout(rec, t, self.npu_format)
            vec, host, _ = self.capture(t)  # statistics, a host copy in tensor mode
            if host is not None:
                rec["file"], rec["data_offsets"] = self.files.store(folder, rec["name"], host)
            entries.append((rec, vec, None))
        op.entries = entries
        if self.overflow_left > 0:
            self.overflow_left -= 1
            if self.overflow_left == 0:
                self._select.closed = True


def _produced_nonfinite(op: OpRecord) -> bool:
    """Whether a tensor the op produced (forward outputs; the gradients a backward call
    produced; parameter gradients) holds NaN or Inf."""
    if op.call_args is not None:
        return nonfinite_result(op.call_out)
    produced = "parameter" if op.kind == "parameters_grad" else "output"
    return any_nonfinite(
        [t for rec, _, t in op.entries if t is not None and rec["role"] == produced]
    )


def _npu_format() -> Optional[Callable[[torch.Tensor], Any]]:
    """``torch_npu.get_npu_format`` where torch_npu is imported (never imported here)."""
    return getattr(sys.modules.get("torch_npu"), "get_npu_format", None)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
