"""Weight fingerprints: the model's parameters at step 0 (and optionally after training).

Runs that should be identical but start from other initial weights (another seed, a
different init order, a checkpoint that did not load) are found by comparing these.
"""

from __future__ import annotations

from typing import Any

from .fingerprint import tensor_fingerprint


def record_weights(out: list[dict[str, Any]], model: Any, step: int, rank: int) -> None:
    """Append one record per named parameter of ``model``, in ``named_parameters`` order."""
    for name, p in model.named_parameters():
        out.append({"step": step, "rank": rank, "name": name, "fingerprint": tensor_fingerprint(p)})
