"""The APIs the capture agent hooks, as data: ``probe/api_list.json`` ({ApiType: [names]}).

Why a leaf module without torch: the agent reads it to decide what it wraps
(capture/patcher.py), and the replay reads the same list to decide what it may call
(replay/allowed.py): a replay runs only what a capture could have recorded.
"""

from __future__ import annotations

import json
import os
from typing import Optional

#: The list shipped in the package.
PATH = os.path.join(os.path.dirname(__file__), "api_list.json")


def load_api_list(path: Optional[str] = None) -> dict[str, list[str]]:
    """Read the hooked API list ({ApiType: [names]}; keys starting with ``_`` are comments)."""
    with open(path or PATH, encoding="utf-8") as fh:
        data = json.load(fh)
    return {k: list(v) for k, v in data.items() if not k.startswith("_")}
