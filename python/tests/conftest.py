"""Shared helpers: a tiny model, a training step, and dump readers."""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Callable, Iterator

import probe
import pytest
import warm
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMAS = os.path.join(REPO, "schemas")
EXAMPLE = os.path.join(REPO, "examples", "train_small.py")

# The agent's native statistics kernel (capture/native.py) is written into a private folder
# of this test session (shared with the training scripts the tests run), not ~/.cache.
if "PROBE_CACHE_DIR" not in os.environ:
    os.environ["PROBE_CACHE_DIR"] = tempfile.mkdtemp(prefix="probe-tests-")
    atexit.register(shutil.rmtree, os.environ["PROBE_CACHE_DIR"], True)


def load_example() -> Any:
    """examples/train_small.py as a module, to run its ``main`` in this process."""
    spec = importlib.util.spec_from_file_location("train_small", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def probe_bin() -> str:
    """The `probe` command: $PROBE_BIN, else the one installed with the agent (the wheel that
    scripts/test.sh builds and installs), else a cargo build of this checkout; skips if none."""
    try:
        return probe.binary()
    except probe.BinaryNotFound:
        pass
    for rel in ("target/debug/probe", "target/release/probe"):
        path = os.path.join(REPO, rel)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    pytest.skip("probe binary not found: install the wheel (pip install .), set PROBE_BIN or cargo build")
    raise AssertionError  # unreachable


class Halve(torch.autograd.Function):
    """A custom autograd function whose backward calls a hooked API, as tensor-parallel
    layers all-reduce their gradients in theirs."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 0.5

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return torch.mul(g, 0.5)


class Tiny(nn.Module):
    """Small enough to run in milliseconds, rich enough to hit api/module/backward paths."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.block = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 16))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))
        h = h + self.block(h)
        return self.head(h)


def run_steps(
    dbg: Any,
    model: nn.Module,
    optimizers: list[torch.optim.Optimizer],
    batches: list[Any],
    loss_of: Callable[[Any], torch.Tensor],
) -> list[float]:
    """One training step per batch under ``dbg`` (None = bare): capture started, gradients
    zeroed, ``loss_of(batch)`` backpropagated, every optimizer stepped, capture stopped and
    the step closed; ``dbg`` closed at the end. Returns the losses."""
    losses = []
    for batch in batches:
        if dbg is not None:
            dbg.start(model)
        for opt in optimizers:
            opt.zero_grad()
        loss = loss_of(batch)
        loss.backward()
        for opt in optimizers:
            opt.step()
        if dbg is not None:
            dbg.stop()
            dbg.step()
        losses.append(loss.item())
    if dbg is not None:
        dbg.close()
    return losses


def train(dbg: Any, steps: int = 1, seed: int = 0) -> list[float]:
    """Run ``steps`` training steps of Tiny under ``dbg`` (None = bare); returns the losses."""
    torch.manual_seed(seed)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(seed + 1)
    batches = [
        (torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g))
        for _ in range(steps)
    ]
    return run_steps(dbg, model, [opt], batches, lambda b: F.cross_entropy(model(b[0]), b[1]))


def run_agent_script(
    script: str, *args: str, timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (Python source) in a fresh interpreter with this checkout's agent on its
    path, as a user's training script runs; its output is captured."""
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    cmd = [sys.executable, "-c", script, *args]
    return warm.run(cmd[1:], timeout=timeout, env=env)


def compare_summary(bench: str, cmp_: str, out: str, *extra: str) -> tuple[int, dict[str, Any]]:
    """Run ``probe compare`` quietly (exit 0 or 1 expected) and read its summary.json."""
    r = subprocess.run(
        [probe_bin(), "compare", "-q", "-b", bench, "-c", cmp_, "-o", out, *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode in (0, 1), r.stderr
    with open(os.path.join(out, "summary.json")) as fh:
        return r.returncode, json.load(fh)


def read_ops(folder: str) -> list[dict[str, Any]]:
    """Read an ops.jsonl line by line, skipping an incomplete last line (as readers must)."""
    out = []
    with open(os.path.join(folder, "ops.jsonl"), encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i >= len(lines) - 2:
                continue  # the truncated tail of a crashed run
            raise
    return out


def iter_tensors(ops: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for op in ops:
        for t in op["tensors"]:
            yield op, t


@pytest.fixture
def dump(tmp_path: Any) -> str:
    return str(tmp_path / "dump")
