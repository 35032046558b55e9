#!/usr/bin/python3
"""Compare two runs of a `soapc emit --target dtensor` program (--dump
files): each step's loss and every final weight within soap-run's
tolerance, max(1e-5 relative, 1e-6 absolute) per number (compare.py of
test/cli/exec). Prints one line per pair, after the run's name when there
are several pairs; exits 1 on a mismatch.

    compare_npz.py REF.npz RUN.npz [REF.npz RUN.npz]..."""
import os
import sys

import numpy as np


def compare(ref, run):
    """'MATCH: ...' or 'MISMATCH: ...'."""
    a, b = np.load(ref), np.load(run)
    if sorted(a.files) != sorted(b.files):
        return "MISMATCH: the weights differ in name"
    la, lb = a["losses"], b["losses"]
    if len(la) == 0 or la.shape != lb.shape:
        return "MISMATCH: %d losses against %d" % (len(la), len(lb))
    n = 0
    for name in ["losses"] + sorted(f for f in a.files if f != "losses"):
        x, y = a[name].astype(np.float64), b[name].astype(np.float64)
        if x.shape != y.shape:
            return "MISMATCH: %s has shape %s against %s" % (
                name, x.shape, y.shape)
        tol = np.maximum(1e-5 * np.maximum(np.abs(x), np.abs(y)), 1e-6)
        bad = np.flatnonzero(~(np.abs(x - y) <= tol))
        if bad.size:
            i = int(bad[0])
            return "MISMATCH: %s[%d] %.9g against %.9g" % (
                name, i, x.reshape(-1)[i], y.reshape(-1)[i])
        if name != "losses":
            n += x.size
    return "MATCH: %d losses, %d weights, %d elements" % (
        len(la), len(a.files) - 1, n)


def main():
    pairs = list(zip(sys.argv[1::2], sys.argv[2::2]))
    bad = False
    for ref, run in pairs:
        line = compare(ref, run)
        bad |= not line.startswith("MATCH")
        name = os.path.splitext(os.path.basename(run))[0]
        print(line if len(pairs) == 1 else "%s: %s" % (name, line))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
