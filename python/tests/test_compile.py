"""The agent beside ``torch.compile`` (capture/compiled.py): training runs as it would
without the agent, compiled models are not recompiled at every captured step, the dump holds
the eager calls only (none of the compiler's own), and the user is told once."""

from __future__ import annotations

import json
import os
import subprocess
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import probe
from conftest import (
    SCHEMAS,
    Tiny,
    compare_summary,
    load_example,
    probe_bin,
    read_ops,
    run_agent_script,
)
from probe.capture import compiled

dynamo = pytest.importorskip("torch._dynamo")
from torch._dynamo.utils import counters  # noqa: E402


EXAMPLE = load_example()


def _graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


def _run(
    backend: str, dbg: Any, steps: int, give_wrapper: bool = True, every: int = 2
) -> list[float]:
    """``steps`` SGD steps of the example's model compiled, capturing every ``every``-th
    one (the even ones by default) under ``dbg`` (when given), from a fresh Dynamo;
    returns the losses."""
    dynamo.reset()
    probe.seed_all(0)
    model = EXAMPLE.SmallNet()
    data = EXAMPLE.make_data(2, 4, torch.device("cpu"))
    cm = torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for i in range(steps):
        x, y = data[i % 2]
        cap = dbg is not None and i % every == 0
        if cap:
            dbg.start(cm if give_wrapper else model)
        opt.zero_grad()
        out = cm(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        if cap:
            dbg.stop()
        if dbg is not None:
            dbg.step()
        losses.append(loss.item())
    if dbg is not None:
        dbg.close()  # its wrappers out: TorchScript cannot script through them
    return losses


@pytest.mark.parametrize("level", ["api", "mix"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_compiled_model_trains_as_without_the_agent(
    tmp_path: Any, backend: str, level: str
) -> None:
    before = _graphs()
    bare = _run(backend, None, 6)
    before, bare_graphs = _graphs(), _graphs() - before
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level=level)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = _run(backend, dbg, 6, give_wrapper=level == "mix")
    assert dbg.enabled, "capture was switched off by an error inside a compiled step"
    assert got == bare
    # Traced once with the agent's hooks and once without (the uncaptured steps), not again
    # at every start(): a graph per captured step would reach Dynamo's recompile limit.
    assert _graphs() - before <= bare_graphs + 1, (_graphs() - before, bare_graphs)
    # Every graph was compiled after the Debugger existed: instrumented, nothing missing.
    assert not [w for w in seen if "missing from the dump" in str(w.message)]
    keys = {}
    for step in (0, 2, 4):
        ops = read_ops(os.path.join(tmp_path, f"step{step}", "rank0"))
        keys[step] = [o["op"] for o in ops]
        for o in ops:
            assert "_orig_mod" not in o["op"] and "_orig_mod" not in (o.get("module") or "")
    assert keys[0] == keys[2] == keys[4], "captured steps dumped different calls"
    apis = {k.rsplit(".", 2)[0] for k in keys[0] if k.endswith(".forward") and "Module." not in k}
    assert {"Functional.cross_entropy", "Tensor.add_", "Tensor.reshape"} <= apis
    if backend == "aot_eager":
        # The model runs as one compiled graph: its calls are recorded from the graph
        # (``graph``), the loss and SGD's updates eagerly. AOT autograd's runtime wrapper
        # detaches the graph's outputs at every call, from its own code: not the model's
        # calls, not in the dump.
        ops = read_ops(os.path.join(tmp_path, "step0", "rank0"))
        eager = {o["op"].rsplit(".", 2)[0] for o in ops if "graph" not in o and o["kind"] == "api"}
        assert eager == {"Functional.cross_entropy", "Tensor.add_", "Tensor.reshape"}, eager
        inside = {o["op"] for o in ops if "graph" in o}
        for api in ("Functional.conv2d", "Functional.linear", "Functional.gelu"):
            assert f"{api}.0.forward" in inside and f"{api}.0.backward" in inside, api
    if level == "mix":
        grads = [k for k in keys[0] if k.endswith("parameters_grad")]
        assert "Module.block.fc1.Linear.parameters_grad" in grads, grads


@pytest.mark.parametrize("give_wrapper", [True, False], ids=["compiled", "its-model"])
def test_captured_steps_in_a_row_do_not_recompile(tmp_path: Any, give_wrapper: bool) -> None:
    """Every step captured, as ``steps=[0, 1, ...]`` does: the agent's forward hooks are new
    at every ``start()``, and Dynamo guarded the traced module calls on the ids of those
    that run even when the forward raises (``always_call``): each captured step recompiled
    the model (6 graphs for 6 steps here), and after Dynamo's limit of 8 it ran uncompiled.
    Under compiled code the hooks are plain ones now (modules.py)."""
    before = _graphs()
    bare = _run("aot_eager", None, 6)
    before, bare_graphs = _graphs(), _graphs() - before
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level="api")
    got = _run("aot_eager", dbg, 6, give_wrapper=give_wrapper, every=1)
    assert dbg.enabled
    assert got == bare
    assert _graphs() - before <= bare_graphs + 1, (_graphs() - before, bare_graphs)
    for step in range(6):
        ops = read_ops(os.path.join(tmp_path, f"step{step}", "rank0"))
        inside = {o["op"] for o in ops if "graph" in o}
        assert "Functional.gelu.0.forward" in inside, (step, sorted(inside)[:5])


def _dump_sgd_steps(
    path: str, backend: str, sizes: tuple[int, ...] = (), dynamic: Any = None
) -> None:
    """Captured SGD steps of the example's model at API level, compiled with ``backend``
    (``""``: eager): two of batch 4, or one per batch size of ``sizes``."""
    dynamo.reset()
    probe.seed_all(0)
    model = EXAMPLE.SmallNet()
    cpu = torch.device("cpu")
    data = [EXAMPLE.make_data(1, b, cpu, seed=b)[0] for b in sizes] or EXAMPLE.make_data(2, 4, cpu)
    run = torch.compile(model, backend=backend, dynamic=dynamic) if backend else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = probe.Debugger(None, dump_path=path, level="api")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for x, y in data:
            dbg.start(run)
            opt.zero_grad()
            out = run(x)
            F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)).backward()
            opt.step()
            dbg.stop()
            dbg.step()
    dbg.close()


