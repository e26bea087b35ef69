"""``probe.Monitor``: per-step, per-module metrics of a training run, one Arrow IPC stream
per rank (the format: docs/monitor.md, read by ``probe compare`` / ``probe scan`` and by
pyarrow, polars, pandas, DuckDB).

Why this shape: a migrated job parts from its reference after hundreds of steps, and the
step to dump is what users lack. Every step therefore costs little: forward hooks add the
squared norm (and the NaN/Inf count) of each monitored module's output to a device tensor;
at the optimizer step, per-parameter norms of gradients, parameters, updates and optimizer
state come from ``torch._foreach_norm`` and are summed per module by one matrix product; the
step's numbers are concatenated into one tensor and copied to the host once (asynchronously
into pinned memory on an accelerator, read at the next step). Nothing the model computes is
touched: hooks read outputs under ``no_grad``, and return nothing. A failure inside the
monitor warns once and switches it off; training goes on.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from typing import Any, Optional, Union

import numpy as np
import torch

from .._version import __version__
from . import arrow_ipc
from .arrow_ipc import Column

#: Metrics of a module's row, per module (squared norms summed, then rooted on the host).
_FIXED = [
    "output_norm",
    "output_nonfinite",
    "grad_norm",
    "grad_nonfinite",
    "param_norm",
    "update_norm",
]


def _floating(out: Any, found: list[torch.Tensor]) -> None:
    """Every floating tensor in a module's output (tuples, lists, dicts, ModelOutput)."""
    if isinstance(out, torch.Tensor):
        if out.is_floating_point():
            found.append(out)
    elif isinstance(out, (list, tuple)):
        for o in out:
            _floating(o, found)
    elif isinstance(out, dict):
        for o in out.values():
            _floating(o, found)


