"""Call stacks of captured ops: ``stacks.jsonl``, one line per distinct Python stack.

Finding the line of user code that made a diverging op is the point of a dump, but a
stack is looked up once per captured op, so the lookup must be cheap: the key is the chain
of ``(id(code), f_lasti)`` of the caller's frames, a flat tuple of ints (hashing code
objects themselves rehashes their constants every time), and frames are formatted (line
numbers, source lines) once per distinct stack for the Debugger's lifetime, not per step.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time
from types import CodeType, FrameType
from typing import Any, Optional

import torch

from .writer import RankFolder

# Frames inside the agent (the probe package) and torch are left out of stacks.
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_CACHE_MAX = 1 << 16


#: Frames of code that can be suspended and resumed by another caller: the chain above
#: such a frame is not fixed while it lives.
_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


class StackTable:
    """Stack ids for the open folder, with frames formatted once per distinct stack.

    Consecutive ops are mostly called from the same function (a model's forward, the
    optimizer's loop): the frames above the caller's are then the same, so their part of
    the key is kept with the caller's parent frame and only the two innermost frames are
    read again (a 15-frame walk was the largest part of a stack's cost). The parent is held
    by reference, so that nothing else can take its identity: while the same frame object
    is the parent, it has been running all along (resumable frames are never kept), so
    every frame above it, and where each is in its code, is unchanged.
    """

    def __init__(self) -> None:
        # Code objects and JSON ``frames`` array by stack key, kept across steps.
        self._cache: dict[tuple[int, ...], tuple[tuple[CodeType, ...], str]] = {}
        #: A compiled graph's stacks (formatted frames) as their JSON array, across steps.
        self._graph_json: dict[tuple[str, ...], str] = {}
        #: The last caller's parent frame, its code's id, and the key of the frames above it.
        self._parent: Optional[FrameType] = None
        self._parent_code = 0
        self._above: tuple[int, ...] = ()
        #: Time spent formatting stacks not in the cache: the first captured step pays it
        #: for its every call site, later steps find them formatted (forecast.py).
        self.miss_ns = 0

    def release(self) -> None:
        """Let go of the parent frame kept (at ``stop()``: its locals are the user's)."""
        self._parent = None

    def stack_id(self, folder: Optional[RankFolder], ours: int = 1) -> Optional[int]:
        """Id of the caller's Python stack in the folder's stacks.jsonl (written when new);
        None without a folder.

        ``ours``: how many frames above this one are the agent's for certain (the API path
        passes its wrapper, dispatch, call and input frames): they are stepped over without
        being made into frame objects, which Python creates on first access for each
        frame a walk touches (~0.5 us each, every call, as those frames are new each time).

        Ids in keys are safe because the cache and the folder keep every code object of
        their keys alive, so no id can be reused by another code object while a key naming
        it exists.
        """
        if folder is None:
            return None
        f: Optional[FrameType] = sys._getframe(ours + 1)
        while f is not None and f.f_code.co_filename.startswith(_PKG_DIR):
            f = f.f_back
        if f is None:
            k: tuple[int, ...] = ()
        else:
            parent = f.f_back
            if parent is None:
                k = (id(f.f_code), f.f_lasti)
            else:
                if parent is not self._parent:
                    key: list[int] = []
                    add = key.append
                    g = parent.f_back
                    while g is not None:
                        add(id(g.f_code))
                        add(g.f_lasti)  # cheap; the line number is derived only for new stacks
                        g = g.f_back
                    resumable = parent.f_code.co_flags & _RESUMABLE
                    self._parent = None if resumable else parent
                    self._parent_code = id(parent.f_code)
                    self._above = tuple(key)
                # (code, position) of each frame, innermost first.
                k = (id(f.f_code), f.f_lasti, self._parent_code, parent.f_lasti) + self._above
        sid = folder.stack_ids.get(k)
        if sid is None:
            sid = len(folder.stack_ids)
            folder.stack_ids[k] = sid
            codes, text = self._frames(k, f)
            folder.stack_codes.append(codes)  # the key's ids stay valid while the folder is
            folder.write_stack_json(sid, text)
        return sid

    def frames_id(self, folder: RankFolder, frames: tuple[str, ...]) -> int:
        """Id of a stack given as its formatted frames (a compiled graph's node: the stack
        Dynamo traced), written when new. Keyed apart from live stacks' keys (a string in
        the key, never in theirs)."""
        k: Any = ("graph", frames)
        sid = folder.stack_ids.get(k)
        if sid is None:
            sid = len(folder.stack_ids)
            folder.stack_ids[k] = sid
            cache = self._graph_json
            text = cache.get(frames)
            if text is None:
                if len(cache) >= _CACHE_MAX:
                    cache.clear()
                text = cache[frames] = json.dumps(list(frames))
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
        t0 = time.perf_counter_ns()
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
        self.miss_ns += time.perf_counter_ns() - t0
        return hit
