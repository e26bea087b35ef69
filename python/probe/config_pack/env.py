"""Environment variables, with secrets redacted.

Stray variables (``CUBLAS_WORKSPACE_CONFIG``, ``NCCL_*``, ``HCCL_*``, thread counts) change
numerics; a pack keeps every variable so a difference can be seen. Secrets never leave the
machine: values of secret-named variables, and secrets found inside any value (URL
passwords, token-shaped or high-entropy words), are replaced by a short digest (or dropped);
the rules are in :mod:`.redaction`.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from .redaction import NAME_PARTS, is_secret_name, marker, redact_named

#: Name parts that mark a variable's value as a secret (case-insensitive, whole parts).
SECRET_MARKERS: tuple[str, ...] = tuple(sorted(NAME_PARTS))

__all__ = ["SECRET_MARKERS", "collect_env", "is_secret_name", "redact"]


def redact(value: str, mode: str = "hash") -> str:
    """The marker that replaces a secret value: equal values give equal markers."""
    return marker(value, mode)


def collect_env(environ: Optional[dict[str, str]] = None, mode: str = "hash") -> dict[str, Any]:
    """The ``env`` section: every variable by name, secrets redacted; ``redacted`` lists
    the variables whose value was changed."""
    env = dict(os.environ if environ is None else environ)
    out: dict[str, str] = {}
    redacted: list[str] = []
    for k in sorted(env):
        v = redact_named(k, env[k], mode)
        out[k] = v
        if v != env[k]:
            redacted.append(k)
    return {"vars": out, "redacted": redacted}
