#!/usr/bin/env bash
# On the lent GPU machine (device tool, carry [".gpu"]): unpacks the bundle
# bench/fidelity-bundle.sh made, finds the machine's cuDNN and cuBLAS, runs
# bench/fidelity.sh with the given stages and copies profiles and reports
# to $OUT. Example: bash bench/fidelity-remote.sh profile single multi table
set -uo pipefail
cd "$(dirname "$0")/.."
root=/tmp/soap-gpu
mkdir -p "$root"
python3 -c "import tarfile; tarfile.open('.gpu/soap-gpu.tar.xz').extractall('$root')"
libs=$root/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib
# cuDNN may come with the Python wheels rather than with CUDA.
for d in $(python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    for p in nvidia.__path__:
        print("\n".join(sorted(glob.glob(os.path.join(p, "*", "lib")))))
except ImportError:
    pass
PY
); do libs=$libs:$d; done
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi -L || true
if ! ldd "$root/bin/soap-profile" | grep -q 'not found'; then :; else
  ldd "$root/bin/soap-profile" | grep 'not found'
  exit 1
fi
status=0
for stage in "${@:-all}"; do
  BIN=$root/bin bench/fidelity.sh "$stage" || status=$?
done
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  cp profiles/*.json "$OUT/" 2>/dev/null
  (cd bench/results && tar czf "$OUT/fidelity-reports.tgz" fidelity fidelity.json 2>/dev/null)
fi
exit "$status"
