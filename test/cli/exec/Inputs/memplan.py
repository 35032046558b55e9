#!/usr/bin/python3
"""Rewrite a soapc plan with memory-saving choices: ZeRO stage
ZERO on every op with weights that runs on more than one device (a
data-parallel group in a data plan), and RECOMPUTE ("selective": every op
without weights that saves something for backward; "full": every op that
saves something). Needs `soapc dump --format json` of the same model and
batch for the ops' weights and saved bytes.

    memplan.py plan.json dump.json out.json ZERO [RECOMPUTE]"""
import json
import sys


def main():
    plan_path, dump_path, out_path = sys.argv[1:4]
    zero = int(sys.argv[4])
    recompute = sys.argv[5] if len(sys.argv) > 5 else "none"
    with open(plan_path) as f:
        plan = json.load(f)
    with open(dump_path) as f:
        dump = {o["name"]: o for o in json.load(f)["ops"]}
    zeroed = recomputed = 0
    for op in plan["ops"]:
        d = dump[op["op"]]
        weighted = any(i["kind"] == "weight" for i in d["inputs"])
        if zero and weighted and len(set(op["devices"])) > 1:
            op["zero"] = zero
            zeroed += 1
        saves = d.get("saved_bytes", 0) > 0
        if saves and (recompute == "full" or
                      (recompute == "selective" and not weighted)):
            op["recompute"] = True
            recomputed += 1
    plan["version"] = 2
    with open(out_path, "w") as f:
        json.dump(plan, f, indent=2, sort_keys=True)
    print(f"memplan: ZeRO-{zero} on {zeroed} ops, {recomputed} ops "
          f"recomputed ({recompute})")


if __name__ == "__main__":
    main()
