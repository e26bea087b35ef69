"""probe.Monitor (docs/monitor.md): the Arrow IPC file, read back with pyarrow, against
numbers the tests compute themselves from copies of the model; training unchanged by it;
a killed run's file; two DDP ranks; bf16 autocast; module selection; a GradScaler's
skipped step; an internal failure."""

from __future__ import annotations

import io
import json
import math
import os
import signal
import subprocess
import sys
import warnings
from typing import Any, Optional

import numpy as np
import pytest
import warm
import torch
import torch.nn as nn
import torch.nn.functional as F

import probe
from conftest import REPO
from probe.monitor import arrow_ipc as ipc

pa = pytest.importorskip("pyarrow")

PYTHON = os.path.join(REPO, "python")

#: The devices the training-run tests run on: CUDA where there is a GPU
#: (scripts/cuda_check.sh runs them there; CI has none), and the CPU with the accelerator's
#: way of counting NaN/Inf (every tensor's finite elements on the device, subtracted on the
#: host), so that CI runs that path too.
DEVICES = [
    "cpu",
    "cpu-device-counts",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
    ),
]


def on(device: str, monkeypatch: Any) -> str:
    """The torch device of a ``DEVICES`` entry (switching the counting path for the CPU's
    second entry)."""
    if device == "cpu-device-counts":
        from probe.monitor import norms

        monkeypatch.setattr(norms, "counted_on_host", lambda t: False)
        return "cpu"
    return device


class Net(nn.Module):
    """Nested modules, a module returning a tuple, and a branch not taken on odd steps."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.block = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 16))
        self.side = nn.Linear(16, 16)
        self.head = nn.Linear(16, 4)
        self.use_side = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))
        h = h + self.block(h)
        if self.use_side:
            h = h + self.side(h)
        return self.head(h)


def read(path: str) -> tuple[Any, list[dict[str, Any]]]:
    reader = pa.ipc.open_stream(path)
    table = reader.read_all()
    return reader.schema, table.to_pylist()


def rows_of(rows: list[dict[str, Any]], step: int) -> dict[str, dict[str, Any]]:
    return {r["module"]: r for r in rows if r["step"] == step}


def l2(tensors: list[torch.Tensor]) -> float:
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in tensors))


# --- the Arrow writer ----------------------------------------------------------------------

COLS = [
    ipc.Column("step", ipc.INT32, False),
    ipc.Column("module", ipc.DICT_UTF8, False),
    ipc.Column("order", ipc.INT32),
    ipc.Column("loss", ipc.FLOAT64),
    ipc.Column("x", ipc.FLOAT32),
]


def small_stream(batches: int) -> tuple[bytes, list[int]]:
    """A stream of ``batches`` steps; the byte offsets where each batch message ends."""
    data = ipc.schema_message(COLS, {"probe.monitor": '{"k": "v"}'})
    data += ipc.dictionary_message(["", "a", "a.b"])
    ends = []
    for s in range(batches):
        data += ipc.record_batch_message(
            COLS,
            3,
            [
                np.full(3, s),
                np.arange(3),
                np.array([2, -1, 0]),
                np.array([0.5 + s, 0, 0]),
                np.array([1.0, np.nan, -np.inf]),
            ],
            [None, None, np.array([True, False, True]), np.array([True, False, False]), None],
        )
        ends.append(len(data))
    return data + ipc.END_OF_STREAM, ends


def test_arrow_stream_reads_back_with_pyarrow() -> None:
    data, _ = small_stream(2)
    reader = pa.ipc.open_stream(io.BytesIO(data))
    schema = reader.schema
    assert schema.field("step").type == pa.int32() and not schema.field("step").nullable
    assert schema.field("module").type == pa.dictionary(pa.int32(), pa.utf8())
    assert schema.field("order").type == pa.int32() and schema.field("order").nullable
    assert schema.field("loss").type == pa.float64()
    assert schema.field("x").type == pa.float32()
    assert schema.metadata == {b"probe.monitor": b'{"k": "v"}'}
    table = reader.read_all()
    table.validate(full=True)
    rows = table.to_pylist()
    assert [r["module"] for r in rows] == ["", "a", "a.b"] * 2
    assert [r["order"] for r in rows[:3]] == [2, None, 0]
    assert [r["loss"] for r in rows] == [0.5, None, None, 1.5, None, None]
    assert rows[0]["x"] == 1.0 and math.isnan(rows[1]["x"]) and rows[2]["x"] == -math.inf


def test_a_stream_cut_anywhere_keeps_the_batches_before_the_cut() -> None:
    data, ends = small_stream(3)
    for cut in range(ends[0] - 1, len(data) + 1, 3):
        got = 0
        try:
            reader = pa.ipc.open_stream(io.BytesIO(data[:cut]))
            while True:
                reader.read_next_batch()
                got += 1
        except StopIteration:
            pass
        except (pa.ArrowInvalid, OSError):
            pass
        assert got == sum(1 for e in ends if e <= cut), (cut, got)


# --- training runs -------------------------------------------------------------------------


def train(
    steps: int,
    monitor_dir: Optional[str],
    *,
    record: Optional[dict[str, Any]] = None,
    zero_early: bool = True,
    device: str = "cpu",
    **kwargs: Any,
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Adam on Net; ``record`` gets the test's own copies per step (grads, params before
    and after, outputs, the optimizer state)."""
    torch.manual_seed(0)
    model = Net().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    mon = probe.Monitor(monitor_dir, model, opt, **kwargs) if monitor_dir else None
    g = torch.Generator().manual_seed(1)
    outputs: dict[str, list[torch.Tensor]] = {}
    order: list[str] = []
    if record is not None:

        def keep(name: str) -> Any:
            def hook(m: nn.Module, a: Any, o: torch.Tensor) -> None:
                outputs.setdefault(name, []).append(o.detach().clone())
                order.append(name)

            return hook

        for name, mod in model.named_modules():
            mod.register_forward_hook(keep(name))
    losses = []
    for step in range(steps):
        model.use_side = step % 2 == 0
        outputs.clear()
        order.clear()
        x = torch.randn(5, 8, generator=g).to(device)
        loss = model(x).pow(2).mean()
        loss.backward()
        if record is not None:
            record[step] = {
                "grads": {
                    n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
                },
                "before": {n: p.detach().clone() for n, p in model.named_parameters()},
            }
        opt.step()
        if zero_early:
            opt.zero_grad()
        if mon is not None:
            mon.step(loss)
        if not zero_early:
            opt.zero_grad()
        if record is not None:
            record[step].update(
                after={n: p.detach().clone() for n, p in model.named_parameters()},
                outputs={k: list(v) for k, v in outputs.items()},
                order=list(dict.fromkeys(order)),
                state={
                    n: {k: v.clone() for k, v in opt.state[p].items()}
                    for n, p in model.named_parameters()
                },
                loss=float(loss.detach()),
            )
        losses.append(float(loss.detach()))
    if mon is not None:
        mon.close()
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def params_of(names: dict[str, Any], module: str) -> list[str]:
    return [n for n in names if module == "" or n.startswith(module + ".")]


