"""Config packs: a small zip of fingerprints of one training environment.

Why: half of all "the NPU run diverges" reports are a different package, a missing seed,
a shuffled dataset, other initial weights or a stray env var. Each side packs a zip and
``probe config-check gpu.zip npu.zip`` says exactly what differs. Format: docs/config-check.md
and schemas/probe-config-pack.v2.schema.json (version 1: .v1.schema.json).

Usage::

    pack = probe.ConfigPack("gpu.zip", steps=3)    # before seeding: seed calls are recorded
    torch.manual_seed(1234)
    model, opt, dl = ...
    pack.capture(model=model, optimizer=opt, dataloader=dl, args=vars(args))
    for batch in dl: ...                           # the first 3 steps are fingerprinted
    # the pack is saved after step 3 (or call pack.save(); or at interpreter exit)

Nothing here may fail the training run: every hook catches its errors, logs the first one
and carries on; a pack that cannot be written is reported and skipped.

One module per section: ``env``, ``packages``, ``determinism``, ``random_hooks`` (seed calls,
draws, generator states), ``dataset`` (model inputs), ``weights``, ``hyperparameters``;
``fingerprint`` (JSON-safe values, tensor digests) serves them all, and ``pack`` holds the
:class:`ConfigPack` facade and the zip writer; ``checker`` the tutorial's ``ConfigChecker``
over it.
"""

from __future__ import annotations

# Reachable as probe.config_pack.hashlib, as it was when this package was one module (the
# tests compute expected digests through it).
import hashlib  # noqa: F401

from .._runtime import current_rank, device_kind
from .checker import ConfigChecker
from .determinism import collect_determinism
from .env import SECRET_MARKERS, collect_env, is_secret_name, redact
from .fingerprint import jsonable, tensor_fingerprint
from .pack import FORMAT, VERSION, ConfigPack
from .packages import cann_version, collect_packages
from .random_hooks import call_site, rng_state_hashes

__all__ = [
    "FORMAT",
    "SECRET_MARKERS",
    "VERSION",
    "ConfigChecker",
    "ConfigPack",
    "call_site",
    "cann_version",
    "collect_determinism",
    "collect_env",
    "collect_packages",
    "current_rank",
    "device_kind",
    "is_secret_name",
    "jsonable",
    "redact",
    "rng_state_hashes",
    "tensor_fingerprint",
]
