#!/usr/bin/python3
"""bench/gap.py [--models M,..] [--topologies T,..] [--searchers S,..]
[--per-device 64] [--budget 2000] [--timeout 5m] [--out F]

A measure on FlexFlow's six workloads on its two clusters: how
much of the gap between data parallelism and the ideal the best plan
closes. The ideal is the iteration time of one device of the same kind at
the same per-device batch (all the work, none of the communication:
`soapc simulate --strategy data` on a one-device cluster); the best plan is
the fastest of the searchers' (`soapc compare`, all under the same cost
model and simulator). Share closed = (data - best) / (data - ideal); rows
whose gap (data / ideal - 1) is under 5% are marked: there is little to
close. Prints a table, writes JSON (default bench/results/gap.json).
Asserts nothing."""

import argparse
import json
import os
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS = "alexnet,inception_v3,resnet101,rnntc,rnnlm,nmt"
TOPOLOGIES = "p100-4x4,k80-16x4"


def one_device(topology_path, tmp):
    """A cluster of one device of `topology_path`'s kind."""
    with open(topology_path) as f:
        device = json.load(f)["device"]
    doc = {"name": "one-" + device, "description": "one device",
           "device": device, "nodes": 1,
           "node": {"gpus": 1, "intra": {
               "kind": "pcie", "bandwidth_gbps": 100, "latency_us": 1,
               "switches": [{"id": "cpu", "kind": "cpu", "gpus": [0]}]}}}
    path = os.path.join(tmp, "one-%s.json" % device)
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def devices(soapc, topology_path):
    out = subprocess.run([soapc, "topo", topology_path], capture_output=True,
                         text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith("device:") and " x " in line:
            return int(line.rsplit(" x ", 1)[1])
    raise RuntimeError("soapc topo printed no device count")


def iteration(soapc, args):
    p = subprocess.run([soapc, "simulate"] + args, capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip().splitlines()[-1])
    for line in p.stdout.splitlines():
        if line.startswith("iteration time:"):
            return float(line.split()[2]) * 1e-3
    raise RuntimeError("soapc simulate printed no iteration time")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--topologies", default=TOPOLOGIES)
    ap.add_argument("--searchers", default="mcmc,kcuts,pipeline")
    ap.add_argument("--per-device", type=int, default=64)
    ap.add_argument("--budget", default="2000")
    ap.add_argument("--timeout", default="5m")
    ap.add_argument("--soapc", default=os.path.join(ROOT, "build/bin/soapc"))
    ap.add_argument("--out", default=os.path.join(HERE, "results/gap.json"))
    a = ap.parse_args()
    rows = []
    print(f"{'model':<14} {'cluster':<10} {'GPUs':>4} {'ideal ms':>9} "
          f"{'data ms':>9} {'gap':>6} {'best ms':>9} {'closed':>7}  best")
    with tempfile.TemporaryDirectory() as tmp:
        for topo in a.topologies.split(","):
            tpath = os.path.join(ROOT, "examples/topologies", topo + ".json")
            n = devices(a.soapc, tpath)
            one = one_device(tpath, tmp)
            for model in a.models.split(","):
                mpath = os.path.join(ROOT, "examples/models", model + ".onnx")
                batch = a.per_device * n
                row = {"model": model, "topology": topo, "devices": n,
                       "batch": batch}
                try:
                    ideal = iteration(a.soapc, [mpath, "--topology", one,
                                                "--batch",
                                                str(a.per_device),
                                                "--strategy", "data"])
                    p = subprocess.run(
                        [a.soapc, "compare", mpath, "--topology", tpath,
                         "--batch", str(batch), "--search",
                         "data," + a.searchers, "--budget", a.budget,
                         "--timeout", a.timeout, "--jobs", "1",
                         "--format", "json"],
                        capture_output=True, text=True)
                    res = [json.loads(l) for l in p.stdout.splitlines()
                           if l.startswith("{")]
                    if p.returncode != 0 and not res:
                        raise RuntimeError(
                            p.stderr.strip().splitlines()[-1])
                except RuntimeError as e:
                    row["error"] = str(e)
                    rows.append(row)
                    print(f"{model:<14} {topo:<10} {n:>4}   error: {e}")
                    continue
                data = next(r["iteration_s"] for r in res
                            if r["searcher"] == "data")
                found = [r for r in res if r.get("iteration_s")]
                best = min(found, key=lambda r: r["iteration_s"])
                gap = data / ideal - 1
                closed = (data - best["iteration_s"]) / (data - ideal) \
                    if data > ideal else None
                row.update({"ideal_s": ideal, "data_s": data, "gap": gap,
                            "best_s": best["iteration_s"],
                            "best_searcher": best["searcher"],
                            "closed": closed, "searchers": res})
                rows.append(row)
                cl = "-" if closed is None else f"{closed:.0%}"
                note = "" if gap >= 0.05 else "  (gap < 5%)"
                print(f"{model:<14} {topo:<10} {n:>4} {ideal * 1e3:>9.2f} "
                      f"{data * 1e3:>9.2f} {gap:>6.0%} "
                      f"{best['iteration_s'] * 1e3:>9.2f} {cl:>7}  "
                      f"{best['searcher']}{note}", flush=True)
    with open(a.out, "w") as f:
        json.dump({"bench": "gap", "per_device": a.per_device,
                   "budget": a.budget, "results": rows}, f, indent=2)
    print(f"results: {os.path.relpath(a.out, ROOT)}")


if __name__ == "__main__":
    main()
