#!/usr/bin/python3
"""bench/fold.py [--rows NAME,...] [--out bench/results/fold.json]

Task graphs that do not grow with devices: `soapc simulate` of
a symmetric strategy folded (the default: one group of identical devices
simulated, Sim/Fold.h) and with --no-fold (every device's tasks), one
process at a time: tasks, wall time, peak resident memory (GNU time's %M)
and whether the two give the same iteration time and memory. A row's
--no-fold run is skipped where its graph would not fit this machine
(`--skip-full`). Writes JSON. Asserts nothing."""

import argparse
import json
import os
import re
import subprocess
import tempfile
import time

# name: (model, topology, batch, strategy: data or a searcher whose plan is
# simulated, extra flags, simulate --no-fold too)
ROWS = {
    "inception_v3-64": ("inception_v3", "dgx-h100-8", 64 * 64, "data",
                        [], True),
    "gpt2-64": ("gpt2", "dgx-h100-8", 64 * 8, "data", [], True),
    "gpt2-1024": ("gpt2", "dgx-h100-128", 2048, "data", [], True),
    "gpt3_13b-1024-megatron": ("gpt3_13b", "dgx-h100-128", 2048, "megatron",
                               ["--precision", "bf16", "--optimizer", "adam"],
                               True),
    "gpt3_175b-1024-megatron": ("gpt3_175b", "dgx-h100-128", 2048,
                                "megatron", ["--precision", "bf16",
                                             "--optimizer", "adam"], False),
}


def run(cmd):
    t0 = time.time()
    p = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb=%M"] + cmd,
                       capture_output=True, text=True)
    wall = time.time() - t0
    m = re.search(r"maxrss_kb=([0-9]+)", p.stderr)
    return p.returncode, p.stdout, p.stderr, wall, \
        int(m.group(1)) * 1024 if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--soapc", default="build/bin/soapc")
    ap.add_argument("--timeout", default="15m")
    ap.add_argument("--out", default="bench/results/fold.json")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    rows = []
    print(f"{'row':<26}{'fold':>5}{'tasks':>11}{'wall s':>8}{'GB':>6}"
          f"{'full tasks':>12}{'wall s':>8}{'GB':>6}  same")
    for key in a.rows.split(","):
        model, topo, batch, strategy, flags, full = ROWS[key]
        mpath = f"examples/models/{model}.onnx"
        tpath = f"examples/topologies/{topo}.json"
        common = [mpath, "--topology", tpath, "--batch", str(batch)] + flags
        row = {"row": key, "model": model, "topology": topo, "batch": batch,
               "strategy": strategy}
        if strategy != "data":
            plan = os.path.join(tmp, key + ".json")
            code, out, err, wall, rss = run(
                [a.soapc] + common + ["--search", strategy, "--timeout",
                                      a.timeout, "-o", plan])
            row["search_exit"] = code
            row["search_s"] = wall
            if code != 0:
                row["error"] = err.strip().splitlines()[-1]
                rows.append(row)
                print(f"{key:<26} {strategy}: exit {code}: {row['error']}")
                continue
            strategy = plan
        results = {}
        for mode in (["fold", "full"] if full else ["fold"]):
            cmd = [a.soapc, "simulate"] + common + [
                "--strategy", strategy, "--format", "json"]
            if mode == "full":
                cmd.append("--no-fold")
            code, out, err, wall, rss = run(cmd)
            r = {"exit": code, "wall_s": wall, "peak_rss_bytes": rss}
            if code == 0:
                j = json.loads(out)
                r.update(tasks=j["tasks"], fold=j.get("fold", 1),
                         iteration_s=j["iteration_s"], memory=j["memory"])
            else:
                r["error"] = err.strip().splitlines()[-1]
            results[mode] = r
        f = results["fold"]
        same = ""
        if "full" in results and "tasks" in results["full"] and "tasks" in f:
            g = results["full"]
            same = str(f["iteration_s"] == g["iteration_s"] and
                       f["memory"] == g["memory"])
        for r in results.values():
            r.pop("memory", None)
        row.update(results)
        row["same"] = same
        rows.append(row)
        g = results.get("full", {})
        print(f"{key:<26}{f.get('fold', 0):>5}{f.get('tasks', 0):>11,}"
              f"{f['wall_s']:>8.1f}{(f['peak_rss_bytes'] or 0)/1e9:>6.2f}"
              + (f"{g.get('tasks', 0):>12,}{g['wall_s']:>8.1f}"
                 f"{(g['peak_rss_bytes'] or 0)/1e9:>6.2f}" if g else
                 f"{'-':>12}{'-':>8}{'-':>6}")
              + f"  {same}"
              + (f"  iteration {f['iteration_s']*1e3:.2f} ms"
                 if "iteration_s" in f else f"  {f.get('error', '')}"),
              flush=True)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as fh:
        json.dump({"bench": "fold", "rows": rows}, fh, indent=2)
        fh.write("\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
