"""Tests of probe.ConfigPack: contents, schema, and never failing the training run."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any, Dict

import numpy as np
import pytest
import torch
import torch.nn as nn

import probe
from probe import config_pack
from conftest import probe_bin

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "schemas" / "probe-config-pack.v2.schema.json"
SCHEMA_V1 = ROOT / "schemas" / "probe-config-pack.v1.schema.json"


def load(path: str) -> Dict[str, Any]:
    with zipfile.ZipFile(path) as z:
        return {n[: -len(".json")]: json.loads(z.read(n)) for n in z.namelist()}


def train(tmp_path: Path, steps: int = 2, **kw: Any) -> probe.ConfigPack:
    pack = probe.ConfigPack(str(tmp_path / "pack.zip"), steps=steps, **kw)
    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.1), nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # torch.amp.GradScaler came with torch 2.3; before it, the CUDA one (disabled: no GPU).
    if hasattr(torch.amp, "GradScaler"):
        scaler = torch.amp.GradScaler("cpu", enabled=False)
    else:
        scaler = torch.cuda.amp.GradScaler(enabled=False)
    pack.capture(model=model, optimizer=opt, args={"lr": 0.1}, scaler=scaler)
    for _ in range(steps + 1):
        x = torch.randn(5, 4)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return pack


def test_capture_writes_every_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_SECRET_TOKEN", "hunter2")
    monkeypatch.setenv("PLAIN_VAR", "x")
    pack = train(tmp_path)
    assert pack.saved == str(tmp_path / "pack.zip")
    assert pack.errors == []
    docs = load(pack.saved)
    assert docs["manifest"]["format"] == "probe-config-pack"
    assert docs["manifest"]["version"] == 2
    assert docs["manifest"]["world_size"] == 1
    assert docs["manifest"]["steps"] == 2
    env = docs["env"]
    assert env["vars"]["PLAIN_VAR"] == "x"
    assert env["vars"]["MY_SECRET_TOKEN"] == config_pack.redact("hunter2")
    assert "MY_SECRET_TOKEN" in env["redacted"]
    with zipfile.ZipFile(pack.saved) as z:
        assert b"hunter2" not in z.read("env.json")
    assert docs["packages"]["distributions"]["torch"]
    assert docs["packages"]["accelerator"]["torch"] == torch.__version__
    assert "torch.backends.cudnn.deterministic" in docs["determinism"]["flags"]
    seeds = [(s["function"], s["value"]) for s in docs["random"]["seed_calls"]]
    assert seeds == [("random.seed", 3), ("numpy.random.seed", 4), ("torch.manual_seed", 5)]
    assert all("test_config_pack.py" in s["site"] for s in docs["random"]["seed_calls"])
    draws = docs["random"]["draws"]
    # torch.randn in the two captured steps; the third step is not captured.
    assert sum(d["count"] for d in draws["torch.randn"]) == 2
    assert "test_config_pack.py" in draws["torch.randn"][0]["site"]
    assert sum(d["count"] for d in draws["torch.nn.functional.dropout"]) == 2
    assert set(docs["random"]["state_hashes"]) >= {"python", "numpy", "torch"}
    gens = docs["random"]["generators"]
    assert set(gens) == set(docs["random"]["state_hashes"])
    # Seeded all three; python and numpy never drawn from after their seed, torch (init,
    # randn, dropout) was.
    assert gens["python"] == {"seeded": True, "drawn": False}
    assert gens["numpy"] == {"seeded": True, "drawn": False}
    assert gens["torch"] == {"seeded": True, "drawn": True}
    recs = docs["dataset"]["records"]
    assert [(r["step"], r["name"]) for r in recs] == [(0, "args.0"), (1, "args.0")]
    assert recs[0]["fingerprint"]["shape"] == [5, 4]
    assert len(recs[0]["fingerprint"]["sha256"]) == 64
    names = [r["name"] for r in docs["weights"]["records"]]
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias"]
    hp = docs["hyperparameters"]
    assert hp["args"] == {"lr": 0.1}
    assert hp["optimizer"]["class"] == "torch.optim.sgd.SGD"
    assert hp["optimizer"]["param_groups"][0]["lr"] == 0.1
    assert hp["optimizer"]["param_groups"][0]["momentum"] == 0.9
    assert "params" not in hp["optimizer"]["param_groups"][0]
    assert hp["scaler"]["enabled"] is False


def test_autocast_flags_on_every_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Autocast's state is recorded the same way by torch >= 2.4 (one function taking the
    device) and by older torch (one function per device), so that packs of two versions
    compare."""
    from probe.config_pack.determinism import collect_determinism

    def flags() -> Dict[str, Any]:
        got = collect_determinism()["flags"]
        return {k: v for k, v in got.items() if k.startswith("autocast.")}

    want = {
        "autocast.cpu.enabled": True,
        "autocast.cpu.dtype": "bfloat16",
        "autocast.cuda.enabled": False,
        "autocast.cuda.dtype": "float16",
    }
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert flags() == want
        if hasattr(torch, "get_autocast_dtype"):
            # As torch 2.1-2.3 has it, answering from this torch's state.
            enabled, dtype = torch.is_autocast_enabled, torch.get_autocast_dtype
            with monkeypatch.context() as m:
                m.delattr(torch, "get_autocast_dtype")
                m.setattr(torch, "is_autocast_enabled", lambda: enabled("cuda"))
                m.setattr(torch, "is_autocast_cpu_enabled", lambda: enabled("cpu"), raising=False)
                m.setattr(torch, "get_autocast_cpu_dtype", lambda: dtype("cpu"), raising=False)
                m.setattr(torch, "get_autocast_gpu_dtype", lambda: dtype("cuda"), raising=False)
                assert flags() == want


