"""``probe.Monitor``: a few numbers per module and step, for every step of a long run.

Why: the capture agent (``probe.Debugger``) records every operator of a step, too much to
leave on for a whole run. The monitor records, per monitored module and step, the norms
that show where a run starts to go wrong (outputs, gradients, parameters, the update and
the optimizer state, NaN/Inf counts) and the loss, loss scale and learning rate, cheaply
enough to stay on; the file (docs/monitor.md) then tells which step to recapture.

Call order, once per iteration::

    mon = probe.Monitor("monitor", model, optimizer, scaler=scaler)
    for x, y in data:
        loss = loss_fn(model(x), y)        # forward hooks: output norms, order
        loss.backward()
        optimizer.step()                   # step pre-hook: gradients, parameter snapshot
        optimizer.zero_grad()              #   post-hook: the update (zero_grad may go here)
        mon.step(loss)                     # parameters, optimizer state, loss: one row each
    mon.close()

With a GradScaler: ``scaler.step(optimizer); scaler.update(); mon.step(loss)`` (the scale
recorded is the scale after ``update()``). When no optimizer step ran (the scaler skipped
it), ``step()`` reads the gradients itself, if they are still there.

Rules: the monitor never changes what training computes (no random numbers, no in-place
edit of a model tensor, outputs returned untouched, hooks removed at ``close()``), and
never breaks training: an internal failure warns once and switches it off (probe/_guard.py).
On CUDA the step's numbers go to pinned host memory without a sync and are written at the
next step (or at ``close()``).
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import warnings
import weakref
from collections.abc import Sequence
from typing import Any, Optional, Union

import numpy as np
import torch

from .._guard import Guard
from .._runtime import current_rank, world_size
from .._version import __version__
from . import norms as _norms
from .norms import Membership, Which, floating_tensors, nonfinite, norms, output_count
from .table import FORMAT_VERSION, MonitorFile, StepRows

log = logging.getLogger("probe")

#: At most this many steps are held in memory (state columns unknown) while no optimizer
#: step has run yet: the optimizer state, hence the ``state_<key>_norm`` columns, appears
#: with the first real step (a GradScaler skips the first ones of a run).
MAX_HELD_STEPS = 64

#: A root scalar whose value is in the step's device vector (a tensor loss, the scaler's
#: scale), compared by identity.
ON_DEVICE = float("nan")


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model a wrapper (DistributedDataParallel, ``torch.compile``) holds: module
    names are then those of the bare model, the same on every rank and in every run."""
    for _ in range(4):
        inner = (
            getattr(model, "module", None)
            if type(model).__name__.endswith("DataParallel")
            else None
        )
        inner = inner if inner is not None else getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner
    return model


def select_modules(
    model: torch.nn.Module, depth: int, names: Optional[Sequence[str]]
) -> list[tuple[str, torch.nn.Module]]:
    """The root (``""``) then, in ``named_modules()`` order, the modules at most ``depth``
    deep (``a.b`` is 2 deep) or exactly those in ``names``."""
    named = list(model.named_modules())
    if names is None:
        return [(n, m) for n, m in named if n == "" or n.count(".") + 1 <= depth]
    known = {n for n, _ in named}
    missing = [n for n in names if n not in known]
    if missing:
        raise ValueError(f"probe.Monitor: no module named {missing} in the model")
    wanted = set(names)
    return [(n, m) for n, m in named if n == "" or n in wanted]


#: The running backward's id, >= 0 while autograd runs a backward (then a forward hook sees
#: a checkpointed forward being recomputed); looked up once, called in every forward hook.
_TASK_ID = getattr(torch._C, "_current_graph_task_id", None)
_vector_norm = torch.linalg.vector_norm


class _Grads:
    """The gradients' norms, read once per step: which parameters had one (None: all), their
    norms (a device vector) and NaN/Inf counts (a host array on the CPU, else a device
    vector)."""

    def __init__(
        self, which: Which, norm: Optional[torch.Tensor], counts: Union[np.ndarray, torch.Tensor]
    ) -> None:
        self.which = which
        self.norm = norm
        self.counts = counts


