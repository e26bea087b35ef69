"""Where NaN/Inf comes from: the example's injections, `probe scan`, `probe compare` and the
agent's overflow mode, end to end with the real example and the real binary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import warm
import torch
import torch.nn.functional as F

import probe
from conftest import REPO, SCHEMAS, load_example, probe_bin, read_ops

# (example flags, the op that produces the first NaN/Inf)
CASES = {
    "inf": (["--inject-inf", "Functional.gelu.0"], "Functional.gelu.0.forward"),
    "nan": (["--inject-nan", "Functional.layer_norm.1"], "Functional.layer_norm.1.forward"),
    "fp16": (["--fp16-overflow"], "Torch.matmul.0.forward"),
}
# torch 2.1 has no float16 matmul on CPU: the example refuses --fp16-overflow there.
HALF_MATMUL = load_example().has_half_matmul(torch.device("cpu"))
CASE_PARAMS = [
    pytest.param(
        c,
        marks=pytest.mark.skipif(
            c == "fp16" and not HALF_MATMUL, reason="no float16 matmul on CPU in this torch"
        ),
    )
    for c in sorted(CASES)
]


def _example(dump: str, *extra: str) -> None:
    cmd = [
        sys.executable,
        os.path.join(REPO, "examples", "train_small.py"),
        "--dump",
        dump,
        "--steps",
        "1",
        "--batch",
        "4",
        "--quiet",
        *extra,
    ]
    r = warm.run(cmd[1:], timeout=300)
    assert r.returncode == 0, r.stderr


def _probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([probe_bin(), *args, "-q"], capture_output=True, text=True, timeout=300)


def _scan(dump: str, out: str) -> tuple[int, dict[str, Any]]:
    r = _probe("scan", dump, "-o", out)
    path = os.path.join(out, "summary.json")
    summary = json.load(open(path)) if os.path.exists(path) else {}
    return r.returncode, summary


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One statistics-mode run of the example per injection, and a clean one."""
    probe_bin()  # skip before spending time on runs when there is no binary
    root = tmp_path_factory.mktemp("nonfinite")
    out = {"clean": str(root / "clean")}
    _example(out["clean"])
    for name, (flags, _) in CASES.items():
        if name == "fp16" and not HALF_MATMUL:
            continue
        out[name] = str(root / name)
        _example(out[name], *flags)
    return out


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_scan_names_the_producer(runs: dict[str, str], case: str, tmp_path: Any) -> None:
    code, summary = _scan(runs[case], str(tmp_path / "scan"))
    assert code == 1, summary.get("headline")
    assert summary["first_nonfinite"]["forward"]["op"] == CASES[case][1], summary["headline"]


def test_scan_of_the_clean_run_passes(runs: dict[str, str], tmp_path: Any) -> None:
    code, summary = _scan(runs["clean"], str(tmp_path / "scan"))
    assert code == 0, summary.get("headline")
    assert summary["first_nonfinite"].get("forward") is None


def test_compare_names_the_producer(runs: dict[str, str], tmp_path: Any) -> None:
    out = str(tmp_path / "cmp")
    r = _probe("compare", "-b", runs["clean"], "-c", runs["inf"], "-o", out)
    assert r.returncode == 1, r.stdout + r.stderr
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["first_nonfinite"]["op"] == CASES["inf"][1]
    assert f"NaN/Inf first produced by {CASES['inf'][1]}" in summary["headline"]


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_overflow_mode_records_only_the_producer(case: str, tmp_path: Any) -> None:
    """Two steps, overflow_nums 1: one record, the producer's, with its inputs and
    outputs as data; capture stopped after it (no step1)."""
    dump = str(tmp_path / "dump")
    _example(dump, "--mode", "overflow", "--steps", "2", *CASES[case][0])
    assert sorted(os.listdir(dump)) == ["manifest.json", "step0"]
    man = json.load(open(os.path.join(dump, "manifest.json")))
    assert man["mode"] == "tensor" and man["overflow"] == {"overflow_nums": 1}
    ops = read_ops(os.path.join(dump, "step0", "rank0"))
    assert [o["op"] for o in ops] == [CASES[case][1]]
    roles = {t["role"] for t in ops[0]["tensors"]}
    assert roles == {"input", "output"}
    assert all("file" in t for t in ops[0]["tensors"])
    assert ops[0]["stack"] is not None
    code, summary = _scan(dump, str(tmp_path / "scan"))
    assert code == 1 and summary["first_nonfinite"]["forward"]["op"] == CASES[case][1]


def test_overflow_mode_clean_run_writes_no_step(tmp_path: Any) -> None:
    """Nothing overflowed: the manifest and no step folder; scan says so and exits 0."""
    dump = str(tmp_path / "dump")
    _example(dump, "--mode", "overflow")
    assert os.listdir(dump) == ["manifest.json"]
    code, summary = _scan(dump, str(tmp_path / "scan"))
    assert code == 0
    assert summary["headline"].startswith("CLEAN: nothing overflowed"), summary["headline"]


