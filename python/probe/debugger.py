"""The capture agent: ``Debugger`` hooks PyTorch and writes a probe dump (docs/format.md).

Design rules, in order of priority:

1. Never break training. Every entry point from PyTorch into the agent (API wrappers,
   module hooks, autograd hooks) runs agent code inside ``try``; the first exception is
   logged once with its context and capture is switched off for the rest of the run.
2. Cost nothing when not capturing: wrappers and hooks are only installed between
   ``start()`` and ``stop()`` of a selected step on a selected rank.
3. Cost little when capturing: statistics stay on the device until one transfer per op,
   tensors go to a background writer, the op log is appended.
"""

from __future__ import annotations

import atexit
import datetime
import json
import logging
import os
import sys
import threading
import warnings
import weakref
from typing import Any, Callable, Optional, Union

import torch

from ._runtime import current_rank, model_device
from ._version import __version__
from .config import (
    CaptureConfig,
    load_config,
    module_candidates,
    module_path_match,
    op_candidates,
    pattern_match,
)
from .hooks import DISPATCH, PATCHER, tls
from .stats import (
    STORABLE,
    checksum,
    dtype_name,
    finish_stats,
    host_copy,
    null_stats,
    stat_vector,
)
from .writer import RankFolder, TensorWriter, atomic_write_text

log = logging.getLogger("probe")

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_graph_task_id: Optional[Callable[[], int]] = getattr(torch._C, "_current_graph_task_id", None)
_PRIMITIVES = (int, float, bool, str)
_STACK_CACHE_MAX = 1 << 16
_STRIDED = torch.strided
# Bound before any wrapper exists: the agent's own calls skip the API wrappers.
_stack = torch.stack
_view_as = torch.Tensor.view_as


class _Op:
    """One record being built: tensor records plus their on-device stat vectors."""

    __slots__ = (
        "key",
        "kind",
        "direction",
        "module",
        "stack",
        "recompute",
        "recs",
        "vecs",
        "tensors",
        "args",
        "expect",
        "got",
        "done",
        "folder",
    )

    def __init__(self, key: str, kind: str, direction: str, module: Optional[str]) -> None:
        self.key = key
        self.kind = kind
        self.direction = direction
        self.module = module
        self.stack: Optional[int] = None
        self.recompute = False
        self.recs: list[dict[str, Any]] = []
        self.vecs: list[Optional[list[torch.Tensor]]] = []
        self.tensors: list[Optional[torch.Tensor]] = []
        self.args: Optional[dict[str, Any]] = None
        self.expect = 0
        self.got = 0
        self.done = False
        self.folder: Optional[RankFolder] = None


