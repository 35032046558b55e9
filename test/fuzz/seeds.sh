#!/usr/bin/env bash
# Prints the seed inputs of fuzz target $1 (onnx, topology, profile, plan),
# one path a line, relative to the repository root: the committed corpus
# test/fuzz/corpus/$1/ and the example and test inputs of that format. The
# zoo models over 200 KB (slow to mutate) are left out; ctest
# replays them all (test/fuzz/CMakeLists.txt).
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
  onnx)
    ls test/fuzz/corpus/onnx/* test/cli/Inputs/bad/*.onnx 2>/dev/null || true
    find examples/models -name '*.onnx' -size -200k | sort ;;
  topology)
    ls test/fuzz/corpus/topology/* examples/topologies/*.json \
      test/cli/Inputs/topo/*.json 2>/dev/null || true ;;
  profile)
    ls test/fuzz/corpus/profile/* test/cli/Inputs/cost/*.json 2>/dev/null || true ;;
  plan)
    ls test/fuzz/corpus/plan/* examples/plans/*.json 2>/dev/null || true ;;
  *)
    echo "usage: $0 onnx|topology|profile|plan" >&2
    exit 2 ;;
esac
