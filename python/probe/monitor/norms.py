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


def counted_on_host(t: torch.Tensor) -> bool:
    """Whether the NaN/Inf counts of tensors on ``t``'s device are taken on the host, only
    where a norm is not finite (the CPU: reading a value costs no device sync), or on the
    device, every tensor's (an accelerator). Tests switch it off to run the device path on
    the CPU."""
    return t.device.type == "cpu"


#: On an accelerator, tensors of at most this many elements have their NaN/Inf elements
#: counted together (one concatenation and a few kernels per chunk of :data:`CHUNK`
#: elements): a kernel launch costs more than counting a small tensor, and a launch-bound
#: step has dozens of small ones (biases, norms' weights). Larger tensors are counted one
#: by one (two kernels each, little beside their own step's work).
SMALL = 1 << 20
CHUNK = 1 << 22


def count_nonfinite(t: torch.Tensor) -> torch.Tensor:
    """The NaN/Inf elements of ``t``, as a 0-d float32 tensor on its device, in two kernels
    (``torch.isfinite`` takes four on CUDA): ``t - t`` is 0 where ``t`` is finite and NaN
    elsewhere, and its "0-norm" counts what is not 0. Exact up to 2**24 of them."""
    d = t.detach()
    count: torch.Tensor = torch.linalg.vector_norm(d - d, ord=0, dtype=torch.float32)
    return count


def nonfinite_counts(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The NaN/Inf counts of ``tensors``, as a float32 vector on their device: the small
    tensors of one dtype a chunk at a time, each large one apart."""
    counts: list[Optional[torch.Tensor]] = [None] * len(tensors)
    chunks: dict[tuple[torch.dtype, torch.device], list[tuple[int, list[int]]]] = {}
    for i, t in enumerate(tensors):
        n = t.numel()
        if n > SMALL or n == 0:
            counts[i] = count_nonfinite(t).reshape(1)
            continue
        groups = chunks.setdefault((t.dtype, t.device), [(0, [])])
        if groups[-1][1] and groups[-1][0] + n > CHUNK:
            groups.append((0, []))
        size, members = groups[-1]
        members.append(i)
        groups[-1] = (size + n, members)
    for groups in chunks.values():
        for _, group in groups:
            for i, c in zip(group, _chunk_counts([tensors[i] for i in group])):
                counts[i] = c
    return torch.cat([c for c in counts if c is not None])


#: The segment lengths of the chunks counted lately, on their device (a chunk's layout is
#: the same every step: uploaded once).
_LENGTHS: dict[tuple[torch.device, tuple[int, ...]], torch.Tensor] = {}


def _chunk_counts(chunk: list[torch.Tensor]) -> list[torch.Tensor]:
    """The NaN/Inf counts of tensors of one dtype and device, as 1-element tensors."""
    flat = torch.cat([t.detach().reshape(-1) for t in chunk])
    key = (flat.device, tuple(t.numel() for t in chunk))
    lengths = _LENGTHS.get(key)
    if lengths is None:
        if len(_LENGTHS) >= 64:
            _LENGTHS.clear()
        lengths = _LENGTHS[key] = torch.tensor(key[1]).to(flat.device)
    bad = (flat - flat).ne(0).to(torch.float32)  # NaN != 0
    try:
        sums = torch.segment_reduce(bad, "sum", lengths=lengths)
    except (RuntimeError, NotImplementedError):  # a backend without segment_reduce
        return [count_nonfinite(t).reshape(1) for t in chunk]
    return list(torch.split(sums, 1))


def nonfinite(
    tensors: Sequence[torch.Tensor], norm: torch.Tensor
) -> Union[np.ndarray, torch.Tensor]:
    """The NaN/Inf counts of ``tensors``, given ``norm``, their norms as a vector.

    A tensor with a finite norm has none, so on the CPU (where reading a value costs no
    device sync) only the tensors with a non-finite norm are counted, and the counts are a
    host array; elsewhere :func:`nonfinite_counts`' device vector."""
    if counted_on_host(norm):
        counts = np.zeros(len(tensors))
        host = norm.numpy()
        if not np.isfinite(host).all():
            for i in np.flatnonzero(~np.isfinite(host)).tolist():
                t = tensors[i].detach()
                counts[i] = float(t.numel() - int(torch.isfinite(t).sum()))
        return counts
    return nonfinite_counts(tensors)


def output_count(t: torch.Tensor, norm: torch.Tensor) -> Any:
    """The NaN/Inf count of one output ``t`` of norm ``norm`` on the CPU: 0 unless the
    norm is not finite (on an accelerator the hook takes :func:`count_nonfinite`)."""
    if math.isfinite(norm.item()):
        return 0
    return t.numel() - int(torch.isfinite(t).sum())


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
