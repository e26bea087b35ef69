#!/usr/bin/env bash
# Benchmark of `probe compare` (not a test). Prints, in one run:
#   - tensor dump of SIZE_GB per side: probe's wall time, the time to `cat` both dumps to
#     /dev/null (page-cached), their ratio, GB/s of dump read, peak RSS;
#   - start-up time (`probe --version`);
#   - statistics-only dump of STATS_TENSORS tensors: compare time including the xlsx, with
#     the structural aligner and with `--align name`, and their ratio (alignment cost); and
#     with `--reference` (a third run read, aligned and measured: issue 48's goal <= 1.6x).
#   Tensor figures are the best of RUNS (3) runs each, with CPU time (user + sys, from
#   /usr/bin/time) next to wall time: on a shared machine CPU time is the steadier measure.
# Usage: bash bench/compare_bench.sh            (SIZE_GB=2 STATS_TENSORS=100000 RUNS=3 by default)
#        SKIP_STATS=1 bash bench/compare_bench.sh   (the tensor dump and start-up only)
#        PROBE_BIN=/path/to/other/probe bash bench/compare_bench.sh   (measure another build)
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_GB=${SIZE_GB:-2}
STATS_TENSORS=${STATS_TENSORS:-100000}
WORK=${BENCH_DIR:-/tmp/probe-bench}
mkdir -p "$WORK"
source bench/probe_bin.sh
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
# Wall and CPU time (user + sys) of a command, best of RUNS: "wall cpu maxrss_kb" with the
# fastest wall and the smallest CPU (each the least disturbed by other jobs on the machine).
RUNS=${RUNS:-3}
timed() {
  /usr/bin/time -f "%e %U %S %M" -o "$WORK/time.txt" "$@" > /dev/null || true
  awk '{ printf "%s %.2f %s\n", $1, $2 + $3, $4 }' "$WORK/time.txt"
}
best_of() {
  for _ in $(seq "$RUNS"); do timed "$@"; done |
    awk 'NR == 1 || $1 < w { w = $1 } NR == 1 || $2 < c { c = $2 } $3 > m { m = $3 }
         END { printf "%s %s %s\n", w, c, m }'
}
# Warm the page cache, then time cat: the cost of just reading the bytes.
FILES=("$WORK"/tensor/{bench,cmp}/step0/rank0/*.safetensors)
cat "${FILES[@]}" > /dev/null
read -r CAT CAT_CPU _ < <(best_of cat "${FILES[@]}")
CMP=("$P" compare -q -b "$WORK/tensor/bench" -c "$WORK/tensor/cmp" -o "$WORK/out")
timed "${CMP[@]}" --format json > /dev/null  # warm
read -r PROBE PROBE_CPU RSS_KB < <(best_of "${CMP[@]}" --format json)
read -r PROBE_ALL _ RSS_ALL_KB < <(RUNS=1 best_of "${CMP[@]}")
gbs() { awk -v b="$BYTES" -v t="$1" 'BEGIN { printf "%.2f", (t > 0 ? b / t / 1e9 : 0) }'; }
div() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
GBS=$(gbs "$PROBE"); CAT_GBS=$(gbs "$CAT")
CORE_GBS=$(gbs "$PROBE_CPU"); CAT_CORE_GBS=$(gbs "$CAT_CPU")
RATIO=$(div "$PROBE" "$CAT"); SPEED=$(div "$CAT" "$PROBE"); CPU_RATIO=$(div "$PROBE_CPU" "$CAT_CPU")

t0=$(now); for _ in $(seq 20); do "$P" --version > /dev/null; done; t1=$(now)
START_MS=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", (b - a) * 1000 / 20 }')

if [ -z "${SKIP_STATS:-}" ]; then
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
# A reference run: the same benchmark (same seed), other noise on the comparison side.
if [ ! -f "$WORK/stats-ref/cmp/step0/rank0/ops.jsonl" ] || [ "$(cat "$WORK/stats-ref/.count" 2>/dev/null)" != "$STATS_TENSORS" ]; then
  rm -rf "$WORK/stats-ref"
  "$P" synth -o "$WORK/stats-ref" --mode statistics --bulk "$STATS_TENSORS" --bulk-elems 64 --noise 2e-6 2>/dev/null
  echo "$STATS_TENSORS" > "$WORK/stats-ref/.count"
fi
read -r REF_T REF_RSS < <(for _ in 1 2 3; do stats_run --reference "$WORK/stats-ref/cmp"; done | best)
REF_RT=$(awk -v a="$REF_T" -v b="$STATS_T" 'BEGIN { printf "%.2f", a / b }')
REF_RRSS=$(awk -v a="$REF_RSS" -v b="$STATS_RSS" 'BEGIN { printf "%.2f", a / b }')
fi

echo "probe compare benchmark ($(nproc) cores, $(uname -m))"
echo "tensor dump: $(awk -v b="$BYTES" 'BEGIN { printf "%.2f", b / 1e9 }') GB read (both sides, page-cached), $COUNT tensor pairs of 64 MiB"
echo "  (best of $RUNS; CPU = user + sys; per-core GB/s = bytes / CPU seconds)"
echo "  cat both dumps > /dev/null : ${CAT} s  (${CAT_GBS} GB/s)  CPU ${CAT_CPU} s  (${CAT_CORE_GBS} GB/s per core)"
echo "  probe compare, json only    : ${PROBE} s  (${GBS} GB/s)  CPU ${PROBE_CPU} s  (${CORE_GBS} GB/s per core)  peak RSS $((RSS_KB / 1024)) MB"
echo "  probe compare, all reports  : ${PROBE_ALL} s  peak RSS $((RSS_ALL_KB / 1024)) MB"
echo "  wall probe / cat            : ${RATIO}  (speed ${SPEED}x cat's; goal >= 0.8x)"
echo "  CPU  probe / cat            : ${CPU_RATIO}  (goal <= 2x)"
echo "start-up (probe --version)    : ${START_MS} ms"
[ -n "${SKIP_STATS:-}" ] && exit 0
echo "statistics dump, $STATS_TENSORS tensors, json+parquet+xlsx: ${STATS_T} s  peak RSS $((STATS_RSS / 1024)) MB"
echo "  same with --align name      : ${NAME_T} s  peak RSS $((NAME_RSS / 1024)) MB"
echo "  structural / name           : time ${ALIGN_T}x  peak RSS ${ALIGN_RSS}x  (goal <= 1.2x)"
echo "  same with --reference       : ${REF_T} s  peak RSS $((REF_RSS / 1024)) MB"
echo "  --reference / plain         : time ${REF_RT}x  peak RSS ${REF_RRSS}x  (goal <= 1.6x)"
