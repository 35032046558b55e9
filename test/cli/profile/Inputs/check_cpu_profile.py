#!/usr/bin/python3
"""Summarises a cost database written by soap-profile --backend cpu for
cpu.test: the device block, whether every kernel has a forward time, and the
collective curves (kind, group shape, number of sizes)."""
import json
import sys


def main():
    with open(sys.argv[1]) as f:
        db = json.load(f)
    dev = db["device"]
    print("device %s, %d ranks, %d thread%s per rank, copy bandwidth %s"
          % (dev["name"], dev["ranks"], dev["threads_per_rank"],
             "" if dev["threads_per_rank"] == 1 else "s",
             "> 0" if db.get("calibration", {}).get(
                 "memory_bandwidth_bytes_per_sec", 0) > 0 else "missing"))
    kernels = db["kernels"]
    bad = [k["signature"] for k in kernels if not k["forward_s"] > 0]
    print("every kernel timed: forward > 0" if kernels and not bad
          else "untimed: %s" % bad[:3])
    curves = sorted("%s %dx%d, %d sizes" % (c["collective"], c["nodes"],
                                            c["gpus_per_node"],
                                            len(c["points"]))
                    for c in db.get("collectives", []))
    sizes = {c.split(", ")[1] for c in curves}
    names = [c.split(",")[0] for c in curves]
    print("collectives: %s, %s each" % (", ".join(names),
                                         sizes.pop() if len(sizes) == 1
                                         else "sizes differ"))


if __name__ == "__main__":
    main()
