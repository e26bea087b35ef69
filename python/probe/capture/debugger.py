"""The capture agent's facade: ``Debugger`` hooks PyTorch and writes a probe dump
(docs/format.md); ``seed_all`` makes two runs comparable.

Design rules, in order of priority:

1. Never break training. Every entry point from PyTorch into the agent (API wrappers,
   module hooks, autograd hooks) runs agent code inside ``try``; the first exception is
   logged once with its context and capture is switched off for the rest of the run
   (probe/_guard.py).
2. Cost nothing when not capturing: wrappers and hooks are only installed between
   ``start()`` and ``stop()`` of a selected step on a selected rank.
3. Cost little when capturing: statistics stay on the device until one transfer per op,
   tensors go to a background writer, the op log is appended.

The Debugger owns the step lifecycle and the path every captured tensor takes (record ->
statistics -> writer: ``_add_tensor``, ``_capture``, ``_finish``); each kind of hook lives
in its own module (api, modules, backward) and reaches that path through the Debugger.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import torch

from .._guard import Guard
from .._runtime import current_rank
from ..config import CaptureConfig, load_config
from .api import DISPATCH, PATCHER, ApiCapture, tls
from .backward import BackwardHooks
from .buffer import Fill, StatsBuffer
from .compiled import graph_count, in_model, module_tree, unwrap
from .distributed import Collectives, DdpHooks, is_ddp
from .modules import ModuleHooks
from .records import (
    UNWRITTEN,
    Captured,
    Dataflow,
    Known,
    OpRecord,
    StatVector,
    TensorEntry,
    json_args,
    results,
    walk,
)
from .selection import Selection
from .stacks import StackTable
from .stats import (
    DTYPE_NAMES,
    PLAIN,
    STORABLE,
    any_nonfinite,
    checksum_later,
    dtensor_local,
    dtype_name,
    finish_stats,
    nested_shape,
    nonfinite_result,
    null_stats,
    stat_vector,
    use_native,
)
from .writer import DumpFiles

if TYPE_CHECKING:
    from .iterations import IterationCounter
    from .records import TensorRecord

log = logging.getLogger("probe")

_STRIDED = torch.strided
# Bound before any wrapper exists: the agent's own calls skip the API wrappers.
_clone = torch.Tensor.clone
_detach = torch.Tensor.detach


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


def _storable(t: torch.Tensor) -> bool:
    """Whether tensor mode stores ``t``'s data: a dense tensor of a dtype safetensors holds
    (sparse and nested tensors get their record and statistics only)."""
    return t.dtype in STORABLE and t.layout is _STRIDED and not t.is_nested


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
        # Overflow mode: every captured op is checked for NaN/Inf and only those that
        # produced some are recorded. What only a recorded op needs (stacks, dataflow ids,
        # non-tensor arguments, statistics, data) is then taken when it is known to be one.
        self._overflow = self.config.mode == "overflow"
        self._mode = self.config.mode
        #: Overflow mode: ops producing NaN/Inf still to record (negative: no limit).
        self._overflow_left = self.config.overflow_nums
        #: Stacks taken when an op is called (overflow mode: when it is recorded).
        self._call_stacks = self.config.stack and not self._overflow
        #: Dataflow ids (``id``/``src``): meaningless when most ops are not recorded.
        self._dataflow = not self._overflow
        #: Dynamo's compiled-graph count at ``start()``, whether compiled code has run while
        #: capturing (or the model is compiled), and whether the user was told (compiled.py).
        self._graphs = 0
        self._compiled = False
        #: What the user was told once already (:meth:`_tell_once`).
        self._told: set[str] = set()
        #: Whether this is a forked copy of the process that runs the Debugger (a DataLoader
        #: worker): it captures and writes nothing (_after_fork_in_child).
        self._child = False
        self._model: Optional[weakref.ref[torch.nn.Module]] = None
        if model is not None:
            self._take_model(model)
        self.current_step = 0
        self._running = False
        #: Whether API wrappers capture on the capturing thread now: running at api or mix
        #: level (read on every captured call, so a plain attribute kept with _running).
        self._api_on = False
        self._session = 0  # start() count: hooks of an earlier session do nothing
        self._lock = threading.RLock()
        self._guard = Guard(self._report_failure, self._switch_off)
        self._select = Selection(self.config)
        self._files = DumpFiles(self.config)
        self._stacks = StackTable()
        # A checksum is of the bytes in C order: it is shared only in the same order.
        self._flow = Dataflow(permuted=self.config.mode != "checksum")
        #: Finished records whose statistics are still on the device (buffer.py).
        self._pending = StatsBuffer()
        self._modules = ModuleHooks(self)
        self._backward = BackwardHooks(self)
        self._api = ApiCapture(self)
        #: Per-step sequence numbers of collectives (``coll_seq``), and DDP's comm hook.
        self._collectives = Collectives()
        self._ddp = DdpHooks(self)
        #: Automatic iteration counting (ApiProfiler); an explicit step() turns it off.
        self._auto: Optional[IterationCounter] = None
        self._explicit_steps = False
        #: Whether the api_list was checked against the hooked APIs / the model's modules.
        self._apis_checked = False
        self._modules_checked = False
        atexit.register(_close_at_exit, weakref.ref(self))
        _LIVE.add(self)

    # ------------------------------------------------------------------ public API

    def start(self, model: Optional[torch.nn.Module] = None) -> None:
        """Begin capturing the current step (no-op if the step or rank is not selected)."""
        if model is not None:
            self._take_model(model)
        if self._guard.failed or self._running or self._child:
            return
        self._attach_ddp()
        if DISPATCH.current is not None and DISPATCH.current is not self._api:
            warnings.warn(
                "probe: another Debugger is capturing; this start() is ignored",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        if self.config.api_list:
            try:
                self._check_api_list()
            except Exception as exc:  # noqa: BLE001 - an odd model's named_modules()
                self._guard.fail(exc, "checking the api_list")
                return
        if not self._select.step(self.current_step):
            return
        rank = current_rank()
        if not self._select.rank(rank):
            return
        try:
            use_native()  # the first time: the CPU statistics kernel (native.py)
            model = self.model
            self._files.open(self.current_step, rank, model)
            self._session += 1
            if self.config.api:
                PATCHER.install()
            self._graphs = graph_count()
            if model is not None:
                self._modules.install(model)
            self._running = True
            self._api_on = self.config.api
            DISPATCH.current = self._api
            tls.active = self._api_on
        except Exception as exc:  # noqa: BLE001 - unwritable path, odd model...
            self._guard.fail(exc, "start()")

    def stop(self) -> None:
        """Stop capturing; the dump of this step is complete on disk when this returns."""
        if not self._running:
            return
        tls.active = False
        self._running = self._api_on = False
        if DISPATCH.current is self._api:
            DISPATCH.current = None
        self._note_compiled()
        try:
            if not self._select.step(self.current_step + 1):
                # Wrappers stay installed (inert: one thread-local test per call) only
                # while the next step is captured too; reinstalling costs milliseconds.
                PATCHER.uninstall()
            self._modules.remove()
            self._stacks.release()
            self._api.waits.settle()  # (takes the lock)
            with self._lock:
                self._ddp.flush(self)
                self._backward.finish_step()
                self._flush_records()
            self._files.sync()
            if not self._select.step(self.current_step + 1):
                self._files.pool.clear()  # no host buffers held between captured steps
        except Exception as exc:  # noqa: BLE001
            self._guard.fail(exc, "stop()")

    def step(self) -> None:
        """Advance the step counter (``step<S>`` folder); closes this step's files.

        Explicit calls take precedence: the first one turns automatic iteration counting
        (ApiProfiler) off for the rest of the run, so an iteration is never counted twice;
        if the counter has just ended an iteration (no forward of the model since), this
        call is taken as that same end (iterations.py).
        """
        self._explicit_steps = True
        if self._auto is not None:
            auto, self._auto = self._auto, None
            auto.remove()
            log.info("probe: explicit step(): automatic iteration counting is off")
            if auto.fresh:
                return
        self._next_step()

    def _next_step(self) -> None:
        """What :meth:`step` does, also for the automatic iteration counter."""
        if self._child:
            return
        if self._running:
            self.stop()
        try:
            with self._lock:
                self._flush_records()  # records finished after stop() (late gradients)
            self._files.close_step()
        except Exception as exc:  # noqa: BLE001
            self._guard.fail(exc, "step()")
        self.current_step += 1
        self._select.new_step()
        self._flow.clear()
        self._collectives.new_step()

    @property
    def model(self) -> Optional[torch.nn.Module]:
        """The model hooked at module level (and for DDP's buckets), held weakly: the agent
        must not keep it alive. A Debugger held it to the end of the process, and a DDP
        model's reducer then outlived ``destroy_process_group()``: gloo aborted the process
        at exit now and then ("terminate called without an active exception"), and a job
        that had finished reported a failure."""
        ref = self._model
        return ref() if ref is not None else None

    @model.setter
    def model(self, model: Optional[torch.nn.Module]) -> None:
        self._model = weakref.ref(model) if model is not None else None

    def _take_model(self, model: torch.nn.Module) -> None:
        """The model to hook: the one a ``torch.compile`` wrapper holds, noting that it is
        compiled (compiled.py)."""
        self._compiled = self._compiled or in_model(model)
        self.model = unwrap(model)

    def _note_compiled(self) -> None:
        """At ``stop()``: whether compiled code ran in the captured step (a compiled model,
        or graphs Dynamo compiled since ``start()``, as when the model given is not the
        compiled one). Its operators are not hooked, so they are missing from the dump: the
        user is told once."""
        self._compiled = self._compiled or graph_count() > self._graphs
        if self._compiled:
            try:
                self._files.mark_compiled()
            except Exception as exc:  # noqa: BLE001 - an unwritable manifest
                self._guard.fail(exc, "stop()")
            self._tell_once(
                "compiled",
                f"probe: compiled code (torch.compile, TorchScript) ran while capturing step "
                f"{self.current_step}: the operators inside it are not hooked and are missing "
                "from the dump. Capture the run without compiling to record them.",
                stacklevel=4,  # the caller of stop()
            )

    def _note_transform(self, what: str) -> None:
        """A call inside a ``torch.func`` transform was not captured (``api.in_transform``):
        the user is told once (checked first: it is called for every such call)."""
        if "transform" not in self._told:
            self._tell_once(
                "transform",
                f"probe: {what} ran inside a torch.func transform (vmap, grad, ...) at step "
                f"{self.current_step}: calls inside transforms are not captured",
                stacklevel=5,  # the caller of the hooked API
            )

    def _tell_once(self, what: str, msg: str, stacklevel: int) -> None:
        """Log ``msg`` and warn with it, the first time something of kind ``what`` happens
        (``stacklevel``: the warning's, counted from here)."""
        if what in self._told:
            return
        self._told.add(what)
        log.warning(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=stacklevel)

    def _attach_ddp(self) -> None:
        """A DistributedDataParallel model gets the bucket-recording communication hook,
        once (distributed.py). Registering it never stops training: a failure only
        switches capture off."""
        model = self.model
        if model is None or not is_ddp(model):
            return
        try:
            self._ddp.attach(model)
        except Exception as exc:  # noqa: BLE001
            self._guard.fail(exc, "registering the DDP communication hook")

    def close(self) -> None:
        """Stop, remove every hook and close all files (also done at interpreter exit)."""
        if self._child:
            return  # the parent's files: the parent closes them
        self.stop()
        try:
            if DISPATCH.current is None:
                PATCHER.uninstall()
        except Exception:  # noqa: BLE001
            pass
        try:
            with self._lock:
                self._flush_records()
            self._files.close_step()
        except Exception:  # noqa: BLE001
            pass

    def _adopt_model(self, model: torch.nn.Module) -> None:
        """The model, found by the iteration counter at its first forward when none was
        given: module hooks from now on, as :meth:`start` installs them, and the
        api_list's module paths checked against it."""
        if self.model is not None:
            return
        self._take_model(model)
        self._attach_ddp()
        try:
            self._check_api_list()
            self._files.model_known(model)
            if self._running:
                self._modules.install(model)  # (module_tree unwraps a compiled one)
        except Exception as exc:  # noqa: BLE001
            self._guard.fail(exc, "taking the model at its first forward")

    def _check_api_list(self) -> None:
        """Report, once, the api_list entries that can select nothing (an API the agent does
        not hook, an API at module level, a module path the model lacks): a typo must not
        silently dump nothing. Module paths are checked once the model is known; a
        leading model variable name is resolved then (Selection.resolve_modules)."""
        c = self.config
        bad: list[str] = []
        if not self._apis_checked:
            self._apis_checked = True
            for e in c.api_list:
                if e.api is None:
                    continue
                if not c.api:
                    bad.append(f"{e.name} (an API: at module level only module paths select)")
                elif not PATCHER.hooks(e.api):
                    bad.append(f"{e.name} ({e.api} is not a hooked API)")
        model = self.model
        if not self._modules_checked and model is not None:
            self._modules_checked = True
            paths = {p for p, _ in module_tree(model) if p}
            for name in self._select.resolve_modules(paths):
                bad.append(f"{name} (no such module in the model)")
        if bad:
            msg = "probe: api_list entries that select nothing: " + "; ".join(bad)
            log.warning(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=3)

    @property
    def enabled(self) -> bool:
        """False once an internal error switched capture off for the rest of the run."""
        return not self._guard.failed

    def __enter__(self) -> Debugger:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.step()

    # ------------------------------------------------------------------ failure handling

    def _switch_off(self, exc: BaseException, context: str) -> None:
        """On any failure: capture off for good, every hook removed, files flushed."""
        if self._auto is not None:
            auto, self._auto = self._auto, None
            auto.remove()
        tls.active = False
        self._running = self._api_on = False
        if DISPATCH.current is self._api:
            DISPATCH.current = None
        try:
            PATCHER.uninstall()
            self._modules.remove()
            self._stacks.release()
            self._api.waits.clear()  # records of collectives not waited on yet: dropped
        except Exception:  # noqa: BLE001
            pass
        try:
            # Records finished before the failure are complete: write them, then flush.
            self._flush_records()
        except Exception:  # noqa: BLE001
            self._pending.discard()
        try:
            if self._files.folder is not None:
                self._files.folder.flush()
        except Exception:  # noqa: BLE001
            pass

    def _report_failure(self, exc: BaseException, context: str) -> None:
        """The first failure: logged with its traceback, and a warning; training continues.

        A file-system error (an unusable ``dump_path``, a full or read-only disk) is the
        environment's, not the agent's: one line naming the path, no traceback.
        """
        if isinstance(exc, OSError):
            path = exc.filename if exc.filename is not None else self.config.dump_path
            reason = exc.strerror or str(exc)
            msg = (
                f"probe: cannot write the dump at {path}: {reason}; capture disabled "
                f"for the rest of the run (step {self.current_step}), training continues"
            )
            log.error("%s", msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
            return
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
            stacklevel=3,
        )

    # ------------------------------------------------------------------ tensor -> record

    def _capture(self, t: torch.Tensor, held: bool = False) -> Captured:
        """Statistics, plus the data to store (tensor mode: ``DumpFiles.stage``; a host copy
        when ``held``, kept before it is stored) or checksum.

        Statistics read on the host (a CPU tensor's) come back as the record's finished
        ``stats`` dict; an accelerator's stay on the device until their batch is read
        (buffer.py). Grad mode is switched off only where a reduction could be recorded
        (a tensor that requires grad): the switch costs two calls per tensor."""
        nested = t.is_nested
        if nested:
            t = t.values()  # its elements, packed: their statistics, and no data stored
        if t.layout is not _STRIDED or t.is_meta:
            return None, None, None
        prev = t.requires_grad and torch.is_grad_enabled()
        if prev:
            torch._C._set_grad_enabled(False)
        try:
            vec: StatVector = stat_vector(t)
            if type(vec) is list:
                vec = finish_stats(vec, t.numel() or 1, None)  # type: ignore[assignment]
            mode = self._mode
            if mode == "statistics" or nested or t.dtype not in STORABLE:
                return vec, None, None
            if mode == "checksum":
                return vec, None, checksum_later(t, self._files.pool.copy)
            files = self._files
            return vec, files.pool.copy(t) if held else files.stage(t), None
        finally:
            if prev:
                torch._C._set_grad_enabled(True)

    def _add_tensor(
        self,
        op: OpRecord,
        name: str,
        role: str,
        t: torch.Tensor,
        counts: bool = False,
        pre: Optional[Captured] = None,
        same_as: Optional[Known] = None,
    ) -> TensorRecord:
        """Record one tensor: metadata now, stats as a device vector, data to the writer.

        ``counts``: the tensor is about to change in place (overflow mode then keeps a copy
        of it as the op saw it; the statistics take their NaN/Inf counts now in every case).
        ``pre``: what :meth:`_capture` already took of it (parameter gradients).
        ``same_as``: the record and statistics of a tensor captured before that this
        tensor *is* (same object, version and storage writes: ``Dataflow``). A finished
        record's stats/checksum are reused; an unfinished one's statistics too (a module's
        parameter met again inside it at mix level). Only data is stored again.
        A ``DTensor`` is recorded as its local shard (``dtensor_local``).
        """
        placed = None
        if type(t) not in PLAIN:
            local = dtensor_local(t)
            if local is not None:
                t, placed = local
        if self._overflow:
            # Nothing is computed until _finish knows whether the op overflowed (most do
            # not, and then write nothing; dtype and shape are filled in then); a tensor
            # about to change in place is kept as a device copy, as the value the op saw.
            if counts and pre is None:
                t = self._snapshot(t)
            rec: TensorRecord = {"name": name, "role": role, "dtype": "", "shape": ()}
            if placed is not None:
                rec["dtensor"] = placed
            op.entries.append((rec, None, t))
            return rec
        dt = t.dtype
        # The shape as a tuple, not a list: a tuple of ints leaves the garbage collector's
        # watch at its first pass, a list never does, and the records a step keeps
        # (Dataflow) live through several collections into the oldest generation, whose
        # full collections they bring on (docs/capture.md, "eighth pass").
        rec = {
            "name": name,
            "role": role,
            "dtype": DTYPE_NAMES.get(dt) or dtype_name(dt),
            "shape": tuple(t.shape) if not t.is_nested else nested_shape(t),
        }
        if placed is not None:
            rec["dtensor"] = placed
        vec: StatVector
        host: Optional[torch.Tensor]
        crc: Union[str, torch.Tensor, None]
        if same_as is None:
            vec, host, crc = pre if pre is not None else self._capture(t)
            if pre is UNWRITTEN:
                rec["unwritten"] = True
        else:
            mode = self._mode
            known, known_vec, _ = same_as
            if "unwritten" in known:  # the same memory, still not written
                rec["unwritten"] = True
                op.entries.append((rec, None, None))
                return rec
            if "stats" in known:
                rec["stats"] = known["stats"]
                if mode != "tensor":
                    if "checksum" in known:
                        rec["checksum"] = known["checksum"]
                    op.entries.append((rec, None, None))
                    return rec
                vec, host, crc = None, self._files.stage(t) if _storable(t) else None, None
            elif known_vec is not None and mode != "checksum":
                # Its record is not finished (no stats yet), its statistics are reduced.
                host = self._files.stage(t) if mode == "tensor" and _storable(t) else None
                vec, crc = known_vec, None
            else:
                vec, host, crc = pre if pre is not None else self._capture(t)
        if crc is not None:
            # A host copy stands in for the checksum until its batch lands (_finish).
            rec["checksum"] = crc  # type: ignore[typeddict-item]
        if host is not None:
            folder = op.folder or self._files.folder
            assert folder is not None
            rec["file"], rec["data_offsets"] = self._files.store(folder, name, host)
        op.entries.append((rec, vec, None))
        return rec

    @staticmethod
    def _snapshot(t: torch.Tensor) -> torch.Tensor:
        """Overflow mode: a device copy of a tensor about to change, which is all that is
        taken of it unless its op turns out to overflow."""
        if t.layout is not _STRIDED or t.is_meta or t.is_nested:
            return t
        return _clone(_detach(t))

    def keep_gradient(
        self, g: torch.Tensor, reduced: bool = False
    ) -> tuple[torch.Tensor, Captured, Optional[Known]]:
        """What a parameter-gradient hook keeps until ``stop()`` writes the record: the
        gradient and its stats/data taken now (zero_grad may clear it before), or in
        overflow mode a device copy, checked and recorded at ``stop()``.

        In statistics mode a gradient that a backward record already holds (the one
        autograd accumulated into ``.grad``) is not reduced again: the third value is what
        is known of it, for ``_add_tensor``'s ``same_as``. ``reduced``: taken again after a
        collective wrote it (DDP), which is reduced anew. A gradient reduced here is
        remembered, so that the optimizer ops reading it reuse its statistics."""
        if self._overflow:
            return self._snapshot(g), (None, None, None), None
        flow = self._flow if self._dataflow else None
        mem = None
        if flow is not None and not reduced and self.config.mode == "statistics":
            same, mem = flow.find(g)
            if same is not None and ("stats" in same[0] or same[1] is not None):
                return g, (None, None, None), same
        local = dtensor_local(g) if type(g) not in PLAIN else None
        captured = self._capture(g if local is None else local[0], held=True)
        if flow is not None and captured[0] is not None:
            # Its record is made at stop(); until then the statistics stand for it.
            record: TensorRecord = {"name": "", "role": "parameter", "dtype": "", "shape": ()}
            flow.remember(g, (record, captured[0], None), mem)
        return g, captured, None

    def _finish(self, op: OpRecord) -> None:
        """Hand the record and its tensors' statistics (still on their devices) to the stats
        buffer, which brings those of many ops to the host in one transfer and writes the
        records in order (buffer.py): no host read per op."""
        op.done = True
        folder = op.folder or self._files.folder
        if folder is None or folder is not self._files.folder:
            return  # the step this op belonged to is already closed
        if self._overflow:
            if self._overflow_left == 0 or not _produced_nonfinite(op):
                return
            self._take_overflow(op)
        entries = op.entries
        if op.direction == "backward" and len(entries) > 1:
            # Gradients arrive in autograd order; store them in name order for readers.
            entries.sort(key=lambda e: (e[0]["role"], e[0]["name"]))
        parts: list[Any] = []
        fills: list[Fill] = []
        tensors: list[TensorRecord] = []
        later: list[TensorRecord] = []  # checksums of host copies on their way
        for rec, vec, _ in entries:
            tensors.append(rec)
            crc = rec.get("checksum")
            if crc is not None and type(crc) is not str:
                later.append(rec)
            if type(vec) is dict:
                # Read on the host already (a CPU tensor's): in place now, last, so that
                # the key order is the dump's.
                rec["stats"] = vec  # type: ignore[typeddict-item]
                continue
            if vec is None:
                if "stats" not in rec:
                    # Leftover bytes have no statistics, not even NaN/Inf counts.
                    rec["stats"] = None if "unwritten" in rec else null_stats()
                continue
            # In place now, so that the key order is the dump's, and so that an input
            # reusing this output's stats shares them. Filled when the buffer reads the
            # numbers: a vector is concatenated with the rest of its batch's, a slab slot
            # read from its slab (buffer.py). No grad-mode switch needed there: vectors
            # were made with grad off, so cat records nothing.
            stats: Any = {}
            rec["stats"] = stats
            numel = max(1, _numel(rec["shape"]))
            parts.append(vec)
            if isinstance(vec, tuple):  # a slot of a fused slab
                fills.append((stats, 6, numel, vec[0].device))
            else:
                assert isinstance(vec, torch.Tensor)
                fills.append((stats, vec.shape[0], numel, vec.device))
        self._pending.add(folder, op.to_json(tensors), fills, parts, later)
        self._files.push(full_only=True)
        self._files.check()

    def _flush_records(self) -> None:
        """Write every finished record (at ``stop()``: the step's op log is complete)."""
        self._pending.flush(wait=True)

    def _take_overflow(self, op: OpRecord) -> None:
        """Overflow mode: capture an op that produced NaN/Inf as tensor mode would (stats
        and data of every tensor it kept), and count it against ``overflow_nums``; the last
        one allowed ends capture for the rest of the run."""
        folder = op.folder
        assert folder is not None
        c = self.config
        if op.call_args is not None:
            # An API forward call: its tensors are recorded now, the inputs first.
            args, kwargs = op.call_args
            key = op.key

            def add(role: str) -> Callable[[str, torch.Tensor], torch.Tensor]:
                def fn(name: str, t: torch.Tensor) -> torch.Tensor:
                    self._add_tensor(op, f"{key}.{name}", role, t)
                    return t

                return fn

            if c.inputs:
                walk(args, "input", add("input"))
                for k, v in kwargs.items():
                    walk(v, f"input.{k}", add("input"))
                op.args = json_args(args, kwargs)
            if c.outputs:
                out = op.call_out
                walk(results(out), "output", add("output"))
        if c.stack and op.direction == "forward":
            # Still inside the op's call: the same user frames as when it was called. A
            # backward record is made in autograd's frames, so it has no stack here.
            op.stack = self._stacks.stack_id(folder)
        entries: list[TensorEntry] = []
        for rec, _, t in op.entries:
            if t is None:
                entries.append((rec, None, None))
                continue
            rec["dtype"] = dtype_name(t.dtype)
            rec["shape"] = tuple(t.shape)
            vec, host, _ = self._capture(t)  # statistics, a host copy in tensor mode
            if host is not None:
                rec["file"], rec["data_offsets"] = self._files.store(folder, rec["name"], host)
            entries.append((rec, vec, None))
        op.entries = entries
        if self._overflow_left > 0:
            self._overflow_left -= 1
            if self._overflow_left == 0:
                self._select.closed = True


def _after_fork_in_child() -> None:
    """A forked child inherits the running capture: a DataLoader worker forked while a step
    is captured (the automatic iteration counter keeps capture on from step to step, so
    each epoch's workers are forked in one) captured its dataset's calls into a copy of the
    agent. That cost the workers time, and their records, never written, could only have
    been written into the parent's open files. The child captures, writes and closes
    nothing, whatever its Debuggers were doing."""
    tls.active = False
    DISPATCH.current = None
    for dbg in list(_LIVE):
        dbg._child = True
        dbg._running = dbg._api_on = False


#: Every Debugger of the process, for :func:`_after_fork_in_child`.
_LIVE: weakref.WeakSet[Debugger] = weakref.WeakSet()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _close_at_exit(ref: weakref.ReferenceType[Debugger]) -> None:
    """A run that never calls stop() still leaves complete, flushed files behind."""
    dbg = ref()
    if dbg is not None:
        try:
            dbg.close()
        except Exception:  # noqa: BLE001
            pass


def _produced_nonfinite(op: OpRecord) -> bool:
    """Whether a tensor the op produced (forward outputs; the gradients a backward call
    produced; parameter gradients) holds NaN or Inf."""
    if op.call_args is not None:
        return nonfinite_result(op.call_out)
    produced = "parameter" if op.kind == "parameters_grad" else "output"
    return any_nonfinite(
        [t for rec, _, t in op.entries if t is not None and rec["role"] == produced]
    )


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
