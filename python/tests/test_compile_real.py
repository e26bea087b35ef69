"""Capture inside ``torch.compile`` graphs in the cases real training has (graph_taps.py):
autocast to bfloat16, activation checkpointing inside the compiled region, a body the agent
cannot instrument (``torch.cond``), and the ``eager`` backend, whose graphs run as Python.
Each compiled run is compared with the same model run eagerly under the agent: records,
dtypes and statistics, and ``probe compare``. AOT autograd (``aot_eager``) keeps them cheap;
Inductor's transparency is test_compile_capture.py's."""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

import probe
from conftest import compare_summary, read_ops

dynamo = pytest.importorskip("torch._dynamo")


class Net(nn.Module):
    """Linear, then a block (Linear, LayerNorm, GELU, residual) under activation
    checkpointing when ``checkpoint``, then a head; under bfloat16 autocast (entered inside
    the compiled region) when ``autocast``."""

    def __init__(self, checkpoint: bool, autocast: bool) -> None:
        super().__init__()
        self.checkpoint = checkpoint
        self.autocast = autocast
        self.fc = nn.Linear(8, 16)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.GELU())
        self.head = nn.Linear(16, 4)

    def body(self, h: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = h + self.block(h)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            h = self.fc(x)
            if self.checkpoint:
                h = torch.utils.checkpoint.checkpoint(self.body, h, use_reentrant=False)
            else:
                h = self.body(h)
            out: torch.Tensor = self.head(h).float()
        return out


def _run(
    dump: str | None, backend: str | None, checkpoint: bool = False, autocast: bool = False
) -> tuple[list[torch.Tensor], list[dict[str, Any]]]:
    """One training step (forward, backward) of ``Net``, compiled with ``backend`` (None:
    eager), captured at API level into ``dump`` (None: no agent); the gradients, and the
    step's records."""
    dynamo.reset()
    torch.manual_seed(0)
    model = Net(checkpoint, autocast)
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 3])
    fn: Callable[[torch.Tensor], torch.Tensor] = (
        torch.compile(model, backend=backend) if backend else model
    )
    dbg = probe.Debugger(None, dump_path=dump, level="api") if dump else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dbg is not None:
            dbg.start(model)
        F.cross_entropy(fn(x), y).backward()
        if dbg is not None:
            dbg.stop()
            dbg.close()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if dbg is None or dump is None:
        return grads, []
    assert dbg.enabled, "capture switched itself off"
    return grads, read_ops(os.path.join(dump, "step0", "rank0"))


def _manifest(dump: str) -> dict[str, Any]:
    with open(os.path.join(dump, "manifest.json")) as fh:
        out: dict[str, Any] = json.load(fh)
    return out


def test_a_checkpointed_block_inside_a_compiled_model(tmp_path: Any) -> None:
    """``torch.utils.checkpoint`` inside the compiled region is a higher-order operator
    whose body is a graph of its own: its calls were missing from the dump, and nothing said
    so. The body is instrumented now: each of its calls has one forward record (the eager
    run's recompute has no counterpart: compare accounts for it) and its backward record,
    the statistics are the eager run's, and the gradients those of the compiled run
    without the agent."""
    eager, comp = str(tmp_path / "eager"), str(tmp_path / "compiled")
    _, e = _run(eager, None, checkpoint=True)
    bare, _ = _run(None, "aot_eager", checkpoint=True)
    grads, c = _run(comp, "aot_eager", checkpoint=True)
    assert all(torch.equal(a, b) for a, b in zip(grads, bare)) and len(grads) == len(bare) == 8
    recomputed = [o["op"] for o in e if o.get("recompute")]
    assert "Functional.layer_norm.1.forward" in recomputed, recomputed  # the eager recompute
    assert not [o for o in c if o.get("recompute")]
    assert [o["op"] for o in c] == [o["op"] for o in e if not o.get("recompute")]
    inside = {o["op"]: o for o in c if "graph" in o}
    for key in ("Functional.layer_norm.0", "Functional.gelu.0", "Tensor.__add__.0"):
        assert f"{key}.forward" in inside and f"{key}.backward" in inside, key
    assert inside["Functional.layer_norm.0.forward"]["module"] == "block.1"
    want = {o["op"]: o for o in e}
    for key, op in inside.items():
        names = [t["name"] for t in op["tensors"]]
        assert names == [t["name"] for t in want[key]["tensors"]], key
        for a, b in zip(op["tensors"], want[key]["tensors"]):
            assert a["stats"]["norm"] == pytest.approx(b["stats"]["norm"], rel=1e-5), a["name"]
    assert "compiled" not in _manifest(comp)  # nothing missing
    code, s = compare_summary(eager, comp, str(tmp_path / "out"))
    assert code == 0, s["headline"]
    counts = s["counts"]
    assert counts["error"] == 0 and counts["unmatched_bench"] == counts["unmatched_cmp"] == 0
    assert counts["recompute"] > 0, counts


