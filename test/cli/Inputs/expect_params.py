"""Prints a FileCheck line pinning a zoo model's parameter count to the
number PyTorch reported when examples/models/export.py exported it."""
import json
import sys

params = json.load(open(sys.argv[1]))[sys.argv[2]]["pytorch_params"]
print("CHECK: parameters: {:,}".format(params))
