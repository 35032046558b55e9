#!/usr/bin/python3
"""bench/exec-all.py [--models M:B,..] [--searchers S,..] [--ranks 2,4]
[--steps K] [--timeout D] [--build DIR] [--out F]

Every zoo model runs under every searcher's plan: for each
model (at batch B) and each searcher, soapc's plan on 2 and 4 ranks
(test/cli/exec/Inputs: two.json, p100-2x2.json) is run by soap-run under
mpirun, and its losses and every final weight are compared with the same
model's one-rank run (test/cli/exec/Inputs/compare.py: within max(1e-5
relative, 1e-6 absolute)); a micro-batched plan (pipeline, gradient
accumulation) is compared with a one-rank run of the same micro-batches
when the model has BatchNormalization (each micro-batch is normalised by its
own statistics), else with the plain one. Prints one row per model, searcher
and rank count (MATCH, MISMATCH with the first difference, or the error),
with the seconds per step; writes JSON (default
bench/results/exec-all.json). Asserts nothing.

Where a run differs from one rank beyond that tolerance and the model is
one PyTorch builds with the same weight names and image inputs (the
torchvision models, export.py's CNNs), the same training in float64
(torch_reference.py --write) decides: the run matches when it is no
further from float64 than twice the furthest of two float32 runs, soap-run's
one rank and PyTorch's (compare.py --exact-ref, --float32-ref), and the row
says so (float64_reference). Deep networks with batch statistics
over a few samples move float32 far from the exact result whatever the
plan (ResNet-101 at batch 4: 6% of the loss after 2 steps).

The default models are every zoo model with weights that soap-run can
train in minutes a run; the GPT-3 models have no weights (soap-run refuses
them) and the TensorOpt-size ones do not fit in a 24 GB machine. transformer
and gpt2 at batch 4 on 4 ranks hold 5-6 GB a rank, and gpt2's one-rank
reference about 17 GB: on 24 GB add swap, or run them at batch 2 with
--ranks 2. A reference whose batch does not fit one P100 is planned on one
H100 (bench/fidelity-h100x1.json); every op is on device 0 either way. Only
the references' weight dumps are kept while the bench runs."""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from mpirun import mpirun, run  # bench/mpirun.py, beside this file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
INPUTS = os.path.join(ROOT, "test/cli/exec/Inputs")
TOPOLOGY = {1: "one.json", 2: "two.json", 4: "p100-2x2.json"}
DEFAULT_MODELS = ("mlp_small:8,lenet:8,resnet_small:8,mobilenet_small:8,"
                  "transformer_small:8,alexnet:4,rnntc:4,rnnlm:4,nmt:4,"
                  "resnet101:4,inception_v3:4,vgg16:4,transformer:4,gpt2:4")
DEFAULT_SEARCHERS = "data,model,expert,kcuts,mcmc,balanced,pipeline"
STEP = re.compile(r"^step \d+ loss \S+ time (\S+) s", re.M)
def train(a, onnx, plan, ranks, wdir, out):
    text = mpirun(ranks, [a.soap_run, onnx, plan, "--seed", "7", "--steps",
                          str(a.steps), "--threads", "1", "--dump-weights",
                          wdir], a.timeout)
    with open(out, "w") as f:
        f.write(text)
    return [float(t) for t in STEP.findall(text)]


def save(path, steps, rows):
    with open(path, "w") as f:
        json.dump({"bench": "exec-all", "steps": steps, "results": rows}, f,
                  indent=2)


