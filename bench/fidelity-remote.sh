#!/usr/bin/env bash
# On the lent GPU machine (device tool, carry [".gpu", "bench/results/fidelity"],
# the plans made here by bench/fidelity.sh plans): unpacks the bundle
# bench/fidelity-bundle.sh made, finds the machine's CUDA, cuBLAS, cuDNN and
# NCCL, and runs the given stages, each under its own time limit:
#   tests        the GPU tool tests (lit: exec/cuda.test, profile/gpu.test,
#                and exec/nccl.test where there are 4 GPUs and mpirun)
#   STAGE[:S]    a bench/fidelity.sh stage (profile, single, multi, exec,
#                table, ...), stopped after S seconds (default 600)
# then packs the profiles, reports and logs into $OUT/gpu-results.tgz.
# Example: bash bench/fidelity-remote.sh tests profile:150 single:60 table
set -uo pipefail
cd "$(dirname "$0")/.."
root=/tmp/soap-gpu
logs=$root/logs
mkdir -p "$root" "$logs"
start=$SECONDS
if command -v xz >/dev/null; then tar -C "$root" -xJf .gpu/soap-gpu.tar.xz
else python3 -c "import tarfile; tarfile.open('.gpu/soap-gpu.tar.xz').extractall('$root')"; fi
echo "unpacked in $((SECONDS - start)) s"
libs=$root/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib
# cuBLAS, cuDNN and NCCL may come with the Python wheels rather than CUDA.
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
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv |
  tee "$logs/gpu.txt"
# The profile and topologies follow the GPU found (fidelity.sh's GPU).
if [ -z "${GPU:-}" ]; then
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
    *H200*) export GPU=h200 ;;
    *) export GPU=h100 ;;
  esac
fi
for b in soapc soap-profile soap-run; do
  if ldd "$root/bin/$b" | grep 'not found'; then echo "missing libraries for $b"; exit 1; fi
done

run_tests() {
  local obj=$root/obj
  mkdir -p "$obj/test"
  cat > "$obj/test/lit.site.cfg.py" <<CFG
import os
config.soap_src_root = "$PWD"
config.soap_obj_root = "$obj"
config.soap_tools_dir = "$root/bin"
config.llvm_tools_dir = "$root/llvm"
config.soap_have_cuda = True
config.soap_have_mpi = $(command -v mpirun >/dev/null && echo True || echo False)
config.soap_sanitize = False
lit_config.load_config(config, os.path.join(config.soap_src_root, "test", "lit.cfg.py"))
CFG
  python3 "$root/lit/lit.py" -v "$obj/test" --filter 'exec/cuda|exec/nccl|profile/gpu'
}

[ $# -eq 0 ] && set -- tests profile single multi table
status=0
for arg in "$@"; do
  stage=${arg%%:*} limit=600
  [ "$stage" != "$arg" ] && limit=${arg##*:}
  t0=$SECONDS
  echo "== $stage (limit ${limit} s)"
  if [ "$stage" = tests ]; then
    timeout "$limit" bash -c "$(declare -f run_tests); root=$root; run_tests" \
      > "$logs/tests.log" 2>&1
  else
    # fidelity.sh writes under bench/results/fidelity: OUT is the tool's.
    OUT= BIN=$root/bin timeout "$limit" bench/fidelity.sh "$stage" \
      > "$logs/$stage.log" 2>&1
  fi
  rc=$?
  [ $rc -ne 0 ] && status=$rc
  echo "== $stage: exit $rc after $((SECONDS - t0)) s"
  tail -n 25 "$logs/$stage.log"
done
if [ -n "${OUT:-}" ]; then
  # Not the weight dumps a stage stopped by its limit leaves (GBs).
  tar czf "$OUT/gpu-results.tgz" --exclude="w-*" profiles/*.json bench/results/fidelity \
    $(ls bench/results/fidelity.json 2>/dev/null) -C "$root" logs 2>/dev/null
  ls -l "$OUT"
fi
exit "$status"
