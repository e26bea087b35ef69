"""probe.Monitor on real training runs, and the probe command on what it writes
(docs/monitor.md): values against norms computed here by hand, training untouched, a killed
run's file, the first step where two runs part (a kernel fault, a learning-rate schedule and
a data order, each from step N), the recapture that dumps the faulty op, and a NaN at step
200 of 300 found by scan."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import warm
import torch
import torch.nn as nn
import torch.nn.functional as F

import probe
from conftest import probe_bin

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyarrow.parquet")
ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def num_threads(n: int) -> Iterator[None]:
    """torch's thread count set for a run and put back after: a later test file on this
    worker must not inherit it (another count rounds differently; test_crash's in-process
    runs would then differ from its subprocesses)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        # A faulty kernel: from the step it is switched on, the activation's output is 2 %
        # off (the same ops either way; the factor is the multiply's argument).
        self.gain = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)) * self.gain)


class Net(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.layers = nn.ModuleList([Block(width) for _ in range(2)])
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def train(
    steps: int,
    monitor: Optional[Path] = None,
    *,
    fault_from: Optional[int] = None,
    lr_from: Optional[int] = None,
    data_from: Optional[int] = None,
    nan_at: Optional[int] = None,
    threads: int = 1,
    dump: Optional[tuple[str, Path]] = None,
) -> list[float]:
    """Trains Net for `steps` AdamW steps on `threads` threads; the faults switch on at
    their step."""
    with num_threads(threads):
        return _train(steps, monitor, fault_from, lr_from, data_from, nan_at, dump)


def _train(
    steps: int,
    monitor: Optional[Path],
    fault_from: Optional[int],
    lr_from: Optional[int],
    data_from: Optional[int],
    nan_at: Optional[int],
    dump: Optional[tuple[str, Path]],
) -> list[float]:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    mon = probe.Monitor(monitor, model, opt, depth=2) if monitor else None
    dbg = probe.Debugger(dump[0], dump_path=str(dump[1])) if dump else None
    data = torch.Generator().manual_seed(1)
    other = torch.Generator().manual_seed(2)
    losses = []
    for s in range(steps):
        if fault_from is not None and s == fault_from:
            model.layers[1].gain = 1.02
        if lr_from is not None and s >= lr_from:
            for g in opt.param_groups:
                g["lr"] = 3e-3 * (1 + 0.05 * (s - lr_from + 1))
        gen = other if data_from is not None and s >= data_from else data
        x = torch.randn(16, 8, generator=gen)
        if nan_at is not None and s >= nan_at:
            x[0, 0] = float("nan")
        y = torch.randint(0, 4, (16,), generator=gen)
        if dbg:
            dbg.start(model)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if dbg:
            dbg.stop()
            dbg.step()
        if mon:
            mon.step(loss)
        losses.append(loss.item())
    if mon:
        mon.close()
    if dbg:
        dbg.close()
    return losses


def run_probe(*args: Any) -> tuple[int, dict[str, Any], str]:
    out = Path(args[args.index("-o") + 1])
    p = subprocess.run([probe_bin(), *map(str, args)], capture_output=True, text=True)
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    return p.returncode, summary, p.stdout + p.stderr


def read(path: Path) -> Any:
    return pa.ipc.open_stream(str(path / "rank0.arrows")).read_all().to_pylist()


def test_the_file_holds_the_norms_computed_by_hand(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mon = probe.Monitor(tmp_path, model, opt, depth=2)
    expected = []
    for _ in range(3):
        x = torch.randn(16, 8)
        out = model(x)
        loss = out.pow(2).mean()
        loss.backward()
        grad = torch.sqrt(sum(p.grad.double().pow(2).sum() for p in model.parameters()))
        up_grad = torch.sqrt(sum(p.grad.double().pow(2).sum() for p in model.layers[1].parameters()))
        before = [p.detach().clone() for p in model.parameters()]
        opt.step()
        upd = torch.sqrt(sum((p.detach() - b).double().pow(2).sum() for p, b in zip(model.parameters(), before)))
        param = torch.sqrt(sum(p.detach().double().pow(2).sum() for p in model.layers[1].parameters()))
        exp_avg = torch.sqrt(sum(opt.state[p]["exp_avg"].double().pow(2).sum() for p in model.head.parameters()))
        expected.append((loss.item(), grad.item(), up_grad.item(), upd.item(), param.item(), exp_avg.item(), out.double().norm().item()))
        opt.zero_grad()
        mon.step(loss)
    mon.close()
    table = pa.ipc.open_stream(str(tmp_path / "rank0.arrows")).read_all()
    meta = json.loads(table.schema.metadata[b"probe.monitor"])
    assert meta["format"] == "probe.monitor" and meta["version"] == 1 and meta["rank"] == 0
    rows = table.to_pylist()
    modules = ["", "embed", "layers", "head", "layers.0", "layers.1"]
    assert sorted({r["module"] for r in rows}) == sorted(modules)
    by = {(r["step"], r["module"]): r for r in rows}
    for s, (loss, grad, g1, upd, p1, ea, onorm) in enumerate(expected):
        root = by[(s, "")]
        assert root["loss"] == pytest.approx(loss, rel=1e-12)
        assert root["lr"] == pytest.approx(1e-2)
        assert root["grad_norm"] == pytest.approx(grad, rel=1e-5)
        assert root["update_norm"] == pytest.approx(upd, rel=1e-4)
        assert root["output_norm"] == pytest.approx(onorm, rel=1e-5)
        assert root["loss_scale"] is None
        assert by[(s, "layers.1")]["grad_norm"] == pytest.approx(g1, rel=1e-5)
        assert by[(s, "layers.1")]["param_norm"] == pytest.approx(p1, rel=1e-5)
        assert by[(s, "head")]["state_exp_avg_norm"] == pytest.approx(ea, rel=1e-5)
        # The data flow: embed, the blocks, head, then the model; a ModuleList is never called.
        order = {m: by[(s, m)]["order"] for m in modules}
        assert order["layers"] is None and by[(s, "layers")]["output_norm"] is None
        assert order["embed"] < order["layers.0"] < order["layers.1"] < order["head"] < order[""]


def test_training_is_bitwise_the_same_with_the_monitor(tmp_path: Path) -> None:
    bare = train(20)
    watched = train(20, tmp_path / "m")
    assert bare == watched


def test_a_killed_run_keeps_every_completed_step(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys, torch
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_monitor import Net
        import probe, torch.nn.functional as F
        torch.manual_seed(0)
        m = Net(); opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        mon = probe.Monitor({str(tmp_path / 'mon')!r}, m, opt)
        for s in range(30):
            loss = F.cross_entropy(m(torch.randn(4, 8)), torch.randint(0, 4, (4,)))
            loss.backward(); opt.step(); opt.zero_grad(); mon.step(loss)
            if s == 11:
                os.kill(os.getpid(), signal.SIGKILL)
    """))
    p = subprocess.run([sys.executable, str(script)], env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    assert p.returncode == -signal.SIGKILL
    steps = {r["step"] for r in pa.ipc.open_stream(str(tmp_path / "mon/rank0.arrows")).read_all().to_pylist()}
    assert steps == set(range(12))
    code, s, out = run_probe("scan", tmp_path / "mon", "-o", tmp_path / "scan")
    assert code == 0, out
    assert s["steps"] == 12


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bench")
    train(120, d / "mon")
    return d


@pytest.mark.parametrize(
    "fault,step,modules",
    [
        # The faulty module, or its direct consumer (a norm can miss a change its consumer shows).
        ({"fault_from": 70}, 70, {"layers.1", "head"}),
        ({"data_from": 55}, 55, {"embed"}),
        ({"lr_from": 80}, 80, {""}),
    ],
)
def test_the_first_step_where_runs_part_is_named(
    bench: Path, tmp_path: Path, fault: dict[str, int], step: int, modules: set[str]
) -> None:
    train(120, tmp_path / "mon", threads=2, **fault)
    code, s, out = run_probe("compare", "-b", bench / "mon", "-c", tmp_path / "mon", "-o", tmp_path / "out")
    assert code == 1, out
    p = s["parting"]
    assert p["step"] == step, s["headline"]
    assert p["series"]["module"] in modules, s["headline"]
    jsonschema = pytest.importorskip("jsonschema")
    schemas = ROOT / "schemas"
    jsonschema.validate(s, json.loads((schemas / "probe-monitor-summary.v1.schema.json").read_text()))
    recapture = json.loads((tmp_path / "out/recapture.json").read_text())
    jsonschema.validate(recapture, json.loads((schemas / "probe-capture-config.v1.schema.json").read_text()))
    assert recapture["steps"] == [step - 1, step]


def train_transformer(steps: int, monitor: Path, threads: int) -> None:
    """A 4-layer transformer encoder (its attention's reductions round differently on
    another thread count, unlike Net's small matmuls)."""
    with num_threads(threads):
        _train_transformer(steps, monitor)


def _train_transformer(steps: int, monitor: Path) -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, 4, enable_nested_tensor=False), nn.Linear(64, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(1)
    with probe.Monitor(monitor, model, opt, depth=3) as mon:
        for _ in range(steps):
            x = torch.randn(8, 16, 64, generator=data)
            y = torch.randint(0, 10, (8, 16), generator=data)
            loss = F.cross_entropy(model(x).reshape(-1, 10), y.reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss)


def test_clean_reruns_on_another_thread_count_part_nowhere(tmp_path: Path) -> None:
    train_transformer(300, tmp_path / "one", threads=1)
    train_transformer(300, tmp_path / "two", threads=2)
    code, s, out = run_probe("compare", "-b", tmp_path / "one", "-c", tmp_path / "two", "-o", tmp_path / "out")
    assert code == 0, out
    assert s["parting"] is None
    assert s["steps"] == 300
    # The reruns do differ (in their last bits): the verdict is no accident of equal files.
    table = pa.parquet.read_table(tmp_path / "out/monitor.parquet").to_pydict()
    assert max(table["worst_ratio"]) > 0, "the two runs are bitwise equal"


def test_the_recapture_config_dumps_the_step_where_compare_names_the_faulty_op(bench: Path, tmp_path: Path) -> None:
    train(120, tmp_path / "mon", threads=2, fault_from=70)
    code, s, out = run_probe("compare", "-b", bench / "mon", "-c", tmp_path / "mon", "-o", tmp_path / "out")
    assert code == 1, out
    config = str(tmp_path / "out/recapture.json")
    train(72, dump=(config, tmp_path / "dump_b"))
    train(72, threads=2, fault_from=70, dump=(config, tmp_path / "dump_c"))
    assert sorted(p for p in os.listdir(tmp_path / "dump_c") if p.startswith("step")) == ["step69", "step70"]
    code, s, out = run_probe("compare", "-b", tmp_path / "dump_b", "-c", tmp_path / "dump_c", "-o", tmp_path / "cmp")
    assert code == 1, out
    first = s["first_divergent"]["forward"]
    assert first["step"] in ("step70", 70), first
    assert "mul" in first["op"], first
    assert "layers.1" in json.dumps(first), first


def test_scan_names_the_step_and_module_where_nan_first_appears(tmp_path: Path) -> None:
    train(300, tmp_path / "mon", nan_at=200)
    code, s, out = run_probe("scan", tmp_path / "mon", "-o", tmp_path / "scan")
    assert code == 1, out
    e = s["events"][0]
    assert (e["kind"], e["step"], e["module"]) == ("nonfinite", 200, "embed"), s["headline"]


def torchrun_monitor(out: Path, *extra: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [str(ROOT / "examples/train_ddp.py"), "--no-dump", "--quiet", "--steps", "30"]
    cmd += ["--monitor-dir", str(out), *extra]
    res = warm.run(cmd[1:], env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


def test_a_fault_on_one_rank_of_a_ddp_job_is_named_at_its_step_and_rank(tmp_path: Path) -> None:
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    torchrun_monitor(tmp_path / "bench")
    torchrun_monitor(
        tmp_path / "cmp", "--inject", "Functional.gelu", "--inject-rank", "1", "--inject-from-step", "20"
    )
    code, s, out = run_probe("compare", "-b", tmp_path / "bench", "-c", tmp_path / "cmp", "-o", tmp_path / "out")
    assert code == 1, out
    p = s["parting"]
    assert s["ranks"] == [0, 1]
    # Rank 1's own forward parts first; rank 0 only sees it through the averaged gradients.
    assert (p["step"], p["series"]["rank"]) == (20, 1), s["headline"]
    assert p["series"]["metric"] in ("output_norm", "output_nonfinite"), s["headline"]
    recapture = json.loads((tmp_path / "out/recapture.json").read_text())
    assert recapture["ranks"] == [1] and recapture["steps"] == [19, 20]


def train_small(out: Path, *extra: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    cmd = [sys.executable, str(ROOT / "examples/train_small.py"), "--steps", "80", "--no-dump"]
    res = warm.run([*cmd[1:], "--quiet", "--monitor", str(out), *extra], env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


def test_a_bfloat16_port_drifts_without_parting_and_a_fault_in_it_is_named(tmp_path: Path) -> None:
    """float32 benchmark, bfloat16 autocast port: the port's drift grows step by step past
    what the first steps show, and the envelope follows it; a gelu 5 % off from step 50 in
    the port jumps past it there."""
    train_small(tmp_path / "fp32")
    train_small(tmp_path / "bf16", "--dtype", "bfloat16")
    train_small(tmp_path / "bf16_fault", "--dtype", "bfloat16", "--inject", "Functional.gelu", "--inject-from-step", "50")
    code, s, out = run_probe("compare", "-b", tmp_path / "fp32", "-c", tmp_path / "bf16", "-o", tmp_path / "clean")
    assert code == 0, out
    assert s["parting"] is None
    code, s, out = run_probe("compare", "-b", tmp_path / "fp32", "-c", tmp_path / "bf16_fault", "-o", tmp_path / "fault")
    assert code == 1, out
    assert s["parting"]["step"] == 50, s["headline"]
    assert s["parting"]["series"]["module"].startswith("block."), s["headline"]
