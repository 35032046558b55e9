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
from torch.distributed.tensor import DTensor


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
        # DTensor caches sharding propagation by op schema, and a schema of
        # one program can be taken for another's (a wrong output spec, seen
        # in torch 2.7): each program starts with empty caches, as alone.
        sp = DTensor._op_dispatcher.sharding_propagator
        sp.propagate_op_sharding.cache.cache_clear()
        sp._propagate_tensor_meta.cache_clear()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
