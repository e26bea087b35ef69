"""Records, levels, selection, dataflow and statistics of the capture agent."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import warnings
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import probe
from conftest import (
    SCHEMAS,
    Halve,
    Tiny,
    iter_tensors,
    probe_bin,
    read_ops,
    run_agent_script,
    run_steps,
    train,
)


def _keys(ops: list[dict[str, Any]]) -> list[str]:
    return [o["op"] for o in ops]


def test_api_level_forward_and_backward(dump: str) -> None:
    train(probe.Debugger(None, dump_path=dump, level="api"))
    ops = read_ops(os.path.join(dump, "step0", "rank0"))
    keys = _keys(ops)
    for k in (
        "Functional.linear.0.forward",
        "Functional.gelu.0.forward",
        "Tensor.__add__.0.forward",
        "Functional.layer_norm.0.forward",
        "Functional.cross_entropy.0.forward",
        "Functional.gelu.0.backward",
        "Functional.linear.0.backward",
    ):
        assert k in keys, k
    assert [o["seq"] for o in ops] == list(range(len(ops)))
    assert len(set(t["name"] for _, t in iter_tensors(ops))) == sum(1 for _ in iter_tensors(ops))
    gelu_b = ops[keys.index("Functional.gelu.0.backward")]
    names = {t["name"]: t for t in gelu_b["tensors"]}
    assert set(names) == {
        "Functional.gelu.0.backward.input.0",
        "Functional.gelu.0.backward.output.0",
    }
    # Nested calls inside a captured op are not captured again (F.linear -> torch internals).
    assert not any(k.startswith("Torch.addmm") for k in keys)
    # Optimizer in-place ops are captured (SGD uses Tensor.add_ / Torch._foreach? either way runs).
    man = json.load(open(os.path.join(dump, "manifest.json")))
    assert man["format"] == "probe-dump" and man["version"] == 1 and man["level"] == "api"
    assert man["world_size"] == 1  # one process, no process group


def test_module_level_and_param_grads(dump: str) -> None:
    train(probe.Debugger(None, dump_path=dump, level="module"))
    ops = read_ops(os.path.join(dump, "step0", "rank0"))
    keys = _keys(ops)
    assert "Module.fc1.Linear.forward.0" in keys
    assert "Module.block.1.Linear.forward.0" in keys
    assert "Module.fc1.Linear.backward.0" in keys
    assert "Module.fc1.Linear.parameters_grad" in keys
    assert not any(k.startswith("Functional.") for k in keys)
    pg = ops[keys.index("Module.fc1.Linear.parameters_grad")]
    assert pg["kind"] == "parameters_grad" and pg["direction"] == "backward"
    assert {t["name"] for t in pg["tensors"]} == {
        "Module.fc1.Linear.parameters_grad.weight",
        "Module.fc1.Linear.parameters_grad.bias",
    }
    fwd = ops[keys.index("Module.fc1.Linear.forward.0")]
    roles = {t["name"].split("forward.0.")[1]: t["role"] for t in fwd["tensors"]}
    assert roles == {
        "input.0": "input",
        "parameters.weight": "parameter",
        "parameters.bias": "parameter",
        "output.0": "output",
    }
    assert fwd["module"] == "fc1"


def test_mix_level_has_both(dump: str) -> None:
    train(probe.Debugger(None, dump_path=dump, level="mix"))
    keys = _keys(read_ops(os.path.join(dump, "step0", "rank0")))
    assert "Module.head.Linear.forward.0" in keys and "Functional.linear.2.forward" in keys
    assert "Functional.linear.2.backward" in keys and "Module.head.Linear.backward.0" in keys


def test_training_unchanged_by_capture(dump: str) -> None:
    bare = train(None, steps=2)
    for level in ("api", "module", "mix"):
        got = train(probe.Debugger(None, dump_path=f"{dump}-{level}", level=level), steps=2)
        assert got == bare, level


def _np_stats(a: np.ndarray) -> dict[str, float]:
    a = a.astype(np.float64)
    fin = a[np.isfinite(a)]
    return {
        "max": float(a.max()),
        "min": float(a.min()),
        "mean": float(a.mean()),
        "norm": float(np.sqrt((a * a).sum())),
        "nan": int(np.isnan(a).sum()),
        "inf": int(np.isinf(a).sum()),
        "n_fin": fin.size,
    }


def test_statistics_match_numpy(dump: str) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(33, 17, generator=g) * 3
    w = torch.randn(5, 17, generator=g)
    xi = torch.randint(-50, 50, (40,), generator=g)
    xb = x.to(torch.bfloat16)
    expected_out = F.linear(x, w)
    dbg = probe.Debugger(None, dump_path=dump)
    dbg.start()
    F.linear(x, w)
    torch.abs(xi)
    torch.neg(xb)
    torch.gt(x, 0)
    dbg.stop()
    dbg.close()
    ops = {o["op"]: o for o in read_ops(os.path.join(dump, "step0", "rank0"))}
    cases = [
        (ops["Functional.linear.0.forward"]["tensors"][0], x.numpy()),
        (ops["Functional.linear.0.forward"]["tensors"][1], w.numpy()),
        (ops["Functional.linear.0.forward"]["tensors"][2], expected_out.numpy()),
        (ops["Torch.abs.0.forward"]["tensors"][0], xi.numpy()),
        (ops["Torch.neg.0.forward"]["tensors"][0], xb.float().numpy()),
    ]
    for rec, arr in cases:
        exp = _np_stats(arr)
        st = rec["stats"]
        for k in ("max", "min", "mean", "norm"):
            assert st[k] == pytest.approx(exp[k], rel=1e-5, abs=1e-6), (rec["name"], k)
        assert st["nan"] == 0 and st["inf"] == 0
    assert ops["Torch.abs.0.forward"]["tensors"][0]["dtype"] == "int64"
    assert ops["Torch.neg.0.forward"]["tensors"][0]["dtype"] == "bfloat16"
    gt_out = ops["Torch.gt.0.forward"]["tensors"][-1]
    assert gt_out["dtype"] == "bool"
    mask = (x > 0).numpy()
    assert gt_out["stats"]["max"] == 1 and gt_out["stats"]["min"] == 0
    assert gt_out["stats"]["mean"] == pytest.approx(mask.mean())


def test_every_result_of_a_structured_return_is_recorded(dump: str) -> None:
    """``topk``, ``max(dim)`` and ``sort`` return ``torch.return_types`` (tuple subclasses),
    a module may return a named tuple or an ``OrderedDict``: each tensor in them is an
    output (``output.i``, ``output.0.key``), with its statistics and, when it requires grad,
    its gradient in the backward record."""
    from collections import OrderedDict, namedtuple

    Pair = namedtuple("Pair", ["hi", "lo"])

    class Split(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> Any:
            return Pair(x * 2, x - 1)

    class Named(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> Any:
            return OrderedDict(last=x + 1, skipped=None)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.split, self.named = Split(), Named()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            vals, idx = torch.topk(x, 2, dim=1)
            p = self.split(vals)
            return p.hi.sum() + p.lo.sum() + self.named(x)["last"].sum() + x.max(dim=1).values.sum()

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(5), requires_grad=True)
    dbg = probe.Debugger(None, dump_path=dump, level="mix")
    net = Net()
    dbg.start(net)
    net(x).backward()
    dbg.stop()
    dbg.close()
    ops = {o["op"]: o for o in read_ops(os.path.join(dump, "step0", "rank0"))}

    def tensors(op: str, role: str) -> dict[str, dict[str, Any]]:
        return {t["name"][len(op) + 1 :]: t for t in ops[op]["tensors"] if t["role"] == role}

    vals, idx = torch.topk(x.detach(), 2, dim=1)
    out = tensors("Torch.topk.0.forward", "output")
    assert set(out) == {"output.0", "output.1"}
    for name, want in (("output.0", vals), ("output.1", idx)):
        exp = _np_stats(want.numpy())
        for k in ("max", "min", "mean", "norm"):
            assert out[name]["stats"][k] == pytest.approx(exp[k], rel=1e-6), (name, k)
    assert out["output.1"]["dtype"] == "int64"
    # The values' gradient (the indices have none): 2 through p.hi, 1 through p.lo.
    grad = tensors("Torch.topk.0.backward", "input")
    assert set(grad) == {"input.0"} and grad["input.0"]["stats"]["mean"] == 3.0
    assert set(tensors("Tensor.max.0.forward", "output")) == {"output.0", "output.1"}
    split = tensors("Module.split.Split.forward.0", "output")
    assert set(split) == {"output.0", "output.1"}
    assert split["output.1"]["stats"]["mean"] == pytest.approx((vals - 1).mean().item(), rel=1e-6)
    assert set(tensors("Module.split.Split.backward.0", "input")) == {"input.0", "input.1"}
    named = tensors("Module.named.Named.forward.0", "output")
    assert set(named) == {"output.0.last"}
    assert named["output.0.last"]["stats"]["max"] == pytest.approx(x.max().item() + 1, rel=1e-6)
    assert set(tensors("Module.named.Named.backward.0", "input")) == {"input.0.last"}


def test_non_finite_stats_are_strings(dump: str) -> None:
    x = torch.tensor([1.0, float("nan"), float("inf"), -2.0, float("-inf"), float("inf")])
    y = torch.tensor([1.0, float("inf"), 3.0])
    dbg = probe.Debugger(None, dump_path=dump)
    dbg.start()
    torch.abs(x)
    torch.neg(y)
    dbg.stop()
    dbg.close()
    raw = open(os.path.join(dump, "step0", "rank0", "ops.jsonl")).read()
    assert "NaN" not in raw and "Infinity" not in raw
    ops = {o["op"]: o for o in read_ops(os.path.join(dump, "step0", "rank0"))}
    s = ops["Torch.abs.0.forward"]["tensors"][0]["stats"]
    assert s["nan"] == 1 and s["inf"] == 3 and s["max"] == "nan" and s["mean"] == "nan"
    s = ops["Torch.neg.0.forward"]["tensors"][0]["stats"]
    assert s == {"max": "inf", "min": 1.0, "mean": "inf", "norm": "inf", "nan": 0, "inf": 1}
    s = ops["Torch.neg.0.forward"]["tensors"][1]["stats"]
    assert s["min"] == "-inf" and s["max"] == -1.0 and s["inf"] == 1


def test_steps_select_exactly(dump: str) -> None:
    train(probe.Debugger(None, dump_path=dump, steps=[1, "3-4"]), steps=6)
    assert sorted(d for d in os.listdir(dump) if d.startswith("step")) == [
        "step1",
        "step3",
        "step4",
    ]


def test_ranks_select_exactly(dump: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    train(probe.Debugger(None, dump_path=dump, ranks=["0-1"]))
    assert not os.path.exists(os.path.join(dump, "step0"))
    train(probe.Debugger(None, dump_path=dump, ranks=[2]))
    assert os.listdir(os.path.join(dump, "step0")) == ["rank2"]


def test_include_exclude_filters(dump: str) -> None:
    train(probe.Debugger(None, dump_path=dump + "1", include=["Functional.gelu", "*layer_norm*"]))
    keys = _keys(read_ops(os.path.join(dump + "1", "step0", "rank0")))
    assert keys and all(k.startswith(("Functional.gelu.", "Functional.layer_norm.")) for k in keys)
    assert any(k.endswith("backward") for k in keys)
    train(
        probe.Debugger(
            None, dump_path=dump + "2", exclude=["Functional.linear"], directions=["forward"]
        )
    )
    keys = _keys(read_ops(os.path.join(dump + "2", "step0", "rank0")))
    assert not any(k.startswith("Functional.linear") for k in keys)
    assert all(k.endswith("forward") for k in keys) and "Functional.gelu.0.forward" in keys
    train(probe.Debugger(None, dump_path=dump + "3", include_modules=["block"], level="mix"))
    ops = read_ops(os.path.join(dump + "3", "step0", "rank0"))
    assert ops and all(o["module"] is not None and o["module"].startswith("block") for o in ops)
    assert "Functional.layer_norm.0.forward" in _keys(ops)


def test_data_filter_outputs_only(dump: str) -> None:
    train(probe.Debugger(None, dump_path=dump, data=["outputs"], directions=["forward"]))
    ops = read_ops(os.path.join(dump, "step0", "rank0"))
    assert ops and all(t["role"] == "output" for _, t in iter_tensors(ops))


def test_scope_range(dump: str) -> None:
    train(
        probe.Debugger(
            None,
            dump_path=dump,
            scope=["Functional.gelu.0", "Functional.layer_norm.0"],
            directions=["forward"],
        )
    )
    keys = _keys(read_ops(os.path.join(dump, "step0", "rank0")))
    assert keys[0] == "Functional.gelu.0.forward"
    assert keys[-1] == "Functional.layer_norm.0.forward"
    assert "Functional.linear.0.forward" not in keys and "Functional.linear.2.forward" not in keys


def test_dataflow_src_links(dump: str) -> None:
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(3, 4)
    dbg = probe.Debugger(None, dump_path=dump)
    dbg.start()
    a = F.linear(x, w)  # inputs: data batch and weight -> no src
    b = torch.relu(a)  # src = linear output
    c = b.T  # property view, not captured: src via shared storage
    d = torch.matmul(c, b)  # both inputs come from relu's output
    e = d.clone()
    e.add_(1.0)  # in-place: a new id for the new version
    f = torch.exp(e)  # src = the add_ output, not clone's
    f.sum().backward()
    dbg.stop()
    dbg.close()
    ops = {o["op"]: o for o in read_ops(os.path.join(dump, "step0", "rank0"))}
    lin = ops["Functional.linear.0.forward"]["tensors"]
    assert all("src" not in t or t["src"] is None for t in lin if t["role"] == "input")
    lin_out = [t for t in lin if t["role"] == "output"][0]["id"]
    relu = ops["Torch.relu.0.forward"]["tensors"]
    assert relu[0]["src"] == lin_out
    relu_out = relu[1]["id"]
    mm = ops["Torch.matmul.0.forward"]["tensors"]
    assert mm[0]["src"] == relu_out and mm[1]["src"] == relu_out
    add = ops["Tensor.add_.0.forward"]["tensors"]
    assert add[0]["src"] == ops["Tensor.clone.0.forward"]["tensors"][1]["id"]
    add_out = [t for t in add if t["role"] == "output"][0]["id"]
    assert ops["Torch.exp.0.forward"]["tensors"][0]["src"] == add_out
    ids = [t["id"] for _, t in iter_tensors(list(ops.values())) if t.get("id") is not None]
    assert len(ids) == len(set(ids))
    # backward of relu: grad w.r.t. its output and input
    rb = {t["name"] for t in ops["Torch.relu.0.backward"]["tensors"]}
    assert rb == {"Torch.relu.0.backward.input.0", "Torch.relu.0.backward.output.0"}


def test_inplace_input_stats_taken_before_the_call(dump: str) -> None:
    x = torch.ones(10)
    dbg = probe.Debugger(None, dump_path=dump)
    dbg.start()
    x.mul_(3.0)
    x[2] = 7.0
    dbg.stop()
    dbg.close()
    ops = {o["op"]: o for o in read_ops(os.path.join(dump, "step0", "rank0"))}
    mul = ops["Tensor.mul_.0.forward"]["tensors"]
    assert mul[0]["stats"]["max"] == 1.0 and mul[-1]["stats"]["max"] == 3.0
    st = ops["Tensor.__setitem__.0.forward"]["tensors"]
    assert (
        st[0]["stats"]["max"] == 3.0
        and st[-1]["role"] == "output"
        and st[-1]["stats"]["max"] == 7.0
    )


def test_recompute_marked(dump: str) -> None:
    from torch.utils.checkpoint import checkpoint

    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    dbg = probe.Debugger(None, dump_path=dump, directions=["forward"])
    dbg.start()
    y = checkpoint(lambda t: F.gelu(lin(t)), x, use_reentrant=False)
    y.sum().backward()
    dbg.stop()
    dbg.close()
    ops = read_ops(os.path.join(dump, "step0", "rank0"))
    # Non-reentrant checkpointing stops recomputing once the saved tensors it needs are
    # back (early stop), so gelu itself may not be re-run, but linear (gelu's input) is.
    lin_ops = [o for o in ops if o["op"].startswith("Functional.linear.")]
    assert [o["recompute"] for o in lin_ops] == [False, True]
    assert [o["op"] for o in lin_ops] == [
        "Functional.linear.0.forward",
        "Functional.linear.1.forward",
    ]


@pytest.mark.parametrize("reentrant", [False, True])
def test_calls_in_a_custom_backward_are_not_recompute(dump: str, reentrant: bool) -> None:
    """A backward graph runs both for a custom function's backward and for a checkpoint's
    recompute. Only the recompute re-runs a forward, with gradients on (to rebuild the graph
    it then differentiates); a custom backward runs with them off. Calls in a custom backward
    were marked ``recompute`` too, and the compare put them beside another side's recomputed
    forwards when only one side checkpoints."""
    from torch.utils.checkpoint import checkpoint

    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    dbg = probe.Debugger(None, dump_path=dump, directions=["forward"], level="api")
    dbg.start()
    y = checkpoint(lambda t: Halve.apply(F.gelu(lin(t))), x, use_reentrant=reentrant)
    y.sum().backward()
    dbg.stop()
    dbg.close()
    ops = read_ops(os.path.join(dump, "step0", "rank0"))
    marks = {o["op"]: o["recompute"] for o in ops}
    assert marks["Functional.linear.0.forward"] is False
    assert marks["Functional.linear.1.forward"] is True  # the checkpoint's recompute
    assert marks["Torch.mul.0.forward"] is False  # Halve's backward


def _backward_on(thread: bool, dump: str, reentrant: bool, level: str) -> list[dict[str, Any]]:
    """One captured step of a checkpointed linear, GELU and custom function, its backward
    called on this thread or on another one; then a call on this thread and, while it is
    captured still, one on a thread that runs no backward. The records, in order."""
    import threading

    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU())
    x = torch.randn(2, 4, requires_grad=True)
    dbg = probe.Debugger(None, dump_path=dump, level=level)
    dbg.start(model)
    loss = checkpoint(lambda t: Halve.apply(model(t)), x, use_reentrant=reentrant).sum()
    errors: list[BaseException] = []

    def run(fn: Any) -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    if thread:
        t = threading.Thread(target=run, args=(loss.backward,))
        t.start()
        t.join()
    else:
        loss.backward()
    torch.mul(x.detach(), 2.0)  # this thread, after the backward
    loader = threading.Thread(target=run, args=(lambda: torch.add(x.detach(), 1.0),))
    loader.start()
    loader.join()
    dbg.stop()
    dbg.close()
    assert not errors, errors
    return read_ops(os.path.join(dump, "step0", "rank0"))


@pytest.mark.parametrize("level", ["api", "mix"])
@pytest.mark.parametrize("reentrant", [False, True])
def test_a_backward_on_another_thread_is_captured_as_on_the_calling_one(
    tmp_path: Any, reentrant: bool, level: str
) -> None:
    """Autograd runs the backward of CUDA and NPU tensors on a device thread of its own
    while the thread that called ``backward()`` waits. Only the thread that called
    ``start()`` captured API calls, so on an accelerator a checkpoint's recompute and the
    calls in a custom function's backward (a tensor-parallel layer's gradient all-reduce)
    were missing from the dump, where a CPU run has them. On CPU autograd runs the backward
    on the calling thread, so a backward called from another thread stands in for the
    device thread here: it must write the records a backward on this thread writes
    (``test_cuda.py`` runs the same on a GPU). A thread that runs no backward (data
    loading) is still not captured."""
    here = _backward_on(False, str(tmp_path / "here"), reentrant, level)
    there = _backward_on(True, str(tmp_path / "there"), reentrant, level)

    def facts(ops: list[dict[str, Any]]) -> list[Any]:
        return [
            (o["op"], o.get("recompute"), [(t["name"], t.get("stats")) for t in o["tensors"]])
            for o in ops
        ]

    assert facts(there) == facts(here)
    keys = _keys(there)
    marks = {o["op"]: o.get("recompute") for o in there}
    assert marks["Functional.linear.1.forward"] is True  # the checkpoint's recompute
    assert marks["Torch.mul.0.forward"] is False  # Halve's backward
    assert "Torch.mul.1.forward" in keys  # this thread's call after the backward
    assert not any(k.startswith("Torch.add.") for k in keys)  # the loader's


@pytest.mark.parametrize("level", ["api", "mix"])
def test_recompute_stopped_early_leaves_its_modules(dump: str, level: str) -> None:
    """Non-reentrant checkpointing ends a recompute by raising inside the module's forward
    once it has the tensors it needs: the module (and the one it ran in) must be left, so
    that calls after it are not attributed to them, and the cut-short call has no record."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = torch.nn.Module()
    model.block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU(), torch.nn.Linear(4, 4))
    x = torch.randn(2, 4, requires_grad=True)
    dbg = probe.Debugger(None, dump_path=dump, level=level, directions=["forward"])
    dbg.start(model)
    y = checkpoint(model.block, x, use_reentrant=False)
    y.sum().backward()
    z = torch.mul(x.detach(), 2.0)  # after the recompute, outside every module
    dbg.stop()
    dbg.close()
    assert z.shape == x.shape
    ops = read_ops(os.path.join(dump, "step0", "rank0"))
    recomputed = [o for o in ops if o["recompute"]]
    assert recomputed, _keys(ops)
    assert all(o["module"] and o["module"].startswith("block") for o in recomputed)
    (mul,) = [o for o in ops if o["op"] == "Torch.mul.0.forward"]
    assert mul["module"] is None
    if level == "mix":
        # The block's recompute was cut short: its first forward only is recorded.
        block = [o["op"] for o in ops if o["op"].startswith("Module.block.Sequential.")]
        assert block == ["Module.block.Sequential.forward.0"]
        for o in ops:
            if o["kind"] == "module":
                assert {t["role"] for t in o["tensors"]} >= {"input", "output"}, o["op"]


