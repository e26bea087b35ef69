"""Finished op records whose statistics are still on the device, written in batches.

Each finished op hands over its record (a dict, complete but for the numbers of its
accelerator tensors' ``stats``, which are empty dicts already in place so that the JSON key
order is the one the dump always had) and those tensors' statistics: 0-d tensors on their
devices. Every ``limit`` ops (and at ``stop()``) the statistics of the whole batch are
stacked per device, one call for all its ops, and copied to the host in one transfer. On an
accelerator the copy is non-blocking into pinned memory and the batch is only *completed*
(numbers filled in, records encoded and written) at the next flush, by when the copy has
long landed: capture adds no host sync per op, one per ``limit`` ops at most, and none that
waits for the device except at ``stop()``. CPU tensors' numbers are read at once
(``stats.stat_vector``: cheaper than stacking them), so their records come complete and the
buffer only keeps them in order and writes them in batches; tests run the accelerator path
on CPU (``stats.READ_ON_CPU`` off).

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
_stack = torch.stack
_empty = torch.empty

#: One tensor's statistics: the stats dict to fill, how many values were taken (its next
#: ``n`` parts of the op's), its element count, and the device the values are on.
Fill = tuple[dict[str, Any], int, int, Any]
#: A finished op: its folder, its record, its fills, and its parts (the 0-d statistics of
#: its tensors in fill order; empty when it has none).
Pending = tuple["RankFolder", dict[str, Any], list[Fill], list[torch.Tensor]]


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
        parts: list[torch.Tensor],
    ) -> None:
        items = self._items
        items.append((folder, record, fills, parts))
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
        for _, _, fills, parts in items:
            # Each tensor's parts to its device's list (an op copying between devices has
            # tensors on two).
            p = 0
            for _, n, _, dev in fills:
                per_device.setdefault(dev, []).extend(parts[p : p + n])
                p += n
        for dev, vecs in per_device.items():
            # One stack per device (dtypes promote losslessly: float32 values widen exactly
            # to float64, counts are exact to 2**53), then one copy to the host.
            flat = _stack(vecs)
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
        for folder, record, fills, _ in batch.items:
            for stats, n, numel, dev in fills:
                p = pos[dev]
                fill_stats(stats, values[dev], p, n, numel)
                pos[dev] = p + n
            folder.write_op(record)
