#!/usr/bin/python3
"""Compare two soap-run results: each step's loss (from its output) and every
final weight (from its --dump-weights directory).

    compare.py REF.out REF_DIR RUN.out RUN_DIR [--exact]

Equal means within max(1e-5 relative, 1e-6 absolute) per number, or
bit-identical with --exact. Prints one line; exits 1 on a mismatch."""
import array
import json
import os
import re
import sys


def losses(path):
    with open(path) as f:
        return [float(m.group(1)) for m in
                re.finditer(r"^step \d+ loss (\S+)", f.read(), re.M)]


def weights(d):
    with open(os.path.join(d, "weights.json")) as f:
        man = json.load(f)["weights"]
    out = {}
    for w in man:
        a = array.array("f")
        with open(os.path.join(d, w["file"]), "rb") as f:
            a.frombytes(f.read())
        out[w["name"]] = a
    return out


def close(a, b, exact):
    if exact:
        return array.array("f", [a]).tobytes() == array.array("f", [b]).tobytes()
    return abs(a - b) <= max(1e-5 * max(abs(a), abs(b)), 1e-6)


def main():
    args = [a for a in sys.argv[1:] if a != "--exact"]
    exact = "--exact" in sys.argv
    ref_out, ref_dir, run_out, run_dir = args
    la, lb = losses(ref_out), losses(run_out)
    if not la or len(la) != len(lb):
        sys.exit("MISMATCH: %d losses against %d" % (len(la), len(lb)))
    for k, (a, b) in enumerate(zip(la, lb)):
        if not close(a, b, exact):
            sys.exit("MISMATCH: step %d loss %.9g against %.9g" % (k + 1, a, b))
    wa, wb = weights(ref_dir), weights(run_dir)
    if sorted(wa) != sorted(wb):
        sys.exit("MISMATCH: weight names differ")
    n, worst = 0, 0.0
    for name in sorted(wa):
        a, b = wa[name], wb[name]
        if len(a) != len(b):
            sys.exit("MISMATCH: %s has %d elements against %d"
                     % (name, len(a), len(b)))
        for i, (x, y) in enumerate(zip(a, b)):
            if not close(x, y, exact):
                sys.exit("MISMATCH: %s[%d] %.9g against %.9g" % (name, i, x, y))
            worst = max(worst, abs(x - y))
        n += len(a)
    print("MATCH%s: %d losses, %d weights, %d elements"
          % (" exactly" if exact else "", len(la), len(wa), n))


if __name__ == "__main__":
    main()
