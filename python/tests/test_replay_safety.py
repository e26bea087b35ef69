"""A replay never runs code that a dump names (issue 70, items 1 and 8; docs/security.md, "probe replay").

Why these cases: an op key is data from a dump, which may come from anyone. Before the
allow-list, the engine walked the key's dotted name from ``torch`` (``torch.os`` is the
``os`` module), so a record ``Torch.os.system.0.forward`` with the argument ``"touch X"``
made ``probe replay`` run a shell command, and ``Torch.save`` wrote a file anywhere. The
hostile dumps below are built by hand (a few tensors) and replayed through every entry
point: ``--op``, ``--from`` a compare's folder, the default flow (the compare names the
hostile op as the first divergent one) and the engine itself. Each must refuse in one line
naming the op, exit 2, run nothing (no marker file) and write nothing.

And a Python started in a folder holding ``torch.py`` (or ``probe.py``, ``json.py``) must
not import it: ``python -m`` and ``python -c`` put the current folder first on
``sys.path``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import warm
from conftest import REPO, probe_bin

PY_PATH = os.path.join(REPO, "python")

MANIFEST = {
    "created": "2026-01-01T00:00:00Z",
    "device": "cpu",
    "format": "probe-dump",
    "framework": "pytorch",
    "framework_version": "2",
    "level": "api",
    "mode": "tensor",
    "producer": "test_replay_safety",
    "version": 1,
    "world_size": 1,
}


def _stats(t: torch.Tensor) -> dict[str, float]:
    d = t.double()
    return {
        "inf": 0,
        "max": float(d.max()),
        "mean": float(d.mean()),
        "min": float(d.min()),
        "nan": 0,
        "norm": float(d.norm()),
    }


def write_dump(root: Path, key: str, args: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """A one-record tensor-mode dump: ``key`` with ``tensors`` by slot (``input.0``,
    ``output.0``) and the recorded non-tensor ``args``."""
    rank = root / "step0" / "rank0"
    rank.mkdir(parents=True)
    (root / "manifest.json").write_text(json.dumps(MANIFEST))
    names = {f"{key}.{slot}": t.contiguous() for slot, t in tensors.items()}
    save_file(names, str(rank / "tensors-00000.safetensors"))
    rec = {
        "direction": "forward",
        "kind": "api",
        "op": key,
        "seq": 0,
        "args": args,
        "tensors": [
            {
                "dtype": str(t.dtype).replace("torch.", ""),
                "file": "tensors-00000.safetensors",
                "name": name,
                "role": name.split(".")[-2],
                "shape": list(t.shape),
                "stats": _stats(t),
            }
            for name, t in names.items()
        ],
    }
    (rank / "ops.jsonl").write_text(json.dumps(rec) + "\n")


def hostile_pair(root: Path, key: str, args: dict[str, Any], inputs: dict[str, torch.Tensor]) -> None:
    """``root/bench`` and ``root/cmp``: the same call, outputs that differ (so a compare
    names it the first divergent op)."""
    out = torch.linspace(1.0, 2.0, 6).reshape(2, 3)
    write_dump(root / "bench", key, args, {**inputs, "output.0": out})
    write_dump(root / "cmp", key, args, {**inputs, "output.0": out * 1.5})


def cases(marker: Path) -> list[tuple[str, dict[str, Any], dict[str, torch.Tensor]]]:
    """(op key, recorded arguments, input tensors): a recorded argument of a tensor's slot
    is what the call receives there, so the input tensor (equal in both dumps: the compare
    finds the op locally divergent) is replaced by the string."""
    x = {"input.0": torch.ones(2, 3)}
    shell = {"input.0": f"touch {marker}"}
    return [
        ("Torch.os.system.0.forward", shell, x),
        ("Functional.torch.os.system.0.forward", shell, x),
        ("Torch.save.0.forward", {"input.1": str(marker)}, x),
        ("Tensor.__reduce_ex__.0.forward", {"input.1": 2}, x),
        ("Aten.__getattr__.0.forward", {"input.0": "add"}, x),
    ]


def env() -> dict[str, str]:
    e = dict(os.environ, PYTHONPATH=PY_PATH, PROBE_PYTHON=sys.executable)
    e.pop("PROBE_REPLAY_PRELUDE", None)
    return e


def probe(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([probe_bin(), *args], capture_output=True, text=True, timeout=300, env=env(), cwd=cwd)


def assert_refused(r: subprocess.CompletedProcess[str], key: str, marker: Path, out: Path) -> None:
    assert not marker.exists(), f"{key}: the dump's call ran\n{r.stdout}{r.stderr}"
    assert r.returncode == 2, f"{key}: exit {r.returncode}\n{r.stdout}{r.stderr}"
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and key in errors[0] and "not an operator a replay may run" in errors[0], r.stderr
    # The engine's line, or the binary's where a name is plainly no operator (os.system).
    assert errors[0].startswith(("probe replay: error: ", "probe: error: ")), r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists(), f"{key}: wrote {out}"


@pytest.mark.parametrize("index", range(5))
def test_a_dump_naming_a_non_operator_is_refused_at_every_entry_point(tmp_path: Path, index: int) -> None:
    marker = tmp_path / "PWNED"
    key, args, inputs = cases(marker)[index]
    hostile_pair(tmp_path, key, args, inputs)
    b, c = str(tmp_path / "bench"), str(tmp_path / "cmp")
    # The engine itself.
    out = tmp_path / "engine"
    r = warm.run(["-m", "probe.replay", "-b", b, "-c", c, "--op", key, "-o", str(out)], env=env(), cwd=str(tmp_path), timeout=120)
    assert_refused(r, key, marker, out)
    # probe replay --op.
    out = tmp_path / "op"
    assert_refused(probe(tmp_path, "replay", "-b", b, "-c", c, "--op", key, "-o", str(out)), key, marker, out)
    # The default flow: the compare names the hostile op, the replay refuses it.
    out = tmp_path / "default"
    assert_refused(probe(tmp_path, "replay", "-b", b, "-c", c, "-o", str(out)), key, marker, out)
    # --from an earlier compare's folder that names it.
    cmp = probe(tmp_path, "compare", "-b", b, "-c", c, "-o", str(tmp_path / "cmp_out"), "-q")
    assert cmp.returncode == 1, cmp.stdout + cmp.stderr
    with open(tmp_path / "cmp_out" / "summary.json", encoding="utf-8") as fh:
        assert key in json.dumps(json.load(fh))
    out = tmp_path / "from"
    assert_refused(probe(tmp_path, "replay", "--from", str(tmp_path / "cmp_out"), "-o", str(out)), key, marker, out)


# -- the allow-list itself ----------------------------------------------------------------------

HOSTILE = [
    ("function", "torch.os.system"),
    ("function", "torch.nn.functional.torch.os.system"),
    ("function", "torch.nn.functional.torch"),
    ("function", "torch.save"),
    ("function", "torch.load"),
    ("function", "torch.hub.load"),
    ("function", "torch.utils.cpp_extension.load"),
    ("function", "torch.ops.load_library"),
    ("function", "torch.ops.aten.__getattr__"),
    ("function", "torch.ops.aten.add.__call__"),
    ("function", "torch.ops.aten.add._op"),
    ("function", "torch.ops.aten._dir"),
    ("function", "torch.ops.aten.name"),
    ("function", "torch.ops.aten.add.Tensor.__call__"),
    ("function", "torch.ops.aten.add.Tensor.Tensor"),
    ("function", "torch.ops.aten.add.default.py_kernels"),
    ("function", "torch.ops.myns.op"),
    ("function", "torch._C._get_tracing_state"),
    ("function", "torch._VF.__class__"),
    ("function", "torch.__builtins__"),
    ("function", "torch.linalg.os.system"),
    ("function", "torch.sum.__globals__"),
    ("function", "torch_npu.os.system"),
    ("function", "builtins.exec"),
    ("function", "os.system"),
    ("function", "torch"),
    ("function", "torch.gelu.."),
    ("function", "torch. sum"),
    ("method", "torch.Tensor.__reduce_ex__"),
    ("method", "torch.Tensor.__class__"),
    ("method", "torch.Tensor.__init_subclass__"),
    ("method", "torch.Tensor.register_hook"),
    ("method", "torch.sum"),
    ("function", "torch.Tensor.add"),
    ("module", "torch.nn.Module"),
    ("module", "torch.nn.Conv2d"),
    ("module", "torch.nn.modules.linear.Linear"),
    ("module", "torch.save"),
    ("function", "torch.nn.Linear"),
    ("nonsense", "torch.sum"),
]


@pytest.mark.parametrize("kind, path", HOSTILE)
def test_the_allow_list_refuses_hostile_names(kind: str, path: str) -> None:
    from probe.replay import allowed

    with pytest.raises(allowed.NotAnOperator, match="not an operator"):
        allowed.resolve({"kind": kind, "path": path})


def test_the_ops_replays_run_resolve_to_torchs_own_callables() -> None:
    """What the replay tests and the collective replays call, as PyTorch defines them."""
    import torch.nn.functional as F

    from probe.replay import allowed

    want = {
        ("function", "torch.nn.functional.gelu"): F.gelu,
        ("function", "torch.nn.functional.silu"): F.silu,
        ("function", "torch.nn.functional.linear"): F.linear,
        ("function", "torch.matmul"): torch.matmul,
        ("function", "torch.linalg.vector_norm"): torch.linalg.vector_norm,
        ("function", "torch._VF.lstm"): torch._VF.lstm,
        ("method", "torch.Tensor.add_"): torch.Tensor.add_,
        ("method", "torch.Tensor.unbind"): torch.Tensor.unbind,
        ("method", "torch.Tensor.__add__"): torch.Tensor.__add__,
        ("module", "torch.nn.Linear"): torch.nn.Linear,
        ("function", "torch.ops.aten.add.Tensor"): torch.ops.aten.add.Tensor,
        ("function", "torch.ops.aten._softmax"): torch.ops.aten._softmax,
        ("function", "torch.ops.aten.native_dropout.default"): torch.ops.aten.native_dropout.default,
    }
    for op in ("sum", "mean", "amax", "amin", "prod"):  # collective.OPS
        want[("api", f"torch.{op}")] = getattr(torch, op)
    for (kind, path), fn in want.items():
        assert allowed.resolve({"kind": kind, "path": path}) is fn, path


def test_every_listed_api_resolves_to_a_callable_of_its_namespace() -> None:
    """Every name api_list.json lists for a replayable ApiType is allowed, and what it
    resolves to is a callable, never a module; names this torch lacks are absent, not
    something else."""
    import types

    from probe.replay import allowed

    roots = {"Torch": "torch", "Functional": "torch.nn.functional", "Tensor": "torch.Tensor", "VF": "torch._VF"}
    with open(os.path.join(PY_PATH, "probe", "api_list.json"), encoding="utf-8") as fh:
        listed = json.load(fh)
    n = 0
    for api_type, root in roots.items():
        for name in listed[api_type]:
            kind = "method" if api_type == "Tensor" else "function"
            try:
                fn = allowed.resolve({"kind": kind, "path": f"{root}.{name}"})
            except AttributeError:
                continue
            assert callable(fn) and not isinstance(fn, types.ModuleType), name
            n += 1
    assert n > 1000


# -- the current folder is not on the replay's import path -------------------------------------

PLANTED = ("torch", "probe", "json", "runpy")


def plant(folder: Path, marker: Path) -> None:
    """Modules in ``folder`` that write ``marker`` (their name) when imported."""
    for name in PLANTED:
        (folder / f"{name}.py").write_text(
            f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\nraise SystemExit(97)\n"
        )


def test_modules_in_the_current_folder_are_not_imported(tmp_path: Path) -> None:
    """probe replay runs its Python from the user's folder: a torch.py (probe.py, json.py)
    there is not imported, by the check of the Python nor by the replay, which still
    finds torch and probe where the environment (PYTHONPATH) puts them; python -m
    probe.replay itself does not import a torch.py there either."""
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run([probe_bin(), "synth", "-o", str(tmp_path / "s"), "--blocks", "1", "--width", "4", "--batch", "2",
                    "--inject", "Functional.gelu.0"], check=True, capture_output=True)
    marker = tmp_path / "IMPORTED"
    plant(work, marker)
    r = probe(work, "replay", "-b", "../s/bench", "-c", "../s/cmp", "--op", "Functional.gelu.0.forward", "-o", "out", "-q")
    assert not marker.exists(), marker.read_text()
    assert r.returncode == 0 and r.stdout.startswith("DOES NOT REPRODUCE: Functional.gelu.0.forward"), r.stdout + r.stderr
    assert (work / "out" / "replay.json").is_file()
    (work / "probe.py").unlink()  # python -m needs the package itself; its later imports are guarded
    (work / "json.py").unlink()
    (work / "runpy.py").unlink()
    r = subprocess.run([sys.executable, "-m", "probe.replay", "-b", "../s/bench", "-c", "../s/cmp", "--op",
                        "Functional.gelu.0.forward", "-o", "out2", "-q"], capture_output=True, text=True, env=env(), cwd=work, timeout=300)
    assert not marker.exists(), marker.read_text()
    assert r.returncode == 0, r.stdout + r.stderr
