#!/usr/bin/python3
"""Compare two soap-run results: each step's loss (from its output) and every
final weight (from its --dump-weights directory).

    compare.py REF.out REF_DIR RUN.out RUN_DIR [--exact | --bf16 [--atol A]]
               [--exact-ref X.out X_DIR [--float32-ref Y.out Y_DIR]...]

Equal means within max(1e-5 relative, 1e-6 absolute) per number,
bit-identical with --exact, or within bf16's tolerance with --bf16:
max(2^-7 relative, 1e-4 absolute), two units in the last place of a bf16
value (runs that sum in another order may round a stored bf16 value to its
neighbour). --atol A replaces bf16's absolute floor: Adam divides each
gradient element by its own magnitude, so an element near zero whose bf16
rounding differs moves by up to the learning rate either way, whatever its
size (a tenth of the learning rate is the floor such runs use).

--exact-ref gives the same training in float64 (torch_reference.py
--write). Where float32 itself is further than the tolerance from the exact
result (a deep network with batch statistics over a few samples amplifies
rounding: ResNet-101 at batch 4 moves some weights 20-30% of their update
away from float64, in PyTorch as in soap-run), a loss or a weight tensor
whose numbers differ beyond the tolerance still matches when the run is no
further from the exact result than ENVELOPE times the furthest float32
sample: the reference run and each --float32-ref (the same training by
other kernels, torch_reference.py --write --float32), by the largest
difference over the tensor. Plans that split a reduction add in another
order and have come to 3.0 times (VGG-16's k-cuts plan on 4 ranks, a bias
after 2 steps); a plan that loses 1% of one weight's update is 3,300 times
past it (AlexNet, one step). Prints one line; exits 1 on a mismatch."""
import array
import json
import math
import os
import re
import sys

try:  # vectorised where numpy is at hand (python3-torch brings it)
    import numpy as np
except ImportError:
    np = None

CHUNK = 1 << 22  # numpy's elements per slice: bounds its temporaries
ENVELOPE = 4  # --exact-ref: how much further than float32 a run may be


def losses(path):
    with open(path) as f:
        return [float(m.group(1)) for m in
                re.finditer(r"^step \d+ loss (\S+)", f.read(), re.M)]


def weights(d):
    with open(os.path.join(d, "weights.json")) as f:
        man = json.load(f)["weights"]
    out = {}
    for w in man:
        a = array.array("d" if w.get("dtype") == "f64" else "f")
        with open(os.path.join(d, w["file"]), "rb") as f:
            a.frombytes(f.read())
        out[w["name"]] = a
    return out


def tolerance(bf16, atol):
    """(relative, absolute floor) of close()."""
    return (2.0 ** -7, atol) if bf16 else (1e-5, 1e-6)


def close(a, b, exact, bf16=False, atol=1e-4):
    if exact:
        return array.array("f", [a]).tobytes() == array.array("f", [b]).tobytes()
    rel, floor = tolerance(bf16, atol)
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), floor)


def first_far(a, b, exact, bf16, atol):
    """The index of the first pair of a and b that is not close(), or -1."""
    if np is None or not isinstance(a, array.array):
        for i, (x, y) in enumerate(zip(a, b)):
            if not close(x, y, exact, bf16, atol):
                return i
        return -1
    for lo in range(0, len(a), CHUNK):
        x = np.frombuffer(a, dtype=a.typecode, count=min(CHUNK, len(a) - lo),
                          offset=lo * a.itemsize)
        y = np.frombuffer(b, dtype=b.typecode, count=len(x),
                          offset=lo * b.itemsize)
        if exact:
            ok = (x.astype(np.float32).view(np.uint32) ==
                  y.astype(np.float32).view(np.uint32))
        else:
            x, y = x.astype(np.float64), y.astype(np.float64)
            rel, floor = tolerance(bf16, atol)
            tol = np.maximum(rel * np.maximum(np.abs(x), np.abs(y)), floor)
            ok = np.abs(x - y) <= tol  # NaN compares False: not close
        bad = np.flatnonzero(~ok)
        if bad.size:
            return lo + int(bad[0])
    return -1


