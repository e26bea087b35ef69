"""Hyperparameters: command line, user arguments, optimizer, scheduler, scaler, data loader.

A different learning rate, epsilon, loss-scale schedule or batch size explains many
"diverging" runs by itself; a pack records what the objects say about themselves (param
group settings, scheduler state, scaler settings, loader settings) rather than what the
script meant to pass them.

``argv``, ``args`` and ``extra`` are user text and may hold secrets (``--token X``,
``hf_token``, a database URL): they are redacted by the rules of :mod:`.redaction`.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

from .fingerprint import jsonable
from .redaction import redact_argv, redact_tree


def collect_hyperparameters(
    args: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    scaler: Any = None,
    dataloader: Any = None,
    extra: Optional[dict[str, Any]] = None,
    mode: str = "hash",
) -> dict[str, Any]:
    """The ``hyperparameters`` section: ``argv`` plus a summary of each object given;
    secrets in ``argv``, ``args`` and ``extra`` redacted (``mode``: ``hash`` or ``drop``)."""
    hp: dict[str, Any] = {"argv": redact_argv([str(a) for a in sys.argv], mode)}
    if args is not None:
        raw = jsonable(vars(args) if hasattr(args, "__dict__") else args)
        hp["args"] = redact_tree(raw, "args", mode)
    if optimizer is not None:
        hp["optimizer"] = optimizer_info(optimizer)
    if scheduler is not None:
        hp["scheduler"] = _scheduler_info(scheduler)
    if scaler is not None:
        hp["scaler"] = _scaler_info(scaler)
    if dataloader is not None:
        hp["dataloader"] = _dataloader_info(dataloader)
    if extra:
        hp["extra"] = redact_tree(jsonable(extra), "extra", mode)
    return hp


def optimizer_info(opt: Any) -> dict[str, Any]:
    groups = []
    for g in getattr(opt, "param_groups", []):
        d = {k: jsonable(v) for k, v in g.items() if k != "params"}
        d["num_params"] = len(g.get("params", []))
        d["num_elements"] = int(sum(int(p.numel()) for p in g.get("params", [])))
        groups.append(d)
    cls = type(opt)
    return {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "defaults": jsonable(getattr(opt, "defaults", {})),
        "param_groups": groups,
    }


def _scheduler_info(s: Any) -> dict[str, Any]:
    cls = type(s)
    state = {}
    try:
        state = {k: jsonable(v) for k, v in s.state_dict().items() if k != "optimizer"}
    except Exception:  # noqa: BLE001
        pass
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "state": state}


def _scaler_info(s: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"class": f"{type(s).__module__}.{type(s).__qualname__}"}
    for k in ("is_enabled", "get_scale", "get_growth_factor", "get_backoff_factor"):
        try:
            d[k.replace("get_", "").replace("is_", "")] = jsonable(getattr(s, k)())
        except Exception:  # noqa: BLE001
            pass
    try:
        d["growth_interval"] = jsonable(s.get_growth_interval())
    except Exception:  # noqa: BLE001
        pass
    return d


def _dataloader_info(dl: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"class": f"{type(dl).__module__}.{type(dl).__qualname__}"}
    for k in ("batch_size", "drop_last", "num_workers", "pin_memory"):
        if hasattr(dl, k):
            d[k] = jsonable(getattr(dl, k))
    for k in ("sampler", "batch_sampler", "dataset"):
        v = getattr(dl, k, None)
        if v is not None:
            d[k] = type(v).__qualname__
    try:
        d["dataset_len"] = len(dl.dataset)
    except Exception:  # noqa: BLE001
        pass
    return d