def test_schema_validation(dump: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    train(probe.Debugger(None, dump_path=dump, level="mix", mode="checksum"))
    op_schema = json.load(open(os.path.join(SCHEMAS, "probe-dump-op.v1.schema.json")))
    man_schema = json.load(open(os.path.join(SCHEMAS, "probe-dump-manifest.v1.schema.json")))
    st_schema = json.load(open(os.path.join(SCHEMAS, "probe-dump-stack.v1.schema.json")))
    jsonschema.validate(json.load(open(os.path.join(dump, "manifest.json"))), man_schema)
    folder = os.path.join(dump, "step0", "rank0")
    v = jsonschema.Draft202012Validator(op_schema)
    ops = read_ops(folder)
    assert ops
    for o in ops:
        v.validate(o)
    stack_ids = set()
    for line in open(os.path.join(folder, "stacks.jsonl")):
        rec = json.loads(line)
        jsonschema.validate(rec, st_schema)
        stack_ids.add(rec["id"])
    assert {o["stack"] for o in ops if o.get("stack") is not None} <= stack_ids


def test_checksum_mode_crc(dump: str) -> None:
    x = torch.randn(5, 7)
    dbg = probe.Debugger(None, dump_path=dump, mode="checksum")
    dbg.start()
    y = torch.exp(x)
    dbg.stop()
    dbg.close()
    ops = read_ops(os.path.join(dump, "step0", "rank0"))
    t_in, t_out = ops[0]["tensors"]
    assert t_in["checksum"] == "crc32:%08x" % zlib.crc32(x.numpy().tobytes())
    assert t_out["checksum"] == "crc32:%08x" % zlib.crc32(y.numpy().tobytes())


def test_tensor_mode_shards_hold_every_file(dump: str) -> None:
    from safetensors import safe_open

    train(
        probe.Debugger(None, dump_path=dump, level="mix", mode="tensor", shard_size_mb=0.002),
        steps=2,
    )
    for step in ("step0", "step1"):
        folder = os.path.join(dump, step, "rank0")
        ops = read_ops(folder)
        shards = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
        assert len(shards) > 2, "small shard size must roll shards"
        assert not [f for f in os.listdir(folder) if f.endswith(".tmp")]
        opened = {s: safe_open(os.path.join(folder, s), "pt") for s in shards}
        n = 0
        for _, t in iter_tensors(ops):
            assert "file" in t, t["name"]
            data = opened[t["file"]].get_tensor(t["name"])
            assert list(data.shape) == t["shape"]
            if t["dtype"] == "float32" and data.numel():
                assert float(data.max()) == pytest.approx(t["stats"]["max"], rel=1e-6)
                assert float(data.double().norm()) == pytest.approx(t["stats"]["norm"], rel=1e-5)
            n += 1
        assert n == sum(len(list(opened[s].keys())) for s in shards)


def test_tensor_mode_reuses_host_buffers_across_steps(
    dump: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Host copies land in buffers handed back by the writer thread: after the first step,
    steps of the same shapes take their copies from the pool (a fresh buffer faults in every
    page). How many buffers one step needs depends on how far the writer thread lags, so a
    later step may still add a few; before the pool worked, every copy of every step was a
    new buffer. The data the reused buffers carry is checked by the shard test above."""
    from probe.capture import writer

    fresh: list[int] = []
    copies: list[int] = []
    empty = writer._empty
    copy = writer.HostPool.copy

    def counting(*args: Any, **kwargs: Any) -> torch.Tensor:
        if args and isinstance(args[0], int):  # HostPool's 1-D buffers
            fresh.append(args[0])
        return empty(*args, **kwargs)

    def counted_copy(self: Any, t: torch.Tensor) -> torch.Tensor:
        copies.append(1)
        return copy(self, t)

    monkeypatch.setattr(writer, "_empty", counting)
    monkeypatch.setattr(writer.HostPool, "copy", counted_copy)
    dbg = probe.Debugger(None, dump_path=dump, level="mix", mode="tensor", tensor_writer="thread")
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    per_step = []
    for _ in range(6):
        before = len(fresh)
        dbg.start(model)
        opt.zero_grad()
        F.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 4, (4,))).backward()
        opt.step()
        dbg.stop()
        dbg.step()
        per_step.append(len(fresh) - before)
    dbg.close()
    per_copy_step = len(copies) // 6
    assert per_copy_step > 20 and 0 < per_step[0] <= per_copy_step
    assert sum(per_step[1:]) < per_copy_step, (per_step, per_copy_step)


def test_tensor_mode_queues_small_copies_in_batches(
    dump: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small copies reach the writer thread in batches, not one queue item per op (each
    item wakes the thread, which then competes with training for the GIL), and every
    tensor still lands in the shards with its values."""
    from safetensors import safe_open

    from probe.capture import writer

    batches: list[int] = []
    put_many = writer.TensorWriter.put_many

    def counted(self: Any, items: list[Any]) -> None:
        batches.append(len(items))
        put_many(self, items)

    monkeypatch.setattr(writer.TensorWriter, "put_many", counted)
    dbg = probe.Debugger(
        None, dump_path=dump, level="api", mode="tensor", stack=False, tensor_writer="thread"
    )
    x = torch.arange(16, dtype=torch.float32)
    dbg.start()
    ys = [torch.mul(x, float(i)) for i in range(200)]
    dbg.stop()
    want = {f"Torch.mul.{i}.forward.output.0": y for i, y in enumerate(ys)}
    dbg.step()
    dbg.close()
    assert sum(batches) >= 400 and len(batches) <= 400 // writer._OUTBOX_ITEMS + 2, batches
    folder = os.path.join(dump, "step0", "rank0")
    got = {}
    for op in read_ops(folder):
        for t in op["tensors"]:
            with safe_open(os.path.join(folder, t["file"]), "pt") as f:
                got[t["name"]] = f.get_tensor(t["name"])
    assert len(got) == 400
    for name, y in want.items():
        assert torch.equal(got[name], y), name


def test_msprobe_config_keys(tmp_path: Any) -> None:
    cfg = {
        "task": "tensor",
        "dump_path": str(tmp_path / "d"),
        "rank": [0],
        "step": [0, 2],
        "level": "L0",
        "tensor": {
            "scope": [],
            "list": ["relu"],
            "data_mode": ["forward"],
            "summary_mode": "statistics",
        },
    }
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    c = probe.Debugger(str(p)).config
    assert (c.mode, c.level, c.steps, c.ranks) == (
        "tensor",
        "module",
        frozenset({0, 2}),
        frozenset({0}),
    )
    assert c.directions == ("forward",) and c.include == ["*relu*"]
    cfg2 = {"task": "statistics", "level": "L1", "statistics": {"summary_mode": "md5"}}
    assert probe.load_config(cfg2, {}).mode == "checksum"
    with pytest.raises(probe.ConfigError):
        probe.Debugger(None, level="L9")
    with pytest.raises(probe.ConfigError):
        probe.Debugger(None, stepz=[1])


def test_context_manager_and_seed_all(dump: str) -> None:
    probe.seed_all(7)
    a = torch.rand(3)
    probe.seed_all(7)
    assert torch.equal(a, torch.rand(3))
    dbg = probe.Debugger(None, dump_path=dump)
    for _ in range(2):
        with dbg:
            torch.relu(torch.randn(3))
    dbg.close()
    assert sorted(os.listdir(dump)) == ["manifest.json", "step0", "step1"]


def test_inplace_input_counts_nan_inf_before_the_call(dump: str) -> None:
    # On CPU the NaN/Inf count passes run only when the sum is non-finite: both branches.
    x = torch.tensor([1.0, float("nan"), float("inf"), -2.0])
    z = torch.ones(4, dtype=torch.int64)
    f = torch.ones(3)
    dbg = probe.Debugger(None, dump_path=dump)
    dbg.start()
    x.nan_to_num_()
    z.mul_(2)
    f.mul_(2.0)
    dbg.stop()
    dbg.close()
    ops = {o["op"]: o for o in read_ops(os.path.join(dump, "step0", "rank0"))}
    nt = ops["Tensor.nan_to_num_.0.forward"]["tensors"]
    assert nt[0]["stats"]["nan"] == 1 and nt[0]["stats"]["inf"] == 1
    assert nt[-1]["stats"]["nan"] == 0 and nt[-1]["stats"]["inf"] == 0
    zs = ops["Tensor.mul_.0.forward"]["tensors"][0]["stats"]
    assert zs == {"max": 1.0, "min": 1.0, "mean": 1.0, "norm": 2.0, "nan": 0, "inf": 0}
    fs = ops["Tensor.mul_.1.forward"]["tensors"][0]["stats"]
    assert fs["max"] == 1.0 and fs["nan"] == 0 and fs["inf"] == 0


def test_checksum_of_non_contiguous_cpu_input(dump: str) -> None:
    # Checksums read CPU tensors in place: a strided view must hash its logical bytes.
    x = torch.randn(6, 4).t()
    dbg = probe.Debugger(None, dump_path=dump, mode="checksum")
    dbg.start()
    torch.neg(x)
    dbg.stop()
    dbg.close()
    rec = read_ops(os.path.join(dump, "step0", "rank0"))[0]["tensors"][0]
    assert rec["checksum"] == "crc32:%08x" % zlib.crc32(x.contiguous().numpy().tobytes())


def test_stacks_are_the_same_in_every_step(dump: str) -> None:
    # Formatted stacks are cached across steps: each step's stacks.jsonl must still be
    # complete on its own and name every stack id its ops use.
    train(probe.Debugger(None, dump_path=dump), steps=2)
    per_step = []
    for s in (0, 1):
        folder = os.path.join(dump, f"step{s}", "rank0")
        with open(os.path.join(folder, "stacks.jsonl"), encoding="utf-8") as fh:
            stacks = [json.loads(line) for line in fh]
        assert [r["id"] for r in stacks] == list(range(len(stacks)))
        used = {o["stack"] for o in read_ops(folder)}
        assert used == set(range(len(stacks)))
        per_step.append(stacks)
    assert per_step[0] == per_step[1]
    assert all(r["frames"] for r in per_step[0])


def _relu_here(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x)


def _gelu_here(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x)


def _relus(x: torch.Tensor, n: int) -> Any:
    for _ in range(n):
        yield _relu_here(x)


def _stack_lines(dump: str) -> dict[str, list[tuple[str, int]]]:
    """Each op's stack as (function, line) pairs, outermost first."""
    folder = os.path.join(dump, "step0", "rank0")
    with open(os.path.join(folder, "stacks.jsonl"), encoding="utf-8") as fh:
        frames = {r["id"]: r["frames"] for r in map(json.loads, fh)}
    out = {}
    for o in read_ops(folder):
        pairs = []
        for fr in frames[o["stack"]]:
            head = fr.split(":", 1)[0]  # File "...", line N, in NAME
            pairs.append((head.rsplit(" in ", 1)[1], int(head.split(", line ")[1].split(",")[0])))
        out[o["op"]] = pairs
    return out


@contextlib.contextmanager
def _forward_capture(dump: str) -> Iterator[None]:
    """Forward records of the calls made in the ``with`` block, dumped to ``dump``."""
    dbg = probe.Debugger(None, dump_path=dump, directions=["forward"])
    dbg.start()
    yield
    dbg.stop()
    dbg.close()


def _line() -> int:
    """The line its caller is at."""
    return sys._getframe(1).f_lineno


def _assert_stack_tails(stacks: dict[str, list[tuple[str, int]]], want: dict[str, Any]) -> None:
    """Each op's innermost frames are the (function, line) pairs ``want`` names for it."""
    for op, frames in want.items():
        assert stacks[op][-len(frames) :] == frames, (op, stacks[op])


def test_stacks_follow_the_caller_through_every_frame(dump: str) -> None:
    """Ops called from one function, through helpers called at different lines of it,
    and from a generator resumed at two places: every stack names the lines each frame
    was at when its op was called (the frames above the caller are kept between ops)."""
    import inspect

    x = torch.randn(3, 4)
    with _forward_capture(dump):
        base = _line()
        _relu_here(x)  # base + 1
        _gelu_here(x)  # base + 2
        _relu_here(x)  # base + 3
        gen = _relus(x, 2)
        next(gen)  # base + 5
        next(gen)  # base + 6: the generator's frame again, resumed from another line
        torch.exp(x)  # base + 7
    stacks = _stack_lines(dump)
    me = "test_stacks_follow_the_caller_through_every_frame"
    relu_line = inspect.getsourcelines(_relu_here)[1] + 1
    gelu_line = inspect.getsourcelines(_gelu_here)[1] + 1
    gen_line = inspect.getsourcelines(_relus)[1] + 2
    want = {
        "Functional.relu.0.forward": [(me, base + 1), ("_relu_here", relu_line)],
        "Functional.gelu.0.forward": [(me, base + 2), ("_gelu_here", gelu_line)],
        "Functional.relu.1.forward": [(me, base + 3), ("_relu_here", relu_line)],
        "Functional.relu.2.forward": [
            (me, base + 5),
            ("_relus", gen_line),
            ("_relu_here", relu_line),
        ],
        "Torch.exp.0.forward": [(me, base + 7)],
        "Functional.relu.3.forward": [
            (me, base + 6),
            ("_relus", gen_line),
            ("_relu_here", relu_line),
        ],
    }
    _assert_stack_tails(stacks, want)


def _relu_deep(x: torch.Tensor, depth: int) -> torch.Tensor:
    if depth == 0:
        return F.relu(x)
    return _relu_deep(x, depth - 1)


def _gelu_two_down(x: torch.Tensor) -> torch.Tensor:
    return _gelu_here(x)


def _gelus(x: torch.Tensor) -> Any:
    while True:
        yield _gelu_two_down(x)


def _resume(gen: Any) -> Any:
    return next(gen)


def test_stacks_follow_the_caller_through_deep_and_resumed_frames(dump: str) -> None:
    """Stacks through recursion and a resumed generator: ops at several depths of one
    recursive function, called from different lines (the same frames below this one
    twice); from a generator that is not the op's parent but its grandparent, resumed once
    here and then through a helper (the frames above it change); and from this function
    itself. Every stack names each frame at the line it was at, and all share the frames
    above this test."""
    import inspect

    x = torch.randn(3, 4)
    with _forward_capture(dump):
        base = _line()
        _relu_deep(x, 3)  # base + 1
        _relu_deep(x, 1)  # base + 2
        _relu_deep(x, 1)  # base + 3: the same frames below this one as at base + 2
        torch.exp(x)  # base + 4
        gen = _gelus(x)
        next(gen)  # base + 6
        _resume(gen)  # base + 7: the generator's frame again, called by another frame
        torch.exp(x)  # base + 8
    stacks = _stack_lines(dump)
    me = "test_stacks_follow_the_caller_through_deep_and_resumed_frames"
    deep_first = inspect.getsourcelines(_relu_deep)[1]
    relu_at, recurse_at = deep_first + 2, deep_first + 3
    gelu_at = inspect.getsourcelines(_gelu_here)[1] + 1
    two_down_at = inspect.getsourcelines(_gelu_two_down)[1] + 1
    gen_at = inspect.getsourcelines(_gelus)[1] + 2
    resume_at = inspect.getsourcelines(_resume)[1] + 1

    def deep(line: int, depth: int) -> list[tuple[str, int]]:
        return [(me, line)] + [("_relu_deep", recurse_at)] * depth + [("_relu_deep", relu_at)]

    from_gen = [("_gelus", gen_at), ("_gelu_two_down", two_down_at), ("_gelu_here", gelu_at)]
    want = {
        "Functional.relu.0.forward": deep(base + 1, 3),
        "Functional.relu.1.forward": deep(base + 2, 1),
        "Functional.relu.2.forward": deep(base + 3, 1),
        "Torch.exp.0.forward": [(me, base + 4)],
        "Functional.gelu.0.forward": [(me, base + 6)] + from_gen,
        "Functional.gelu.1.forward": [(me, base + 7), ("_resume", resume_at)] + from_gen,
        "Torch.exp.1.forward": [(me, base + 8)],
    }
    assert set(stacks) == set(want)
    outer = {tuple(stacks[op][: -len(frames)]) for op, frames in want.items()}
    assert len(outer) == 1 and all(f[0] != me for f in next(iter(outer)))
    _assert_stack_tails(stacks, want)


_EVERY_DTYPE: dict[str, torch.Tensor] = {
    "f32": torch.randn(3, 4),
    "f16": torch.randn(5, dtype=torch.float16),
    "bf16": torch.randn(2, 3).to(torch.bfloat16),
    "f64": torch.randn(7, dtype=torch.float64),
    "i64": torch.arange(-3, 3, dtype=torch.int64),
    "i32": torch.arange(4, dtype=torch.int32).reshape(2, 2),
    "i16": torch.arange(-2, 3, dtype=torch.int16),
    "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
    "u8": torch.arange(250, 256, dtype=torch.uint8),
    "bool": torch.tensor([True, False, True]),
    "zero_d": torch.tensor(2.5),
    "empty": torch.ones(0, 3),
    "empty_i8": torch.ones(0, dtype=torch.int8),
    "odd name é\n": torch.ones(1),
}


def _same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert torch.equal(got[k], v), k


def test_direct_shard_writer_matches_the_safetensors_library(tmp_path: Any) -> None:
    """write_safetensors: every stored dtype, 0-d and empty; the library's exact bytes."""
    from safetensors.torch import load_file, save_file

    from probe.capture.writer import write_safetensors

    ours, theirs = str(tmp_path / "ours.safetensors"), str(tmp_path / "lib.safetensors")
    write_safetensors(ours, _EVERY_DTYPE)
    save_file(_EVERY_DTYPE, theirs)
    _same(load_file(ours), _EVERY_DTYPE)
    with open(ours, "rb") as a, open(theirs, "rb") as b:
        assert a.read() == b.read()


@pytest.mark.parametrize("reserve", [8, 64 * 1024])
@pytest.mark.parametrize("duplicate", [False, True])
def test_streamed_shard_round_trips(tmp_path: Any, reserve: int, duplicate: bool) -> None:
    """A streamed shard (header room too small or ample, a repeated key) loads whole;
    the header is padded with spaces to a multiple of 8 and offsets are contiguous."""
    from safetensors.torch import load_file

    from probe.capture.writer import _ShardStream

    path = str(tmp_path / "s.safetensors")
    want = dict(_EVERY_DTYPE)
    shard = _ShardStream(path, reserve)
    for k, v in want.items():
        shard.add(k, v)
    if duplicate:
        want["f32"] = torch.full((2,), 7.0)
        shard.add("f32", want["f32"])
    shard.close()
    assert not os.path.exists(shard.tmp)
    _same(load_file(path), want)
    with open(path, "rb") as fh:
        raw = fh.read()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0 and raw[8 + len(raw[8 : 8 + n].rstrip(b" ")) - 1 : 8 + n].strip() == b"}"
    header = json.loads(raw[8 : 8 + n])
    spans = sorted(tuple(e["data_offsets"]) for e in header.values())
    assert spans[0][0] == 0 and spans[-1][1] == len(raw) - 8 - n
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_unfinished_stream_locates_its_data(tmp_path: Any) -> None:
    """What a crash leaves of a shard being streamed: a provisional header saying where
    the data starts, then each tensor at the offsets the writer handed out (data_offsets)."""
    from probe.capture.writer import RankFolder, _ShardStream

    folder = RankFolder(str(tmp_path / "r"), shard_bytes=1 << 30)
    shard = _ShardStream(str(tmp_path / "s.safetensors"), 64 * 1024)
    spans = {}
    for k, v in _EVERY_DTYPE.items():
        _, lo, _ = folder.shard_for(v.numel() * v.element_size())
        spans[k] = (lo, lo + v.numel() * v.element_size())
        shard.add(k, v)
    shard.fh.flush()  # as far as a killed process's data gets: no header, no rename
    with open(shard.tmp, "rb") as fh:
        raw = fh.read()
    n = int.from_bytes(raw[:8], "little")
    assert json.loads(raw[8 : 8 + n]) == {"__metadata__": {"probe": "streaming"}}
    for k, v in _EVERY_DTYPE.items():
        lo, hi = spans[k]
        want = v.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        assert raw[8 + n + lo : 8 + n + hi] == want, k
    shard.abandon()
    folder.close()


def _no_grad_calls(w: torch.Tensor) -> None:
    """Calls without a backward record, of every shape the plain path handles: in-place
    ops on a captured output (``src`` links, writes seen by the dataflow), ``out=`` and
    ``inplace=True`` (one of them through ``.data``, which a's version counter misses),
    nested and keyword tensor arguments, several outputs, a result that
    is the first argument (``__setitem__``), integer and one-element tensors, a strided
    view, non-tensor arguments (the record's ``args``), an identity op (``vals.float()``)."""
    h = F.linear(torch.ones(3, 4), w)  # grad on: the general path, for the links
    with torch.no_grad():
        a = h.detach() * 2.0
        a.mul_(0.5).add_(1.0)
        b = torch.add(a, other=torch.full((3, 4), 0.25), alpha=2)
        F.relu(b, inplace=True)
        c = torch.cat([a, b, a], dim=1)
        torch.add(a, b, out=a)
        torch.mul(b, 3.0, out=a.data)  # a write that a's version counter does not see
        a.sum()
        vals, idx = torch.topk(c, 2, dim=1)
        c[0] = vals[:, 0].sum()
        n = torch.tensor([3, 1, 2]).sum()
        s = torch.tensor(1.5) * 2.0
        t = c.t().contiguous().sum(dim=(0,), keepdim=True, dtype=torch.float64)
        e = t.float()
        torch.stack((vals.float(), idx.float(), vals[:, :1].expand(3, 2) + s + n + e.sum()))


def test_plain_calls_match_the_general_path(tmp_path: Any, monkeypatch: Any) -> None:
    """Calls without a backward record take ApiCapture's plain path (_plain_pre and
    _plain_post); their records must be the ones the general path (_pre and _post) writes,
    byte for byte, stacks included."""
    from probe.capture.api import ApiCapture

    taken = []
    plain = ApiCapture._plain_pre

    def counted(self: Any, api: str, *rest: Any) -> Any:
        taken.append(api)
        return plain(self, api, *rest)

    monkeypatch.setattr(ApiCapture, "_plain_pre", counted)
    torch.manual_seed(0)
    w = torch.randn(4, 4, requires_grad=True)
    logs = {}
    for general in (True, False):  # one call site: the same stacks
        dump = str(tmp_path / f"general_{general}")
        dbg = probe.Debugger(None, dump_path=dump, level="mix", mode="statistics")
        dbg._api._plain = not general
        dbg.start()
        _no_grad_calls(w)
        dbg.stop()
        dbg.step()
        dbg.close()
        folder = os.path.join(dump, "step0", "rank0")
        logs[general] = [
            open(os.path.join(folder, f), "rb").read() for f in ("ops.jsonl", "stacks.jsonl")
        ]
    assert len(taken) >= 20 and "Tensor.__setitem__" in taken and "Torch.topk" in taken
    assert logs[False] == logs[True]
    ops = read_ops(os.path.join(str(tmp_path / "general_False"), "step0", "rank0"))
    by_key = {o["op"]: o for o in ops}
    mul = {t["name"]: t for t in by_key["Tensor.mul_.0.forward"]["tensors"]}
    out = {t["name"]: t for t in by_key["Tensor.__mul__.0.forward"]["tensors"]}
    assert (
        mul["Tensor.mul_.0.forward.input.0"]["src"]
        == out["Tensor.__mul__.0.forward.output.0"]["id"]
    )
    assert by_key["Torch.cat.0.forward"]["args"] == {"input.dim": 1}
    assert [t["name"].rsplit(".", 2)[-2:] for t in by_key["Torch.topk.0.forward"]["tensors"]][
        -2:
    ] == [
        ["output", "0"],
        ["output", "1"],
    ]


def _eval_dump(dump: str, grad_off: Any, mode: str, level: str) -> None:
    """One forward of the example's model under ``grad_off`` (a context), captured."""
    from conftest import load_example

    ex = load_example()
    probe.seed_all(0)
    model = ex.SmallNet().eval()
    x, _ = ex.make_data(1, 4, torch.device("cpu"))[0]
    dbg = probe.Debugger(None, dump_path=dump, mode=mode, level=level)
    dbg.start(model)
    with grad_off():
        model(x)
    dbg.stop()
    dbg.step()
    dbg.close()
    assert dbg.enabled


@pytest.mark.parametrize(("mode", "level"), [("statistics", "mix"), ("tensor", "api")])
def test_inference_mode_is_captured_as_no_grad(tmp_path: Any, mode: str, level: str) -> None:
    """Tensors made under ``torch.inference_mode()`` have no version counter: reading it
    raised and switched capture off at the first op. They are captured with the values
    ``no_grad`` gives; only the dataflow links are missing, since without a version
    counter a write to such a tensor could go unseen."""
    plain, inference = str(tmp_path / "no_grad"), str(tmp_path / "inference")
    _eval_dump(plain, torch.no_grad, mode, level)
    _eval_dump(inference, torch.inference_mode, mode, level)
    a = read_ops(os.path.join(plain, "step0", "rank0"))
    b = read_ops(os.path.join(inference, "step0", "rank0"))
    assert len(a) > 20 and len(a) == len(b)
    assert any("src" in t for _, t in iter_tensors(a)), "no links to lose: the test is vacuous"
    assert not any("src" in t for _, t in iter_tensors(b))
    for x, y in zip(a, b):
        for t in (*x["tensors"], *y["tensors"]):
            t.pop("id", None)
            t.pop("src", None)
        assert x == y
    if mode == "tensor":
        for name in sorted(os.listdir(os.path.join(plain, "step0", "rank0"))):
            if name.endswith(".safetensors"):
                with open(os.path.join(plain, "step0", "rank0", name), "rb") as fa:
                    with open(os.path.join(inference, "step0", "rank0", name), "rb") as fb:
                        assert fa.read() == fb.read(), name


def _per_sample_step(dbg: Any, transform: bool) -> list[float]:
    """Two SGD steps of Tiny; with ``transform``, per-sample gradient norms by
    ``torch.func`` (vmap of grad of a functional call) join the loss, as in DP-SGD."""
    torch.manual_seed(0)
    model = Tiny()
    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g)) for _ in range(2)
    ]

    def one(p: dict[str, torch.Tensor], xi: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(model, p, (xi.unsqueeze(0),)).sum()

    def loss_of(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(model(x), y)
        if transform:
            params = {k: v.detach() for k, v in model.named_parameters()}
            per = torch.func.vmap(torch.func.grad(one), in_dims=(None, 0))(params, x)
            loss = loss + 0.0 * sum(v.sum() for v in per.values())
        return loss

    return run_steps(dbg, model, [torch.optim.SGD(model.parameters(), lr=0.1)], batches, loss_of)


@pytest.mark.parametrize("level", ["api", "mix"])
def test_calls_inside_torch_func_transforms_are_not_captured(tmp_path: Any, level: str) -> None:
    """Inside ``vmap``/``grad`` tensors are wrappers without storage: reading them switched
    capture off for the rest of the run. Their calls are skipped, with one warning; the
    calls around the transform are captured as usual."""
    with_t, without = str(tmp_path / "with"), str(tmp_path / "without")
    dbg = probe.Debugger(None, dump_path=with_t, level=level)
    with pytest.warns(RuntimeWarning, match="torch.func transform") as seen:
        got = _per_sample_step(dbg, True)
    assert dbg.enabled
    assert len([w for w in seen if "torch.func" in str(w.message)]) == 1
    assert got == _per_sample_step(None, True)
    _per_sample_step(probe.Debugger(None, dump_path=without, level=level), False)
    for step in (0, 1):
        a = [o["op"] for o in read_ops(os.path.join(with_t, f"step{step}", "rank0"))]
        b = [o["op"] for o in read_ops(os.path.join(without, f"step{step}", "rank0"))]
        # The transform's own calls add nothing; around it: the sum of the per-sample
        # gradients, the scaling, the additions to the loss and their backward records.
        extra = [k for k in a if k not in b]
        assert a and all(k in a for k in b), (a, b)
        assert all(k.split(".")[0] in ("Tensor", "Torch") for k in extra), extra
        linears = [k for k in a if k.startswith("Functional.linear.") and k.endswith("forward")]
        assert len(linears) == 3, linears  # the model's own three; none from the transform
        assert not any(k.startswith("Tensor.unsqueeze") for k in a), a


class _SparseEmb(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16, sparse=True)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, i: torch.Tensor) -> torch.Tensor:
        return self.head(F.gelu(self.emb(i).sum(1)))


def _sparse_steps(dbg: Any) -> list[float]:
    torch.manual_seed(0)
    model = _SparseEmb()
    sparse = torch.optim.SparseAdam([model.emb.weight], lr=1e-2)
    dense = torch.optim.Adam(model.head.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randint(0, 50, (4, 6), generator=g), torch.randint(0, 4, (4,), generator=g))
        for _ in range(2)
    ]
    return run_steps(
        dbg, model, [sparse, dense], batches, lambda b: F.cross_entropy(model(b[0]), b[1])
    )


