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

The Debugger owns the step lifecycle: it opens the step's files, installs the hooks, and
at ``stop()`` settles what is still waiting and flushes. Each kind of hook lives in its own
module (api, modules, backward, ddp, waits) and sees only a narrow context
(context.HookContext, implemented by :class:`_Context`); the path every captured tensor
takes (record -> statistics -> writer) is the :class:`~.recorder.Recorder`'s.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import shutil
import tempfile
import threading
import time
import warnings
import weakref
from typing import Any, Optional, Union

import torch

from .._guard import Guard
from .._runtime import current_rank, world_size
from ..config import CaptureConfig, load_config
from .api import ApiCapture
from .backward import BackwardHooks
from .collectives import Collectives
from .compiled import Survey, graph_count, module_tree, survey, unwrap
from .ddp import DdpHooks, is_ddp
from .flight import FlightRecorder
from .forecast import (
    AgentClock,
    FullCollections,
    Reading,
    describe,
    folder_bytes,
    forecast,
    over_budget,
    selected,
)
from .graphs import ACTIVE as GRAPHS
from .graphs import GraphCapture, install_compiler_hook
from .iterations import IterationCounter
from .modules import ModuleHooks
from .patcher import DISPATCH, PATCHER
from .recorder import Recorder
from .selection import Selection
from .stats import use_native
from .threadstate import tls
from .writer import DumpFiles, HostPool

