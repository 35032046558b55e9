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
#   scripts/setup.sh --venv     also the project virtual environment .venv
#                               from PyPI, pinned by scripts/requirements.txt:
#                               torch 2.x (DTensor, FSDP2, pipelining),
#                               onnx, onnxruntime, transformers; what
#                               `soapc emit --target dtensor` programs and
#                               the transformers exports run with
#   scripts/setup.sh --tests    --models' packages, python3-jsonschema and
#                               --venv: what the tool tests use (the PyTorch
#                               references of soap-run and the importer, the
#                               topology schema, the emitted programs under
#                               torchrun); scripts/test.sh passes it
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
venv=0
for arg in "$@"; do
  case "$arg" in
    --models) packages+=("${models[@]}") ;;
    --venv) packages+=(python3-venv); venv=1 ;;
    --tests) packages+=("${models[@]}" python3-jsonschema python3-venv); venv=1 ;;
    --sanitize) packages+=(clang-14 libclang-rt-14-dev) ;;
    *) echo "usage: scripts/setup.sh [--models] [--venv] [--tests] [--sanitize]" >&2
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

# The virtual environment is remade when scripts/requirements.txt changes
# (its copy inside .venv is the stamp). Debian's python3 makes it, so the
# interpreter is the system's 3.11 whatever else is on PATH.
if ((venv)) && ! cmp -s scripts/requirements.txt .venv/requirements.txt; then
  echo "setup: making .venv from scripts/requirements.txt"
  rm -rf .venv
  /usr/bin/python3 -m venv .venv
  .venv/bin/pip install -q --no-input -r scripts/requirements.txt
  cp scripts/requirements.txt .venv/requirements.txt
fi

werror=OFF
if [[ -n "${CI:-}" ]]; then werror=ON; fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSOAP_WERROR="$werror" >/dev/null
cmake --build build -j "$(nproc)"
