"""Who writes tensor mode's data: the writer thread (from host copies) or the training thread
itself (``tensor_writer: inline``, the ``auto`` choice of a CPU run with no core to spare).

Both must write the same bytes: the values each tensor had when it was captured, whatever
the training does to it afterwards.
"""

from __future__ import annotations

import filecmp
import os
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

import probe
from conftest import Tiny, load_example, read_ops
from probe.capture import writer
from probe.config import ConfigError

WRITERS = ["thread", "inline"]


def _shard_tensors(folder: str) -> dict[str, torch.Tensor]:
    """Every tensor of a step folder, by record name, read through the op records."""
    got: dict[str, torch.Tensor] = {}
    for op in read_ops(folder):
        for t in op["tensors"]:
            if "file" in t:
                with safe_open(os.path.join(folder, t["file"]), "pt") as f:
                    got[t["name"]] = f.get_tensor(t["name"])
    return got


@pytest.mark.parametrize("tensor_writer", WRITERS)
def test_written_values_are_those_of_the_call(dump: str, tensor_writer: str) -> None:
    """A tensor changed in place by the next op is stored as its op saw it: small ones (the
    thread's batched copies) and large ones (over writer._SMALL) alike."""
    dbg = probe.Debugger(
        None, dump_path=dump, level="api", mode="tensor", stack=False, tensor_writer=tensor_writer
    )
    xs = [torch.randn(8, 8), torch.randn(200, 200)]
    want: dict[str, torch.Tensor] = {}
    dbg.start()
    assert dbg._files.writer is not None and dbg._files.writer.inline == (tensor_writer == "inline")
    for i, x in enumerate(xs):
        y = torch.mul(x, 2.0)
        want[f"Torch.mul.{i}.forward.output.0"] = (x * 2.0).clone()
        y.add_(1.0)
        want[f"Tensor.add_.{i}.forward.input.0"] = (x * 2.0).clone()
        want[f"Tensor.add_.{i}.forward.output.0"] = (x * 2.0 + 1.0).clone()
        y.mul_(3.0)
        want[f"Tensor.mul_.{i}.forward.input.0"] = (x * 2.0 + 1.0).clone()
        y.zero_()
    dbg.stop()
    dbg.close()
    got = _shard_tensors(os.path.join(dump, "step0", "rank0"))
    for name, value in want.items():
        assert torch.equal(got[name], value), name


@pytest.mark.parametrize("tensor_writer", WRITERS)
def test_parameter_gradients_are_kept_as_the_hook_saw_them(dump: str, tensor_writer: str) -> None:
    """A parameter's gradient is recorded at stop(); zeroing it in place before then must not
    reach the stored data (the inline writer copies what it keeps, as the thread does)."""
    torch.manual_seed(0)
    model = Tiny()
    dbg = probe.Debugger(
        None, dump_path=dump, level="module", mode="tensor", tensor_writer=tensor_writer
    )
    dbg.start(model)
    F.cross_entropy(model(torch.randn(4, 8)), torch.tensor([0, 1, 2, 3])).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    for p in model.parameters():
        p.grad.zero_()  # type: ignore[union-attr]
    dbg.stop()
    dbg.close()
    got = _shard_tensors(os.path.join(dump, "step0", "rank0"))
    for name, g in grads.items():
        module, pname = name.rsplit(".", 1)
        cls = type(model.get_submodule(module)).__name__
        key = f"Module.{module}.{cls}.parameters_grad.{pname}"
        assert torch.equal(got[key], g) and g.abs().sum() > 0, key


@pytest.mark.parametrize("extra", [[], ["--checkpoint"]], ids=["plain", "checkpoint"])
def test_both_writers_write_the_same_dump(tmp_path: Any, extra: list[str]) -> None:
    """The example's training (Adam's in-place updates, mix level, two steps; recomputed
    checkpoints too) dumps the same op logs and byte-identical shards either way."""
    ex = load_example()
    det = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    dumps = {w: str(tmp_path / w) for w in WRITERS}
    try:
        for w, path in dumps.items():
            args = ["--dump", path, "--mode", "tensor", "--level", "mix", "--steps", "2"]
            args += ["--batch", "4", "--quiet", "--tensor-writer", w, *extra]
            assert ex.main(args) == 0
    finally:
        torch.use_deterministic_algorithms(det, warn_only=warn_only)
    for step in ("step0", "step1"):
        a, b = (os.path.join(dumps[w], step, "rank0") for w in WRITERS)
        files = sorted(f for f in os.listdir(a) if f != "stacks.jsonl")
        assert sorted(f for f in os.listdir(b) if f != "stacks.jsonl") == files
        assert sum(f.endswith(".safetensors") for f in files) >= 1
        match, mismatch, errors = filecmp.cmpfiles(a, b, files, shallow=False)
        assert not mismatch and not errors, (mismatch, errors)
        assert len(_shard_tensors(a)) > 100


def test_inline_writing_leaves_the_pool_alone(dump: str) -> None:
    """A tensor written from its own memory never becomes a pool buffer, even one that looks
    like a pool copy (a view of a 1-D tensor of the same size): the pool would later copy
    other tensors into the training's memory."""
    dbg = probe.Debugger(None, dump_path=dump, level="api", mode="tensor", tensor_writer="inline")
    base = torch.arange(100_000, dtype=torch.float32)
    dbg.start()
    torch.relu(base.view(100, 1000))
    dbg.stop()
    buffers = [b for free in dbg._files.pool._free.values() for b in free]
    dbg.close()
    assert all(b.data_ptr() != base.data_ptr() for b in buffers)
    assert torch.equal(base, torch.arange(100_000, dtype=torch.float32))


def test_auto_writes_inline_only_without_a_spare_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer, "_accelerator_in_use", lambda: False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    for threads, inline in ((4, True), (8, True), (3, False), (1, False)):
        monkeypatch.setattr(torch, "get_num_threads", lambda n=threads: n)
        assert writer.write_inline("auto", "cpu") is inline, threads
        assert writer.write_inline("auto", "cuda") is False
        assert writer.write_inline("thread", "cpu") is False
        assert writer.write_inline("inline", "cuda") is True
    monkeypatch.setattr(writer, "_accelerator_in_use", lambda: True)
    assert writer.write_inline("auto", "cpu") is False


def test_unknown_tensor_writer_is_refused(dump: str) -> None:
    with pytest.raises(ConfigError, match="tensor_writer: 'fast' is not one of auto, thread"):
        probe.Debugger(None, dump_path=dump, mode="tensor", tensor_writer="fast")
