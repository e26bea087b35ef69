"""Finished op records whose statistics are still on the device, written in batches.

Each finished op hands over its record (a dict, complete but for the numbers of its
``stats``, which are empty dicts already in place so that the JSON key order is the one the
dump always had) and one small vector per op: the statistics of all its tensors stacked on
their device. Every ``limit`` ops (and at ``stop()``) the vectors of the batch are
concatenated per device and copied to the host in one transfer. On an accelerator the copy is
non-blocking into pinned memory and the batch is only *completed* (numbers filled in, records
encoded and written) at the next flush, by when the copy has long landed: capture adds no
host sync per op, one per ``limit`` ops at most, and none that waits for the device except at
``stop()``. On CPU the same path runs (the copy is the concatenation itself), so the ordering
and filling logic is exercised everywhere.

Nothing in a pending record refers to a tensor of the model: statistics are computed when the
tensor is captured (an in-place op that changes it later cannot change them), and NaN/Inf
counts are taken then (``stats.stat_vector``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch

from .stats import fill_stats

if TYPE_CHECKING:
    from .writer import RankFolder

# Bound before any wrapper exists: the agent's own torch calls skip the API wrappers.
_cat = torch.cat
_empty = torch.empty

#: One tensor's place in its op vector: the stats dict to fill, values taken, element count.
Fill = tuple[dict[str, Any], int, int]
#: A finished op: its folder, its record, its fills, its stacked statistics (None: no stats).
Pending = tuple["RankFolder", dict[str, Any], list[Fill], Optional[torch.Tensor]]


class _Batch:
    """Ops of one flush, with their statistics on the way to the host."""

    __slots__ = ("event", "host", "items")

    def __init__(self, items: list[Pending]) -> None:
        self.items = items
        #: Per device: host tensor (or the vector itself on CPU), event to wait for (CUDA).
        self.host: dict[Any, torch.Tensor] = {}
        self.event: dict[Any, Any] = {}


class StatsBuffer:
    """Pending op records of one Debugger, written in order (at most ``limit`` ops held
    before a flush, plus one batch in flight)."""

    #: Ops per batch. Enough to spread one host read (and on an accelerator one transfer)
    #: over many ops, and few enough that a pending record dies young: records held for 256
    #: ops outlived Python's younger GC generations, and the full collections they brought on
    #: (each walks every object of torch and the model, ~100 ms in the example's process)
    #: cost ~15 us a captured call; at 32 about 2 us (docs/capture.md, "Overhead").
    LIMIT = 32

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._items: list[Pending] = []
        self._inflight: Optional[_Batch] = None

    def __len__(self) -> int:
        return len(self._items) + (len(self._inflight.items) if self._inflight else 0)

    def add(
        self,
        folder: RankFolder,
        record: dict[str, Any],
        fills: list[Fill],
        vec: Optional[torch.Tensor],
    ) -> None:
        items = self._items
        items.append((folder, record, fills, vec))
        if len(items) >= self.limit:
            self.flush(wait=False)

    def flush(self, wait: bool = True) -> None:
        """Start the transfer of the ops added since the last flush, then write the batch
        before it (``wait``: this one too, synchronously: at ``stop()``).

        On an exception (a failing write) the records after the one that failed are
        dropped, as they would have been had they been written one by one."""
        batch = None
        if self._items:
            items, self._items = self._items, []
            batch = self._launch(items)
        prev, self._inflight = self._inflight, batch
        try:
            if prev is not None:
                self._complete(prev)
            if wait and batch is not None:
                self._inflight = None
                self._complete(batch)
        except BaseException:
            self._inflight = None
            self._items = []
            raise

    def discard(self) -> None:
        """Forget everything pending (a failure made the records unwritable)."""
        self._items = []
        self._inflight = None

    @staticmethod
    def _launch(items: list[Pending]) -> _Batch:
        batch = _Batch(items)
        per_device: dict[Any, list[torch.Tensor]] = {}
        for _, _, _, vec in items:
            if vec is not None:
                dev = vec.device
                vecs = per_device.get(dev)
                if vecs is None:
                    per_device[dev] = [vec]
                else:
                    vecs.append(vec)
        for dev, vecs in per_device.items():
            # One concatenation per device (dtypes promote losslessly: float32 values
            # widen exactly to float64), then one copy to the host.
            flat = vecs[0] if len(vecs) == 1 else _cat(vecs)
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
        for folder, record, fills, vec in batch.items:
            if vec is not None:
                dev = vec.device
                flat = values[dev]
                p = pos[dev]
                for stats, n, numel in fills:
                    fill_stats(stats, flat, p, n, numel)
                    p += n
                pos[dev] = p
            folder.write_op(record)
