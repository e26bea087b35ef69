"""Text from a dump made safe for a terminal (a leaf: it imports nothing, not even torch,
so that the command can word its errors where PyTorch is missing)."""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` without control characters (escaped as ``\\xNN``): op keys and paths come
    from files and are data, never terminal commands."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
