#!/usr/bin/env bash
# bench/fuzz: runs each libFuzzer target of the sanitizer build (ASan + UBSan,
# build-asan-clang/, configured by scripts/test.sh --sanitize) for RUNS
# executions (default 1,000,000), one target at a time in one process, and
# prints executions, seconds, executions per second and crashes per target;
# writes the same as JSON. Not run by CI (which fuzzes each target for 60 s).
# With --jobs J, J processes share the target's work corpus (as libFuzzer's
# own -jobs does) and run RUNS/J executions each; the row sums them.
#   bench/fuzz.sh [--runs N] [--jobs J] [--out FILE] [TARGET...]
#   (targets: onnx topology profile plan)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=1000000 jobs=1 out=bench/results/fuzz.json targets=()
while (($#)); do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
((${#targets[@]})) || targets=(onnx topology profile plan)
build=build-asan-clang
for t in "${targets[@]}"; do
  [[ -x "$build/bin/fuzz-$t" ]] || {
    echo "bench/fuzz: $build/bin/fuzz-$t is missing; run scripts/test.sh --sanitize first" >&2
    exit 2; }
done
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/test/fuzz/lsan.supp:print_suppressions=0"

# The JSON is rewritten after each target, so an interrupted run keeps what
# it measured.
write_json() {
  mkdir -p "$(dirname "$out")"
  {
    echo '{'
    echo '  "benchmark": "fuzz",'
    echo "  \"runs_per_target\": $runs,"
    echo '  "build": "clang 14, -O1, ASan + UBSan (-fno-sanitize-recover=all), libFuzzer",'
    echo "  \"machine\": \"$(nproc) cores shared, $(uname -m)\","
    echo '  "targets": ['
    for i in "${!rows[@]}"; do
      sep=","; ((i == ${#rows[@]} - 1)) && sep=""
      echo "    ${rows[$i]}$sep"
    done
    echo '  ]'
    echo '}'
  } >"$out"
}

printf '%-9s %12s %9s %9s %8s\n' target executions seconds exec/s crashes
rows=()
for t in "${targets[@]}"; do
  log="$build/fuzz-bench-$t.log"
  start=$(date +%s.%N)
  crashes=0 pids=()
  for ((j = 0; j < jobs; j++)); do
    SOAP_FUZZ_JOB=$j test/fuzz/run.sh "$t" "$build" - -runs="$((runs / jobs))" \
      >"$log.$j" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || crashes=1; done
  end=$(date +%s.%N)
  cat "$log".* >"$log"
  execs=0
  for ((j = 0; j < jobs; j++)); do
    n=$(awk '/stat::number_of_executed_units/ {print $2}' "$log.$j" | tail -1)
    execs=$((execs + ${n:-0}))
  done
  secs=$(awk -v a="$start" -v b="$end" 'BEGIN {print b - a}')
  rate=$(awk -v n="$execs" -v s="$secs" 'BEGIN {print n / s}')
  printf '%-9s %12d %9.0f %9.0f %8d\n' "$t" "$execs" "$secs" "$rate" "$crashes"
  ((crashes == 0)) || echo "  fuzz-$t crashed: see $log" >&2
  rows+=("$(printf '{"target": "%s", "executions": %d, "processes": %d, "seconds": %.1f, "exec_per_sec": %.0f, "crashes": %d, "corpus_files": %d}' \
    "$t" "$execs" "$jobs" "$secs" "$rate" "$crashes" "$(ls "$build/fuzz/$t" | wc -l)")")
  write_json
done
echo "wrote $out"
