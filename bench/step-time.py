#!/usr/bin/python3
"""bench/step-time.py [--models M,..] [--threads T] [--steps K] [--out F]

The wall time of one SGD step of soap-run (one rank, a
data-parallel plan on one device, CPU kernels) against PyTorch on the CPU
for the same zoo model (examples/models/export.py's builder), batch,
threads and loss (softmax cross-entropy over the logits, SGD), side by side
in one run. Each side runs K steps; the figures are the median and the
minimum of steps 2..K (step 1 warms caches, JIT kernels and allocators; on
a machine shared with other work the minimum is the steadier one). A model
soap-run refuses (or that dies) is reported with its error line. Prints a table and writes JSON (default
bench/results/step-time.json). Asserts nothing."""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# model -> batch: ResNet-101 (a resnet50-class CNN), GPT-2 small at its
# 1024-token context, LSTM models (rnnlm: 2 x LSTM(2048); rnntc: 4 x
# LSTM(1024); 40 steps), BERT-large at 512 tokens.
DEFAULT = "resnet101:2,gpt2:1,rnnlm:1,rnntc:4,transformer:1"


def run_soap(model, batch, threads, steps, soapc, soap_run, tmp):
    onnx = os.path.join(ROOT, "examples/models", model + ".onnx")
    plan = os.path.join(tmp, model + ".json")
    topo = os.path.join(ROOT, "test/cli/exec/Inputs/one.json")
    p = subprocess.run([soapc, onnx, "--topology", topo, "--search", "data",
                        "--batch", str(batch), "-o", plan],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    p = subprocess.run([soap_run, onnx, plan, "--steps", str(steps),
                        "--threads", str(threads)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or
               [f"exit status {p.returncode} (killed by the OS: out of "
                f"memory?)" if p.returncode < 0 else
                f"exit status {p.returncode}"])[0]
        return {"error": why}
    times = [float(t) for t in re.findall(r"time ([0-9.]+) s", p.stdout)]
    losses = [float(x) for x in re.findall(r"loss ([-0-9.e+naif]+)", p.stdout)]
    return {"step_s": times, "loss": losses}


def run_torch(model, batch, threads, steps):
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(ROOT, "examples/models"))
    import export
    torch.set_num_threads(threads)
    builder, specs = export.MODELS[model]
    torch.manual_seed(0)
    net = builder()
    net.train()
    args = export.make_inputs(specs, batch)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    times, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        logits = net(*args)
        classes = logits.shape[-1]
        labels = torch.randint(0, classes, logits.shape[:-1])
        loss = F.cross_entropy(logits.reshape(-1, classes), labels.reshape(-1))
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    return {"step_s": times, "loss": losses}


def after_first(ts):
    return ts[1:] if len(ts) > 1 else ts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=DEFAULT,
                    help="model:batch,... (zoo names)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out",
                    default=os.path.join(HERE, "results/step-time.json"))
    a = ap.parse_args()
    soapc = os.path.join(a.build, "bin/soapc")
    soap_run = os.path.join(a.build, "bin/soap-run")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for item in a.models.split(","):
            model, batch = item.split(":")
            batch = int(batch)
            soap = run_soap(model, batch, a.threads, a.steps, soapc, soap_run,
                            tmp)
            torch = run_torch(model, batch, a.threads, a.steps)
            row = {"model": model, "batch": batch, "threads": a.threads,
                   "steps": a.steps, "soap_run": soap, "pytorch": torch}
            row["pytorch_s"] = statistics.median(after_first(torch["step_s"]))
            row["pytorch_min_s"] = min(after_first(torch["step_s"]))
            if "error" not in soap and soap["step_s"]:
                row["soap_run_s"] = statistics.median(after_first(soap["step_s"]))
                row["soap_run_min_s"] = min(after_first(soap["step_s"]))
                row["ratio"] = row["soap_run_s"] / row["pytorch_s"]
                row["ratio_min"] = row["soap_run_min_s"] / row["pytorch_min_s"]
            rows.append(row)
            print(f"{model}: done", file=sys.stderr, flush=True)
    print(f"{'model':<11} {'batch':>5} {'threads':>7} "
          f"{'soap-run s (med/min)':>21} {'pytorch s (med/min)':>20} "
          f"{'ratio (med/min)':>16}")
    for r in rows:
        if "soap_run_s" in r:
            s = f"{r['soap_run_s']:10.3f}/{r['soap_run_min_s']:<10.3f}"
            q = f"{r['ratio']:7.2f}/{r['ratio_min']:<8.2f}"
        else:
            s, q = f"{'-':>21}", f"{'-':>16}"
        p = f"{r['pytorch_s']:9.3f}/{r['pytorch_min_s']:<10.3f}"
        print(f"{r['model']:<11} {r['batch']:>5} {r['threads']:>7} {s} {p} "
              f"{q}")
        if "error" in r["soap_run"]:
            print(f"    soap-run: {r['soap_run']['error']}")
    import torch
    out = {"machine": {"cpu": platform.processor() or platform.machine(),
                       "cores": os.cpu_count(),
                       "torch": torch.__version__},
           "command": " ".join(sys.argv),
           "rows": rows}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
