"""Call stacks of captured ops: ``stacks.jsonl``, one line per distinct Python stack.

Finding the line of user code that made a diverging op is the point of a dump, but a
stack is looked up once per captured op, so the lookup must be cheap: the key is the chain
of ``(id(code), f_lasti)`` of the caller's frames, a flat tuple of ints (hashing code
objects themselves rehashes their constants every time), and frames are formatted (line
numbers, source lines) once per distinct stack for the Debugger's lifetime, not per step.
"""

from __future__ import annotations

import json
import os
import sys
from types import CodeType, FrameType
from typing import Optional

import torch

from .writer import RankFolder

# Frames inside the agent (the probe package) and torch are left out of stacks.
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_CACHE_MAX = 1 << 16


class StackTable:
    """Stack ids for the open folder, with frames formatted once per distinct stack."""

    def __init__(self) -> None:
        # Code objects and JSON ``frames`` array by stack key, kept across steps.
        self._cache: dict[tuple[int, ...], tuple[tuple[CodeType, ...], str]] = {}

    def stack_id(self, folder: Optional[RankFolder]) -> Optional[int]:
        """Id of the caller's Python stack in the folder's stacks.jsonl (written when new);
        None without a folder.

        Ids in keys are safe because the cache and the folder keep every code object of
        their keys alive, so no id can be reused by another code object while a key naming
        it exists.
        """
        if folder is None:
            return None
        f: Optional[FrameType] = sys._getframe(1)
        while f is not None and f.f_code.co_filename.startswith(_PKG_DIR):
            f = f.f_back
        key: list[int] = []
        add = key.append
        g = f
        while g is not None:
            add(id(g.f_code))
            add(g.f_lasti)  # cheap; the line number is derived only for new stacks
            g = g.f_back
        k = tuple(key)
        sid = folder.stack_ids.get(k)
        if sid is None:
            sid = len(folder.stack_ids)
            folder.stack_ids[k] = sid
            codes, text = self._frames(k, f)
            folder.stack_codes.append(codes)  # the key's ids stay valid while the folder is
            folder.write_stack_json(sid, text)
        return sid

    def _frames(
        self, k: tuple[int, ...], f: Optional[FrameType]
    ) -> tuple[tuple[CodeType, ...], str]:
        """The code objects of stack key ``k`` (innermost frame ``f``) and its JSON
        ``frames`` array, formatted once per Debugger."""
        cache = self._cache
        hit = cache.get(k)
        if hit is not None:
            return hit
        import linecache

        codes = []
        lines = []
        g = f
        while g is not None:
            codes.append(g.f_code)
            lines.append((g.f_code, g.f_lineno))
            g = g.f_back
        frames = []
        for code, line in reversed(lines):
            fn = code.co_filename
            if fn.startswith(_TORCH_DIR) or fn.startswith(_PKG_DIR):
                continue
            src = linecache.getline(fn, line).strip()
            frames.append(f'File "{fn}", line {line}, in {code.co_name}: {src}')
        if len(cache) >= _CACHE_MAX:
            # Bounded for programs that keep creating code (exec, codegen). The open
            # folder's keys stay valid: RankFolder keeps their code objects alive too.
            cache.clear()
        hit = (tuple(codes), json.dumps(frames))
        cache[k] = hit
        return hit
