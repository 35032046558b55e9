#!/usr/bin/python3
"""Determinism check: every searcher `soapc --help` lists x every
model of the zoo: two searches each -- one with --threads 1, one with
--threads 2 (and --chains 2, so that threads have something to run) --
must exit alike and, when they write a plan, write the same plan. Two
processes, two thread counts: a search that depends on addresses, timing
or thread scheduling differs between them (a third run with --threads 1
added only CI time: this test took 506 s of it). A combination whose
searches all exit 3 (no feasible plan) is skipped with a line saying so.

Seeds. The searchers in SEEDED draw random numbers: each runs at seeds
{0, 1, 42}, and its two plans must have the same SHA-256. Every other
searcher is deterministic without a seed, which only reaches its plan's
"search.seed": it runs once at seed 0 (--threads 1) and once at seed 42
(--threads 2), and the two plans must be the same bytes but for that value. So a
searcher that starts drawing from the seed fails here until it is added to
SEEDED, and the seed-free searchers cost a third of what three seeds did.

    determinism.py SOAPC MODELS_DIR TOPOLOGY OUT_DIR [--jobs N] [--skip P,...]

Budgets are proposal counts (deterministic by definition): BUDGET by
default, less for searchers whose proposal is a whole simulated strategy.
Prints one line per combination that is not identical, a summary, and exits
1 on any difference.
"""

import argparse
import concurrent.futures
import hashlib
import os
import re
import subprocess
import sys
import time

SEEDS = (0, 1, 42)
THREADS = (1, 2)
SEEDED = ("mcmc", "exhaustive")
UNSEEDED_SEEDS = (0, 42)  # with THREADS, pairwise
BUDGET = 60
BUDGETS = {"exhaustive": 4}  # each of its proposals is a full simulation
BATCH = 64


def searchers(soapc):
    """The `searchers:` block of soapc --help: one "    name  description"
    line each, so searchers registered later are covered too."""
    out = subprocess.run([soapc, "--help"], capture_output=True, text=True,
                         check=True).stdout
    names, inside = [], False
    for line in out.splitlines():
        if line.strip() == "searchers:":
            inside = True
        elif inside and re.match(r"^    \S", line):
            names.append(line.split()[0])
        elif inside and names:
            break
    return names


def unseeded(path):
    """A plan's bytes with the value of its "seed" keys blanked (the plan
    writer's one-key-a-line layout), so the rest is compared byte for
    byte."""
    with open(path, "rb") as f:
        return re.sub(rb'"seed": [0-9]+', b'"seed": _', f.read())


def run(soapc, model, topology, searcher, seed, threads, out):
    cmd = [soapc, model, "--topology", topology, "--search", searcher,
           "--budget", str(BUDGETS.get(searcher, BUDGET)), "--seed",
           str(seed), "--batch", str(BATCH), "--chains", "2", "--threads",
           str(threads), "-o", out]
    p = subprocess.run(cmd, capture_output=True, text=True)
    digest = None
    if p.returncode == 0:
        with open(out, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    return p.returncode, digest, p.stderr.strip().splitlines()[-1:]


def check(args, searcher, model, seed):
    t0 = time.monotonic()
    kind, line = check_runs(args, searcher, model, seed)
    return kind, line, time.monotonic() - t0


def check_runs(args, searcher, model, seed):
    """seed is None for a searcher outside SEEDED: its runs take seeds
    UNSEEDED_SEEDS, and their plans are compared without search.seed."""
    name = os.path.splitext(os.path.basename(model))[0]
    seeds = UNSEEDED_SEEDS if seed is None else (seed,) * len(THREADS)
    tag = (f"{searcher} {name} seed {seed}" if seed is not None else
           f"{searcher} {name} seeds {', '.join(map(str, seeds))}")
    results, outs = [], []
    for k, (threads, s) in enumerate(zip(THREADS, seeds)):
        out = os.path.join(args.out, f"{searcher}-{name}-{s}-{k}.json")
        outs.append(out)
        results.append(run(args.soapc, model, args.topology, searcher, s,
                           threads, out))
    codes = [r[0] for r in results]
    digests = [r[1] for r in results]
    if len(set(codes)) != 1:
        return "fail", f"{tag}: exit codes differ: {codes} (runs: threads 1, 2)"
    if codes[0] == 3:
        return "skip", f"{tag}: skipped: no feasible plan (exit 3 in every run)"
    if codes[0] != 0:
        return "fail", f"{tag}: exit code {codes[0]}: {results[0][2]}"
    if seed is None:
        if len({unseeded(o) for o in outs}) != 1:
            return "fail", (f"{tag}: plans differ beyond search.seed (threads "
                            f"{', '.join(map(str, THREADS))}); if {searcher} "
                            "now draws from the seed, add it to SEEDED")
        return "same", f"{tag}: equal but for the seed"
    if len(set(digests)) != 1:
        return "fail", (f"{tag}: plans differ: " +
                        ", ".join(f"threads {t}: {d[:12]}" for t, d in
                                  zip(THREADS, digests)))
    return "same", f"{tag}: {digests[0][:16]}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("soapc")
    ap.add_argument("models")
    ap.add_argument("topology")
    ap.add_argument("out")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--skip", default="",
                    help="comma-separated model-name prefixes to leave out")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    names = searchers(args.soapc)
    skip = tuple(p for p in args.skip.split(",") if p)
    models = sorted(os.path.join(args.models, f)
                    for f in os.listdir(args.models)
                    if f.endswith(".onnx") and not (skip and f.startswith(skip)))
    if not names or not models:
        print(f"determinism: found {len(names)} searchers and {len(models)} "
              "models; expected some of each")
        return 1
    seeded = [n for n in names if n in SEEDED]
    print(f"determinism: searchers {', '.join(names)}; {len(models)} models; "
          f"seeds {', '.join(map(str, SEEDS))} for {', '.join(seeded)}; "
          f"{' and '.join(map(str, UNSEEDED_SEEDS))} for the others")
    jobs = [(s, m, seed) for s in names for m in models
            for seed in (SEEDS if s in SEEDED else (None,))]
    counts = {"same": 0, "skip": 0, "fail": 0}
    took = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for (kind, line, seconds), job in zip(
                pool.map(lambda j: check(args, *j), jobs), jobs):
            counts[kind] += 1
            took.append((seconds, job))
            if kind != "same":
                print(line)
    # Where the test's time goes (it is the longest of the suite).
    for seconds, (s, m, seed) in sorted(took, reverse=True)[:5]:
        name = os.path.splitext(os.path.basename(m))[0]
        which = "seeds 0/42" if seed is None else f"seed {seed}"
        print(f"determinism: slowest: {s} {name} {which}: {seconds:.1f} s")
    print(f"determinism: {len(jobs)} combinations: {counts['same']} "
          f"identical, {counts['skip']} skipped, {counts['fail']} failed")
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
