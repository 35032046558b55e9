#!/usr/bin/python3
"""Runs several programs that `soapc emit --target dtensor` wrote in one
process group (under torchrun, or alone as one process), one after the
other, so that a test pays torch's start-up once per launch:

    run_programs.py "PROG.py ARGS..." ["PROG.py ARGS..."]...

Each program's output goes to stdout as it would alone."""
import os
import runpy
import shlex
import sys

import torch
import torch.distributed as dist


def main():
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    backend = "nccl" if cuda else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend)
    else:  # one process, started without a launcher
        dist.init_process_group(backend, store=dist.HashStore(), rank=0,
                                world_size=1)
    for cmd in sys.argv[1:]:
        argv = shlex.split(cmd)
        prog = runpy.run_path(argv[0], run_name="program")
        prog["main"](argv[1:])
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