def test_a_graphs_records_are_the_same_read_on_the_host_or_from_device_rows(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """A compiled graph's forward records are written from its statistics read on the host
    at once (CPU), or hold device rows the stats buffer reads with its batch (an
    accelerator; run here on CPU with ``READ_ON_CPU`` off): the graphs' records and the
    stacks are the same either way. (The eager calls around the graph differ in their last
    bits: with ``READ_ON_CPU`` off they take PyTorch's reductions, not the kernel.)"""
    from probe.capture import stats as stats_mod

    runs = []
    for on_host in (True, False):
        monkeypatch.setattr(stats_mod, "READ_ON_CPU", on_host)
        path = str(tmp_path / f"host{on_host}")
        _dump_sgd_steps(path, "aot_eager")
        got = {}
        for step in (0, 1):
            folder = os.path.join(path, f"step{step}", "rank0")
            got[step] = [o for o in read_ops(folder) if "graph" in o]
            for o in got[step]:
                o["graph"].pop("id")  # (a new graph of the process: the next id)
            with open(os.path.join(folder, "stacks.jsonl"), "rb") as fh:
                got[f"stacks{step}"] = fh.read()
        runs.append(got)
    assert runs[0] == runs[1]
    inside = runs[0][1]
    assert len(inside) > 20
    assert {o["direction"] for o in inside} == {"forward", "backward"}
    assert all(t["stats"]["max"] is not None for o in inside for t in o["tensors"])


def test_a_compiled_run_against_an_eager_one_passes(tmp_path: Any) -> None:
    """The benchmark captured eagerly, the comparison run compiled (AOT autograd): the
    compiled run's dump holds the graph's calls, forward and backward, named as the eager
    run's, with the loss and the optimizer's updates around them, and compare pairs every
    tensor. (Before the graphs' calls were captured, its dump held the loss and the updates
    only: the eager run's BatchNorm counter ``Tensor.add_`` shifted every update's call
    number, and the updates of two parameters of one shape were compared with each other,
    48 tensors out of tolerance; then compare said the comparison was incomplete.)"""
    eager, comp = str(tmp_path / "eager"), str(tmp_path / "compiled")
    _dump_sgd_steps(eager, "")
    _dump_sgd_steps(comp, "aot_eager")
    jsonschema = pytest.importorskip("jsonschema")
    with open(os.path.join(SCHEMAS, "probe-dump-manifest.v1.schema.json")) as fh:
        schema = json.load(fh)
    for path, captured in ((eager, None), (comp, {"forward": True, "backward": True})):
        with open(os.path.join(path, "manifest.json")) as fh:
            manifest = json.load(fh)
        assert "compiled" not in manifest, path  # nothing compiled is missing
        got = manifest.get("compiled_capture")
        if captured is None:
            assert got is None
        else:  # (a second graph: traced again once the agent's hooks changed)
            assert got["graphs"] in (1, 2) and {k: got[k] for k in captured} == captured, got
        jsonschema.validate(manifest, schema)
    out = str(tmp_path / "out")
    r = subprocess.run(
        [probe_bin(), "compare", "-q", "-b", eager, "-c", comp, "-o", out, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    with open(os.path.join(out, "summary.json")) as fh:
        s = json.load(fh)
    assert r.returncode == 0, s["headline"]
    c = s["counts"]
    assert c["error"] == 0 and c["unmatched_cmp"] == 0 and c["unmatched_bench"] == 0, c
    ops = read_ops(os.path.join(comp, "step0", "rank0"))
    assert {"Functional.gelu.0.forward", "Functional.gelu.0.backward"} <= {
        o["op"] for o in ops if "graph" in o
    }
    updates = [o["op"] for o in ops if "graph" not in o]
    assert sum(k.startswith("Tensor.add_.") for k in updates) == 22, updates
    assert not [w for w in s["warnings"] if "compiled" in w], s["warnings"]


def test_the_paths_of_compiled_submodules_are_the_eager_ones() -> None:
    torch.manual_seed(0)
    eager = [p for p, _ in Tiny().named_modules()]
    model = Tiny()
    assert not compiled.in_model(model)
    model.block = torch.compile(model.block, backend="eager")  # type: ignore[assignment]
    whole = torch.compile(model, backend="eager")
    for m in (model, whole):
        assert [p for p, _ in compiled.module_tree(m)] == eager
        assert compiled.in_model(m)
    assert compiled.unwrap(whole) is model
    assert compiled.unwrap(model) is model


def test_calls_on_fake_tensors_are_not_captured(tmp_path: Any) -> None:
    """What a compiler runs through PyTorch's Python API while lowering a graph: under a
    fake mode, or on fake tensors outside it. Capturing them read values that do not exist
    and switched capture off for the rest of the run."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    dbg = probe.Debugger(None, dump_path=str(tmp_path), level="api")
    dbg.start()
    a = torch.ones(3) + 0
    with FakeTensorMode() as mode:
        fake = torch.ones(3) * 2  # under the mode
    fake.to(torch.float64)  # a fake tensor outside it
    b = a * 3
    dbg.stop()
    dbg.step()
    dbg.close()
    assert dbg.enabled
    assert mode is not None and b.sum().item() == 9.0
    keys = [o["op"] for o in read_ops(os.path.join(tmp_path, "step0", "rank0"))]
    assert keys == ["Tensor.__add__.0.forward", "Tensor.__mul__.0.forward"], keys


INDUCTOR_IMPORTED_WHILE_CAPTURING = r"""
import json, os, sys, warnings
import torch, torch.nn as nn
import probe
warnings.simplefilter("ignore")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
x = torch.randn(5, 8)
dbg = probe.Debugger(None, dump_path=sys.argv[1], level="api", directions=["forward"])
dbg.start(model)
import torch._inductor.kernel.mm  # binds extern_kernels.mm to torch.mm: the agent's wrapper
from torch._inductor.select_algorithm import extern_kernels
assert extern_kernels.mm is torch.mm
model(x).sum().backward()  # step 0: eager
dbg.stop(); dbg.step()
run = torch.compile(model)
for _ in range(2):  # steps 1, 2: compiled (the first compiles)
    dbg.start(model)
    run(x).sum().backward()
    dbg.stop(); dbg.step()
dbg.close()
"""


def test_inductors_code_calling_the_agents_wrappers_is_not_the_models_call(
    tmp_path: Any,
) -> None:
    """Inductor binds the PyTorch functions its generated code calls (``extern_kernels.mm``)
    when it is imported: during a capture, those are the agent's wrappers. The matrix
    products of the compiled backward then ran through them with capture on and were
    recorded as the model's forward calls (``Torch.mm``): the compiled run no longer
    matched its eager twin (found by test order: in a process where an earlier test had
    imported Inductor under capture). Each step's dump holds the model's calls, the same
    in the eager step and in the compiled ones."""
    r = run_agent_script(INDUCTOR_IMPORTED_WHILE_CAPTURING, str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [
        [o["op"] for o in read_ops(os.path.join(tmp_path, f"step{i}", "rank0"))] for i in range(3)
    ]
    assert steps[0] == [
        "Functional.linear.0.forward",
        "Functional.gelu.0.forward",
        "Functional.linear.1.forward",
        "Tensor.sum.0.forward",
    ], steps[0]
    assert steps[1] == steps[0] and steps[2] == steps[0], steps


def test_a_compiled_model_is_reported_without_a_new_graph(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled model given to start() says by itself that its operators are missing,
    when Dynamo compiles nothing new in the captured step (here: its graph count frozen)."""
    import probe.capture.debugger as pd

    monkeypatch.setattr(pd, "graph_count", lambda: 0)
    dynamo.reset()
    torch.manual_seed(0)
    cm = torch.compile(Tiny(), backend="aot_eager")
    x = torch.randn(4, 8)
    # Compiled here, before any Debugger existed: without the agent's compiler hook (an
    # earlier test of this process installed it, for the process's life).
    from torch._dynamo.output_graph import OutputGraph

    hooked = OutputGraph.call_user_compiler
    monkeypatch.setattr(OutputGraph, "call_user_compiler", getattr(hooked, "__wrapped__", hooked))
    cm(x).sum().backward()
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level="api")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dbg.start(cm)
        cm(x).sum().backward()
        dbg.stop()
    dbg.close()
    assert [str(w.message) for w in seen if "torch.compile" in str(w.message)]
    assert dbg.model is compiled.unwrap(cm)


def test_a_torchscript_submodule_is_left_unhooked(tmp_path: Any) -> None:
    """A scripted submodule refuses Python hooks: registering them raised, and capture was
    off from the first start(). It is left unhooked, like compiled code, and said so."""
    torch.manual_seed(0)
    model = Tiny()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # TorchScript is deprecated
        model.block = torch.jit.script(model.block)  # type: ignore[assignment]
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level="mix")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dbg.start(model)
        F.cross_entropy(model(torch.randn(4, 8)), torch.tensor([0, 1, 2, 3])).backward()
        dbg.stop()
    dbg.close()
    assert dbg.enabled
    told = [str(w.message) for w in seen if "TorchScript" in str(w.message)]
    assert len(told) == 1, told
    keys = [o["op"] for o in read_ops(os.path.join(tmp_path, "step0", "rank0"))]
    assert "Module.fc1.Linear.forward.0" in keys and "Module.head.Linear.forward.0" in keys
    assert not any(k.startswith("Module.block") for k in keys), keys
    assert [p for p, _ in compiled.module_tree(model)] == ["", "fc1", "head"]


def _halve_relu(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) * 0.5 + F.gelu(x)


class _Block(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x) + torch.tanh(x)


def test_scripting_and_tracing_while_capturing(tmp_path: Any) -> None:
    """``torch.jit.script`` of a function calling ``torch.relu`` found the agent's wrapper
    and raised; ``torch.jit.trace`` made shape values tensors, a record could not be
    written and capture switched off; FX tracing wrote records of proxies and gave its graph
    the agent's wrappers as targets. They now run with the wrappers removed: each gives what
    it gives without the agent, records nothing, and capture goes on after them."""
    x = torch.randn(3, 4)
    want_fn, want_block = _halve_relu(x), _Block()(x)
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level="api")
    dbg.start()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (scripting and tracing are deprecated)
        scripted = torch.jit.script(_halve_relu)
        traced = torch.jit.trace(_Block(), x)
    graph = torch.fx.symbolic_trace(_Block())
    after = torch.sigmoid(x)  # captured: the wrappers are back
    dbg.stop()
    dbg.step()
    dbg.close()
    assert dbg.enabled
    assert torch.equal(scripted(x), want_fn) and torch.equal(traced(x), want_block)
    assert torch.equal(graph(x), want_block)
    targets = {n.target for n in graph.graph.nodes if n.op == "call_function"}
    assert F.relu in targets and torch.tanh in targets
    assert all(not hasattr(t, "__probe_wrapped__") for t in targets)
    ops = [o["op"] for o in read_ops(os.path.join(tmp_path, "step0", "rank0"))]
    assert ops == ["Torch.sigmoid.0.forward"], ops
    assert torch.equal(after, torch.sigmoid(x))


