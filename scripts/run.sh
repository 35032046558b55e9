#!/usr/bin/env bash
# README command 1: set up, build, and run soapc on a bundled model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build/bin/soapc dump examples/models/resnet101.onnx --batch 64
