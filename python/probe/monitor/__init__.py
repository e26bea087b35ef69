"""The monitor: a few numbers per module and step, every step, for almost nothing
(docs/monitor.md). ``probe compare`` of two monitor folders names the first step where
runs part; ``probe scan`` of one names where it goes bad; both write the capture
configuration that dumps exactly that step."""

from .monitor import Monitor

__all__ = ["Monitor"]
