#!/usr/bin/python3
"""bench/scale.py [--rows gpt2,gpt3_13b,gpt3_175b,llama3_405b]
                  [--searchers S,...] [--budget 4m] [--timeout 5m]
                  [--out bench/results/scale.json]

Scale: searches on dgx-h100-128 (1,024 H100): GPT-2 (the zoo's export, fp32
+ SGD) and GPT-3 13B (the zoo's shape-only export, bf16 + Adam) at a global
batch of 2,048 sequences with data, kcuts, mcmc and ft; GPT-3 175B at NVIDIA's
1,024-GPU batch of 1,536 sequences of 2,048 tokens and Llama 3.1 405B at 2,048
sequences of 8,192 tokens (16M tokens, the Llama 3 paper's batch), bf16 +
Adam, with megatron, pipeline and mcmc. --searchers replaces every row's
list. Each searcher runs as a user runs
it, `soapc MODEL --search S --budget B --timeout T`, one process at a time;
the table gives its wall time, the search time and proposals it printed,
proposals per second, the process's peak resident memory (GNU time's %M)
and the predicted iteration time. Goal: every searcher returns
within 5 minutes and 8 GB. Writes JSON (rows not run this time are kept
from the file). Asserts nothing."""

import argparse
import json
import os
import re
import subprocess
import tempfile
import time

from pipeline import merge_rows  # bench/pipeline.py, beside this file

BF16_ADAM = ["--precision", "bf16", "--optimizer", "adam"]
SMALL = ["data", "kcuts", "mcmc", "ft"]
LARGE = ["megatron", "pipeline", "mcmc"]
# key: (model, batch, flags, searchers)
ROWS = {
    "gpt2": ("gpt2", 2048, ["--optimizer", "sgd"], SMALL),
    "gpt3_13b": ("gpt3_13b", 2048, BF16_ADAM, SMALL),
    "gpt3_175b": ("gpt3_175b", 1536, BF16_ADAM, LARGE),
    "llama3_405b": ("llama3_405b", 2048, BF16_ADAM, LARGE),
}
TOPOLOGY = "dgx-h100-128"


def run(cmd):
    """Runs `cmd`; returns (exit code, stdout, stderr, wall s)."""
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    out, err = p.communicate()
    wall = time.time() - t0
    return p.returncode, out, err, wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--searchers", default="",
                    help="comma-separated; default: each row's own list")
    ap.add_argument("--budget", default="4m")
    ap.add_argument("--timeout", default="5m")
    ap.add_argument("--soapc", default="build/bin/soapc")
    ap.add_argument("--out", default="bench/results/scale.json")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    rows = []
    print(f"{TOPOLOGY} (1,024 H100); --budget {a.budget} "
          f"--timeout {a.timeout}")
    print(f"{'model':<12}{'searcher':<10}{'exit':>5}{'wall s':>9}"
          f"{'search s':>10}{'proposals':>11}{'prop/s':>9}{'peak GB':>9}"
          f"{'iter ms':>10}")
    for key in a.rows.split(","):
        model, batch, flags, searchers = ROWS[key]
        for s in (a.searchers.split(",") if a.searchers else searchers):
            plan = os.path.join(tmp, f"{key}-{s}.json")
            cmd = ["/usr/bin/time", "-f", "maxrss_kb=%M", a.soapc,
                   f"examples/models/{model}.onnx", "--topology",
                   f"examples/topologies/{TOPOLOGY}.json", "--batch",
                   str(batch), "--search", s, "--budget", a.budget,
                   "--timeout", a.timeout, "-o", plan] + flags
            code, out, err, wall = run(cmd)
            m = re.search(r"maxrss_kb=([0-9]+)", err)
            rss = int(m.group(1)) * 1024 if m else None
            row = {"model": key, "searcher": s, "topology": TOPOLOGY,
                   "batch": batch, "budget": a.budget, "timeout": a.timeout,
                   "exit": code, "wall_s": wall, "peak_rss_bytes": rss}
            m = re.search(r"searcher: \S+ \(([0-9]+) proposals, ([0-9.]+) s"
                          r"(?:, ([0-9.]+) proposals/s)?", out)
            if m:
                row.update(proposals=int(m.group(1)),
                           search_s=float(m.group(2)),
                           proposals_per_s=float(m.group(3) or 0))
            if code == 0:
                row["iteration_s"] = json.load(
                    open(plan))["predicted"]["iteration_time_s"]
                row["ended"] = ("budget ended" if "budget ended" in out else
                                "timed out" if "timed out" in out else "")
            else:
                # GNU time's own lines ("Command exited ...") are not
                # soapc's message.
                lines = [l for l in err.splitlines()
                         if not l.startswith(("maxrss_kb=", "Command "))]
                row["error"] = lines[-1] if lines else ""
            rows.append(row)
            it = (f"{row['iteration_s']*1e3:>10.2f}" if "iteration_s" in row
                  else f"{'-':>10}")
            print(f"{key:<12}{s:<10}{code:>5}{wall:>9.1f}"
                  f"{row.get('search_s', 0):>10.1f}"
                  f"{row.get('proposals', 0):>11,}"
                  f"{row.get('proposals_per_s', 0):>9.2f}"
                  f"{(rss or 0)/1e9:>9.2f}{it}"
                  + (f"  {row['ended']}" if row.get("ended") else "")
                  + (f"  {row['error'][:60]}" if "error" in row else ""),
                  flush=True)
    rows = merge_rows(a.out, rows)
    with open(a.out, "w") as f:
        json.dump({"bench": "scale", "rows": rows}, f, indent=2)
        f.write("\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