@pytest.mark.parametrize("level", ["api", "mix"])
def test_sparse_gradients_pass_through_the_agent(tmp_path: Any, level: str) -> None:
    """``nn.Embedding(sparse=True)`` gives its weight a sparse gradient. The agent's alias
    of the weight (how an input's gradient reaches its backward record) was a ``view_as``,
    whose backward reshapes the gradient: the user's ``loss.backward()`` raised. The
    gradient now reaches the record, without statistics (a sparse tensor has none here)."""
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level=level)
    assert _sparse_steps(dbg) == _sparse_steps(None)
    assert dbg.enabled
    ops = {o["op"]: o for o in read_ops(os.path.join(tmp_path, "step1", "rank0"))}
    back = ops["Functional.embedding.0.backward"]
    (weight,) = [t for t in back["tensors"] if t["name"].endswith("output.1")]
    assert weight["shape"] == [50, 16] and weight["stats"]["max"] is None
    (dense,) = [t for t in back["tensors"] if t["role"] == "input"]
    assert dense["shape"] == [4, 6, 16] and dense["stats"]["norm"] > 0


@pytest.mark.parametrize("level", ["api", "mix"])
def test_a_tensor_passed_twice_is_one_object_to_the_op(
    tmp_path: Any, level: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Self-attention passes one tensor as query, key and value, and attention takes its
    packed in-projection only when ``query is key is value``. The agent gave each position
    an alias of its own, so the op took another path than without the agent. One alias per
    tensor now; its gradient, the total over the positions, is recorded once."""
    orig = F._in_projection_packed  # what the captured op calls with its q, k, v
    seen: list[tuple[bool, bool]] = []

    def spy(q: Any, k: Any, v: Any, *a: Any, **kw: Any) -> Any:
        seen.append((q is k, k is v))
        return orig(q, k, v, *a, **kw)

    monkeypatch.setattr(F, "_in_projection_packed", spy)
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 4)
    x = torch.randn(5, 2, 16, requires_grad=True)
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level=level)
    dbg.start(mha)
    mha(x, x, x)[0].sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    assert seen == [(True, True)]
    ops = {o["op"]: o for o in read_ops(os.path.join(tmp_path, "step0", "rank0"))}
    back = ops["Functional.multi_head_attention_forward.0.backward"]
    grads = {
        t["name"].rsplit(".", 2)[-2] + "." + t["name"].rsplit(".", 1)[-1]: t
        for t in back["tensors"]
        if t["role"] == "output"
    }
    assert "output.0" in grads and "output.1" not in grads and "output.2" not in grads, grads
    assert grads["output.0"]["shape"] == [5, 2, 16]
    assert x.grad is not None
    assert math.isclose(grads["output.0"]["stats"]["norm"], x.grad.norm().item(), rel_tol=1e-5)


class _Pair(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.same: list[bool] = []

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        self.same.append(a is b)
        return a * b


def test_a_module_given_one_tensor_twice_gets_one_object(tmp_path: Any) -> None:
    """The module level hands a module its arguments as they are (modules.py): one tensor
    passed twice stays one object, and its gradient is recorded once, under the first name."""
    outer = torch.nn.ModuleDict({"pair": _Pair()})
    x = torch.randn(3, requires_grad=True)
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level="module")
    dbg.start(outer)
    outer["pair"](x, x).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    assert outer["pair"].same == [True]
    ops = {o["op"]: o for o in read_ops(os.path.join(tmp_path, "step0", "rank0"))}
    back = ops["Module.pair._Pair.backward.0"]
    (g,) = [t for t in back["tensors"] if t["role"] == "output"]
    assert g["name"].endswith("output.0")
    assert x.grad is not None and math.isclose(
        g["stats"]["norm"], x.grad.norm().item(), rel_tol=1e-6
    )


class _Recurrent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(8, 16, num_layers=2, batch_first=True)
        self.cell = torch.nn.GRUCell(16, 16)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, (h, _) = self.rnn(x)
        return self.head(self.cell(out[:, -1], h[-1]))


def _recurrent_steps(dbg: Any, steps: int = 2) -> tuple[list[float], _Recurrent, list[Any]]:
    torch.manual_seed(0)
    model = _Recurrent()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(3, 5, 8, generator=g), torch.randint(0, 4, (3,), generator=g))
        for _ in range(2)
    ]
    loss_of = lambda b: F.cross_entropy(model(b[0]), b[1])  # noqa: E731
    return run_steps(dbg, model, [opt], batches[:steps], loss_of), model, batches


@pytest.mark.parametrize("level", ["api", "mix"])
def test_recurrent_layers_are_captured_at_api_level(tmp_path: Any, level: str) -> None:
    """``nn.LSTM``, ``nn.GRU``, ``nn.RNN`` and their cells compute in ``torch._VF``'s
    kernels, which no hooked API reached: an LSTM left no API record. They are hooked as
    ``VF.<name>`` (msprobe's API type): forward and backward records, training unchanged."""
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level=level)
    losses, _, _ = _recurrent_steps(dbg)
    assert losses == _recurrent_steps(None)[0] and dbg.enabled
    ops = {o["op"]: o for o in read_ops(os.path.join(tmp_path, "step1", "rank0"))}
    assert {"VF.lstm.0.backward", "VF.gru_cell.0.forward", "VF.gru_cell.0.backward"} <= set(ops)
    # The LSTM's output at step 1, computed again from the weights after step 0.
    _, model, batches = _recurrent_steps(None, steps=1)
    with torch.no_grad():
        want = model.rnn(batches[1][0])[0]
    (out,) = [t for t in ops["VF.lstm.0.forward"]["tensors"] if t["name"].endswith("output.0")]
    assert out["shape"] == [3, 5, 16]
    assert math.isclose(out["stats"]["norm"], float(want.double().norm()), rel_tol=1e-6)


def test_gradient_clipping_norms_are_recorded(tmp_path: Any) -> None:
    """``clip_grad_norm_`` takes every gradient's norm in one ``torch._foreach_norm`` call and
    their total with ``torch.linalg.vector_norm``; neither was hooked, so the norm a clipping
    threshold is held against left no record. Both are now (msprobe hooks them too), the
    dotted name as ``Torch.linalg.vector_norm``, and the wrapper is gone after ``stop()``."""
    vector_norm = torch.linalg.vector_norm
    torch.manual_seed(0)
    model = Tiny()
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level="api")
    dbg.start(model)
    F.cross_entropy(model(x), y).backward()
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
    dbg.stop()
    dbg.step()
    dbg.close()
    assert torch.linalg.vector_norm is vector_norm
    ops = {o["op"]: o for o in read_ops(os.path.join(tmp_path, "step0", "rank0"))}
    grads = [p for p in model.parameters() if p.grad is not None]
    norms = ops["Torch._foreach_norm.0.forward"]["tensors"]
    assert [t["name"].split(".forward.")[1] for t in norms] == [
        f"input.0.{i}" for i in range(len(grads))
    ] + [f"output.{i}" for i in range(len(grads))]
    (out,) = [
        t for t in ops["Torch.linalg.vector_norm.0.forward"]["tensors"] if t["role"] == "output"
    ]
    # The total norm clip_grad_norm_ returned, before it scaled the gradients.
    assert math.isclose(out["stats"]["max"], float(total), rel_tol=1e-6)


