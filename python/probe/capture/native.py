"""The one-pass statistics kernel of the ``probe`` binary, for CPU tensors.

Why: the statistics of a CPU tensor were three PyTorch reductions (``aminmax``, ``sum``, a
norm): three reads of the tensor and seven dispatcher calls, ~10 us for a small tensor and
~260 us for a 1M-element one: most of statistics mode's overhead on a CPU transformer
step. The kernel (``src/agent_stats.rs``) reads a float32 or bfloat16 tensor once
and returns max, min, sum and norm for ~2 us of call overhead.

How: the wheel ships the Rust program and no extension module, so the program carries the
kernel as a small shared library: ``probe agent-kernel --dir DIR`` writes it into the cache
folder (named by its content, written atomically) and prints its path, and ``ctypes`` loads
it. A view with gaps in its memory (a slice of channels, a chunk of a fused projection) is
read in place by the kernel's strided entry points, with the bits of a copy of it. :func:`load` does that (``stats.use_native``: once per process, at the first
``start()``) and checks the kernel against float64 reductions of a test tensor of each
dtype before it is used. Without the program, on a build without the kernel, with
``PROBE_NATIVE_STATS=0``, or when anything fails (logged once), the PyTorch reductions are
used as before.

Numbers (``docs/capture.md``, "sixth pass"): max and min exact; sum and norm accumulated in
float32 over 16 elements per lane, then in float64: within ~1e-6 of Σ|x| (Σx²) at any size,
deterministic. A tensor holding NaN or Inf is not handled by the kernel (it says so), and
takes PyTorch's path, which also counts them.
"""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

log = logging.getLogger("probe")

#: The kernel's interface version this agent speaks (``ABI`` in ``src/agent_stats.rs``).
ABI = 2

#: ``fn(data_ptr, numel, out) -> 1`` (done: ``out`` holds max, min, sum, norm) or ``0``
#: (not handled).
Kernel = Callable[[int, int, Any], int]
#: ``fn(data_ptr, ndim, sizes, strides, out) -> 1 or 0``: the same numbers of a view read in
#: place, its dimensions (int64 arrays) in the order to read them.
StridedKernel = Callable[[int, int, Any, Any, Any], int]


@dataclass(frozen=True)
class Kernels:
    """The kernels by dtype (float32, bfloat16): for contiguous memory, and for views with
    gaps read in place (the same bits as a copy of the view read contiguously)."""

    plain: dict[torch.dtype, Kernel]
    strided: dict[torch.dtype, StridedKernel]


def cache_dir() -> str:
    """Where the kernel's file is written: ``$PROBE_CACHE_DIR``, else ``probe`` in the XDG
    cache folder (``~/.cache/probe``)."""
    explicit = os.environ.get("PROBE_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "probe")


def load() -> Optional[Kernels]:
    """The kernels, or None when there are none to use.
    Each call asks the binary again: ``stats.use_native`` calls it once per process."""
    if os.environ.get("PROBE_NATIVE_STATS", "1") == "0":
        return None
    try:
        kernels = _open(_write())
        _self_test(kernels)
    except Exception as exc:  # noqa: BLE001 - an optional speed-up: never fail capture
        log.info("probe: CPU statistics use PyTorch's reductions (no native kernel: %s)", exc)
        return None
    return kernels


def _write() -> str:
    from .._cli import binary

    done = subprocess.run(
        [binary(), "agent-kernel", "--dir", cache_dir()],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip() or f"probe agent-kernel exited {done.returncode}")
    return done.stdout.strip()


def _open(path: str) -> Kernels:
    lib = ctypes.CDLL(path)
    lib.probe_stats_abi.restype = ctypes.c_uint32
    lib.probe_stats_abi.argtypes = []
    abi = lib.probe_stats_abi()
    if abi != ABI:
        raise RuntimeError(f"{path}: kernel interface {abi}, this agent speaks {ABI}")
    plain: dict[torch.dtype, Kernel] = {}
    strided: dict[torch.dtype, StridedKernel] = {}
    for dtype, name in ((torch.float32, "probe_stats_f32"), (torch.bfloat16, "probe_stats_bf16")):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        plain[dtype] = fn
        fn = getattr(lib, f"{name}_strided")
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_void_p] * 3
        strided[dtype] = fn
    return Kernels(plain, strided)


def _self_test(kernels: Kernels) -> None:
    """The kernel must agree with float64 reductions of the same values (1e-6), and read a
    view with gaps as it reads a copy of it (the same bits), before the agent trusts it with
    a dump."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4099, generator=g) * 3 + 0.5
    for dtype, fn in kernels.plain.items():
        t = base.to(dtype)
        out = (ctypes.c_double * 4)()
        if fn(t.data_ptr(), t.numel(), out) != 1:
            raise RuntimeError(f"the kernel refused a finite {dtype} tensor")
        x = t.double()
        want = [x.max().item(), x.min().item(), x.sum().item(), x.norm().item()]
        scale = [1.0, 1.0, x.abs().sum().item(), want[3]]
        for got, w, s in zip(out, want, scale):
            if abs(got - w) > 1e-6 * s:
                raise RuntimeError(f"the kernel's {dtype} statistics disagree: {list(out)}")
        view = t[: 64 * 60].view(64, 60)[:, 3:50]  # rows of 47 with gaps between them
        copy = view.contiguous()
        dims = ctypes.c_int64 * 2
        here = (ctypes.c_double * 4)()
        done = kernels.strided[dtype](
            view.data_ptr(), 2, dims(*view.shape), dims(*view.stride()), here
        )
        if done != 1 or fn(copy.data_ptr(), copy.numel(), out) != 1 or here[:] != out[:]:
            raise RuntimeError(f"the kernel reads a {dtype} view otherwise than its copy")
