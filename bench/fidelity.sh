#!/usr/bin/env bash
# bench/fidelity.sh: how well the simulator predicts compute on a real GPU
# (issue 9). Needs a CUDA build of soap-profile and one H100 or H200.
#   bench/fidelity.sh profile   measure what the runs below need into the
#                               profile (only signatures it lacks)
#   bench/fidelity.sh single    every model whole on one GPU: the simulator's
#                               compute per iteration (profiled and analytic)
#                               against the replayed kernels
#   bench/fidelity.sh multi     5 plans per model on 8 devices (data, model,
#                               expert, kcuts, mcmc): every device's compute
#                               tasks replayed on the one GPU in turn; task
#                               error and whether the plans are ordered alike
#   bench/fidelity.sh table     print the table, write bench/results/fidelity.json
#   bench/fidelity.sh all       the four in order
# Knobs (environment): GPU=h100|h200, BIN=build/bin, BATCH=64 (single),
# MODELS, MULTI_MODELS, TIME_LIMIT=0 (seconds per profiling call),
# REPEATS=25, WARMUP=5, OUT=bench/results/fidelity. Nothing here asserts a
# time: it prints a table and writes JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-build/bin}
gpu=${GPU:-h100}
case "$gpu" in
  h100) profile=profiles/h100-sxm.json
        multi_topo=examples/topologies/dgx-h100-1.json ;;
  h200) profile=profiles/h200-sxm.json
        multi_topo=bench/fidelity-h200x8.json ;;
  *) echo "fidelity.sh: GPU must be h100 or h200, got '$gpu'" >&2; exit 2 ;;
esac
one_topo=bench/fidelity-${gpu}x1.json
models=${MODELS:-lenet mlp alexnet vgg16 resnet101 wide_resnet101_2 inception_v3 rnntc rnnlm nmt transformer gpt2}
multi_models=${MULTI_MODELS:-alexnet resnet101 inception_v3 rnntc transformer}
batch=${BATCH:-64}
limit=${TIME_LIMIT:-0}
repeats=${REPEATS:-25}
warmup=${WARMUP:-5}
out=${OUT:-bench/results/fidelity}
mkdir -p "$out" profiles
timing=(--warmup "$warmup" --repeats "$repeats")

stage_profile() {
  for m in $models; do
    echo "== profile $m: whole, batch $batch"
    "$bin/soap-profile" "examples/models/$m.onnx" --topology "$one_topo" \
      --devices 1 --batch "$batch" --time-limit "$limit" "${timing[@]}" \
      -o "$profile" || echo "fidelity.sh: profiling $m failed" >&2
  done
  for m in $multi_models; do
    echo "== profile $m: 8 devices, batch 512"
    "$bin/soap-profile" "examples/models/$m.onnx" --topology "$multi_topo" \
      --devices 8 --time-limit "$limit" "${timing[@]}" -o "$profile" ||
      echo "fidelity.sh: profiling $m failed" >&2
  done
}

stage_single() {
  for m in $models; do
    plan="$out/$m-1gpu.plan.json"
    "$bin/soapc" "examples/models/$m.onnx" --topology "$one_topo" \
      --search data --batch "$batch" --profile "$profile" -o "$plan" >/dev/null
    echo "== replay $m whole on one GPU"
    "$bin/soap-profile" --replay "$plan" --profile "$profile" "${timing[@]}" \
      --tasks -o "$out/$m-1gpu.json" ||
      echo "fidelity.sh: replaying $m failed" >&2
  done
}

stage_multi() {
  for m in $multi_models; do
    plans=()
    for s in data model expert kcuts mcmc; do
      plan="$out/$m-8dev-$s.plan.json"
      "$bin/soapc" "examples/models/$m.onnx" --topology "$multi_topo" \
        --search "$s" --budget 2000 --seed 0 --profile "$profile" \
        -o "$plan" >/dev/null
      plans+=("$plan")
    done
    echo "== replay 5 plans of $m on 8 devices"
    "$bin/soap-profile" --replay "${plans[@]}" --profile "$profile" \
      "${timing[@]}" --tasks -o "$out/$m-8dev.json" ||
      echo "fidelity.sh: replaying $m failed" >&2
  done
}

stage_table() {
  python3 bench/fidelity_table.py "$out" bench/results/fidelity.json
}

case "${1:-all}" in
  profile) stage_profile ;;
  single) stage_single ;;
  multi) stage_multi ;;
  table) stage_table ;;
  all) stage_profile; stage_single; stage_multi; stage_table ;;
  *) echo "usage: $0 [profile|single|multi|table|all]" >&2; exit 2 ;;
esac
