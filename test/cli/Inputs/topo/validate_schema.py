"""Validates every *.json in a folder against a JSON Schema (draft 2020-12).

    validate_schema.py SCHEMA DIR [SOAPC UNKNOWN_DEVICE_JSON]

With SOAPC, also checks that the schema's /device enum lists exactly the
device catalog's types: soapc's error for a topology naming an unknown
device (UNKNOWN_DEVICE_JSON) lists the known ones."""
import glob
import json
import os
import re
import subprocess
import sys

import jsonschema

schema = json.load(open(sys.argv[1]))
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)
paths = sorted(glob.glob(os.path.join(sys.argv[2], "*.json")))
for path in paths:
    errors = list(validator.iter_errors(json.load(open(path))))
    name = os.path.basename(path)
    print(f"{name}: valid" if not errors else f"{name}: {errors[0].message}")
print(f"{len(paths)} topologies")

if len(sys.argv) > 4:
    err = subprocess.run([sys.argv[3], "topo", sys.argv[4]],
                         capture_output=True, text=True).stderr
    known = re.search(r"known: (.*)$", err.strip())
    if not known:
        print(f"device enum: no list of known devices in soapc's error: {err!r}")
        sys.exit(1)
    catalog = known.group(1).split(", ")
    enum = schema["properties"]["device"]["enum"]
    if catalog == enum:
        print(f"device enum: the catalog's {len(catalog)} types")
    else:
        print(f"device enum differs from the catalog: schema {enum}, "
              f"catalog {catalog}")
