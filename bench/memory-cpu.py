#!/usr/bin/python3
"""bench/memory-cpu.py [--models M:B,..] [--ranks N] [--build DIR] [--out F]

The memory check: for each plan kind — data parallelism, a 2-stage
pipeline (1F1B and GPipe, 4 micro-batches), selective and full
recomputation, ZeRO-1, -2 and -3, and bf16 data parallelism, pipeline and
ZeRO-3 — on small zoo models, the simulator's
predicted peak bytes of every device beside soap-run's measured peak on its
rank (`soap-run --memory`: every byte of tensor storage the rank holds,
counted by the executor's allocator), and their ratio. Plans are soapc's
data plan on N ranks (test/cli/exec/Inputs: two.json for 2, p100-2x2.json
for 4) rewritten by test/cli/exec/Inputs/memplan.py and pipeplan.py. Runs
soap-run under mpirun (2 steps; the peak is the larger of the two). Prints
a table (one row per model and plan: the range over ranks) and writes JSON
with every rank (default bench/results/memory-cpu.json). Asserts nothing."""

import argparse
import json
import os
import re
import sys
import tempfile

from mpirun import mpirun, run  # bench/mpirun.py, beside this file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
INPUTS = os.path.join(ROOT, "test/cli/exec/Inputs")
DEFAULT = "mlp_small:64,transformer_small:8,lenet:32"
TOPOLOGY = {1: "one.json", 2: "two.json", 4: "p100-2x2.json"}
# kind -> (memplan arguments, pipeplan arguments)
KINDS = [
    ("data parallel", None, None),
    ("pipeline 1f1b", None, ["2", "4", "1f1b"]),
    ("pipeline gpipe", None, ["2", "4", "gpipe"]),
    ("recompute selective", ["0", "selective"], None),
    ("recompute full", ["0", "full"], None),
    ("zero-1", ["1"], None),
    ("zero-2", ["2"], None),
    ("zero-3", ["3"], None),
    # bf16 (soapc --precision bf16): bf16 weights, gradients and
    # activations, fp32 master weights (mixed precision).
    ("bf16 data parallel", None, None, "bf16"),
    ("bf16 pipeline 1f1b", None, ["2", "4", "1f1b"], "bf16"),
    ("bf16 zero-3", ["3"], None, "bf16"),
]
LINE = re.compile(r"memory: rank (\d+) peak (\d+) bytes measured, (\d+) "
                  r"predicted \(weights (\d+), gradients (\d+), optimizer "
                  r"(\d+), saved (\d+), buffers (\d+), workspace (\d+)\)")


def measure(model, batch, ranks, kind, mem, pipe, soapc, soap_run, tmp,
            precision="fp32"):
    onnx = os.path.join(ROOT, "examples/models", model + ".onnx")
    dump = os.path.join(tmp, f"{model}-dump.json")
    if not os.path.exists(dump):
        with open(dump, "w") as f:
            f.write(run([soapc, "dump", onnx, "--batch", str(batch),
                         "--format", "json"]))
    plan = os.path.join(tmp, f"{model}-{ranks}-{precision}.json")
    run([soapc, onnx, "--topology", os.path.join(INPUTS, TOPOLOGY[ranks]),
         "--search", "data", "--batch", str(batch), "--precision", precision,
         "-o", plan])
    if pipe:
        out = plan.replace(".json", "-pipe.json")
        run([sys.executable, os.path.join(INPUTS, "pipeplan.py"), plan, dump,
             out] + pipe)
        plan = out
    if mem:
        out = plan.replace(".json", "-mem.json")
        run([sys.executable, os.path.join(INPUTS, "memplan.py"), plan, dump,
             out] + mem)
        plan = out
    out = mpirun(ranks, [soap_run, onnx, plan, "--steps", "2", "--threads",
                         "1", "--memory"])
    rows = []
    for m in LINE.finditer(out):
        r, meas, pred, w, g, o, s, b, ws = map(int, m.groups())
        rows.append({"rank": r, "measured": meas, "predicted": pred,
                     "ratio": meas / pred if pred else None,
                     "predicted_parts": {"weights": w, "gradients": g,
                                         "optimizer": o, "saved": s,
                                         "buffers": b, "workspace": ws}})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT)
    ap.add_argument("--ranks", type=int, default=4, choices=[2, 4])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out",
                    default=os.path.join(HERE, "results/memory-cpu.json"))
    a = ap.parse_args()
    soapc = os.path.join(a.build, "bin/soapc")
    soap_run = os.path.join(a.build, "bin/soap-run")
    results = []
    print(f"{'model':<18} {'batch':>5} {'plan':<20} {'ranks':>5} "
          f"{'measured B':>11} {'predicted B':>11} {'ratio':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        for spec in a.models.split(","):
            model, batch = spec.split(":")
            batch = int(batch)
            for kind, mem, pipe, *prec in KINDS:
                entry = {"model": model, "batch": batch, "plan": kind,
                         "ranks": a.ranks}
                try:
                    entry["per_rank"] = measure(model, batch, a.ranks, kind,
                                                mem, pipe, soapc, soap_run,
                                                tmp, *prec)
                except RuntimeError as e:
                    entry["error"] = str(e)
                results.append(entry)
                if "error" in entry:
                    print(f"{model:<18} {batch:>5} {kind:<20} {a.ranks:>5} "
                          f"  error: {entry['error']}")
                    continue
                pr = entry["per_rank"]
                meas = max(r["measured"] for r in pr)
                pred = max(r["predicted"] for r in pr)
                lo = min(r["ratio"] for r in pr)
                hi = max(r["ratio"] for r in pr)
                rng = f"{lo:.3f}" if abs(hi - lo) < 5e-4 else \
                    f"{lo:.3f}-{hi:.3f}"
                print(f"{model:<18} {batch:>5} {kind:<20} {a.ranks:>5} "
                      f"{meas:>11} {pred:>11} {rng:>13}", flush=True)
    with open(a.out, "w") as f:
        json.dump({"bench": "memory-cpu", "results": results}, f, indent=2)
    print(f"results: {os.path.relpath(a.out, ROOT)}")


if __name__ == "__main__":
    main()
