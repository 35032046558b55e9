"""Checks that every signature the cost model is asked for (argv[1]: the
ops of `soapc cost --format json`, or the tasks of `soap-profile --replay
--list --tasks --format json`) is among those `soap-profile --list --format
json` enumerated (argv[2]): soap-profile and the cost model share one
signature function, and a plan's tiles are in the configuration space."""
import json
import sys

doc = json.load(open(sys.argv[1]))
if "ops" in doc:
    asked = [op["signature"] for op in doc["ops"]]
else:
    asked = [t["signature"] for p in doc["plans"] for t in p["tasks"]]
listed = {s["signature"] for s in json.load(open(sys.argv[2]))["list"]}
missing = [s for s in asked if s not in listed]
for s in missing:
    print("missing:", s)
print("%d asked, %d listed, %d missing" % (len(asked), len(listed), len(missing)))
