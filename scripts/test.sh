#!/usr/bin/env bash
# The one command that runs every test: Rust (format, lints, unit, integration) and the
# Python capture agent (including the end-to-end dump -> probe compare test).
# Installs what it needs itself: a virtualenv in .venv with torch (CPU use), safetensors,
# numpy, pytest (with pytest-xdist), jsonschema, xmlschema (the JUnit schema check), ruff, mypy, maturin, transformers (a small LLaMA from a config,
# nothing downloaded: test_transformers_model.py; accelerate for its Trainer), and the wheel of this checkout (the probe
# command and the agent: pyproject.toml). pip caches the torch wheel, cargo the release build.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
# Each stage's heading says when it began, in seconds since the start: where CI's time goes.
stage() { echo "== $1 [${SECONDS}s]"; }

stage "rust: fmt, clippy"
cargo fmt --all -- --check
cargo clippy --all-targets --quiet -- -D warnings

stage "rust: tests"
cargo test --quiet 2>&1

stage "python: environment"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv --system-site-packages .venv
fi
PY=.venv/bin/python
"$PY" -m pip install --quiet --disable-pip-version-check "torch>=2.1" numpy safetensors orjson pytest pytest-xdist jsonschema xmlschema ruff mypy import-linter "maturin>=1.5,<2" transformers accelerate pyarrow

stage "python: ruff, mypy, import contracts (pyproject.toml)"
"$PY" -m ruff check python examples bench
"$PY" -m ruff format --check python examples bench
"$PY" -m mypy
# No import circles in python/probe, and the agent's layers (the source tree, not the wheel).
PYTHONPATH=python .venv/bin/lint-imports --no-cache

stage "wheel: pip wheel . (maturin: the probe command + the agent), installed into .venv"
# The user's `pip install .` path (PEP 517 through maturin, release build; cargo caches it in
# target/). Always this checkout's build, even when the same version is installed.
rm -rf target/wheels
# (maturin's PEP 517 hook runs the `maturin` command: the venv's bin must be on PATH.)
PATH="$PWD/.venv/bin:$PATH" "$PY" -m pip wheel --quiet --disable-pip-version-check --no-build-isolation --no-deps -w target/wheels .
PROBE_WHEEL="$(ls "$PWD"/target/wheels/probe_dl-*.whl)"
export PROBE_WHEEL
"$PY" -m pip uninstall --quiet --disable-pip-version-check -y probe-agent 2>/dev/null || true  # the old agent-only name
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$PROBE_WHEEL"

stage "python: tests (the installed probe command; test_install.py checks a fresh venv)"
unset PROBE_BIN
# One worker per core, at most 4 (PROBE_TEST_WORKERS sets the number; 0 runs them in this
# process): most tests train a small model in one Python thread, so on 2 cores two workers
# took 70 % of the time one did (8.75 against 12.5 minutes). A file's tests stay on one
# worker (--dist loadfile), so each module's runs (its fixtures) are made once. The cap keeps
# a large box from filling with training processes (the multi-rank tests start 2-4 each).
workers="${PROBE_TEST_WORKERS:-$(nproc)}"
case "$workers" in
  '' | *[!0-9]*) echo "PROBE_TEST_WORKERS must be a whole number, not '$workers'" >&2; exit 2 ;;
esac
[ "$workers" -le 4 ] || workers=4
# The tests' training runs are forked from an interpreter per worker that has imported torch
# (python/tests/warm.py; PROBE_TEST_WARM=0: a fresh interpreter each).
# The slowest tests are listed after the results: CI aims at under 30 minutes on 2 cores
# (42 at the last clean-clone run, 26 of them pytest).
# Every test's time is kept in target/test-times/pytest.xml (JUnit: a testcase's `time`), the
# run's record of where the Python suite's time went.
mkdir -p target/test-times
"$PY" -m pytest python/tests -q -p no:cacheprovider -n "$workers" --dist loadfile --durations=15 \
  --junitxml=target/test-times/pytest.xml

stage "html: the reports in headless Chromium (skips without chromium; CI as root installs it)"
PROBE_BIN="$PWD/.venv/bin/probe" bash scripts/check_html.sh
echo "== done [${SECONDS}s]"
# The suite's aim on CI's machine (2 cores) is 20 minutes: past it, say so loudly (a warning,
# not a failure: the machine's load swings, and CI's own limit is 90).
if [ "$SECONDS" -gt 1200 ]; then
  echo "WARNING: the test suite took $((SECONDS / 60)) min $((SECONDS % 60)) s, past its 20-minute aim (issue 77: see the stage times above and target/test-times/pytest.xml)"
fi
