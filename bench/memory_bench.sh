#!/usr/bin/env bash
# Benchmark of a huge step/rank pair's memory (not a test). Prints, in one run, for two
# synthetic statistics pairs of TENSORS tensors a side (page-cached, every report written):
#   - "model": a model's structure (`probe synth --blocks`: 26 tensors in 10 ops per block,
#     forward and backward, a few APIs, one module per block);
#   - "bulk": one single-tensor op per tensor, each its own API (`--bulk`: the worst case
#     for the records and the aligner: a million ops and a million API names);
# over RUNS runs, the compare's best wall time and CPU time, the range of its peak RSS, and
# the worst peak against issue 14's goal (512 MB for 1M tensors a side, all reports); then
# the resident memory after each stage of one more run (PROBE_TRACE_MEMORY).
# Usage: bash bench/memory_bench.sh      (TENSORS=1000000 RUNS=3 by default)
#        PROBE_BIN=/path/to/other/probe bash bench/memory_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
TENSORS=${TENSORS:-1000000}
RUNS=${RUNS:-3}
WORK=${BENCH_DIR:-/tmp/probe-bench-memory}
GOAL_MB=512
source bench/probe_bin.sh
mkdir -p "$WORK"
# The model pair's blocks hold 26 tensors (forward and backward) a block.
BLOCKS=$(( (TENSORS + 25) / 26 ))
make_pair() {
  local name=$1; shift
  local d="$WORK/$name-$TENSORS"
  if [ ! -f "$d/.done" ]; then
    rm -rf "$d"
    "$P" synth -o "$d" --mode statistics --noise 1e-6 "$@" 2>/dev/null
    touch "$d/.done"
  fi
  echo "$d"
}
MODEL=$(make_pair model --blocks "$BLOCKS" --width 32)
BULK=$(make_pair bulk --bulk "$TENSORS" --bulk-elems 64)
echo "probe compare, one step/rank pair of ~$TENSORS statistics tensors a side, all reports ($(nproc) cores, $RUNS runs each)"
printf "%-6s %9s %12s %12s %16s %12s\n" pair tensors best_wall_s best_cpu_s peak_MB_range "worst/goal"
for pair in "model:$MODEL" "bulk:$BULK"; do
  name=${pair%%:*}; d=${pair#*:}
  cat "$d"/bench/step0/rank0/ops.jsonl "$d"/cmp/step0/rank0/ops.jsonl > /dev/null  # page cache
  : > "$WORK/runs.txt"
  for ((r = 1; r <= RUNS; r++)); do
    /usr/bin/time -f "%e %U %S %M" -o "$WORK/time.txt" "$P" compare -q -b "$d/bench" -c "$d/cmp" -o "$WORK/out" > /dev/null 2>&1 || true
    tail -1 "$WORK/time.txt" >> "$WORK/runs.txt"
  done
  tensors=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['counts']['tensors'])" "$WORK/out/summary.json")
  awk -v n="$name" -v t="$tensors" -v g="$GOAL_MB" '
    NR == 1 || $1 < w { w = $1 }
    NR == 1 || $2 + $3 < c { c = $2 + $3 }
    NR == 1 || $4 < lo { lo = $4 }
    NR == 1 || $4 > hi { hi = $4 }
    END { printf "%-6s %9s %12.2f %12.2f %7.0f-%-8.0f %12.2f\n", n, t, w, c, lo / 1024, hi / 1024, hi / 1024 / g }
  ' "$WORK/runs.txt"
done
echo "resident memory after each stage (model pair, one run):"
PROBE_TRACE_MEMORY=1 "$P" compare -q -b "$MODEL/bench" -c "$MODEL/cmp" -o "$WORK/out" 2>&1 >/dev/null | sed 's/^probe: /  /' || true
