"""The capture's cost known up front (issue 51): the first captured step is measured and a
forecast of the run's time, bytes and host memory is made from it (docs/capture.md,
"Forecast, dry run and budgets").

What is measured, on each rank for itself:

- **time**: the wall time of the captured step, from ``start()`` to the end of ``stop()``
  (everything the training loop runs in between, plus the flush), less the one-time setup
  of the first captured step (installing the API wrappers, loading the native kernel),
  which later steps do not pay.
- **bare time**, the same step without capture, taken in this order: the last uncaptured
  step before it (``start()`` to ``stop()`` of a step the selection leaves out, the same
  window), else the captured step less the time spent inside the agent (``AgentClock``:
  the API wrappers' capture work, timed per call during that step only, and ``stop()``'s
  flush; module and gradient hooks are not timed, so this bare time is an upper bound and
  the overhead a lower bound: ``bare_from`` says which).
- **bytes**: what the step's ``step<S>/rank<R>`` folder holds once the step is closed
  (op log, stacks, shards).
- **host memory**: the peak of the agent's host buffers during the step (tensor mode's
  pool of host copies, ``HostPool.peak``) plus the op log's size (the records are held in
  memory until the flush; their JSON is a lower bound of that).

Everything here is plain data and arithmetic: the Debugger takes the readings.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional


class AgentClock:
    """Time spent inside the agent during the measured step (nanoseconds).

    Set as ``DISPATCH.clock`` for that step only: every other step pays one attribute
    test per captured call."""

    def __init__(self) -> None:
        self.ns = 0

    def call(
        self,
        run: Callable[..., Any],
        orig: Callable[..., Any],
        api: str,
        inplace: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """``run(orig, ...)`` (the capture of one call), timing what it spends outside
        ``orig``: the agent's share of the call."""
        inner = 0

        def timed(*a: Any, **k: Any) -> Any:
            nonlocal inner
            t = time.perf_counter_ns()
            try:
                return orig(*a, **k)
            finally:
                inner += time.perf_counter_ns() - t

        t0 = time.perf_counter_ns()
        try:
            return run(timed, api, inplace, args, kwargs)
        finally:
            self.ns += time.perf_counter_ns() - t0 - inner


