#!/usr/bin/env bash
# Regenerates the bundled monitor pair (docs/monitor.md): examples/train_small.py monitored
# for 60 steps, once clean (bench) and once with a kernel fault that appears at step 40 (cmp:
# Functional.gelu's output 5 % off from step 40 on). `probe compare -b testdata/monitor/bench
# -c testdata/monitor/cmp` names step 40; scripts/check_html.sh renders its monitor.html.
# Needs torch (scripts/test.sh's .venv): PY=.venv/bin/python by default.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
rm -rf testdata/monitor
for side in bench cmp; do
  extra=()
  [[ $side == cmp ]] && extra=(--inject Functional.gelu --inject-from-step 40)
  PYTHONPATH=python "$PY" examples/train_small.py --steps 60 --no-dump --quiet \
    --monitor "testdata/monitor/$side" "${extra[@]}"
done