def test_gradients_unscaled_by_amp_are_recorded_unscaled(tmp_path: Any) -> None:
    """``GradScaler.unscale_`` divides the gradients in place with an operator that bumps no
    version counter: the optimizer's reads of them were recorded with the statistics of the
    scaled gradients the backward left (1024 times too large here). They are recorded as
    they are read."""
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level="api")
    dbg.start(model)
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    scaler.step(opt)
    scaler.update()
    dbg.stop()
    dbg.step()
    dbg.close()
    ops = {o["op"]: o for o in read_ops(os.path.join(tmp_path, "step0", "rank0"))}
    # Adam's first lerp_ reads the first parameter's (unscaled) gradient.
    (grad,) = [t for t in ops["Tensor.lerp_.0.forward"]["tensors"] if t["name"].endswith("input.1")]
    first = next(model.parameters())
    assert first.grad is not None
    assert math.isclose(grad["stats"]["norm"], float(first.grad.double().norm()), rel_tol=1e-6), (
        grad
    )


def test_printing_a_tensor_or_a_state_dict_leaves_no_records(tmp_path: Any) -> None:
    """``print(loss)`` formats the tensor with some twenty calls of hooked APIs (reshape,
    isfinite, masked_select, abs, min, max, ceil ...), and ``model.state_dict()`` detaches
    every parameter: neither is the model's computation, each call left a record, and a run
    that prints or saves a checkpoint compared with one that does not had them unmatched."""
    dumps = []
    for printing in (False, True):
        dump = str(tmp_path / f"print{printing}")
        torch.manual_seed(0)
        x = torch.randn(4, 3)
        model = Tiny()
        dbg = probe.Debugger(None, dump_path=dump, level="api")
        dbg.start()
        y = torch.tanh(x) * 2.5
        if printing:
            assert "tensor(" in repr(y) and "tensor(" in f"{y}" and "tensor(" in str(y)
            state = model.state_dict()
            assert len(state) == 8 and all(not t.requires_grad for t in state.values())
        y.sum()
        dbg.stop()
        dbg.step()
        dbg.close()
        dumps.append([o["op"] for o in read_ops(os.path.join(dump, "step0", "rank0"))])
    assert (
        dumps[0]
        == dumps[1]
        == [
            "Torch.tanh.0.forward",
            "Tensor.__mul__.0.forward",
            "Tensor.sum.0.forward",
        ]
    ), dumps


