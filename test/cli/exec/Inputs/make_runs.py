#!/usr/bin/python3
"""make_runs.py DIR NAME LOSS W0 W1 ... [--f64]: writes DIR/NAME.out (one
step with LOSS) and DIR/NAME/ (weights.json and one weight 'w' holding the
numbers W0 W1 ..., float32, or float64 with --f64) in soap-run's
--dump-weights layout, for compare.py's tests."""
import array
import json
import os
import sys

args = [a for a in sys.argv[1:] if a != "--f64"]
f64 = "--f64" in sys.argv
d, name, loss, ws = args[0], args[1], args[2], [float(x) for x in args[3:]]
with open(os.path.join(d, name + ".out"), "w") as f:
    f.write("step 1 loss %s time 0.1 s\n" % loss)
wdir = os.path.join(d, name)
os.makedirs(wdir, exist_ok=True)
entry = {"file": "0-w.bin", "name": "w", "shape": [len(ws)]}
if f64:
    entry["dtype"] = "f64"
with open(os.path.join(wdir, "0-w.bin"), "wb") as f:
    f.write(array.array("d" if f64 else "f", ws).tobytes())
with open(os.path.join(wdir, "weights.json"), "w") as f:
    json.dump({"weights": [entry]}, f)
