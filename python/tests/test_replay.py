"""Replaying a recorded op (issue 50: ``python -m probe.replay``, docs/replay.md) on real dumps
of the example model and of a small ``transformers`` LLaMA.

Why these cases: a replay must say "reproduces" exactly when this machine's kernel is off
on the benchmark's inputs (a faulty kernel installed by a prelude, forward or backward),
"does not reproduce" when the difference entered from outside the call (other data), and
exit 0 on a clean pair; its repro folder must run where only torch is importable. The
expected errors are not written here: they are computed from the dumps' own tensors.

Each replay is a subprocess (a prelude patches torch process-wide); the example's training
runs in this process, with ``F.gelu`` restored after the run that injects a fault into it.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any

import pytest
import warm
import torch
import torch.nn.functional as F

from conftest import REPO, SCHEMAS, load_example, probe_bin

PY_PATH = os.path.join(REPO, "python")

FORWARD_FAULT = """
import torch.nn.functional as F
_gelu = F.gelu
def gelu(x, approximate="none"):  # a GELU kernel 3 % too large
    return _gelu(x, approximate=approximate) * 1.03
F.gelu = gelu
"""

BACKWARD_FAULT = """
import torch
import torch.nn.functional as F
_gelu = F.gelu
class _G(torch.autograd.Function):  # a GELU whose backward kernel is 8 % too large
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _gelu(x)
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        xd = x.detach().requires_grad_()
        with torch.enable_grad():
            (gx,) = torch.autograd.grad(_gelu(xd), xd, g)
        return gx * 1.08
F.gelu = lambda x, approximate="none": _G.apply(x)
"""

SILU_FAULT = """
import torch.nn.functional as F
_silu = F.silu
F.silu = lambda x, inplace=False: _silu(x) * 1.10  # a SiLU kernel 10 % too large
"""

LLAMA = """
import sys
import torch
import probe
from transformers import LlamaConfig, LlamaForCausalLM

