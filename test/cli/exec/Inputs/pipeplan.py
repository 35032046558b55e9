#!/usr/bin/python3
"""Rewrite a soapc plan into a pipelined one: the ops cut into STAGES stages
of equal op counts (in the plan's op order, a topological one), stage s on
devices s*G .. s*G+G-1 with every op split by sample G ways there (G = the
plan's devices / STAGES), M micro-batches under SCHEDULE. Needs `soapc dump
--format json` of the same model and batch for the sample loops' names.

    pipeplan.py plan.json dump.json out.json STAGES M [SCHEDULE]"""
import json
import sys


def main():
    plan_path, dump_path, out_path = sys.argv[1:4]
    stages, m = int(sys.argv[4]), int(sys.argv[5])
    schedule = sys.argv[6] if len(sys.argv) > 6 else "1f1b"
    with open(plan_path) as f:
        plan = json.load(f)
    with open(dump_path) as f:
        dump = {o["name"]: o for o in json.load(f)["ops"]}
    n = plan["topology"]["devices"]
    group = n // stages
    ops = plan["ops"]
    for i, op in enumerate(ops):
        s = i * stages // len(ops)
        sample = [l["name"] for l in dump[op["op"]]["loops"]
                  if l["class"] == "S"][0]
        op["stage"] = s
        op["loops"] = {sample: group} if group > 1 else {}
        op["replicas"] = 1
        op["devices"] = list(range(s * group, (s + 1) * group))
    plan["version"] = 2
    plan["pipeline"] = {"micro_batches": m, "schedule": schedule,
                        "stages": stages}
    with open(out_path, "w") as f:
        json.dump(plan, f, indent=2, sort_keys=True)
    print(f"pipeplan: {len(ops)} ops in {stages} stages of {group} devices, "
          f"{m} micro-batches, {schedule}")


if __name__ == "__main__":
    main()
