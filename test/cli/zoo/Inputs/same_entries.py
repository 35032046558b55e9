"""Exits 1 unless the named entries of two params.json files are equal.

    same_entries.py A.json B.json NAME...
"""
import json
import sys

a, b = (json.load(open(p)) for p in sys.argv[1:3])
bad = [n for n in sys.argv[3:] if a.get(n) != b.get(n) or n not in a]
for n in bad:
    print("params.json entry %r differs: %r != %r" % (n, a.get(n), b.get(n)))
sys.exit(1 if bad else 0)