@pytest.mark.parametrize("mode", ["statistics", "tensor", "overflow"])
def test_nested_tensors_are_recorded_without_switching_capture_off(
    tmp_path: Any, mode: str
) -> None:
    """A nested tensor has no sizes (strided layout) or a symbolic ragged one (jagged), and
    recording one raised: capture was off for the rest of the run. ``nn.TransformerEncoder``
    makes them in eval with a padding mask, and jagged ones carry packed sequences. They are
    recorded now: strided with the padded shape, jagged with the ragged dimension's total,
    the statistics those of their elements, no data stored."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=True).eval()
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(3, 5, 16)
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[0, 3:] = True
    parts = [torch.randn(2, 4), torch.randn(3, 4)]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", UserWarning)  # (nested tensors are a prototype)
        want = enc(x, src_key_padding_mask=mask)
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level="mix", mode=mode)
    dbg.start(enc)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", UserWarning)
        got = enc(x, src_key_padding_mask=mask)
    jagged = torch.nested.nested_tensor(parts, layout=torch.jagged, requires_grad=True)
    lin(jagged).values().sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    assert dbg.enabled
    assert torch.allclose(got, want, equal_nan=True)
    if mode == "overflow":
        return  # (nothing overflowed: nothing to record)
    ops = {o["op"]: o for o in read_ops(os.path.join(tmp_path, "step0", "rank0"))}
    layer_in = [
        t
        for t in ops["Module.layers.0.TransformerEncoderLayer.forward.0"]["tensors"]
        if t["role"] == "input"
    ][0]
    # The unpadded elements of x: every row but the three masked positions.
    kept = x[~mask]
    assert layer_in["shape"] == [3, 5, 16]
    assert math.isclose(layer_in["stats"]["norm"], float(kept.double().norm()), rel_tol=1e-5)
    assert "file" not in layer_in
    # The jagged input of the last linear: 2 sequences, 5 rows in all.
    linears = [k for k in ops if k.startswith("Functional.linear.") and k.endswith("forward")]
    last = max(linears, key=lambda k: ops[k]["seq"])
    (jin,) = [t for t in ops[last]["tensors"] if t["name"].endswith("input.0")]
    assert jin["shape"] == [2, 5, 4]
    assert math.isclose(jin["stats"]["max"], float(torch.cat(parts).max()), rel_tol=1e-6)


@pytest.mark.parametrize("level", ["api", "mix"])
def test_a_parameters_gradient_accumulator_is_reachable_while_capturing(
    tmp_path: Any, level: str
) -> None:
    """FSDP, DeepSpeed, Megatron-LM and Apex reach a parameter's gradient accumulator as
    ``p.expand_as(p).grad_fn.next_functions[0][0]`` and hook it to reduce gradients. The
    agent gave ``expand_as`` an alias of ``p``, so they hooked the alias's node, which no
    backward runs: FSDP's gradients were never reduced (None), and its training changed."""
    torch.manual_seed(0)
    model = Tiny()
    x = torch.randn(4, 8)
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level=level)
    dbg.start(model)
    seen: dict[str, torch.Tensor] = {}
    keep = []
    for name, p in model.named_parameters():
        acc = p.expand_as(p).grad_fn.next_functions[0][0]
        assert type(acc).__name__ == "AccumulateGrad" and acc.variable is p
        acc.register_hook(lambda gi, go, name=name: seen.__setitem__(name, go[0].clone()))
        keep.append(acc)
    model(x).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    assert dbg.enabled
    assert set(seen) == {n for n, _ in model.named_parameters()}
    for name, p in model.named_parameters():
        assert torch.equal(seen[name], p.grad), name


