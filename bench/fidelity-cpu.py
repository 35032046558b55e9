#!/usr/bin/python3
"""bench/fidelity-cpu.py [--models M:B,..] [--searchers S,..] [--topology T]
[--profile P] [--seconds S] [--rounds R] [--build DIR] [--out F]

The closed loop on the CPU: for each zoo model and each searcher's
plan on this host as soap-run uses it (examples/topologies/cpu-2.json: two
MPI ranks of one core each), soapc's predicted iteration time and peak
memory per device under the host's own cost database (profiles/
xeon-avx512-core.json, written by `soap-profile --backend cpu`) beside
soap-run's measured step time: the fastest step over R runs of each plan
(in turn, each about S seconds of steps after a first that allocates and
warms up). This host is a KVM guest whose neighbours slow whole seconds of
steps by up to 70% at random; the minimum is the figure that repeats. The
median is printed and recorded too and measured peak bytes per rank (`--memory`).
Prints one row per model and plan, then per model whether the predicted
order of the distinct plans holds for each pair, and the summary: median
and worst relative error of the iteration time, memory ratios, the share of
pairs whose order is preserved. Writes JSON (default
bench/results/fidelity-cpu.json). Asserts nothing.

Run it on an otherwise idle machine: the two ranks take both cores."""

import argparse
import itertools
import json
import os
import re
import statistics
import tempfile

from mpirun import mpirun, run  # bench/mpirun.py, beside this file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_MODELS = ("lenet:64,resnet_small:32,mobilenet_small:32,"
                  "transformer_small:32,rnntc:8")
DEFAULT_SEARCHERS = "data,model,expert,mcmc,kcuts,balanced"
STEP = re.compile(r"^step (\d+) loss \S+ time (\S+) s", re.M)
MEM = re.compile(r"memory: rank (\d+) peak (\d+) bytes measured, (\d+) "
                 r"predicted")


def make_plan(model, batch, searcher, a, tmp):
    onnx = os.path.join(ROOT, "examples/models", model + ".onnx")
    plan = os.path.join(tmp, f"{model}-{searcher}.json")
    cmd = [a.soapc, onnx, "--topology", a.topology, "--batch", str(batch),
           "--search", searcher, "--budget", str(a.budget), "--seed", "0",
           "-o", plan]
    if a.profile:
        cmd += ["--profile", a.profile]
    run(cmd)
    with open(plan) as f:
        p = json.load(f)
    ops = p["ops"]
    devices = sorted({d for o in ops for d in o["devices"]})
    stages = 1 + max(o.get("stage", 0) for o in ops)
    m = p.get("pipeline", {}).get("micro_batches", 1)
    shape = "%d stage%s, m = %d, %d ops on devices %s" % (
        stages, "" if stages == 1 else "s", m, len(ops),
        ",".join(str(d) for d in devices))
    return {"model": model, "batch": batch, "searcher": searcher,
            "onnx": onnx, "path": plan, "plan": shape,
            "predicted_s": p["predicted"]["iteration_time_s"],
            "steps_s": [], "memory": []}


def run_plan(r, a):
    """One soap-run of the plan: steps for about a.seconds (10 at least),
    the first dropped (it allocates and warms up)."""
    k = max(10, min(400, int(a.seconds / max(r["predicted_s"], 1e-6))))
    out = mpirun(a.ranks, [a.soap_run, r["onnx"], r["path"], "--steps",
                           str(k + 1), "--threads", "1", "--memory"])
    steps = [float(t) for _, t in STEP.findall(out)]
    if len(steps) < 2:
        raise RuntimeError("soap-run printed %d steps" % len(steps))
    r["steps_s"] += steps[1:]
    mem = [{"rank": int(rk), "measured": int(m), "predicted": int(q),
            "ratio": int(m) / int(q) if int(q) else None}
           for rk, m, q in MEM.findall(out)]
    # The peak is the same every run; keep the largest seen.
    if not r["memory"]:
        r["memory"] = mem
    else:
        for old, new in zip(r["memory"], mem):
            if new["measured"] > old["measured"]:
                old.update(new)


def finish(r):
    r["measured_s"] = min(r["steps_s"])
    r["measured_median_s"] = statistics.median(r["steps_s"])
    r["error"] = (r["predicted_s"] - r["measured_s"]) / r["measured_s"]
    for k in ("onnx", "path"):
        del r[k]


