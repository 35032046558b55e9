#!/usr/bin/python3
"""bench/gpt3.py [--rows 1.3b,6.7b,13b,175b] [--searchers ...] [--timeout 10m]
                 [--out bench/results/gpt3.json]

GPT-3 (Brown et al. 2020, Table 2.1; the zoo's
gpt3_*.onnx, weights shape-only) trained in bf16 with Adam at a global batch
of sequences of 2,048 tokens: 1.3B on dgx-h100-1 (8 H100), 6.7B and 13B on
dgx-h100-8 (64), 175B on dgx-h100-128 (1,024). Every searcher runs under the
same simulator and cost model; for each the table gives the predicted
iteration time, model-FLOPs utilisation (6 * parameters * tokens / time /
(devices * bf16 peak), the convention of Narayanan et al. SC21 and PaLM,
attention FLOPs not counted), peak memory, search time and the plan's
shape (stages, micro-batches, ZeRO stages, recomputed ops), beside the
published Megatron-LM figure where there is one (SC21, Table 1: 175B on
1,024 A100 at 138 TFLOP/s per GPU, 44% of peak, with attention FLOPs;
about 40% by this convention). A searcher that passes --timeout is
reported as such. Writes JSON (rows of searchers not run this time are
kept from the file). Asserts nothing."""

import argparse
import json
import os
import re
import subprocess
import tempfile
import time

from pipeline import merge_rows  # bench/pipeline.py, beside this file

ROWS = {
    "1.3b": ("gpt3_1_3b", "dgx-h100-1", 1024),
    "6.7b": ("gpt3_6_7b", "dgx-h100-8", 1024),
    "13b": ("gpt3_13b", "dgx-h100-8", 1024),
    "175b": ("gpt3_175b", "dgx-h100-128", 2048),
}
SEQ = 2048
PUBLISHED = {"175b": "Megatron-LM SC21: 1,024 A100, 44% (attention incl.)"}
SEARCHERS = ["data", "megatron", "pipeline", "mcmc"]


def parameters(soapc, model):
    out = subprocess.run([soapc, "dump", model, "--batch", "1"],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"^parameters: ([0-9,]+)", out, re.M)
    return int(m.group(1).replace(",", ""))


def peak_bf16(soapc, topology):
    out = subprocess.run([soapc, "topo", topology], capture_output=True,
                         text=True, check=True).stdout
    m = re.search(r"fp16/bf16 ([0-9.]+)", out)
    n = re.search(r"counts: ([0-9]+) devices", out)
    return float(m.group(1)) * 1e12, int(n.group(1))


def shape(plan):
    p = plan.get("pipeline", {})
    zero = {}
    recompute = 0
    for op in plan["ops"]:
        if op.get("zero"):
            zero[op["zero"]] = zero.get(op["zero"], 0) + 1
        recompute += bool(op.get("recompute"))
    # The first attention projection's split (column-parallel under
    # tensor parallelism: n; b0 is the sample split).
    qkv = next((op for op in plan["ops"] if op["kind"] == "MatMul"
                and "qkv" in op["op"]), None)
    split = (" ".join(f"{l}={d}" for l, d in sorted(qkv["loops"].items()))
             or "-") if qkv else "?"
    z = ",".join(f"ZeRO-{k} x{v}" for k, v in sorted(zero.items()))
    return (f"{p.get('stages', 1)} stages, m={p.get('micro_batches', 1)}, "
            f"qkv {split}"
            + (f", {z}" if z else "")
            + (f", {recompute} recomputed" if recompute else ""))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--searchers", default=",".join(SEARCHERS))
    ap.add_argument("--timeout", default="10m")
    ap.add_argument("--soapc", default="build/bin/soapc")
    ap.add_argument("--out", default="bench/results/gpt3.json")
    a = ap.parse_args()
    rows = []
    print(f"GPT-3, bf16 + Adam, {SEQ}-token sequences; timeout {a.timeout} "
          "per searcher")
    print(f"{'model':<7}{'GPUs':>6}{'batch':>7} {'searcher':<10}{'time s':>9}"
          f"{'MFU %':>7}{'peak GiB':>10}{'search s':>10}  shape")
    tmp = tempfile.mkdtemp()
    for key in a.rows.split(","):
        model, topo, batch = ROWS[key]
        mpath = f"examples/models/{model}.onnx"
        tpath = f"examples/topologies/{topo}.json"
        params = parameters(a.soapc, mpath)
        peak, devices = peak_bf16(a.soapc, tpath)
        flops = 6 * params * batch * SEQ
        for s in a.searchers.split(","):
            plan_path = os.path.join(tmp, f"{model}-{s}.json")
            cmd = [a.soapc, mpath, "--topology", tpath, "--batch", str(batch),
                   "--precision", "bf16", "--optimizer", "adam", "--search", s,
                   "--timeout", a.timeout, "--budget", "2000", "-o", plan_path]
            t0 = time.time()
            p = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.time() - t0
            row = {"model": model, "parameters": params, "topology": topo,
                   "devices": devices, "batch": batch, "searcher": s,
                   "exit": p.returncode, "wall_s": wall}
            if p.returncode == 0:
                plan = json.load(open(plan_path))
                it = plan["predicted"]["iteration_time_s"]
                mfu = flops / it / (devices * peak)
                row.update(iteration_s=it, mfu=mfu,
                           peak_bytes=plan["predicted"]["peak_memory_bytes"],
                           shape=shape(plan),
                           timed_out="timed out" in p.stdout + p.stderr)
                print(f"{key:<7}{devices:>6}{batch:>7} {s:<10}{it:>9.2f}"
                      f"{mfu*100:>7.1f}"
                      f"{row['peak_bytes']/2**30:>10.1f}{wall:>10.1f}  "
                      f"{row['shape']}"
                      + (" (timed out: best so far)" if row["timed_out"]
                         else ""))
            else:
                row["error"] = (p.stderr.strip().splitlines() or [""])[-1]
                print(f"{key:<7}{devices:>6}{batch:>7} {s:<10}{'-':>9}"
                      f"{'-':>7}{'-':>10}{wall:>10.1f}  exit {p.returncode}: "
                      f"{row['error'][:70]}")
            rows.append(row)
        if key in PUBLISHED:
            print(f"{'':<21}published: {PUBLISHED[key]}")
    rows = merge_rows(a.out, rows)
    with open(a.out, "w") as f:
        json.dump({"sequence": SEQ, "precision": "bf16", "optimizer": "adam",
                   "published": PUBLISHED, "rows": rows}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
