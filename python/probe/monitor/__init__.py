"""Monitor mode: a few norms per module and step, for every step of a run (docs/monitor.md).

``probe.Monitor`` (monitor.py) hooks the model and the optimizer; norms.py computes on the
device; table.py lays the numbers out as the monitor file's columns; arrow_ipc.py encodes
them as an Arrow IPC stream without pyarrow.
"""

from __future__ import annotations

from .monitor import Monitor

__all__ = ["Monitor"]
