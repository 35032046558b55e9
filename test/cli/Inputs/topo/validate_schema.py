"""Validates every *.json in a folder against a JSON Schema (draft 2020-12)."""
import glob
import json
import os
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