def _copy_into(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    try:
        torch._foreach_copy_(dst, src)
    except (AttributeError, RuntimeError):  # torch < 2.1, or mixed devices
        for d, t in zip(dst, src):
            d.copy_(t)


class _Reader:
    """Consecutive slices of the step's host vector."""

    def __init__(self, vec: np.ndarray) -> None:
        self.vec = vec
        self.at = 0

    def take(self, count: int) -> np.ndarray:
        part = self.vec[self.at : self.at + count]
        self.at += count
        return part

    def rest(self) -> np.ndarray:
        return self.vec[self.at :]


class _StepState:
    """What the hooks gather during one step (reset by ``Monitor.step``)."""

    def __init__(self, modules: int) -> None:
        self.order = [-1] * modules
        self.next_order = 0
        self.out_norms: list[torch.Tensor] = []
        self.out_rows: list[int] = []
        self.host_counts = np.zeros(modules)
        #: On an accelerator: per output, its row and its NaN/Inf count (on the device).
        self.dev_counts: list[tuple[int, torch.Tensor]] = []
        self.grads: Optional[_Grads] = None
        #: The parameters are in the monitor's buffer (pre-hook), then the buffer holds the
        #: update, before minus after (post-hook).
        self.copied = False
        self.updated = False


class Monitor:
    """Writes ``path/rank<R>.arrows`` (docs/monitor.md): one row per monitored module and
    step. See the module docstring for the call order.

    ``depth``: the modules at most that deep are monitored (the root always);
    ``modules``: exactly these names instead. ``update_norm=False`` saves the copy of the
    parameters that the update's norm needs. ``rank``/``world_size``: the process group's
    when one is up, else ``$RANK``/``$WORLD_SIZE``.
    """

    def __init__(
        self,
        path: str,
        model: torch.nn.Module,
        optimizer: Optional[torch.optim.Optimizer] = None,
        *,
        scaler: Optional[Any] = None,
        depth: int = 2,
        modules: Optional[Sequence[str]] = None,
        update_norm: bool = True,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
    ) -> None:
        if isinstance(modules, str):
            raise TypeError("probe.Monitor: modules is a list of module names, not one string")
        self._guard = Guard(self._report, self._switch_off)
        self._on = False
        self._handles: list[Any] = []
        self.step_index = 0
        self._model = _unwrap(model)
        self._optimizer = optimizer
        self._scaler = scaler
        self._update_norm = update_norm
        selected = select_modules(self._model, depth, modules)
        self.module_names = [n for n, _ in selected]
        self._file: Optional[MonitorFile] = None
        self._held: list[StepRows] = []
        self._keys: Optional[list[str]] = None
        self._stepped_ever = False
        self._inflight: Optional[tuple[torch.Tensor, Any, dict[str, Any]]] = None
        #: The pinned host vector the step's numbers are copied into (CUDA), reused while
        #: its size holds: it is free again once the step before was delivered.
        self._pinned: Optional[torch.Tensor] = None
        #: The parameters before the optimizer step, then the update: allocated once.
        self._buf: list[torch.Tensor] = []
        self._buf_layout: list[tuple[torch.Size, torch.dtype, torch.device]] = []
        #: The optimizer's state tensors by key, and the identities they were found with.
        self._states: dict[str, tuple[Which, list[torch.Tensor]]] = {}
        self._states_seen: list[int] = []
        self._state = _StepState(len(selected))
        try:
            self._setup(
                path, selected, depth if modules is None else list(modules), rank, world_size
            )
        except Exception as exc:  # noqa: BLE001 - an unusable path must not stop training
            self._guard.fail(exc, "Monitor()")

    def _setup(
        self,
        path: str,
        selected: list[tuple[str, torch.nn.Module]],
        config: Union[int, list[str]],
        rank: Optional[int],
        world: Optional[int],
    ) -> None:
        rank = current_rank() if rank is None else rank
        world = world_size() if world is None else world
        first = next(self._model.parameters(), None)
        self._device = first.device if first is not None else torch.device("cpu")
        self._members = Membership([m for _, m in selected])
        meta = {
            "format": "probe.monitor",
            "version": FORMAT_VERSION,
            "rank": rank,
            "world_size": world,
            "probe_version": __version__,
            "modules": config,
        }
        self._file = MonitorFile(path, rank, self.module_names, json.dumps(meta))
        self._on = True
        for i, (_, mod) in enumerate(selected):
            self._handles.append(mod.register_forward_hook(self._forward_hook(i)))
        if self._optimizer is not None:
            self._handles.append(self._optimizer.register_step_pre_hook(self._pre_step))
            self._handles.append(self._optimizer.register_step_post_hook(self._post_step))
        ref = weakref.ref(self)
        atexit.register(lambda: (lambda m: m.close() if m is not None else None)(ref()))

    # --- hooks ---------------------------------------------------------------------------

    def _forward_hook(self, i: int) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if self._on:
                self._record_output(i, output)

        return hook

    def _record_output(self, i: int, output: Any) -> None:
        """One norm kernel per floating output tensor; on the CPU its NaN/Inf elements are
        counted only when that norm is not finite (a finite norm has none), elsewhere its
        NaN/Inf elements are counted on the device (two kernels, no wait)."""
        try:
            if _TASK_ID is not None and _TASK_ID() >= 0:  # a checkpointed forward recomputed
                return
            s = self._state
            if s.order[i] < 0:
                s.order[i] = s.next_order
                s.next_order += 1
            for t in floating_tensors(output):
                n = _vector_norm(t, dtype=torch.float32)
                s.out_norms.append(n)
                s.out_rows.append(i)
                if not _norms.counted_on_host(n):
                    s.dev_counts.append((i, _norms.count_nonfinite(t)))
                elif not math.isfinite(n.item()):
                    s.host_counts[i] += output_count(t, n)
        except Exception as exc:  # noqa: BLE001 - must never fail the training run
            self._guard.fail(exc, f"the forward hook of module {self.module_names[i]!r}")

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._on:
            return
        try:
            with torch.no_grad():
                s = self._state
                if s.grads is None:
                    self._read_grads()
                if self._update_norm:
                    _copy_into(self._buffer(), self._members.params)
                    s.copied, s.updated = True, False
        except Exception as exc:  # noqa: BLE001 - must never fail the training run
            self._guard.fail(exc, "the optimizer step pre-hook")

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._on:
            return
        try:
            self._stepped_ever = True
            s = self._state
            if s.copied:
                s.copied = False
                with torch.no_grad():
                    torch._foreach_sub_(self._buf, self._members.params)
                s.updated = True
        except Exception as exc:  # noqa: BLE001 - must never fail the training run
            self._guard.fail(exc, "the optimizer step post-hook")

    def _buffer(self) -> list[torch.Tensor]:
        """The monitor's copy of the parameters, allocated once (again only if a parameter
        changed shape, dtype or device): the pre-hook copies into it, the post-hook
        subtracts the parameters from it, ``step()`` takes its norms."""
        params = self._members.params
        layout = [(p.shape, p.dtype, p.device) for p in params]
        if layout != self._buf_layout:
            self._buf = [torch.empty_like(p) for p in params]
            self._buf_layout = layout
        return self._buf

    def _read_grads(self) -> None:
        grads = [p.grad for p in self._members.params]
        which: Which = None
        if any(g is None for g in grads):
            which = [j for j, g in enumerate(grads) if g is not None]
            grads = [grads[j] for j in which]
        present = [g for g in grads if g is not None]
        if not present:
            self._state.grads = _Grads(which, None, np.zeros(0))
            return
        norm = torch.stack(norms(present))
        self._state.grads = _Grads(which, norm, nonfinite(present, norm))

    # --- the step ------------------------------------------------------------------------

    def step(self, loss: Union[torch.Tensor, float, None] = None) -> None:
        """Record this step (call it once per iteration, after the optimizer step)."""
        if self._on:
            try:
                with torch.no_grad():
                    self._deliver_inflight()
                    self._gather(loss)
            except Exception as exc:  # noqa: BLE001 - must never fail the training run
                self._guard.fail(exc, f"step() at step {self.step_index}")
        self.step_index += 1
        self._state = _StepState(len(self.module_names))

    def _state_keys(self) -> list[str]:
        """The optimizer state entries shaped like their parameter (``exp_avg``, ...)."""
        keys: list[str] = []
        state = self._optimizer.state if self._optimizer is not None else {}
        for p in self._members.params:
            for key, value in state.get(p, {}).items():
                if isinstance(value, torch.Tensor) and value.shape == p.shape and key not in keys:
                    keys.append(str(key))
        return keys

    def _gather(self, loss: Union[torch.Tensor, float, None]) -> None:
        """This step's norms, as one vector on the device, sent to the host: the outputs',
        the update's, the parameters', the optimizer state's (one ``_foreach_norm``), the
        gradients' (read before the optimizer step), device counts and scalars."""
        s, m = self._state, self._members
        if s.grads is None:
            self._read_grads()
        g = s.grads
        assert g is not None
        if self._keys is None and (
            self._optimizer is None or self._stepped_ever or len(self._held) >= MAX_HELD_STEPS
        ):
            self._keys = self._state_keys()
        keys = list(self._keys or [])
        inputs = list(self._buf) if s.updated else []
        inputs += m.params
        states = self._state_tensors(keys)
        for _, tensors in states:
            inputs += tensors
        first = torch.stack(s.out_norms + norms(inputs))
        dev, host = self._scalars(loss, first.device)
        pieces = [first]
        if g.norm is not None:
            pieces.append(g.norm)
        if isinstance(g.counts, torch.Tensor):
            pieces.append(g.counts)
        if s.dev_counts:
            pieces.append(torch.stack([c for _, c in s.dev_counts]))
        if dev is not None:
            pieces.append(dev)
        vec = torch.cat(pieces) if len(pieces) > 1 else pieces[0]  # float64 with a scalar
        meta = {
            "step": self.step_index,
            "order": np.array(s.order, dtype=np.int32),
            "out_rows": np.array(s.out_rows, dtype=np.int64),
            "host_counts": s.host_counts,
            "updated": s.updated,
            "states": [(which, len(tensors)) for which, tensors in states],
            "grads": (g.which, 0 if g.norm is None else len(g.norm), g.counts),
            "dev_rows": np.array([i for i, _ in s.dev_counts], dtype=np.int64),
            "keys": keys,
            "host_scalars": host,
        }
        if vec.device.type == "cuda":
            pinned = self._pinned
            if pinned is None or pinned.shape != vec.shape or pinned.dtype != vec.dtype:
                pinned = self._pinned = torch.empty(vec.shape, dtype=vec.dtype, pin_memory=True)
            pinned.copy_(vec, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record()
            self._inflight = (pinned, event, meta)
        else:
            self._deliver(vec.cpu().numpy(), meta)

    def _state_tensors(self, keys: list[str]) -> list[tuple[Which, list[torch.Tensor]]]:
        """Per key: the parameters that have that state (None: all) and its tensors; looked
        up again only when the optimizer's state entries are other objects than last step."""
        if self._optimizer is None or not keys:
            return []
        state = self._optimizer.state
        per = [state.get(p) for p in self._members.params]
        seen = [id(v) for d in per if d for v in d.values()]
        seen.append(hash(tuple(keys)))
        if seen != self._states_seen:
            self._states = {key: self._state_of(key) for key in keys}
            self._states_seen = seen
        return [self._states[key] for key in keys]

    def _state_of(self, key: str) -> tuple[Which, list[torch.Tensor]]:
        assert self._optimizer is not None
        state = self._optimizer.state
        params = self._members.params
        which, tensors = [], []
        for j, p in enumerate(params):
            value = state.get(p, {}).get(key)
            if isinstance(value, torch.Tensor) and value.shape == p.shape:
                which.append(j)
                tensors.append(value.detach())
        return (None if len(which) == len(params) else which), tensors

    def _scalars(
        self, loss: Union[torch.Tensor, float, None], device: torch.device
    ) -> tuple[Optional[torch.Tensor], dict[str, Optional[float]]]:
        """loss, loss scale, lr: the host values (a CPU tensor's value is read at once, no
        wait), and apart, the device tensors' values as a float64 vector (float32 on MPS,
        which has no float64; their names then hold :data:`ON_DEVICE`), so that nothing here
        waits for the device."""
        dev: list[torch.Tensor] = []
        host: dict[str, Optional[float]] = {}
        scale = getattr(self._scaler, "_scale", None) if self._scaler is not None else None
        lr = self._optimizer.param_groups[0].get("lr") if self._optimizer is not None else None
        for name, value in (("loss", loss), ("loss_scale", scale), ("lr", lr)):
            if isinstance(value, torch.Tensor):
                first = value.detach().reshape(-1)[0]
                if first.device.type == "cpu":
                    host[name] = float(first)
                else:
                    wide = torch.float32 if device.type == "mps" else torch.float64
                    dev.append(first.to(device, wide))
                    host[name] = ON_DEVICE
            else:
                host[name] = None if value is None else float(value)
        return (torch.stack(dev) if dev else None), host

    def _deliver_inflight(self) -> None:
        if self._inflight is not None:
            pinned, event, meta = self._inflight
            self._inflight = None
            event.synchronize()
            self._deliver(pinned.numpy(), meta)

    def _deliver(self, raw: np.ndarray, meta: dict[str, Any]) -> None:
        """Turn the host vector into the step's rows, and write them (or hold them)."""
        m, n = self._members, len(self.module_names)
        vec = raw.astype(np.float64)
        parts = _Reader(vec)
        out = parts.take(len(meta["out_rows"]))
        update = parts.take(len(m.params)) if meta["updated"] else None
        params = parts.take(len(m.params))
        states = [(which, parts.take(count)) for which, count in meta["states"]]
        which, count, counts = meta["grads"]
        grads = parts.take(count)
        grad_nf = parts.take(count) if isinstance(counts, torch.Tensor) else counts
        dev_counts = parts.take(len(meta["dev_rows"]))
        called = meta["order"] >= 0
        has, with_grad = m.has_params, m.present(which)
        groups = [(which, grads), (None, params)] + states
        if update is not None:
            groups.append((None, update))
        norm = m.module_norms(groups)
        nonfinite = m.sums(which, grad_nf) if np.any(grad_nf) else np.zeros(n)
        out_nf = meta["host_counts"]
        if len(dev_counts):
            out_nf = out_nf + np.bincount(meta["dev_rows"], dev_counts, minlength=n)
        metrics: dict[str, tuple[np.ndarray, np.ndarray]] = {
            "output_norm": (np.sqrt(np.bincount(meta["out_rows"], out * out, minlength=n)), called),
            "output_nonfinite": (out_nf, called),
            "grad_norm": (norm[0], with_grad),
            "grad_nonfinite": (nonfinite, with_grad),
            "param_norm": (norm[1], has),
            "update_norm": (norm[-1], has) if update is not None else (np.zeros(n), has & False),
        }
        for k, (key, (which, _)) in enumerate(zip(meta["keys"], states)):
            metrics[f"state_{key}_norm"] = (norm[2 + k], m.present(which))
        scalars = dict(meta["host_scalars"])
        tail = iter(parts.rest().tolist())
        for name in ("loss", "loss_scale", "lr"):
            if scalars[name] is ON_DEVICE:
                scalars[name] = next(tail)
        self._held.append(StepRows(meta["step"], meta["order"], scalars, metrics))
        self._flush()

    def _flush(self, final: bool = False) -> None:
        """Write the held steps once the schema is known (or at close)."""
        f = self._file
        if f is None or not self._held:
            return
        if not f.started:
            if self._keys is None and not final:
                return
            f.start(self._keys if self._keys is not None else self._state_keys())
        held, self._held = self._held, []
        f.write(held)

    # --- the end -------------------------------------------------------------------------

    def close(self) -> None:
        """Write what is pending and the stream's end; remove every hook. Idempotent."""
        try:
            if self._on:
                with torch.no_grad():
                    self._deliver_inflight()
                self._flush(final=True)
        except Exception as exc:  # noqa: BLE001 - must never fail the training run
            self._guard.fail(exc, "close()")
        self._switch_off(None, "close()")

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _switch_off(self, exc: Optional[BaseException], context: str) -> None:
        """Remove every hook and close the file; the monitor stays off. Never raises."""
        self._on = False
        for handle in self._handles:
            try:
                handle.remove()
            except Exception:  # noqa: BLE001 - removing the others matters more
                pass
        self._handles = []
        self._state = _StepState(len(self.module_names))
        f, self._file = self._file, None
        if f is not None:
            try:
                f.close()
            except Exception:  # noqa: BLE001 - the file may be what failed
                pass

    def _report(self, exc: BaseException, context: str) -> None:
        """The first failure: logged with its traceback and warned; training continues."""
        msg = (
            f"probe.Monitor switched off after an error in {context}: {exc!r}; "
            "the monitor file keeps the steps before it, training continues"
        )
        log.error("%s", msg, exc_info=(type(exc), exc, exc.__traceback__))
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
