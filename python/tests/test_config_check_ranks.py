"""config-check on folders of per-rank packs (issue 52, item 1), from real torchrun jobs: 8 ranks,
gloo on CPU, one pack per rank (``path`` with ``{rank}``). In the second job one rank runs with
another environment variable and another data seed (a node set up differently): the headline
names that rank, the variable and the data; the clean job passes, its ranks consistent with one
another (what torchrun sets per rank is not a difference)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest
import warm

from conftest import REPO, probe_bin

RANKS = 8
ODD = 3

# A tiny DDP job: the pack is made before seeding, captured once the model is wrapped, and
# written after one optimizer step. Each rank reads its own shard (seeded by the data seed
# and its rank), as a DistributedSampler would give it.
SCRIPT = """
import os

import probe

pack = probe.ConfigPack("packs/rank{rank}.zip", steps=1)

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
seed = int(os.environ.get("DATA_SEED", "7"))
shard = torch.Generator().manual_seed(seed * 1000 + dist.get_rank())
x = torch.randn(4, 8, generator=shard)
pack.capture(model=model, optimizer=opt)
model(x).pow(2).mean().backward()
opt.step()
dist.destroy_process_group()
"""

# torchrun starts each rank through this shell line (``$PYTHON``: the command that starts a
# Python script, warm.py's shim): the rank given as its argument ($1; -1: none) gets another
# variable and data seed. (An argument of the shell, not a variable: the
# packs record every variable.)
LAUNCH = (
    'if [ "$1" = "$RANK" ]; then export NCCL_ALGO=Ring DATA_SEED=8; fi; exec $PYTHON ../train.py'
)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two jobs at once, each in its folder (the same relative paths, so that no variable or
    argument differs between them): ``clean/packs`` and ``odd/packs``."""
    d = tmp_path_factory.mktemp("ranks")
    (d / "train.py").write_text(SCRIPT)
    procs = []
    for name in ("clean", "odd"):
        (d / name).mkdir()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + env.get("PYTHONPATH", "")
        env.update(PYTHON=" ".join(warm.rank_command(env)), OMP_NUM_THREADS="1")
        odd = str(ODD) if name == "odd" else "-1"
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node", str(RANKS), "--no-python", "sh", "-c", LAUNCH, "sh", odd,
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(cmd, cwd=d / name, env=env, stderr=subprocess.PIPE, text=True)
        )
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    for name in ("clean", "odd"):
        packs = sorted(p.name for p in (d / name / "packs").iterdir())
        assert packs == [f"rank{r}.zip" for r in range(RANKS)]
    return d


def _check(d: Path, a: str, b: str) -> tuple[int, str, Dict[str, Any]]:
    out = d / f"cc-{a}-{b}"
    proc = subprocess.run(
        [probe_bin(), "config-check", str(d / a / "packs"), str(d / b / "packs"), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc.returncode, proc.stdout, json.loads((out / "config_check.json").read_text())


def test_a_clean_job_passes(jobs: Path) -> None:
    code, stdout, result = _check(jobs, "clean", "clean")
    assert code == 0, stdout
    ranks = result["ranks"]
    assert ranks["compared"] == f"0-{RANKS - 1}"
    assert ranks["bench"]["world_size"] == RANKS
    assert ranks["bench"]["job"].startswith("TORCHELASTIC_RUN_ID=")
    # RANK, LOCAL_RANK, ... and each rank's data shard differ by design: no finding.
    assert ranks["consistency"] == []
    assert "no difference" in ranks["headline"][0]
    assert {c["name"]: c["verdict"] for c in result["categories"]}["dataset"] == "pass"


def test_reports_match_the_schema(jobs: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(Path(REPO, "schemas", "probe-config-check.v1.schema.json").read_text())
    for a, b in (("clean", "clean"), ("clean", "odd")):
        jsonschema.validate(_check(jobs, a, b)[2], schema)


def test_the_odd_rank_is_named_with_what_differs(jobs: Path) -> None:
    code, stdout, result = _check(jobs, "clean", "odd")
    assert code == 1
    headline = result["ranks"]["headline"]
    text = "\n".join(headline)
    # Against its peers: the variables only it has.
    peers = [
        line
        for line in headline
        if line.startswith(f"rank {ODD} of cmp differs from the other {RANKS - 1} ranks")
    ]
    assert peers, text
    assert "env DATA_SEED = 8 (others: <unset>)" in peers[0]
    assert "env NCCL_ALGO = Ring (others: <unset>)" in peers[0]
    # Against the clean job's same rank: its data differs too.
    pair = [line for line in headline if line.startswith(f"rank {ODD}, bench vs cmp:")]
    assert pair, text
    assert "dataset args.0 (step 0): bytes differ" in pair[0], pair[0]
    assert headline[0] in (peers[0], pair[0])
    assert f"rank {ODD} of cmp differs" in stdout
    # Only that rank differs, in env and dataset.
    bad = {
        row["rank"]: {c for c, v in row["cells"].items() if v in ("error", "warning")}
        for row in result["ranks"]["matrix"]
    }
    assert bad == {r: ({"env", "dataset"} if r == ODD else set()) for r in range(RANKS)}, bad
    assert {f["side"] for f in result["ranks"]["consistency"]} == {"cmp"}
