"""Ablations of the capture agent, for ``bench/capture_overhead.py --ablate``. Not an agent:
an ablated configuration writes wrong or incomplete dumps, on purpose.

Why: the agent's overhead per captured call is spread over many small pieces (docs/capture.md,
"tenth pass"), and a native per-call path can only pay where it takes a large share away.
Timing the agent with one part of its work replaced by a stub that does nothing, in the same
run as the whole agent, bounds what that part costs the step: what any faster
implementation of it could win at most. Each part:

- ``records``: an API call's forward record is built but never finished (no ``ops.jsonl``
  line, no statistics buffer, no write); backward and module records are written as usual.
- ``facts``: a tensor captured afresh gets a constant record and constant statistics: none of
  its facts are read (dtype, shape) and it is not reduced. A tensor whose statistics are reused
  (``Dataflow``) is recorded as usual.
- ``dataflow``: the dataflow knows no tensor: no ``src``/``id`` links beyond fresh ids, and no
  statistics reused. The step then reduces tensors the agent would have reused, so this
  measures the dataflow's bookkeeping less what its reuse saves.
- ``args``: no ``args`` of API records (their non-tensor arguments).
- ``stacks``: every record names stack 0; no stack is looked up or written.
- ``none``: nothing: the whole agent, timed as an ablated configuration is. The control: the
  bench steps its configurations in turn, and this shows what that alone does to a reading.

The stubs replace attributes of the configuration's own recorder (the Debugger's
``_recorder``: capture/recorder.py), its dataflow and stack table, and the API module's
``json_args``, from its ``start()`` to its ``stop()``, so the other configurations of the
run, taking turns with it step by step, are untouched.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Optional

#: The parts that can be left out, in the order of the module doc, and ``none``: the whole
#: agent again, as an ablation is run (a control for the order of the configurations).
PARTS = ("records", "facts", "dataflow", "args", "stacks", "none")

#: The statistics every ``facts``-ablated tensor gets.
_STATS = {"max": 0.0, "min": 0.0, "mean": 0.0, "norm": 0.0, "nan": 0, "inf": 0}

Patch = tuple[Any, str, Any]


def patches(part: str, agent: Any, dbg: Any) -> list[Patch]:
    """``(owner, attribute, stub)`` for leaving ``part`` out of Debugger ``dbg`` of the agent
    package ``agent``."""
    rec = dbg._recorder
    if part == "records":
        finish = rec.finish

        def unfinished(op: Any) -> None:
            if op.kind == "api" and op.direction == "forward":
                op.done = True
                return
            finish(op)

        return [(rec, "finish", unfinished)]
    if part == "facts":
        add = rec.add_tensor

        def constant(
            op: Any,
            name: str,
            role: str,
            t: Any,
            counts: bool = False,
            pre: Any = None,
            same_as: Any = None,
        ) -> Any:
            if pre is not None or same_as is not None:
                return add(op, name, role, t, counts, pre, same_as)
            rec = {"name": name, "role": role, "dtype": "float32", "shape": (1,)}
            op.entries.append((rec, _STATS, None))
            return rec

        return [(rec, "add_tensor", constant)]
    if part == "dataflow":
        flow = rec.flow

        def register(t: Any, folder: Any, known: Any = None, mem: Any = None) -> int:
            tid: int = folder.next_id
            folder.next_id += 1
            return tid

        return [
            (flow, "source", lambda t: (None, None, None)),
            (flow, "find", lambda t: (None, None)),
            (flow, "register", register),
            (flow, "remember", lambda t, known, mem=None: None),
            (flow, "note_write", lambda written: None),
        ]
    if part == "args":
        api = importlib.import_module(f"{agent.__name__}.capture.api")
        return [(api, "json_args", lambda args, kwargs: None)]
    if part == "stacks":
        return [(rec.stacks, "stack_id", lambda folder, ours=1: None if folder is None else 0)]
    if part == "none":
        return []
    raise ValueError(f"unknown part {part!r} (one of {', '.join(PARTS)})")


class Ablation:
    """Applies a part's stubs around one configuration's ``start()`` .. ``stop()``."""

    def __init__(self, part: str, agent: Any, dbg: Any) -> None:
        self._patches = patches(part, agent, dbg)
        self._saved: list[tuple[Any, str, Optional[Any], bool]] = []

    def apply(self) -> None:
        for owner, name, stub in self._patches:
            # An instance's method comes from its class: restored by deleting the stub.
            own = name in getattr(owner, "__dict__", {})
            self._saved.append((owner, name, getattr(owner, name) if own else None, own))
            setattr(owner, name, stub)

    def restore(self) -> None:
        for owner, name, old, own in reversed(self._saved):
            if own:
                setattr(owner, name, old)
            else:
                delattr(owner, name)
        self._saved.clear()


def wrap(
    ablation: Ablation, start: Callable[[Any], None], stop: Callable[[], None]
) -> tuple[Callable[[Any], None], Callable[[], None]]:
    """A runner's ``start`` and ``stop`` with the ablation applied in between."""

    def ablated_start(m: Any) -> None:
        ablation.apply()
        start(m)

    def ablated_stop() -> None:
        try:
            stop()
        finally:
            ablation.restore()

    return ablated_start, ablated_stop
