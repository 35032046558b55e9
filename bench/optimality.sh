#!/usr/bin/env bash
# bench/optimality.sh: FlexFlow section 8.3 — exhaustive search against mcmc
# on small executions (4 devices and fewer): LeNet, FlexFlow's RNNLM
# restricted to 2 unrolled steps, and the MLP, on one P100 node of 2 and 4
# GPUs. For each: what exhaustive found in its budget (and whether it proved
# the optimum), then the smallest mcmc budget (250, 500, ... proposals) whose
# plan is as fast, with mcmc's search time. Writes bench/results/optimality.json.
#   bench/optimality.sh [EXHAUSTIVE_BUDGET]     (default 300s)
set -euo pipefail
cd "$(dirname "$0")/.."
soapc=${SOAPC:-build/bin/soapc}
budget=${1:-300s}
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# FlexFlow's RNNLM with 2 unrolled steps: the zoo's RNNLM class, sequence 2.
$py - "$work/rnnlm_2step.onnx" <<'PY'
import sys
sys.path.insert(0, "examples/models")
import export, onnx
export.MODELS["rnnlm_2step"] = (export.RNNLM, [("ids", ["N", 2], "int64")])
proto = export.export_proto("rnnlm_2step", batch=2)[0]
proto = onnx.shape_inference.infer_shapes(proto)
export.strip(proto)
onnx.save(proto, sys.argv[1])
PY
sed -e 's/"p100-1x4"/"p100-1x2"/' -e 's/"gpus": 4/"gpus": 2/' \
  examples/topologies/p100-1x4.json > "$work/p100-1x2.json"

rows=()
for topo in "$work/p100-1x2.json" examples/topologies/p100-1x4.json; do
  for model in examples/models/lenet.onnx "$work/rnnlm_2step.onnx" examples/models/mlp.onnx; do
    flags=(--topology "$topo" --batch 64)
    [[ $model == *rnnlm_2step* ]] && flags+=(--unroll-rnn)
    name=$(basename "$model" .onnx); tname=$(basename "$topo" .json)
    ex=$("$soapc" compare "$model" "${flags[@]}" --search exhaustive \
           --budget "$budget" --format json -v 2>"$work/ex.log")
    proven=$(grep -c "exhaustive: optimal after" "$work/ex.log" || true)
    space=$(sed -n 's/.*exhaustive: [0-9]* ops, 10^\([0-9.]*\) strategies.*/\1/p' "$work/ex.log")
    read -r ext exs exn < <($py -c 'import json,sys; r=json.loads(sys.stdin.readline()); print(r["iteration_s"], r["search_s"], r["proposals"])' <<<"$ex")
    found=none; mt=""; ms=""
    for p in 250 500 1000 2000 4000 8000 16000 32000; do
      m=$("$soapc" compare "$model" "${flags[@]}" --search mcmc --budget $p --format json 2>/dev/null)
      read -r mt ms < <($py -c 'import json,sys; r=json.loads(sys.stdin.readline()); print(r["iteration_s"], r["search_s"])' <<<"$m")
      if $py -c "import sys; sys.exit(0 if float('$mt') <= float('$ext') * (1 + 1e-9) else 1)"; then
        found=$p; break
      fi
    done
    rows+=("{\"model\": \"$name\", \"topology\": \"$tname\", \"space_log10\": $space, \"exhaustive_s\": $ext, \"exhaustive_search_s\": $exs, \"exhaustive_strategies\": $exn, \"proven_optimal\": $([[ $proven -gt 0 ]] && echo true || echo false), \"mcmc_proposals_to_match\": \"$found\", \"mcmc_s\": $mt, \"mcmc_search_s\": $ms}")
    printf '%-12s %-9s 10^%-5s exhaustive %9.4f ms in %7.1f s (%s strategies, proven %s) | mcmc %9.4f ms after %s proposals, %.2f s\n' \
      "$name" "$tname" "$space" "$(echo "$ext*1000" | bc -l)" "$exs" "$exn" \
      "$([[ $proven -gt 0 ]] && echo yes || echo no)" "$(echo "$mt*1000" | bc -l)" "$found" "$ms"
  done
done
mkdir -p bench/results
(IFS=,; echo "{\"budget\": \"$budget\", \"rows\": [${rows[*]}]}") |
  $py -m json.tool > bench/results/optimality.json
