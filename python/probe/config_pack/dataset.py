"""Dataset fingerprints: the exact model inputs of the first steps.

A different shuffle, augmentation or preprocessing shows up as different input bytes at
step 0 long before it shows up in a loss curve. The pack hooks the model's forward and
fingerprints every tensor argument of each call.
"""

from __future__ import annotations

from typing import Any

from .fingerprint import add_tensor_records


def record_forward_inputs(
    out: list[dict[str, Any]], args: Any, kwargs: Any, call: int, step: int, rank: int
) -> None:
    """Append the records of one forward call's tensor arguments (``args.0``, ``kwargs.x``;
    the second and later calls of a step are prefixed ``call1.``, ``call2.`` ...)."""
    prefix = "" if call == 0 else f"call{call}."
    add_tensor_records(out, list(args), prefix + "args", step, rank)
    if kwargs:
        add_tensor_records(out, dict(kwargs), prefix + "kwargs", step, rank)
