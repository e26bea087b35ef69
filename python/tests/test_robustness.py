"""The agent must never break training, and must leave readable partial dumps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from typing import Any

import pytest
import torch

import probe
import probe.capture.recorder as pd
from conftest import REPO, read_ops, train


def test_survives_exception_inside_hook(
    dump: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bare = train(None, steps=3)
    calls = {"n": 0}
    real = pd.stat_vector

    def flaky(t: torch.Tensor) -> Any:
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("boom inside a hook")
        return real(t)

    monkeypatch.setattr(pd, "stat_vector", flaky)
    dbg = probe.Debugger(None, dump_path=dump, level="mix")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = train(dbg, steps=3)
    assert got == bare
    assert not dbg.enabled
    assert sum("capture disabled" in str(x.message) for x in w) == 1
    assert sum("boom inside a hook" in r.getMessage() for r in caplog.records) == 1
    # Wrappers are gone: torch is back to its original functions.
    assert not hasattr(torch.nn.functional.gelu, "__probe_wrapped__")
    assert not hasattr(torch.Tensor.__add__, "__probe_wrapped__")
    # What was written before the failure is still readable.
    read_ops(os.path.join(dump, "step0", "rank0"))


def test_survives_exception_in_backward_hook(dump: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bare = train(None, steps=2)
    real = pd.Recorder.finish

    def bad_finish(self: Any, op: Any) -> None:
        if op.direction == "backward":
            raise OSError(28, "No space left on device")
        real(self, op)

    monkeypatch.setattr(pd.Recorder, "finish", bad_finish)
    dbg = probe.Debugger(None, dump_path=dump)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert train(dbg, steps=2) == bare
    assert not dbg.enabled


def test_unwritable_dump_path(tmp_path: Any) -> None:
    blocker = tmp_path / "somefile"
    blocker.write_text("a regular file, so nothing can be created under it")
    bare = train(None, steps=2)
    dbg = probe.Debugger(None, dump_path=str(blocker / "dump"), mode="tensor")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert train(dbg, steps=2) == bare
    assert not dbg.enabled
    assert any("capture disabled" in str(x.message) for x in w)


def test_unusable_dump_path_is_one_line_naming_it(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "somefile"
    blocker.write_text("a regular file, so nothing can be created under it")
    path = str(blocker / "dump")
    dbg = probe.Debugger(None, dump_path=path)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        train(dbg, steps=1)
    msgs = [str(x.message) for x in w if "probe:" in str(x.message)]
    assert len(msgs) == 1, msgs
    assert "\n" not in msgs[0] and "cannot write the dump at" in msgs[0], msgs
    assert str(blocker) in msgs[0] and "internal error" not in msgs[0], msgs
    probe_logs = [r for r in caplog.records if r.name == "probe"]
    assert len(probe_logs) == 1 and probe_logs[0].exc_info is None  # no traceback
    assert "internal error" not in probe_logs[0].getMessage()


@pytest.mark.parametrize("given", ["L2", "L3", "kernel"])
def test_unknown_level_is_a_config_error_naming_it(given: str, tmp_path: Any) -> None:
    with pytest.raises(probe.ConfigError, match=repr(given)):
        probe.Debugger(None, dump_path=str(tmp_path), level=given)


def test_msprobe_level_l2_is_a_config_error(tmp_path: Any) -> None:
    cfg = {"task": "statistics", "level": "L2", "dump_path": str(tmp_path)}
    with pytest.raises(probe.ConfigError, match="'L2'"):
        probe.Debugger(cfg)


def test_bad_data_reports_the_value_given(tmp_path: Any) -> None:
    with pytest.raises(probe.ConfigError) as e:
        probe.Debugger(None, dump_path=str(tmp_path), data=["in"])
    assert "['in']" in str(e.value) and "ins" not in str(e.value).replace("inputs", "")


def test_truncated_ops_jsonl_still_parses(dump: str) -> None:
    train(probe.Debugger(None, dump_path=dump))
    path = os.path.join(dump, "step0", "rank0", "ops.jsonl")
    full = open(path, "rb").read()
    n = full.count(b"\n")
    with open(path, "wb") as fh:
        fh.write(full[: len(full) - 57])  # cut inside the last record, as a crash would
    ops = read_ops(os.path.dirname(path))
    assert len(ops) == n - 1
    assert [o["seq"] for o in ops] == list(range(n - 1))


def test_crash_without_stop_leaves_flushed_log(tmp_path: Any) -> None:
    script = tmp_path / "crash.py"
    script.write_text(
        "import os, torch, probe\n"
        f"dbg = probe.Debugger(None, dump_path={str(tmp_path / 'dump')!r})\n"
        "dbg.start()\n"
        "torch.relu(torch.randn(3)); torch.exp(torch.randn(3))\n"
        "raise SystemExit(3)\n"
    )
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3
    ops = read_ops(str(tmp_path / "dump" / "step0" / "rank0"))
    assert [o["op"] for o in ops] == ["Torch.relu.0.forward", "Torch.exp.0.forward"]


def test_hooks_removed_outside_selected_steps(dump: str) -> None:
    dbg = probe.Debugger(None, dump_path=dump, steps=[1])
    dbg.start()
    assert not hasattr(torch.Tensor.__add__, "__probe_wrapped__")  # step 0: nothing installed
    dbg.stop()
    dbg.step()
    dbg.start()
    assert hasattr(torch.Tensor.__add__, "__probe_wrapped__")
    dbg.stop()
    assert not hasattr(torch.Tensor.__add__, "__probe_wrapped__")  # no later step selected
    dbg.close()


class _FlagData(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Samples that carry whether the agent captured in the worker that made them."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        from probe.capture.patcher import DISPATCH
        from probe.capture.threadstate import tls

        x = torch.arange(4.0) + i
        x = (x - x.mean()) / x.std()  # hooked calls, in the worker
        return x, torch.tensor([float(tls.active), float(DISPATCH.current is not None)])


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="needs os.register_at_fork")
def test_dataloader_workers_forked_while_capturing_capture_nothing(tmp_path: Any) -> None:
    """Workers forked in a captured step (each epoch's, when capture stays on from step to
    step) inherited the running capture and captured their dataset's calls into a copy of
    the agent: time lost, and records that could only have gone into the parent's files."""
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork start method")
    loader = torch.utils.data.DataLoader(
        _FlagData(), batch_size=4, num_workers=2, multiprocessing_context="fork"
    )
    model = torch.nn.Linear(4, 2)
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level="api")
    dbg.start(model)
    flags = []
    for x, flag in loader:  # forked here, while capturing
        model(x).sum().backward()
        flags.append(flag)
        dbg.stop()
        dbg.step()
        dbg.start(model)
    dbg.stop()
    dbg.close()
    assert dbg.enabled
    assert torch.cat(flags).sum().item() == 0.0, "a worker captured"
    keys = [o["op"] for o in read_ops(os.path.join(tmp_path, "step0", "rank0"))]
    assert "Functional.linear.0.forward" in keys
    assert not any(k.startswith(("Tensor.mean", "Tensor.std")) for k in keys), keys


@pytest.mark.parametrize("level", ["api", "mix"])
def test_the_debugger_does_not_keep_the_model_alive(tmp_path: Any, level: str) -> None:
    """The model is the user's: a Debugger that outlives it must not hold it. It did, to
    the end of the process, and a DDP model's reducer then outlived
    ``destroy_process_group()``: gloo aborted the finished job at exit now and then."""
    import gc
    import weakref

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    dbg = probe.Debugger(None, dump_path=str(tmp_path), level=level, model=model)
    for _ in range(2):
        dbg.start(model)
        model(torch.randn(3, 4)).sum().backward()
        dbg.stop()
        dbg.step()
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None
    assert dbg.model is None and dbg.enabled
    dbg.start()  # nothing to hook at module level now, and no failure
    torch.relu(torch.ones(2))
    dbg.stop()
    dbg.step()
    dbg.close()
    assert dbg.enabled
    assert [o["op"] for o in read_ops(os.path.join(tmp_path, "step2", "rank0"))] == (
        ["Torch.relu.0.forward"]
    )
