# lit configuration for soapc's tool tests (test/cli).
import os
import sys
import lit.formats

config.name = "soapc"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".test"]
config.test_source_root = os.path.join(config.soap_src_root, "test", "cli")
config.test_exec_root = os.path.join(config.soap_obj_root, "test", "cli")
config.excludes = ["Inputs"]

config.environment["PATH"] = os.pathsep.join(
    [config.soap_tools_dir, config.llvm_tools_dir, config.environment.get("PATH", "")])
# The sanitizer build (scripts/test.sh --sanitize) sets these.
for var in ("HOME", "TMPDIR", "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"):
    if var in os.environ:
        config.environment[var] = os.environ[var]

config.substitutions.append(("%soapc", os.path.join(config.soap_tools_dir, "soapc")))
config.substitutions.append(("%python", sys.executable))
config.substitutions.append(("%models", os.path.join(config.soap_src_root, "examples", "models")))
config.substitutions.append(("%topologies", os.path.join(config.soap_src_root, "examples", "topologies")))
config.substitutions.append(("%one-error", sys.executable + " " + os.path.join(
    config.soap_src_root, "test", "cli", "Inputs", "one_error.py")))
config.substitutions.append(("%inputs", os.path.join(config.soap_src_root, "test", "cli", "Inputs")))
# FileCheck is taken from LLVM 15; Debian installs it without the version
# suffix under /usr/lib/llvm-15/bin.

if config.soap_have_cuda:
    config.available_features.add("cuda")
if config.soap_sanitize:
    config.available_features.add("sanitize")
if config.soap_have_mpi:
    config.available_features.add("mpi")

# The JSON Schema check of the example topologies needs python3-jsonschema.
try:
    import jsonschema  # noqa: F401
    config.available_features.add("jsonschema")
except ImportError:
    pass

# soap-run's tool tests (test/cli/exec) start 4 MPI ranks on whatever cores
# there are, also as root in CI containers.
if config.soap_have_mpi:
    config.environment["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    config.environment["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    config.substitutions.append(
        ("%mpirun", "mpirun --oversubscribe --bind-to none"))
config.substitutions.append(
    ("%soap-run", os.path.join(config.soap_tools_dir, "soap-run")))
# A GPU to run on (soap-run --backend cuda): CUDA built and a device listed.
if config.soap_have_cuda:
    import shutil
    import subprocess
    smi = shutil.which("nvidia-smi")
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True) if smi else None
    if listed and listed.returncode == 0:
        gpus = sum(1 for l in listed.stdout.splitlines() if l.startswith("GPU "))
        if gpus:
            config.available_features.add("gpu")
        # gpus-N: at least N GPUs (a test with a GPU per rank).
        for n in (2, 4, 8):
            if gpus >= n:
                config.available_features.add("gpus-%d" % n)
# PyTorch as a reference for soap-run (test/cli/exec/torch.test); found, not
# imported, so lit starts fast.
import importlib.util
if importlib.util.find_spec("torch") is not None:
    config.available_features.add("torch")
# ONNX's Python package: examples/models' generators (test/cli/zoo).
if importlib.util.find_spec("onnx") is not None:
    config.available_features.add("onnx")
# The project virtual environment (scripts/setup.sh --venv): torch 2.x, onnx,
# onnxruntime and transformers from PyPI, for the programs `soapc emit
# --target dtensor` writes (run under torchrun), the onnxruntime reference
# and the transformers exports. %venv-python is its interpreter.
venv_python = os.path.join(config.soap_src_root, ".venv", "bin", "python")
if os.path.exists(venv_python):
    config.available_features.add("venv")
    config.substitutions.append(("%venv-python", venv_python))
    config.substitutions.append(("%torchrun", os.path.join(
        config.soap_src_root, ".venv", "bin", "torchrun")))