#: Batch sizes of steps (:func:`_dump_sgd_steps`): the second runs a graph compiled for
#: symbolic sizes (Dynamo's automatic dynamic, or ``dynamic=True`` from the start).
SIZES = (4, 6, 4)


@pytest.mark.parametrize(
    "backend,dynamic", [("aot_eager", None), ("aot_eager", True), ("inductor", True)]
)
def test_a_graph_with_symbolic_shapes_is_captured_at_the_sizes_it_runs_with(
    tmp_path: Any, backend: str, dynamic: Any
) -> None:
    """A graph compiled with symbolic sizes (``dynamic=True``; or by default, once the
    model ran with a second batch size: Dynamo's automatic dynamic, as FSDP2's compiled
    submodules and variable sequence lengths get) is instrumented for the sizes of each
    captured call: every step's dump holds the graph's calls, forward and backward, at that
    step's batch size, and compare against the same steps run eagerly pairs every tensor
    within tolerance. Before, such a graph ran uninstrumented: its calls were missing and
    the manifest said so."""
    eager, comp = str(tmp_path / "eager"), str(tmp_path / "compiled")
    _dump_sgd_steps(eager, "", SIZES)
    _dump_sgd_steps(comp, backend, SIZES, dynamic)
    with open(os.path.join(comp, "manifest.json")) as fh:
        manifest = json.load(fh)
    assert "compiled" not in manifest, manifest  # nothing compiled is missing
    assert {k: manifest["compiled_capture"][k] for k in ("forward", "backward")} == {
        "forward": True,
        "backward": True,
    }
    for step, batch in enumerate(SIZES):
        ops = read_ops(os.path.join(comp, f"step{step}", "rank0"))
        inside = {o["op"]: o for o in ops if "graph" in o}
        conv = inside["Functional.conv2d.0.forward"]["tensors"][0]
        assert conv["shape"] == [batch, 3, 32, 32], (step, conv)
        grad = inside["Functional.conv2d.0.backward"]["tensors"]
        assert [t["shape"] for t in grad if t["role"] == "input"] == [[batch, 32, 32, 32]]
    code, s = compare_summary(eager, comp, str(tmp_path / "out"), "--format", "json")
    assert code == 0, s["headline"]
    c = s["counts"]
    assert c["error"] == 0 and c["unmatched_cmp"] == 0 and c["unmatched_bench"] == 0, c
    assert not [w for w in s["warnings"] if "compiled" in w], s["warnings"]