def _by_op(folder: str) -> dict[str, dict[str, dict[str, Any]]]:
    """Each record's tensors by the part of their name after ``.forward.``."""
    return {
        o["op"]: {t["name"].rsplit(".forward.", 1)[1]: t for t in o["tensors"]}
        for o in read_ops(folder)
    }


@pytest.mark.parametrize("mode", ["statistics", "tensor", "checksum"])
def test_memory_nothing_wrote_is_recorded_as_unwritten(tmp_path: Any, mode: str) -> None:
    """Memory that ``torch.empty`` allocates, or a storage ``resize_`` grows, holds whatever
    bytes were there: FSDP2 makes views of its gather buffers before filling them, and their
    statistics (NaN now and then, different in every run) made two equal runs compare as
    diverging and a clean one scan as producing NaN. A tensor over such memory is recorded
    ``unwritten``, without statistics, data or checksum, until something writes there: a
    captured op, or any op writing through a tensor that shares its version counter."""
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level="api", mode=mode)
    dbg.start(torch.nn.Linear(2, 2))
    big = torch.empty(5000)  # looked up by the memory it reads too (Dataflow.LAYOUT_MIN)
    big.view(2, 2500)
    big.narrow(0, 0, 100).view(10, 10)
    small = torch.empty(64)
    small.view(8, 8)
    torch.split_with_sizes_copy(torch.ones(2, 32), [32], dim=1, out=[small.view(2, 32)])
    small.view(8, 8)  # written by a captured op
    storage = small.untyped_storage()
    storage.resize_(0)
    storage.resize_(64 * 4)  # FSDP's way of allocating a gathered parameter again
    small.view(4, 16)
    torch.ops.aten.fill_.Scalar(small, 3.0)  # not a hooked API: seen by its version
    small.view(16, 4)
    other = torch.empty(8).new_empty(32)
    other.view(4, 8)
    torch.ops.aten.fill_.Scalar(other.narrow(0, 0, 4), 5.0)  # part of it, through a view
    other.view(8, 4)
    dbg.stop()
    dbg.step()
    dbg.close()
    ops = _by_op(os.path.join(tmp_path, "step0", "rank0"))

    def unwritten(t: dict[str, Any]) -> bool:
        if not t.get("unwritten"):
            return False
        assert t["stats"] is None, t  # no statistics, not even NaN/Inf counts
        assert "file" not in t and "checksum" not in t, t
        return True

    # (view.3 is the copy's destination, made before it)
    for op in ("view.0", "narrow.0", "view.1", "view.2", "view.3"):
        tensors = ops[f"Tensor.{op}.forward"]
        assert all(unwritten(t) for t in tensors.values()), (op, tensors)
    copy = ops["Torch.split_with_sizes_copy.0.forward"]
    assert unwritten(copy["input.out.0"]) and not unwritten(copy["input.0"])
    after = ops["Tensor.view.4.forward"]["output.0"]
    assert not unwritten(after) and after["stats"]["max"] == 1.0, after
    assert unwritten(ops["Tensor.view.5.forward"]["input.0"])  # after the resize
    filled = ops["Tensor.view.6.forward"]["output.0"]
    assert not unwritten(filled) and filled["stats"]["min"] == 3.0, filled
    assert unwritten(ops["Tensor.view.7.forward"]["input.0"])  # new_empty
    part = ops["Tensor.view.8.forward"]["output.0"]
    assert not unwritten(part) and part["stats"]["max"] is not None, part  # read as it is


