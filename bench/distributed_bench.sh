#!/usr/bin/env bash
# Benchmark of the cross-rank analysis (not a test). Prints, in one run, the wall time of
# `probe compare` on a RANKS-rank synthetic dump (`probe synth --ranks`, one op perturbed on
# rank 1, statistics mode) with its collective records (group, coll_seq: the cross-rank
# analysis runs) and on the same dump with those two fields stripped (no collective is
# known: the analysis has nothing to do), the median of REPS runs each, and their ratio.
# Goal: ratio <= 1.10.
# Usage: bash bench/distributed_bench.sh     (RANKS=64 BLOCKS=8 WIDTH=32 REPS=5 by default)
#        PROBE_BIN=/path/to/other/probe bash bench/distributed_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${RANKS:-64}
BLOCKS=${BLOCKS:-8}
WIDTH=${WIDTH:-32}
REPS=${REPS:-5}
MODE=${MODE:-statistics}
WORK=${BENCH_DIR:-/tmp/probe-bench-dist}
source bench/probe_bin.sh
rm -rf "$WORK"
mkdir -p "$WORK"
"$P" synth -o "$WORK/with" --mode "$MODE" --ranks "$RANKS" --blocks "$BLOCKS" --width "$WIDTH" \
  --perturb-rank 1 --perturb-op Functional.gelu.1 2>/dev/null
cp -r "$WORK/with" "$WORK/without"
find "$WORK/without" -name ops.jsonl -exec sed -i -E 's/,"group":\[[0-9,]*\],"coll_seq":[0-9]+//' {} +
if grep -rq coll_seq "$WORK/without"; then echo "strip failed" >&2; exit 1; fi
now() { date +%s.%N; }
time_one() {
  local t0 t1
  t0=$(now)
  "$P" compare -q -b "$WORK/$1/bench" -c "$WORK/$1/cmp" -o "$WORK/out-$1" --format json || true
  t1=$(now)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f\n", b - a }'
}
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
: > "$WORK/with.txt"; : > "$WORK/without.txt"
time_one with > /dev/null; time_one without > /dev/null   # warm the page cache
for _ in $(seq "$REPS"); do               # interleaved, so drift hits both alike
  time_one with >> "$WORK/with.txt"
  time_one without >> "$WORK/without.txt"
done
W=$(median < "$WORK/with.txt")
WO=$(median < "$WORK/without.txt")
OPS=$(cat "$WORK"/with/cmp/step0/rank*/ops.jsonl | wc -l)
echo "ranks: $RANKS, op records per side: $OPS, mode: $MODE, median of $REPS runs"
echo "headline: $(grep -o '"headline": *"[^"]*"' "$WORK/out-with/summary.json" | cut -c1-160)..."
echo "compare with cross-rank analysis:    ${W} s"
echo "compare without (collectives stripped): ${WO} s"
awk -v a="$W" -v b="$WO" 'BEGIN { printf "ratio: %.3fx (goal <= 1.10x)\n", a / b }'