def test_a_graph_run_at_more_sizes_than_it_is_instrumented_for_is_reported(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """Each set of sizes is a compile of the instrumented graph, so there are at most
    ``graphs.MAX_SHAPES`` of them: a captured call at another runs the graph as compiled,
    and the dump says that its operators are missing."""
    from probe.capture import graphs

    monkeypatch.setattr(graphs, "MAX_SHAPES", 1)
    dynamo.reset()
    torch.manual_seed(0)
    model = Tiny()
    cm = torch.compile(model, backend="aot_eager", dynamic=True)
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level="api")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for batch in (4, 5, 6, 7):  # (the second may recompile: a new graph, new sizes)
            dbg.start(model)
            cm(torch.randn(batch, 8)).sum().backward()
            dbg.stop()
            dbg.step()
    dbg.close()
    assert dbg.enabled
    told = [str(w.message) for w in seen if "could not instrument" in str(w.message)]
    assert len(told) == 1, [str(w.message) for w in seen]
    with open(os.path.join(tmp_path, "manifest.json")) as fh:
        assert json.load(fh)["compiled"] is True
    first = read_ops(os.path.join(tmp_path, "step0", "rank0"))
    assert [[4, 8]] == [
        o["tensors"][0]["shape"] for o in first if o["op"] == "Functional.linear.0.forward"
    ]
    last = os.path.join(tmp_path, "step3", "rank0")
    assert not os.path.exists(last) or not [o for o in read_ops(last) if "graph" in o]