# ---------------------------------------------------------------- in process (Tiny model)


class Overflowing(torch.nn.Module):
    """exp of a large activation overflows float32 (the wrappers are built once per
    process, so patching an API here would not reach them: the overflow must be real)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.exp(self.fc(x) * 1000.0))


def _train_overflowing(dbg: probe.Debugger, steps: int = 1) -> None:
    torch.manual_seed(0)
    model = Overflowing()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        dbg.start(model)
        opt.zero_grad()
        F.cross_entropy(model(torch.randn(4, 8)), torch.tensor([0, 1, 2, 3])).backward()
        opt.step()
        dbg.stop()
        dbg.step()
    dbg.close()


def test_overflow_nums_limits_the_records_and_ends_capture(dump: str) -> None:
    dbg = probe.Debugger(None, dump_path=dump, mode="overflow", overflow_nums=3)
    _train_overflowing(dbg, steps=2)
    ops = read_ops(os.path.join(dump, "step0", "rank0"))
    assert len(ops) == 3 and ops[0]["op"] == "Torch.exp.0.forward"
    assert not os.path.exists(os.path.join(dump, "step1"))
    assert dbg.enabled


def test_overflow_mode_unlimited_records_every_step(dump: str) -> None:
    _train_overflowing(
        probe.Debugger(None, dump_path=dump, mode="overflow", overflow_nums=-1), steps=2
    )
    ops = read_ops(os.path.join(dump, "step0", "rank0"))
    assert ops[0]["op"] == "Torch.exp.0.forward"
    assert any(o["direction"] == "backward" for o in ops)
    # The optimizer step made the weights NaN: step 1 overflows from its first linear on.
    assert read_ops(os.path.join(dump, "step1", "rank0"))[0]["op"] == "Functional.linear.0.forward"


def test_overflow_dump_matches_the_schemas(dump: str) -> None:
    """Mix level, no limit: module and API records, forward and backward, parameter
    gradients; every file as the format says, every stack id written."""
    jsonschema = pytest.importorskip("jsonschema")
    _train_overflowing(
        probe.Debugger(None, dump_path=dump, level="mix", mode="overflow", overflow_nums=-1)
    )
    schema = {
        n: json.load(open(os.path.join(SCHEMAS, f"probe-dump-{n}.v1.schema.json")))
        for n in ("manifest", "op", "stack")
    }
    jsonschema.validate(json.load(open(os.path.join(dump, "manifest.json"))), schema["manifest"])
    folder = os.path.join(dump, "step0", "rank0")
    ops = read_ops(folder)
    kinds = {(o["kind"], o["direction"]) for o in ops}
    assert kinds == {
        ("api", "forward"),
        ("api", "backward"),
        ("module", "forward"),
        ("module", "backward"),
        ("parameters_grad", "backward"),
    }
    v = jsonschema.Draft202012Validator(schema["op"])
    for o in ops:
        v.validate(o)
    stacks = [json.loads(line) for line in open(os.path.join(folder, "stacks.jsonl"))]
    for st in stacks:
        jsonschema.validate(st, schema["stack"])
    assert {o["stack"] for o in ops if o["stack"] is not None} <= {st["id"] for st in stacks}


def test_overflow_mode_backward_producer(dump: str) -> None:
    """sqrt(0) is finite, its gradient is not: the backward call is the producer."""
    dbg = probe.Debugger(None, dump_path=dump, mode="overflow")
    dbg.start()
    x = torch.zeros(3, 4, requires_grad=True)
    torch.sqrt(x).sum().backward()
    dbg.stop()
    dbg.close()
    ops = read_ops(os.path.join(dump, "step0", "rank0"))
    assert [o["op"] for o in ops] == ["Torch.sqrt.0.backward"]
    grads = {t["role"]: t for t in ops[0]["tensors"]}
    assert grads["output"]["stats"]["inf"] == 12 and grads["input"]["stats"]["inf"] == 0
    assert ops[0]["stack"] is None


def test_overflow_mode_inplace_input_is_the_value_before(dump: str) -> None:
    dbg = probe.Debugger(None, dump_path=dump, mode="overflow")
    dbg.start()
    x = torch.full((4,), 1e38)
    x.mul_(10.0)
    dbg.stop()
    dbg.close()
    (op,) = read_ops(os.path.join(dump, "step0", "rank0"))
    assert op["op"] == "Tensor.mul_.0.forward" and op["args"] == {"input.1": 10.0}
    ins = {t["name"]: t["stats"] for t in op["tensors"]}
    assert ins["Tensor.mul_.0.forward.input.0"]["max"] == pytest.approx(1e38)
    assert ins["Tensor.mul_.0.forward.output.0"]["inf"] == 4


def test_msprobe_overflow_check_config(tmp_path: Any) -> None:
    cfg = {
        "task": "overflow_check",
        "dump_path": str(tmp_path / "dump"),
        "rank": [],
        "step": [],
        "level": "L1",
        "overflow_check": {"overflow_nums": 2},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    c = probe.Debugger(str(path)).config
    assert (c.mode, c.overflow_nums, c.level) == ("overflow", 2, "api")
    del cfg["overflow_check"]
    path.write_text(json.dumps(cfg))
    assert probe.Debugger(str(path)).config.overflow_nums == 1  # msprobe's default


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "1"])
def test_overflow_nums_is_validated(bad: Any) -> None:
    with pytest.raises(probe.ConfigError, match="overflow_nums"):
        probe.Debugger(None, mode="overflow", overflow_nums=bad)


def test_overflow_config_matches_the_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.load(open(os.path.join(SCHEMAS, "probe-capture-config.v1.schema.json")))
    jsonschema.validate({"mode": "overflow", "overflow_nums": -1}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"mode": "overflow", "overflow_nums": 0}, schema)


SCALED = """
import sys, torch, probe
import torch.nn.functional as F
dump, init_scale, nan_forward = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "nan"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
if nan_forward:
    x[0, 0] = float("nan")
