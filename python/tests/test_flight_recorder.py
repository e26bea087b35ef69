"""Dump on trigger (``flight_recorder``, capture/flight.py): real training runs of a small
model in which a NaN, a loss spike, an exception or a signal ends up in a dump of the last
K steps only, which ``probe scan`` and ``probe compare`` read as any other dump."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import warnings
from collections.abc import Collection
from typing import Any, Optional

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import probe
from conftest import compare_summary, probe_bin, read_ops

STEPS = 300
NAN_AT = 200
#: Large enough for a smooth loss: the spike trigger's defaults never fire on its noise.
BATCH = 128


class Net(nn.Module):
    """A tiny regression model whose hidden activations are scaled by ``torch.log`` of the
    batch's last column: e (a scale of 1) in every batch but the poisoned ones, where it is
    negative and ``torch.log`` produces the run's first NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x[:, :8]))
        return self.fc2(h * torch.log(x[:, 8:]))  # type: ignore[no-any-return]


def batch(
    step: int, nan_from: Optional[int], spike_at: Optional[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s batch: the same in every run; the last column goes negative from
    ``nan_from`` on, the targets are 30 times larger at ``spike_at``."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, 8, generator=g)
    y = x[:, :2].sum(1, keepdim=True) + 0.1 * torch.randn(BATCH, 1, generator=g)
    poisoned = nan_from is not None and step >= nan_from
    scale = torch.full((BATCH, 1), -1.0 if poisoned else math.e)
    if step == spike_at:
        y = y * 30
    return torch.cat([x, scale], 1), y


def train(
    dbg: Optional[probe.Debugger],
    steps: int = STEPS,
    nan_from: Optional[int] = None,
    spike_at: Optional[int] = None,
    signal_at: Collection[int] = (),
    device: str = "cpu",
) -> Net:
    """Train ``steps`` steps under ``dbg`` (None: bare), the loss handed to ``dbg.step``;
    the test sends itself SIGUSR1 inside the steps of ``signal_at``."""
    torch.manual_seed(0)
    model = Net().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for s in range(steps):
        x, y = (t.to(device) for t in batch(s, nan_from, spike_at))
        if dbg is not None:
            dbg.start(model)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if s in signal_at:
            os.kill(os.getpid(), signal.SIGUSR1)
        if dbg is not None:
            dbg.stop()
            dbg.step(loss=loss)
    if dbg is not None:
        dbg.close()
    return model


def steps_in(dump: str) -> list[str]:
    return sorted(d for d in os.listdir(dump) if d.startswith("step"))


def trigger_events(dump: str) -> list[dict[str, Any]]:
    with open(os.path.join(dump, "trigger.json")) as fh:
        doc = json.load(fh)
    assert doc["format"] == "probe-trigger" and doc["version"] == 1
    try:
        import jsonschema
    except ImportError:
        pass
    else:
        schema = os.path.join(
            os.path.dirname(__file__), "../../schemas/probe-trigger.v1.schema.json"
        )
        with open(schema) as fh:
            jsonschema.validate(doc, json.load(fh))
    return doc["events"]  # type: ignore[no-any-return]


def from_train(folder: str) -> list[tuple[int, list[str]]]:
    """A folder's stacks, from the frame of ``train`` down."""
    out = []
    with open(os.path.join(folder, "stacks.jsonl")) as fh:
        for line in fh:
            stack = json.loads(line)
            frames = stack["frames"]
            first = next(i for i, f in enumerate(frames) if ", in train: " in f)
            out.append((stack["id"], frames[first:]))
    return out


def scan(dump: str, out: str) -> tuple[int, dict[str, Any]]:
    r = subprocess.run(
        [probe_bin(), "scan", dump, "-o", out, "-q"], capture_output=True, text=True, timeout=300
    )
    with open(os.path.join(out, "summary.json")) as fh:
        return r.returncode, json.load(fh)


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """300 steps, NaN from step 200 on, K = 2, every trigger on, then: continue."""
    probe_bin()  # skip before training when there is no binary
    dump = str(tmp_path_factory.mktemp("flight") / "dump")
    train(probe.Debugger(None, dump_path=dump, flight_recorder=2), nan_from=NAN_AT)
    return dump


def test_nan_dumps_the_last_two_steps_and_scan_names_the_producer(
    nan_run: str, tmp_path: Any
) -> None:
    """The dump holds step199 and step200 only (NaN persists after 200: the nonfinite
    trigger fires once and waits for a finite step); trigger.json says nonfinite at 200;
    scan names torch.log as the first producer at step 200."""
    assert steps_in(nan_run) == ["step199", "step200"]
    assert sorted(os.listdir(nan_run)) == ["manifest.json", "step199", "step200", "trigger.json"]
    (event,) = trigger_events(nan_run)
    assert (event["trigger"], event["step"], event["rank"]) == ("nonfinite", NAN_AT, 0)
    assert event["steps_written"] == [NAN_AT - 1, NAN_AT]
    assert "loss is nan" in event["reason"] and "Torch.log.0.forward" in event["reason"]
    code, summary = scan(nan_run, str(tmp_path / "scan"))
    assert code == 1, summary["headline"]
    first = summary["first_nonfinite"]["forward"]
    assert first["op"] == "Torch.log.0.forward", summary["headline"]
    assert first["step"] == f"step{NAN_AT}", first


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_held_steps_stay_on_the_device_and_the_nan_is_named(tmp_path: Any) -> None:
    """The same NaN run on a GPU (scripts/cuda_check.sh): steps 199 and 200 only, and scan
    names the producer."""
    dump = str(tmp_path / "dump")
    train(probe.Debugger(None, dump_path=dump, flight_recorder=2), nan_from=NAN_AT, device="cuda")
    assert steps_in(dump) == ["step199", "step200"]
    (event,) = trigger_events(dump)
    assert (event["trigger"], event["step"]) == ("nonfinite", NAN_AT)
    code, summary = scan(dump, str(tmp_path / "scan"))
    assert code == 1 and summary["first_nonfinite"]["forward"]["op"] == "Torch.log.0.forward"


def test_the_written_steps_are_those_of_a_normal_statistics_dump(
    nan_run: str, tmp_path: Any
) -> None:
    """A normal statistics capture of steps 199 and 200 writes the same op logs and stacks,
    byte for byte (the stacks differ only above ``train``, in its callers); ``probe compare``
    pairs them step for step, with no warning (trigger.json is not a step) and no
    difference."""
    normal = str(tmp_path / "normal")
    train(probe.Debugger(None, dump_path=normal, steps=[NAN_AT - 1, NAN_AT]), nan_from=NAN_AT)
    for step in ("step199", "step200"):
        a = os.path.join(normal, step, "rank0")
        b = os.path.join(nan_run, step, "rank0")
        with open(os.path.join(a, "ops.jsonl"), "rb") as fa:
            with open(os.path.join(b, "ops.jsonl"), "rb") as fb:
                assert fa.read() == fb.read(), step
        assert from_train(a) == from_train(b), step
    assert sorted(os.listdir(os.path.join(nan_run, "step200", "rank0"))) == sorted(
        os.listdir(os.path.join(normal, "step200", "rank0"))
    )
    code, summary = compare_summary(normal, nan_run, str(tmp_path / "cmp"))
    assert code == 0 and summary["verdict"] == "pass", summary["headline"]
    assert [p["step"] for p in summary["pairs"]] == ["step199", "step200"]
    assert summary["counts"]["unmatched_cmp"] == 0 and summary["warnings"] == []


def test_no_trigger_writes_nothing_and_training_is_bitwise_the_same(tmp_path: Any) -> None:
    """A clean run with every trigger on leaves no file at all, holds at most K steps, and
    trains to the same bits as a bare run."""
    dump = str(tmp_path / "dump")
    dbg = probe.Debugger(None, dump_path=dump, flight_recorder=3)
    flight = dbg._flight
    assert flight is not None
    with_recorder = train(dbg)
    bare = train(None)
    assert not os.path.exists(dump)
    for (name, a), (_, b) in zip(with_recorder.state_dict().items(), bare.state_dict().items()):
        assert torch.equal(a, b), name
    assert len(flight._ring) <= 3 and flight.held_bytes() > 0


def test_loss_spike(tmp_path: Any) -> None:
    """Targets 30 times larger at step 80: the loss spike trigger fires there, and not
    before (the window of 50 steps fills at step 50)."""
    dump = str(tmp_path / "dump")
    cfg = {"steps": 2, "triggers": ["loss_spike"]}
    train(probe.Debugger(None, dump_path=dump, flight_recorder=cfg), steps=90, spike_at=80)
    events = trigger_events(dump)
    assert (events[0]["trigger"], events[0]["step"]) == ("loss_spike", 80)
    assert "robust score" in events[0]["reason"]
    assert steps_in(dump)[:2] == ["step79", "step80"]


@pytest.mark.filterwarnings("ignore:probe. flight recorder. step.. got no loss")
def test_exception_inside_the_step_writes_and_propagates(tmp_path: Any) -> None:
    """An exception raised in the ``with`` block of step 5 writes steps 4 and 5 (5 as far
    as it ran) and reaches the user as it was raised."""
    dump = str(tmp_path / "dump")
    dbg = probe.Debugger(None, dump_path=dump, flight_recorder=2)
    model = Net()
    boom = ValueError("boom at step 5")
    with pytest.raises(ValueError) as info:
        for s in range(10):
            with dbg:
                x, y = batch(s, None, None)
                F.mse_loss(model(x), y).backward()
                if s == 5:
                    raise boom
    assert info.value is boom
    dbg.close()
    assert steps_in(dump) == ["step4", "step5"]
    (event,) = trigger_events(dump)
    assert (event["trigger"], event["step"]) == ("exception", 5)
    assert event["reason"] == "ValueError: boom at step 5"
    assert read_ops(os.path.join(dump, "step5", "rank0"))


def test_exception_between_start_and_stop_is_found_at_close(tmp_path: Any) -> None:
    dump = str(tmp_path / "dump")
    dbg = probe.Debugger(None, dump_path=dump, flight_recorder=2)
    model = Net()
    for s in range(3):
        dbg.start(model)
        loss = model(batch(s, None, None)[0]).sum()
        loss.backward()
        if s < 2:
            dbg.stop()
            dbg.step(loss=loss)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "got no loss" from close()
        dbg.close()  # step 2 never stopped: as when an exception ends the loop
    (event,) = trigger_events(dump)
    assert (event["trigger"], event["step"]) == ("exception", 2)
    assert steps_in(dump) == ["step1", "step2"]


def test_signal_continue_writes_each_trigger_its_own_steps(tmp_path: Any) -> None:
    """SIGUSR1 in steps 5, 6 and 12, K = 3: the first writes 3-5, the second only 6 (3-5
    are written already), the third 10-12; the previous handler is back after close()."""
    dump = str(tmp_path / "dump")
    before = signal.getsignal(signal.SIGUSR1)
    cfg = {"steps": 3, "triggers": ["signal"]}
    train(probe.Debugger(None, dump_path=dump, flight_recorder=cfg), steps=15, signal_at=(5, 6, 12))
    assert signal.getsignal(signal.SIGUSR1) == before
    events = trigger_events(dump)
    assert [(e["trigger"], e["step"], e["steps_written"]) for e in events] == [
        ("signal", 5, [3, 4, 5]),
        ("signal", 6, [6]),
        ("signal", 12, [10, 11, 12]),
    ]
    assert events[0]["reason"] == "SIGUSR1 received"
    assert steps_in(dump) == [f"step{s}" for s in (10, 11, 12, 3, 4, 5, 6)]


def test_then_stop_stops_capturing(tmp_path: Any) -> None:
    """then: stop after the NaN of step 20: steps 19-20 written, nothing captured after it
    (a signal at step 30 writes nothing: the handler before the recorder's has it back),
    training goes on to its end untouched."""
    dump = str(tmp_path / "dump")
    seen: list[int] = []

    def mine(signum: int, frame: Any) -> None:
        seen.append(signum)

    before = signal.signal(signal.SIGUSR1, mine)
    try:
        dbg = probe.Debugger(None, dump_path=dump, flight_recorder={"steps": 2, "then": "stop"})
        stopped = train(dbg, steps=40, nan_from=20, signal_at=(30,))
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert seen == [signal.SIGUSR1]  # the handler given back at the stop received it
    bare = train(None, steps=40, nan_from=20)
    assert steps_in(dump) == ["step19", "step20"]
    (event,) = trigger_events(dump)
    assert (event["trigger"], event["step"], event["then"]) == ("nonfinite", 20, "stop")
    assert dbg._flight is None and dbg.enabled  # closed, not failed
    for (name, a), (_, b) in zip(stopped.state_dict().items(), bare.state_dict().items()):
        assert torch.equal(a.isnan(), b.isnan()), name


def test_without_a_loss_the_loss_triggers_say_so_once(tmp_path: Any) -> None:
    dump = str(tmp_path / "dump")
    dbg = probe.Debugger(None, dump_path=dump, flight_recorder=2)
    model = Net()
    with pytest.warns(RuntimeWarning, match="step\\(\\) got no loss") as record:
        for s in range(3):
            with dbg:
                model(batch(s, None, None)[0]).sum().backward()
    dbg.close()
    assert sum("no loss" in str(w.message) for w in record) == 1
    assert not os.path.exists(dump)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "flight_recorder: 0 must be an integer >= 1"),
        (True, "flight_recorder: True must be an integer"),
        ({"triggers": ["nonfinite"]}, "'steps' .* is required"),
        ({"steps": 2, "triggers": ["nan"]}, "'nan' is not a trigger"),
        ({"steps": 2, "triggers": []}, "flight_recorder.triggers: empty"),
        ({"steps": 2, "then": "halt"}, "then: 'halt' is not one of continue, stop"),
        ({"steps": 2, "signal": "SIGNOPE"}, "'SIGNOPE' is not a signal"),
        ({"steps": 2, "loss_window": 1}, "loss_window: 1 must be an integer >= 3"),
        ({"steps": 2, "spike_threshold": 0}, "spike_threshold: 0 must be a positive number"),
        ({"steps": 2, "windows": 5}, "unknown key 'windows'"),
    ],
)
def test_bad_config_values_are_refused(value: Any, message: str) -> None:
    with pytest.raises(probe.ConfigError, match=message):
        probe.Debugger(None, dump_path="unused", flight_recorder=value)


def test_only_statistics_mode(tmp_path: Any) -> None:
    with pytest.raises(probe.ConfigError, match="needs mode 'statistics'"):
        probe.Debugger(None, dump_path=str(tmp_path), mode="tensor", flight_recorder=2)


def test_config_file_key(tmp_path: Any) -> None:
    """The key in probe's config file, and its schema."""
    jsonschema = pytest.importorskip("jsonschema")
    from conftest import SCHEMAS

    cfg = {"dump_path": str(tmp_path / "d"), "flight_recorder": {"steps": 4, "then": "stop"}}
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(cfg))
    dbg = probe.Debugger(str(path))
    assert dbg.config.flight_recorder is not None
    assert (dbg.config.flight_recorder.steps, dbg.config.flight_recorder.then) == (4, "stop")
    dbg.close()
    with open(os.path.join(SCHEMAS, "probe-capture-config.v1.schema.json")) as fh:
        schema = json.load(fh)
    jsonschema.validate(cfg, schema)
    jsonschema.validate({"flight_recorder": 2}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"flight_recorder": {"steps": 2, "then": "halt"}}, schema)