def test_a_storage_written_through_itself_is_read_again(tmp_path: Any) -> None:
    """``UntypedStorage.resize_``, ``fill_`` and ``copy_`` change bytes that no version
    counter sees. FSDP frees a gathered parameter's memory after its forward and allocates
    it again before its backward so, and the views read then were recorded with the
    statistics kept from the forward, not the values they held."""
    x = torch.ones(4096)  # large enough to be known by its memory as well
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level="api")
    dbg.start(torch.nn.Linear(2, 2))
    x.view(64, 64)
    storage = x.untyped_storage()
    storage.fill_(0)  # (bytes: 0.0 in float32)
    x.view(64, 64)
    storage.resize_(0)
    storage.resize_(4096 * 4)
    storage.copy_(torch.full((4096,), 5.0).untyped_storage())
    x.view(64, 64)
    dbg.stop()
    dbg.step()
    dbg.close()
    ops = _by_op(os.path.join(tmp_path, "step0", "rank0"))
    for i, want in enumerate((1.0, 0.0, 5.0)):
        for name in ("input.0", "output.0"):
            t = ops[f"Tensor.view.{i}.forward"][name]
            assert t["stats"]["max"] == t["stats"]["min"] == want, (i, t)


def test_unwritten_marks_are_bounded_within_a_step(tmp_path: Any) -> None:
    """A step that allocates without end keeps at most ``FRESH_MAX`` marks: those of freed
    memory go first, then all of them (the memory is then read as it is)."""
    from probe.capture import records

    dbg = probe.Debugger(None, dump_path=str(tmp_path), level="api")
    dbg.start(torch.nn.Linear(2, 2))
    fresh = dbg._recorder.flow.fresh
    live, other = torch.empty(4), torch.empty(4)
    batch = [torch.empty(4) for _ in range(records.FRESH_MAX - 2)]  # all alive: distinct
    assert len(fresh) == records.FRESH_MAX
    del batch
    torch.empty(4)  # the freed ones' marks go, the live ones' stay
    assert len(fresh) <= 3
    live.view(2, 2)
    kept = [torch.empty(4) for _ in range(records.FRESH_MAX)]  # none freed: all go
    assert len(fresh) < records.FRESH_MAX <= len(kept)
    other.view(4)
    dbg.stop()
    dbg.step()
    dbg.close()
    first, second = read_ops(os.path.join(tmp_path, "step0", "rank0"))
    assert all(t.get("unwritten") for t in first["tensors"]), first
    assert not any(t.get("unwritten") for t in second["tensors"]), second


