"""Capture inside ``torch.compile`` graphs with Inductor (capture/graphs.py): a 4-layer
transformer compiled against its eager twin, on CPU.

The compiled run's dump holds the graphs' API calls, with statistics the compiled code
computed; compare of the two runs passes; a fault in one op that only Inductor's code has
(its decomposition of GELU off by 5 %) is named by compare's headline; capture does not
change what the compiled model computes, and no captured step recompiles it. One module
fixture compiles each variant once (Inductor compiles C++ on CPU: tens of seconds each)."""

from __future__ import annotations

import json
import os
import subprocess
import warnings
from typing import Any, Callable, Optional

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import probe
from conftest import load_example, probe_bin, read_ops, run_agent_script, run_steps

dynamo = pytest.importorskip("torch._dynamo")
from torch._dynamo.utils import counters  # noqa: E402

STEPS = 3
CAPTURED = (0, 2)


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.matmul(q, k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        h = torch.matmul(F.softmax(att, dim=-1), v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(h)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Transformer(nn.Module):
    """4 layers, width 32, 4 heads, a 64-token vocabulary."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.layers = nn.ModuleList(Block(32, 4) for _ in range(4))
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 64)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        out: torch.Tensor = self.head(self.norm(x))
        return out


def _train(
    dump: Optional[str],
    compile: bool,
    directions: tuple[str, ...] = ("forward",),
    steps: int = STEPS,
) -> tuple[list[float], int]:
    """``steps`` Adam steps of the transformer (those of ``CAPTURED`` captured into
    ``dump`` at API level), compiled with Inductor or eager; the losses, and the graphs
    Dynamo compiled."""
    dynamo.reset()
    before = int(counters["stats"]["unique_graphs"])
    probe.seed_all(0)
    model = Transformer()
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 64, (4, 16), generator=g) for _ in range(steps)]
    run: Callable[[torch.Tensor], torch.Tensor] = torch.compile(model) if compile else model
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    dbg = None
    if dump is not None:
        dbg = probe.Debugger(None, dump_path=dump, level="api", directions=list(directions))
    losses = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, tokens in enumerate(data):
            if dbg is not None and i in CAPTURED:
                dbg.start(model)
            opt.zero_grad()
            logits = run(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, 64), tokens[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            if dbg is not None:
                dbg.stop()
                dbg.step()
            losses.append(loss.item())
    if dbg is not None:
        assert dbg.enabled, "capture switched itself off"
        dbg.close()
    return losses, int(counters["stats"]["unique_graphs"]) - before


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("compiled")
    out: dict[str, Any] = {"root": root}
    # Forward only: a graph without gradient taps compiles in half the time (minutes for
    # this one on two CPU cores). The graphs' backward is test_backward_of_an_inductor_graph.
    out["eager"] = _train(str(root / "eager"), compile=False)
    out["compiled"] = _train(str(root / "compiled"), compile=True)
    undo = load_example().inductor_fault("gelu", 0.05)
    try:  # (step 0 only: its test compares that step, and no uncaptured graph is compiled)
        out["fault"] = _train(str(root / "fault"), compile=True, steps=1)
    finally:
        undo()
    return out


def _compare_dirs(bench: str, cmp: str, out: str, *extra: str) -> tuple[int, dict[str, Any]]:
    r = subprocess.run(
        [probe_bin(), "compare", "-q", "-b", bench, "-c", cmp, "-o", out, "--format", "json"]
        + list(extra),
        capture_output=True,
        text=True,
        timeout=300,
    )
    with open(os.path.join(out, "summary.json")) as fh:
        return r.returncode, json.load(fh)


def _compare(root: Any, cmp: str) -> tuple[int, dict[str, Any]]:
    """Compare the first step: Inductor's backward is not the eager one to the last bit,
    and Adam makes last bits of small gradients into different updates, so later steps'
    weights drift apart (drift, not a defect: what compare's tolerances cannot tell yet)."""
    eager = str(root / "eager")
    return _compare_dirs(eager, str(root / cmp), str(root / f"out-{cmp}"), "--steps", "0")


def test_no_captured_step_recompiles_the_model(runs: Any) -> None:
    # Captured and uncaptured steps alternate: traced with the agent's hooks and without,
    # never again per start() (the instrumented copy is no new Dynamo graph). (That the
    # agent leaves the compiled training unchanged is test_compile.py's, with AOT autograd.)
    _, graphs = runs["compiled"]
    assert 1 <= graphs <= 2, graphs


def test_the_dump_holds_the_compiled_graphs_calls(runs: Any) -> None:
    root = runs["root"]
    with open(root / "compiled" / "manifest.json") as fh:
        manifest = json.load(fh)
    got = manifest["compiled_capture"]
    assert got["forward"] is True and got["backward"] is False and got["graphs"] >= 1, got
    assert "compiled" not in manifest
    for step in CAPTURED:
        ops = read_ops(str(root / "compiled" / f"step{step}" / "rank0"))
        eager = read_ops(str(root / "eager" / f"step{step}" / "rank0"))
        inside = [o for o in ops if "graph" in o]
        # Every call of the model's forward is in the graph, named and numbered as the
        # eager run names it, in the same order; the slicing of the batch before it, the
        # loss and Adam's updates after it are eager calls.
        assert [o["op"] for o in ops] == [o["op"] for o in eager]
        fwd_inside = inside
        first = ops.index(inside[0])
        assert ops[first : first + len(inside)] == inside and len(inside) > 90
        fc1 = [o for o in fwd_inside if o["module"] == "layers.2.fc1"]
        assert len(fc1) == 1
        assert fc1[0]["graph"]["node"]
        # The statistics are those of the tensors the eager run computes, to float32
        # rounding (the compiled code fuses and reorders, its sums are float64).
        want = {o["op"]: o for o in eager}[fc1[0]["op"]]
        for a, b in zip(fc1[0]["tensors"], want["tensors"]):
            assert a["name"] == b["name"] and a["shape"] == b["shape"]
            for k in ("max", "min", "norm"):
                assert a["stats"][k] == pytest.approx(b["stats"][k], rel=1e-5, abs=1e-6)
    stacks = (root / "compiled" / "step0" / "rank0" / "stacks.jsonl").read_text()
    assert "test_compile_capture.py" in stacks and "self.fc2(F.gelu(" in stacks


def test_compiled_against_eager_passes(runs: Any) -> None:
    code, s = _compare(runs["root"], "compiled")
    assert code == 0, s["headline"]
    assert s["counts"]["error"] == 0 and s["counts"]["unmatched_cmp"] == 0, s["counts"]


def test_a_fault_in_inductors_code_is_named(runs: Any) -> None:
    code, s = _compare(runs["root"], "fault")
    assert code == 1, s["headline"]
    assert "first divergent op Functional.gelu.0.forward" in s["headline"], s["headline"]
    assert "`layers.0`" in s["headline"], s["headline"]


def test_backward_of_an_inductor_graph(tmp_path: Any) -> None:
    """The backward records of a graph's calls, from its compiled backward (gradient taps,
    graph_taps.py): the same records as an eager run's, in both directions, and compare
    passes; a call whose output no loss reads has no backward record (none came)."""
    from conftest import Tiny

    def run(path: str, compile: bool) -> None:
        dynamo.reset()
        torch.manual_seed(0)
        model = Tiny()
        x = torch.randn(4, 8)
        fn: Callable[[torch.Tensor], torch.Tensor] = torch.compile(model) if compile else model
        dbg = probe.Debugger(None, dump_path=path, level="api")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dbg.start(model)
            fn(x).square().mean().backward()
            dbg.stop()
        dbg.close()

    eager, comp = str(tmp_path / "eager"), str(tmp_path / "compiled")
    run(eager, False)
    run(comp, True)
    e = read_ops(os.path.join(eager, "step0", "rank0"))
    c = read_ops(os.path.join(comp, "step0", "rank0"))
    assert sorted(o["op"] for o in c) == sorted(o["op"] for o in e)
    bwd = {o["op"]: o for o in c if o["direction"] == "backward" and "graph" in o}
    assert set(bwd) == {
        "Functional.linear.0.backward",
        "Functional.gelu.0.backward",
        "Functional.layer_norm.0.backward",
        "Functional.linear.1.backward",
        "Tensor.__add__.0.backward",
        "Functional.linear.2.backward",
    }, set(bwd)
    want = {o["op"]: o for o in e}
    for key, op in bwd.items():
        names = [t["name"] for t in op["tensors"]]
        assert names == [t["name"] for t in want[key]["tensors"]], key
        for a, b in zip(op["tensors"], want[key]["tensors"]):
            assert a["stats"]["norm"] == pytest.approx(b["stats"]["norm"], rel=1e-5), a["name"]
    code, _ = _compare_dirs(eager, comp, str(tmp_path / "out"))
    assert code == 0


class _Residual(nn.Module):
    """The shape that showed it: a residual sum (of a transposed activation) read by a
    LayerNorm and a mean over tokens, as train_small's block and final norm."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(16, 16)
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 64)
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pre(x).transpose(1, 2)
        h = h + self.b(F.gelu(self.a(h)))
        out: torch.Tensor = self.head(self.norm(h).mean(dim=1))
        return out


class _Conv(nn.Module):
    """The example's shape: convolutions, BatchNorm (whose running statistics the graph
    writes) and ReLU, whose activations Inductor stores channels-last on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 16, 3, padding=1)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn(self.c1(x)))
        h = F.relu(self.c2(h))
        out: torch.Tensor = self.head(h.mean(dim=(2, 3)))
        return out


