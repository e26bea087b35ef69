"""``python -m probe.replay``: see cli.py.

Why the folder is dropped from ``sys.path`` first: ``python -m`` puts the current folder
first on it, and the replay imports torch (and torch_npu) after this line, so a ``torch.py``
in the folder a replay runs from would run instead (issue 70). What ``import probe`` itself
imported before this file ran was looked up there too: ``probe replay`` runs the engine with
the folder off the path from the start (src/replay.rs), as does ``python -P`` (3.11+).
"""

from __future__ import annotations

import os
import sys

if not getattr(sys.flags, "safe_path", False) and sys.path[:1] in ([""], [os.getcwd()]):
    del sys.path[0]  # the entry -m added; PYTHONPATH's own entries are the user's choice

from .cli import main  # noqa: E402 - after the path is safe

if __name__ == "__main__":
    sys.exit(main())
