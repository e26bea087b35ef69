#!/usr/bin/env bash
# Benchmark of sharding (not a test). Prints, in one run, for a RANKS-rank synthetic
# statistics dump (STEPS steps, one op perturbed on rank 1):
#   - the unsharded compare: wall, CPU (user+sys) and peak RSS;
#   - SHARDS shards (`--shard i/N`, run one after another) and `probe merge`: each one's
#     wall, CPU and peak RSS, their total CPU, and the ratio to the unsharded CPU
#     (goal <= 1.1x: sharding costs only the shard results' write and read);
#   - the same ratio over ROUNDS rounds (default 3) and its median;
#   - whether the merged summary.json equals the unsharded one (apart from output paths).
# All reports are written (json, parquet, xlsx), as a user's run would.
# Usage: bash bench/shard_bench.sh      (RANKS=64 STEPS=2 BLOCKS=8 WIDTH=32 SHARDS=4 MODE=statistics
#                                        ROUNDS=3 by default; MODE=tensor compares full tensors)
#        PROBE_BIN=/path/to/other/probe bash bench/shard_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${RANKS:-64}
STEPS=${STEPS:-2}
BLOCKS=${BLOCKS:-8}
WIDTH=${WIDTH:-32}
SHARDS=${SHARDS:-4}
MODE=${MODE:-statistics}
ROUNDS=${ROUNDS:-3}
WORK=${BENCH_DIR:-/tmp/probe-bench-shard}
source bench/probe_bin.sh
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK"
"$P" synth -o . --mode "$MODE" --ranks "$RANKS" --steps "$STEPS" --blocks "$BLOCKS" \
  --width "$WIDTH" --perturb-rank 1 --perturb-op Functional.gelu.1 2>/dev/null
TENSORS=$(cat bench/step*/rank*/ops.jsonl | grep -o '"name"' | wc -l)
# wall user sys maxrss_kb
measure() { /usr/bin/time -f "%e %U %S %M" -o time.txt "$@" > /dev/null 2>&1 || true; tail -1 time.txt; }
cpu() { awk '{ printf "%.2f", $2 + $3 }' <<< "$1"; }
row() { awk -v n="$1" '{ printf "%-22s wall %6.2f s   cpu %6.2f s   peak RSS %6.0f MB\n", n, $1, $2 + $3, $4 / 1024 }' <<< "$2"; }
measure "$P" compare -q -b bench -c cmp -o warm > /dev/null  # warm the page cache
echo "dump: $RANKS ranks x $STEPS steps, $TENSORS tensor records per side ($MODE)"
# ROUNDS rounds, each the unsharded compare then the shards and the merge back to back: a
# single pair of figures on a shared machine can be off by half; the median ratio is not.
RATIOS=()
for ((r = 1; r <= ROUNDS; r++)); do
  rm -rf full merged s[0-9]*
  FULL=$(measure "$P" compare -q -b bench -c cmp -o full)
  [ "$r" -gt 1 ] || row "unsharded" "$FULL"
  TOTAL=0
  for ((i = 0; i < SHARDS; i++)); do
    T=$(measure "$P" compare -q -b bench -c cmp -o "s$i" --shard "$i/$SHARDS")
    [ "$r" -gt 1 ] || row "shard $i/$SHARDS" "$T"
    TOTAL=$(awk -v a="$TOTAL" -v b="$(cpu "$T")" 'BEGIN { printf "%.2f", a + b }')
  done
  SHARD_DIRS=()
  for ((i = 0; i < SHARDS; i++)); do SHARD_DIRS+=("s$i"); done
  M=$(measure "$P" merge -q -o merged "${SHARD_DIRS[@]}")
  [ "$r" -gt 1 ] || row "merge" "$M"
  TOTAL=$(awk -v a="$TOTAL" -v b="$(cpu "$M")" 'BEGIN { printf "%.2f", a + b }')
  RATIO=$(awk -v a="$TOTAL" -v b="$(cpu "$FULL")" 'BEGIN { printf "%.2f", a / b }')
  RATIOS+=("$RATIO")
  echo "round $r: unsharded CPU $(cpu "$FULL") s; $SHARDS shards + merge $TOTAL s = ${RATIO}x"
done
MEDIAN=$(printf "%s\n" "${RATIOS[@]}" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
echo "total CPU, $SHARDS shards + merge: median ${MEDIAN}x the unsharded compare over $ROUNDS rounds (${RATIOS[*]}; goal <= 1.1x)"
if diff <(sed 's|"full/|"OUT/|' full/summary.json) <(sed 's|"merged/|"OUT/|' merged/summary.json) > /dev/null; then
  echo "merged summary.json equals the unsharded one (apart from output paths)"
else
  echo "merged summary.json DIFFERS from the unsharded one" >&2
  exit 1
fi
