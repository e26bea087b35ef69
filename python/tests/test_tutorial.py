"""The migration tutorial's workflow, literally (issue #12): its snippets with only the import
line changed, on the example model, both sides (one with an injected fault), then
`probe config-check` and `probe compare` on what they wrote (docs/tutorial.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import probe
from probe.config import api_name, load_config, strip_line_comments
from conftest import REPO, Tiny, probe_bin, read_ops

EXAMPLES = os.path.join(REPO, "examples")
FAULT = "Functional.relu"  # every call perturbed by 5 % on the "npu" side

# The tutorial's training script: step 1 (ConfigChecker) and step 2 (ApiProfiler) as its
# snippets write them; only `from msprobe.pytorch import ...` became `from probe import ...`.
SCRIPT = '''
import os
import sys

from probe import ApiProfiler, ConfigChecker, seed_all

ConfigChecker.apply_patches(fmk="pytorch")

import torch
import torch.nn.functional as F

sys.path.insert(0, os.environ["EXAMPLES"])
from train_small import Fault, SmallNet, make_data

seed_all(0)
my_model = SmallNet()
ConfigChecker(my_model, output_zip_path=sys.argv[1], fmk="pytorch")
opt = torch.optim.Adam(my_model.parameters(), lr=1e-3, foreach=False)
data = make_data(3, 16, torch.device("cpu"))
if len(sys.argv) > 2:
    Fault(sys.argv[2], 0.05)  # the "npu" side's kernel bug

profiler = ApiProfiler()
profiler.start()
for x, y in data:
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(my_model(x), y)
    loss.backward()
    opt.step()
profiler.stop()
profiler.save()
'''

# The tutorial's dump configuration, commented as the tutorial writes it.
CONFIG = """{
  // dump_iter: iterations 0 and 2 of 3 (0-based, like msprobe's step)
  "dump": {
    "common_dump_settings": {"dump_mode": "api", "dump_path": "%s", "dump_iter": "0|2"},
    "api_list": [
      {"name": "torch.nn.functional.conv2d", "api_type": "forward"},
      {"name": "torch.nn.functional.relu", "api_type": "forward"},
      {"name": "my_model.block.fc1", "api_type": "forward"}  // a module path from print(model)
    ]
  }
}
"""

SELECTED = {
    "Functional.conv2d.0.forward",
    "Functional.relu.0.forward",
    "Functional.conv2d.1.forward",
    "Functional.relu.1.forward",
    "Functional.linear.2.forward",  # the call inside block.fc1
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both sides of the tutorial, run at once in their own processes (cwd-relative paths,
    as the tutorial has them)."""
    d = tmp_path_factory.mktemp("tutorial")
    (d / "train.py").write_text(SCRIPT)
    procs = []
    for side, extra in (("gpu", []), ("npu", [FAULT])):
        (d / f"{side}_config.json").write_text(CONFIG % f"./{side}_dump")
        env = dict(os.environ)
        env["MSPROBE_PATH"] = f"./{side}_config.json"
        env["EXAMPLES"] = EXAMPLES
        env["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, "train.py", f"./{side}_config_pack.zip", *extra]
        procs.append(subprocess.Popen(cmd, cwd=d, env=env, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    return d


def _steps(dump: Path) -> list[str]:
    return sorted(p.name for p in dump.iterdir() if p.is_dir())


def test_dump_iter_and_api_list_select(runs: Path) -> None:
    for side in ("gpu", "npu"):
        dump = runs / f"{side}_dump"
        assert _steps(dump) == ["step0", "step2"]
        for step in ("step0", "step2"):
            ops = read_ops(str(dump / step / "rank0"))
            assert {op["op"] for op in ops} == SELECTED
            linear = [op for op in ops if op["op"].startswith("Functional.linear")]
            assert [op["module"] for op in linear] == ["block.fc1"]


def test_config_packs_are_written_and_checked(runs: Path) -> None:
    gpu, npu = runs / "gpu_config_pack.zip", runs / "npu_config_pack.zip"
    assert gpu.is_file() and npu.is_file()
    out = runs / "config_diff_result"
    # The tutorial's command line, as pasted: -c with both packs.
    proc = subprocess.run(
        [probe_bin(), "config-check", "-c", str(gpu), str(npu), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    # Same seeds, data and weights: only the config path and argv differ (warnings).
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((out / "config_check.json").read_text())
    verdicts = {c["name"]: c["verdict"] for c in result["categories"]}
    assert verdicts["weights"] == verdicts["dataset"] == verdicts["random"] == "pass"
    # The tutorial's pass_check column, per category.
    passed = {c["name"]: c["pass_check"] for c in result["categories"]}
    assert passed["weights"] is True and passed["random"] is True
    # The optimizer was found by its first step: its hyperparameters are in the pack.
    assert "optimizer" in _pack_entry(gpu, "hyperparameters")


def _pack_entry(pack: Path, name: str) -> Any:
    import zipfile

    with zipfile.ZipFile(pack) as z:
        return json.loads(z.read(f"{name}.json"))


def test_compare_names_the_injected_op(runs: Path) -> None:
    out = runs / "precision_compare_result"
    # The tutorial's command line: -l api.
    proc = subprocess.run(
        [
            probe_bin(),
            "compare",
            "-b",
            str(runs / "gpu_dump"),
            "-c",
            str(runs / "npu_dump"),
            "-l",
            "api",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    first = summary["first_divergent"]["forward"]
    assert (first["op"], first["step"]) == (f"{FAULT}.0.forward", "step0"), first
    # The per-API table of the workbook's summary sheet links the culprit to its tensors.
    import zipfile

    with zipfile.ZipFile(out / "compare.xlsx") as z:
        sheet = z.read("xl/worksheets/sheet1.xml").decode()
    assert f'display="{FAULT}.0.forward"' in sheet and "location=\"'tensors'!A" in sheet


def test_auto_counting_matches_explicit_steps(runs: Path, tmp_path: Path) -> None:
    """The example's explicit start/stop/step() loop, on the same config, dumps the same
    step folders and ops as the tutorial's start-once profiler."""
    sys.path.insert(0, EXAMPLES)
    try:
        import train_small
    finally:
        sys.path.remove(EXAMPLES)
    cfg = tmp_path / "config.json"
    cfg.write_text(CONFIG % (tmp_path / "dump").as_posix())
    assert train_small.main(["--config", str(cfg), "--steps", "3", "--quiet"]) == 0
    auto, explicit = runs / "gpu_dump", tmp_path / "dump"
    assert _steps(explicit) == _steps(auto) == ["step0", "step2"]
    for step in _steps(auto):
        a = read_ops(str(auto / step / "rank0"))
        e = read_ops(str(explicit / step / "rank0"))
        assert [op["op"] for op in e] == [op["op"] for op in a]
        assert [[t["name"] for t in op["tensors"]] for op in e] == [
            [t["name"] for t in op["tensors"]] for op in a
        ]


# ---------------------------------------------------------------- in-process details


def test_tutorial_shape_translates() -> None:
    c = load_config(
        {
            "dump": {
                "common_dump_settings": {"dump_mode": "module", "dump_path": "d", "dump_iter": "10|20"},
                "api_list": [{"name": "layer1.0.conv1", "api_type": "backward"}],
            }
        },
        {},
    )
    assert (c.level, c.dump_path, c.steps) == ("module", "d", frozenset({10, 20}))
    (e,) = c.api_list
    assert (e.module, e.api, e.forward, e.backward) == ("layer1.0.conv1", None, False, True)
    assert api_name("torch.nn.functional.conv2d") == "Functional.conv2d"
    assert api_name("torch.matmul") == "Torch.matmul"
    assert api_name("torch.Tensor.add") == "Tensor.add"
    assert api_name("Functional.gelu") == "Functional.gelu"
    assert api_name("torch._VF.lstm") == "VF.lstm" and api_name("VF.gru") == "VF.gru"
    assert api_name("my_model.layer1.0.conv1") is None
    # probe's own keys sit beside the tutorial's: how the tutorial shape asks for tensor mode.
    c = load_config({"dump": {"common_dump_settings": {"mode": "tensor"}}}, {})
    assert c.mode == "tensor" and c.api_list == ()


@pytest.mark.parametrize(
    "cfg, key",
    [
        ({"dump": {"common_dump_settings": {"dump_level": "api"}}}, "dump_level"),
        ({"dump": {"common_dump_settings": {"level": "api"}}}, "level"),
        ({"dump": {"api_lists": []}}, "api_lists"),
        ({"dump": {}, "task": "x"}, "task"),
        ({"dump": {"api_list": [{"name": "torch.relu", "type": "forward"}]}}, "type"),
        ({"dump": {"api_list": [{"name": "torch.relu", "api_type": "both"}]}}, "both"),
    ],
)
def test_unknown_keys_are_named(cfg: dict[str, Any], key: str) -> None:
    with pytest.raises(probe.ConfigError, match=key):
        load_config(cfg, {})


def test_line_comments(tmp_path: Path) -> None:
    text = '{"dump_path": "a//b", // a comment\n "level": "api" // "level": "module"\n}'
    assert json.loads(strip_line_comments(text)) == {"dump_path": "a//b", "level": "api"}
    path = tmp_path / "c.json"
    path.write_text("/* block comments are not JSON */ {}")
    with pytest.raises(probe.ConfigError, match="not valid JSON"):
        probe.Debugger(str(path))


def test_fmk_and_missing_config(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(probe.ConfigError, match="'mindspore'"):
        probe.ConfigChecker.apply_patches(fmk="mindspore")
    with pytest.raises(probe.ConfigError, match="'mindspore'"):
        probe.ConfigChecker(None, output_zip_path="x.zip", fmk="mindspore")
    monkeypatch.delenv("MSPROBE_PATH", raising=False)
    with pytest.raises(probe.ConfigError, match="MSPROBE_PATH"):
        probe.ApiProfiler()


def _loop(profiler: Any, iterations: int = 3, optimizer: bool = True, explicit: int = 0) -> None:
    """Train Tiny under ``profiler``; ``explicit``: optimizer steps per iteration, each
    iteration ended by ``profiler.step()`` (0: no explicit calls)."""
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    profiler.start()
    for _ in range(iterations):
        x = torch.randn(4, 8)
        if optimizer:
            opt.zero_grad()
            F.cross_entropy(model(x), torch.tensor([0, 1, 2, 3])).backward()
            opt.step()
            if explicit:
                for _ in range(explicit - 1):
                    opt.step()
                profiler.step()
        else:
            with torch.no_grad():
                model(x)
    profiler.stop()
    profiler.save()


def _profiler(dump: str, api_list: list[dict[str, str]], **settings: Any) -> probe.ApiProfiler:
    common = {"dump_path": dump, **settings}
    return probe.ApiProfiler({"dump": {"common_dump_settings": common, "api_list": api_list}})


def test_backward_only_entry(dump: str) -> None:
    _loop(_profiler(dump, [{"name": "torch.nn.functional.gelu", "api_type": "backward"}]))
    assert _steps(Path(dump)) == ["step0", "step1", "step2"]
    ops = read_ops(os.path.join(dump, "step1", "rank0"))
    assert [op["op"] for op in ops] == ["Functional.gelu.0.backward"]


def test_module_path_at_module_level(dump: str) -> None:
    # "model." is the variable name: no module has that path, so it is stripped.
    _loop(_profiler(dump, [{"name": "model.block", "api_type": "forward"}], dump_mode="module", dump_iter="1"))
    ops = read_ops(os.path.join(dump, "step1", "rank0"))
    assert [op["op"] for op in ops] == [  # written as each call ends: inner ones first
        "Module.block.0.LayerNorm.forward.0",
        "Module.block.1.Linear.forward.0",
        "Module.block.Sequential.forward.0",
    ]


def test_forward_fallback_and_explicit_precedence(tmp_path: Path) -> None:
    # No optimizer: each forward of the model is an iteration.
    _loop(_profiler(str(tmp_path / "a"), [{"name": "torch.nn.functional.gelu"}]), optimizer=False)
    assert _steps(tmp_path / "a") == ["step0", "step1", "step2"]
    # profiler.step() at the end of each iteration, as msprobe users write debugger.step():
    # the same folders as automatic counting (the first call confirms the boundary the
    # optimizer step just made), and from then on optimizer steps no longer count.
    _loop(_profiler(str(tmp_path / "b"), [{"name": "torch.nn.functional.gelu"}]), explicit=1)
    assert _steps(tmp_path / "b") == ["step0", "step1", "step2"]
    # Two optimizer steps per iteration: iteration 0's second step was counted before the
    # first explicit call (step1: its optimizer ops only, not selected); from then on one
    # folder per iteration (step2, step3).
    _loop(_profiler(str(tmp_path / "c"), [{"name": "torch.nn.functional.gelu"}]), explicit=2)
    assert _steps(tmp_path / "c") == ["step0", "step2", "step3"]


def test_entries_that_select_nothing_are_reported(dump: str) -> None:
    prof = _profiler(dump, [{"name": "torch.nn.functional.gelux"}, {"name": "model.blok"}])
    # The API at start(); the module path when the model is known (its first forward).
    with pytest.warns(RuntimeWarning) as caught:
        _loop(prof, iterations=1)
    text = " ".join(str(w.message) for w in caught)
    assert "torch.nn.functional.gelux" in text and "model.blok (no such module" in text


def test_config_schema_covers_the_tutorial_shape() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    from conftest import SCHEMAS

    schema = json.loads(Path(SCHEMAS, "probe-capture-config.v1.schema.json").read_text())
    jsonschema.validate(json.loads(strip_line_comments(CONFIG % "./d")), schema)
    jsonschema.validate({"level": "module", "api_list": [{"name": "block.fc1"}]}, schema)
    for bad in (
        {"dump": {"common_dump_settings": {"dump_level": "api"}}},
        {"dump": {"common_dump_settings": {"dump_iter": "1,2"}}},
        {"api_list": [{"name": "torch.relu", "api_type": "both"}]},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