@pytest.mark.parametrize(
    "model, shape, api",
    [
        (_Residual, (8, 64, 16), "Functional.layer_norm.0"),
        (_Conv, (8, 3, 16, 16), "Functional.batch_norm.0"),
    ],
    ids=["layernorm", "conv"],
)
def test_capture_leaves_inductors_training_bit_identical(
    tmp_path: Any,
    model: type[nn.Module],
    shape: tuple[int, ...],
    api: str,
) -> None:
    """Two SGD steps compiled by Inductor, captured on every step (forward and backward
    taps), against the same steps without the agent: the same losses and parameters, bit
    for bit. A tap traced as plain reductions was fused into the kernel of the residual
    sum, LayerNorm and mean, whose reduction was then generated otherwise: 9 of the 10
    parameters differed in the last bits. Taps are opaque operators now (graph_taps.py),
    which read what the model's kernels stored, as they stored it (tap_lowering.py): the
    conv model's taps read stored buffers, and no buffer is stored otherwise."""
    import torch._functorch.config as aot_config
    import torch._inductor.config as inductor_config

    from probe.capture import tap_lowering

    def train(dump: Optional[str]) -> tuple[list[float], list[torch.Tensor]]:
        dynamo.reset()
        torch.manual_seed(0)
        net = model()
        run = torch.compile(net)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        dbg = probe.Debugger(None, dump_path=dump, level="api") if dump else None
        batches = [
            (torch.randn(*shape, generator=g), torch.randint(0, 4, (8,), generator=g))
            for _ in range(2)
        ]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            losses = run_steps(dbg, net, [opt], batches, lambda b: F.cross_entropy(run(b[0]), b[1]))
        assert dbg is None or dbg.enabled
        return losses, [p.detach().clone() for p in net.parameters()]

    bare = train(None)
    stored, direct = tap_lowering.READS["stored"], tap_lowering.READS["direct"]
    # Compiled here, not taken from a cache an earlier run filled: the taps are lowered.
    with inductor_config.patch(fx_graph_cache=False), aot_config.patch(enable_autograd_cache=False):
        got = train(str(tmp_path))
    assert got[0] == bare[0]
    assert all(torch.equal(a, b) for a, b in zip(got[1], bare[1]))
    # Taps read buffers as the compiled code stored them (not only copies).
    assert tap_lowering.READS["stored"] > stored
    # ... and CPU taps call the kernel directly, without the operator's dispatch.
    assert tap_lowering.READS["direct"] > direct
    # The graph's calls were captured in both directions, on both steps.
    for step in (0, 1):
        ops = read_ops(str(tmp_path / f"step{step}" / "rank0"))
        inside = {o["op"] for o in ops if "graph" in o}
        assert {f"{api}.forward", f"{api}.backward"} <= inside


