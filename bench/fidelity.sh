#!/usr/bin/env bash
# bench/fidelity.sh: how well the simulator predicts compute on a real GPU
#. Needs a CUDA build of soap-profile and one H100 or H200.
#   bench/fidelity.sh plans     the plans compared: every model whole on one
#                               GPU (a data plan on one device), and 5 plans
#                               per MULTI_MODELS model on 8 devices (data,
#                               model, expert, kcuts, mcmc)
#   bench/fidelity.sh profile   measure the plans' compute tiles into the
#                               profile (only signatures it lacks; all of
#                               them with REMEASURE=1); the plans include
#                               GPT-3's megatron plans (bf16), profiled only
#   bench/fidelity.sh single    one GPU: the simulator's compute per
#                               iteration (profiled and analytic) against the
#                               replayed kernels
#   bench/fidelity.sh multi     8 devices: every device's compute tasks
#                               replayed on the one GPU in turn; task error
#                               and whether the plans are ordered alike
#   bench/fidelity.sh exec      soap-run each EXEC_MODELS model whole on the
#                               GPU (--backend cuda) and on the CPU, 2 steps:
#                               numerics compared, step times logged
#   bench/fidelity.sh iter      one GPU: each model's whole training iteration
#                               run by PyTorch (bench/fidelity-iter.py measure,
#                               of the plans that the plans stage made with
#                               bench/fidelity-iter.py plans)
#   bench/fidelity.sh table     print the tables, write bench/results/fidelity.json
#   bench/fidelity.sh all       plans, profile, single, multi, table
#   bench/fidelity.sh space     (not in all) the configuration spaces of the
#                               zoo on 8 and 16 devices, TIME_LIMIT seconds
#                               per model, for profiles/<device>.json
# Knobs (environment): GPU=h100|h200, BIN=build/bin, BATCH=64 (one GPU),
# MODELS, MULTI_MODELS, GPT3_MODELS, ITER_MODELS (model:batch,..), ITER_ONLY,
# ITER_REPEATS=10, ITER_WARMUP=3, PROFILE_PLANS (a glob; default every
# plan), TIME_LIMIT=600, REPEATS=25, WARMUP=5,
# REMEASURE,
# OUT=bench/results/fidelity. Nothing here asserts a time: it prints tables
# and writes JSON.
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
multi_models=${MULTI_MODELS:-alexnet resnet101 inception_v3 rnntc nmt}
batch=${BATCH:-64}
limit=${TIME_LIMIT:-600}
repeats=${REPEATS:-25}
warmup=${WARMUP:-5}
out=${OUT:-bench/results/fidelity}
mkdir -p "$out" profiles
timing=(--warmup "$warmup" --repeats "$repeats")

# Plans are searched with the profile once it exists.
with_profile() { [ -f "$profile" ] && echo --profile "$profile"; }

