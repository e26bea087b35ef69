#!/usr/bin/env bash
# Benchmark of how `probe compare` scales with the number of ranks (not a test). Prints, in
# one run, for each rank count in RANK_COUNTS: a synthetic statistics dump of that many
# ranks with about 20,000 tensors per rank (`probe synth --ranks R --blocks 714`), the
# compare's wall time, CPU time and peak RSS with every report written, and each figure's
# ratio to the smallest rank count's:
#   - wall time per rank should stay flat (time linear in the ranks);
#   - peak RSS should stay flat (issue 14's goal: 64 ranks within 10 % of 8): rows past
#     --row-memory (ROW_MEMORY, MB, default probe's 256) wait in a file, so RSS stops growing
#     once the budget is full; ROW_MEMORY=0 parks every pair's rows.
# Usage: bash bench/scale_bench.sh      (RANK_COUNTS="8 16 32 64" by default)
#        ROW_MEMORY=0 bash bench/scale_bench.sh
#        PROBE_BIN=/path/to/other/probe bash bench/scale_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RANK_COUNTS=${RANK_COUNTS:-"8 16 32 64"}
BLOCKS=${BLOCKS:-714}
WORK=${BENCH_DIR:-/tmp/probe-bench-scale}
ROW_MEMORY_ARGS=()
if [ -n "${ROW_MEMORY:-}" ]; then
  ROW_MEMORY_ARGS=(--row-memory "$ROW_MEMORY")
fi
source bench/probe_bin.sh
mkdir -p "$WORK"
printf "%-6s %10s %10s %10s %10s %12s %10s\n" ranks tensors wall_s cpu_s rss_MB wall/rank_x rss_x
base_wall_per_rank=""
base_rss=""
for r in $RANK_COUNTS; do
  d="$WORK/r$r"
  if [ ! -f "$d/.done" ]; then
    rm -rf "$d"
    "$P" synth -o "$d" --mode statistics --ranks "$r" --blocks "$BLOCKS" --width 16 2>/dev/null
    touch "$d/.done"
  fi
  cat "$d"/bench/step0/rank*/ops.jsonl "$d"/cmp/step0/rank*/ops.jsonl > /dev/null  # page cache
  /usr/bin/time -f "%e %U %S %M" -o "$WORK/time.txt" "$P" compare -q -b "$d/bench" -c "$d/cmp" -o "$d/out" "${ROW_MEMORY_ARGS[@]}" > /dev/null 2>&1 || true
  read -r wall user sys rss < <(tail -1 "$WORK/time.txt")
  tensors=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['counts']['tensors'])" "$d/out/summary.json")
  wpr=$(awk -v w="$wall" -v r="$r" 'BEGIN { printf "%.4f", w / r }')
  [ -n "$base_wall_per_rank" ] || base_wall_per_rank=$wpr
  [ -n "$base_rss" ] || base_rss=$rss
  awk -v r="$r" -v t="$tensors" -v w="$wall" -v u="$user" -v s="$sys" -v m="$rss" \
      -v wpr="$wpr" -v bw="$base_wall_per_rank" -v bm="$base_rss" \
      'BEGIN { printf "%-6s %10s %10.2f %10.2f %10.0f %12.2f %10.2f\n", r, t, w, u + s, m / 1024, wpr / bw, m / bm }'
done
