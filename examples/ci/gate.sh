#!/usr/bin/env bash
# The accuracy-regression gate of docs/ci.md, as a CI job runs it: dump the example model for
# a few steps on this runner, compare the dump with the stored baseline, write every report
# (html, xlsx, summary.json, JUnit XML, summary.md) and exit with probe compare's code
# (0 pass, 1 divergence, 2 bad input, 3 nothing comparable, 4 incomplete).
#
#   examples/ci/gate.sh BASELINE_DIR OUT [train_small.py arguments ...]
#
# OUT/run/dump and OUT/run/config_pack.zip are this run's dump and config pack (what
# `probe baseline accept` takes to make this run the new baseline); OUT/compare/ holds the
# compare's reports, OUT/config-check/ the environment's differences from the baseline's
# pack (reported, not gated: an explanation, not a verdict). When $GITHUB_STEP_SUMMARY is
# set, the Markdown summary is appended to it.
#
# Settings (environment): PROBE (the probe command, default `probe`), PYTHON (default
# `python3`), DEVICE (cpu, cuda or npu; default cpu), STEPS (default 2), MODE (the capture
# mode; statistics by default, as the baseline's), FAIL_ON (error or warning; default
# error), MAX_UNMATCHED (default 0.05).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 BASELINE_DIR OUT [train_small.py arguments ...]" >&2
  exit 2
fi
baseline=$1
out=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
PROBE=${PROBE:-probe}
PYTHON=${PYTHON:-python3}
run="$out/run"
rm -rf "$run" "$out/compare" "$out/config-check"
mkdir -p "$run"

# 1. Dump the model on this runner (a new torch_npu/CANN, kernel or driver under test).
"$PYTHON" "$here/../train_small.py" --device "${DEVICE:-cpu}" --steps "${STEPS:-2}" \
  --mode "${MODE:-statistics}" --dump "$run/dump" --config-pack "$run/config_pack.zip" \
  --quiet "$@" || exit 2

# 2. Compare with the baseline (its calibration file, when it has one, sets the tolerances).
set +e
"$PROBE" compare -b "$baseline" -c "$run/dump" -o "$out/compare" -q \
  --format json,html,xlsx,junit,markdown \
  --fail-on "${FAIL_ON:-error}" --max-unmatched "${MAX_UNMATCHED:-0.05}"
code=$?
set -e

# 3. The environment against the baseline's: explains a failure, does not gate it.
if [ -f "$baseline/config_pack.zip" ]; then
  "$PROBE" config-check "$baseline/config_pack.zip" "$run/config_pack.zip" \
    -o "$out/config-check" -q --format json,html,junit,markdown --fail-on never || code=2
fi

if [ -n "${GITHUB_STEP_SUMMARY:-}" ] && [ -f "$out/compare/summary.md" ]; then
  cat "$out/compare/summary.md" >>"$GITHUB_STEP_SUMMARY"
fi
exit "$code"
