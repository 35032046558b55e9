#!/usr/bin/python3
"""Makes the plans of test/cli/emit/dtensor.test and their DTensor programs:
for each model and rank count (2 or 4: the clusters of test/cli/exec), a
data-parallel plan, Megatron's tp 2 (simulate --strategy megatron:tp=2), a
ZeRO-3 plan (fsdp:zero=3), an mcmc plan and a pipeline (the data plan cut
into 2 stages of RANKS/2 devices, 8/RANKS micro-batches, by
test/cli/exec/Inputs/pipeplan.py), each emitted with
`soapc emit --target dtensor` to OUT/<model>-<kind><ranks>.py, whose
fallback notes go to OUT/<model>-<kind><ranks>.err. Prints one line per
program: its name and how many ops fell back.

    dtensor_programs.py SOAPC OUT RANKS MODEL.onnx..."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOPOLOGY = {2: "two.json", 4: "p100-2x2.json"}
KINDS = {
    "dp": ["--search", "data"],
    "tp": ["simulate", "--strategy", "megatron:tp=2"],
    "z3": ["simulate", "--strategy", "fsdp:zero=3"],
    "mc": ["--search", "mcmc", "--budget", "300", "--seed", "1"],
    "pp": None,  # made from "dp"
}
PIPEPLAN = os.path.join(HERE, "..", "..", "exec", "Inputs", "pipeplan.py")


def main():
    soapc, out, ranks = sys.argv[1], sys.argv[2], int(sys.argv[3])
    topo = os.path.join(HERE, "..", "..", "exec", "Inputs", TOPOLOGY[ranks])
    for model in sys.argv[4:]:
        name = os.path.splitext(os.path.basename(model))[0]
        for kind, args in KINDS.items():
            stem = os.path.join(out, "%s-%s%d" % (name, kind, ranks))
            if kind == "pp":
                dump = stem + "-dump.json"
                with open(dump, "w") as f:
                    subprocess.run([soapc, "dump", model, "--kernels",
                                    "fused", "--batch", "8", "--format",
                                    "json"], check=True, stdout=f)
                subprocess.run([sys.executable, PIPEPLAN, os.path.join(
                    out, "%s-dp%d.json" % (name, ranks)), dump,
                    stem + ".json", "2", str(8 // ranks)], check=True,
                    stdout=subprocess.DEVNULL)
                emit(soapc, stem)
                continue
            cmd = [soapc] + args[:1] + [model] + args[1:] if \
                args[0] == "simulate" else [soapc, model] + args
            subprocess.run(cmd + ["--topology", topo, "--batch", "8", "-q",
                                  "-o", stem + ".json"],
                           check=True, stdout=subprocess.DEVNULL)
            emit(soapc, stem)


def emit(soapc, stem):
    """stem.py from stem.json, its notes in stem.err; prints the count."""
    with open(stem + ".err", "w") as err:
        subprocess.run([soapc, "emit", stem + ".json", "--target", "dtensor",
                        "-o", stem + ".py"], check=True, stderr=err)
    with open(stem + ".err") as err:
        fell = sum(1 for line in err if "DTensor fallback" in line)
    print("%s: %d fallbacks" % (os.path.basename(stem), fell))


if __name__ == "__main__":
    main()