RERUN = """
import json, sys, warnings
import torch, torch.nn as nn, torch.nn.functional as F
from torch._dynamo.utils import counters
import probe

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
run = torch.compile(net)
dbg = probe.Debugger(None, dump_path=sys.argv[1], level="api")
x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    dbg.start(net)
    F.cross_entropy(run(x), torch.arange(8) % 4).backward()
    dbg.stop()
    dbg.step()
dbg.close()
print(json.dumps({k: dict(counters[k]) for k in ("inductor", "aot_autograd")}))
"""


def test_a_rerun_takes_the_instrumented_graphs_from_the_compile_caches(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's second run compiles nothing: Inductor's graph cache and AOTAutograd's cache
    hold the instrumented graphs too. Both skipped them (a compile without a shape
    environment; a graph calling the taps' functions), and every run traced and compiled
    them anew: a minute for test_compile_capture's transformer on two CPU cores."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    counts, dumps = [], []
    for i in range(2):
        dump = str(tmp_path / f"run{i}")
        r = run_agent_script(RERUN, dump)
        assert r.returncode == 0, r.stderr[-4000:]
        counts.append(json.loads(r.stdout.strip().splitlines()[-1]))
        dumps.append(read_ops(os.path.join(dump, "step0", "rank0")))
    first, second = counts
    # The first run compiles the plain forward, and the instrumented forward and backward.
    assert first["inductor"].get("fxgraph_cache_miss", 0) >= 3, first
    assert second["inductor"].get("fxgraph_cache_miss", 0) == 0, second
    assert second["inductor"]["fxgraph_cache_hit"] == first["inductor"]["fxgraph_cache_miss"]
    assert not any("bypass" in k for c in counts for part in c.values() for k in part), counts
    # (The plain graph's entry waits for its backward, which this step does not run.)
    assert second["aot_autograd"].get("autograd_cache_hit", 0) >= 1, second

    # Both runs captured the same calls, forward and backward, with the same statistics.
    def key(ops: list[dict[str, Any]]) -> list[tuple[str, list[Any]]]:
        return [(o["op"], [t.get("stats") for t in o.get("tensors", [])]) for o in ops]

    assert key(dumps[0]) == key(dumps[1])
    inside = {o["op"] for o in dumps[0] if "graph" in o}
    assert {"Functional.gelu.0.forward", "Functional.gelu.0.backward"} <= inside, inside
