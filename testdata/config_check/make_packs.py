#!/usr/bin/env python3
"""Make the probe config packs used by tests/config_check.rs from real (tiny) training runs.

    PYTHONPATH=python python testdata/config_check/make_packs.py testdata/config_check

Each scenario trains a small conv + linear model for 3 Adam steps on CPU under
``probe.ConfigPack``; the packs differ only in what the scenario changes:

| pack            | change                                       | categories that must fail |
|-----------------|----------------------------------------------|---------------------------|
| base.zip        | -                                            | -                         |
| rerun.zip       | the same run again                           | none                      |
| seed.zip        | ``torch.manual_seed(1235)`` instead of 1234  | random, weights           |
| env.zip         | ``CUDA_LAUNCH_BLOCKING=1``                   | env                       |
| package.zip     | base.zip with numpy's version edited          | packages                  |
| data_order.zip  | the DataLoader shuffles with another seed    | dataset                   |

The environment is replaced by a fixed one while the runs execute, so that no value of the
machine that made the packs is committed (``HF_TOKEN`` shows the redaction).
"""

from __future__ import annotations

import json
import os
import random
import sys
import zipfile
from typing import Dict, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import probe

FIXED_ENV: Dict[str, str] = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/home/user",
    "LANG": "C.UTF-8",
    "PWD": "/home/user/run",
    "CUDA_VISIBLE_DEVICES": "0",
    "NCCL_DEBUG": "WARN",
    "OMP_NUM_THREADS": "1",
    "HF_TOKEN": "hf_not_a_real_token",
    "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_user",
}


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc(x.flatten(1))


def run(
    out: str, seed: int = 1234, data_seed: int = 0, env: Optional[Dict[str, str]] = None
) -> None:
    os.environ.clear()
    os.environ.update(FIXED_ENV)
    os.environ.update(env or {})
    pack = probe.ConfigPack(out, steps=3)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    model = TinyNet()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    gen = torch.Generator().manual_seed(7)  # the data itself never depends on the seed
    data = torch.randn(12, 3, 8, 8, generator=gen)
    labels = torch.randint(0, 5, (12,), generator=gen)
    dl = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(data, labels),
        batch_size=4,
        shuffle=True,
        generator=torch.Generator().manual_seed(data_seed),
    )
    pack.capture(
        model=model,
        optimizer=opt,
        dataloader=dl,
        scheduler=sched,
        args={"lr": 1e-3, "batch_size": 4, "epochs": 1},
    )
    for x, y in dl:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    if pack.saved is None:
        pack.save()
    assert pack.saved == out, pack.errors
    assert not pack.errors, pack.errors


def edit_packages(src: str, dst: str, package: str, version: str) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename == "packages.json":
                doc = json.loads(data)
                doc["distributions"][package] = version
                data = json.dumps(doc, indent=1, sort_keys=True).encode()
            zout.writestr(info, data)


def main() -> None:
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    saved = dict(os.environ)
    try:
        p = lambda n: os.path.join(outdir, n)  # noqa: E731
        run(p("base.zip"))
        run(p("rerun.zip"))
        run(p("seed.zip"), seed=1235)
        run(p("env.zip"), env={"CUDA_LAUNCH_BLOCKING": "1"})
        run(p("data_order.zip"), data_seed=1)
        edit_packages(p("base.zip"), p("package.zip"), "numpy", "1.26.4")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    print(f"wrote packs to {outdir}")


if __name__ == "__main__":
    main()
