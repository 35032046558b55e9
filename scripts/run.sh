#!/usr/bin/env bash
# README command 1: set up, build, and run soapc on a bundled model: the
# expert strategy for ResNet-101 on FlexFlow's 4 x 4 P100 cluster, simulated.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build/bin/soapc simulate examples/models/resnet101.onnx \
  --topology examples/topologies/p100-4x4.json --strategy expert
