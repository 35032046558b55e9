#!/usr/bin/python3
"""Read soap-run --memory output ("memory: rank R peak M bytes measured, P
predicted ..."). One file: print every rank's measured and predicted peak
and their ratio. Two files: check that the first run's measured peak is
below the second's on every rank ("LOWER" or exit 1).

    peaks.py run.out [other.out]"""
import re
import sys

LINE = re.compile(r"memory: rank (\d+) peak (\d+) bytes measured, (\d+) predicted")


def read(path):
    peaks = {}
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if m:
                peaks[int(m.group(1))] = (int(m.group(2)), int(m.group(3)))
    if not peaks:
        sys.exit(f"{path}: no memory lines (was soap-run given --memory?)")
    return peaks


def main():
    a = read(sys.argv[1])
    if len(sys.argv) == 2:
        for r, (meas, pred) in sorted(a.items()):
            print(f"rank {r}: measured {meas} predicted {pred} "
                  f"ratio {meas / pred:.3f}")
        return
    b = read(sys.argv[2])
    for r in sorted(a):
        if a[r][0] >= b[r][0]:
            sys.exit(f"NOT LOWER: rank {r} peak {a[r][0]} against {b[r][0]}")
    print(f"LOWER: {len(a)} ranks, peaks " +
          ", ".join(f"{a[r][0]} < {b[r][0]}" for r in sorted(a)))


if __name__ == "__main__":
    main()