def close(got: Optional[float], want: float) -> bool:
    return got is not None and math.isclose(got, want, rel_tol=2e-5, abs_tol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
def test_values_match_the_model_computed_by_hand(
    tmp_path: Any, device: str, monkeypatch: Any
) -> None:
    record: dict[int, Any] = {}
    train(3, str(tmp_path), record=record, device=on(device, monkeypatch))
    schema, rows = read(str(tmp_path / "rank0.arrows"))
    meta = json.loads(schema.metadata[b"probe.monitor"])
    assert meta == {
        "format": "probe.monitor",
        "version": 1,
        "rank": 0,
        "world_size": 1,
        "probe_version": probe.__version__,
        "modules": 2,
    }
    assert "state_exp_avg_norm" in schema.names and "state_exp_avg_sq_norm" in schema.names
    assert "state_step_norm" not in schema.names  # Adam's step counter is no per-element state
    modules = ["", "fc1", "block", "block.0", "block.1", "side", "head"]
    for step in range(3):
        r, got = record[step], rows_of(rows, step)
        assert [row["module"] for row in rows if row["step"] == step] == modules
        assert got[""]["loss"] == pytest.approx(r["loss"], rel=1e-12)
        assert got[""]["lr"] == 0.01 and got[""]["loss_scale"] is None
        assert all(got[m]["loss"] is None and got[m]["lr"] is None for m in modules[1:])
        called = [m for m in r["order"] if m in modules]
        for m in modules:
            row = got[m]
            names = params_of(r["before"], m)
            assert close(row["param_norm"], l2([r["after"][n] for n in names])), (step, m)
            with_grad = [r["grads"][n] for n in names if n in r["grads"]]
            if with_grad:
                assert close(row["grad_norm"], l2(with_grad)), (step, m)
                assert row["grad_nonfinite"] == 0.0
            else:  # a branch not taken has no gradient (zero_grad set them to None)
                assert m == "side" and row["grad_norm"] is None and row["grad_nonfinite"] is None
            assert close(row["update_norm"], l2([r["after"][n] - r["before"][n] for n in names])), (
                step,
                m,
            )
            for key in ("exp_avg", "exp_avg_sq"):
                assert close(row[f"state_{key}_norm"], l2([r["state"][n][key] for n in names])), (
                    step,
                    m,
                    key,
                )
            if m in called:
                assert row["order"] == called.index(m)
                assert close(row["output_norm"], l2(r["outputs"][m])), (step, m)
                assert row["output_nonfinite"] == 0.0
            else:
                assert m == "side" and step % 2 == 1
                assert row["order"] is None and row["output_norm"] is None
                assert row["output_nonfinite"] is None
        assert got[""]["order"] == len(called) - 1  # the root returns last


@pytest.mark.parametrize("device", DEVICES)
def test_training_is_bitwise_the_same_with_the_monitor(
    tmp_path: Any, device: str, monkeypatch: Any
) -> None:
    device = on(device, monkeypatch)
    losses, params = train(4, None, device=device)
    losses_m, params_m = train(4, str(tmp_path), zero_early=False, device=device)
    assert losses == losses_m
    assert all(torch.equal(params[n], params_m[n]) for n in params)
    # and the hooks are gone after close(): nothing of the monitor stays on the model
    torch.manual_seed(0)
    model = Net()
    mon = probe.Monitor(str(tmp_path / "again"), model, torch.optim.SGD(model.parameters(), lr=0.1))
    mon.close()
    assert all(not m._forward_hooks for m in model.modules())


def test_depth_and_module_selection(tmp_path: Any) -> None:
    for kwargs, want in (
        ({"depth": 0}, [""]),
        ({"depth": 1}, ["", "fc1", "block", "side", "head"]),
        ({"modules": ["block.1", "head"]}, ["", "block.1", "head"]),
    ):
        d = tmp_path / str(len(want))
        train(1, str(d), **kwargs)
        schema, rows = read(str(d / "rank0.arrows"))
        assert [r["module"] for r in rows] == want
        meta = json.loads(schema.metadata[b"probe.monitor"])
        assert meta["modules"] == kwargs.get("depth", kwargs.get("modules"))
    with pytest.raises(ValueError, match="nope"):
        probe.Monitor(str(tmp_path / "bad"), Net(), modules=["nope"])


def test_bf16_autocast_on_cpu(tmp_path: Any) -> None:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    outs: list[torch.Tensor] = []
    model.head.register_forward_hook(lambda m, a, o: outs.append(o.detach().clone()) and None)
    with probe.Monitor(str(tmp_path), model, opt) as mon:
        for _ in range(2):
            outs.clear()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(torch.randn(4, 8))
            loss = out.float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss)
    schema, rows = read(str(tmp_path / "rank0.arrows"))
    assert "state_momentum_buffer_norm" in schema.names
    last = rows_of(rows, 1)
    assert outs[0].dtype == torch.bfloat16
    assert close(last["head"]["output_norm"], l2(outs))
    assert all(math.isfinite(r["grad_norm"]) for r in last.values())