def _walk(obj: Any, prefix: str, fn: Callable[[str, torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn(name, tensor)`` to every tensor in nested lists/tuples/dicts.

    Returns the structure rebuilt with ``fn``'s results, which is how inputs are swapped
    for autograd aliases. Names follow msprobe: list items ``.i``, dict items ``.key``.
    """
    if isinstance(obj, torch.Tensor):
        return fn(prefix, obj)
    t = type(obj)
    if t is tuple or t is list:
        return t([_walk(v, f"{prefix}.{i}", fn) for i, v in enumerate(obj)])
    if t is dict:
        return {k: _walk(v, f"{prefix}.{k}", fn) for k, v in obj.items()}
    return obj


def _json_arg(v: Any) -> Any:
    """A JSON-safe rendering of a non-tensor argument, or None to leave it out."""
    if isinstance(v, _PRIMITIVES):
        if isinstance(v, float) and v != v or v in (float("inf"), float("-inf")):
            return str(v)
        return v
    if isinstance(v, (torch.dtype, torch.device)):
        return str(v)
    if type(v) in (tuple, list) and len(v) <= 8 and all(isinstance(x, _PRIMITIVES) for x in v):
        return list(v)
    return None


def seed_all(seed: int = 1234, deterministic: bool = True) -> None:
    """Seed python, numpy, torch (CPU, CUDA, NPU) and ask for deterministic kernels.

    A benchmark/comparison pair is only meaningful when both runs start from the same
    weights and data and take the same kernel choices.
    """
    import random

    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    npu = getattr(torch, "npu", None)
    if npu is not None:
        try:
            npu.manual_seed_all(seed)
        except Exception:  # noqa: BLE001 - torch_npu missing or no device
            pass
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


class Debugger:
    """Capture agent. Typical use::

        dbg = probe.Debugger("probe.json")      # or Debugger(None, dump_path=..., level=...)
        for batch in data:
            dbg.start(model)                    # model needed for module/mix level
            loss = model(batch).sum(); loss.backward(); opt.step()
            dbg.stop()
            dbg.step()

    or ``with dbg: ...`` per step (start on enter; stop and step on exit).
    """

    def __init__(
        self,
        config: Union[str, os.PathLike[str], dict[str, Any], None] = None,
        model: Optional[torch.nn.Module] = None,
        **overrides: Any,
    ) -> None:
        self.config: CaptureConfig = load_config(config, overrides)
        self.model = model
        self.current_step = 0
        self._failed = False
        self._running = False
        self._lock = threading.RLock()
        self._patcher = PATCHER
        self._writer: Optional[TensorWriter] = None
        self._folder: Optional[RankFolder] = None
        self._manifest_done = False
        self._counters: dict[str, int] = {}
        self._mod_counters: dict[str, int] = {}
        self._ids: dict[int, tuple[Any, int, int, Optional[dict[str, Any]]]] = {}
        self._by_storage: dict[int, tuple[Any, int, int, None]] = {}
        self._pending_bwd: list[_Op] = []
        self._pgrads: dict[str, dict[str, tuple[torch.Tensor, Any]]] = {}
        self._pgrad_meta: dict[str, tuple[str, dict[str, torch.nn.Parameter]]] = {}
        self._handles: list[Any] = []
        self._mod_stack: list[str] = []
        self._mod_ctx: list[Optional[_Op]] = []
        self._scope_state = 0
        self._session = 0
        # Formatted stacks by frame key, kept across steps (see _stack_id).
        self._stack_cache: dict[tuple[int, ...], tuple[tuple[Any, ...], str]] = {}
        atexit.register(_close_at_exit, weakref.ref(self))
        c = self.config
        self._filtered = bool(
            c.include or c.exclude or c.include_modules or c.exclude_modules or c.scope
        )

    # ------------------------------------------------------------------ public API

    def start(self, model: Optional[torch.nn.Module] = None) -> None:
        """Begin capturing the current step (no-op if the step or rank is not selected)."""
        if model is not None:
            self.model = model
        if self._failed or self._running:
            return
        if DISPATCH.current is not None and DISPATCH.current is not self:
            warnings.warn(
                "probe: another Debugger is capturing; this start() is ignored",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        c = self.config
        if c.steps is not None and self.current_step not in c.steps:
            return
        rank = current_rank()
        if c.ranks is not None and rank not in c.ranks:
            return
        try:
            self._open(rank)
            self._session += 1
            self._mod_stack.clear()
            self._mod_ctx.clear()
            if c.api:
                self._patcher.install()
            if self.model is not None:
                self._install_module_hooks(self.model)
            self._running = True
            DISPATCH.current = self
            tls.active = self._api_on
        except Exception as exc:  # noqa: BLE001 - unwritable path, odd model...
            self._fail(exc, "start()")

    def stop(self) -> None:
        """Stop capturing; the dump of this step is complete on disk when this returns."""
        if not self._running:
            return
        tls.active = False
        self._running = False
        if DISPATCH.current is self:
            DISPATCH.current = None
        try:
            steps = self.config.steps
            if steps is not None and self.current_step + 1 not in steps:
                # Wrappers stay installed (inert: one thread-local test per call) only
                # while the next step is captured too; reinstalling costs milliseconds.
                self._patcher.uninstall()
            self._remove_module_hooks()
            with self._lock:
                for op in self._pending_bwd:
                    if not op.done and op.got:
                        self._finish(op)
                self._pending_bwd.clear()
                self._emit_param_grads()
            self._sync_files()
        except Exception as exc:  # noqa: BLE001
            self._fail(exc, "stop()")

    def step(self) -> None:
        """Advance the step counter (``step<S>`` folder); closes this step's files."""
        if self._running:
            self.stop()
        if self._folder is not None:
            try:
                self._folder.close()
            except Exception as exc:  # noqa: BLE001
                self._fail(exc, "step()")
            self._folder = None
        self.current_step += 1
        self._counters.clear()
        self._mod_counters.clear()
        self._ids.clear()
        self._by_storage.clear()
        self._scope_state = 0

    def close(self) -> None:
        """Stop, remove every hook and close all files (also done at interpreter exit)."""
        self.stop()
        try:
            if DISPATCH.current is None:
                self._patcher.uninstall()
        except Exception:  # noqa: BLE001
            pass
        if self._folder is not None:
            try:
                self._folder.close()
            except Exception:  # noqa: BLE001
                pass
            self._folder = None

    @property
    def _api_on(self) -> bool:
        """Whether API wrappers should capture on this thread right now."""
        return self._running and self.config.api

    @property
    def enabled(self) -> bool:
        """False once an internal error switched capture off for the rest of the run."""
        return not self._failed

    def __enter__(self) -> "Debugger":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        self.step()

    # ------------------------------------------------------------------ failure handling

    def _fail(self, exc: BaseException, context: str) -> None:
        """Log once, switch capture off for good, leave training untouched."""
        tls.active = False
        self._running = False
        if DISPATCH.current is self:
            DISPATCH.current = None
        first = not self._failed
        self._failed = True
        if first:
            log.error(
                "probe: internal error in %s at step %d; capture is disabled for the rest "
                "of the run, training continues: %r",
                context,
                self.current_step,
                exc,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
            warnings.warn(
                f"probe: capture disabled after an internal error in {context}: {exc!r}",
                RuntimeWarning,
                stacklevel=2,
            )
        try:
            self._patcher.uninstall()
            self._remove_module_hooks()
        except Exception:  # noqa: BLE001
            pass
        try:
            if self._folder is not None:
                self._folder.flush()
        except Exception:  # noqa: BLE001
            pass

    # ------------------------------------------------------------------ files

    def _open(self, rank: int) -> None:
        c = self.config
        if not self._manifest_done:
            os.makedirs(c.dump_path, exist_ok=True)
            self._write_manifest()
            self._manifest_done = True
        if self._folder is None:
            path = os.path.join(c.dump_path, f"step{self.current_step}", f"rank{rank}")
            self._folder = RankFolder(path, c.shard_bytes)
        if c.mode == "tensor" and self._writer is None:
            self._writer = TensorWriter(c.queue_size, _writer_thread_init)

    def _write_manifest(self) -> None:
        c = self.config
        device = model_device(c.device, self.model)
        manifest = {
            "format": "probe-dump",
            "version": 1,
            "framework": "pytorch",
            "framework_version": torch.__version__.split("+")[0],
            "device": device,
            "mode": c.mode,
            "level": c.level,
            "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "producer": f"probe-agent {__version__}",
            "config": json.loads(json.dumps(c.raw, default=str)),
        }
        atomic_write_text(
            os.path.join(c.dump_path, "manifest.json"), json.dumps(manifest, indent=2) + "\n"
        )

    def _sync_files(self) -> None:
        folder = self._folder
        if folder is None:
            return
        if self._writer is not None:
            shard = folder.take_open_shard()
            if shard is not None:
                self._writer.close_shard(os.path.join(folder.path, shard))
            self._writer.sync()
            if self._writer.error is not None:
                raise OSError(f"writing tensors to {folder.path}: {self._writer.error!r}")
        folder.flush()

    # ------------------------------------------------------------------ selection

    def _selected(self, names: tuple[str, ...], module_path: Optional[str]) -> bool:
        c = self.config
        if c.scope is not None:
            first, last = c.scope
            if self._scope_state == 0:
                if not pattern_match((first,), names):
                    return False
                self._scope_state = 1
            if self._scope_state == 2:
                return False
            if last is not None and pattern_match((last,), names):
                self._scope_state = 2
        return self._filters_ok(names, module_path)

    def _filters_ok(self, names: tuple[str, ...], module_path: Optional[str]) -> bool:
        """The include/exclude filters on op names and module paths (no scope state)."""
        c = self.config
        if c.include and not pattern_match(c.include, names):
            return False
        if c.exclude and pattern_match(c.exclude, names):
            return False
        if c.include_modules and not module_path_match(c.include_modules, module_path):
            return False
        if c.exclude_modules and module_path_match(c.exclude_modules, module_path):
            return False
        return True

    # ------------------------------------------------------------------ tensors

    def _stack_id(self) -> Optional[int]:
        """Id of the current Python call stack in stacks.jsonl (deduplicated).

        Called once per captured op, so the lookup must be cheap: the key is the chain of
        ``(id(code), f_lasti)`` of the caller's frames, a flat tuple of ints (hashing code
        objects themselves rehashes their constants every time). Ids are safe because the
        formatted-stack cache and the folder keep every code object of their keys alive, so
        no id can be reused by another code object while a key naming it exists. Frames are formatted
        (line numbers, source lines) once per distinct stack for the Debugger's lifetime,
        not once per step.
        """
        folder = self._folder
        if folder is None:
            return None
        f = sys._getframe(1)
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
            codes, text = self._stack_frames(k, f)
            folder.stack_codes.append(codes)  # the key's ids stay valid while the folder is
            folder.write_stack_json(sid, text)
        return sid

    def _stack_frames(self, k: tuple[int, ...], f: Any) -> tuple[tuple[Any, ...], str]:
        """The code objects of stack key ``k`` (innermost frame ``f``) and its JSON
        ``frames`` array, formatted once per Debugger."""
        cache = self._stack_cache
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
        if len(cache) >= _STACK_CACHE_MAX:
            # Bounded for programs that keep creating code (exec, codegen). The open
            # folder's keys stay valid: RankFolder keeps their code objects alive too.
            cache.clear()
        hit = (tuple(codes), json.dumps(frames))
        cache[k] = hit
        return hit

    def _lookup_src(self, t: torch.Tensor) -> tuple[Optional[int], Optional[dict[str, Any]]]:
        """Dataflow: the id of the captured output this input value came from, if any, and
        that output's record when the input is exactly the same tensor (same object and
        version): its stats and checksum can then be reused instead of recomputed."""
        e = self._ids.get(id(t))
        if e is not None and e[0]() is t and e[2] == t._version:
            return e[1], e[3]
        try:
            e2 = self._by_storage.get(t.untyped_storage().data_ptr())
        except Exception:  # noqa: BLE001 - tensors without storage (meta, sparse)
            return None, None
        if e2 is not None and e2[0]() is not None and e2[2] == t._version:
            return e2[1], None
        return None, None

    def _register_output(self, t: torch.Tensor, rec: Optional[dict[str, Any]] = None) -> int:
        folder = self._folder
        assert folder is not None
        tid = folder.next_id
        folder.next_id += 1
        ref = weakref.ref(t)
        ver = t._version
        self._ids[id(t)] = (ref, tid, ver, rec)
        try:
            self._by_storage[t.untyped_storage().data_ptr()] = (ref, tid, ver, None)
        except Exception:  # noqa: BLE001
            pass
        return tid

    def _capture(
        self, t: torch.Tensor, counts: bool
    ) -> tuple[Optional[list[torch.Tensor]], Optional[torch.Tensor], Optional[str]]:
        """Stats vector on the device, plus a host copy (tensor mode) or checksum."""
        if t.layout is not _STRIDED or t.is_meta:
            return None, None, None
        prev = torch.is_grad_enabled()
        if prev:
            torch._C._set_grad_enabled(False)
        try:
            vec = stat_vector(t, counts)
            mode = self.config.mode
            if mode == "statistics" or t.dtype not in STORABLE:
                return vec, None, None
            if mode == "checksum":
                return vec, None, checksum(t)
            return vec, host_copy(t), None
        finally:
            if prev:
                torch._C._set_grad_enabled(True)

    def _add_tensor(
        self,
        op: _Op,
        name: str,
        role: str,
        t: torch.Tensor,
        counts: bool = False,
        pre: Optional[
            tuple[Optional[list[torch.Tensor]], Optional[torch.Tensor], Optional[str]]
        ] = None,
        same_as: Optional[dict[str, Any]] = None,
    ) -> dict[str, Any]:
        """Record one tensor: metadata now, stats as a device vector, data to the writer.

        ``same_as``: the finished record of the captured output this tensor *is* (same
        object, same version); its stats/checksum are reused, only data is stored again.
        """
        rec: dict[str, Any] = {
            "name": name,
            "role": role,
            "dtype": dtype_name(t.dtype),
            "shape": list(t.shape),
        }
        if same_as is not None and "stats" in same_as and self.config.mode != "tensor":
            rec["stats"] = same_as["stats"]
            if "checksum" in same_as:
                rec["checksum"] = same_as["checksum"]
            op.recs.append(rec)
            op.vecs.append(None)
            op.tensors.append(None)
            return rec
        if same_as is not None and "stats" in same_as:
            rec["stats"] = same_as["stats"]
            vec, host, crc = None, host_copy(t), None
        else:
            vec, host, crc = pre if pre is not None else self._capture(t, counts)
        if crc is not None:
            rec["checksum"] = crc
        if host is not None:
            folder = op.folder or self._folder
            assert folder is not None and self._writer is not None
            fname, to_close = folder.shard_for(host.numel() * host.element_size())
            rec["file"] = fname
            self._writer.put(os.path.join(folder.path, fname), name, host)
            if to_close is not None:
                self._writer.close_shard(os.path.join(folder.path, to_close))
        op.recs.append(rec)
        op.vecs.append(vec)
        op.tensors.append(t if vec is not None and len(vec) == 4 else None)
        return rec

    def _finish(self, op: _Op) -> None:
        """Bring all stats of the op to the host in one transfer and append the record."""
        op.done = True
        folder = op.folder or self._folder
        if folder is None or folder is not self._folder:
            return  # the step this op belonged to is already closed
        if op.direction == "backward" and len(op.recs) > 1:
            # Gradients arrive in autograd order; store them in name order for readers.
            order = sorted(
                range(len(op.recs)), key=lambda i: (op.recs[i]["role"], op.recs[i]["name"])
            )
            op.recs = [op.recs[i] for i in order]
            op.vecs = [op.vecs[i] for i in order]
            op.tensors = [op.tensors[i] for i in order]
        parts = [p for v in op.vecs if v is not None for p in v]
        flat: list[float] = []
        if parts:
            # The one device-to-host transfer of this op. No grad-mode switch needed: the
            # parts were made with grad off, so stack records nothing (a no_grad() context
            # here cost more than the stack itself).
            flat = _stack(parts).tolist()
        pos = 0
        for rec, vec, t in zip(op.recs, op.vecs, op.tensors):
            if vec is None:
                if "stats" not in rec:
                    rec["stats"] = null_stats()
                continue
            n = len(vec)
            rec["stats"] = finish_stats(flat[pos : pos + n], max(1, _numel(rec["shape"])), t)
            pos += n
        record: dict[str, Any] = {
            "seq": 0,
            "op": op.key,
            "kind": op.kind,
            "direction": op.direction,
            "module": op.module,
            "stack": op.stack,
            "recompute": op.recompute,
            "tensors": op.recs,
        }
        if op.args:
            record["args"] = op.args
        folder.write_op(record)
        if self._writer is not None and self._writer.error is not None:
            raise OSError(f"tensor writer failed: {self._writer.error!r}")

    # ------------------------------------------------------------------ backward

    def _watch_grad(self, bwd: _Op, node: Any, index: int, name: str, role: str) -> None:
        """Hook an autograd node so ``bwd`` receives the gradient at ``index``.

        A node pre-hook sees the gradient w.r.t. exactly the tensor version this op
        produced or consumed, which tensor hooks cannot guarantee after in-place ops.
        """
        session = self._session
        ref = weakref.ref(self)

        def hook(grad_outputs: tuple[Optional[torch.Tensor], ...]) -> None:
            dbg = ref()
            if dbg is None or dbg._failed or bwd.done or dbg._session != session:
                return None
            was = tls.active
            tls.active = False
            try:
                with dbg._lock:
                    g = grad_outputs[index] if index < len(grad_outputs) else None
                    if g is not None:
                        dbg._add_tensor(bwd, name, role, g)
                    bwd.got += 1
                    if bwd.got >= bwd.expect and not bwd.done:
                        dbg._finish(bwd)
            except Exception as exc:  # noqa: BLE001
                dbg._fail(exc, f"backward hook of {bwd.key}")
            finally:
                tls.active = was and dbg._api_on
            return None

        node.register_prehook(hook)
        bwd.expect += 1

    # ------------------------------------------------------------------ API level

    def _api_call(
        self, orig: Callable[..., Any], api: str, inplace: bool, args: tuple, kwargs: dict
    ) -> Any:
        """Run one call of a hooked API (reached only while ``tls.active``)."""
        tls.active = False
        ctx = None
        try:
            with self._lock:
                ctx = self._api_pre(api, inplace, args, kwargs)
            if ctx is not None and ctx[2] is not None:
                args, kwargs = ctx[2], ctx[3]
        except Exception as exc:  # noqa: BLE001
            self._fail(exc, f"capturing inputs of {api}")
            ctx = None
        try:
            out = orig(*args, **kwargs)
        finally:
            tls.active = self._api_on
        if ctx is None:
            return out
        tls.active = False
        try:
            with self._lock:
                out = self._api_post(ctx, args, out)
        except Exception as exc:  # noqa: BLE001
            self._fail(exc, f"capturing outputs of {api}")
        finally:
            tls.active = self._api_on
        return out

    def _api_pre(self, api: str, inplace: bool, args: tuple, kwargs: dict) -> Optional[tuple]:
        call = self._counters.get(api, 0)
        self._counters[api] = call + 1
        module = self._mod_stack[-1] if self._mod_stack else None
        if self._filtered and not self._selected(op_candidates(api, call), module):
            return None
        c = self.config
        if not inplace and kwargs.get("inplace") is True:
            inplace = True
        recompute = _graph_task_id is not None and _graph_task_id() != -1
        fwd = _Op(f"{api}.{call}.forward", "api", "forward", module)
        fwd.recompute = recompute
        fwd.folder = self._folder
        bwd: Optional[_Op] = None
        if c.backward and torch.is_grad_enabled():
            bwd = _Op(f"{api}.{call}.backward", "api", "backward", module)
            bwd.folder = self._folder
        if c.stack:
            fwd.stack = self._stack_id()
            if bwd is not None:
                bwd.stack = fwd.stack
        aliases: dict[int, torch.Tensor] = {}
        want_fwd_in = c.forward and c.inputs
        bkey = bwd.key if bwd is not None else ""

        def on_input(name: str, t: torch.Tensor) -> torch.Tensor:
            if want_fwd_in:
                src, same = self._lookup_src(t)
                rec = self._add_tensor(
                    fwd,
                    f"{fwd.key}.{name}",
                    "input",
                    t,
                    inplace and name == "input.0",
                    same_as=same,
                )
                if src is not None:
                    rec["src"] = src
            if (
                bwd is not None
                and c.outputs
                and t.requires_grad
                and t.layout == torch.strided
                and not (inplace and name == "input.0")
                and not api.startswith("Distributed.")
            ):
                alias = _view_as(t, t)
                aliases[id(alias)] = t
                self._watch_grad(bwd, alias.grad_fn, 0, f"{bkey}.output{name[5:]}", "output")
                return alias
            return t

        new_args = _walk(args, "input", on_input) if args else args
        new_kwargs = (
            {k: _walk(v, f"input.{k}", on_input) for k, v in kwargs.items()} if kwargs else kwargs
        )
        if not want_fwd_in:
            pass
        else:
            fargs: dict[str, Any] = {}
            for i, a in enumerate(args):
                if not isinstance(a, torch.Tensor):
                    j = _json_arg(a)
                    if j is not None:
                        fargs[f"input.{i}"] = j
            for k, a in kwargs.items():
                if not isinstance(a, torch.Tensor):
                    j = _json_arg(a)
                    if j is not None:
                        fargs[f"input.{k}"] = j
            fwd.args = fargs or None
        if bwd is not None and bwd.expect:
            return (fwd, bwd, tuple(new_args), new_kwargs, aliases, inplace)
        return (fwd, bwd, None, None, aliases, inplace)

    def _api_post(self, ctx: tuple, args: tuple, out: Any) -> Any:
        fwd, bwd, _, _, aliases, inplace = ctx
        c = self.config
        if aliases and isinstance(out, torch.Tensor) and id(out) in aliases:
            out = aliases[id(out)]  # identity ops (x.float() on float) return their input
        result = out
        if out is None and inplace and args and isinstance(args[0], torch.Tensor):
            out = args[0]  # __setitem__, collectives: the first argument holds the result
        want_out = c.forward and c.outputs
        bkey = bwd.key if bwd is not None else ""

        def on_output(name: str, t: torch.Tensor) -> torch.Tensor:
            if want_out:
                rec = self._add_tensor(fwd, f"{fwd.key}.{name}", "output", t)
                rec["id"] = self._register_output(t, rec)
            else:
                self._register_output(t)
            if bwd is not None and c.inputs and t.requires_grad and t.grad_fn is not None:
                self._watch_grad(bwd, t.grad_fn, t.output_nr, f"{bkey}.input{name[6:]}", "input")
            return t

        _walk(out if type(out) in (tuple, list) else (out,), "output", on_output)
        if c.forward:
            self._finish(fwd)
        if bwd is not None and bwd.expect:
            self._pending_bwd.append(bwd)
        return result

    # ------------------------------------------------------------------ module level

    def _install_module_hooks(self, model: torch.nn.Module) -> None:
        c = self.config
        track_only = not c.module
        for path, mod in model.named_modules():
            if not path:
                continue  # the root: its path would be empty; its submodules cover it
            cls = type(mod).__name__
            self._handles.append(
                mod.register_forward_pre_hook(
                    self._make_pre_hook(path, cls, track_only), with_kwargs=True
                )
            )
            self._handles.append(
                mod.register_forward_hook(
                    self._make_post_hook(path, cls, track_only), with_kwargs=True
                )
            )
            if c.module and c.backward:
                params = dict(mod.named_parameters(recurse=False))
                if params and self._filtered_module_ok(path, cls):
                    base = f"Module.{path}.{cls}"
                    self._pgrad_meta[base] = (path, params)
                    for pname, p in params.items():
                        if p.requires_grad:
                            self._handles.append(
                                p.register_post_accumulate_grad_hook(
                                    self._make_pgrad_hook(base, pname)
                                )
                            )

    def _filtered_module_ok(self, path: str, cls: str) -> bool:
        return self._filters_ok(module_candidates(path, cls, 0), path)

    def _remove_module_hooks(self) -> None:
        while self._handles:
            h = self._handles.pop()
            try:
                h.remove()
            except Exception:  # noqa: BLE001
                pass
        self._pgrad_meta.clear()

    def _make_pre_hook(self, path: str, cls: str, track_only: bool) -> Callable[..., Any]:
        def pre_hook(mod: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
            if not self._running:
                return None
            was = tls.active
            tls.active = False
            try:
                self._mod_stack.append(path)
                if track_only:
                    return None
                with self._lock:
                    op, new = self._module_pre(mod, path, cls, args, kwargs)
                self._mod_ctx.append(op)
                return new
            except Exception as exc:  # noqa: BLE001
                self._fail(exc, f"forward pre-hook of module {path}")
                return None
            finally:
                tls.active = was and self._api_on

        return pre_hook

    def _make_post_hook(self, path: str, cls: str, track_only: bool) -> Callable[..., Any]:
        def post_hook(mod: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            if not self._running:
                return None
            was = tls.active
            tls.active = False
            try:
                if self._mod_stack and self._mod_stack[-1] == path:
                    self._mod_stack.pop()
                if track_only or not self._mod_ctx:
                    return None
                op = self._mod_ctx.pop()
                if op is not None:
                    with self._lock:
                        self._module_post(op, output)
                return None
            except Exception as exc:  # noqa: BLE001
                self._fail(exc, f"forward hook of module {path}")
                return None
            finally:
                tls.active = was and self._api_on

        return post_hook

    def _module_pre(
        self, mod: torch.nn.Module, path: str, cls: str, args: tuple, kwargs: dict
    ) -> tuple[Optional[tuple[_Op, Optional[_Op]]], Any]:
        base = f"Module.{path}.{cls}"
        call = self._mod_counters.get(base, 0)
        self._mod_counters[base] = call + 1
        if self._filtered and not self._selected(module_candidates(path, cls, call), path):
            return None, None
        c = self.config
        fwd = _Op(f"{base}.forward.{call}", "module", "forward", path)
        fwd.recompute = _graph_task_id is not None and _graph_task_id() != -1
        fwd.folder = self._folder
        bwd: Optional[_Op] = None
        if c.backward and torch.is_grad_enabled():
            bwd = _Op(f"{base}.backward.{call}", "module", "backward", path)
            bwd.folder = self._folder
        if c.stack:
            fwd.stack = self._stack_id()
            if bwd is not None:
                bwd.stack = fwd.stack
        want_in = c.forward and c.inputs
        changed = False

        def on_input(name: str, t: torch.Tensor) -> torch.Tensor:
            nonlocal changed
            if want_in:
                src, same = self._lookup_src(t)
                rec = self._add_tensor(fwd, f"{fwd.key}.{name}", "input", t, True, same_as=same)
                if src is not None:
                    rec["src"] = src
            if bwd is not None and c.outputs and t.requires_grad and t.layout == torch.strided:
                alias = _view_as(t, t)
                self._watch_grad(bwd, alias.grad_fn, 0, f"{bwd.key}.output{name[5:]}", "output")
                changed = True
                return alias
            return t

        new_args = _walk(args, "input", on_input)
        new_kwargs = {k: _walk(v, f"input.{k}", on_input) for k, v in kwargs.items()}
        if c.forward:
            for pname, p in mod.named_parameters(recurse=False):
                self._add_tensor(fwd, f"{fwd.key}.parameters.{pname}", "parameter", p)
        return (fwd, bwd), ((tuple(new_args), new_kwargs) if changed else None)

    def _module_post(self, ctx: tuple[_Op, Optional[_Op]], output: Any) -> None:
        fwd, bwd = ctx
        c = self.config
        want_out = c.forward and c.outputs

        def on_output(name: str, t: torch.Tensor) -> torch.Tensor:
            if want_out:
                rec = self._add_tensor(fwd, f"{fwd.key}.{name}", "output", t)
                rec["id"] = self._register_output(t, rec)
            if bwd is not None and c.inputs and t.requires_grad and t.grad_fn is not None:
                self._watch_grad(bwd, t.grad_fn, t.output_nr, f"{bwd.key}.input{name[6:]}", "input")
            return t

        _walk(output if type(output) in (tuple, list) else (output,), "output", on_output)
        if c.forward:
            self._finish(fwd)
        if bwd is not None and bwd.expect:
            self._pending_bwd.append(bwd)

    def _make_pgrad_hook(self, base: str, pname: str) -> Callable[[torch.Tensor], None]:
        session = self._session

        def hook(p: torch.Tensor) -> None:
            if self._failed or self._session != session or p.grad is None:
                return
            was = tls.active
            tls.active = False
            try:
                with self._lock, torch.no_grad():
                    g = p.grad
                    # Keep the latest (fully accumulated) gradient's stats and data now:
                    # zero_grad() may clear it before stop() emits the record.
                    self._pgrads.setdefault(base, {})[pname] = (g, self._capture(g, True))
            except Exception as exc:  # noqa: BLE001
                self._fail(exc, f"gradient hook of {base}.{pname}")
            finally:
                tls.active = was and self._api_on

        return hook

    def _emit_param_grads(self) -> None:
        """One ``Module.{path}.{Class}.parameters_grad`` record per module with gradients."""
        if not self._pgrads:
            return
        for base, grads in self._pgrads.items():
            path = base.split(".", 1)[1].rsplit(".", 1)[0]
            op = _Op(f"{base}.parameters_grad", "parameters_grad", "backward", path)
            op.folder = self._folder
            for pname, (g, pre) in grads.items():
                self._add_tensor(op, f"{op.key}.{pname}", "parameter", g, True, pre)
            self._finish(op)
        self._pgrads.clear()


def _close_at_exit(ref: "weakref.ReferenceType[Debugger]") -> None:
    """A run that never calls stop() still leaves complete, flushed files behind."""
    dbg = ref()
    if dbg is not None:
        try:
            dbg.close()
        except Exception:  # noqa: BLE001
            pass


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _writer_thread_init() -> None:
    """The writer thread must never be captured by the wrappers (its own torch calls)."""
    tls.active = False
