"""The tensor side of the monitor: norms and non-finite counts, and the per-module sums.

Why squares: a module's norm over several tensors (its parameters, or every output of every
call in a step) is the square root of the sum of their squared norms, so every tensor is
reduced once on its device (``torch._foreach_norm`` over one list per step where it can,
fp32 accumulation), the step's norms go to the host as one vector, and the per-module sums
of their squares are one float64 matrix-vector product there with the module x parameter
membership matrix (numpy: a few dozen numbers, no device kernel launches per module).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any, Optional, Union

import numpy as np
import torch

#: How deep :func:`floating_tensors` looks into nested outputs (tuples of dicts of ...).
MAX_NESTING = 6


def norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The L2 norm of each tensor, accumulated in fp32, as 0-d fp32 tensors (no autograd:
    call under ``torch.no_grad()``)."""
    if not tensors:
        return []
    try:
        return list(torch._foreach_norm(tensors, 2, dtype=torch.float32))
    except (TypeError, RuntimeError):  # torch < 2.3 (no dtype), or mixed devices
        return [torch.linalg.vector_norm(t, dtype=torch.float32) for t in tensors]


def nonfinite(
    tensors: Sequence[torch.Tensor], norm: torch.Tensor
) -> Union[np.ndarray, torch.Tensor]:
    """How many NaN/Inf elements each tensor holds, given ``norm``, their norms as a vector.

    A tensor with a finite norm has none, so on the CPU (where reading a value costs no
    device sync) only the tensors with a non-finite norm are counted, and the counts are a
    host array; elsewhere every tensor is counted on the device (numel minus its finite
    elements: two kernels each) into a float32 vector."""
    if norm.device.type == "cpu":
        counts = np.zeros(len(tensors))
        host = norm.numpy()
        if not np.isfinite(host).all():
            for i in np.flatnonzero(~np.isfinite(host)).tolist():
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


#: Which parameters a list of per-parameter values covers: their indices in
#: ``Membership.params``, or None for all of them in order (the common case, cached).
Which = Optional[list[int]]


class Membership:
    """Which parameters each monitored module holds (recursively, each parameter once).

    ``params`` are the distinct parameters of the modules, the root's first; ``member`` the
    (modules x params) bool matrix, ``weights`` the same as float64 for the sums."""

    def __init__(self, modules: Sequence[torch.nn.Module]) -> None:
        self.params: list[torch.Tensor] = []
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
        self.weights = self.member.astype(np.float64)
        self.has_params = np.asarray(self.member.any(axis=1))

    def sums(self, which: Which, values: np.ndarray) -> np.ndarray:
        """Per module: the sum of ``values`` (one per parameter of ``which``), float64."""
        if which is None:
            out: np.ndarray = self.weights @ values
            return out
        if not which:
            return np.zeros(len(self.member))
        out = self.weights[:, which] @ values
        return out

    def module_norms(self, groups: list[tuple[Which, np.ndarray]]) -> list[np.ndarray]:
        """Per group of per-parameter norms (of the parameters ``which``): the per-module
        norms, the square roots of the sums of their squares (float64); the groups over
        every parameter in one matrix product."""
        out: list[np.ndarray] = [np.zeros(0)] * len(groups)
        full = [k for k, (which, _) in enumerate(groups) if which is None]
        if full:
            x = np.stack([groups[k][1] for k in full])
            sums = np.sqrt(self.weights @ (x * x).T)
            for j, k in enumerate(full):
                out[k] = sums[:, j]
        for k, (which, values) in enumerate(groups):
            if which is not None:
                out[k] = np.sqrt(self.sums(which, values * values))
        return out

    def present(self, which: Which) -> np.ndarray:
        """Per module: whether it holds one of the parameters ``which``."""
        if which is None:
            return self.has_params
        present: np.ndarray = np.asarray(self.member[:, which].any(axis=1))
        return present
