#!/usr/bin/python3
"""Runs a command that must fail on bad input and prints its stderr for
FileCheck. Exits 1 (failing the lit test) unless the command exits with the
expected code, writes nothing on stdout and exactly one line on stderr, and no
sanitizer report appears.

    one_error.py CODE COMMAND [ARG...]
"""

import subprocess
import sys


def main():
    code, cmd = int(sys.argv[1]), sys.argv[2:]
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    sys.stdout.write(p.stderr)
    problems = []
    if p.returncode != code:
        problems.append(f"exit code {p.returncode}, expected {code}")
    if p.stdout:
        problems.append(f"{len(p.stdout)} bytes on stdout")
    if len(p.stderr.splitlines()) != 1:
        problems.append(f"{len(p.stderr.splitlines())} lines on stderr, "
                        "expected 1")
    if "Sanitizer" in p.stderr or "runtime error:" in p.stderr:
        problems.append("a sanitizer report")
    for what in problems:
        print(f"one_error.py: {what}", file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
