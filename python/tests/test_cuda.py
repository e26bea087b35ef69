"""Capture on CUDA: the fused statistics kernel and no host sync per op.

Skipped without a GPU (CI has none); ``scripts/cuda_check.sh`` runs them on one. Expected
values are computed here independently, in float64 on the CPU.
"""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import probe
from conftest import Halve, read_ops
from fused_interp_check import reference, same
from probe.capture import fused
from probe.capture.buffer import StatsBuffer
from probe.capture.stats import finish_stats, stat_vector

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _numbers(vec: Any) -> list[float]:
    """The six numbers of a statistics vector: a fused slab slot, or a device vector."""
    if isinstance(vec, tuple):
        slab, k = vec
        return list(slab.values()[k * 6 : (k + 1) * 6])
    return list(vec.tolist())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 7, 1000, 32768, 32769, (1 << 20) + 3, 5_000_001])
@pytest.mark.parametrize("poison", [None, "nan", "inf", "both"])
def test_fused_statistics_match_a_float64_reference(
    dtype: torch.dtype, n: int, poison: Any
) -> None:
    g = torch.Generator(device="cuda").manual_seed(n)
    t = (torch.randn(n, generator=g, device="cuda") * 3 + 0.5).to(dtype)
    if poison in ("nan", "both"):
        t[n // 2] = math.nan
    if poison in ("inf", "both"):
        t[n // 3] = -math.inf
        t[n - 1] = math.inf
    with torch.no_grad():
        vec = stat_vector(t)
    assert isinstance(vec, tuple), "the fused kernel was not used"
    got = finish_stats(_numbers(vec), n, None)
    want = reference(t)
    assert (got["nan"], got["inf"]) == (want["nan"], want["inf"])
    assert same(got["max"], want["max"], 0.0) and same(got["min"], want["min"], 0.0)
    # Sums in float64 lanes: rounding far below float32's.
    assert same(got["mean"], want["mean"], 1e-12 * max(1.0, want["scale"]) / n), (got, want)
    assert same(got["norm"], want["norm"], 1e-12 * max(1.0, want["norm"])), (got, want)


@pytest.mark.parametrize(
    "view,fused_path",
    [
        (lambda b: b.permute(0, 2, 3, 1), True),  # channels-last
        (lambda b: b.transpose(1, 2), True),  # attention heads
        (lambda b: b[1:].transpose(0, 3), True),  # permuted, past the storage's start
        (lambda b: b[:, ::2], False),  # gaps: PyTorch's reductions
        (lambda b: b[:1].expand(3, 16, 40, 50), False),  # repeats: PyTorch's reductions
    ],
)
def test_transposed_tensors_take_the_fused_kernel_in_memory_order(
    view: Any, fused_path: bool
) -> None:
    g = torch.Generator(device="cuda").manual_seed(5)
    base = torch.randn(4, 16, 40, 50, generator=g, device="cuda", dtype=torch.bfloat16)
    base.view(-1)[777] = math.inf
    t = view(base)
    assert not t.is_contiguous()
    with torch.no_grad():
        vec = stat_vector(t)
    assert isinstance(vec, tuple) == fused_path
    got = finish_stats(_numbers(vec), t.numel(), None)
    want = reference(t)
    assert (got["nan"], got["inf"]) == (want["nan"], want["inf"])
    assert same(got["max"], want["max"], 0.0) and same(got["min"], want["min"], 0.0)
    assert same(got["norm"], want["norm"], 1e-5 * want["norm"]), (got, want)


def test_fused_and_pytorch_reductions_agree_within_float32_rounding(monkeypatch: Any) -> None:
    """The fused kernel against the PyTorch reductions it replaces (the path without
    Triton): same counts and extremes, sums within float32 accumulation error."""
    t = torch.randn(3, 1000, 777, device="cuda") * 10
    with torch.no_grad():
        fast = stat_vector(t)
        monkeypatch.setattr(fused, "_launch", False)
        slow = stat_vector(t)
    assert isinstance(fast, tuple) and isinstance(slow, torch.Tensor)
    a = finish_stats(_numbers(fast), t.numel(), None)
    b = finish_stats(_numbers(slow), t.numel(), None)
    assert a["max"] == b["max"] and a["min"] == b["min"] and a["nan"] == b["nan"] == 0
    assert abs(a["norm"] - b["norm"]) <= 1e-5 * a["norm"]
    assert abs(a["mean"] - b["mean"]) <= 1e-5 * float(t.abs().mean())


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 256)
        self.norm = nn.LayerNorm(256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(F.gelu(self.fc1(x))).transpose(0, 1).t())


def _train_without_syncs(dump: str, mode: str, level: str) -> tuple[Any, list[torch.Tensor]]:
    """Three captured steps of twelve optimizer steps each, with PyTorch's sync debugging set
    to raise: any host sync inside a step (an ``.item()``, a blocking copy) would make the
    agent switch itself off. Returns the debugger and fc1's outputs, kept by a hook."""
    torch.manual_seed(0)
    model = Net().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[torch.Tensor] = []
    model.fc1.register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    dbg = probe.Debugger(None, dump_path=dump, mode=mode, level=level)
    x = torch.randn(32, 64, device="cuda")
    y = torch.randint(0, 10, (32,), device="cuda")
    for _ in range(3):
        dbg.start(model)
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(12):  # more ops than the stats buffer keeps in flight
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x), y).backward()
                opt.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        dbg.stop()
        dbg.step()
    dbg.close()
    assert dbg.enabled, "capture switched itself off: a host sync inside a step?"
    return dbg, seen


