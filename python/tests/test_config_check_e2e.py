"""config-check end to end: packs written by real runs of the example on CPU, compared by the
Rust `probe config-check`; each change fails exactly the categories it should."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

import pytest

from conftest import REPO, probe_bin



def _run(pack: Path, *extra: str, env: Dict[str, str] | None = None) -> None:
    cmd = [sys.executable, os.path.join(REPO, "examples", "train_small.py"), "--no-dump", "--quiet"]
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + full_env.get("PYTHONPATH", "")
    subprocess.run(cmd + ["--config-pack", str(pack), *extra], check=True, env=full_env, timeout=300)


def _failing(tmp: Path, a: Path, b: Path) -> tuple[int, Set[str]]:
    out = tmp / f"cc-{b.stem}"
    proc = subprocess.run(
        [probe_bin(), "config-check", str(a), str(b), "-o", str(out)], capture_output=True, text=True
    )
    assert proc.returncode in (0, 1), proc.stderr
    result = json.loads((out / "config_check.json").read_text())
    assert result["exit_code"] == proc.returncode
    cats: List[dict] = result["categories"]
    return proc.returncode, {c["name"] for c in cats if c["verdict"] == "error"}


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("packs")
    env = {"CUDA_LAUNCH_BLOCKING": "0"}
    _run(d / "base.zip", env=env)
    _run(d / "rerun.zip", env=env)
    _run(d / "env.zip", env={"CUDA_LAUNCH_BLOCKING": "1"})
    _run(d / "seed.zip", "--seed", "1", env=env)
    _run(d / "data.zip", "--data-seed", "7", env=env)
    return d


def test_rerun_passes(packs: Path, tmp_path: Path) -> None:
    code, failing = _failing(tmp_path, packs / "base.zip", packs / "rerun.zip")
    assert (code, failing) == (0, set())


def test_env_change_fails_env_only(packs: Path, tmp_path: Path) -> None:
    assert _failing(tmp_path, packs / "base.zip", packs / "env.zip") == (1, {"env"})


def test_seed_change_fails_random_and_weights(packs: Path, tmp_path: Path) -> None:
    # seed_all also sets PYTHONHASHSEED (env), and --seed is a hyperparameter.
    code, failing = _failing(tmp_path, packs / "base.zip", packs / "seed.zip")
    assert (code, failing) == (1, {"random", "weights", "env", "hyperparameters"})


def test_data_order_change_fails_dataset(packs: Path, tmp_path: Path) -> None:
    code, failing = _failing(tmp_path, packs / "base.zip", packs / "data.zip")
    assert (code, failing) == (1, {"dataset", "hyperparameters"})
