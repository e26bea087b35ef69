#!/usr/bin/env bash
# Benchmark of `probe compare` (not a test). Prints, in one run:
#   - tensor dump of SIZE_GB per side: probe's wall time, the time to `cat` both dumps to
#     /dev/null (page-cached), their ratio, GB/s of dump read, peak RSS;
#   - start-up time (`probe --version`);
#   - statistics-only dump of STATS_TENSORS tensors: compare time including the xlsx, with
#     the structural aligner and with `--align name`, and their ratio (alignment cost).
# Usage: bash bench/compare_bench.sh            (SIZE_GB=2 STATS_TENSORS=100000 by default)
#        PROBE_BIN=/path/to/other/probe bash bench/compare_bench.sh   (measure another build)
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_GB=${SIZE_GB:-2}
STATS_TENSORS=${STATS_TENSORS:-100000}
WORK=${BENCH_DIR:-/tmp/probe-bench}
mkdir -p "$WORK"
if [ -n "${PROBE_BIN:-}" ]; then
  P="$PROBE_BIN"
else
  cargo build --release --quiet
  P="$PWD/target/release/probe"
fi
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

ELEMS=$((16 * 1024 * 1024))                  # 64 MiB per f32 tensor
COUNT=$((SIZE_GB * 1024 / 64))
if [ ! -f "$WORK/tensor/cmp/step0/rank0/ops.jsonl" ] || [ "$(cat "$WORK/tensor/.count" 2>/dev/null)" != "$COUNT" ]; then
  echo "generating $COUNT tensors x 64 MiB per side in $WORK/tensor ..." >&2
  rm -rf "$WORK/tensor"
  "$P" synth -o "$WORK/tensor" --bulk "$COUNT" --bulk-elems "$ELEMS" --noise 1e-6 2>/dev/null
  echo "$COUNT" > "$WORK/tensor/.count"
fi
BYTES=$(du -cb "$WORK"/tensor/{bench,cmp}/step0/rank0/*.safetensors | tail -1 | cut -f1)
# Warm the page cache, then time cat.
cat "$WORK"/tensor/{bench,cmp}/step0/rank0/*.safetensors > /dev/null
t0=$(now); cat "$WORK"/tensor/{bench,cmp}/step0/rank0/*.safetensors > /dev/null; t1=$(now)
CAT=$(elapsed "$t0" "$t1")
run_probe() {
  /usr/bin/time -f "%e %M" -o "$WORK/time.txt" "$P" compare -q -b "$WORK/tensor/bench" -c "$WORK/tensor/cmp" -o "$WORK/out" "$@" || true
  cat "$WORK/time.txt"
}
run_probe --format json > /dev/null  # warm
read -r PROBE RSS_KB < <(run_probe --format json)
read -r PROBE_ALL RSS_ALL_KB < <(run_probe)
GBS=$(awk -v b="$BYTES" -v t="$PROBE" 'BEGIN { printf "%.2f", b / t / 1e9 }')
CAT_GBS=$(awk -v b="$BYTES" -v t="$CAT" 'BEGIN { printf "%.2f", b / t / 1e9 }')
RATIO=$(awk -v p="$PROBE" -v c="$CAT" 'BEGIN { printf "%.2f", p / c }')

t0=$(now); for _ in $(seq 20); do "$P" --version > /dev/null; done; t1=$(now)
START_MS=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", (b - a) * 1000 / 20 }')

if [ ! -f "$WORK/stats/cmp/step0/rank0/ops.jsonl" ] || [ "$(cat "$WORK/stats/.count" 2>/dev/null)" != "$STATS_TENSORS" ]; then
  rm -rf "$WORK/stats"
  "$P" synth -o "$WORK/stats" --mode statistics --bulk "$STATS_TENSORS" --bulk-elems 64 --noise 1e-6 2>/dev/null
  echo "$STATS_TENSORS" > "$WORK/stats/.count"
fi
stats_run() {
  /usr/bin/time -f "%e %M" -o "$WORK/time.txt" "$P" compare -q -b "$WORK/stats/bench" -c "$WORK/stats/cmp" -o "$WORK/out-stats" "$@" || true
  cat "$WORK/time.txt"
}
# Alignment cost: the structural aligner (default) against msprobe's pairing by name, same
# run, best of 3 each (the goal: within 1.2x in time and peak RSS).
best() { sort -n -k1,1 | head -1; }
read -r STATS_T STATS_RSS < <(for _ in 1 2 3; do stats_run; done | best)
read -r NAME_T NAME_RSS < <(for _ in 1 2 3; do stats_run --align name; done | best)
ALIGN_T=$(awk -v a="$STATS_T" -v b="$NAME_T" 'BEGIN { printf "%.2f", a / b }')
ALIGN_RSS=$(awk -v a="$STATS_RSS" -v b="$NAME_RSS" 'BEGIN { printf "%.2f", a / b }')

echo "probe compare benchmark ($(nproc) cores, $(uname -m))"
echo "tensor dump: $(awk -v b="$BYTES" 'BEGIN { printf "%.2f", b / 1e9 }') GB read (both sides, page-cached), $COUNT tensor pairs of 64 MiB"
echo "  cat both dumps > /dev/null : ${CAT} s  (${CAT_GBS} GB/s)"
echo "  probe compare, json only    : ${PROBE} s  (${GBS} GB/s)  peak RSS $((RSS_KB / 1024)) MB"
echo "  probe compare, all reports  : ${PROBE_ALL} s  peak RSS $((RSS_ALL_KB / 1024)) MB"
echo "  ratio probe / cat           : ${RATIO}"
echo "start-up (probe --version)    : ${START_MS} ms"
echo "statistics dump, $STATS_TENSORS tensors, json+parquet+xlsx: ${STATS_T} s  peak RSS $((STATS_RSS / 1024)) MB"
echo "  same with --align name      : ${NAME_T} s  peak RSS $((NAME_RSS / 1024)) MB"
echo "  structural / name           : time ${ALIGN_T}x  peak RSS ${ALIGN_RSS}x  (goal <= 1.2x)"
