"""The capture's cost known up front (issue 51): the forecast made after the first captured
step (manifest, log, ``Debugger.forecast``), ``dry_run`` and the budgets."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from typing import Any, Optional

import probe
import pytest
import torch
from conftest import REPO, SCHEMAS, load_example

BENCH = os.path.join(REPO, "bench", "forecast_bench.py")


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return load_example().SmallNet()  # type: ignore[no-any-return]


def _train(dbg: Optional[probe.Debugger], steps: int, model: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        x, y = torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)
        if dbg is not None:
            dbg.start(model)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if dbg is not None:
            dbg.stop()
            dbg.step()
    if dbg is not None:
        dbg.close()


def _manifest(dump: str) -> dict[str, Any]:
    with open(os.path.join(dump, "manifest.json"), encoding="utf-8") as fh:
        return json.load(fh)  # type: ignore[no-any-return]


def _folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def _records(dump: str, step: int) -> list[dict[str, Any]]:
    with open(os.path.join(dump, f"step{step}", "rank0", "ops.jsonl"), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def test_the_manifest_holds_a_sane_forecast_and_the_log_says_it(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    dump = str(tmp_path / "d")
    dbg = probe.Debugger(None, dump_path=dump, steps="1-3", level="mix")
    with caplog.at_level(logging.INFO, logger="probe"):
        _train(dbg, 4, _net())
    m = _manifest(dump)
    jsonschema = pytest.importorskip("jsonschema")
    with open(os.path.join(SCHEMAS, "probe-dump-manifest.v1.schema.json")) as fh:
        jsonschema.validate(m, json.load(fh))
    f = m["forecast"]
    assert f == dbg.forecast
    assert f["measured_on_step"] == 1 and f["rank"] == 0
    assert f["bare_from"] == "uncaptured_step"  # step 0 ran bare, from start() to stop()
    assert 0 < f["bare_step_s"] < 60 and 0 < f["time_per_step_s"] < 60
    assert f["overhead"] == pytest.approx(f["time_per_step_s"] / f["bare_step_s"], rel=0.01)
    assert f["bytes_per_step"] == _folder_bytes(os.path.join(dump, "step1", "rank0"))
    assert (f["steps"], f["ranks"]) == (3, 1)
    assert f["bytes_total"] == 3 * f["bytes_per_step"]
    # statistics mode holds no host copies: the records held until the flush, ~the op log
    assert f["host_memory_bytes"] >= os.path.getsize(
        os.path.join(dump, "step1", "rank0", "ops.jsonl")
    )
    lines = [r.getMessage() for r in caplog.records if "forecast" in r.getMessage()]
    assert len(lines) == 1 and "per captured step" in lines[0], lines
    # every step of a statistics run writes what the first did, to the op
    for s in (2, 3):
        got = _folder_bytes(os.path.join(dump, f"step{s}", "rank0"))
        assert abs(got - f["bytes_per_step"]) <= 0.02 * f["bytes_per_step"]


def test_open_ended_steps_give_per_step_figures_and_say_so(tmp_path: Any) -> None:
    dump = str(tmp_path / "d")
    dbg = probe.Debugger(None, dump_path=dump)
    _train(dbg, 2, _net())
    f = _manifest(dump)["forecast"]
    assert f["measured_on_step"] == 0 and f["steps"] is None and f["bytes_total"] is None
    assert "open-ended" in f["note"]
    assert f["bare_from"] == "agent_time"  # no step ran bare before the first captured one
    assert f["bare_step_s"] <= f["time_per_step_s"] and f["overhead"] >= 1


def test_tensor_mode_counts_its_host_copies(tmp_path: Any) -> None:
    dump = str(tmp_path / "d")
    dbg = probe.Debugger(None, dump_path=dump, steps=[0], mode="tensor", tensor_writer="thread")
    _train(dbg, 1, _net())
    f = _manifest(dump)["forecast"]
    shards = [n for n in os.listdir(os.path.join(dump, "step0", "rank0")) if "safetensors" in n]
    assert shards and f["bytes_per_step"] == _folder_bytes(os.path.join(dump, "step0", "rank0"))
    assert f["host_memory_bytes"] > 0


def test_dry_run_writes_nothing_and_leaves_training_bitwise_the_same(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    bare = _net()
    _train(None, 3, bare)
    dump = str(tmp_path / "d")
    dbg = probe.Debugger(None, dump_path=dump, mode="tensor", level="mix", dry_run=True)
    model = _net()
    with caplog.at_level(logging.INFO, logger="probe"):
        _train(dbg, 3, model)
    assert not os.path.exists(dump)
    f = dbg.forecast
    assert f is not None and f["measured_on_step"] == 0 and f["bytes_per_step"] > 0
    assert any("forecast" in r.getMessage() for r in caplog.records)
    for (n, a), (_, b) in zip(bare.state_dict().items(), model.state_dict().items()):
        assert torch.equal(a, b), n
    # the temporary folder the step was captured into is gone too
    assert dbg.config.dump_path != dump and not os.path.exists(dbg.config.dump_path)


def test_over_max_bytes_tensor_mode_degrades_to_statistics_and_says_so(tmp_path: Any) -> None:
    dump = str(tmp_path / "d")
    dbg = probe.Debugger(None, dump_path=dump, steps="0-2", mode="tensor", max_bytes=1000)
    with pytest.warns(RuntimeWarning, match=r"over budget \(max_bytes: .* statistics instead"):
        _train(dbg, 3, _net())
    m = _manifest(dump)
    jsonschema = pytest.importorskip("jsonschema")
    with open(os.path.join(SCHEMAS, "probe-dump-manifest.v1.schema.json")) as fh:
        jsonschema.validate(m, json.load(fh))
    with open(os.path.join(SCHEMAS, "probe-capture-config.v1.schema.json")) as fh:
        jsonschema.validate(m["config"], json.load(fh))
    assert m["budget"]["action"] == "statistics" and m["budget"]["from_step"] == 1
    assert m["budget"]["exceeded"][0].startswith("max_bytes")
    assert any("file" in t for r in _records(dump, 0) for t in r["tensors"])
    for s in (1, 2):
        assert not any("file" in t for r in _records(dump, s) for t in r["tensors"])
        assert not [n for n in os.listdir(os.path.join(dump, f"step{s}", "rank0")) if "safet" in n]


def test_on_budget_stop_captures_no_more_steps(tmp_path: Any) -> None:
    dump = str(tmp_path / "d")
    dbg = probe.Debugger(None, dump_path=dump, steps="0-2", max_bytes=1000, on_budget="stop")
    with pytest.warns(RuntimeWarning, match="no capture from step 1"):
        _train(dbg, 3, _net())
    assert sorted(n for n in os.listdir(dump) if n.startswith("step")) == ["step0"]
    assert _manifest(dump)["budget"]["action"] == "stop"


def test_within_budget_nothing_changes(tmp_path: Any) -> None:
    dump = str(tmp_path / "d")
    dbg = probe.Debugger(None, dump_path=dump, steps="0-1", mode="tensor", max_bytes=1 << 40)
    _train(dbg, 2, _net())
    assert "budget" not in _manifest(dump)
    assert any("file" in t for r in _records(dump, 1) for t in r["tensors"])


@pytest.mark.parametrize(
    ("cfg", "msg"),
    [
        ({"max_bytes": 10}, "needs a finite 'steps'"),
        ({"max_bytes": -1, "steps": [0]}, "max_bytes"),
        ({"max_overhead": 0.5}, "must be >= 1"),
        ({"on_budget": "fewer"}, "on_budget: 'fewer' is not one of"),
        ({"dry_run": "yes"}, "dry_run: 'yes' must be true or false"),
        ({"dry_run": True, "flight_recorder": 2}, "not with flight_recorder"),
    ],
)
def test_bad_options_are_one_line_errors(cfg: dict[str, Any], msg: str) -> None:
    with pytest.raises(probe.ConfigError, match=msg) as err:
        probe.Debugger(None, **cfg)
    assert "\n" not in str(err.value)


def test_a_run_past_the_page_cache_is_told_the_disk_will_bind_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from probe.capture import forecast as fc

    monkeypatch.setattr(fc, "dirty_limit", lambda: 1000)
    r = fc.Reading(2, 0, 1.0, 0.1, 0.5, 0.1, 200, 0)
    f = fc.forecast(r, fc.Selected(steps=10, ranks=2))
    assert f["bytes_total"] == 4000 and f["overhead"] == pytest.approx(1.8)
    assert "wait for the disk" in f["note"] and "wait for the disk" in fc.describe(f)
    assert "note" not in fc.forecast(r, fc.Selected(steps=4, ranks=2))
    open_ended = fc.forecast(r, fc.Selected(steps=None, ranks=1))
    assert open_ended["note"].startswith("steps is open-ended") and "disk" in open_ended["note"]


def test_one_time_setup_that_outweighs_the_step_gives_no_negative_time() -> None:
    """Setup measured on other threads (the writer's rewrites, fresh host buffers) can
    overlap the measured step and exceed it: with no bare step to bound the estimate, the
    whole step is taken, and the forecast says so (a 2-rank job read -0.32 s a step)."""
    from probe.capture import forecast as fc

    r = fc.Reading(0, 1, 0.2, 0.5, None, 0.05, 100, 0)
    f = fc.forecast(r, fc.Selected(steps=2, ranks=2))
    assert f["time_per_step_s"] == pytest.approx(0.2) and f["bare_step_s"] == pytest.approx(0.15)
    assert f["time_total_s"] == pytest.approx(0.4)
    assert "upper bound" in f["note"]
    ok = fc.forecast(fc.Reading(0, 1, 0.6, 0.5, None, 0.05, 100, 0), fc.Selected(2, 2))
    assert ok["time_per_step_s"] == pytest.approx(0.1) and "note" not in ok


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("forecast_bench", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("model", ["small", "transformer", "llama"])
def test_the_forecast_after_one_step_predicts_the_next_ten(tmp_path: Any, model: str) -> None:
    """The issue's goal, on the example, the 4-layer transformer and a transformers model.

    Bytes: within ±25 % (statistics steps repeat to the byte, but for numbers whose JSON
    length varies). Time: the ±25 % goal is checked by bench/forecast_bench.py on a quiet
    machine (docs/performance.md). On a shared 2-core CI box another process often takes
    the cores for seconds, and every step then costs what it leaves (a bare LLaMA step went
    from 5 ms to 0.8 s), so this test runs torch on one thread, takes the median of the
    ten steps, asks for 0.4-2.5x and tries up to three times: a forecast that forgot a
    whole part of the step (the flush, the one-time setup, the backward) is out of it every
    time, a neighbour's burst is not."""
    if model == "llama":
        pytest.importorskip("transformers")
    bench = _bench()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ratios = []
        for attempt in range(3):
            r = bench.measure(model, "statistics", "mix", 10, str(tmp_path / f"d{attempt}"))
            assert r["manifest_has_forecast"]
            assert 0.75 <= r["bytes_ratio"] <= 1.25, r
            ratios.append(r["time_ratio"])
            if 0.4 <= r["time_ratio"] <= 2.5:
                break
        else:
            pytest.fail(f"time forecast / measured out of 0.4-2.5 three times: {ratios}")
    finally:
        torch.set_num_threads(threads)
