#!/usr/bin/env bash
# Packs soapc and soap-profile (a CUDA build) with the shared libraries the
# lent GPU machine lacks (it has CUDA, cuDNN and NCCL, no Debian packages)
# into .gpu/soap-gpu.tar.xz, for the device tool to carry (64 MiB limit):
#   bench/fidelity-bundle.sh            then run: bench/fidelity-remote.sh
# CUDA's own libraries (cudart, cuBLAS, cuDNN) are left out: the machine's
# are used, and their versions are the ones a profile records; so are glibc
# and libstdc++, which the machine has in newer, compatible versions.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-build/bin}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" .gpu
cp "$bin/soapc" "$bin/soap-profile" "$bin/soap-run" "$stage/bin/"
ldd "$bin/soapc" "$bin/soap-profile" "$bin/soap-run" | awk '/=> \// {print $3}' | sort -u |
  grep -v -e libcuda -e libcublas -e libcudnn -e libnccl -e '/ld-linux' \
    -e '/libc\.so' -e '/libm\.so' -e '/libdl\.so' -e '/libpthread\.so' \
    -e '/librt\.so' -e '/libstdc++\.so' -e '/libgcc_s\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
# The GPU tool tests' runner: lit and LLVM's FileCheck and not.
mkdir -p "$stage/llvm"
cp /usr/lib/llvm-15/bin/FileCheck /usr/lib/llvm-15/bin/not "$stage/llvm/"
mkdir -p "$stage/lit"
cp /usr/lib/llvm-15/build/utils/lit/lit.py "$stage/lit/"
cp -r /usr/lib/llvm-15/build/utils/lit/lit "$stage/lit/lit"
XZ_OPT=${XZ_OPT:--6 -T2} tar -C "$stage" -cJf .gpu/soap-gpu.tar.xz bin lib llvm lit
ls -l .gpu/soap-gpu.tar.xz
# The device tool carries only ignored paths named in `carry`.
git check-ignore -q .gpu/soap-gpu.tar.xz ||
  echo "fidelity-bundle.sh: add /.gpu/ to $(git rev-parse --git-common-dir)/info/exclude so that .gpu is carried, not sent as part of the tree" >&2
