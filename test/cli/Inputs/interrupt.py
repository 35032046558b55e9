#!/usr/bin/python3
"""Interrupts a command the way a user does, for lit: runs it, waits until
its stderr shows TEXT (so the signals land where the test means them to,
however loaded the machine), sends it SIGNALS, and prints its stdout, then
"exit: CODE", then its stderr, for FileCheck. Exits 1 (failing the lit test)
when TEXT never shows or the command does not end after the signals.

    interrupt.py --wait-for TEXT --signals INT[,TERM...] [--delay S]
                 [--stopped] -- COMMAND [ARG...]

The command gets SIGINT and SIGTERM at their defaults: lit's workers ignore
SIGINT, a child inherits that, and soapc keeps a signal ignored on entry
ignored (as a `cmd &` in a script expects). --stopped sends the signals while
the command is stopped (SIGSTOP ... SIGCONT), so that it takes them all
before it runs on: sent one after another to a running process, a second
could come after it finished. (The signals must differ: two of one kind
pending at once merge into one, POSIX 2.4.1.)
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

LIMIT_S = 60  # far past what either wait takes on a loaded machine


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wait-for", required=True)
    ap.add_argument("--signals", required=True)
    ap.add_argument("--delay", type=float, default=0)
    ap.add_argument("--stopped", action="store_true")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    sigs = [getattr(signal, "SIG" + s) for s in a.signals.split(",")]
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err)

        def stderr_text():
            err.seek(0)
            return err.read().decode(errors="replace")

        def fail(why):
            if p.poll() is None:
                p.kill()
                p.wait()
            sys.stderr.write(stderr_text())
            print(f"interrupt.py: {why}", file=sys.stderr)
            sys.exit(1)

        start = time.monotonic()
        while a.wait_for not in stderr_text():
            if p.poll() is not None:
                fail(f"the command ended (exit {p.returncode}) before "
                     f"its stderr showed '{a.wait_for}'")
            if time.monotonic() - start > LIMIT_S:
                fail(f"no '{a.wait_for}' on stderr after {LIMIT_S} s")
            time.sleep(0.02)
        time.sleep(a.delay)
        if a.stopped:
            p.send_signal(signal.SIGSTOP)
        for s in sigs:
            p.send_signal(s)
        if a.stopped:
            p.send_signal(signal.SIGCONT)
        try:
            code = p.wait(timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            fail(f"still running {LIMIT_S} s after {a.signals}")
        out.seek(0)
        sys.stdout.write(out.read().decode(errors="replace"))
        print(f"exit: {code}")
        sys.stdout.write(stderr_text())


if __name__ == "__main__":
    main()
