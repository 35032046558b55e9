#!/usr/bin/python3
"""bench/pipeline.py [--topology T] [--per-device N] [--timeout 10m] [--out F]

gpt2 and transformer (BERT-large-like) on dgx-h100-8
(64 H100s) at N sequences per device (default 64), every searcher under the
same simulator: data parallelism, the hand-written `megatron` plan (its best
tensor x pipeline shape), the `pipeline` searcher and mcmc (per-op SOAP
configurations, no stages). Prints a table (iteration time, samples/s,
peak memory, search time, the plan's shape) and writes JSON (default
bench/results/pipeline.json). Asserts nothing."""

import argparse
import json
import os
import re
import subprocess
import tempfile

SEARCHERS = ["data", "megatron", "pipeline", "mcmc"]


def shape(plan):
    p = plan.get("pipeline", {})
    return (f"{p.get('stages', 1)} stages, m={p.get('micro_batches', 1)} "
            f"{p.get('schedule', '')}")


def merge_rows(path, rows):
    """`rows` with the rows of `path` (a previous run) that they do not
    replace, keyed by (model, searcher), sorted; makes path's directory."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    old = {}
    if os.path.exists(path):
        # Rows of searchers not run this time are kept from the last run.
        for r in json.load(open(path)).get("rows", []):
            old[(r["model"], r["searcher"])] = r
    for r in rows:
        old[(r["model"], r["searcher"])] = r
    return [old[k] for k in sorted(old)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--topology", default="examples/topologies/dgx-h100-8.json")
    ap.add_argument("--per-device", type=int, default=64)
    ap.add_argument("--timeout", default="10m")
    ap.add_argument("--models", default="gpt2,transformer")
    ap.add_argument("--searchers", default=",".join(SEARCHERS))
    ap.add_argument("--soapc", default="build/bin/soapc")
    ap.add_argument("--out", default="bench/results/pipeline.json")
    a = ap.parse_args()
    topo = json.load(open(a.topology))
    devices = topo["nodes"] * topo["node"]["gpus"]
    batch = a.per_device * devices
    rows = []
    print(f"{os.path.basename(a.topology)}: {devices} devices, batch {batch} "
          f"({a.per_device} per device), timeout {a.timeout} per searcher")
    print(f"{'model':<12}{'searcher':<10}{'time ms':>11}{'samples/s':>11}"
          f"{'peak GiB':>10}{'search s':>10}  shape")
    tmp = tempfile.mkdtemp()
    for model in a.models.split(","):
        for s in a.searchers.split(","):
            plan_path = os.path.join(tmp, f"{model}-{s}.json")
            cmd = [a.soapc, f"examples/models/{model}.onnx", "--topology",
                   a.topology, "--batch", str(batch), "--search", s,
                   "--timeout", a.timeout, "--budget", "2000", "-o",
                   plan_path]
            p = subprocess.run(cmd, capture_output=True, text=True)
            row = {"model": model, "searcher": s, "batch": batch,
                   "exit": p.returncode}
            if p.returncode == 0:
                plan = json.load(open(plan_path))
                pred = plan["predicted"]
                row.update(iteration_s=pred["iteration_time_s"],
                           samples_per_s=pred["samples_per_sec"],
                           peak_bytes=pred["peak_memory_bytes"],
                           pipeline=plan.get("pipeline"),
                           timed_out="timed out" in p.stdout + p.stderr)
                for line in p.stdout.splitlines():
                    if line.startswith("searcher:"):
                        row["searcher_line"] = line
                        mt = re.search(r"([0-9]+) proposals, ([0-9.]+) s", line)
                        if mt:
                            row["proposals"] = int(mt.group(1))
                            row["search_s"] = float(mt.group(2))
                print(f"{model:<12}{s:<10}{pred['iteration_time_s']*1e3:>11.1f}"
                      f"{pred['samples_per_sec']:>11.0f}"
                      f"{pred['peak_memory_bytes']/2**30:>10.2f}"
                      f"{row.get('search_s', 0):>10.1f}  {shape(plan)}")
            else:
                row["error"] = (p.stderr.strip().splitlines() or [""])[-1]
                print(f"{model:<12}{s:<10}{'-':>11}{'-':>11}{'-':>10}"
                      f"{'':>10}  exit {p.returncode}: {row['error'][:70]}")
            rows.append(row)
    rows = merge_rows(a.out, rows)
    with open(a.out, "w") as f:
        json.dump({"topology": a.topology, "devices": devices, "batch": batch,
                   "rows": rows}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
