#!/usr/bin/env bash
# Runs libFuzzer target $1 (onnx, topology, profile, plan) of the build in
# $2 (configured with -DSOAP_FUZZ=ON) for $3 seconds, or with the libFuzzer
# flags that follow ($3 may be "-" to give only those), from its seeds
# (seeds.sh) into a work corpus $2/fuzz/<target>/ that grows across runs.
# Crash reproducers land in $2/fuzz/<target>-crash-*; the exit status is
# libFuzzer's (0: no crash). Used by scripts/test.sh (CI) and bench/fuzz.sh.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
target="$1" build="$2" seconds="${3:--}"
shift 3 || shift $#
bin="$build/bin/fuzz-$target"
[[ -x "$bin" ]] || { echo "fuzz: $bin is missing (configure with -DSOAP_FUZZ=ON)" >&2; exit 2; }
# SOAP_FUZZ_JOB (bench/fuzz.sh --jobs) gives each process its own seeds copy.
work="$build/fuzz/$target" seeds="$build/fuzz/seeds-$target${SOAP_FUZZ_JOB:+.$SOAP_FUZZ_JOB}"
mkdir -p "$work"
rm -rf "$seeds" && mkdir -p "$seeds"
(cd "$root" && test/fuzz/seeds.sh "$target") | while read -r f; do
  cp "$root/$f" "$seeds/$(echo "$f" | tr / _)"
done
flags=(-print_final_stats=1 -timeout=10 -rss_limit_mb=4096
  -artifact_prefix="$build/fuzz/$target-")
if [[ "$seconds" != "-" ]]; then flags+=(-max_total_time="$seconds"); fi
# libFuzzer reads every corpus directory and writes new inputs to the first.
exec "$bin" "${flags[@]}" "$@" "$work" "$seeds"
