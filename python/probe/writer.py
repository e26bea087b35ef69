"""Writing a dump: the append-only op log and the background safetensors shard writer.

The op log is appended one line per op and flushed per step, never rewritten (msprobe
rewrites its whole dump.json on every flush, which is quadratic and loses everything on a
crash). Tensors go through a bounded queue to one writer thread, so the training thread only
pays for the host copy; the bound keeps memory in check when the disk is slower than training.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from typing import Any, Callable, Optional

import torch

log = logging.getLogger("probe")


def atomic_write_text(path: str, text: str) -> None:
    """Write a small file via temp + rename so readers never see half of it."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


class TensorWriter:
    """One background thread writing safetensors shards.

    A safetensors file must be written whole, so the thread buffers a shard's tensors and
    writes the shard (temp file + rename) when the producer says it is closed. Errors are
    kept in ``error`` for the training thread to notice; the thread keeps draining the queue
    so a producer can never block forever on a dead writer.
    """

    def __init__(self, queue_size: int, on_thread_start: Callable[[], None]) -> None:
        self._q: queue.Queue[tuple[Any, ...]] = queue.Queue(maxsize=queue_size)
        self._pending: dict[str, dict[str, torch.Tensor]] = {}
        self.error: Optional[BaseException] = None
        self._on_thread_start = on_thread_start
        self._thread = threading.Thread(target=self._run, name="probe-writer", daemon=True)
        self._thread.start()

    def put(self, shard_path: str, key: str, tensor: torch.Tensor) -> None:
        self._q.put(("t", shard_path, key, tensor))

    def close_shard(self, shard_path: str) -> None:
        self._q.put(("c", shard_path))

    def sync(self, timeout: Optional[float] = None) -> None:
        """Wait until everything queued so far is on disk."""
        done = threading.Event()
        self._q.put(("s", done))
        done.wait(timeout)

    def _run(self) -> None:
        self._on_thread_start()
        from safetensors.torch import save_file

        while True:
            item = self._q.get()
            try:
                kind = item[0]
                if kind == "t":
                    if self.error is None:
                        self._pending.setdefault(item[1], {})[item[2]] = item[3]
                elif kind == "c":
                    tensors = self._pending.pop(item[1], None)
                    if tensors and self.error is None:
                        tmp = item[1] + ".tmp"
                        save_file(tensors, tmp)
                        os.replace(tmp, item[1])
                elif kind == "s":
                    item[1].set()
            except BaseException as exc:  # noqa: BLE001 - must never kill the thread
                self.error = exc
                self._pending.clear()
            finally:
                self._q.task_done()


class RankFolder:
    """The files of one ``step<S>/rank<R>`` folder: ops.jsonl, stacks.jsonl, shard names."""

    def __init__(self, path: str, shard_bytes: int) -> None:
        self.path = path
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
        self._ops = open(os.path.join(path, "ops.jsonl"), "a", encoding="utf-8", buffering=1 << 20)
        self._stacks: Optional[Any] = None
        self.seq = 0
        self.next_id = 0
        self.shard_index = 0
        self.shard_used = 0
        self.shard_bytes = shard_bytes
        self.stack_ids: dict[tuple[int, ...], int] = {}
        # Code objects named (by id) in stack_ids' keys, held so that no id is reused.
        self.stack_codes: list[tuple[Any, ...]] = []

    def write_op(self, record: dict[str, Any]) -> None:
        record["seq"] = self.seq
        self.seq += 1
        self._ops.write(json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n")

    def write_stack(self, sid: int, frames: list[str]) -> None:
        self.write_stack_json(sid, json.dumps(frames))

    def write_stack_json(self, sid: int, frames_json: str) -> None:
        """Append one stack whose ``frames`` array is already JSON (cached across steps)."""
        if self._stacks is None:
            self._stacks = open(os.path.join(self.path, "stacks.jsonl"), "a", encoding="utf-8")
        self._stacks.write('{"id": %d, "frames": %s}\n' % (sid, frames_json))

    def shard_for(self, nbytes: int) -> tuple[str, Optional[str]]:
        """Assign a tensor to the current shard; returns (file name, shard to close or None).

        Shard assignment happens here, in the training thread, so the op record can name
        its ``file`` immediately; a shard is closed once it passes the size limit.
        """
        name = "tensors-%05d.safetensors" % self.shard_index
        self.shard_used += max(nbytes, 1)
        to_close = None
        if self.shard_used >= self.shard_bytes:
            to_close = name
            self.shard_index += 1
            self.shard_used = 0
        return name, to_close

    def take_open_shard(self) -> Optional[str]:
        """Close the shard being filled (at stop/step end); the next tensor starts a new one."""
        if self.shard_used == 0:
            return None
        name = "tensors-%05d.safetensors" % self.shard_index
        self.shard_index += 1
        self.shard_used = 0
        return name

    def flush(self) -> None:
        self._ops.flush()
        if self._stacks is not None:
            self._stacks.flush()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._ops.close()
            if self._stacks is not None:
                self._stacks.close()