def has_batchnorm(a, onnx, batch):
    text = run([a.soapc, "dump", onnx, "--batch", str(batch)])
    return "BatchNormalization" in text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--searchers", default=DEFAULT_SEARCHERS)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--budget", default="500")
    ap.add_argument("--timeout", type=int, default=1800,
                    help="seconds one soap-run may take")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out",
                    default=os.path.join(HERE, "results/exec-all.json"))
    a = ap.parse_args()
    a.soapc = os.path.join(a.build, "bin/soapc")
    a.soap_run = os.path.join(a.build, "bin/soap-run")
    compare = os.path.join(INPUTS, "compare.py")
    torch_ref = os.path.join(INPUTS, "torch_reference.py")
    rows = []
    print(f"{'model':<18} {'batch':>5} {'searcher':<9} {'ranks':>5} "
          f"{'s/step':>8}  result")
    with tempfile.TemporaryDirectory() as tmp:
        for spec in a.models.split(","):
            model, batch = spec.split(":")
            onnx = os.path.join(ROOT, "examples/models", model + ".onnx")
            refs = {}

            def reference(m):
                """The one-rank run of m micro-batches (1: the plain one)."""
                if m in refs:
                    return refs[m]
                plan = os.path.join(tmp, f"{model}-one-{m}.json")
                # One P100; where the whole batch does not fit its 16 GB
                # (gpt2 and transformer at batch 4), one H100 (80 GB): the
                # same plan, every op on device 0, for soap-run's CPU.
                for topo in (os.path.join(INPUTS, TOPOLOGY[1]),
                             os.path.join(HERE, "fidelity-h100x1.json")):
                    try:
                        run([a.soapc, onnx, "--topology", topo, "--search",
                             "data", "--batch", batch, "-o", plan])
                        break
                    except RuntimeError as e:
                        if "does not fit" not in str(e) or "h100" in topo:
                            raise
                if m > 1:
                    with open(plan) as f:
                        p = json.load(f)
                    p["pipeline"]["micro_batches"] = m
                    with open(plan, "w") as f:
                        json.dump(p, f)
                w = os.path.join(tmp, f"w-{model}-one-{m}")
                out = os.path.join(tmp, f"{model}-one-{m}.out")
                steps = train(a, onnx, plan, 1, w, out)
                refs[m] = (out, w, steps)
                return refs[m]

            exacts = {}

            def exact(m):
                """compare.py's arguments for the float64 PyTorch run of m
                micro-batches and the float32 one, or None where the model
                is not one torch_reference.py can build."""
                if m not in exacts:
                    args = []
                    for flag, opt in (([], "--exact-ref"),
                                      (["--float32"], "--float32-ref")):
                        tag = f"{model}-torch{len(flag)}-{m}"
                        out = os.path.join(tmp, tag + ".out")
                        w = os.path.join(tmp, "w-" + tag)
                        c = subprocess.run([sys.executable, torch_ref,
                                            "--write"] + flag +
                                           [model, "7", batch, str(a.steps),
                                            str(m), out, w],
                                           capture_output=True, text=True)
                        if c.returncode != 0:
                            break
                        args += [opt, out, w]
                    exacts[m] = args if len(args) == 6 else None
                return exacts[m]

            try:
                bn = has_batchnorm(a, onnx, batch)
                reference(1)
            except RuntimeError as e:
                rows.append({"model": model, "batch": int(batch),
                             "error": "one rank: " + str(e)})
                print(f"{model:<18} {batch:>5} {'-':<9} {1:>5} {'':>8}  "
                      f"error: {e}", flush=True)
                continue
            for ranks in [int(r) for r in a.ranks.split(",")]:
                for s in a.searchers.split(","):
                    row = {"model": model, "batch": int(batch),
                           "searcher": s, "ranks": ranks}
                    t0 = time.time()
                    try:
                        plan = os.path.join(tmp, f"{model}-{s}-{ranks}.json")
                        run([a.soapc, onnx, "--topology",
                             os.path.join(INPUTS, TOPOLOGY[ranks]),
                             "--search", s, "--batch", batch, "--budget",
                             a.budget, "--seed", "0", "-o", plan])
                        with open(plan) as f:
                            p = json.load(f)
                        m = p["pipeline"]["micro_batches"]
                        row["stages"] = p["pipeline"]["stages"]
                        row["micro_batches"] = m
                        ref = reference(m if bn else 1)
                        w = os.path.join(tmp, f"w-{model}-{s}-{ranks}")
                        out = os.path.join(tmp, f"{model}-{s}-{ranks}.out")
                        steps = train(a, onnx, plan, ranks, w, out)
                        row["step_s"] = min(steps) if steps else None
                        c = subprocess.run([sys.executable, compare, ref[0],
                                            ref[1], out, w],
                                           capture_output=True, text=True)
                        ex = (exact(m if bn else 1)
                              if c.returncode != 0 else None)
                        if ex:
                            c = subprocess.run(
                                [sys.executable, compare, ref[0], ref[1], out,
                                 w] + ex, capture_output=True, text=True)
                            row["float64_reference"] = True
                        row["result"] = (c.stdout or c.stderr).strip()
                        row["match"] = c.returncode == 0
                        # Only the references' weights are kept: a large
                        # model's dumps would fill the disk (BERT-large:
                        # 1.3 GB a run).
                        shutil.rmtree(w, ignore_errors=True)
                    except RuntimeError as e:
                        row["error"] = str(e)
                    row["seconds"] = time.time() - t0
                    rows.append(row)
                    save(a.out, a.steps, rows)  # a long run cut short keeps its rows
                    res = row.get("result", "error: " + row.get("error", ""))
                    st = f"{row['step_s']:.3f}" if row.get("step_s") else "-"
                    print(f"{model:<18} {batch:>5} {s:<9} {ranks:>5} "
                          f"{st:>8}  {res}", flush=True)
    ok = sum(1 for r in rows if r.get("match"))
    print(f"{ok} of {len(rows)} runs match one rank")
    save(a.out, a.steps, rows)
    print(f"results: {os.path.relpath(a.out, ROOT)}")


if __name__ == "__main__":
    main()