stage_plans() {
  for m in $models; do
    "$bin/soapc" "examples/models/$m.onnx" --topology "$one_topo" \
      --search data --batch "$batch" $(with_profile) \
      -o "$out/$m-1gpu.plan.json" >/dev/null ||
      echo "fidelity.sh: no one-GPU plan for $m" >&2
  done
  python3 bench/fidelity-iter.py plans --dir "$out" --gpu "$gpu" --bin "$bin" \
    ${ITER_MODELS:+--models "$ITER_MODELS"}
  for m in $multi_models; do
    for s in data model expert kcuts mcmc; do
      "$bin/soapc" "examples/models/$m.onnx" --topology "$multi_topo" \
        --search "$s" --budget 2000 --seed 0 $(with_profile) \
        -o "$out/$m-8dev-$s.plan.json" >/dev/null ||
        echo "fidelity.sh: no $s plan for $m" >&2
    done
  done
  # GPT-3's bf16 tiles (Adam, batch 1,024 sequences, the megatron plan of
  # bench/gpt3.py's clusters; on an H200, of its 8-GPU node, since a profile
  # holds one device type): profiled, not replayed (an iteration is seconds
  # per device). A cluster is examples/topologies/T.json or bench/T.json.
  local gpt3=${GPT3_MODELS:-gpt3_1_3b:dgx-h100-1 gpt3_6_7b:dgx-h100-8 gpt3_13b:dgx-h100-8}
  [ "$gpu" = h200 ] &&
    gpt3=${GPT3_MODELS:-gpt3_1_3b:fidelity-h200x8 gpt3_6_7b:fidelity-h200x8 gpt3_13b:fidelity-h200x8}
  for spec in $gpt3; do
    m=${spec%%:*} t=examples/topologies/${spec##*:}.json
    [ -f "$t" ] || t=bench/${spec##*:}.json
    "$bin/soapc" "examples/models/$m.onnx" --topology "$t" \
      --search megatron --batch 1024 --precision bf16 --optimizer adam \
      --timeout 5m $(with_profile) -o "$out/$m-megatron.plan.json" >/dev/null ||
      echo "fidelity.sh: no megatron plan for $m" >&2
  done
  ls "$out"/*.plan.json | wc -l
}

stage_profile() {
  # shellcheck disable=SC2086 # PROFILE_PLANS is a glob
  "$bin/soap-profile" --from-plans ${PROFILE_PLANS:-"$out"/*.plan.json} --time-limit "$limit" \
    "${timing[@]}" ${REMEASURE:+--remeasure} -o "$profile"
}

stage_space() {
  for m in $models; do
    echo "== profile the space of $m on 8 and 16 devices"
    "$bin/soap-profile" "examples/models/$m.onnx" --topology "$multi_topo" \
      --devices 8,16 --time-limit "$limit" "${timing[@]}" -o "$profile" ||
      echo "fidelity.sh: profiling $m failed" >&2
  done
}

stage_single() {
  for m in $models; do
    if [ ! -f "$out/$m-1gpu.plan.json" ]; then
      echo "== $m: no one-GPU plan (plans: it does not fit one GPU at batch $batch)"
      continue
    fi
    echo "== replay $m whole on one GPU"
    "$bin/soap-profile" --replay "$out/$m-1gpu.plan.json" $(with_profile) \
      "${timing[@]}" --tasks -o "$out/$m-1gpu.json" ||
      echo "fidelity.sh: replaying $m failed" >&2
  done
}

stage_multi() {
  for m in $multi_models; do
    echo "== replay 5 plans of $m on 8 devices"
    "$bin/soap-profile" --replay "$out/$m"-8dev-*.plan.json $(with_profile) \
      "${timing[@]}" --tasks -o "$out/$m-8dev.json" ||
      echo "fidelity.sh: replaying $m failed" >&2
  done
}

# soap-run on the GPU against its CPU backend: the same one-GPU data plan,
# seed and 2 steps; compare.py's verdict and both runs' step times into
# $out/exec.log (one "exec MODEL BATCH ..." line per model). Where the two
# differ past 1e-5 and python3 has PyTorch, float64 and float32 PyTorch runs
# of the same model, weights, inputs and masks decide (compare.py
# --exact-ref/--float32-ref, as bench/exec-all.py): the CUDA run matches when
# it is no further from float64 than float32's own spread allows.
stage_exec() {
  local spec m b dir verdict ref=test/cli/exec/Inputs
  for spec in ${EXEC_MODELS:-lenet:8 mlp:8 alexnet:8 resnet101:4 inception_v3:4 vgg16:4 rnntc:8 rnnlm:8 nmt:4 transformer_small:8 gpt2:1}; do
    m=${spec%%:*} b=${spec##*:} dir=$out/exec-$m
    rm -rf "$dir" && mkdir -p "$dir"
    "$bin/soapc" "examples/models/$m.onnx" --topology "$one_topo" --search data \
      --batch "$b" -o "$dir/plan.json" >/dev/null || { echo "exec $m $b noplan"; continue; }
    for be in cpu cuda; do
      timeout "${EXEC_TIMEOUT:-90}" "$bin/soap-run" "examples/models/$m.onnx" \
        "$dir/plan.json" --steps 2 --seed 7 --backend "$be" \
        --dump-weights "$dir/w-$be" > "$dir/$be.out" 2> "$dir/$be.err" ||
        echo "exec $m $b $be failed: $(tail -c 300 "$dir/$be.err")"
    done
    verdict=$(python3 $ref/compare.py "$dir/cpu.out" "$dir/w-cpu" \
      "$dir/cuda.out" "$dir/w-cuda" 2>&1 | tail -1 || true)
    case "$verdict" in
      MATCH*) ;;
      *) if python3 $ref/torch_reference.py --write "$m" 7 "$b" 2 1 \
              "$dir/t64.out" "$dir/w-t64" > /dev/null 2>&1 &&
            python3 $ref/torch_reference.py --write --float32 "$m" 7 "$b" 2 1 \
              "$dir/t32.out" "$dir/w-t32" > /dev/null 2>&1; then
           verdict="$verdict; against float64: $(python3 $ref/compare.py \
             --exact-ref "$dir/t64.out" "$dir/w-t64" \
             --float32-ref "$dir/t32.out" "$dir/w-t32" \
             "$dir/cpu.out" "$dir/w-cpu" "$dir/cuda.out" "$dir/w-cuda" 2>&1 | tail -1)"
         else verdict="$verdict; no PyTorch reference"; fi ;;
    esac
    echo "exec $m $b cpu $(grep -o 'time [0-9.e+-]*' "$dir/cpu.out" | tr '\n' ' ')" \
      "cuda $(grep -o 'time [0-9.e+-]*' "$dir/cuda.out" | tr '\n' ' ')" "$verdict"
    rm -rf "$dir"/w-*
  done | tee "$out/exec.log"
}

stage_iter() {
  python3 bench/fidelity-iter.py measure --dir "$out" --repeats "${ITER_REPEATS:-10}" \
    --warmup "${ITER_WARMUP:-3}" ${ITER_ONLY:+--only "$ITER_ONLY"}
}

stage_table() {
  python3 bench/fidelity_table.py "$out" bench/results/fidelity.json
}

case "${1:-all}" in
  plans) stage_plans ;;
  profile) stage_profile ;;
  space) stage_space ;;
  single) stage_single ;;
  multi) stage_multi ;;
  table) stage_table ;;
  exec) stage_exec ;;
  iter) stage_iter ;;
  all) stage_plans; stage_profile; stage_single; stage_multi; stage_table ;;
  *) echo "usage: $0 [plans|profile|single|multi|exec|iter|table|all|space]" >&2; exit 2 ;;
esac