probe.seed_all(0)
cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                  attn_implementation="eager")
model = LlamaForCausalLM(cfg)
ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
dbg = probe.Debugger(None, dump_path=sys.argv[1], level="mix", mode="tensor")
dbg.start(model)
model(input_ids=ids, labels=ids).loss.backward()
dbg.stop()
dbg.step()
dbg.close()
"""


def _train(ex: Any, dump: str, *extra: str) -> None:
    gelu = F.gelu
    try:
        ex.main(["--dump", dump, "--steps", "1", "--batch", "4", "--level", "mix", "--quiet", *extra])
    finally:
        F.gelu = gelu  # --inject patches it and leaves it so


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("replay")
    out = {k: str(root / k) for k in ("bench", "fault", "data", "stats", "stats_fault", "llama")}
    env = dict(os.environ, PYTHONPATH=PY_PATH)
    llama = None
    if importlib_ok("transformers"):
        llama = subprocess.Popen([sys.executable, "-c", LLAMA, out["llama"]], env=env, stderr=subprocess.PIPE, text=True)
    ex = load_example()
    threads = torch.get_num_threads()
    try:
        _train(ex, out["bench"], "--mode", "tensor")
        _train(ex, out["fault"], "--mode", "tensor", "--inject", "Functional.gelu.0", "--inject-rel", "0.03")
        _train(ex, out["data"], "--mode", "tensor", "--data-seed", "99")
        _train(ex, out["stats"], "--mode", "statistics")
        _train(ex, out["stats_fault"], "--mode", "statistics", "--inject", "Functional.gelu.0", "--inject-rel", "0.03")
    finally:
        torch.set_num_threads(threads)
    for name, text in (("fwd.py", FORWARD_FAULT), ("bwd.py", BACKWARD_FAULT), ("silu.py", SILU_FAULT)):
        (root / name).write_text(text)
        out[name] = str(root / name)
    if llama is not None:
        _, err = llama.communicate(timeout=300)
        assert llama.returncode == 0, err[-3000:]
    out["root"] = str(root)
    return out


def importlib_ok(name: str) -> bool:
    try:
        md.distribution(name)
    except md.PackageNotFoundError:
        return False
    return True


def replay(d: dict[str, str], out: str, *args: str, bench: str = "bench", cmp: str = "fault") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=PY_PATH)
    env.pop("PROBE_REPLAY_PRELUDE", None)
    cmd = [sys.executable, "-m", "probe.replay", "--bench", d[bench], "--cmp", d[cmp], "-o", os.path.join(d["root"], out), *args]
    return warm.run(cmd[1:], timeout=120, env=env)


def doc(d: dict[str, str], out: str) -> dict[str, Any]:
    with open(os.path.join(d["root"], out, "replay.json"), encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    schema_path = os.path.join(SCHEMAS, "probe-replay.v1.schema.json")
    jsonschema = pytest.importorskip("jsonschema")
    with open(schema_path, encoding="utf-8") as fh:
        jsonschema.validate(data, json.load(fh))
    return data


def ops_of(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {o["op"]: o for o in data["ops"]}


def recorded(dump: str, key: str, slot: str) -> torch.Tensor:
    """A tensor of a dump read with the safetensors package (not the replay's reader)."""
    from safetensors import safe_open

    folder = os.path.join(dump, "step0", "rank0")
    with open(os.path.join(folder, "ops.jsonl"), encoding="utf-8") as fh:
        rec = next(r for r in map(json.loads, fh) if r["op"] == key)
    t = next(t for t in rec["tensors"] if t["name"] == f"{key}.{slot}")
    with safe_open(os.path.join(folder, t["file"]), framework="pt") as f:
        return f.get_tensor(t["name"])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


# -- a bare interpreter: torch and what it requires, nothing else -------------------------


def _closure(name: str, extras: frozenset[str] = frozenset()) -> dict[str, md.Distribution]:
    seen: dict[str, md.Distribution] = {}
    todo = [(name, extras)]
    while todo:
        n, ex = todo.pop()
        key = re.sub(r"[-_.]+", "-", n).lower()
        try:
            dist = md.distribution(n)
        except md.PackageNotFoundError:
            continue
        if key in seen and not ex:
            continue
        seen[key] = dist
        for req in dist.requires or []:
            spec, _, marker = req.partition(";")
            m = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", spec)
            assert m is not None
            wanted = re.search(r"extra\s*==\s*[\"']([^\"']+)[\"']", marker)
            if wanted and wanted.group(1) not in ex:
                continue
            todo.append((m.group(1), frozenset(x.strip() for x in (m.group(2) or "").split(",") if x.strip())))
    return seen


def torch_only(folder: str) -> dict[str, str]:
    """A folder of links to torch's installed distributions (its requirements, followed),
    and the environment that runs ``python -S`` on it alone: no site-packages, no probe."""
    os.makedirs(folder, exist_ok=True)
    for dist in _closure("torch").values():
        for f in dist.files or []:
            top = f.parts[0]
            if top.startswith("..") or top.endswith(".pth") or os.path.exists(os.path.join(folder, top)):
                continue
            os.symlink(str(dist.locate_file(top)), os.path.join(folder, top))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PROBE"))}
    env["PYTHONPATH"] = folder
    return env


@pytest.fixture(scope="module")
def bare(dumps: dict[str, str]) -> dict[str, str]:
    env = torch_only(os.path.join(dumps["root"], "torch-only"))
    for mod in ("probe", "safetensors", "numpy"):
        r = subprocess.run([sys.executable, "-S", "-c", f"import {mod}"], env=env, capture_output=True, text=True)
        assert r.returncode != 0, f"{mod} is importable in the torch-only environment"
    return env


# -- the cases --------------------------------------------------------------------------------


def test_a_forward_kernel_fault_reproduces_and_its_repro_runs_with_torch_alone(
    dumps: dict[str, str], bare: dict[str, str]
) -> None:
    r = replay(dumps, "fwd", "--op", "Functional.gelu.0.forward", "--op", "Functional.linear.0.forward", "--prelude", dumps["fwd.py"])
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("REPRODUCES in isolation: Functional.gelu.0.forward")
    assert len(lines) == 3 and "Traceback" not in r.stderr
    ops = ops_of(doc(dumps, "fwd"))
    gelu = ops["Functional.gelu.0.forward"]
    assert gelu["verdict"] == "reproduces" and ops["Functional.linear.0.forward"]["verdict"] == "within_tolerance"
    # The errors, computed here from the recorded tensors: the fault's 3 %, the cmp run's 3 %.
    x = recorded(dumps["bench"], "Functional.gelu.0.forward", "input.0")
    ref = F.gelu(x.double())
    out = gelu["outputs"][0]
    assert out["replayed_vs_fp64"]["rel_l2"] == pytest.approx(rel(F.gelu(x) * 1.03, ref), rel=1e-3)
    cmp_out = recorded(dumps["fault"], "Functional.gelu.0.forward", "output.0")
    assert out["cmp_vs_fp64"]["rel_l2"] == pytest.approx(rel(cmp_out, ref), rel=1e-6)
    assert out["replayed_vs_cmp"]["rel_l2"] < 1e-5  # the replay gives the cmp run's output
    repro = os.path.join(dumps["root"], "fwd", gelu["repro"], "repro.py")
    faulty = subprocess.run([sys.executable, "-S", repro, "--prelude", dumps["fwd.py"]], env=bare, capture_output=True, text=True, timeout=120)
    assert faulty.returncode == 1, faulty.stdout + faulty.stderr
    clean = subprocess.run([sys.executable, "-S", repro], env=bare, capture_output=True, text=True, timeout=120)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    readme = open(os.path.join(os.path.dirname(repro), "README.md"), encoding="utf-8").read()
    assert "Functional.gelu.0.forward" in readme and str(list(x.shape)) in readme and "float32" in readme


def test_a_backward_kernel_fault_reproduces(dumps: dict[str, str]) -> None:
    r = replay(dumps, "bwd", "--op", "Functional.gelu.0.backward", "--op", "Functional.gelu.0.forward", "--prelude", dumps["bwd.py"])
    assert r.returncode == 1, r.stderr
    ops = ops_of(doc(dumps, "bwd"))
    back = ops["Functional.gelu.0.backward"]
    assert back["verdict"] == "reproduces"
    # The forward of that kernel is right: the cmp run's 3 % on it came from elsewhere.
    assert ops["Functional.gelu.0.forward"]["verdict"] == "does_not_reproduce"
    x = recorded(dumps["bench"], "Functional.gelu.0.forward", "input.0").double().requires_grad_()
    g = recorded(dumps["bench"], "Functional.gelu.0.backward", "input.0").double()
    (exact,) = torch.autograd.grad(F.gelu(x), x, g)
    assert back["outputs"][0]["replayed_vs_fp64"]["rel_l2"] == pytest.approx(0.08, rel=1e-3)
    bench_grad = recorded(dumps["bench"], "Functional.gelu.0.backward", "output.0")
    assert back["outputs"][0]["bench_vs_fp64"]["rel_l2"] == pytest.approx(rel(bench_grad, exact), rel=1e-6)


def test_a_clean_pair_is_within_tolerance_across_kinds_of_call(dumps: dict[str, str]) -> None:
    keys = [
        "Functional.linear.0.forward",
        "Functional.layer_norm.0.backward",
        "Torch.matmul.1.backward",
        "Tensor.add_.3.forward",
        "Tensor.unbind.0.forward",
        "Module.head.Linear.forward.0",
        "Module.head.Linear.backward.0",
        "Module.conv1.Conv2d.forward.0",
    ]
    r = replay(dumps, "clean", *[a for k in keys for a in ("--op", k)], cmp="bench")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("WITHIN TOLERANCE") and len(r.stdout.splitlines()) == len(keys) + 1
    ops = ops_of(doc(dumps, "clean"))
    assert {k: o["verdict"] for k, o in ops.items()} == {
        **{k: "within_tolerance" for k in keys[:-1]},
        "Module.conv1.Conv2d.forward.0": "cannot_replay",
    }
    assert "constructor arguments" in ops["Module.conv1.Conv2d.forward.0"]["reason"]
    # In place: the recorded input is the value before the call, the output after it.
    add = ops["Tensor.add_.3.forward"]["outputs"][0]
    assert add["replayed_vs_cmp"]["rel_l2"] == 0 or add["replayed_vs_cmp"]["rel_l2"] < 1e-6


def test_a_divergence_from_other_data_does_not_reproduce(dumps: dict[str, str]) -> None:
    r = replay(dumps, "data_out", "--op", "Functional.gelu.0.forward", cmp="data")
    assert r.returncode == 0, r.stderr
    op = ops_of(doc(dumps, "data_out"))["Functional.gelu.0.forward"]
    assert op["verdict"] == "does_not_reproduce"
    assert [d["slot"] for d in op["inputs_differ"]] == ["input.0"]
    assert "its recorded inputs differ" in r.stdout.splitlines()[0]


def test_a_statistics_dump_has_nothing_to_replay(dumps: dict[str, str]) -> None:
    r = replay(dumps, "stats_out", "--op", "Functional.gelu.0.forward", bench="stats", cmp="stats")
    assert r.returncode == 3, r.stderr
    assert "recapture.json" in r.stdout and "mode statistics" in r.stdout


@pytest.mark.parametrize(
    "args, words",
    [
        (["--op", "Functional.nothing.0.forward"], "is not in the benchmark dump"),
        (["--op", "Functional.gelu.0.forward", "--step", "7"], "no step7"),
        (["--op", "not a key\x1b[31m"], "not an op key"),
        (["--op", "Functional.gelu.0.forward", "--prelude", "/nonexistent.py"], "no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(dumps: dict[str, str], args: list[str], words: str) -> None:
    from probe.replay import cli

    out = os.path.join(dumps["root"], "bad")
    with pytest.raises(SystemExit) as e:
        cli.main(["--bench", dumps["bench"], "--cmp", dumps["fault"], "-o", out, *args])
    assert e.value.code == 2
    assert not os.path.exists(out)


def test_a_corrupt_shard_is_one_line_and_exit_2(dumps: dict[str, str]) -> None:
    broken = os.path.join(dumps["root"], "broken")
    shutil.copytree(dumps["bench"], broken)
    rank = os.path.join(broken, "step0", "rank0")
    shard = next(f for f in os.listdir(rank) if f.endswith(".safetensors"))
    with open(os.path.join(rank, shard), "r+b") as fh:
        fh.truncate(8 + int.from_bytes(fh.read(8), "little") + 16)  # the header, little data
    dumps = dict(dumps, broken=broken)
    r = replay(dumps, "broken-out", "--op", "Functional.gelu.0.forward", bench="broken")
    assert r.returncode == 2
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln.lower()]
    assert len(errors) == 1 and errors[0].startswith("probe replay: error: "), r.stderr
    assert "cut short" in errors[0] and "Traceback" not in r.stderr


def test_a_transformers_model_with_a_faulty_kernel_reproduces(dumps: dict[str, str]) -> None:
    if not os.path.isdir(dumps["llama"]):
        pytest.skip("transformers is not installed")
    r = replay(dumps, "llama_out", "--op", "Functional.silu.0.forward", "--op", "Functional.silu.0.backward", "--prelude", dumps["silu.py"], bench="llama", cmp="llama")
    assert r.returncode == 1, r.stdout + r.stderr
    ops = ops_of(doc(dumps, "llama_out"))
    assert ops["Functional.silu.0.forward"]["verdict"] == "reproduces"
    assert ops["Functional.silu.0.backward"]["verdict"] == "reproduces"
    assert ops["Functional.silu.0.forward"]["outputs"][0]["replayed_vs_fp64"]["rel_l2"] == pytest.approx(0.10, rel=1e-3)


def test_a_python_without_torch_is_told_so(dumps: dict[str, str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = PY_PATH
    r = subprocess.run([sys.executable, "-S", "-m", "probe.replay", "-b", "x", "-c", "y", "--op", "k", "-o", "z"], env=env, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("probe replay: error: PyTorch is not installed")


def test_what_cannot_be_replayed_says_why() -> None:
    from probe._op_key import parse_key
    from probe.replay.spec import CannotReplay, random_reason, target

    p = parse_key("Distributed.all_reduce.0.forward")
    assert p is not None
    with pytest.raises(CannotReplay, match="collective"):
        target(p, {})
    assert random_reason("Functional.dropout", [{"tensor": "input.0"}, 0.1, True], {})
    assert random_reason("Functional.dropout", [{"tensor": "input.0"}], {"p": 0.0}) is None
    assert random_reason("Functional.scaled_dot_product_attention", [], {}) is None
    assert random_reason("Functional.scaled_dot_product_attention", [], {"dropout_p": 0.1})


def test_the_key_parser_reads_the_golden_keys() -> None:
    from probe._op_key import forward_twin, parse_key

    with open(os.path.join(REPO, "testdata", "op_keys.json"), encoding="utf-8") as fh:
        cases = json.load(fh)["cases"]
    for c in cases:
        p, want = parse_key(c["key"]), c["parsed"]
        assert p is not None and p.kind == want["kind"] and p.direction == want["direction"]
        assert forward_twin(c["key"]) == want["forward_twin"]
        if want.get("module_path"):
            assert p.path == want["module_path"]


def test_a_shard_whose_data_is_not_aligned_reads_back(tmp_path: Any) -> None:
    """Shards are mapped, not read: a tensor whose data starts off its element size (a
    1-byte tensor before it, a 9-byte header) still reads back, by a copy; one cut short
    is a one-line error."""
    from probe.replay import dump

    x = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7
    header = json.dumps(
        {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "x": {"dtype": "F32", "shape": [2, 3], "data_offsets": [1, 25]}}
    ).encode()
    header += b" " * (9 - len(header) % 8)  # the data section starts at an odd offset
    path = tmp_path / "tensors-00000.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\x07" + x.numpy().tobytes())
    rank = dump.RankDir(str(tmp_path), 0, 0, None)
    rec = {"op": "Torch.f.0.forward", "tensors": [{"name": "x", "dtype": "float32", "shape": [2, 3], "file": path.name}]}
    got = dump.load_tensors(rank, rec)
    assert torch.equal(got["x"], x)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(dump.InputError, match="cut short"):
        dump.load_tensors(rank, rec)


# -- through the probe binary (tests/replay.rs checks its arguments with a stand-in Python) ----


def probe(*args: str, cwd: str = REPO, **env: str) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, PYTHONPATH=PY_PATH, PROBE_PYTHON=sys.executable, **env)
    full.pop("PROBE_REPLAY_PRELUDE", None)
    return subprocess.run([probe_bin(), *args], capture_output=True, text=True, timeout=300, env=full, cwd=cwd)


def test_probe_replay_names_the_compares_culprit_and_proves_it(dumps: dict[str, str]) -> None:
    """No --op: probe compares the dumps itself, replays the first divergent op (the GELU
    the comparison run perturbed) on the Python it finds, and returns the replay's exit
    code; --from an earlier compare's folder does the same; without the faulty kernel
    the same divergence does not reproduce (exit 0)."""
    root = dumps["root"]
    r = probe("replay", "-b", dumps["bench"], "-c", dumps["fault"], "-o", f"{root}/p1", "--prelude", dumps["fwd.py"])
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.splitlines()[0].startswith("REPRODUCES in isolation: Functional.gelu.0.forward"), r.stdout
    assert list(ops_of(doc(dumps, "p1"))) == ["Functional.gelu.0.forward"]
    assert os.path.isfile(f"{root}/p1/Functional.gelu.0.forward/repro.py")
    c = probe("compare", "-b", dumps["bench"], "-c", dumps["fault"], "-o", f"{root}/cmp", "-q")
    assert c.returncode == 1, c.stdout + c.stderr
    r = probe("replay", "--from", f"{root}/cmp", "-o", f"{root}/p2", "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("DOES NOT REPRODUCE: Functional.gelu.0.forward") and r.stderr == "", r.stderr


def test_a_statistics_dump_gets_a_recapture_that_the_script_applies_unchanged(
    dumps: dict[str, str], tmp_path: Any
) -> None:
    """Statistics dumps hold no inputs: compare writes recapture.json; the example script,
    run again unchanged with PROBE_CONFIG naming it, dumps that op alone in tensor mode
    (into ./probe_recapture of where it runs), and probe replay of the two new dumps
    proves the fault."""
    c = probe("compare", "-b", dumps["stats"], "-c", dumps["stats_fault"], "-o", str(tmp_path / "cmp"), "-q")
    assert c.returncode == 1, c.stdout + c.stderr
    with open(tmp_path / "cmp" / "summary.json", encoding="utf-8") as fh:
        summary = json.load(fh)
    assert summary["recapture"]["ops"] == ["Functional.gelu.0.forward"], summary["recapture"]
    config = str(tmp_path / "cmp" / "recapture.json")
    r = probe("replay", "--from", str(tmp_path / "cmp"), "-o", str(tmp_path / "none"))
    assert r.returncode == 3 and "recapture" in r.stdout + r.stderr, r.stdout + r.stderr
    script = os.path.join(REPO, "examples", "train_small.py")
    for side, extra in (("b", []), ("c", ["--inject", "Functional.gelu.0", "--inject-rel", "0.03"])):
        (tmp_path / side).mkdir()
        run = warm.run(
            [script, "--quiet", "--steps", "1", "--batch", "4", "--level", "mix", "--dump", "unused", *extra],
            cwd=tmp_path / side, env=dict(os.environ, PYTHONPATH=PY_PATH, PROBE_CONFIG=config), timeout=300,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        assert not (tmp_path / side / "unused").exists()
    rank = tmp_path / "b" / "probe_recapture" / "step0" / "rank0"
    with open(rank / "ops.jsonl", encoding="utf-8") as fh:
        ops = [json.loads(line)["op"] for line in fh]
    assert ops == ["Functional.gelu.0.forward", "Functional.gelu.0.backward"], ops
    r = probe(
        "replay", "-b", str(tmp_path / "b" / "probe_recapture"), "-c", str(tmp_path / "c" / "probe_recapture"),
        "-o", str(tmp_path / "replay"), "--prelude", dumps["fwd.py"], "-q",
    )
    assert r.returncode == 1 and r.stdout.startswith("REPRODUCES in isolation: Functional.gelu.0.forward"), r.stdout + r.stderr


def test_an_output_folder_that_is_not_a_replays_is_never_replaced(dumps: dict[str, str]) -> None:
    """A replay replaces its -o folder: a dump or a compare's folder given by mistake is
    refused, one line, exit 2, untouched (the engine and the binary alike)."""
    before = sorted(os.listdir(dumps["bench"]))
    r = replay(dumps, "bench", "--op", "Functional.gelu.0.forward")
    assert r.returncode == 2 and "name a new or empty one" in r.stderr, r.stderr
    p = probe("replay", "-b", dumps["bench"], "-c", dumps["fault"], "-o", dumps["bench"])
    assert p.returncode == 2 and "name a new or empty one" in p.stderr, p.stderr
    assert sorted(os.listdir(dumps["bench"])) == before


# -- collectives: a 2-rank DDP job, replayed from every rank's recorded inputs ----------------


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Three tensor-mode dumps of examples/train_ddp.py on 2 ranks: clean, with rank 1's
    bucket all-reduce result garbled, and with a GELU fault on rank 1 only."""
    root = tmp_path_factory.mktemp("ddp")
    runs = {
        "clean": [],
        "garbled": ["--inject-collective", "ddp_bucket_allreduce", "--inject-rank", "1"],
        "gelu1": ["--inject", "Functional.gelu.0", "--inject-rank", "1"],
    }
    env = dict(os.environ, PYTHONPATH=PY_PATH)
    procs = {}
    for name, extra in runs.items():
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        cmd += [os.path.join(REPO, "examples", "train_ddp.py"), "--quiet", "--steps", "1", "--level", "mix", "--mode", "tensor"]
        procs[name] = warm.run(
            [*cmd[1:], "--dump", str(root / name), *extra], env=env, timeout=300
        )
        assert procs[name].returncode == 0, procs[name].stderr[-2000:]
    out = {k: str(root / k) for k in runs}
    out["root"] = str(root)
    return out


def test_an_allreduce_is_replayed_from_every_ranks_inputs(ddp: dict[str, str], dumps: dict[str, str]) -> None:
    """The bucket all-reduce: the mean of both ranks' recorded inputs (the reduction the
    benchmark's output shows), within tolerance on a clean pair; a garbled result on rank 1
    does not reproduce, and the line says the collective itself is at fault; a GELU fault
    on rank 1 reaches rank 0's all-reduce as rank 1's input, which the line names."""
    key = "Distributed.ddp_bucket_allreduce.0.forward"
    cases = (("clean", 1, 0, None), ("garbled", 1, 0, "not the mean of its ranks' recorded inputs"), ("gelu1", 0, 0, "rank 1's input differs"))
    for cmp, rank, code, why in cases:
        out = os.path.join(ddp["root"], f"out_{cmp}")
        r = warm.run(
            ["-m", "probe.replay", "-b", ddp["clean"], "-c", ddp[cmp], "--op", key, "--step", "0", "--rank", str(rank), "-o", out], timeout=120, env=dict(os.environ, PYTHONPATH=PY_PATH),
        )
        assert r.returncode == code, r.stdout + r.stderr
        with open(os.path.join(out, "replay.json"), encoding="utf-8") as fh:
            op = json.load(fh)["ops"][0]
        assert op["call"].startswith("torch.mean(input.0"), op["call"]
        assert op["verdict"] == ("within_tolerance" if why is None else "does_not_reproduce"), op
        if why:
            assert why in r.stdout, r.stdout
    # The mean, checked here from the dumps themselves (not the replay's reader).
    mean = (recorded_at(ddp["clean"], 0, key, "input.0").double() + recorded_at(ddp["clean"], 1, key, "input.0").double()) / 2
    assert rel(recorded_at(ddp["clean"], 1, key, "output.0"), mean) < 1e-6
    # Through the binary with no --op: the compare names the garbled all-reduce; a missing
    # rank folder cannot be replayed, and says so.
    p = probe("replay", "-b", ddp["clean"], "-c", ddp["garbled"], "-o", os.path.join(ddp["root"], "auto"), "-q")
    assert p.returncode == 0 and p.stdout.startswith(f"DOES NOT REPRODUCE: {key}"), p.stdout + p.stderr
    alone = os.path.join(ddp["root"], "rank1_only")
    shutil.copytree(os.path.join(ddp["clean"], "step0", "rank1"), os.path.join(alone, "step0", "rank1"))
    shutil.copy(os.path.join(ddp["clean"], "manifest.json"), alone)
    r = replay({**dumps, "alone": alone}, "alone_out", "--op", key, bench="alone", cmp="alone")
    assert r.returncode == 3 and "rank 0's record of this collective" in r.stdout, r.stdout + r.stderr


def recorded_at(dump: str, rank: int, key: str, slot: str) -> torch.Tensor:
    from safetensors import safe_open

    folder = os.path.join(dump, "step0", f"rank{rank}")
    with open(os.path.join(folder, "ops.jsonl"), encoding="utf-8") as fh:
        rec = next(r for r in map(json.loads, fh) if r["op"] == key)
    t = next(t for t in rec["tensors"] if t["name"] == f"{key}.{slot}")
    with safe_open(os.path.join(folder, t["file"]), framework="pt") as f:
        return f.get_tensor(t["name"])


@pytest.mark.parametrize(
    "group, world",
    [(["/../../outside"], 2), ([0, "1"], 2), ([0, 2], 2), ([0, -1], 2), ([0, 0], 2), ([True, 1], 2), ([0, 1 << 40], None)],
)
def test_a_collectives_group_names_only_ranks_of_the_job(tmp_path: Any, group: list[Any], world: Any) -> None:
    """Issue 70: the group's members name the peers' folders (``rank<R>``); a member that is
    no rank of the job (a path, a string, past the world size, twice) is refused before
    any folder is built from it, never followed."""
    from probe.replay.collective import peer_inputs
    from probe.replay.dump import RankDir
    from probe.replay.spec import CannotReplay

    step = tmp_path / "dump" / "step0"
    (step / "rank0").mkdir(parents=True)
    (step / "rank").mkdir()  # what "rank/../../outside" would pass through
    outside = tmp_path / "dump" / "outside"
    outside.mkdir()
    rec = {"op": "Distributed.all_reduce.0.forward", "group": group, "coll_seq": 0}
    (outside / "ops.jsonl").write_text(json.dumps(rec) + "\n")
    manifest = None if world is None else {"world_size": world}
    rank = RankDir(str(step / "rank0"), 0, 0, manifest)
    with pytest.raises(CannotReplay, match="not a rank of the job|a rank twice"):
        peer_inputs(rank, "all_reduce", rec)


def test_bidi_controls_are_escaped_for_the_terminal() -> None:
    """Issue 70: right-to-left overrides, isolates and marks (U+202A-U+202E, U+2066-U+2069,
    U+200E, U+200F, U+061C) from a dump are escaped like control characters, as the
    binary's printable does."""
    from probe.replay.text import printable

    for c in [*map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A)), "\u200e", "\u200f", "\u061c"]:
        assert printable(f"op{c}x") == f"op\\u{ord(c):04x}x"
    assert printable("Functional.gelu.0 – é") == "Functional.gelu.0 – é"