@pytest.mark.parametrize("device", DEVICES)
def test_a_skipped_scaler_step_has_no_update_and_counts_the_nonfinite_gradients(
    tmp_path: Any, device: str, monkeypatch: Any
) -> None:
    device = on(device, monkeypatch)
    torch.manual_seed(0)
    model = Net().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(device, init_scale=1024.0)
    bad: dict[str, float] = {}  # step 1's NaN/Inf counts, by the test

    def count(ts: list[torch.Tensor]) -> float:
        return float(sum(int((~torch.isfinite(t)).sum()) for t in ts))

    with probe.Monitor(str(tmp_path), model, opt, scaler=scaler, depth=1) as mon:
        for step in range(3):
            x = torch.randn(4, 8).to(device)
            if step == 1:
                x[0, 0] = math.inf
            out = model(x)
            loss = out.pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            if step == 1:
                bad = {
                    "out": count([out]),
                    "root": count([p.grad for p in model.parameters()]),
                    "fc1": count([p.grad for p in model.fc1.parameters()]),
                }
            mon.step(loss)  # zero_grad after: a skipped step's gradients are read here
            opt.zero_grad()
    _, rows = read(str(tmp_path / "rank0.arrows"))
    ok, skipped = rows_of(rows, 0), rows_of(rows, 1)
    assert ok[""]["update_norm"] > 0 and ok[""]["loss_scale"] == 1024.0
    assert skipped[""]["update_norm"] is None and skipped[""]["loss_scale"] == 512.0
    assert bad["root"] > 0 and bad["fc1"] > 0 and bad["out"] > 0
    assert (
        skipped[""]["grad_nonfinite"] == bad["root"]
        and skipped["fc1"]["grad_nonfinite"] == bad["fc1"]
    )
    assert skipped[""]["output_nonfinite"] == bad["out"]
    assert ok[""]["grad_nonfinite"] == 0 and ok[""]["output_nonfinite"] == 0
    assert rows_of(rows, 2)[""]["update_norm"] > 0


