"""The ConfigPack facade: when each collector runs, and writing the pack as a zip.

Collectors run at :meth:`ConfigPack.capture` (env, packages, determinism, hyperparameters,
initial weights); seed calls are recorded from construction on; inputs and random draws are
recorded for the first ``steps`` steps, counted by optimizer steps (or forward calls when no
optimizer is given); then the pack is written once, atomically, with fixed timestamps and
sorted keys, so equal environments give byte-equal entries.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import io
import json
import os
import zipfile
from typing import Any, Optional

from .._guard import Guard, guarded
from .._runtime import current_rank, device_kind, world_size
from . import random_hooks
from ._report import report_failure
from .dataset import record_forward_inputs
from .determinism import collect_determinism
from .env import collect_env
from .fingerprint import add_tensor_records
from .hyperparameters import collect_hyperparameters, optimizer_info
from .packages import collect_packages
from .redaction import MODES, redact_value
from .weights import record_weights

FORMAT = "probe-config-pack"
#: 2: ``manifest.world_size`` and ``random.generators`` (seeded/drawn per generator).
VERSION = 2


class ConfigPack:
    """Collects one environment's fingerprints and writes them as a config pack zip.

    Create it before the seed calls you want recorded, call :meth:`capture` once the model
    and optimizer exist, train; the pack is saved after ``steps`` optimizer steps (or by
    :meth:`save`, or at interpreter exit). With ``world_size > 1`` write one pack per rank
    (``path`` may contain ``{rank}``).

    Nothing here fails the training run: every failure is noted in ``errors`` (and in the
    pack's manifest), the first one is also logged, and the pack goes on with what works.

    Secrets never leave the machine (docs/config-check.md, "Secrets"): with ``redact="hash"``
    (the default) secret values in ``env``, ``argv``, ``args`` and ``extra`` become
    ``<redacted:sha256:XXXXXXXX>`` (equal secrets stay equal across packs, but a short or
    common secret can be guessed from its digest); ``redact="drop"`` writes ``<redacted>``
    and keeps nothing of the value.
    """

    def __init__(
        self,
        path: Optional[str],
        steps: int = 3,
        weights_after: bool = False,
        autosave: bool = True,
        redact: str = "hash",
    ) -> None:
        #: None: not known yet (ConfigChecker.apply_patches listens before the tutorial
        #: names the zip); a pack without a path is not written, not even at exit.
        self.path = str(path) if path is not None else None
        self.steps = max(0, int(steps))
        self.weights_after = weights_after
        self.autosave = autosave
        self.errors: list[str] = []
        self.saved: Optional[str] = None
        self._guard = Guard(report_failure, self._note)
        self._step = 0
        self._calls_in_step = 0
        self._by_forward = False
        self._random = random_hooks.RandomLog()
        self._sections: dict[str, Any] = {}
        self._dataset: list[dict[str, Any]] = []
        self._weights: list[dict[str, Any]] = []
        self._handles: list[Any] = []
        self._model: Any = None
        self._rank = 0
        self._world_size = 1
        self.redact = redact if redact in MODES else "hash"
        if redact not in MODES:
            self._guard.fail(
                ValueError(f"redact={redact!r} is not one of {MODES}; using hash"), "init"
            )
        try:
            random_hooks.listen(self._random)
            atexit.register(self._at_exit)
        except Exception as e:  # noqa: BLE001 - must never fail the training run
            self._guard.fail(e, "init")

    def _collect_env(self) -> dict[str, Any]:
        return collect_env(mode=self.redact)

    def _note(self, exc: BaseException, what: str) -> None:
        self.errors.append(f"{what}: {exc!r}")

    # ---- public API
    @guarded("capture")
    def capture(
        self,
        model: Any = None,
        optimizer: Any = None,
        dataloader: Any = None,
        args: Any = None,
        scheduler: Any = None,
        scaler: Any = None,
        steps: Optional[int] = None,
        extra: Optional[dict[str, Any]] = None,
    ) -> ConfigPack:
        """Records env, packages, determinism, hyperparameters and the initial weights now,
        then fingerprints the model inputs and counts random draws for ``steps`` steps."""
        if steps is not None:
            self.steps = max(0, int(steps))
        self._rank = current_rank()
        self._world_size = world_size()
        self._model = model
        for name, fn in (
            ("env", self._collect_env),
            ("packages", collect_packages),
            ("determinism", collect_determinism),
        ):
            try:
                self._sections[name] = fn()
            except Exception as e:  # noqa: BLE001 - go on without this section
                self._guard.fail(e, name)
        self._sections["hyperparameters"] = collect_hyperparameters(
            args, optimizer, scheduler, scaler, dataloader, extra, self.redact
        )
        if model is not None:
            try:
                record_weights(self._weights, model, 0, self._rank)
            except Exception as e:  # noqa: BLE001 - go on without initial weights
                self._guard.fail(e, "weights")
        if self.steps > 0:
            if model is not None:
                self._handles.append(
                    model.register_forward_pre_hook(self._on_forward, with_kwargs=True)
                )
            if optimizer is not None and hasattr(optimizer, "register_step_post_hook"):
                self._handles.append(optimizer.register_step_post_hook(self._on_opt_step))
            self._by_forward = optimizer is None
            random_hooks.count_draws(self._random)
        elif self.autosave:
            self.save()
        return self

    @guarded("record_batch")
    def record_batch(self, batch: Any, name: str = "batch") -> None:
        """Fingerprints an arbitrary (nested) batch, e.g. with its labels, for this step."""
        if self._random.counting:
            add_tensor_records(self._dataset, batch, name, self._step, self._rank)

    @guarded("use_optimizer")
    def use_optimizer(self, optimizer: Any) -> None:
        """An optimizer first known after :meth:`capture` (ConfigChecker sees it at its
        first step): its hyperparameters are recorded, and steps end at :meth:`step` calls
        from now on, no longer at forwards. The caller calls :meth:`step` per optimizer
        step (hooking the optimizer here could not be undone from inside its own step)."""
        hyper = self._sections.get("hyperparameters")
        if isinstance(hyper, dict):
            hyper["optimizer"] = optimizer_info(optimizer)
        self._by_forward = False

    @guarded("step")
    def step(self) -> None:
        """Ends a step by hand (when no optimizer was given to :meth:`capture`)."""
        self._end_step()

    @guarded("forward hook")
    def _on_forward(self, module: Any, args: Any, kwargs: Any) -> None:
        if not self._random.counting:
            return
        if self._by_forward and self._calls_in_step > 0:
            self._end_step()
            if not self._random.counting:
                return
        record_forward_inputs(
            self._dataset, args, kwargs, self._calls_in_step, self._step, self._rank
        )
        self._calls_in_step += 1

    @guarded("optimizer hook")
    def _on_opt_step(self, *_: Any, **__: Any) -> None:
        self._end_step()

    def _end_step(self) -> None:
        if not self._random.counting:
            return
        self._step += 1
        self._calls_in_step = 0
        if self._step >= self.steps:
            self._stop_counting()
            if self.weights_after and self._model is not None:
                record_weights(self._weights, self._model, self._step, self._rank)
            if self.autosave:
                self.save()

    def _stop_counting(self) -> None:
        if not self._random.counting:
            return
        random_hooks.stop_counting(self._random)
        for h in self._handles:
            try:
                h.remove()
            except Exception:  # noqa: BLE001
                pass
        self._handles = []

    def contents(self) -> dict[str, Any]:
        """The pack's JSON documents by entry name (without the ``.json`` suffix)."""
        random_section = self._random.section()
        docs: dict[str, Any] = {
            "manifest": {
                "format": FORMAT,
                "version": VERSION,
                "producer": "probe-agent (python)",
                "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "device": device_kind(),
                "rank": self._rank,
                "world_size": self._world_size,
                "steps": min(self._step, self.steps) if self._model is not None else 0,
                "errors": [redact_value(e, self.redact) for e in self.errors],
            },
            **self._sections,
            "random": random_section,
        }
        if self._model is not None or self._dataset:
            docs["dataset"] = {"records": list(self._dataset)}
        if self._weights:
            docs["weights"] = {"records": list(self._weights)}
        return docs

    @guarded("save")
    def save(self, path: Optional[str] = None) -> Optional[str]:
        """Writes the zip (atomically); returns its path, or None when it could not."""
        try:
            return self._write(path)
        finally:
            random_hooks.unlisten(self._random)

    def _write(self, path: Optional[str]) -> str:
        self._stop_counting()
        where = path or self.path
        if where is None:
            raise ValueError("the pack has no path yet")
        target = where.replace("{rank}", str(self._rank))
        docs = self.contents()
        docs["manifest"]["entries"] = sorted(f"{k}.json" for k in docs)
        _write_zip(target, docs)
        self.saved = target
        return target

    def _at_exit(self) -> None:
        if self.saved is None and self.path is not None and random_hooks.is_listening(self._random):
            self.save()


def _write_zip(target: str, docs: dict[str, Any]) -> None:
    """One ``<name>.json`` entry per document, with fixed dates and modes, written to a
    temporary file beside ``target`` and renamed over it (readers never see half a pack)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name in sorted(docs):
            data = json.dumps(docs[name], indent=1, sort_keys=True, allow_nan=False)
            info = zipfile.ZipInfo(f"{name}.json", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, data)
    d = os.path.dirname(os.path.abspath(target))
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{os.path.basename(target)}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(buf.getvalue())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
