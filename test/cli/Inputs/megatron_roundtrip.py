#!/usr/bin/python3
"""Reads the Megatron-LM arguments `soapc emit --target megatron` printed for
a plan back as a `megatron:` what-if, has soapc build that what-if as a plan
(simulate -o), and compares it with the original op by op: the arguments
say everything the plan does when every op's configuration, stage, ZeRO
stage and recomputation, and the pipeline, come back the same. Prints "ok:
the arguments rebuild the plan's N ops" or the differences, exiting 1.

    megatron_roundtrip.py SOAPC PLAN.json ARGS.txt OUT.json
"""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_args import parse_args  # noqa: E402


def what_if(args):
    """The megatron: keys the arguments give."""
    keys = {
        "tp": args["--tensor-model-parallel-size"],
        "pp": args["--pipeline-model-parallel-size"],
        "cp": args["--context-parallel-size"],
        "mbs": args["--micro-batch-size"],
    }
    if "--num-layers-per-virtual-pipeline-stage" in args:
        layers = int(args["--num-layers"])
        per_chunk = int(args["--num-layers-per-virtual-pipeline-stage"])
        keys["vp"] = str(layers // (int(keys["pp"]) * per_chunk))
    keys["sp"] = "1" if "--sequence-parallel" in args else "0"
    keys["tp_comm_overlap"] = "1" if "--tp-comm-overlap" in args else "0"
    keys["recompute"] = args.get("--recompute-granularity", "none")
    distopt = "--use-distributed-optimizer" in args
    keys["distopt"] = "1" if distopt else "0"
    keys["overlap_grad_reduce"] = "1" if "--overlap-grad-reduce" in args else "0"
    if distopt:
        keys["overlap_param_gather"] = (
            "1" if "--overlap-param-gather" in args else "0")
    if "--ddp-bucket-size" in args:
        keys["bucket_size"] = args["--ddp-bucket-size"]
    return ",".join(f"{k}={v}" for k, v in keys.items())


def main():
    soapc, plan_path, args_path, out_path = sys.argv[1:5]
    plan = json.load(open(plan_path))
    args, problems = parse_args(open(args_path).read())
    if problems:
        sys.exit("\n".join(problems))
    keys = what_if(args)
    if int(args["--global-batch-size"]) != plan["model"]["batch"]:
        sys.exit(f"--global-batch-size {args['--global-batch-size']}, the "
                 f"plan's batch is {plan['model']['batch']}")
    cmd = [soapc, "simulate", plan["model"]["path"],
           "--topology", plan["topology"]["path"],
           "--batch", str(plan["model"]["batch"]),
           "--precision", plan["search"]["precision"],
           "--optimizer", plan["search"]["optimizer"],
           "--kernels", plan["search"]["kernels"],
           "--strategy", "megatron:" + keys, "-o", out_path, "-q"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    again = json.load(open(out_path))
    problems = []
    if plan["pipeline"] != again["pipeline"]:
        problems.append(f"pipeline {plan['pipeline']}, rebuilt "
                        f"{again['pipeline']}")
    if keys.find("distopt=1") >= 0 and \
            plan.get("grad_sync") != again.get("grad_sync"):
        problems.append(f"grad_sync {plan.get('grad_sync')}, rebuilt "
                        f"{again.get('grad_sync')}")
    for a, b in zip(plan["ops"], again["ops"]):
        if a != b:
            problems.append(f"op {a['op']}: {a}, rebuilt {b}")
            break
    if len(plan["ops"]) != len(again["ops"]):
        problems.append(f"{len(plan['ops'])} ops, rebuilt {len(again['ops'])}")
    for p in problems:
        print(f"megatron_roundtrip.py: megatron:{keys}: {p}")
    if problems:
        sys.exit(1)
    print(f"ok: the arguments rebuild the plan's {len(plan['ops'])} ops")


if __name__ == "__main__":
    main()