class Monitor:
    """Monitors ``model`` (and ``optimizer``): call :meth:`step` once per iteration, after
    the optimizer step, with the loss; :meth:`close` at the end (or use ``with``).

    ``depth``: the modules monitored are the model (``""``) and every module whose qualified
    name has at most ``depth`` parts (``layers.0`` has two); ``modules`` names them instead.
    ``scaler``: a ``torch.amp.GradScaler``, for the loss scale. ``update_norm``: keep a copy
    of the parameters across the optimizer step to measure the update (memory of one copy
    of the parameters, during the step only).
    """

    def __init__(
        self,
        path: Union[str, os.PathLike[str]],
        model: torch.nn.Module,
        optimizer: Optional[torch.optim.Optimizer] = None,
        *,
        scaler: Optional[Any] = None,
        depth: int = 2,
        modules: Optional[list[str]] = None,
        update_norm: bool = True,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
    ) -> None:
        dist = torch.distributed
        live = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else (dist.get_rank() if live else 0)
        self.world_size = (
            world_size if world_size is not None else (dist.get_world_size() if live else 1)
        )
        named = dict(model.named_modules())
        if modules is not None:
            unknown = [m for m in modules if m not in named]
            if unknown:
                raise ValueError(f"Monitor: no module named {unknown[0]!r} in the model")
            names = [""] + [m for m in modules if m != ""]
        else:
            names = [""] + [n for n in named if n and n.count(".") < depth]
        self.names = names
        self._model = model
        self._optimizer = optimizer
        self._scaler = scaler
        self._update = update_norm
        self._on = True
        self._step = 0
        params = [p for p in model.parameters()]
        index = {id(p): k for k, p in enumerate(params)}
        self._params = params
        device = params[0].device if params else torch.device("cpu")
        self._device = device
        member = torch.zeros(len(names), max(1, len(params)), dtype=torch.float64)
        for i, n in enumerate(names):
            for p in named[n].parameters():
                member[i, index[id(p)]] = 1.0
        self._member = member.to(device)
        self._has_params = member.sum(dim=1).numpy() > 0
        self._hooks = [
            named[n].register_forward_hook(self._forward_hook(i)) for i, n in enumerate(names)
        ]
        self._opt_hooks: list[Any] = []
        if optimizer is not None:
            self._opt_hooks = [
                optimizer.register_step_pre_hook(self._pre_step),
                optimizer.register_step_post_hook(self._post_step),
            ]
        os.makedirs(path, exist_ok=True)
        self.file = os.path.join(os.fspath(path), f"rank{self.rank}.arrows")
        self._fd = os.open(self.file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._columns: Optional[list[Column]] = None
        self._state_keys: list[str] = []
        self._pending: Optional[tuple[int, torch.Tensor, Any, dict[str, Any]]] = None
        self._reset()

    # -- per step state ---------------------------------------------------------------------

    def _reset(self) -> None:
        n = len(self.names)
        self._out_norms: list[torch.Tensor] = []
        self._out_index: list[int] = []
        self._order: list[Optional[int]] = [None] * n
        self._calls = 0
        self._grads: Optional[tuple[torch.Tensor, torch.Tensor]] = None
        self._snapshot: Optional[list[torch.Tensor]] = None
        self._after: Optional[tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]] = None

    def _fail(self, exc: BaseException) -> None:
        self._on = False
        warnings.warn(
            f"probe.Monitor switched off after an internal error ({type(exc).__name__}: {exc}); "
            "training is not affected",
            RuntimeWarning,
            stacklevel=3,
        )

    def _forward_hook(self, i: int) -> Any:
        def hook(module: torch.nn.Module, args: Any, out: Any) -> None:
            if not self._on:
                return
            try:
                with torch.no_grad():
                    found: list[torch.Tensor] = []
                    _floating(out, found)
                    if not found:
                        return
                    # One kernel per output tensor; squares and sums wait for the step's end.
                    for t in found:
                        self._out_norms.append(torch.linalg.vector_norm(t, dtype=torch.float32))
                        self._out_index.append(i)
                    if self._order[i] is None:
                        self._order[i] = self._calls
                        self._calls += 1
            except Exception as exc:  # noqa: BLE001 - never fail the training run
                self._fail(exc)

        return hook

    def _per_module(self, per_param: Sequence[torch.Tensor]) -> torch.Tensor:
        """Per-parameter norms (0-d tensors, params order) -> per-module squared norms."""
        sq = torch.stack([n.to(torch.float64) for n in per_param]) ** 2
        return self._member @ sq

    def _read_grads(self) -> None:
        with torch.no_grad():
            grads = [
                p.grad if p.grad is not None else torch.zeros((), device=p.device)
                for p in self._params
            ]
            if not grads:
                return
            norms = torch._foreach_norm(grads)
            sq = self._per_module(norms)
            bad = self._member @ torch.stack(
                [(~torch.isfinite(n)).to(torch.float64) for n in norms]
            )
            self._grads = (sq, bad)

    def _pre_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        if not self._on:
            return
        try:
            self._read_grads()
            if self._update and self._params:
                with torch.no_grad():
                    self._snapshot = [p.detach().clone() for p in self._params]
        except Exception as exc:  # noqa: BLE001 - never fail the training run
            self._fail(exc)

    def _post_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        if not self._on or not self._params:
            return
        try:
            with torch.no_grad():
                params = [p.detach() for p in self._params]
                param_sq = self._per_module(torch._foreach_norm(params))
                upd = None
                if self._snapshot is not None:
                    diffs = torch._foreach_sub(params, self._snapshot)
                    upd = self._per_module(torch._foreach_norm(diffs))
                    self._snapshot = None
                if self._columns is None and not self._state_keys:
                    self._state_keys = self._find_state_keys()
                states = []
                zero = torch.zeros((), device=self._device)
                for key in self._state_keys:
                    values: list[torch.Tensor] = []
                    for p in self._params:
                        v = self._optimizer.state.get(p, {}).get(key) if self._optimizer else None
                        ok = isinstance(v, torch.Tensor) and v.shape == p.shape
                        values.append(v if ok and isinstance(v, torch.Tensor) else zero)
                    states.append(self._per_module(torch._foreach_norm(values)))
                state = (
                    torch.stack(states)
                    if states
                    else torch.zeros(0, len(self.names), dtype=torch.float64, device=self._device)
                )
                self._after = (param_sq, upd, state)
        except Exception as exc:  # noqa: BLE001 - never fail the training run
            self._fail(exc)

    def _find_state_keys(self) -> list[str]:
        keys: list[str] = []
        if self._optimizer is None:
            return keys
        for p in self._params:
            for k, v in self._optimizer.state.get(p, {}).items():
                if isinstance(v, torch.Tensor) and v.shape == p.shape and k not in keys:
                    keys.append(k)
        return keys

    # -- the step ---------------------------------------------------------------------------

    def step(self, loss: Optional[torch.Tensor] = None) -> None:
        """Ends a step: its numbers go to the file (one host copy; on an accelerator the
        copy completes while the next step runs)."""
        if not self._on:
            self._step += 1
            return
        try:
            self._end_step(loss)
        except Exception as exc:  # noqa: BLE001 - never fail the training run
            self._fail(exc)
        self._step += 1
        self._reset()

    def _end_step(self, loss: Optional[torch.Tensor]) -> None:
        n = len(self.names)
        dev = self._device
        if self._grads is None:
            self._read_grads()
        z = torch.zeros(n, dtype=torch.float64, device=dev)
        out_sq, out_bad = z, z
        if self._out_norms:
            norms = torch.stack(self._out_norms).to(dev, torch.float64)
            index = torch.tensor(self._out_index, device=dev)
            out_sq = z.index_add(0, index, norms**2)
            out_bad = z.index_add(0, index, (~torch.isfinite(norms)).to(torch.float64))
        grad_sq, grad_bad = self._grads if self._grads is not None else (z, z)
        param_sq, upd, state = self._after if self._after is not None else (None, None, None)
        if param_sq is None:
            with torch.no_grad():
                param_sq = (
                    self._per_module(torch._foreach_norm([p.detach() for p in self._params]))
                    if self._params
                    else z
                )
        scalars = [
            loss.detach().to(dev, torch.float64).reshape(())
            if isinstance(loss, torch.Tensor)
            else torch.tensor(
                float("nan") if loss is None else float(loss), dtype=torch.float64, device=dev
            ),
        ]
        scale = getattr(self._scaler, "_scale", None) if self._scaler is not None else None
        scalars.append(
            scale.detach().to(dev, torch.float64).reshape(())
            if isinstance(scale, torch.Tensor)
            else torch.tensor(float("nan"), dtype=torch.float64, device=dev)
        )
        if state is None:
            state = torch.zeros(len(self._state_keys), n, dtype=torch.float64, device=dev)
        parts = [
            torch.stack(scalars),
            out_sq,
            out_bad,
            grad_sq,
            grad_bad,
            param_sq,
            upd if upd is not None else z,
            state.reshape(-1),
        ]
        flat = torch.cat(parts)
        info = {
            "order": list(self._order),
            "has_output": [o is not None for o in self._order],
            "has_grad": self._grads is not None,
            "has_update": upd is not None,
            "has_scale": isinstance(scale, torch.Tensor)
            and self._scaler is not None
            and bool(getattr(self._scaler, "is_enabled", lambda: True)()),
            "loss_given": loss is not None,
            "lr": self._lr(),
        }
        if flat.device.type == "cpu":
            self._flush(self._step, flat.numpy().copy(), info)
            return
        host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
        host.copy_(flat, non_blocking=True)
        event = torch.cuda.Event() if flat.device.type == "cuda" else None  # type: ignore[no-untyped-call]
        if event is not None:
            event.record()
        self._drain()
        self._pending = (self._step, host, event, info)

    def _lr(self) -> Optional[float]:
        if self._optimizer is None or not self._optimizer.param_groups:
            return None
        lr = self._optimizer.param_groups[0].get("lr")
        return float(lr) if lr is not None else None

    def _drain(self) -> None:
        if self._pending is None:
            return
        step, host, event, info = self._pending
        self._pending = None
        if event is not None:
            event.synchronize()
        self._flush(step, host.numpy().copy(), info)

    def _flush(self, step: int, flat: np.ndarray, info: dict[str, Any]) -> None:
        n = len(self.names)
        k = len(self._state_keys)
        if self._columns is None:
            self._columns = self._make_columns()
            header = arrow_ipc.schema_message(self._columns, {"probe.monitor": self._metadata()})
            os.write(self._fd, header + arrow_ipc.dictionary_message(self.names))
        loss, scale = flat[0], flat[1]
        blocks = flat[2:].reshape(6 + k, n)
        out_sq, out_bad, grad_sq, grad_bad, param_sq, upd_sq = blocks[:6]
        root = np.zeros(n, dtype=bool)
        root[0] = True
        called = np.array(info["has_output"])
        order = np.array([o if o is not None else 0 for o in info["order"]], dtype=np.int32)
        has_p = self._has_params
        data: list[tuple[np.ndarray, Optional[np.ndarray]]] = [
            (np.full(n, step, dtype=np.int32), None),
            (np.arange(n, dtype=np.int32), None),
            (order, called),
            (np.where(root, loss, 0.0), root & info["loss_given"]),
            (np.where(root, scale, 0.0), root & info["has_scale"]),
            (np.full(n, info["lr"] or 0.0), root & (info["lr"] is not None)),
            (np.sqrt(out_sq).astype(np.float32), called),
            (out_bad.astype(np.float32), called),
            (np.sqrt(grad_sq).astype(np.float32), has_p & info["has_grad"]),
            (grad_bad.astype(np.float32), has_p & info["has_grad"]),
            (np.sqrt(param_sq).astype(np.float32), has_p),
            (np.sqrt(upd_sq).astype(np.float32), has_p & info["has_update"]),
        ]
        for j in range(k):
            data.append((np.sqrt(blocks[6 + j]).astype(np.float32), has_p & info["has_update"]))
        os.write(self._fd, arrow_ipc.record_batch_message(self._columns, data))

    def _make_columns(self) -> list[Column]:
        cols = [
            Column("step", "int32", nullable=False),
            Column("module", "dict_utf8", nullable=False),
            Column("order", "int32"),
            Column("loss", "float64"),
            Column("loss_scale", "float64"),
            Column("lr", "float64"),
        ]
        cols += [Column(m, "float32") for m in _FIXED]
        cols += [Column(f"state_{k}_norm", "float32") for k in self._state_keys]
        return cols

    def _metadata(self) -> str:
        return json.dumps(
            {
                "format": "probe.monitor",
                "version": 1,
                "rank": self.rank,
                "world_size": self.world_size,
                "probe_version": __version__,
                "modules": len(self.names),
            }
        )

    def close(self) -> None:
        """Writes what is pending and the stream's end; removes every hook."""
        if self._fd < 0:
            return
        try:
            self._drain()
            if self._columns is not None:
                os.write(self._fd, arrow_ipc.END_OF_STREAM)
        except Exception as exc:  # noqa: BLE001 - never fail the training run
            self._fail(exc)
        finally:
            for h in self._hooks + self._opt_hooks:
                h.remove()
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
