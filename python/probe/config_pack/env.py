"""Environment variables, with secrets replaced by digests.

Stray variables (``CUBLAS_WORKSPACE_CONFIG``, ``NCCL_*``, ``HCCL_*``, thread counts) change
numerics; a pack keeps every variable so a difference can be seen. Values of variables whose
names look secret never leave the machine: they are replaced by a digest, so two packs with
the same token still compare equal.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Optional

#: Parts of an environment variable name that mark its value as a secret (case-insensitive).
SECRET_MARKERS: tuple[str, ...] = (
    "TOKEN",
    "SECRET",
    "PASSW",
    "CREDENTIAL",
    "ACCESS",
    "AUTH",
    "PRIVATE",
    "COOKIE",
    "SESSION",
    "KEY",
)


def is_secret_name(name: str) -> bool:
    """True when the variable's value must not leave the machine (compared by digest)."""
    upper = name.upper()
    return any(m in upper for m in SECRET_MARKERS)


def redact(value: str) -> str:
    """The digest that replaces a secret value: equal values stay equal."""
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()


def collect_env(environ: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """The ``env`` section: every variable by name, secrets redacted and listed."""
    env = dict(os.environ if environ is None else environ)
    out: dict[str, str] = {}
    redacted: list[str] = []
    for k in sorted(env):
        if is_secret_name(k):
            out[k] = redact(env[k])
            redacted.append(k)
        else:
            out[k] = env[k]
    return {"vars": out, "redacted": redacted}
