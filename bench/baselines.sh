#!/usr/bin/env bash
# bench/baselines.sh: mcmc against data, model and expert parallelism on every
# zoo model on p100-4x4, k80-16x4 and dgx-h100-2 under the same simulator
#. mcmc starts from those strategies, so it is never slower; the
# table shows by how much it is faster. Writes bench/results/baselines.csv.
#   bench/baselines.sh [BUDGET]      (default 300 proposals)
set -euo pipefail
cd "$(dirname "$0")/.."
soapc=${SOAPC:-build/bin/soapc}
budget=${1:-300}
out=bench/results/baselines.csv
mkdir -p bench/results
echo "model,topology,searcher,time ms,speedup,peak memory,transfers,all-reduces,proposals,search s,note" > "$out"
for topo in p100-4x4 k80-16x4 dgx-h100-2; do
  for model in lenet alexnet vgg16 resnet101 inception_v3 wide_resnet101_2 \
               mlp rnntc rnnlm nmt transformer gpt2; do
    "$soapc" compare "examples/models/$model.onnx" \
      --topology "examples/topologies/$topo.json" \
      --search mcmc,data,model,expert --budget "$budget" --format csv 2>&1 |
      tail -n +2 | sed "s/^/$model,$topo,/" >> "$out" || true
  done
done
column -s, -t < "$out"
