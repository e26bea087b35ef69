"""Dump on trigger, a flight recorder for numerics (``flight_recorder``; docs/monitor.md,
"Dump on trigger: the flight recorder").

Dumping every step costs too much for a long run, so the NaN of step 12,345 is never in a
dump. The flight recorder captures every step as statistics capture does, but each step's
``step<S>/rank<R>`` folder is held in memory (:class:`HeldFolder`: its ``ops.jsonl`` and
``stacks.jsonl`` as bytes) and only the last ``steps`` of them are kept. When a trigger
fires at the end of a step, the held steps are written as the ordinary folders they would
have been, with the manifest, and ``trigger.json`` at the dump root says why.

Why the records are held on the host, not the device: statistics leave the device in
batches while the step runs (buffer.py), asynchronously, and the nonfinite trigger needs
their NaN/Inf counts at the end of every step anyway. What is held is then the records'
JSON text, a few hundred bytes per tensor, and no tensor of the model or the device.

Triggers are taken at the end of a step (``Debugger.step``), never inside it: the signal
handler only sets a flag, and an exception inside the step is noted by ``__exit__`` (or
found at ``close()`` when a step was left without ``stop()``).
"""

from __future__ import annotations

import datetime
import io
import json
import logging
import math
import os
import signal
import statistics
import sys
import threading
from collections import deque
from types import FrameType
from typing import Any, Callable, Optional, Union

from .._runtime import world_size
from ..config import FlightConfig
from .writer import DumpFiles, RankFolder, atomic_write_text

log = logging.getLogger("probe")

#: The order in which triggers of one step are named (``trigger`` is the first that fired).
_ORDER = ("exception", "nonfinite", "loss_spike", "signal")
#: The normal-consistent scale of the median absolute deviation.
_MAD_SCALE = 1.4826


class HeldFolder(RankFolder):
    """A ``step<S>/rank<R>`` folder kept in memory: the same lines a :class:`RankFolder`
    writes, into buffers, and the first op whose statistics count a NaN or an Inf."""

    def __init__(self, path: str, shard_bytes: int, step: int, rank: int, lazy: bool) -> None:
        super().__init__(path, shard_bytes, lazy=True)
        self.step = step
        self.rank = rank
        #: An ApiProfiler step folder: written only if it holds an op (as on disk).
        self.lazy = lazy
        self._ops = io.BytesIO()
        self._stack_lines: list[str] = []
        #: ``op`` and role of the first record with a NaN/Inf count, in write order.
        self.first_nonfinite: Optional[str] = None

    def materialize(self) -> None:
        """Nothing on disk until :meth:`spill`."""

    def write_op(self, record: dict[str, Any]) -> None:
        super().write_op(record)
        if self.first_nonfinite is None:
            for t in record["tensors"]:
                st = t.get("stats")
                if st and (st.get("nan") or st.get("inf")):
                    self.first_nonfinite = f"{record['op']} ({t['role']} {t['name']})"
                    break

    def _write_stack_line(self, line: str) -> None:
        self._stack_lines.append(line)

    def flush(self) -> None:
        """Nothing to flush: the lines stay in memory."""

    def close(self) -> None:
        """Kept open: the buffers are what a trigger writes."""

    def nbytes(self) -> int:
        """Bytes held (the op log and the stacks, as text)."""
        assert isinstance(self._ops, io.BytesIO)
        return self._ops.getbuffer().nbytes + sum(len(s) for s in self._stack_lines)

    def spill(self) -> bool:
        """Write the folder as a :class:`RankFolder` would have; False if it holds nothing
        to write (a lazy folder without ops)."""
        if self.lazy and self.seq == 0:
            return False
        assert isinstance(self._ops, io.BytesIO)
        os.makedirs(self.path, exist_ok=True)
        for f in os.listdir(self.path):  # an earlier run's files (RankFolder.materialize)
            if f in ("ops.jsonl", "stacks.jsonl") or f.endswith(".safetensors"):
                os.remove(os.path.join(self.path, f))
        with open(os.path.join(self.path, "ops.jsonl"), "wb") as fh:
            fh.write(self._ops.getbuffer())
        if self._stack_lines:
            with open(os.path.join(self.path, "stacks.jsonl"), "w", encoding="utf-8") as fh:
                fh.writelines(self._stack_lines)
        return True


