#!/usr/bin/env bash
# Benchmark (not a test): what capturing collectives costs a 2-rank DDP job (gloo, CPU),
# statistics mode. Runs examples/train_ddp.py under torchrun three ways, alternating, and
# prints the median step time of each (rank 0, steps after the first) and the ratio
#   capture with collectives / capture without them (`exclude: Distributed.*`)
# (goal: <= 1.05x). Usage: bash bench/distributed_capture.sh   (STEPS=12 REPEATS=3)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
STEPS=${STEPS:-12}
REPEATS=${REPEATS:-3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH="$PWD/python" OMP_NUM_THREADS=1
run() {
  "$PY" -m torch.distributed.run --standalone --nproc_per_node 2 examples/train_ddp.py \
    --steps "$STEPS" --quiet --time --level mix --dump "$WORK/d" "$@" 2>/dev/null |
    awk '/^ms\/step/ { print $2 }'
  rm -rf "$WORK/d"
}
declare -A T
for _ in $(seq "$REPEATS"); do
  T[none]+="$(run --no-dump) "
  T[without]+="$(run --no-collectives) "
  T[with]+="$(run) "
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
NONE=$(echo "${T[none]}" | median)
WITHOUT=$(echo "${T[without]}" | median)
WITH=$(echo "${T[with]}" | median)
echo "2-rank DDP example (gloo, CPU, $(getconf _NPROCESSORS_ONLN) cores), statistics mode, mix level, median of $REPEATS runs of $STEPS steps"
echo "  no capture                       : ${NONE} ms/step"
echo "  capture without collectives      : ${WITHOUT} ms/step"
echo "  capture with collectives + DDP   : ${WITH} ms/step"
awk -v a="$WITH" -v b="$WITHOUT" 'BEGIN { printf "  collectives / without            : %.3fx  (goal <= 1.05x)\n", a / b }'
