#!/usr/bin/env python3
"""Summarise the shape of cost frontiers written by `soapc frontier --write-json`:
the knee (the point furthest below the chord from the least-memory point to the
fastest one, both axes normalised to their range) and the slope of iteration time
against memory per device before and after it. A sharp turning point (TensorOpt
Figure 6) has most of the time gain within a small part of the memory range.

    bench/ft_knee.py bench/results/ft-transformer-frontier*.json
"""
import json
import sys


def knee(path):
    with open(path) as f:
        d = json.load(f)
    p = d["points"]
    if len(p) < 3:
        return f"{path}: {len(p)} points, no knee"
    m = [x["memory_bytes"] / 2**30 for x in p]
    t = [x["time_s"] for x in p]
    dm, dt = m[-1] - m[0], t[0] - t[-1]
    k = max(range(len(p)), key=lambda i: (t[0] - t[i]) / dt - (m[i] - m[0]) / dm)
    before = (t[0] - t[k]) / (m[k] - m[0])
    after = (t[k] - t[-1]) / (m[-1] - m[k])
    return (
        f"{path}: {len(p)} points ({d['max_split_loops']}-D meshes); least memory "
        f"{m[0]:.2f} GiB at {t[0]:.2f} s; knee {m[k]:.2f} GiB at {t[k]:.2f} s; fastest "
        f"{m[-1]:.2f} GiB at {t[-1]:.2f} s; slope {before:.3f} s/GiB before the knee, "
        f"{after:.3f} after ({before / after:.0f}x); {100 * (t[0] - t[k]) / dt:.0f}% of "
        f"the time gained within the first {100 * (m[k] - m[0]) / dm:.0f}% of the "
        f"memory range")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for a in sys.argv[1:]:
        print(knee(a))
