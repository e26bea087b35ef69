#!/usr/bin/env bash
# The one command that runs every test: Rust (format, lints, unit, integration) and the
# Python capture agent (including the end-to-end dump -> probe compare test).
# Installs what it needs itself: a virtualenv in .venv with torch (CPU use), safetensors,
# numpy, pytest, jsonschema, ruff, mypy, and the agent from ./python. pip caches the torch
# wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

echo "== rust: fmt, clippy"
cargo fmt --all -- --check
cargo clippy --all-targets --quiet -- -D warnings

echo "== rust: tests"
cargo test --quiet 2>&1

echo "== python: environment"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv --system-site-packages .venv
fi
PY=.venv/bin/python
"$PY" -m pip install --quiet --disable-pip-version-check "torch>=2.1" numpy safetensors pytest jsonschema ruff mypy
# Always the checkout's agent, even when an older copy with the same version is installed.
"$PY" -m pip install --quiet --disable-pip-version-check --no-build-isolation --no-deps --force-reinstall ./python

echo "== python: ruff, mypy (python/pyproject.toml)"
(cd python && "../$PY" -m ruff check . ../examples ../bench && "../$PY" -m ruff format --check . && "../$PY" -m mypy)

echo "== python: tests"
cargo build --quiet
export PROBE_BIN="$PWD/target/debug/probe"
"$PY" -m pytest python/tests -q -p no:cacheprovider