def test_pack_matches_schema(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    pack = train(tmp_path)
    schema = json.loads(SCHEMA.read_text())
    jsonschema.validate(load(pack.saved), schema)
    # The packs of testdata/ are version 1, which probe still reads.
    schema_v1 = json.loads(SCHEMA_V1.read_text())
    for name in ("base.zip", "seed.zip"):
        jsonschema.validate(load(str(ROOT / "testdata" / "config_check" / name)), schema_v1)


def test_generators_never_seeded_or_used(tmp_path: Path) -> None:
    """Python's and NumPy's generators the script never seeds nor draws from are recorded as
    such; a draw from one of them after the pack began is seen, with or without a seed."""
    pack = probe.ConfigPack(str(tmp_path / "p.zip"), steps=0)
    torch.manual_seed(1)
    np.random.rand(2)
    pack.capture()
    gens = load(str(pack.saved))["random"]["generators"]
    assert gens["python"] == {"seeded": False, "drawn": False}
    assert gens["numpy"] == {"seeded": False, "drawn": True}
    assert gens["torch"] == {"seeded": True, "drawn": False}


def test_fingerprint_is_exact_and_dtype_safe() -> None:
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    fa = config_pack.tensor_fingerprint(a)
    assert fa["sha256"] == config_pack.hashlib.sha256(a.numpy().tobytes()).hexdigest()
    assert fa["max"] == 5.0 and fa["min"] == 0.0 and fa["mean"] == 2.5
    assert config_pack.tensor_fingerprint(a.t())["sha256"] != fa["sha256"]
    for t in (
        a.to(torch.bfloat16),
        torch.tensor(3.0),
        torch.zeros(0),
        torch.ones(2, dtype=torch.bool),
    ):
        fp = config_pack.tensor_fingerprint(t)
        assert len(fp["sha256"]) == 64
    assert config_pack.tensor_fingerprint(torch.tensor([float("nan")]))["max"] == "nan"


def test_wrappers_are_removed_after_save(tmp_path: Path) -> None:
    orig_seed, orig_randn = torch.manual_seed, torch.randn
    pack = train(tmp_path)
    assert pack.saved
    assert torch.manual_seed is orig_seed
    assert torch.randn is orig_randn
    assert random.seed.__name__ == "seed" and not hasattr(random.seed, "_probe_wrapper")


class Broken(nn.Module):
    def named_parameters(self, *a: Any, **k: Any) -> Any:  # type: ignore[override]
        raise RuntimeError("boom")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_never_fails_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pack = probe.ConfigPack(str(tmp_path / "p.zip"), steps=1)
    model = Broken()
    pack.capture(model=model, optimizer=object(), args=object())  # must not raise
    model(torch.ones(1))
    pack.step()
    assert pack.errors and "boom" in pack.errors[0]
    assert pack.saved == str(tmp_path / "p.zip")
    assert load(pack.saved)["dataset"]["records"][0]["name"] == "args.0"
    assert "config pack" in capsys.readouterr().err
    # An unwritable target: save reports, returns None, raises nothing.
    bad = probe.ConfigPack(str(tmp_path / "file" / "x.zip"), steps=0)
    (tmp_path / "file").write_text("not a dir")
    assert bad.save() is None
    assert bad.errors
    assert not hasattr(torch.manual_seed, "_probe_wrapper")


def test_rust_reads_python_pack(tmp_path: Path) -> None:
    exe = probe_bin()
    a = train(tmp_path / "a").saved
    b = train(tmp_path / "b").saved
    assert a and b
    r = subprocess.run(
        [exe, "config-check", a, b, "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={**os.environ},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((tmp_path / "out" / "config_check.json").read_text())
    assert report["verdict"] == "pass"
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "schemas" / "probe-config-check.v1.schema.json").read_text())
    jsonschema.validate(report, schema)


PLANTED_ENV = {
    "DATABASE_URL": ("postgres://u:PlantedPw1@h/db", "PlantedPw1"),
    "PIP_INDEX_URL": ("https://user:PlantedTok2@pypi.example/simple", "PlantedTok2"),
    "REDIS_URL": ("redis://:PlantedRedis3@redis:6379/0", "PlantedRedis3"),
    "MLFLOW_TRACKING_URI": ("https://ml:PlantedMl4@mlflow.example", "PlantedMl4"),
    "GITHUB_PAT": ("github_pat_11PLANTED0fakeFAKEfake0123456789", "PLANTED0fake"),
    "SLACK_WEBHOOK": ("https://hooks.slack.com/services/T0/B0/PlantedHook5", "PlantedHook5"),
    "ALERTS": ("https://hooks.slack.com/services/T1/B1/PlantedHook6", "PlantedHook6"),
    "SOME_NOTE": ("ghp_PLANTEDfake0123456789FAKEfake01234567", "PLANTEDfake01"),
    "HF_TOKEN": ("PlantedHf7", "PlantedHf7"),
}
PLANTED_ARGV = ["--token", "PlantedArgv8", "--password=PlantedArgv9", "db.password=PlantedArgv10"]
PLANTED_ARGS = {
    "lr": 0.1,
    "hf_token": "PlantedArgs11",
    "db": {"password": "PlantedArgs12", "host": "db.example"},
    "url": "postgres://u:PlantedArgs13@h/db",
}
PLANTED_EXTRA = {"api_key": "PlantedExtra14", "note": "xoxb-123456789012-PlantedExtra15xyz"}


@pytest.mark.parametrize("mode", ["hash", "drop"])
def test_planted_secrets_never_reach_the_pack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    for name, (value, _) in PLANTED_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("sys.argv", ["train.py", *PLANTED_ARGV, "--lr", "0.1"])
    pack = probe.ConfigPack(str(tmp_path / "p.zip"), steps=0, redact=mode)
    pack.capture(args=PLANTED_ARGS, extra=PLANTED_EXTRA)
    assert pack.saved and pack.errors == []
    secrets = (
        [s for _, s in PLANTED_ENV.values()]
        + [f"PlantedArgv{i}" for i in (8, 9, 10)]
        + [f"PlantedArgs{i}" for i in (11, 12, 13)]
        + ["PlantedExtra14", "PlantedExtra15"]
    )
    with zipfile.ZipFile(pack.saved) as z:
        for entry in z.namelist():
            data = z.read(entry).decode()
            for s in secrets:
                assert s not in data, f"{s} in {entry}"
            if mode == "drop":
                assert "<redacted:sha256:" not in data
    docs = load(pack.saved)
    env, hp = docs["env"], docs["hyperparameters"]
    assert set(env["redacted"]) == set(PLANTED_ENV)
    marker = config_pack.redact("PlantedHf7", mode)
    assert env["vars"]["HF_TOKEN"] == marker
    assert (
        env["vars"]["DATABASE_URL"]
        == "postgres://u:" + config_pack.redact("PlantedPw1", mode) + "@h/db"
    )
    assert hp["argv"][:3] == ["train.py", "--token", config_pack.redact("PlantedArgv8", mode)]
    assert hp["argv"][-2:] == ["--lr", "0.1"]
    assert hp["args"]["lr"] == 0.1 and hp["args"]["db"]["host"] == "db.example"
    assert hp["args"]["hf_token"] == config_pack.redact("PlantedArgs11", mode)


def test_bad_redact_mode_falls_back_to_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "PlantedHf7")
    pack = probe.ConfigPack(str(tmp_path / "p.zip"), steps=0, redact="none")
    pack.capture()
    assert pack.redact == "hash"
    assert pack.errors and "redact" in pack.errors[0]
    assert load(str(pack.saved))["env"]["vars"]["HF_TOKEN"] == config_pack.redact("PlantedHf7")
