#!/usr/bin/python3
"""Compare two soap-run results: each step's loss (from its output) and every
final weight (from its --dump-weights directory).

    compare.py REF.out REF_DIR RUN.out RUN_DIR [--exact | --bf16 [--atol A]]

Equal means within max(1e-5 relative, 1e-6 absolute) per number,
bit-identical with --exact, or within bf16's tolerance with --bf16:
max(2^-7 relative, 1e-4 absolute), two units in the last place of a bf16
value (runs that sum in another order may round a stored bf16 value to its
neighbour). --atol A replaces bf16's absolute floor: Adam divides each
gradient element by its own magnitude, so an element near zero whose bf16
rounding differs moves by up to the learning rate either way, whatever its
size (a tenth of the learning rate is the floor such runs use). Prints one
line; exits 1 on a mismatch."""
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


def close(a, b, exact, bf16=False, atol=1e-4):
    if exact:
        return array.array("f", [a]).tobytes() == array.array("f", [b]).tobytes()
    if bf16:
        return abs(a - b) <= max(2.0 ** -7 * max(abs(a), abs(b)), atol)
    return abs(a - b) <= max(1e-5 * max(abs(a), abs(b)), 1e-6)


def main():
    argv = sys.argv[1:]
    atol = 1e-4
    if "--atol" in argv:
        k = argv.index("--atol")
        atol = float(argv[k + 1])
        del argv[k:k + 2]
    args = [a for a in argv if a not in ("--exact", "--bf16")]
    exact = "--exact" in argv
    bf16 = "--bf16" in argv
    ref_out, ref_dir, run_out, run_dir = args
    la, lb = losses(ref_out), losses(run_out)
    if not la or len(la) != len(lb):
        sys.exit("MISMATCH: %d losses against %d" % (len(la), len(lb)))
    for k, (a, b) in enumerate(zip(la, lb)):
        if not close(a, b, exact, bf16, atol):
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
            if not close(x, y, exact, bf16, atol):
                sys.exit("MISMATCH: %s[%d] %.9g against %.9g" % (name, i, x, y))
            worst = max(worst, abs(x - y))
        n += len(a)
    print("MATCH%s: %d losses, %d weights, %d elements"
          % (" exactly" if exact else " (bf16)" if bf16 else "", len(la),
             len(wa), n))


if __name__ == "__main__":
    main()
