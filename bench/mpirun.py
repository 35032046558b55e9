"""Running soapc and soap-run from the CPU benches (memory-cpu.py,
fidelity-cpu.py, exec-all.py): a command's stdout, or RuntimeError with the
last line it printed on stderr; soap-run under mpirun as root."""
import os
import subprocess

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1",
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def run(cmd, timeout=None):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=ENV,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError("timed out after %d s" % timeout)
    if p.returncode != 0:
        raise RuntimeError((p.stderr.strip().splitlines() or
                            [f"exit status {p.returncode}"])[-1])
    return p.stdout


def mpirun(ranks, cmd, timeout=None):
    """`cmd` on `ranks` MPI ranks (directly when 1), unbound to cores."""
    if ranks > 1:
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np",
               str(ranks)] + cmd
    return run(cmd, timeout)
