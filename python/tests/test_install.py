"""The one-wheel install: `pip install` gives both the `probe` command and `import probe`.

scripts/test.sh builds the wheel (`pip wheel .`, maturin through PEP 517, the same path as a
user's `pip install .`), installs it into the test virtualenv and exports its path as
$PROBE_WHEEL; these tests check what a user gets from it. Without $PROBE_WHEEL (pytest run by
hand on an editable checkout) the wheel tests skip.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

import probe
from conftest import REPO

WHEEL = os.environ.get("PROBE_WHEEL")
needs_wheel = pytest.mark.skipif(not WHEEL, reason="PROBE_WHEEL not set (scripts/test.sh sets it)")


def cargo_version() -> str:
    text = (Path(REPO) / "Cargo.toml").read_text()
    m = re.search(r'^version = "([^"]+)"', text, re.M)
    assert m, "no version in Cargo.toml"
    return m.group(1)


def test_one_version_everywhere() -> None:
    # The wheel's version is Cargo.toml's (maturin); the agent stamps its own into every
    # dump manifest. They must be one number.
    assert probe.__version__ == cargo_version()


@needs_wheel
def test_the_wheel_holds_the_command_and_the_agent() -> None:
    assert WHEEL
    names = zipfile.ZipFile(WHEEL).namelist()
    assert any(n.endswith(".data/scripts/probe") for n in names), names
    assert "probe/__init__.py" in names and "probe/capture/api.py" in names
    assert "probe/api_list.json" in names and "probe/py.typed" in names
    assert not any(n.startswith(("tests/", "probe/tests", "python/")) for n in names)
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(WHEEL).read(meta).decode()
    assert "Name: probe-dl" in text and f"Version: {cargo_version()}" in text
    # torch must never be a hard requirement (it would replace an NPU host's torch build).
    requires = [line for line in text.splitlines() if line.startswith("Requires-Dist:")]
    assert not any(r.split(":")[1].split()[0] == "torch" and "extra ==" not in r for r in requires)


@needs_wheel
def test_tests_run_the_installed_command() -> None:
    # With no $PROBE_BIN, the agent finds the binary the wheel put in this environment's
    # scripts folder: the end-to-end tests below run that one.
    env = {k: v for k, v in os.environ.items() if k != "PROBE_BIN"}
    code = "import probe; print(probe.binary())"
    path = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert Path(path).parent == Path(sysconfig.get_path("scripts")), path
    assert "PROBE_BIN" not in os.environ, "scripts/test.sh must test the installed command"


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtualenv (no system packages, no torch) with only the wheel installed."""
    assert WHEEL
    root = tmp_path_factory.mktemp("fresh") / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(root)
    py = root / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", WHEEL],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return root


def clean_env() -> dict[str, str]:
    # Nothing of the test virtualenv may leak in: no PROBE_BIN, no PYTHONPATH, PATH without
    # the fresh env's bin (like a venv that was never activated).
    env = {k: v for k, v in os.environ.items() if k not in ("PROBE_BIN", "PYTHONPATH")}
    env["PATH"] = "/usr/bin:/bin"
    return env


@needs_wheel
def test_fresh_env_gets_a_working_command(fresh_env: Path, tmp_path: Path) -> None:
    exe = fresh_env / "bin" / "probe"
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, env=clean_env())
    assert out.returncode == 0 and cargo_version() in out.stdout, out
    # The main job on the bundled pair through the installed command: a fault is injected
    # into the comparison run, so exit 1 and a summary that names it.
    demo = Path(REPO) / "testdata" / "demo"
    run = subprocess.run(
        [str(exe), "compare", "-b", str(demo / "bench"), "-c", str(demo / "cmp")]
        + ["-o", str(tmp_path / "out"), "-q"],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert run.returncode == 1, run.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["verdict"] == "error"
    assert "gelu" in summary["first_divergent"]["forward"]["op"]  # the op synth faulted
    # The agent's CPU statistics kernel travels in the command (build.rs): a shared library
    # exporting the functions capture/native.py loads.
    kernel = subprocess.run(
        [str(exe), "agent-kernel", "--dir", str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert kernel.returncode == 0, kernel.stderr
    lib = Path(kernel.stdout.strip())
    assert lib.parent == tmp_path / "cache" and lib.read_bytes()[:4] == b"\x7fELF"
    import ctypes

    from probe.capture import native

    # The interface the agent of the same wheel speaks.
    assert ctypes.CDLL(str(lib)).probe_stats_abi() == native.ABI


@needs_wheel
def test_fresh_env_python_m_probe(fresh_env: Path, tmp_path: Path) -> None:
    py = str(fresh_env / "bin" / "python")
    env = clean_env()
    out = subprocess.run([py, "-m", "probe", "--version"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and cargo_version() in out.stdout, out
    # Arguments and the exit code pass straight through.
    demo = Path(REPO) / "testdata" / "demo"
    run = subprocess.run(
        [py, "-m", "probe", "compare", "-b", str(demo / "bench"), "-c", str(demo / "bench")]
        + ["-o", str(tmp_path / "same"), "-q"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    bad = subprocess.run([py, "-m", "probe", "compare"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "error" in bad.stderr.lower()


@needs_wheel
def test_fresh_env_imports_the_agent_without_torch(fresh_env: Path) -> None:
    # The fresh env has no torch: import probe, the config readers and binary() work; the
    # capture names say plainly what is missing.
    py = str(fresh_env / "bin" / "python")
    code = (
        "import probe, os\n"
        "print(os.path.basename(probe.binary()))\n"
        "print(probe.load_config is not None)\n"
        "try:\n    probe.Debugger\nexcept ModuleNotFoundError as e:\n    print('missing:', e)\n"
    )
    out = subprocess.run([py, "-c", code], capture_output=True, text=True, env=clean_env())
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "probe" and lines[1] == "True"
    assert lines[2].startswith("missing: probe.Debugger needs PyTorch"), lines


def test_missing_binary_is_one_clear_line(tmp_path: Path) -> None:
    env = {**os.environ, "PROBE_BIN": str(tmp_path / "nope")}
    out = subprocess.run(
        [sys.executable, "-m", "probe", "compare"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "PROBE_BIN" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_sdist_holds_what_a_build_from_source_needs(tmp_path: Path) -> None:
    # Where no wheel fits (an aarch64 host without a prebuilt wheel), pip builds the sdist:
    # it must carry the crate (manifest, lock file, sources) and the agent, and nothing of the
    # repository's tests or data. Building it compiles nothing; installing it would (a full
    # release build, which the wheel test above already covers).
    maturin = Path(sys.executable).with_name("maturin")
    if not maturin.exists():
        pytest.skip("maturin is not installed in this environment")
    r = subprocess.run(
        [str(maturin), "sdist", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    (sdist,) = tmp_path.glob("probe_dl-*.tar.gz")
    import tarfile

    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for need in (
        "Cargo.toml",
        "Cargo.lock",
        "pyproject.toml",
        "src/main.rs",
        "src/lib.rs",
        "build.rs",  # the agent's statistics kernel (src/agent_stats.rs)
        "src/agent_stats.rs",
    ):
        assert need in names, need
    assert "python/probe/__init__.py" in names and "python/probe/capture/api.py" in names
    assert not any(n.startswith(("tests/", "testdata/", "python/tests/", "bench/")) for n in names)
