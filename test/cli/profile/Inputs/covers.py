"""Checks that every signature `soapc cost --format json` asks for (argv[1])
is among those `soap-profile --list --format json` enumerated (argv[2]):
soap-profile and the cost model share one signature function."""
import json
import sys

asked = [op["signature"] for op in json.load(open(sys.argv[1]))["ops"]]
listed = {s["signature"] for s in json.load(open(sys.argv[2]))["list"]}
missing = [s for s in asked if s not in listed]
for s in missing:
    print("missing:", s)
print("%d asked, %d listed, %d missing" % (len(asked), len(listed), len(missing)))
