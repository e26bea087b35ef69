#!/usr/bin/env bash
# Regenerates the bundled demo pair: a synthetic 3-block residual MLP, forward and backward,
# in probe dump format v1 (tensor mode). The comparison run has a 5 % perturbation injected
# into the output of Functional.gelu.1 — the op `probe compare` must name.
# tests/compare_cli.rs checks that the committed files equal a fresh run of this script.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf testdata/demo
cargo run -q -- synth -o testdata/demo --inject Functional.gelu.1 --blocks 3 --width 16 --batch 4 --seed 1234
