#!/usr/bin/env bash
# Installs soapc's build and test dependencies from Debian 12 (as root, or
# with sudo), then configures and builds into ./build. Idempotent: packages
# already present are not reinstalled, and the build is incremental.
#   scripts/setup.sh            what the build and its C++ tests need, then
#                               build
#   scripts/setup.sh --models   also python3-torch/torchvision/onnx, which
#                               examples/models/export.py needs, and OpenBLAS
#                               as PyTorch's BLAS (bench/step-time.py; the
#                               float64 reference of test/cli/exec/torch.test
#                               takes 4x as long on Debian's reference BLAS)
#   scripts/setup.sh --tests    --models' packages and python3-jsonschema:
#                               what the tool tests use (the PyTorch
#                               references of soap-run and the importer, the
#                               topology schema); scripts/test.sh passes it
#   scripts/setup.sh --sanitize also clang-14 and libclang-rt-14-dev (ASan,
#                               UBSan and libFuzzer's runtime) for the
#                               sanitizer build of scripts/test.sh --sanitize
# Flags combine (scripts/test.sh --sanitize: --tests --sanitize).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build python3 llvm-15-dev llvm-15-tools
  libonnx-dev libprotobuf-dev protobuf-compiler nlohmann-json3-dev libfmt-dev
  libspdlog-dev catch2 libopenmpi-dev openmpi-bin libdnnl-dev libjemalloc-dev)
models=(python3-torch python3-torchvision python3-onnx libopenblas0-pthread)
for arg in "$@"; do
  case "$arg" in
    --models) packages+=("${models[@]}") ;;
    --tests) packages+=("${models[@]}" python3-jsonschema) ;;
    --sanitize) packages+=(clang-14 libclang-rt-14-dev) ;;
    *) echo "usage: scripts/setup.sh [--models] [--tests] [--sanitize]" >&2
       exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

werror=OFF
if [[ -n "${CI:-}" ]]; then werror=ON; fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSOAP_WERROR="$werror" >/dev/null
cmake --build build -j "$(nproc)"
