#!/usr/bin/env bash
# README command 2: set up, build, and run the whole test suite (ctest runs
# the Catch2 unit tests, the lit/FileCheck tool tests and the fuzz corpora).
#   scripts/test.sh              gcc build in build/, then ctest
#   scripts/test.sh --sanitize   also a clang-14 build in build-asan-clang/
#                                with ASan + UBSan (-fno-sanitize-recover=all)
#                                and libFuzzer: ctest under it, then each
#                                fuzz target for SOAP_FUZZ_SECONDS (60) s.
# CI (CI=true) implies --sanitize.
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=0
if [[ -n "${CI:-}" ]]; then sanitize=1; fi
for arg in "$@"; do
  case "$arg" in
    --sanitize) sanitize=1 ;;
    *) echo "usage: scripts/test.sh [--sanitize]" >&2; exit 2 ;;
  esac
done

stamp() { echo "test: $1 after $((SECONDS / 60))m$((SECONDS % 60))s"; }

# --tests: PyTorch, ONNX's Python package and jsonschema, so the tool tests
# that compare with them run rather than report UNSUPPORTED.
if ((sanitize)); then scripts/setup.sh --tests --sanitize; else scripts/setup.sh --tests; fi
stamp "gcc build"
ctest --test-dir build --output-on-failure -j "$(nproc)"
stamp "gcc tests"
((sanitize)) || exit 0

# The sanitizer build: every library, tool and test instrumented with ASan +
# UBSan and libFuzzer's coverage (-fsanitize=fuzzer-no-link), so the fuzz
# targets and the tests share one build. CUDA and MPI are left out (their
# runtimes are not instrumented; the tests that need them report
# UNSUPPORTED here and run in the gcc build).
werror=OFF
if [[ -n "${CI:-}" ]]; then werror=ON; fi
flags="-O1 -gline-tables-only"
cmake -S . -B build-asan-clang -G Ninja -DCMAKE_C_COMPILER=clang-14 \
  -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="$flags" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$flags" -DSOAP_SANITIZE=ON -DSOAP_FUZZ=ON \
  -DSOAP_BUILD_BENCH=OFF -DSOAP_ENABLE_CUDA=OFF -DSOAP_ENABLE_MPI=OFF \
  -DSOAP_WERROR="$werror" >/dev/null
cmake --build build-asan-clang -j "$(nproc)"
stamp "sanitizer build"

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/test/fuzz/lsan.supp:print_suppressions=0"
ctest --test-dir build-asan-clang --output-on-failure -j "$(nproc)"
stamp "sanitizer tests"

# Each fuzz target for a minute, two at a time (CI has 2 cores).
seconds="${SOAP_FUZZ_SECONDS:-60}"
fuzz() {
  if test/fuzz/run.sh "$1" build-asan-clang "$seconds" \
      >"build-asan-clang/fuzz-$1.log" 2>&1; then
    echo "fuzz-$1: $(grep -E 'stat::number_of_executed_units' \
      "build-asan-clang/fuzz-$1.log" | awk '{print $2}') executions in ${seconds} s, no crash"
  else
    echo "fuzz-$1: FAILED; the log follows" >&2
    tail -n 60 "build-asan-clang/fuzz-$1.log" >&2
    return 1
  fi
}
mkdir -p build-asan-clang/fuzz
status=0
fuzz onnx & a=$!
fuzz topology & b=$!
wait $a || status=1
wait $b || status=1
fuzz profile & a=$!
fuzz plan & b=$!
wait $a || status=1
wait $b || status=1
stamp "fuzzing"
exit $status
