"""The monitor file of one rank (docs/monitor.md): its columns, and one record batch per step.

Why a file of its own: the columns are the contract with the ``probe`` command's reader, so
they are spelled out once, here, next to the code that writes them; the Monitor hands over
a step's values as host arrays and never sees Arrow.

Crash safety: the schema, the module dictionary and the first step go out in one
``os.write``, and every later step in one more, so a killed process leaves whole steps (the
step being written may be cut short: readers stop there).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .arrow_ipc import (
    DICT_UTF8,
    END_OF_STREAM,
    FLOAT32,
    FLOAT64,
    INT32,
    Column,
    dictionary_message,
    record_batch_message,
    schema_message,
)

#: The metadata key of the schema that holds the file's JSON description.
METADATA_KEY = "probe.monitor"
FORMAT_VERSION = 1

#: The root row's scalars (float64, null on other rows).
SCALARS = ("loss", "loss_scale", "lr")
#: The per-module metrics every file has (float32), in column order.
METRICS = (
    "output_norm",
    "output_nonfinite",
    "grad_norm",
    "grad_nonfinite",
    "param_norm",
    "update_norm",
)


def columns(state_keys: list[str]) -> list[Column]:
    """The file's columns: step, module, order, the root scalars, the metrics, then one
    ``state_<key>_norm`` per optimizer state key."""
    cols = [
        Column("step", INT32, False),
        Column("module", DICT_UTF8, False),
        Column("order", INT32),
    ]
    cols += [Column(name, FLOAT64) for name in SCALARS]
    cols += [Column(name, FLOAT32) for name in METRICS]
    cols += [Column(f"state_{key}_norm", FLOAT32) for key in state_keys]
    return cols


@dataclass
class StepRows:
    """One step's values on the host, one entry per module (root first).

    ``metrics`` maps a metric column name to (values, valid mask); ``scalars`` maps a root
    scalar to its value (None: null)."""

    step: int
    order: np.ndarray  # int32, -1: not called
    scalars: dict[str, Optional[float]] = field(default_factory=dict)
    metrics: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


class MonitorFile:
    """``DIR/rank<R>.arrows``, written step by step (see the module docstring)."""

    def __init__(self, folder: str, rank: int, modules: list[str], metadata: str) -> None:
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, f"rank{rank}.arrows")
        self.modules = modules
        self.metadata = metadata
        self.columns: Optional[list[Column]] = None
        self._header = b""
        #: Per-step constants: module ids, the root-only mask, zeros, the all-null mask.
        self._constant: Optional[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = None
        self._fd: Optional[int] = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    @property
    def started(self) -> bool:
        """Whether the schema is fixed (the state keys are known)."""
        return self.columns is not None

    def start(self, state_keys: list[str]) -> None:
        """Fix the schema; it goes out with the first step."""
        self.columns = columns(state_keys)
        self._header = schema_message(self.columns, {METADATA_KEY: self.metadata})
        self._header += dictionary_message(self.modules)

    def encode(self, rows: StepRows) -> bytes:
        """One step as a record batch message."""
        assert self.columns is not None
        n = len(self.modules)
        if self._constant is None:
            self._constant = (np.arange(n), np.arange(n) == 0, np.zeros(n), np.zeros(n, bool))
        module, root, zeros, none = self._constant
        values: list[np.ndarray] = [np.full(n, rows.step), module, rows.order]
        valid: list[Optional[np.ndarray]] = [None, None, rows.order >= 0]
        for name in SCALARS:
            v = rows.scalars.get(name)
            if v is None:
                values.append(zeros)
                valid.append(none)
            else:
                col = zeros.copy()
                col[0] = v
                values.append(col)
                valid.append(root)
        for col_ in self.columns[len(values) :]:
            got = rows.metrics.get(col_.name)
            if got is None:
                values.append(zeros)
                valid.append(none)
            else:
                values.append(got[0])
                valid.append(got[1])
        return record_batch_message(self.columns, n, values, valid)

    def write(self, steps: list[StepRows]) -> None:
        """Append ``steps`` (with the header before the first) in one write."""
        if self._fd is None:
            return
        data = self._header + b"".join(self.encode(r) for r in steps)
        self._header = b""
        self._write(data)

    def _write(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:  # a regular file takes it whole; a short write only when the disk fills
            done = os.write(self._fd, view)
            view = view[done:]

    def close(self) -> None:
        """Write the end-of-stream marker (after the header, if no step came) and close."""
        if self._fd is None:
            return
        try:
            if self.columns is None:
                self.start([])
            self._write(self._header + END_OF_STREAM)
            self._header = b""
        finally:
            os.close(self._fd)
            self._fd = None