def _fc1_output(dump: str, level: str) -> dict[str, Any]:
    ops = read_ops(os.path.join(dump, "step0", "rank0"))
    key = "Module.fc1.Linear.forward.0" if level == "mix" else "Functional.linear.0.forward"
    rec = next(op for op in ops if op["op"] == key)
    out: dict[str, Any] = next(t for t in rec["tensors"] if t["role"] == "output")
    return out


@pytest.mark.parametrize("level", ["api", "mix"])
def test_statistics_capture_on_cuda_never_syncs_and_records_true_values(
    tmp_path: Any, level: str
) -> None:
    """Statistics mode: records complete and in order, and an activation's statistics those
    of the tensor itself (reduced here in float64 on the CPU)."""
    dump = str(tmp_path / "dump")
    _, seen = _train_without_syncs(dump, "statistics", level)
    for step in range(3):
        ops = read_ops(os.path.join(dump, f"step{step}", "rank0"))
        assert [op["seq"] for op in ops] == list(range(len(ops)))
        assert len(ops) > (StatsBuffer.MAX_IN_FLIGHT + 1) * StatsBuffer.LIMIT
        for op in ops:
            for t in op["tensors"]:
                assert t["stats"]["max"] is not None, (op["op"], t)
    want = reference(seen[0])
    got = _fc1_output(dump, level)["stats"]
    assert got["max"] == want["max"] and got["min"] == want["min"]
    assert abs(got["mean"] - want["mean"]) <= 1e-9 * max(1.0, want["scale"] / seen[0].numel())
    assert abs(got["norm"] - want["norm"]) <= 1e-9 * want["norm"]


def test_tensor_capture_on_cuda_never_syncs_and_stores_the_values_of_the_time(
    tmp_path: Any,
) -> None:
    """Tensor mode copies to pinned host buffers without waiting; the writer thread waits
    for each copy. The stored activation must be the tensor as the op produced it, though
    later steps change the weights in place and reuse the memory."""
    from safetensors.torch import load_file

    dump = str(tmp_path / "dump")
    _, seen = _train_without_syncs(dump, "tensor", "api")
    out = _fc1_output(dump, "api")
    folder = os.path.join(dump, "step0", "rank0")
    stored = load_file(os.path.join(folder, out["file"]))[out["name"]]
    assert torch.equal(stored, seen[0].cpu())
    last = read_ops(os.path.join(dump, "step2", "rank0"))
    ups = [op for op in last if op["op"].startswith("Functional.linear.") and op["direction"] == "forward"]
    t = next(t for t in ups[-2]["tensors"] if t["role"] == "output")
    got = load_file(os.path.join(dump, "step2", "rank0", t["file"]))[t["name"]]
    assert torch.equal(got, seen[-1].cpu())


def test_checksum_capture_on_cuda_never_syncs_and_hashes_the_bytes_of_the_time(
    tmp_path: Any,
) -> None:
    """Checksum mode copies to pinned host buffers without waiting and checksums each copy
    once its batch has landed: an activation's checksum is that of the tensor as the op
    produced it (the first step's and the last's, though the weights changed in between)."""
    from probe.capture.stats import crc32_of

    dump = str(tmp_path / "dump")
    _, seen = _train_without_syncs(dump, "checksum", "api")
    for step in range(3):
        for op in read_ops(os.path.join(dump, f"step{step}", "rank0")):
            for t in op["tensors"]:
                assert t["checksum"].startswith("crc32:"), (op["op"], t)
    assert _fc1_output(dump, "api")["checksum"] == crc32_of(seen[0].cpu())
    last = read_ops(os.path.join(dump, "step2", "rank0"))
    ups = [op for op in last if op["op"].startswith("Functional.linear.") and op["direction"] == "forward"]
    t = next(t for t in ups[-2]["tensors"] if t["role"] == "output")
    assert t["checksum"] == crc32_of(seen[-1].cpu())


@pytest.mark.parametrize("level", ["api", "mix"])
@pytest.mark.parametrize("reentrant", [False, True])
def test_the_backward_on_autograds_device_thread_is_captured_as_on_cpu(
    tmp_path: Any, reentrant: bool, level: str
) -> None:
    """Autograd runs a CUDA backward on a device thread of its own: a checkpoint's recompute
    and the calls of a custom function's backward run there, and were missing from a CUDA
    dump. The same step on CUDA and on the CPU writes the same records, with statistics
    within float32 rounding."""
    from torch.utils.checkpoint import checkpoint

    def run(device: str) -> list[dict[str, Any]]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.GELU()).to(device)
        x = torch.randn(2, 4).to(device).requires_grad_()
        dump = str(tmp_path / device)
        dbg = probe.Debugger(None, dump_path=dump, level=level)
        dbg.start(model)
        loss = checkpoint(lambda t: Halve.apply(model(t)), x, use_reentrant=reentrant).sum()
        loss.backward()
        dbg.stop()
        dbg.close()
        return read_ops(os.path.join(dump, "step0", "rank0"))

    cpu, gpu = run("cpu"), run("cuda")
    assert sorted((o["op"], o.get("recompute")) for o in gpu) == sorted(
        (o["op"], o.get("recompute")) for o in cpu
    )
    marks = {o["op"]: o.get("recompute") for o in gpu}
    assert marks["Functional.linear.1.forward"] is True  # the checkpoint's recompute
    assert marks["Torch.mul.0.forward"] is False  # Halve's backward
    want = {(o["op"], t["name"]): t["stats"] for o in cpu for t in o["tensors"]}
    for o in gpu:
        for t in o["tensors"]:
            w, g = want[(o["op"], t["name"])], t["stats"]
            if w is None or g is None:
                assert w == g, (o["op"], t["name"])
                continue
            for k in ("max", "min", "mean", "norm"):
                assert abs(g[k] - w[k]) <= 1e-5 * max(1.0, abs(w[k])), (o["op"], t["name"], k)
