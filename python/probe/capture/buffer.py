"""Finished op records whose statistics are still on the device, written in batches.

Each finished op hands over its record (a dict, complete but for the numbers of its
accelerator tensors' ``stats``, which are empty dicts already in place so that the JSON key
order is the one the dump always had) and those tensors' statistics: for a CUDA tensor
reduced by the fused kernel, its slot in a device slab (``fused.py``); else one float64
vector per tensor on its device. Every ``limit`` ops (and at ``stop()``) the slabs written
since the last flush are copied to the host whole, and the vectors of the batch are
concatenated per device, one call for all its ops, and copied in one transfer. On CUDA the copy is non-blocking into pinned memory, with an event behind it, and
the batch is only *completed* (numbers filled in, records encoded and written) at a later
flush once its event says the copy has landed: the training thread never waits for the
device, unless it runs more than ``MAX_IN_FLIGHT`` batches ahead of the GPU (then it waits
for the oldest, which bounds the records held) and at ``stop()``. ``waits`` counts the
former. CPU tensors' numbers are read at once (``stats.stat_vector``: cheaper than stacking
them), so their records come complete and the buffer only keeps them in order and writes
them in batches; tests run the accelerator path on CPU (``stats.READ_ON_CPU`` off).

Nothing in a pending record refers to a tensor of the model: statistics are computed when the
tensor is captured (an in-place op that changes it later cannot change them), and NaN/Inf
counts are taken then (``stats.stat_vector``).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Optional

import torch

from . import fused
from .stats import crc32_of_copy, fill_stats

if TYPE_CHECKING:
    from .writer import RankFolder

# Bound before any wrapper exists: the agent's own torch calls skip the API wrappers.
_cat = torch.cat
_empty = torch.empty

#: One tensor's statistics: the stats dict to fill, how many values its vector holds, its
#: element count, and the device the values are on.
Fill = tuple[dict[str, Any], int, int, Any]
#: A finished op: its folder, its record, its fills, its parts (each fill's statistics
#: vector or fused slab slot, in fill order; empty when it has none), and its tensor records
#: whose ``checksum`` is still the host copy it is taken of (``stats.checksum_later``).
Pending = tuple["RankFolder", dict[str, Any], list[Fill], list[Any], list[Any]]


class _Batch:
    """Ops of one flush, with their statistics on the way to the host."""

    __slots__ = ("copy_bytes", "event", "host", "items", "slabs")

    def __init__(self, items: list[Pending], slabs: list[fused.Slab], copy_bytes: int) -> None:
        self.items = items
        #: Bytes of the host copies its records hold until their checksums are taken.
        self.copy_bytes = copy_bytes
        #: The fused slabs its slots are in (retired, so their copies are on the way).
        self.slabs = slabs
        #: Per device: host tensor (or the vector itself on CPU), event to wait for (CUDA).
        self.host: dict[Any, torch.Tensor] = {}
        self.event: dict[Any, Any] = {}

    def landed(self) -> bool:
        """Whether every copy of this batch has reached the host (asks, never waits)."""
        return all(e.query() for e in self.event.values()) and all(s.landed() for s in self.slabs)


class StatsBuffer:
    """Pending op records of one Debugger, written in order (at most ``limit`` ops held
    before a flush, plus up to ``MAX_IN_FLIGHT`` batches whose numbers are on the way)."""

    #: Ops per batch. Enough to spread one host read (and on an accelerator one transfer)
    #: over many ops, and few enough that a pending record dies young: records held for 256
    #: ops outlived Python's younger GC generations, and the full collections they brought on
    #: (each walks every object of torch and the model, ~100 ms in the example's process)
    #: cost ~15 us a captured call; at 32 about 2 us (docs/capture.md, "Overhead").
    LIMIT = 32
    #: Batches launched and not yet written. A batch is written once its copy has landed;
    #: past this many the oldest is waited for (a GPU that far behind is the bottleneck).
    MAX_IN_FLIGHT = 4
    #: Bytes of host copies (checksum mode on an accelerator) that pending records may hold:
    #: past it everything is written, waiting for the device, so that a model with large
    #: activations does not pile up pinned copies of 160 ops' tensors.
    MAX_COPY_BYTES = 256 << 20

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._items: list[Pending] = []
        self._inflight: deque[_Batch] = deque()
        #: Bytes of host copies held by the records not launched yet (``_items``).
        self._copy_bytes = 0
        #: Times a flush before ``stop()`` had to wait for the device (see the module doc).
        self.waits = 0

    def __len__(self) -> int:
        return len(self._items) + sum(len(b.items) for b in self._inflight)

    def add(
        self,
        folder: RankFolder,
        record: dict[str, Any],
        fills: list[Fill],
        parts: list[Any],
        checksums: Optional[list[Any]] = None,
    ) -> None:
        items = self._items
        items.append((folder, record, fills, parts, checksums or []))
        if checksums:
            for tensor in checksums:
                copy = tensor["checksum"]
                if type(copy) is not str:
                    self._copy_bytes += copy.numel() * copy.element_size()
            held = self._copy_bytes + sum(b.copy_bytes for b in self._inflight)
            if held > self.MAX_COPY_BYTES:
                self.waits += 1
                self.flush(wait=True)
                return
        if len(items) >= self.limit:
            self.flush(wait=False)

    def flush(self, wait: bool = True) -> None:
        """Start the transfer of the ops added since the last flush, then write the batches
        before it whose numbers have landed (``wait``: every batch, this one too, waiting
        for the device: at ``stop()``).

        On an exception (a failing write) the records after the one that failed are
        dropped, as they would have been had they been written one by one."""
        inflight = self._inflight
        try:
            if self._items:
                items, self._items = self._items, []
                inflight.append(self._launch(items, self._copy_bytes))
                self._copy_bytes = 0
            # The batch just launched waits for the next flush (its copy has barely begun).
            while len(inflight) > (0 if wait else 1):
                oldest = inflight[0]
                if not wait and len(inflight) <= self.MAX_IN_FLIGHT and not oldest.landed():
                    break
                if not wait and not oldest.landed():
                    self.waits += 1
                inflight.popleft()
                self._complete(oldest)
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        """Forget everything pending (a failure made the records unwritable)."""
        self._items = []
        self._inflight.clear()
        self._copy_bytes = 0

    @staticmethod
    def _launch(items: list[Pending], copy_bytes: int) -> _Batch:
        # Every slot taken so far, these ops' included, is copied to the host from now on.
        fused.retire_open()
        per_device: dict[Any, list[torch.Tensor]] = {}
        slabs: dict[int, fused.Slab] = {}
        for _, _, fills, parts, _ in items:
            # Each tensor's vector to its device's list (an op copying between devices has
            # tensors on two); a fused slot's slab is copied as a whole.
            for (_, _, _, dev), part in zip(fills, parts):
                if type(part) is tuple:
                    slabs[id(part[0])] = part[0]
                else:
                    per_device.setdefault(dev, []).append(part)
        batch = _Batch(items, list(slabs.values()), copy_bytes)
        for dev, vecs in per_device.items():
            # One concatenation per device (float64 vectors: one batched copy kernel on
            # CUDA), then one copy to the host.
            flat = _cat(vecs)
            if dev.type == "cpu":
                batch.host[dev] = flat
            elif dev.type == "cuda":
                host = _empty(flat.shape, dtype=flat.dtype, pin_memory=True)
                host.copy_(flat, non_blocking=True)
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                event.record()
                batch.host[dev] = host
                batch.event[dev] = event
            else:  # other accelerators: one blocking copy per batch, still not per op
                batch.host[dev] = flat.to("cpu")
        return batch

    @staticmethod
    def _complete(batch: _Batch) -> None:
        values: dict[Any, list[float]] = {}
        for dev, host in batch.host.items():
            event = batch.event.get(dev)
            if event is not None:
                event.synchronize()
            values[dev] = host.tolist()
        pos: dict[Any, int] = dict.fromkeys(values, 0)
        for folder, record, fills, parts, checksums in batch.items:
            for (stats, n, numel, dev), part in zip(fills, parts):
                if type(part) is tuple:
                    fill_stats(stats, part[0].values(), part[1] * 6, 6, numel)
                    continue
                p = pos[dev]
                fill_stats(stats, values[dev], p, n, numel)
                pos[dev] = p + n
            for tensor in checksums:
                tensor["checksum"] = crc32_of_copy(tensor["checksum"])
            folder.write_op(record)
