#!/usr/bin/env bash
# README command 1: set up, build, and run soapc's main job on a bundled
# model and cluster: search a strategy for AlexNet on FlexFlow's 4 x 4 P100
# cluster with MCMC, print the summary, write the plan.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build/bin/soapc examples/models/alexnet.onnx \
  --topology examples/topologies/p100-4x4.json --search mcmc \
  -o build/alexnet-p100-4x4.plan.json
