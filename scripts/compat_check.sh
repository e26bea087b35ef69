#!/usr/bin/env bash
# The agent's test suite on the oldest and newest Python and PyTorch it supports (CI runs one
# pair: Python 3.11 with the newest torch). Each pair gets its own virtualenv under
# target/compat/ (a few GB each: PyTorch's CUDA wheels; pip caches them), and runs
# python/tests against the checkout's agent and target/release/probe (test_install.py, which
# builds the wheel, is left to scripts/test.sh).
#   bash scripts/compat_check.sh                      the pairs below
#   bash scripts/compat_check.sh PYTHON 'SPECS' ...   other pairs: an interpreter, pip specs
# Exits 1 if any pair's tests failed, 2 if a pair could not be set up.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "$#" -eq 0 ]; then
  # torch 2.1 is built against numpy 1.
  set -- python3.9 "torch==2.1.2 numpy<2" python3.13 "torch numpy"
fi
if [ $(($# % 2)) -ne 0 ]; then
  echo "compat_check: expected pairs of PYTHON 'PIP SPECS'" >&2
  exit 2
fi
P="${PROBE_BIN:-$PWD/target/release/probe}"
if [ ! -x "$P" ]; then
  echo "compat_check: no probe binary at $P (cargo build --release, or set PROBE_BIN)" >&2
  exit 2
fi
status=0
while [ "$#" -gt 0 ]; do
  py=$1 specs=$2
  shift 2
  if ! "$py" -c 'import venv' >/dev/null 2>&1; then
    echo "compat_check: $py does not run (give an interpreter's path)" >&2
    exit 2
  fi
  name="$(basename "$py")-$(echo "$specs" | tr -c 'A-Za-z0-9.=\n' '_')"
  venv="target/compat/$name"
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv" || exit 2
  # shellcheck disable=SC2086  # the specs are words
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $specs \
    safetensors orjson pytest jsonschema || exit 2
  versions="$("$venv/bin/python" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)')"
  echo "== $versions"
  if PROBE_BIN="$P" PYTHONPATH="$PWD/python" "$venv/bin/python" -m pytest python/tests -q \
    -p no:cacheprovider --deselect python/tests/test_install.py; then
    echo "== $versions: passed"
  else
    echo "== $versions: FAILED"
    status=1
  fi
done
exit "$status"