class FlightRecorder:
    """Holds the last ``steps`` step folders (:class:`~.writer.Holder`) and writes them when
    a trigger fires at the end of a step (:meth:`end_step`)."""

    def __init__(
        self,
        config: FlightConfig,
        files: DumpFiles,
        tell: Callable[[str, str, int], None],
    ) -> None:
        self.config = config
        self._files = files
        self._tell = tell
        self._on = frozenset(config.triggers)
        self._ring: deque[HeldFolder] = deque()
        #: (step, rank) of the folders written already: a later trigger never rewrites one.
        self._written: set[tuple[int, int]] = set()
        self._losses: deque[float] = deque(maxlen=config.loss_window)
        #: The nonfinite trigger fires on the first nonfinite step, then waits for a finite one.
        self._nonfinite_armed = True
        self._exception: Optional[str] = None
        self._signalled: Optional[int] = None
        self._events: list[dict[str, Any]] = []
        #: ``then: stop`` fired: nothing more is held or triggered.
        self.stopped = False
        self._previous: Any = None
        self._signum: Optional[int] = None
        if "signal" in self._on:
            self._install_signal()

    # ------------------------------------------------------------------ Holder

    def make(self, path: str, shard_bytes: int, step: int, rank: int, lazy: bool) -> HeldFolder:
        """This step's folder; the oldest held ones go, so that this one and the ``steps -
        1`` before it are all that is held."""
        while len(self._ring) >= self.config.steps:
            self._ring.popleft()
        return HeldFolder(path, shard_bytes, step, rank, lazy)

    def keep(self, folder: RankFolder) -> None:
        """A closed step folder joins the ring (past ``steps``, the oldest is dropped)."""
        if not isinstance(folder, HeldFolder) or self.stopped:
            return
        self._ring.append(folder)
        while len(self._ring) > self.config.steps:
            self._ring.popleft()

    def held_bytes(self) -> int:
        """Bytes of op records held now (tests and docs: the recorder's memory)."""
        return sum(f.nbytes() for f in self._ring)

    # ------------------------------------------------------------------ triggers

    def note_exception(self, exc: BaseException) -> None:
        """An exception left the step (``with`` block): the exception trigger, at the step's
        end."""
        if "exception" in self._on and self._exception is None:
            self._exception = f"{type(exc).__name__}: {exc}"[:500]

    def note_unfinished(self, step: int) -> None:
        """``close()`` found step ``step`` still capturing: it was left before ``stop()``,
        by an exception (or an exit). The exception is named when Python kept it."""
        exc = getattr(sys, "last_value", None)
        if isinstance(exc, BaseException):
            self.note_exception(exc)
        elif "exception" in self._on and self._exception is None:
            self._exception = f"step {step} was still being captured at close(): left before stop()"

    def end_step(self, step: int, rank: int, loss: Any, at_close: bool = False) -> bool:
        """The end of step ``step``: check the triggers, and if one fired write the held
        steps. Returns whether capture is to stop (``then: stop`` fired). ``at_close``: the
        step was ended by ``close()``, not ``step()``: there is no loss to miss."""
        if self.stopped:
            return False
        value = None if at_close else self._loss_value(loss)
        fired: list[tuple[str, str]] = []
        if self._exception is not None:
            fired.append(("exception", self._exception))
            self._exception = None
        nonfinite = self._nonfinite(step, value)
        if nonfinite is not None:
            fired.append(("nonfinite", nonfinite))
        spike = self._spike(value)
        if spike is not None:
            fired.append(("loss_spike", spike))
        if self._signalled is not None:
            fired.append(("signal", f"{signal.Signals(self._signalled).name} received"))
            self._signalled = None
        if not fired:
            return False
        fired.sort(key=lambda f: _ORDER.index(f[0]))
        self._write(step, rank, fired)
        if self.config.then == "stop":
            self.stopped = True
            self._ring.clear()
            self.close()
            return True
        return False

    def _loss_value(self, loss: Any) -> Optional[float]:
        """The loss as a float (one host read of a device tensor), or None without one."""
        if loss is None:
            if self._on & {"nonfinite", "loss_spike"}:
                self._tell(
                    "flight-loss",
                    "probe: flight recorder: step() got no loss (dbg.step(loss=loss)): the "
                    "loss_spike trigger is off and the nonfinite trigger watches only the "
                    "captured statistics",
                    8,  # the caller of Debugger.step()
                )
            return None
        try:
            return float(loss.detach() if hasattr(loss, "detach") else loss)
        except (TypeError, ValueError, RuntimeError):
            self._tell(
                "flight-loss-type",
                f"probe: flight recorder: step(loss=...) got {type(loss).__name__}, not a "
                "number or a one-element tensor: the loss triggers ignore it",
                8,
            )
            return None

    def _nonfinite(self, step: int, loss: Optional[float]) -> Optional[str]:
        """Why the nonfinite trigger fires at this step, or None. It fires once per run of
        nonfinite steps: it is armed again by a step that is finite."""
        if "nonfinite" not in self._on:
            return None
        why = []
        if loss is not None and not math.isfinite(loss):
            why.append(f"loss is {loss}")
        held = self._ring[-1] if self._ring and self._ring[-1].step == step else None
        if held is not None and held.first_nonfinite is not None:
            why.append(f"first NaN/Inf in the captured statistics: {held.first_nonfinite}")
        if not why:
            self._nonfinite_armed = True
            return None
        if not self._nonfinite_armed:
            return None
        self._nonfinite_armed = False
        return "; ".join(why)

    def _spike(self, loss: Optional[float]) -> Optional[str]:
        """Why the loss_spike trigger fires for ``loss``, or None: a robust z-score over the
        last ``loss_window`` finite losses (median, MAD), once the window is full."""
        if loss is None or not math.isfinite(loss):
            return None
        c = self.config
        window = self._losses
        why = None
        if "loss_spike" in self._on and len(window) == c.loss_window:
            med = statistics.median(window)
            mad = statistics.median(abs(x - med) for x in window)
            excess = loss - med
            if excess > c.spike_margin * abs(med):
                score = excess / (_MAD_SCALE * mad) if mad > 0 else math.inf
                if score > c.spike_threshold:
                    why = (
                        f"loss {loss:.6g} against a median of {med:.6g} over the last "
                        f"{c.loss_window} steps: robust score {score:.3g} > "
                        f"{c.spike_threshold:g}, {excess / abs(med) if med else math.inf:.3g}x "
                        f"the median above it (> {c.spike_margin:g})"
                    )
        window.append(loss)
        return why

    # ------------------------------------------------------------------ writing

    def _write(self, step: int, rank: int, fired: list[tuple[str, str]]) -> None:
        """Write the held steps not written yet, the manifest (the first time) and the
        trigger's entry in ``trigger.json``."""
        self._files.write_manifest()
        written = []
        for folder in self._ring:
            key = (folder.step, folder.rank)
            if key not in self._written and folder.spill():
                self._written.add(key)
                written.append(folder.step)
        self._ring.clear()
        trigger, reason = fired[0]
        self._events.append(
            {
                "trigger": trigger,
                "step": step,
                "rank": rank,
                "reason": reason,
                "fired": [{"trigger": t, "reason": r} for t, r in fired],
                "steps_written": written,
                "then": self.config.then,
                "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
        doc = {
            "format": "probe-trigger",
            "version": 1,
            "held_steps": self.config.steps,
            "events": self._events,
        }
        name = "trigger.json" if world_size() <= 1 else f"trigger-rank{rank}.json"
        path = os.path.join(self._files.dump_path, name)
        atomic_write_text(path, json.dumps(doc, indent=2) + "\n")
        log.warning(
            "probe: flight recorder: %s at step %d (%s): wrote steps %s to %s",
            trigger,
            step,
            reason,
            written,
            self._files.dump_path,
        )

    # ------------------------------------------------------------------ signal

    def _install_signal(self) -> None:
        """The signal's handler, in the main thread only (Python's rule); elsewhere the
        signal trigger is off, and the user is told."""
        signum = getattr(signal, self.config.signal, None)
        if not isinstance(signum, int):
            self._tell(
                "flight-signal",
                f"probe: flight recorder: no {self.config.signal} on this platform: the "
                "signal trigger is off",
                6,  # the caller of Debugger()
            )
            return
        if threading.current_thread() is not threading.main_thread():
            self._tell(
                "flight-signal",
                "probe: flight recorder: the Debugger was made outside the main thread: "
                "the signal trigger is off (Python handles signals in the main thread only)",
                6,
            )
            return
        self._previous = signal.signal(signum, self._on_signal)
        self._signum = signum

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        """Only a flag: the dump is written at the end of the step (:meth:`end_step`)."""
        self._signalled = signum

    def close(self) -> None:
        """Give the signal back its previous handler (once)."""
        signum, self._signum = self._signum, None
        if signum is None:
            return
        previous: Union[Callable[[int, Optional[FrameType]], Any], int, None] = self._previous
        try:
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        except ValueError:  # closed from another thread (atexit runs in the main one)
            pass
