#!/usr/bin/python3
"""bench/compare-stream.py [--timeout 30s] [--topology T] [--out FILE]

`soapc compare` on FlexFlow's six workloads with every
searcher and --timeout, timing when each row reaches the pipe. Prints a table
(per model: the fastest searcher's search time, when the first row arrived,
when the last arrived, the wall time, and which searchers timed out) and
writes JSON (default bench/results/compare-stream.json). Asserts nothing."""

import argparse
import json
import os
import subprocess
import sys
import time

MODELS = ["alexnet", "inception_v3", "resnet101", "rnntc", "rnnlm", "nmt"]
SEARCHERS = "mcmc,kcuts,ft,data,expert,model"


def duration(text):
    for suffix, scale in (("ms", 1e-3), ("s", 1), ("m", 60), ("h", 3600)):
        if text.endswith(suffix) and text[: -len(suffix)].replace(".", "").isdigit():
            return float(text[: -len(suffix)]) * scale
    return float(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", default="30s")
    ap.add_argument("--topology", default="examples/topologies/p100-4x4.json")
    ap.add_argument("--soapc", default="build/bin/soapc")
    ap.add_argument("--out", default="bench/results/compare-stream.json")
    a = ap.parse_args()
    limit = duration(a.timeout)
    rows = []
    print(f"soapc compare --search {SEARCHERS} --timeout {a.timeout} "
          f"on {os.path.basename(a.topology)}")
    print(f"{'model':<14}{'fastest s':>10}{'first row s':>12}{'last row s':>11}"
          f"{'wall s':>8}  timed out")
    for m in MODELS:
        cmd = [a.soapc, "compare", f"examples/models/{m}.onnx", "--topology",
               a.topology, "--search", SEARCHERS, "--timeout", a.timeout,
               "--format", "json"]
        if m in ("rnntc", "rnnlm", "nmt"):
            cmd.append("--unroll-rnn")
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        arrivals = []
        for line in p.stdout:
            arrivals.append((time.monotonic() - t0, json.loads(line)))
        p.wait()
        wall = time.monotonic() - t0
        if p.returncode != 0 or not arrivals:
            print(f"{m:<14} exit {p.returncode}", file=sys.stderr)
            continue
        fastest = min(r.get("search_s", 0) for _, r in arrivals)
        timed = [r["searcher"] for _, r in arrivals if r.get("timed_out")]
        row = {"model": m, "fastest_search_s": fastest,
               "first_row_s": arrivals[0][0], "last_row_s": arrivals[-1][0],
               "wall_s": wall, "timeout_s": limit, "timed_out": timed,
               "within_timeout_plus_1s": arrivals[-1][0] <= limit + 1,
               "rows": [dict(r, arrived_s=t) for t, r in arrivals]}
        rows.append(row)
        print(f"{m:<14}{fastest:>10.2f}{arrivals[0][0]:>12.2f}"
              f"{arrivals[-1][0]:>11.2f}{wall:>8.2f}  {','.join(timed) or '-'}")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"timeout": a.timeout, "topology": a.topology,
                   "searchers": SEARCHERS, "models": rows}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