def max_diff(a, b):
    """The largest |a[i] - b[i]|."""
    if np is None or not isinstance(a, array.array):
        return max(abs(x - y) for x, y in zip(a, b))
    m = 0.0
    for lo in range(0, len(a), CHUNK):
        n = min(CHUNK, len(a) - lo)
        x = np.frombuffer(a, dtype=a.typecode, count=n, offset=lo * a.itemsize)
        y = np.frombuffer(b, dtype=b.typecode, count=n, offset=lo * b.itemsize)
        m = max(m, float(np.abs(x.astype(np.float64) - y).max()))
    return m


def envelope(samples, run, exact):
    """Largest |run - exact| over the largest |sample - exact| of any
    float32 sample (0 where both are 0)."""
    e_ref = max(max_diff(s, exact) for s in samples)
    e_run = max_diff(run, exact)
    return e_run / e_ref if e_ref > 0 else (0.0 if e_run == 0 else math.inf)


def main():
    argv = sys.argv[1:]
    atol = 1e-4
    if "--atol" in argv:
        k = argv.index("--atol")
        atol = float(argv[k + 1])
        del argv[k:k + 2]
    exact_ref = None
    if "--exact-ref" in argv:
        k = argv.index("--exact-ref")
        exact_ref = argv[k + 1:k + 3]
        del argv[k:k + 3]
    samples = []  # further float32 runs: (losses, weights)
    while "--float32-ref" in argv:
        k = argv.index("--float32-ref")
        samples.append(tuple(argv[k + 1:k + 3]))
        del argv[k:k + 3]
    args = [a for a in argv if a not in ("--exact", "--bf16")]
    exact = "--exact" in argv
    bf16 = "--bf16" in argv
    ref_out, ref_dir, run_out, run_dir = args
    la, lb = losses(ref_out), losses(run_out)
    lx = wx = None
    if exact_ref:
        lx, wx = losses(exact_ref[0]), weights(exact_ref[1])
    samples = [(losses(o), weights(d)) for o, d in samples]
    worst = (-1.0, "")  # the largest envelope ratio used, and where
    if not la or len(la) != len(lb):
        sys.exit("MISMATCH: %d losses against %d" % (len(la), len(lb)))
    for k, (a, b) in enumerate(zip(la, lb)):
        if close(a, b, exact, bf16, atol):
            continue
        r = (envelope([[a]] + [[ls[k]] for ls, _ in samples], [b], [lx[k]])
             if lx and k < len(lx) else math.inf)
        if r > ENVELOPE:
            sys.exit("MISMATCH: step %d loss %.9g against %.9g%s" % (
                k + 1, a, b, "" if lx is None else
                " (float64 %.9g: %.3g times the float32 samples' error)"
                % (lx[k], r)))
        worst = max(worst, (r, "step %d loss" % (k + 1)))
    wa, wb = weights(ref_dir), weights(run_dir)
    if sorted(wa) != sorted(wb):
        sys.exit("MISMATCH: weight names differ")
    n = 0
    for name in sorted(wa):
        a, b = wa[name], wb[name]
        if len(a) != len(b):
            sys.exit("MISMATCH: %s has %d elements against %d"
                     % (name, len(a), len(b)))
        i = first_far(a, b, exact, bf16, atol)
        if i >= 0:
            r = (envelope([a] + [ws[name] for _, ws in samples], b, wx[name])
                 if wx and name in wx and len(wx[name]) == len(a)
                 else math.inf)
            if r > ENVELOPE:
                sys.exit("MISMATCH: %s[%d] %.9g against %.9g%s" % (
                    name, i, a[i], b[i], "" if wx is None else
                    " (%.3g times the float32 samples' largest error)" % r))
            worst = max(worst, (r, name))
        n += len(a)
    print("MATCH%s: %d losses, %d weights, %d elements%s"
          % (" exactly" if exact else " (bf16)" if bf16 else "", len(la),
             len(wa), n, "" if worst[0] < 0 else
             "; beyond the tolerance but within float32's error (float64 "
             "reference): worst %s at %.3g times the float32 samples'" % (
                 worst[1], worst[0])))

if __name__ == "__main__":
    main()
