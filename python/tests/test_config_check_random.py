"""The random rule end to end (issue 52, item 3): the migration tutorial's ConfigChecker flow in a
script that seeds torch only. Python's ``random`` and NumPy's global generator are never seeded
or used, so their states (drawn from OS entropy in each process) say nothing about the
environments: config-check passes. A script that draws from an unseeded NumPy generator on
both sides is an error, as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from conftest import REPO, probe_bin

# The tutorial's step 1 (ConfigChecker as its snippet writes it, `from probe` instead of
# `from msprobe.pytorch`); only torch is seeded. `numpy` as argv[2]: one unseeded NumPy draw
# per step (a augmentation that forgot its seed).
SCRIPT = """
import os
import sys

from probe import ConfigChecker

ConfigChecker.apply_patches(fmk="pytorch")

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.environ["EXAMPLES"])
from train_small import SmallNet, make_data

torch.manual_seed(0)
model = SmallNet()
ConfigChecker(model, output_zip_path=sys.argv[1], fmk="pytorch")
opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
for x, y in make_data(3, 4, torch.device("cpu")):
    if len(sys.argv) > 2 and sys.argv[2] == "numpy":
        x = x + float(np.random.rand()) * 0.0
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    opt.step()
"""


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four runs at once: two without NumPy, two drawing from unseeded NumPy."""
    d = tmp_path_factory.mktemp("random")
    (d / "train.py").write_text(SCRIPT)
    env = dict(os.environ)
    env["EXAMPLES"] = os.path.join(REPO, "examples")
    env["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + env.get("PYTHONPATH", "")
    procs = []
    for name, extra in (("a", []), ("b", []), ("na", ["numpy"]), ("nb", ["numpy"])):
        cmd = [sys.executable, "train.py", f"{name}.zip", *extra]
        procs.append(subprocess.Popen(cmd, cwd=d, env=env, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    return d


def _check(d: Path, a: str, b: str) -> tuple[int, Dict[str, Any]]:
    out = d / f"cc-{a}-{b}"
    proc = subprocess.run(
        [probe_bin(), "config-check", "-c", str(d / a), str(d / b), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc.returncode, json.loads((out / "config_check.json").read_text())


def _state(result: Dict[str, Any], g: str) -> Dict[str, Any]:
    (item,) = [i for i in result["items"] if i["item"] == f"state {g}"]
    return item


def test_unseeded_unused_generators_pass(packs: Path) -> None:
    code, result = _check(packs, "a.zip", "b.zip")
    verdicts = {c["name"]: c["verdict"] for c in result["categories"]}
    assert verdicts["random"] == "pass", result
    assert code == 0
    for g in ("python", "numpy"):
        state = _state(result, g)
        assert state["status"] == "pass"
        assert state["detail"] == "note: never seeded or used"
    # torch was seeded and drawn from: its state is compared (and equal).
    assert _state(result, "torch")["detail"] == ""


def test_draws_from_an_unseeded_numpy_are_an_error(packs: Path) -> None:
    code, result = _check(packs, "na.zip", "nb.zip")
    assert code == 1
    state = _state(result, "numpy")
    assert state["status"] == "error"
    assert "seeded on neither" in state["detail"]
    # Python's generator is still untouched.
    assert _state(result, "python")["status"] == "pass"