def order_pairs(rows):
    """Pairs of distinct plans (different predicted times) of one model:
    whether the measured order is the predicted one."""
    out = []
    for x, y in itertools.combinations(rows, 2):
        if abs(x["predicted_s"] - y["predicted_s"]) <= \
                1e-9 * max(x["predicted_s"], y["predicted_s"]):
            continue  # the same plan (or tied): no order to keep
        keep = (x["predicted_s"] < y["predicted_s"]) == \
            (x["measured_s"] < y["measured_s"])
        out.append({"a": x["searcher"], "b": y["searcher"], "kept": keep})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--searchers", default=DEFAULT_SEARCHERS)
    ap.add_argument("--topology",
                    default=os.path.join(ROOT, "examples/topologies/cpu-2.json"))
    ap.add_argument("--profile", default="",
                    help="cost database (default: soapc's, profiles/"
                         "<device>.json of the source tree)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=1.0,
                    help="steps per run: about this long (10 at least)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="runs of every plan, in turn")
    ap.add_argument("--budget", default="2000")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out",
                    default=os.path.join(HERE, "results/fidelity-cpu.json"))
    a = ap.parse_args()
    a.soapc = os.path.join(a.build, "bin/soapc")
    a.soap_run = os.path.join(a.build, "bin/soap-run")
    rows, errors, pairs = [], [], []
    print(f"{'model':<18} {'batch':>5} {'searcher':<9} {'predicted ms':>12} "
          f"{'measured ms':>11} {'median ms':>10} {'error':>7} "
          f"{'memory ratio':>13}  plan")
    with tempfile.TemporaryDirectory() as tmp:
        for spec in a.models.split(","):
            model, batch = spec.split(":")
            mine = []
            for s in a.searchers.split(","):
                try:
                    mine.append(make_plan(model, int(batch), s, a, tmp))
                except RuntimeError as e:
                    errors.append({"model": model, "searcher": s,
                                   "error": str(e)})
                    print(f"{model:<18} {batch:>5} {s:<9}   error: {e}",
                          flush=True)
            # Rounds over the plans in turn, so a slow spell of the host
            # falls on every plan alike rather than on one.
            for _ in range(a.rounds):
                for r in list(mine):
                    try:
                        run_plan(r, a)
                    except RuntimeError as e:
                        errors.append({"model": model,
                                       "searcher": r["searcher"],
                                       "error": str(e)})
                        mine.remove(r)
            for r in mine:
                finish(r)
                ratios = [m["ratio"] for m in r["memory"] if m["ratio"]]
                mr = "-" if not ratios else (
                    f"{min(ratios):.3f}" if max(ratios) - min(ratios) < 5e-4
                    else f"{min(ratios):.3f}-{max(ratios):.3f}")
                print(f"{model:<18} {batch:>5} {r['searcher']:<9} "
                      f"{r['predicted_s'] * 1e3:>12.2f} "
                      f"{r['measured_s'] * 1e3:>11.2f} "
                      f"{r['measured_median_s'] * 1e3:>10.2f} "
                      f"{r['error'] * 100:>6.1f}% {mr:>13}  {r['plan']}",
                      flush=True)
            rows += mine
            mp = order_pairs(mine)
            pairs += [dict(p, model=model) for p in mp]
            if mp:
                print(f"{model}: order kept in {sum(p['kept'] for p in mp)} "
                      f"of {len(mp)} pairs of distinct plans", flush=True)
    summary = {}
    if rows:
        errs = [abs(r["error"]) for r in rows]
        ratios = [m["ratio"] for r in rows for m in r["memory"] if m["ratio"]]
        summary = {
            "plans": len(rows),
            "median_abs_error": statistics.median(errs),
            "worst_abs_error": max(errs),
            "memory_within_10pct": sum(abs(x - 1) <= 0.10 for x in ratios),
            "memory_ranks": len(ratios),
            "pairs": len(pairs),
            "pairs_kept": sum(p["kept"] for p in pairs),
        }
        print(f"iteration time: median error {summary['median_abs_error']:.1%}"
              f", worst {summary['worst_abs_error']:.1%} over {len(rows)} "
              f"plans; memory within 10% on {summary['memory_within_10pct']}"
              f" of {summary['memory_ranks']} ranks; order kept in "
              f"{summary['pairs_kept']} of {summary['pairs']} pairs")
    with open(a.out, "w") as f:
        json.dump({"bench": "fidelity-cpu", "topology":
                   os.path.relpath(a.topology, ROOT), "profile": a.profile,
                   "seconds": a.seconds, "rounds": a.rounds,
                   "summary": summary, "results": rows,
                   "pairs": pairs, "errors": errors}, f, indent=2)
    print(f"results: {os.path.relpath(a.out, ROOT)}")


if __name__ == "__main__":
    main()