dbg = probe.Debugger(None, dump_path=dump, level="mix", mode="statistics")
dbg.start(model)
with torch.autocast("cpu", dtype=torch.float16):
    loss = F.cross_entropy(model(x), y)
scaler.scale(loss).backward()
scaler.unscale_(opt)
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # reads the overflowed gradients
scaler.step(opt)
scaler.update()
dbg.stop()
dbg.step()
dbg.close()
print(scaler.get_scale())
"""


@pytest.mark.parametrize(
    ("init_scale", "forward", "verdict"),
    [("1e30", "ok", "warning"), ("1024", "ok", "pass"), ("1e30", "nan", "error")],
)
def test_gradients_that_overflow_in_a_step_the_loss_scaler_skips_are_a_warning(
    tmp_path: Any, init_scale: str, forward: str, verdict: str
) -> None:
    """float16 training with AMP's GradScaler: gradients overflowing under the loss scale are
    what the scaler is there for (it skips the step and lowers the scale). The agent records
    the scaler's update, whose ``found_inf`` says so, and the scan calls such a step's
    gradient NaN/Inf a warning, counted apart; NaN in the forward is an error still. Before,
    ``found_inf`` was recorded with the zero it held before the check (the check bumps no
    version counter), and every such step was an error."""
    script = tmp_path / "train.py"
    script.write_text(SCALED, encoding="utf-8")
    dump = str(tmp_path / "dump")
    r = warm.run(
        [str(script), dump, init_scale, forward],
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.path.join(REPO, "python")},
    )
    assert r.returncode == 0, r.stderr
    skipped = float(r.stdout.split()[-1]) < float(init_scale)
    code, s = _scan(dump, str(tmp_path / "out"))
    assert s["verdict"] == verdict, s["headline"]
    c = s["counts"]
    assert c["loss_scaler_skipped_steps"] == int(skipped), c
    if verdict == "warning":
        assert code == 0 and c["nonfinite"] == 0 and c["nonfinite_scaler_skipped"] > 0, c
        assert s["headline"].startswith(
            "NaN/Inf only in the gradients of 1 step/rank folder(s) the loss scaler skipped"
        )
    if verdict == "error":
        assert code == 1 and c["nonfinite"] > 0, c


def test_scan_names_the_log_of_an_unclamped_entropy_term(tmp_path: Any) -> None:
    """An entropy term ``p * log(p)`` without a clamp: a large logit gap underflows softmax
    to exact zeros, ``log`` makes -inf of them from finite inputs, and ``mul``'s ``0 * -inf``
    is NaN. The log is the producer, not the mul reading its -inf (which is no mask)."""
    dump = str(tmp_path / "dump")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    with torch.no_grad():
        model.bias.copy_(torch.tensor([0.0, 0.0, -200.0, 0.0]))
    dbg = probe.Debugger(None, dump_path=dump, mode="statistics")
    dbg.start(model)
    logits = model(torch.randn(6, 8))
    p = torch.softmax(logits, dim=-1)
    entropy = (p * torch.log(p)).sum()
    loss = F.cross_entropy(logits, torch.tensor([0, 1, 3, 0, 1, 3])) + 0.1 * entropy
    dbg.stop()
    dbg.step()
    dbg.close()
    assert torch.isnan(loss) and (p == 0).any()
    code, s = _scan(dump, str(tmp_path / "out"))
    assert code == 1, s
    first = s["first_nonfinite"]["forward"]
    assert first["op"].startswith("Torch.log."), first
    assert "log of 0" in first["reason"], first
    assert first["op"] in s["headline"]