def test_an_internal_failure_warns_once_and_switches_the_monitor_off(
    tmp_path: Any, monkeypatch: Any
) -> None:
    from probe.monitor import monitor as mod

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = probe.Monitor(str(tmp_path), model, opt)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(4):
            if step == 2:
                monkeypatch.setattr(mod, "floating_tensors", lambda v: 1 / 0)
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            mon.step()
        mon.close()
    assert len([w for w in caught if "probe.Monitor" in str(w.message)]) == 1
    assert all(not m._forward_hooks for m in model.modules())
    _, rows = read(str(tmp_path / "rank0.arrows"))
    assert sorted({r["step"] for r in rows}) == [0, 1]


KILLED = """
import os, signal, sys, torch
sys.path.insert(0, {tests!r})
import probe
from test_monitor import Net
torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
mon = probe.Monitor({out!r}, model, opt, depth=1)
for step in range(100):
    if step == 5:
        os.kill(os.getpid(), signal.SIGKILL)  # mid-step: after the forward, before step()
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    mon.step()
"""


def test_a_killed_run_keeps_every_completed_step(tmp_path: Any) -> None:
    code = KILLED.format(tests=os.path.dirname(__file__), out=str(tmp_path))
    env = dict(os.environ, PYTHONPATH=PYTHON, OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60)
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    path = str(tmp_path / "rank0.arrows")
    _, rows = read(path)
    assert sorted({r["step"] for r in rows}) == [0, 1, 2, 3, 4]
    # a cut in the middle of the last step: the four before it are read, batch by batch
    data = open(path, "rb").read()
    reader = pa.ipc.open_stream(io.BytesIO(data[: len(data) - 40]))
    got = []
    with pytest.raises((pa.ArrowInvalid, OSError)):
        while True:
            got.append(reader.read_next_batch())
    assert len(got) == 4


def test_two_ddp_ranks_write_a_file_each(tmp_path: Any) -> None:
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    env = dict(os.environ, PYTHONPATH=PYTHON, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [os.path.join(REPO, "examples", "train_ddp.py"), "--no-dump", "--quiet", "--steps", "3"]
    cmd += ["--monitor-dir", str(tmp_path)]  # torchrun's argparse claims --monitor
    res = warm.run(cmd[1:], env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    files = {}
    for rank in (0, 1):
        schema, rows = read(str(tmp_path / f"rank{rank}.arrows"))
        meta = json.loads(schema.metadata[b"probe.monitor"])
        assert (meta["rank"], meta["world_size"]) == (rank, 2)
        files[rank] = rows
        assert sorted({r["step"] for r in rows}) == [0, 1, 2]
        assert rows[0]["module"] == "" and "block.qkv" in {r["module"] for r in rows}
    for a, b in zip(files[0], files[1]):
        assert a["module"] == b["module"]
        # DDP averages the gradients: every rank sees the same gradients and parameters
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-6)
        assert a["param_norm"] == pytest.approx(b["param_norm"], rel=1e-6)
    assert files[0][0]["loss"] != files[1][0]["loss"]  # each rank its own slice of the batch


def test_nonfinite_counts_batch_small_tensors_and_count_each_exactly(monkeypatch: Any) -> None:
    """The accelerator's counting (norms.nonfinite_counts) on the CPU: tensors of several
    dtypes, sizes across the chunk bounds, empty ones, NaN/Inf anywhere, against a count
    taken tensor by tensor."""
    from probe.monitor import norms

    g = torch.Generator().manual_seed(3)
    sizes = [0, 1, 7, 4096, 5000, 70_000, 300_000]
    tensors = []
    for i, n in enumerate(sizes * 3):
        t = torch.randn(n, generator=g).to([torch.float32, torch.bfloat16, torch.float16][i % 3])
        bad = torch.rand(n, generator=g) < 0.01
        t[bad] = [math.nan, math.inf, -math.inf][i % 3]
        tensors.append(t.reshape(-1, 1) if n % 7 == 0 else t)
    want = [float(t.numel() - int(torch.isfinite(t).sum())) for t in tensors]
    assert sum(w > 0 for w in want) >= 10
    for chunk in (norms.CHUNK, 10_000, 1):
        monkeypatch.setattr(norms, "CHUNK", chunk)
        assert norms.nonfinite_counts(tensors).tolist() == want, chunk
    monkeypatch.setattr(norms, "SMALL", 0)  # every tensor counted apart
    assert norms.nonfinite_counts(tensors).tolist() == want