class _Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.gelu(self.fc(self.norm(x)))


class _Layers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Layer() for _ in range(3)])
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _dump_blocks(path: str, compiled: bool) -> None:
    """Two captured SGD steps of :class:`_Layers`, each block compiled on its own (AOT
    autograd) when ``compiled``, as TorchTitan compiles a transformer's layers."""
    dynamo.reset()
    torch.manual_seed(0)
    model = _Layers()
    if compiled:
        for i, block in enumerate(model.blocks):
            model.blocks[i] = torch.compile(block, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    dbg = probe.Debugger(None, dump_path=path, level="api")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for x in data:
            dbg.start(model)
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            dbg.stop()
            dbg.step()
    dbg.close()


def test_a_graph_run_by_another_module_of_its_class_records_that_modules_calls(
    tmp_path: Any,
) -> None:
    """Dynamo runs one graph for every module of a class (their parameters are its
    arguments): with each block compiled on its own, the graph compiled for one block
    runs the next. Its records carry the module that runs it: before, the third block's
    calls were recorded as the second's (``blocks.1.fc``), and an eager twin's records of
    ``blocks.2`` had no counterpart at module level."""
    eager, comp = str(tmp_path / "eager"), str(tmp_path / "compiled")
    _dump_blocks(eager, False)
    _dump_blocks(comp, True)
    for step in range(2):
        ops = read_ops(os.path.join(comp, f"step{step}", "rank0"))
        inside = [o for o in ops if "graph" in o]
        mods = {o["op"]: o["module"] for o in inside}
        for k in range(3):
            assert mods[f"Functional.linear.{k}.forward"] == f"blocks.{k}.fc", mods
            assert mods[f"Functional.layer_norm.{k}.backward"] == f"blocks.{k}.norm", mods
            assert mods[f"Functional.gelu.{k}.forward"] == f"blocks.{k}", mods
        want = [
            (o["op"], o["module"])
            for o in read_ops(os.path.join(eager, f"step{step}", "rank0"))
            if o["op"].split(".")[1] in ("linear", "layer_norm", "gelu", "__add__")
        ]
        assert [(o["op"], o["module"]) for o in inside] == [w for w in want if w[1] != "head"]
    code, s = compare_summary(eager, comp, str(tmp_path / "out"), "--format", "json")
    assert code == 0, s["headline"]
    c = s["counts"]
    assert c["unmatched_cmp"] == 0 and c["unmatched_bench"] == 0, c


class _Norm(torch.nn.Module):
    """A residual around an RMS norm written as LLaMA's: ``x.to(torch.float32)`` of a
    float32 tensor returns the tensor itself."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, 8))
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        f = h.to(torch.float32)
        f = f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + 1e-6)
        return h + self.weight * f.to(x.dtype).contiguous()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_call_that_returns_its_input_has_the_tensors_whole_gradient(
    tmp_path: Any, backend: str
) -> None:
    """A call that returns its input itself (a no-op ``.to()``, ``contiguous()`` of a
    contiguous tensor): in eager code its output is that tensor, and its backward record
    holds the tensor's whole gradient, the residual's part included. The compiled graph
    has a node for the output whose gradient is that of the uses after the call only: it
    was recorded, and compare said the divergence entered from outside at that ``to``."""
    dumps = {}
    for name, compile in (("eager", False), ("compiled", True)):
        dynamo.reset()
        torch.manual_seed(0)
        model = _Norm()
        run = torch.compile(model, backend=backend) if compile else model
        dumps[name] = path = str(tmp_path / name)
        dbg = probe.Debugger(None, dump_path=path, level="api")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dbg.start(model)
            run(
                torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
            ).square().sum().backward()
            dbg.stop()
        dbg.close()
    got = {
        o["op"]: [t["stats"]["norm"] for t in o["tensors"]]
        for o in read_ops(os.path.join(dumps["compiled"], "step0", "rank0"))
        if "graph" in o
    }
    want = {
        o["op"]: [t["stats"]["norm"] for t in o["tensors"]]
        for o in read_ops(os.path.join(dumps["eager"], "step0", "rank0"))
    }
    for op in ("Tensor.to.0.backward", "Tensor.to.1.backward", "Tensor.contiguous.0.backward"):
        assert got[op] == pytest.approx(want[op], rel=1e-5), op
    code, s = compare_summary(dumps["eager"], dumps["compiled"], str(tmp_path / "out"))
    assert code == 0, s["headline"]
    assert s["counts"]["unmatched_bench"] == 0 and s["counts"]["unmatched_cmp"] == 0


@pytest.mark.parametrize(
    "source,want",
    [
        ("L['self'].layers.0.qkv", ("layers.0.qkv", "self")),
        ("L['self']._modules['fc']", ("fc", "self")),
        ("L['self'].blocks[1]._orig_mod.norm", ("blocks.1.norm", "self")),
        ("L['s'].fc", ("fc", "s")),
        ("G['net'].fc", ("fc", None)),
    ],
)
def test_a_nodes_module_path_from_dynamos_source(source: str, want: Any) -> None:
    """Dynamo's source of a node's module, as a path under the frame's variable it starts
    at (``layers.0.qkv`` under ``self``; a digit after a dot is a path part too: it was
    dropped, and the records of ``layers.0.qkv`` and ``layers.1.qkv`` both read
    ``layers.qkv`` where the path came from the source)."""
    from probe.capture.graph_taps import module_path

    class Node:
        meta = {"nn_module_stack": {"140": (source, torch.nn.Linear)}}

    assert module_path(Node()) == (want[0], 140, want[1])


def test_the_gradients_of_a_tuple_output_reach_the_backward_record(tmp_path: Any) -> None:
    """``q, k, v = x.chunk(3)``: each element is read through the graph's own ``getitem``
    node, so that is where the gradient taps sit; taps on getitems of their own got no
    gradient, and the compiled run's ``Tensor.chunk`` backward record lacked its inputs."""

    class Split(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(8, 24)
            self.b = torch.nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.a(x).chunk(3, dim=-1)
            out: torch.Tensor = self.b(q * k + v)
            return out

    def run(path: str, compile: bool) -> list[dict[str, Any]]:
        dynamo.reset()
        torch.manual_seed(0)
        model = Split()
        fn = torch.compile(model, backend="aot_eager") if compile else model
        dbg = probe.Debugger(None, dump_path=path, level="api")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dbg.start(model)
            fn(torch.randn(4, 8)).square().mean().backward()
            dbg.stop()
        dbg.close()
        return read_ops(os.path.join(path, "step0", "rank0"))

    eager, comp = run(str(tmp_path / "eager"), False), run(str(tmp_path / "compiled"), True)
    for ops in (eager, comp):
        chunk = next(o for o in ops if o["op"] == "Tensor.chunk.0.backward")
        names = [t["name"].split("backward.")[1] for t in chunk["tensors"]]
        assert names == ["input.0", "input.1", "input.2", "output.0"], names
    r = subprocess.run(
        [probe_bin(), "compare", "-q", "-b", str(tmp_path / "eager")]
        + ["-c", str(tmp_path / "compiled"), "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def _expected_row(x: torch.Tensor) -> list[float]:
    """``[max, min, sum, norm, NaN, Inf]`` of ``x`` computed in float64 on the host,
    PyTorch's rule for a tensor holding NaN (NaN max, min, sum and norm)."""
    v = [float(e) for e in x.double().flatten().tolist()]
    n_nan = sum(1 for e in v if e != e)
    n_inf = sum(1 for e in v if e in (float("inf"), float("-inf")))
    if n_nan:
        nan = float("nan")
        return [nan, nan, nan, nan, float(n_nan), float(n_inf)]
    return [max(v), min(v), sum(v), sum(e * e for e in v) ** 0.5, 0.0, float(n_inf)]


def test_a_tap_is_the_tensor_statistics_in_eager_and_inductor_code() -> None:
    """A graph tap's row, called eagerly and compiled by Inductor (as an opaque operator,
    whose CPU kernel is the native one-pass kernel where it loaded), holds each number in
    its own column: a NaN or an Inf in one statistic stays out of the others' columns, the
    counts count, a transposed view and a slice are read as the tensors they are, a
    one-element tensor as its value, and a gradient's row is the same numbers and a 1."""
    from probe.capture import stats
    from probe.capture.tap_ops import COLUMNS, GRAD_COLUMNS, tap

    stats.use_native()  # (as the first start() does; without it, PyTorch's reductions)
    g = torch.Generator().manual_seed(3)
    finite = torch.randn(7, 9, generator=g)
    with_nan = finite.clone()
    with_nan[2, 3] = float("nan")
    with_inf = finite.clone()
    with_inf[0, 1] = float("inf")
    with_inf[4, 4] = float("-inf")
    cases = [finite, with_nan, with_inf, finite > 0, finite.t(), finite.bfloat16()]
    # A slice with gaps in its memory (copied for the kernel), and one-element tensors
    # (read as their value): a step counter, a NaN loss, an infinite scale.
    cases += [finite[:, 1::3], torch.tensor(5), torch.tensor([float("nan")])]
    cases += [torch.tensor([[float("-inf")]]), torch.tensor(True)]

    def rows(*xs: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return [tap(x) for x in xs], [tap(x, GRAD_COLUMNS) for x in xs]

    dynamo.reset()
    for got, grads in (rows(*cases), torch.compile(rows, backend="inductor")(*cases)):
        for x, row, grad in zip(cases, got, grads):
            assert row.dtype == torch.float64 and row.shape == (COLUMNS,)
            assert grad.shape == (GRAD_COLUMNS,) and grad[COLUMNS].item() == 1.0
            assert torch.equal(grad[:COLUMNS].nan_to_num(7.0), row.nan_to_num(7.0))
            want = _expected_row(x.float())
            # Max, min and the counts exact; the sum and the norm as float32 kernels
            # accumulate them (within 1e-6 of the sum of magnitudes, the norm).
            scale = [0.0, 0.0, x.float().abs().sum().item(), abs(want[3]), 0.0, 0.0]
            for a, b, tol in zip(row.tolist(), want, scale):
                assert (a != a and b != b) or a == pytest.approx(b, rel=0, abs=1e-6 * tol), (
                    row,
                    want,
                )


class _Broken(torch.nn.Module):
    """Two compiled graphs with eager code between them: Dynamo breaks the graph at the
    data-dependent branch on ``.item()``, which runs eagerly."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.a(x))
        if h.sum().item() > 0:  # the graph break
            h = h * 2
        else:
            h = h - 1
        return torch.tanh(self.b(h))


def _dump_broken(path: str, backend: str) -> list[float]:
    dynamo.reset()
    probe.seed_all(0)
    model = _Broken()
    run = torch.compile(model, backend=backend) if backend else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(5)
    data = [torch.randn(6, 8, generator=g) for _ in range(2)]
    dbg = probe.Debugger(None, dump_path=path, level="api")
    losses = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for x in data:
            dbg.start(model)
            opt.zero_grad()
            loss = run(x).pow(2).mean()
            loss.backward()
            opt.step()
            dbg.stop()
            dbg.step()
            losses.append(loss.item())
    dbg.close()
    return losses


def test_a_graph_break_keeps_the_eager_order_of_the_calls(tmp_path: Any) -> None:
    """A model whose graph breaks at ``.item()``: the calls of the two graphs and of the
    eager code between them are recorded in the order the eager run records them, with
    the same names and numbers, in both steps; compare of the two runs passes."""
    eager, comp = str(tmp_path / "eager"), str(tmp_path / "compiled")
    losses = _dump_broken(eager, "")
    assert _dump_broken(comp, "aot_eager") == losses
    for step in ("step0", "step1"):
        want = read_ops(os.path.join(eager, step, "rank0"))
        got = read_ops(os.path.join(comp, step, "rank0"))
        forward = [o["op"] for o in want if o["op"].endswith(".forward")]
        assert [o["op"] for o in got if o["op"].endswith(".forward")] == forward
        # (no backward record of the ``sum`` read by ``.item()``: no gradient flows to it)
        assert {o["op"] for o in got} == {o["op"] for o in want}
        graphs = {o["graph"]["id"] for o in got if "graph" in o}
        assert len(graphs) == 2, graphs  # both sides of the break were instrumented
        assert "Functional.gelu.0.forward" in forward and "Torch.tanh.0.forward" in forward
        # The second graph's first call reads the first graph's GELU output: its input
        # names that output as its source, as in the eager dump.
        for ops in (want, got):
            gelu = next(o for o in ops if o["op"] == "Functional.gelu.0.forward")
            out = next(t["id"] for t in gelu["tensors"] if t["role"] == "output")
            after = forward[forward.index("Functional.gelu.0.forward") + 1 :]
            first = next(o for o in ops if o["op"] == after[1])  # (after[0]: the sum)
            assert first["tensors"][0]["role"] == "input"
            assert first["tensors"][0].get("src") == out, first
    with open(os.path.join(comp, "manifest.json")) as fh:
        assert "compiled" not in json.load(fh)  # nothing compiled went unrecorded
    code, s = compare_summary(eager, comp, str(tmp_path / "out"))
    assert code == 0, s["headline"]
    assert s["counts"]["unmatched_cmp"] == 0 and s["counts"]["unmatched_bench"] == 0, s["counts"]


def test_taps_move_after_the_last_reader_of_their_tensor_but_not_past_a_write() -> None:
    """tap_lowering.late_taps on a post-grad-like graph (make_fx, fake values): the tap of
    an activation moves after the matmul that reads it (which decides how it is stored);
    the tap of a graph input, and of a view of a buffer the graph writes into, stay where
    they are (a read after the write would see the new value)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from probe.capture import tap_lowering
    from probe.capture.tap_ops import _TAP_OP

    if _TAP_OP is None:
        pytest.skip("this PyTorch has no opaque tap operator")
    op = _TAP_OP

    def f(a: torch.Tensor, w: torch.Tensor, running: torch.Tensor) -> Any:
        x = torch.relu(a)
        r_x = op(x, 6)
        r_a = op(a, 6)
        old = running.view(-1)
        r_run = op(old, 6)
        y = torch.mm(x, w) + a + old  # each tapped tensor is read again later
        running.copy_(y.sum(0))
        return y, torch.stack([r_x, r_a, r_run])

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4, 4), torch.randn(4, 4), torch.zeros(4))
    graph = gm.graph
    taps = list(graph.find_nodes(op="call_function", target=op))
    assert len(taps) == 3
    mm = next(n for n in graph.nodes if n.target is torch.ops.aten.mm.default)
    last_add = [n for n in graph.nodes if n.target is torch.ops.aten.add.Tensor][-1]

    def at(n: Any) -> int:
        return list(graph.nodes).index(n)

    before = {t: at(t) for t in taps}
    assert before[taps[0]] < at(mm)
    assert tap_lowering.late_taps(graph) == 1
    graph.lint()  # every node still after its arguments
    assert at(taps[0]) > at(mm)  # the activation's tap now follows its last reader
    assert at(taps[1]) < at(last_add) and at(taps[2]) < at(last_add)  # an input; a write
    stack = next(n for n in graph.nodes if n.target is torch.ops.aten.stack.default)
    assert at(taps[0]) < at(stack)
