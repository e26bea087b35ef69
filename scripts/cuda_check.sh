#!/usr/bin/env bash
# The checks that need a GPU (CI has none): run the capture agent on CUDA and read the
# dumps with the release binary, run the CUDA tests, time capture on CUDA. Prints one line
# per check; writes logs under $OUT if set.
#   bash scripts/cuda_check.sh [monitor|replay]  (needs torch with CUDA, target/release/probe;
#                                          "monitor"/"replay": those checks alone)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
P="${PROBE_BIN:-$PWD/target/release/probe}"
PY="${PYTHON:-python3}"
T="$(mktemp -d)"
LOG="${OUT:-$T}"
"$PY" -c "import torch; assert torch.cuda.is_available(); print('torch', torch.__version__, torch.cuda.get_device_name())" || exit 2
ex() { "$PY" examples/train_small.py --quiet "$@" >>"$LOG/examples.log" 2>&1; }
check() { # name, expected exit, command... (prints the first line that is no warning)
  local name=$1 want=$2; shift 2
  "$@" >"$LOG/$name.out" 2>&1; local rc=$?
  local verdict=ok; [ "$rc" = "$want" ] || verdict=UNEXPECTED; [ "$want" = any ] && verdict=info
  printf '%-40s exit %s (want %s) %s | %s\n' "$name" "$rc" "$want" "$verdict" "$(grep -v '^probe: warning' "$LOG/$name.out" | head -1)"
}
capture_checks() {
for mode in statistics tensor; do
  ex --device cuda --dump "$T/cuda_$mode" --mode "$mode" --level mix
  ex --device cuda --dump "$T/cuda2_$mode" --mode "$mode" --level mix
  ex --device cuda --dump "$T/inj_$mode" --mode "$mode" --level mix --inject Functional.gelu.0
  ex --device cpu --dump "$T/cpu_$mode" --mode "$mode" --level mix
  check "cuda-vs-cuda-$mode" 0 "$P" compare -q -b "$T/cuda_$mode" -c "$T/cuda2_$mode" -o "$T/o1_$mode"
  check "cuda-inject-gelu-$mode" 1 "$P" compare -b "$T/cuda_$mode" -c "$T/inj_$mode" -o "$T/o2_$mode"
  check "cpu-vs-cuda-$mode" any "$P" compare -b "$T/cpu_$mode" -c "$T/cuda_$mode" -o "$T/o3_$mode"
done
# A port without bfloat16: float16 with AMP's GradScaler (its fused CUDA unscale kernel)
# against bfloat16: the loss scale is found and compared away, the scaler's own calls are
# not missing, a GELU fault is named. (On an H100 the pair without a fault names
# Functional.conv2d.0.backward: cuDNN's half-precision weight gradient of the first conv is
# 4-5 % off float32 in both dtypes; docs/performance.md, "On a GPU".)
ex --device cuda --dump "$T/bf16" --dtype bfloat16
ex --device cuda --dump "$T/fp16" --dtype float16
ex --device cuda --dump "$T/fp16_gelu" --dtype float16 --inject Functional.gelu.0 --inject-rel 0.3
check "cuda-bf16-vs-fp16-scaler" any "$P" compare -b "$T/bf16" -c "$T/fp16" -o "$T/o4"
check "cuda-bf16-vs-fp16-scaler-gelu" 1 "$P" compare -b "$T/bf16" -c "$T/fp16_gelu" -o "$T/o5"
ex --device cuda --dump "$T/inf" --inject-inf Functional.gelu.0
check "cuda-scan-inf" 1 "$P" scan "$T/inf" -o "$T/s1"
ex --device cuda --dump "$T/ovf" --mode overflow --inject-nan Functional.gelu.0
check "cuda-overflow-mode-nan" 1 "$P" scan "$T/ovf" -o "$T/s2"
ex --device cuda --dump "$T/ovf_clean" --mode overflow
check "cuda-overflow-mode-clean" 0 "$P" scan "$T/ovf_clean" -o "$T/s3"
# DDP on CUDA: two ranks on this GPU over gloo (nccl needs a GPU per rank); DDP's gradient
# hooks and comm hook run on autograd's device thread. A rerun passes; a faulty op on rank 1
# and a garbled bucket all-reduce on rank 1 are named.
ddp() { timeout 300 "$PY" -m torch.distributed.run --standalone --nproc_per_node 2 \
  examples/train_ddp.py --quiet --level mix --device cuda "$@" >>"$LOG/examples.log" 2>&1; }
ddp --dump "$T/ddp"
ddp --dump "$T/ddp2"
ddp --dump "$T/ddp_op" --inject Functional.gelu.0 --inject-rank 1
ddp --dump "$T/ddp_coll" --inject-collective ddp_bucket_allreduce --inject-rank 1
check "cuda-ddp-vs-rerun" 0 "$P" compare -q -b "$T/ddp" -c "$T/ddp2" -o "$T/o6"
check "cuda-ddp-inject-gelu-rank1" 1 "$P" compare -b "$T/ddp" -c "$T/ddp_op" -o "$T/o7"
check "cuda-ddp-garbled-allreduce-rank1" 1 "$P" compare -b "$T/ddp" -c "$T/ddp_coll" -o "$T/o8"
# The fused statistics kernel against float64, and capture with PyTorch's sync debugging
# set to raise (statistics and tensor mode: no host sync inside a step).
check "cuda-tests" 0 "$PY" -m pytest -q -p no:cacheprovider python/tests/test_cuda.py
"$PY" bench/capture_overhead.py --device cuda --steps 10 2>&1 | tee "$LOG/capture_overhead_cuda.txt" | tail -20
"$PY" bench/capture_overhead.py --device cuda --model transformer --modes statistics,tensor \
  --levels mix --steps 4 2>&1 | tee "$LOG/capture_overhead_cuda_transformer.txt" | tail -12
# The same with Adam's per-tensor loop forced (400 captured calls a step; PyTorch's default on
# CUDA is the multi-tensor optimizer, whose _foreach_ ops are hooked too, a call per op over
# every parameter): the runs before 2026-11-25 measured this.
"$PY" bench/capture_overhead.py --device cuda --model transformer --modes statistics --levels mix \
  --steps 4 --optimizer-loop 2>&1 | tee "$LOG/capture_overhead_cuda_transformer_loop.txt" | tail -12
}
case "${1:-all}" in monitor|replay) ;; *) capture_checks ;; esac
# Replay on CUDA (issue 50): CPU dumps of train_small, a GELU fault in the comparison run;
# replayed on the GPU with the fault installed by a prelude (reproduces, its repro.py too)
# and without it (the difference came from outside: does not reproduce).
replay_checks() {
ex --device cpu --dump "$T/rb" --mode tensor --steps 1 --level mix
ex --device cpu --dump "$T/rc" --mode tensor --steps 1 --level mix --inject Functional.gelu.0 --inject-rel 0.03
printf 'import torch.nn.functional as F\n_g = F.gelu\nF.gelu = lambda x, approximate="none": _g(x, approximate=approximate) * 1.05\n' >"$T/fault.py"
check "cuda-replay-fault" 1 "$P" replay -b "$T/rb" -c "$T/rc" -o "$T/r1" --device cuda --prelude "$T/fault.py" --python "$PY"
check "cuda-replay-no-fault" 0 "$P" replay -b "$T/rb" -c "$T/rc" -o "$T/r2" --device cuda --python "$PY"
check "cuda-replay-repro" 1 "$PY" "$T/r1/Functional.gelu.0.forward/repro.py" --device cuda --prelude "$T/fault.py"
}
case "${1:-all}" in monitor) ;; *) replay_checks ;; esac
[ "${1:-all}" = replay ] && exit 0
# The monitor on CUDA (issue 49): its values against the model's own on the GPU (the device
# NaN/Inf counts and the asynchronous copy), two runs' curves with a GELU fault from step 40
# (named at step 40), a rerun (CUDA kernels may not be bitwise deterministic: shown, not
# judged), and its cost at batch 8 (goal <= 1.05x a bare step).
check "cuda-monitor-tests" 0 "$PY" -m pytest -q -p no:cacheprovider python/tests/test_monitor.py python/tests/test_flight_recorder.py -k "cuda"
ex --device cuda --no-dump --steps 80 --monitor "$T/mon_a"
ex --device cuda --no-dump --steps 80 --monitor "$T/mon_b"
ex --device cuda --no-dump --steps 80 --monitor "$T/mon_f" --inject Functional.gelu.0 --inject-from-step 40
check "cuda-monitor-rerun" any "$P" compare -b "$T/mon_a" -c "$T/mon_b" -o "$T/m1"
check "cuda-monitor-gelu-from-40" 1 "$P" compare -b "$T/mon_a" -c "$T/mon_f" -o "$T/m2"
"$PY" bench/monitor_bench.py --device cuda --blocks 100 --block-steps 4 --disk-steps 10 2>&1 \
  | tee "$LOG/monitor_bench_cuda.txt"