def test_a_module_fed_memory_nothing_wrote_records_it_as_unwritten(tmp_path: Any) -> None:
    """A pipeline stage runs its first forward on ``torch.empty`` inputs to learn its
    output shapes. A module's record read those leftover bytes as its input's values; it
    records them as ``unwritten`` now, as an API call's does, and its output (written by
    the module) as it is. (At module level no API is wrapped, ``torch.empty`` included:
    such memory is read as it is there.)"""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level="mix")
    dbg.start(model)
    with torch.no_grad():
        model(torch.empty(2, 4))
        model(torch.zeros(2, 4))
    dbg.stop()
    dbg.step()
    dbg.close()
    ops = _by_op(os.path.join(tmp_path, "step0", "rank0"))
    first, second = (
        {k.split(".", 1)[1]: t for k, t in ops[f"Module.0.Linear.forward.{i}"].items()}
        for i in (0, 1)
    )
    assert first["input.0"].get("unwritten") and first["input.0"]["stats"] is None, first
    assert not first["output.0"].get("unwritten") and first["output.0"]["stats"], first
    assert not second["input.0"].get("unwritten") and second["input.0"]["stats"]["max"] == 0.0


@pytest.mark.parametrize("level", ["module", "mix"])
def test_lazy_modules_are_hooked_once_their_parameters_exist(tmp_path: Any, level: str) -> None:
    """A lazy module (``nn.LazyLinear``) has uninitialised parameters until its first
    forward. Hooking their gradients at ``start()`` raised, and capture was off for the
    rest of the run. Their hooks are now registered when the module's forward starts
    (its own pre-hook has made them then), so the first step has its gradients too."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LazyLinear(8), torch.nn.ReLU(), torch.nn.LazyLinear(3))
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level=level)
    grads = []
    for _ in range(2):
        dbg.start(model)
        model(torch.randn(4, 5)).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        model.zero_grad()
        dbg.stop()
        dbg.step()
    dbg.close()
    assert dbg.enabled
    for step in range(2):
        ops = {o["op"]: o for o in read_ops(os.path.join(tmp_path, f"step{step}", "rank0"))}
        # (a materialized lazy module becomes the class it stands for)
        cls = "LazyLinear" if step == 0 else "Linear"
        for idx in (0, 2):
            rec = ops[f"Module.{idx}.{cls}.parameters_grad"]
            got = {t["name"].rsplit(".", 1)[1]: t["stats"] for t in rec["tensors"]}
            assert set(got) == {"weight", "bias"}, rec
            for pname, stats in got.items():
                want = grads[step][f"{idx}.{pname}"].double()
                assert math.isclose(stats["norm"], float(want.norm()), rel_tol=1e-6)
                assert math.isclose(stats["max"], float(want.max()), rel_tol=1e-6)


def test_an_input_a_module_rewraps_links_to_its_producer_when_a_view_of_it_died(
    tmp_path: Any,
) -> None:
    """An op can read a tensor object the agent never saw over memory it captured (a view
    made by uncaptured code: here an ``aten`` view, which no wrapper sees; once, at mix
    level, the alias the module capture handed a module): it is linked to the output
    captured over that memory (``src``). When the newest such output was a view that has
    died since (a router's ``x.reshape(...)``, as an MoE block runs before its experts), the
    link was lost: the experts' input looked like data from outside, and compare could not
    tell that each expert read the same tokens. The older output, still alive, is linked
    now."""

    class Gate(torch.nn.Module):
        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return h.reshape(-1, 8).sum()  # the view dies on return

    class Experts(torch.nn.Module):
        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return h[torch.tensor([0, 2])] * 2

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.gate, self.experts = torch.nn.Linear(8, 8), Gate(), Experts()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.lin(x).view(-1, 8)
            g = self.gate(h)
            return self.experts(torch.ops.aten.view.default(h, [-1, 8])).sum() + g

    torch.manual_seed(0)
    model = Block()
    for level in ("api", "mix"):
        dump = str(tmp_path / level)
        dbg = probe.Debugger(None, dump_path=dump, level=level)
        dbg.start(model)
        model(torch.randn(4, 8)).backward()
        dbg.stop()
        dbg.step()
        dbg.close()
        ops = {o["op"]: o for o in read_ops(os.path.join(dump, "step0", "rank0"))}
        view_out = ops["Tensor.view.0.forward"]["tensors"][-1]
        read = ops["Tensor.__getitem__.0.forward"]["tensors"][0]
        assert read["name"].endswith("input.0") and view_out["name"].endswith("output.0")
        assert read.get("src") == view_out["id"], (level, read)


def test_an_identity_ops_backward_record_has_both_gradients(tmp_path: Any) -> None:
    """``x.float()`` on a float32 ``x`` returns ``x`` itself; under bfloat16 autocast the same
    call copies. The agent hands the identity its input back (not the autograd alias that
    was to bring the input's gradient), so its backward record had the output's gradient
    only, was written at ``stop()``, and the two runs' casts did not pair in the backward.
    Through an identity the input's gradient is the output's: it is recorded as such, and
    the record is complete when the gradient comes."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(3, 4)
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level="api")
    dbg.start()
    y = lin(x).float()
    (y * y).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    ops = read_ops(os.path.join(tmp_path, "step0", "rank0"))
    keys = _keys(ops)
    bwd = ops[keys.index("Tensor.float.0.backward")]
    grads = {
        t["name"].rsplit(".", 2)[-2] + "." + t["name"].rsplit(".", 1)[-1]: t for t in bwd["tensors"]
    }
    assert set(grads) == {"input.0", "output.0"}, bwd
    want = (2 * lin(x)).detach().double()
    for t in grads.values():
        assert t["dtype"] == "float32" and t["shape"] == [3, 4]
        assert math.isclose(t["stats"]["norm"], float(want.norm()), rel_tol=1e-6), t
    # Written in the backward's order: before the linear's backward record, not at stop().
    assert keys.index("Tensor.float.0.backward") < keys.index("Functional.linear.0.backward"), keys


REPLACED = """
import sys, torch, probe
import torch.nn.functional as F
x = torch.linspace(-1.0, 2.0, 8)
for i, dump in enumerate(sys.argv[1:]):
    if i == 1:  # a port's kernel swapped in between two sessions of one process
        gelu = F.gelu
        F.gelu = lambda t, approximate="none": gelu(t, approximate=approximate) * 2.0
    dbg = probe.Debugger(None, dump_path=dump, level="api", mode="statistics")
    dbg.start()
    F.gelu(x)
    dbg.stop()
    dbg.step()
    dbg.close()
"""


def test_an_api_replaced_between_two_sessions_is_captured_as_replaced(tmp_path: Any) -> None:
    """The agent wraps each API once per process; code that replaces an API after a first
    session (a library's patch, a port's kernel) is what a later session captures, not the
    function the first one wrapped."""
    dumps = [str(tmp_path / "first"), str(tmp_path / "second")]
    r = run_agent_script(REPLACED, *dumps)
    assert r.returncode == 0, r.stderr[-3000:]
    outs = []
    for d in dumps:
        (op,) = [
            o
            for o in read_ops(os.path.join(d, "step0", "rank0"))
            if o["op"].startswith("Functional.gelu")
        ]
        outs.append(op["tensors"][-1]["stats"]["max"])
    expected = float(torch.nn.functional.gelu(torch.tensor(2.0)))
    assert outs[0] == pytest.approx(expected) and outs[1] == pytest.approx(2 * expected), outs


def test_a_module_built_inside_a_captured_step_reads_no_leftover_bytes(tmp_path: Any) -> None:
    """Issue 53 item 5: an ``nn.Linear`` created during the step makes its weight with
    ``nn.Parameter(torch.empty(...))`` and fills it with ``uniform_``. The parameter is
    another tensor than the one ``empty`` returned (which is gone by then), sharing its
    memory and version counter: the value before ``uniform_`` was recorded with the
    statistics of the leftover bytes, and ``probe scan`` read their NaN as entering from
    outside. It is recorded ``unwritten``, and the scan is clean."""
    # Leftover NaN where the next small allocations are likely to land.
    poison = [torch.full((8, 8), float("nan")) for _ in range(64)]
    del poison
    dbg = probe.Debugger(None, dump_path=str(tmp_path / "d"), level="mix", mode="statistics")
    model = torch.nn.Linear(8, 8)
    dbg.start(model)
    extra = torch.nn.Linear(8, 8)  # built inside the captured step
    extra(model(torch.randn(2, 8))).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    ops = read_ops(os.path.join(tmp_path, "d", "step0", "rank0"))
    fills = [o for o in ops if o["op"].startswith("Tensor.uniform_.")]
    assert len(fills) == 2, [o["op"] for o in ops]  # the weight's and the bias's
    for o in fills:
        before = next(t for t in o["tensors"] if t["name"].endswith(".input.0"))
        assert before.get("unwritten") is True and before["stats"] is None, before
    out = subprocess.run(
        [probe_bin(), "scan", str(tmp_path / "d"), "-o", str(tmp_path / "s"), "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