class FullCollections:
    """Time of the garbage collector's full (generation 2) collections while it is on.

    The first captured step allocates what later steps reuse (a wrapper per hooked API,
    formatted stacks, host buffers), which often sets off a full collection inside it: on
    the transformers model that was 230 ms of a 40 ms step. Full collections come every
    ten or more younger ones, not every step, so that time is taken as one-time setup."""

    def __init__(self) -> None:
        self.ns = 0
        self._t = 0

    def __enter__(self) -> FullCollections:
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._note in gc.callbacks:
            gc.callbacks.remove(self._note)

    def _note(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._t = time.perf_counter_ns()
        elif self._t:
            self.ns += time.perf_counter_ns() - self._t
            self._t = 0


@dataclass(frozen=True)
class Reading:
    """What was measured of one captured step on one rank."""

    step: int
    rank: int
    step_s: float
    setup_s: float
    bare_s: Optional[float]
    agent_s: float
    nbytes: int
    host_bytes: int


@dataclass(frozen=True)
class Selected:
    """How many steps and ranks the configuration selects (None: open-ended)."""

    steps: Optional[int]
    ranks: Optional[int]


def selected(
    steps: Optional[frozenset[int]], ranks: Optional[frozenset[int]], world: int
) -> Selected:
    """Steps and ranks that will be captured: the configuration's lists; all ranks are the
    job's world size; all steps are open-ended."""
    return Selected(
        steps=len(steps) if steps is not None else None,
        ranks=len(ranks) if ranks is not None else world,
    )


def forecast(r: Reading, sel: Selected) -> dict[str, Any]:
    """The manifest's ``forecast`` object (docs/format.md)."""
    per_step = r.step_s - r.setup_s
    notes = []
    if r.bare_s is not None and r.bare_s > 0:
        bare, bare_from = r.bare_s, "uncaptured_step"
        # One-time costs measured on other threads may overlap the step: a captured step
        # is never taken for less than the bare one.
        per_step = max(per_step, min(bare, r.step_s))
    else:
        if per_step <= 0:
            # Those costs outweighed the whole step, and no bare step bounds it: the
            # step's own time, setup included, is the estimate (an upper bound).
            per_step = r.step_s
            notes.append(
                "one-time setup on other threads overlapped the measured step: its time "
                "per step is the whole step's, setup included (an upper bound)"
            )
        bare, bare_from = max(per_step - r.agent_s, 1e-9), "agent_time"
    out: dict[str, Any] = {
        "measured_on_step": r.step,
        "rank": r.rank,
        "time_per_step_s": round(per_step, 6),
        "bare_step_s": round(bare, 6),
        "bare_from": bare_from,
        "overhead": round(per_step / bare, 3),
        "setup_s": round(r.setup_s, 6),
        "bytes_per_step": r.nbytes,
        "host_memory_bytes": r.host_bytes,
        "steps": sel.steps,
        "ranks": sel.ranks,
    }
    if sel.steps is not None and sel.ranks is not None:
        out["bytes_total"] = r.nbytes * sel.steps * sel.ranks
        out["time_total_s"] = round(per_step * sel.steps, 3)
    else:
        out["bytes_total"] = None
        notes.append("steps is open-ended: per-step figures only")
    dirty = dirty_limit()
    # (open-ended: the next ten steps)
    horizon = sel.steps if sel.steps is not None else 10
    if dirty is not None and r.nbytes * horizon > dirty:
        notes.append(
            f"a rank writes {human_bytes(r.nbytes)} a step and the page cache holds about "
            f"{human_bytes(dirty)} before writes wait for the disk: later steps may be "
            "slower, bound by the disk's write speed"
        )
    if notes:
        out["note"] = "; ".join(notes)
    return out


def dirty_limit() -> Optional[int]:
    """Bytes of written data the kernel holds in the page cache before writers wait for
    the disk (Linux: ``vm.dirty_bytes``, else ``vm.dirty_ratio`` % of available memory);
    None where unknown."""
    try:
        with open("/proc/sys/vm/dirty_bytes", encoding="ascii") as fh:
            fixed = int(fh.read().strip() or 0)
        if fixed > 0:
            return fixed
        with open("/proc/sys/vm/dirty_ratio", encoding="ascii") as fh:
            ratio = int(fh.read().strip())
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 * ratio // 100
    except (OSError, ValueError, IndexError):
        return None
    return None


def describe(f: dict[str, Any]) -> str:
    """One readable line for the log."""
    total = (
        f"{human_bytes(f['bytes_total'])} for {f['steps']} steps x {f['ranks']} ranks"
        if f.get("bytes_total") is not None
        else "steps open-ended"
    )
    return (
        f"probe: forecast from step {f['measured_on_step']} (rank {f['rank']}): "
        f"{f['time_per_step_s']:.3f} s per captured step ({f['overhead']:.2f}x bare, "
        f"bare from {f['bare_from'].replace('_', ' ')}), "
        f"{human_bytes(f['bytes_per_step'])} per step and rank, {total}, "
        f"host memory {human_bytes(f['host_memory_bytes'])}"
        + (f" ({f['note']})" if f.get("note") else "")
    )


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"  # pragma: no cover - the loop returns


def over_budget(
    f: dict[str, Any], max_bytes: Optional[int], max_overhead: Optional[float]
) -> list[str]:
    """The budgets the forecast exceeds, each as a readable clause."""
    out: list[str] = []
    total = f.get("bytes_total")
    if max_bytes is not None and total is not None and total > max_bytes:
        out.append(f"max_bytes: {human_bytes(total)} forecast > {human_bytes(max_bytes)}")
    if max_overhead is not None and f["overhead"] > max_overhead:
        out.append(f"max_overhead: {f['overhead']:.2f}x forecast > {max_overhead:g}x")
    return out


def folder_bytes(path: str) -> int:
    """Bytes of the regular files in ``path`` (0 when it does not exist: a lazy folder no
    op reached)."""
    total = 0
    try:
        with os.scandir(path) as it:
            for e in it:
                if e.is_file(follow_symlinks=False):
                    total += e.stat(follow_symlinks=False).st_size
    except FileNotFoundError:
        return 0
    return total
