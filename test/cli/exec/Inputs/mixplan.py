#!/usr/bin/python3
"""Rewrite a soapc plan into one that splits every kind of loop. Op k splits
up to two loops by 2 (one loop every third op), preferring the classes S, A,
P, R in an order that rotates with k, and the loops that norms, softmax and
the loss normalise over before any other; it places its tiles on the devices
from k mod N on, and an op with two tiles runs each twice (replicas). Needs
`soapc dump --format json` of the same model and batch. Prints a summary.

    mixplan.py plan.json dump.json out.json [KIND:LOOP=DEGREE ...]

Each KIND:LOOP=DEGREE then splits every op of that kind along that loop alone
(say Gather:v=4, an embedding split by vocabulary)."""
import json
import sys


def main():
    plan_path, dump_path, out_path = sys.argv[1:4]
    forced = {}
    for arg in sys.argv[4:]:
        kind, split = arg.split(":")
        loop, degree = split.split("=")
        forced[kind] = (loop, int(degree))
    with open(plan_path) as f:
        plan = json.load(f)
    with open(dump_path) as f:
        dump = {o["name"]: o for o in json.load(f)["ops"]}
    n = plan["topology"]["devices"]
    order = "SAPR"
    classes = {c: 0 for c in order}
    nstat = replicated = 0
    for k, op in enumerate(plan["ops"]):
        loops = dump[op["op"]]["loops"]
        pref = order[k % 4:] + order[:k % 4]

        def ok(l):
            return (l["splittable"] and l["size"] % 2 == 0 and
                    (l["size"] // 2) % l["granule"] == 0)
        cands = [l for c in pref for l in loops if l["class"] == c and ok(l)]
        # Norm-like ops: split the loops they normalise over first.
        stat = [l for l in cands if l["stat_reduced"]]
        if stat:
            cands = stat + [l for l in cands if not l["stat_reduced"]]
        split = cands[:1 if k % 3 == 0 else 2]
        tiles = 2 ** len(split)
        replicas = 2 if tiles == 2 and k % 3 == 0 else 1
        if tiles * replicas > n:
            replicas = 1
        for l in split:
            classes[l["class"]] += 1
        nstat += any(l["stat_reduced"] for l in split)
        replicated += replicas > 1
        op["loops"] = {l["name"]: 2 for l in split}
        op["replicas"] = replicas
        op["devices"] = [(k + t) % n for t in range(tiles * replicas)]
        if op["kind"] in forced:
            loop, degree = forced[op["kind"]]
            op["loops"] = {loop: degree}
            op["replicas"] = 1
            op["devices"] = [(k + t) % n for t in range(degree)]
    print("mixplan: %d ops; splits %s; statistics split in %d ops; "
          "%d ops replicated" % (len(plan["ops"]), " ".join(
              "%s:%d" % (c, classes[c]) for c in order), nstat, replicated))
    with open(out_path, "w") as f:
        json.dump(plan, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
