#!/usr/bin/python3
"""Checks the Megatron-LM arguments `soapc emit --target megatron` printed for
a what-if plan against the keys the plan records ("searcher": "simulate
megatron:KEYS"), its batch, precision and optimizer, and the model's shape
as published. Every argument must be one that the keys call for, with the
value they give, and every one they call for must be there: a key dropped,
mis-mapped or given the wrong value fails. Prints "ok: N arguments" or the
differences, exiting 1.

    megatron_args.py PLAN.json ARGS.txt layers=96,hidden=12288,...
"""

import json
import shlex
import sys


def what_if_keys(plan):
    searcher = plan["search"]["searcher"]
    prefix = "simulate megatron:"
    if not searcher.startswith(prefix):
        sys.exit(f"megatron_args.py: not a megatron what-if plan: {searcher}")
    keys = {"tp": "1", "pp": "1", "vp": "1", "cp": "1", "mbs": "1", "sp": "0",
            "recompute": "none", "distopt": "0", "schedule": "1f1b",
            "overlap_grad_reduce": "1"}
    given = dict(item.split("=") for item in searcher[len(prefix):].split(","))
    keys.update(given)
    # sp left out: on with tensor parallelism (the models here all have a
    # sequence), as soapc's what-if resolves it.
    if "sp" not in given:
        keys["sp"] = "1" if int(keys["tp"]) > 1 else "0"
    return keys


def parse_args(text):
    """The argument lines: each but the last continued with ' \\'; one flag
    and its value (if any) per line."""
    lines = text.rstrip("\n").split("\n")
    problems = []
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        if last == line.endswith(" \\"):
            problems.append(f"line {i + 1} {'ends' if last else 'does not end'}"
                            f" with ' \\': {line!r}")
    args = {}
    for line in lines:
        words = shlex.split(line.rstrip("\\").strip())
        if not words or not words[0].startswith("--") or len(words) > 2:
            problems.append(f"not one flag and at most one value: {line!r}")
            continue
        if words[0] in args:
            problems.append(f"{words[0]} given twice")
        args[words[0]] = words[1] if len(words) == 2 else True
    return args, problems


def expected_args(plan, keys, shape):
    tp, pp, vp, cp = (int(keys[k]) for k in ("tp", "pp", "vp", "cp"))
    distopt = keys["distopt"] == "1"
    overlap_grad = keys["overlap_grad_reduce"] == "1"
    overlap_param = keys.get("overlap_param_gather",
                             "1" if distopt and overlap_grad else "0") == "1"
    exp = {
        "--tensor-model-parallel-size": str(tp),
        "--pipeline-model-parallel-size": str(pp),
        "--context-parallel-size": str(cp),
        "--micro-batch-size": keys["mbs"],
        "--global-batch-size": str(plan["model"]["batch"]),
    }
    if vp > 1:
        exp["--num-layers-per-virtual-pipeline-stage"] = str(
            shape["layers"] // (pp * vp))
    if keys["sp"] == "1":
        exp["--sequence-parallel"] = True
    if keys.get("tp_comm_overlap", keys["sp"]) == "1":
        exp["--tp-comm-overlap"] = True
    if keys["recompute"] == "selective":
        exp["--recompute-granularity"] = "selective"
    elif keys["recompute"] == "full":
        exp["--recompute-granularity"] = "full"
        exp["--recompute-method"] = "uniform"
        exp["--recompute-num-layers"] = "1"
    if distopt:
        exp["--use-distributed-optimizer"] = True
    if overlap_grad:
        exp["--overlap-grad-reduce"] = True
    if distopt and overlap_param:
        exp["--overlap-param-gather"] = True
    if "bucket_size" in keys:
        exp["--ddp-bucket-size"] = keys["bucket_size"]
    if plan["search"]["precision"] == "bf16":
        exp["--bf16"] = True
    optimizer = plan["search"]["optimizer"]
    if optimizer == "adam":
        exp["--optimizer"] = "adam"
    else:
        exp["--optimizer"] = "sgd"
        exp["--sgd-momentum"] = "0.9" if optimizer == "momentum" else "0"
    exp["--num-layers"] = str(shape["layers"])
    exp["--hidden-size"] = str(shape["hidden"])
    exp["--ffn-hidden-size"] = str(shape["ffn"])
    exp["--num-attention-heads"] = str(shape["heads"])
    exp["--seq-length"] = str(shape["seq"])
    return exp


def main():
    plan = json.load(open(sys.argv[1]))
    args, problems = parse_args(open(sys.argv[2]).read())
    shape = {k: int(v) for k, v in
             (item.split("=") for item in sys.argv[3].split(","))}
    exp = expected_args(plan, what_if_keys(plan), shape)
    for flag in sorted(set(exp) | set(args)):
        if flag not in args:
            problems.append(f"missing {flag} {exp[flag]}")
        elif flag not in exp:
            problems.append(f"unexpected {flag} {args[flag]}")
        elif args[flag] != exp[flag]:
            problems.append(f"{flag} {args[flag]}, expected {exp[flag]}")
    for p in problems:
        print(f"megatron_args.py: {p}")
    if problems:
        sys.exit(1)
    print(f"ok: {len(args)} arguments")


if __name__ == "__main__":
    main()
