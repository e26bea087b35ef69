"""The tensor side of the monitor: squared norms and non-finite counts, per module.

Why squares: a module's norm over several tensors (its parameters, or every output of every
call in a step) is the square root of the sum of their squared norms, so every tensor is
reduced once (``torch._foreach_norm`` over a list where it can, fp32 accumulation) and
the per-module sums are one matrix-vector product with the module x parameter membership
matrix (float64 where the device has it: sums of squares of large norms lose less).
Everything stays on the model's device; the monitor copies one vector to the host per step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

#: How deep :func:`floating_tensors` looks into nested outputs (tuples of dicts of ...).
MAX_NESTING = 6


def sum_dtype(device: torch.device) -> torch.dtype:
    """The dtype of the per-module sums: float64 where the device computes it."""
    return torch.float32 if device.type == "mps" else torch.float64


def norms(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of each tensor, accumulated in fp32, as one fp32 vector."""
    detached = [t.detach() for t in tensors]
    try:
        parts = list(torch._foreach_norm(detached, 2, dtype=torch.float32))
    except (TypeError, RuntimeError):  # torch < 2.3 (no dtype), or mixed devices
        parts = [torch.linalg.vector_norm(t, dtype=torch.float32) for t in detached]
    return torch.stack(parts)


def nonfinite(tensors: Sequence[torch.Tensor], norm: torch.Tensor) -> torch.Tensor:
    """How many NaN/Inf elements each tensor holds, as a vector like ``norm`` (their norms).

    A tensor with a finite norm has none, so on the CPU (where reading a value costs no
    device sync) only the tensors with a non-finite norm are counted; elsewhere every
    tensor is counted on the device (numel minus its finite elements: two kernels each)."""
    if norm.device.type == "cpu":
        counts = torch.zeros(len(tensors), dtype=torch.float32)
        bad = (~torch.isfinite(norm)).nonzero().flatten().tolist()
        for i in bad:
            t = tensors[i].detach()
            counts[i] = float(t.numel() - int(torch.isfinite(t).sum()))
        return counts
    finite = torch.stack([torch.isfinite(t.detach()).sum() for t in tensors])
    sizes = torch.tensor([t.numel() for t in tensors], dtype=torch.float32)
    return sizes.to(norm.device, non_blocking=True) - finite.to(torch.float32)


def output_count(t: torch.Tensor, norm: torch.Tensor) -> Any:
    """The NaN/Inf count of one output ``t`` of norm ``norm``: an int on the CPU (0 unless
    the norm is not finite), else a device tensor."""
    if norm.device.type == "cpu":
        if math.isfinite(norm.item()):
            return 0
        return t.numel() - int(torch.isfinite(t).sum())
    return t.numel() - torch.isfinite(t).sum()


def floating_tensors(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Every floating-point tensor in a module's output: a tensor, or nested tuples, lists
    and dicts of them (transformers' ``ModelOutput`` is a dict)."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and not value.is_sparse:
            yield value.detach()
    elif depth < MAX_NESTING:
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, (list, tuple)):
            for item in value:
                yield from floating_tensors(item, depth + 1)


class Membership:
    """Which parameters each monitored module holds (recursively, each parameter once).

    ``params`` are the distinct parameters of the modules, the root's first; ``member`` the
    host's (modules x params) bool matrix; ``matrix`` the same on the device, to sum
    per-parameter squares per module."""

    def __init__(self, modules: Sequence[torch.nn.Module], device: torch.device) -> None:
        self.params: list[torch.nn.Parameter] = []
        position: dict[int, int] = {}
        rows: list[list[int]] = []
        for mod in modules:
            row = []
            for p in mod.parameters():
                j = position.setdefault(id(p), len(self.params))
                if j == len(self.params):
                    self.params.append(p)
                row.append(j)
            rows.append(row)
        self.member = np.zeros((len(modules), len(self.params)), dtype=bool)
        for i, row in enumerate(rows):
            self.member[i, row] = True
        self.device = device
        self.dtype = sum_dtype(device)
        self.matrix = torch.from_numpy(self.member).to(device=device, dtype=self.dtype)

    def per_module(self, which: Sequence[int], values: torch.Tensor) -> torch.Tensor:
        """Sum ``values`` (one per parameter ``params[which[k]]``) per module."""
        if len(which) == len(self.params):
            return self.matrix @ values.to(self.dtype)
        return self.matrix[:, list(which)] @ values.to(self.dtype)

    def present(self, which: Sequence[int]) -> np.ndarray:
        """Per module: whether it holds one of the parameters ``which``."""
        present: np.ndarray = np.asarray(self.member[:, list(which)].any(axis=1))
        return present

    def squares(self, which: Sequence[int], tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """Per module: the sum of the squared norms of ``tensors`` (one per ``which``)."""
        if not tensors:
            return torch.zeros(len(self.member), dtype=self.dtype, device=self.device)
        n = norms(tensors).to(self.dtype)
        return self.per_module(which, n * n)

    def squares_and_counts(
        self, which: Sequence[int], tensors: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per module: the sum of squared norms and the NaN/Inf count of ``tensors``."""
        if not tensors:
            zero = torch.zeros(len(self.member), dtype=self.dtype, device=self.device)
            return zero, zero
        n = norms(tensors)
        counts = nonfinite(tensors, n)
        wide = n.to(self.dtype)
        return self.per_module(which, wide * wide), self.per_module(which, counts)