log = logging.getLogger("probe")


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

    ``flight_recorder=K`` (or the config key) writes nothing until a trigger fires, then the
    last K steps (flight.py; docs/monitor.md): pass the loss, ``dbg.step(loss=loss)``.

    Capture does not change what the training computes, to the bit, with one exception
    (docs/capture.md, "Transparency"): at api and mix level, an API call whose own autograd
    graph reads one input twice (``x * x``; ``F.normalize``, ``F.rms_norm`` on CPU, built of
    several autograd nodes) while that input has other uses too (a residual) gets the two
    gradients summed before the others, and the input's gradient may differ in its last
    bits. Module level hands modules their arguments untouched and is transparent.
    """

    def __init__(
        self,
        config: Union[str, os.PathLike[str], dict[str, Any], None] = None,
        model: Optional[torch.nn.Module] = None,
        **overrides: Any,
    ) -> None:
        self.config: CaptureConfig = load_config(config, overrides)
        #: The first captured step's forecast (forecast.py), once measured; a dry run
        #: (``dry_run=True``) returns it here and writes nothing into ``dump_path``.
        self.forecast: Optional[dict[str, Any]] = None
        self._meter = _Meter()
        self._dry_dir: Optional[str] = None
        if self.config.dry_run:
            self._dry_dir = tempfile.mkdtemp(prefix="probe-dry-run-")
            self.config = dataclasses.replace(self.config, dump_path=self._dry_dir)
        #: Dynamo's compiled-graph count at ``start()``, whether compiled code has run while
        #: capturing (or the model is compiled), and whether the user was told (compiled.py).
        self._graphs = 0
        self._compiled = False
        #: Whether the model holds TorchScript (compiled code no graph capture sees), and
        #: whether compiled code ran that the dump lacks (_note_compiled).
        self._scripted = False
        self._missing = False
        #: Whether this is a forked copy of the process that runs the Debugger (a DataLoader
        #: worker): it captures and writes nothing (_after_fork_in_child).
        self._child = False
        self._model: Optional[weakref.ref[torch.nn.Module]] = None
        if model is not None:
            self._take_model(model)
        self._guard = Guard(self._report_failure, self._switch_off)
        self._select = Selection(self.config)
        self._files = DumpFiles(self.config)
        self._recorder = Recorder(self.config, self._files, self._select)
        #: What the hooks share (context.HookContext): running, session, lock, step...
        self._ctx = _Context(self.config, self._recorder, self._guard, self._select)
        self._backward = BackwardHooks(self._ctx)
        self._modules = ModuleHooks(self._ctx, self._backward)
        self._api = ApiCapture(self._ctx, self._modules, self._backward)
        #: The API calls inside compiled graphs (graphs.py).
        self._graph_capture = GraphCapture(self._ctx, self._modules.stack)
        if self.config.api:
            install_compiler_hook()  # when torch.compile was called already
        #: DDP's communication hook.
        self._ddp = DdpHooks(self._ctx, self._backward)
        #: Automatic iteration counting (ApiProfiler); an explicit step() turns it off.
        self._auto: Optional[IterationCounter] = None
        self._explicit_steps = False
        #: Whether the api_list was checked against the hooked APIs / the model's modules.
        self._apis_checked = False
        self._modules_checked = False
        #: Dump on trigger (flight.py): steps held in memory, written when a trigger fires.
        self._flight: Optional[FlightRecorder] = None
        if self.config.flight_recorder is not None:
            self._flight = FlightRecorder(
                self.config.flight_recorder,
                self._files,
                lambda what, msg, level: self._ctx.tell_once(what, msg, stacklevel=level),
            )
            self._files.holder = self._flight
            self._meter.done = True  # steps are written on a trigger: no forecast
        atexit.register(_close_at_exit, weakref.ref(self))
        _LIVE.add(self)

    @property
    def current_step(self) -> int:
        """The step captured now (``step<S>`` folder), counted by :meth:`step`."""
        return self._ctx.current_step

    @current_step.setter
    def current_step(self, step: int) -> None:
        self._ctx.current_step = step

    # ------------------------------------------------------------------ public API

    def start(self, model: Optional[torch.nn.Module] = None) -> None:
        """Begin capturing the current step (no-op if the step or rank is not selected)."""
        seen = self._take_model(model) if model is not None else None
        if self._guard.failed or self._ctx.running or self._child:
            return
        if self.config.api:
            # Every start(), captured step or not: graphs compiled from here on are
            # instrumented, those of warm-up steps included (graphs.py).
            install_compiler_hook()
        self._meter.t_start = time.perf_counter()
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
            measure = self._meter.wanted()
            t0 = time.perf_counter()
            use_native()  # the first time: the CPU statistics kernel (native.py)
            if self.config.api:
                PATCHER.install()
            setup = time.perf_counter() - t0
            model = self.model
            self._files.open(self.current_step, rank, model)
            self._ctx.session += 1
            self._graphs = graph_count()
            if model is not None:
                if seen is None:
                    seen = survey(model)  # (one walk of the model for all of start())
                self._modules.install(model, seen.tree, seen.traced)
                self._graph_capture.paths = {id(m): p for p, m in seen.tree}
            self._ctx.running = True
            self._ctx.api_on = self.config.api
            DISPATCH.current = self._api
            # (overflow mode records only calls that overflowed: not those inside graphs)
            if self.config.api and self.config.mode != "overflow" and install_compiler_hook():
                GRAPHS.current = self._graph_capture  # (hooked at every start(): above)
            if measure:
                self._files.pool.reset_peak()
                self._recorder.stacks.miss_ns = 0
                self._graph_capture.compiled = False
                if self._files.writer is not None:
                    self._files.writer.rewrite_ns = 0
                DISPATCH.clock = self._meter.begin(setup)
            tls.active = self._ctx.api_on
        except Exception as exc:  # noqa: BLE001 - unwritable path, odd model...
            self._guard.fail(exc, "start()")

    def stop(self) -> None:
        """Stop capturing; the dump of this step is complete on disk when this returns."""
        if not self._ctx.running:
            self._meter.uncaptured()
            return
        tls.active = False
        self._ctx.running = self._ctx.api_on = False
        if DISPATCH.current is self._api:
            DISPATCH.current = None
        if GRAPHS.current is self._graph_capture:
            GRAPHS.current = None
        t_stop = time.perf_counter()
        self._note_compiled()
        try:
            if not self._select.step(self.current_step + 1):
                # Wrappers stay installed (inert: one thread-local test per call) only
                # while the next step is captured too; reinstalling costs milliseconds.
                PATCHER.uninstall()
            self._modules.remove()
            self._recorder.stacks.release()
            self._api.waits.settle()  # (takes the lock)
            with self._ctx.lock:
                self._ddp.flush()
                self._backward.finish_step()
                self._recorder.flush()
            t_sync = time.perf_counter_ns()
            self._files.sync()
            if self._meter.clock is not None and self._graph_capture.compiled:
                # It compiled graphs with statistics (seconds, and the collections that came
                # with them): not a step like the next ones; the next one is measured.
                self._meter.clock = DISPATCH.clock = None
                self._meter.off()
                self._meter.done = False
            if self._meter.clock is not None:
                w = self._files.writer
                once = self._recorder.stacks.miss_ns
                if w is not None:
                    # A shard rewritten on the writer thread delays the step as far as
                    # stop() waited for that thread; an inline writer's, all of it.
                    waited = time.perf_counter_ns() - t_sync
                    once += w.rewrite_ns if w.inline else min(w.rewrite_ns, waited)
                self._meter.end(t_stop, self._files.pool, once)
                DISPATCH.clock = None
            if not self._select.step(self.current_step + 1):
                self._files.pool.clear()  # no host buffers held between captured steps
        except Exception as exc:  # noqa: BLE001
            self._guard.fail(exc, "stop()")

    def step(self, loss: Any = None) -> None:
        """Advance the step counter (``step<S>`` folder); closes this step's files.

        ``loss`` (a number or a one-element tensor; read on the host once) feeds the flight
        recorder's loss triggers (``flight_recorder``: nonfinite, loss_spike); without a
        flight recorder it is not looked at.

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
        self._next_step(loss)

    def _forecast(self, path: str) -> None:
        """The first captured step is closed: forecast the run's cost from it, log it,
        write it into the manifest (the first selected rank's), apply the budgets; a dry run
        ends here (forecast.py; docs/capture.md, "Forecast, dry run and budgets")."""
        m, c = self._meter, self.config
        rank = current_rank()
        step_s, setup_s, agent_s, host = m.reading or (0.0, 0.0, 0.0, 0)
        m.reading = None
        nbytes = folder_bytes(path)
        r = Reading(self.current_step, rank, step_s, setup_s, m.bare, agent_s, nbytes, host)
        f = forecast(r, selected(c.steps, c.ranks, world_size()))
        f["host_memory_bytes"] += _log_bytes(path)
        self.forecast = f
        log.log(logging.WARNING if c.dry_run else logging.INFO, "%s", describe(f))
        if self._dry_dir is not None:
            self._end_dry_run()
            return
        writes = rank == (min(c.ranks) if c.ranks else 0)
        if writes:
            self._files.note_cost("forecast", f)
        over = over_budget(f, c.max_bytes, c.max_overhead)
        if over:
            self._degrade(over, writes)

    def _degrade(self, over: list[str], writes: bool) -> None:
        """A budget is exceeded: the following steps capture less, as ``on_budget`` says,
        and the user is told once (the manifest's ``budget``)."""
        c = self.config
        action = c.on_budget
        if action == "statistics" and self._recorder.mode not in ("tensor", "checksum"):
            action = "stop"  # nothing cheaper to switch to
        nxt = self.current_step + 1
        if action == "statistics":
            self._recorder.mode = "statistics"
            what = f"statistics instead of {c.mode} from step {nxt}"
        elif action == "stop":
            self._close_capture()
            what = f"no capture from step {nxt}"
        else:
            what = "nothing changed (on_budget: warn)"
        self._ctx.tell_once(
            "budget", f"probe: over budget ({'; '.join(over)}): {what}", stacklevel=4
        )
        if writes:
            self._files.note_cost(
                "budget",
                {"exceeded": over, "action": action, "from_step": nxt, "on_budget": c.on_budget},
            )

    def _close_capture(self) -> None:
        """Capture nothing more in this run (the wrappers go, the host buffers too)."""
        self._select.closed = True
        if DISPATCH.current is None:
            PATCHER.uninstall()
        self._files.pool.clear()

    def _end_dry_run(self) -> None:
        """A dry run measured its step: nothing more is captured, and its files go."""
        self._close_capture()
        if self._files.writer is not None:
            self._files.writer.sync()
        if self._dry_dir is not None:
            shutil.rmtree(self._dry_dir, ignore_errors=True)

    def _end_flight_step(self, loss: Any) -> None:
        """The flight recorder's triggers at the end of this step; after ``then: stop``
        fired, nothing more is captured (and the wrappers go)."""
        assert self._flight is not None
        if self._flight.end_step(self.current_step, current_rank(), loss):
            self._select.closed = True
            self._files.holder = None
            if DISPATCH.current is None:
                PATCHER.uninstall()
            self._files.pool.clear()

    def _iteration_counter(self) -> IterationCounter:
        """A counter of this Debugger's iterations (ApiProfiler): it ends one at each
        optimizer step (iterations.py)."""
        return IterationCounter(
            lambda: self.model, self._next_iteration, self._adopt_model, self._guard
        )

    def _next_iteration(self) -> None:
        """The automatic iteration counter's boundary: this step ends, the next begins."""
        self.stop()
        self._next_step()
        self.start()

    def _next_step(self, loss: Any = None) -> None:
        """What :meth:`step` does, also for the automatic iteration counter."""
        if self._child:
            return
        if self._ctx.running:
            self.stop()
        try:
            with self._ctx.lock:
                self._recorder.flush()  # records finished after stop() (late gradients)
            folder = self._files.folder
            self._files.close_step()
            if self._meter.reading is not None and folder is not None:
                self._forecast(folder.path)
            if self._flight is not None and not self._guard.failed:
                self._end_flight_step(loss)
        except Exception as exc:  # noqa: BLE001
            self._guard.fail(exc, "step()")
        self.current_step += 1
        self._select.new_step()
        self._recorder.new_step()
        self._ctx.collectives.new_step()

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

    def _take_model(self, model: torch.nn.Module) -> Survey:
        """The model to hook: the one a ``torch.compile`` wrapper holds, noting that it is
        compiled (compiled.py); returns what was seen of it."""
        seen = survey(model)
        self._compiled = self._compiled or seen.compiled
        self._scripted = self._scripted or seen.scripted
        self.model = unwrap(model)
        return seen

    def _note_compiled(self) -> None:
        """At ``stop()``: whether compiled code ran in the captured step that the dump lacks.
        The API calls of the graphs Dynamo compiled since the Debugger exists are captured
        (graphs.py); those of graphs compiled before (or not instrumentable: a graph with
        symbolic shapes at more sizes than it is instrumented for), and TorchScript's,
        are not. The user is told once, the manifest says
        which (``compiled``, ``compiled_capture``)."""
        gc = self._graph_capture
        captured = len(gc.graphs)
        ran = self._compiled or graph_count() > self._graphs
        # Compiled code ran that no graph capture saw: a model compiled before, a graph
        # that could not be instrumented, TorchScript.
        self._missing = self._missing or gc.missing > 0 or self._scripted
        self._missing = self._missing or (ran and not captured)
        if not (self._missing or captured):
            return
        c = self.config
        try:
            self._files.mark_compiled(self._missing, captured, c.forward, c.backward)
        except Exception as exc:  # noqa: BLE001 - an unwritable manifest
            self._guard.fail(exc, "stop()")
        if self._missing:
            self._ctx.tell_once(
                "compiled",
                f"probe: compiled code (torch.compile, TorchScript) ran while capturing step "
                f"{self.current_step} that the agent could not instrument (a graph compiled "
                "before the Debugger existed, one with symbolic shapes at more sizes than "
                "it is instrumented for, the body of a "
                "torch.cond or other higher-order operator, TorchScript): its "
                "operators are missing from the dump. Create the Debugger before the model "
                "first runs compiled, or capture the run without compiling, to record them.",
                stacklevel=4,  # the caller of stop()
            )

    def _attach_ddp(self) -> None:
        """A DistributedDataParallel model gets the bucket-recording communication hook,
        once (ddp.py). Registering it never stops training: a failure only
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
        unfinished = self._ctx.running
        self.stop()
        try:
            if DISPATCH.current is None:
                PATCHER.uninstall()
        except Exception:  # noqa: BLE001
            pass
        try:
            with self._ctx.lock:
                self._recorder.flush()
            self._files.close_step()
            flight, self._flight = self._flight, None
            if flight is not None:
                if unfinished and not self._guard.failed:
                    # A step left without stop(): an exception (or an exit) ended it.
                    flight.note_unfinished(self.current_step)
                    flight.end_step(self.current_step, current_rank(), None, at_close=True)
                flight.close()
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
            if self._ctx.running:
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
        error = exc[1] if len(exc) > 1 else None
        if self._flight is not None and isinstance(error, BaseException):
            self._flight.note_exception(error)  # the exception trigger, at the step's end
        self.stop()
        self.step()

    # ------------------------------------------------------------------ failure handling

    def _switch_off(self, exc: BaseException, context: str) -> None:
        """On any failure: capture off for good, every hook removed, files flushed."""
        if self._auto is not None:
            auto, self._auto = self._auto, None
            auto.remove()
        tls.active = False
        self._ctx.running = self._ctx.api_on = False
        if DISPATCH.current is self._api:
            DISPATCH.current = None
        if GRAPHS.current is self._graph_capture:
            GRAPHS.current = None
        DISPATCH.clock = self._meter.clock = None
        self._meter.off()
        try:
            PATCHER.uninstall()
            self._modules.remove()
            self._recorder.stacks.release()
            self._api.waits.clear()  # records of collectives not waited on yet: dropped
        except Exception:  # noqa: BLE001
            pass
        try:
            # Records finished before the failure are complete: write them, then flush.
            self._recorder.flush()
        except Exception:  # noqa: BLE001
            self._recorder.discard()
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


class _Context:
    """What one Debugger's hooks share (context.HookContext): plain attributes, read on
    every captured call. The Debugger sets ``running``, ``api_on``, ``session`` and
    ``current_step``; hooks only read them."""

    def __init__(
        self, config: CaptureConfig, recorder: Recorder, guard: Guard, select: Selection
    ) -> None:
        self.config = config
        self.recorder = recorder
        self.guard = guard
        self.select = select
        self.lock = threading.RLock()
        #: Per-step sequence numbers of collectives (``coll_seq``).
        self.collectives = Collectives()
        self.running = False
        #: Whether API wrappers capture on the capturing thread now: running at api or mix
        #: level (read on every captured call, so a plain attribute kept with ``running``).
        self.api_on = False
        self.session = 0  # start() count: hooks of an earlier session do nothing
        self.current_step = 0
        #: What the user was told once already (:meth:`tell_once`).
        self._told: set[str] = set()

    def note_transform(self, what: str) -> None:
        """A call inside a ``torch.func`` transform was not captured
        (``threadstate.in_transform``): the user is told once (checked first: it is called
        for every such call)."""
        if "transform" not in self._told:
            self.tell_once(
                "transform",
                f"probe: {what} ran inside a torch.func transform (vmap, grad, ...) at step "
                f"{self.current_step}: calls inside transforms are not captured",
                stacklevel=5,  # the caller of the hooked API
            )

    def tell_once(self, what: str, msg: str, stacklevel: int) -> None:
        """Log ``msg`` and warn with it, the first time something of kind ``what`` happens
        (``stacklevel``: the warning's, counted from here)."""
        if what in self._told:
            return
        self._told.add(what)
        log.warning(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=stacklevel)


class _Meter:
    """The readings of the step whose cost is measured (forecast.py): the first captured
    one. Bare steps (selected out) are timed from ``start()`` to ``stop()`` as well."""

    def __init__(self) -> None:
        self.t_start: Optional[float] = None
        #: The last uncaptured step's time, before the measured step.
        self.bare: Optional[float] = None
        self.clock: Optional[AgentClock] = None
        self.collections: Optional[FullCollections] = None
        self.setup = 0.0
        self.done = False
        #: (step time, setup time, agent time, host pool peak) until the forecast is made.
        self.reading: Optional[tuple[float, float, float, int]] = None

    def wanted(self) -> bool:
        return not self.done

    def uncaptured(self) -> None:
        if not self.done and self.t_start is not None:
            self.bare = time.perf_counter() - self.t_start
        self.t_start = None

    def begin(self, setup: float) -> AgentClock:
        self.done = True
        self.setup = setup
        self.clock = AgentClock()
        self.collections = FullCollections().__enter__()
        # start()'s own work after the setup (module hooks, the step folder) is the agent's
        if self.t_start is not None:
            self.clock.ns += int((time.perf_counter() - self.t_start - setup) * 1e9)
        return self.clock

    def off(self) -> float:
        """Stop timing full collections; their time in the measured step (seconds)."""
        coll, self.collections = self.collections, None
        if coll is None:
            return 0.0
        coll.__exit__()
        return coll.ns / 1e9

    def end(self, t_stop: float, pool: HostPool, once_ns: int) -> None:
        """The measured step's ``stop()`` is done. The host buffers it made fresh are
        one-time setup too, as far as the pool keeps them for the next steps, and so are
        ``once_ns`` (the call stacks it formatted, which later steps find in the cache; the
        shards rewritten because their header outgrew the first reserve) and the full
        garbage collections that ran in it (forecast.FullCollections)."""
        clock, self.clock = self.clock, None
        assert clock is not None
        now = time.perf_counter()
        t0 = self.t_start if self.t_start is not None else now
        full = self.off()
        fresh = pool.one_time_s() + once_ns / 1e9 + full
        agent = clock.ns / 1e9 + (now - t_stop) - fresh
        self.reading = (now - t0, self.setup + fresh, agent, pool.peak)


def _log_bytes(path: str) -> int:
    """The step's op log size: its records were held in memory until the flush."""
    try:
        return os.path.getsize(os.path.join(path, "ops.jsonl"))
    except OSError:
        return 0


def _after_fork_in_child() -> None:
    """A forked child inherits the running capture: a DataLoader worker forked while a step
    is captured (the automatic iteration counter keeps capture on from step to step, so
    each epoch's workers are forked in one) captured its dataset's calls into a copy of the
    agent. That cost the workers time, and their records, never written, could only have
    been written into the parent's open files. The child captures, writes and closes
    nothing, whatever its Debuggers were doing."""
    tls.active = False
    DISPATCH.current = None
    GRAPHS.current = None
    for dbg in list(_LIVE):
        dbg._child = True
        dbg._ctx.running = dbg._ctx.api_on = False


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