def test_autocast_inside_a_compiled_model(tmp_path: Any) -> None:
    """bfloat16 autocast entered inside the compiled region (and a checkpoint under it):
    Dynamo's graph holds the calls, not autocast's casts, with the dtypes autocast gives
    (a linear's output bfloat16 from float32 weights, the ``.float()`` after the head);
    the records are the eager run's, dtypes included, and compare passes."""
    eager, comp = str(tmp_path / "eager"), str(tmp_path / "compiled")
    _, e = _run(eager, None, checkpoint=True, autocast=True)
    bare, _ = _run(None, "aot_eager", checkpoint=True, autocast=True)
    grads, c = _run(comp, "aot_eager", checkpoint=True, autocast=True)
    assert all(torch.equal(a, b) for a, b in zip(grads, bare))
    want = {o["op"]: o for o in e}
    inside = [o for o in c if "graph" in o]
    # 3 linears, layer_norm, gelu, the residual's add and .float(): forward and backward.
    assert len(inside) == 14, [o["op"] for o in inside]
    for op in inside:
        got = [(t["name"], t["dtype"], t["shape"]) for t in op["tensors"]]
        assert got == [(t["name"], t["dtype"], t["shape"]) for t in want[op["op"]]["tensors"]]
    linear = {o["op"]: o for o in inside}["Functional.linear.0.forward"]
    assert [t["dtype"] for t in linear["tensors"]] == ["float32"] * 3 + ["bfloat16"]
    code, s = compare_summary(eager, comp, str(tmp_path / "out"))
    assert code == 0, s["headline"]
    assert s["counts"]["error"] == 0 and s["counts"]["unmatched_cmp"] == 0, s["counts"]


def test_a_body_the_agent_cannot_instrument_is_reported(tmp_path: Any) -> None:
    """The branches of ``torch.cond`` are bodies of a higher-order operator that the agent
    does not instrument: the step says that operators are missing (warning, manifest)
    instead of a dump that silently lacks them."""

    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc(x)
            out: torch.Tensor = torch.cond(h.sum() > 0, F.gelu, torch.tanh, (h,))
            return out

    dynamo.reset()
    torch.manual_seed(0)
    model = Branchy()
    fn = torch.compile(model, backend="aot_eager")
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level="api", directions=["forward"])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dbg.start(model)
        fn(torch.randn(4, 8))
        dbg.stop()
    dbg.close()
    told = [str(w.message) for w in seen if "missing from the dump" in str(w.message)]
    assert len(told) == 1 and "higher-order operator" in told[0], told
    assert _manifest(str(tmp_path))["compiled"] is True
    keys = [o["op"] for o in read_ops(os.path.join(tmp_path, "step0", "rank0"))]
    assert keys == ["Functional.linear.0.forward", "Tensor.sum.0.forward"], keys


def test_the_eager_backends_gradient_taps_are_not_the_models_calls(tmp_path: Any) -> None:
    """With the ``eager`` backend the graph runs as Python, and so does a gradient tap's
    backward, while the step is captured: its ``d * d`` was recorded as the model's
    ``Tensor.__mul__`` (float64), once per gradient. The compiled run's records are now
    the eager run's."""
    eager, comp = str(tmp_path / "eager"), str(tmp_path / "compiled")
    _, e = _run(eager, None)
    bare, _ = _run(None, "eager")
    grads, c = _run(comp, "eager")
    assert all(torch.equal(a, b) for a, b in zip(grads, bare))
    assert [o["op"] for o in c] == [o["op"] for o in e]
    assert sum("graph" in o for o in c) >= 12
