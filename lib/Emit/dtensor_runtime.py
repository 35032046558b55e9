# The runtime of the programs `soapc emit --target dtensor` writes
# (docs/emit.md): soapc puts a plan's PLAN dictionary above this text, which
# it embeds at build time, so the program needs nothing from soapc's sources.
# It rebuilds the model from its ONNX file and runs each node as torch ops on
# DTensors, every value in the placements PLAN gives its producer and each
# consumer; it draws weights, inputs and dropout masks as soap-run does (from
# the seed and each element's index in the whole tensor), so one process and
# N see the same numbers; and it trains with soap-run's loss and optimizer.
import argparse
import math
import os
import sys

import numpy as np
import onnx
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper
from torch.distributed.device_mesh import DeviceMesh
from torch.utils._python_dispatch import TorchDispatchMode
from torch.distributed.tensor import (DTensor, Partial, Replicate, Shard,
                                      distribute_tensor)

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


# Seeded numbers, as soapc's hashUniform (lib/Support/Rng.h): element i of
# a stream is a hash of (seed, stream, i), whoever draws it.
def splitmix(x):
    x = (x + GOLDEN) & MASK
    z = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & MASK
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & MASK
    return z ^ (z >> 31)


def fnv1a(s):
    h = 0xcbf29ce484222325
    for c in s.encode():
        h = ((h ^ c) * 0x100000001b3) & MASK
    return h


def hash_uniforms(seed, stream, n, start=0):
    """hashUniform(seed, stream, i) for i in [start, start + n)."""
    u64 = np.uint64
    with np.errstate(over="ignore"):
        a = u64(splitmix((seed * 0xd1342543de82ef95 + stream) & MASK))
        x = (a ^ np.arange(start, start + n, dtype=np.uint64)) + u64(GOLDEN)
        z = (x ^ (x >> u64(30))) * u64(0xbf58476d1ce4e5b9)
        z = (z ^ (z >> u64(27))) * u64(0x94d049bb133111eb)
        z = z ^ (z >> u64(31))
        return (z >> u64(11)).astype(np.float64) * 2.0 ** -53


# Placements are written in PLAN as strings, one per mesh dimension:
# "S<d>" Shard(d), "R" Replicate, "P" Partial (a sum).
def placements(spec):
    out = []
    for p in spec:
        if p == "R":
            out.append(Replicate())
        elif p == "P":
            out.append(Partial())
        else:
            out.append(Shard(int(p[1:])))
    return tuple(out)


class Collectives(TorchDispatchMode):
    """Counts the collectives issued while it is active, by kind: DTensor's
    (functional collectives) and FSDP's (process-group calls), both
    dispatcher ops."""
    KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
    NAMES = {"all_reduce": "all_reduce", "allreduce": "all_reduce",
             "all_gather": "all_gather", "allgather": "all_gather",
             "reduce_scatter": "reduce_scatter",
             "all_to_all": "all_to_all", "alltoall": "all_to_all"}

    def __init__(self):
        super().__init__()
        self.counts = {k: 0 for k in self.KINDS}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is DTensor for t in types):
            return NotImplemented  # DTensor first turns into collectives
        name = func._overloadpacket._qualified_op_name
        if name.startswith(("c10d", "_c10d_functional")):
            for key, kind in self.NAMES.items():
                if key in name:
                    self.counts[kind] += 1
                    break
        return func(*args, **(kwargs or {}))


class Runtime:
    def __init__(self, args):
        self.args = args
        self.world = dist.get_world_size()
        self.rank = dist.get_rank()
        self.cuda = torch.cuda.is_available() and args.device != "cpu"
        self.device = (torch.device("cuda", torch.cuda.current_device())
                       if self.cuda else torch.device("cpu"))
        ranks = PLAN["devices"]
        # One process runs the plan's layout on a mesh of one device: the
        # reference every layout's numbers equal.
        self.single = self.world == 1
        if not self.single and self.world != ranks:
            sys.exit("%s: the plan is for %d ranks, run with %d (or 1)"
                     % (sys.argv[0], ranks, self.world))
        shape = PLAN["mesh"]
        # A pipeline runs its stages on their device groups (one process
        # runs them all, one after the other).
        self.pipelined = PLAN["stages"] > 1 and not self.single
        self.group = 0
        if self.single:
            shape = [1] * len(shape)
            self.mesh = DeviceMesh(self.device.type,
                                   torch.arange(1).reshape(shape))
        elif self.pipelined:
            groups = PLAN["groups"]
            names = ("pp",) + tuple("d%d" % j for j in range(len(shape)))
            world = DeviceMesh(self.device.type,
                               torch.tensor(groups).reshape(
                                   [len(groups)] + shape),
                               mesh_dim_names=names)
            self.mesh = world[names[1:]]
            self.pp_group = world.get_group("pp")
            self.group = [g for g, ranks in enumerate(groups)
                          if self.rank in ranks][0]
        else:
            self.mesh = DeviceMesh(self.device.type,
                                   torch.arange(self.world).reshape(shape))
        self.ops = PLAN["ops"]
        self.producer = {}  # value -> op index whose output it is
        for k, op in enumerate(self.ops):
            for v in op["outputs"]:
                self.producer[v] = k
        self.load_model()

    # -- the model --------------------------------------------------------
    def load_model(self):
        path = self.args.model or PLAN["model"]
        model = onnx.load(path, load_external_data=False)
        self.graph = model.graph
        self.consts = {}
        for init in self.graph.initializer:
            self.consts[init.name] = init
        self.nodes = [n for n in self.graph.node]
        # Each node belongs to the plan op whose output it reaches first
        # through values no op reads as a plan boundary (a fused op's
        # inside), so it runs under that op's placements.
        users = {}
        for k, n in enumerate(self.nodes):
            for v in n.input:
                users.setdefault(v, []).append(k)
        self.owner = [None] * len(self.nodes)
        for k in reversed(range(len(self.nodes))):
            n = self.nodes[k]
            for v in n.output:
                if v in self.producer:
                    self.owner[k] = self.producer[v]
                    break
            else:
                for v in n.output:
                    for u in users.get(v, []):
                        if self.owner[u] is not None:
                            self.owner[k] = self.owner[u]
                            break
                    if self.owner[k] is not None:
                        break

        # Each node's stage: its op's, or (a node of no op: constants and
        # shape arithmetic) its first reader's, which passes it on.
        self.stage_of = [None] * len(self.nodes)
        for k in reversed(range(len(self.nodes))):
            if self.owner[k] is not None:
                self.stage_of[k] = {self.ops[self.owner[k]]["stage"]}
                continue
            st = set()
            for v in self.nodes[k].output:
                for u in users.get(v, []):
                    st |= self.stage_of[u] or set()
            self.stage_of[k] = {min(st)} if st else {0}
        self.placement = {}  # value -> its producer's placement
        for op in self.ops:
            self.placement.update(op["outputs"])
        for spec in PLAN["inputs"]:
            self.placement[spec["name"]] = spec["placement"]

    def my_stages(self):
        """The stages this rank runs (all of them without a pipeline)."""
        if not self.pipelined:
            return list(range(PLAN["stages"]))
        groups = len(PLAN["groups"])
        return [st for st in range(PLAN["stages"]) if st % groups ==
                self.group]

    def uses(self, stages):
        """The values the nodes of `stages` read."""
        out = set()
        for k, n in enumerate(self.nodes):
            if self.stage_of[k] & stages:
                out.update(n.input)
        return out

    def init_weights(self, seed):
        """Each weight drawn whole on every rank (soap-run's values), then
        each rank keeps its part of its home placement: no communication."""
        self.params = {}
        self.fsdp = []
        self.fsdp_weight = {}  # weight name -> its op's FSDP module
        zero3 = {}
        used = self.uses(set(self.my_stages()))
        for w in PLAN["weights"]:
            if w["name"] not in used:
                continue
            shape = w["shape"]
            n = math.prod(shape)
            u = 2 * hash_uniforms(seed, fnv1a(w["name"]), n) - 1
            if w["init"] == "scale":
                v = 1 + 0.1 * u
            elif len(shape) >= 2:
                v = u / math.sqrt(n / shape[0])
            else:
                v = 0.1 * u
            t = torch.tensor(v.astype(np.float32)).reshape(
                w["view"]).to(self.device)
            if w.get("fsdp") is not None and not self.single:
                zero3.setdefault(w["fsdp"], []).append((w["name"], t))
                continue
            p = nn.Parameter(distribute_tensor(
                t, self.mesh, placements(w["home"]), src_data_rank=None))
            self.params[w["name"]] = p
        if zero3:
            from torch.distributed.fsdp import fully_shard
            flat = DeviceMesh(self.device.type,
                              torch.arange(self.world))
            # One FSDP module per op. Each is its own root, whose weights
            # FSDP2 keeps gathered from its forward to its backward; the
            # forward reshards them after the op (ZeRO-3 gathers them again
            # for the backward).
            for k, ws in sorted(zero3.items()):
                mod = OpWeights(self.mesh, ws)
                fully_shard(mod, mesh=flat, reshard_after_forward=True)
                # The partial sums of every rank add up in the
                # reduce-scatter: the loss is already the batch's mean.
                mod.set_reduce_scatter_divide_factor(1.0)
                self.fsdp.append((k, mod))
                for name, p in mod.named_parameters():
                    self.params[mod.names[name]] = p
                    self.fsdp_weight[mod.names[name]] = mod

    def draw_input(self, spec, seed):
        shape = spec["shape"]
        n = math.prod(shape)
        u = hash_uniforms(seed, fnv1a(spec["name"]) ^ 0x5EED, n)
        if spec["range"]:
            r = spec["range"]
            v = np.minimum((u * r).astype(np.int64), r - 1)
            return torch.tensor(v).reshape(shape)
        return torch.tensor((2 * u - 1).astype(np.float32)).reshape(shape)

    # -- placements ------------------------------------------------------
    def dtensor(self, x, spec=None):
        """A plain tensor as a DTensor: its part of `spec` (all replicated
        without), cut locally, as every rank holds it whole."""
        if isinstance(x, DTensor):
            return x
        pl = placements(spec) if spec else (Replicate(),) * self.mesh.ndim
        return distribute_tensor(x.to(self.device), self.mesh, pl,
                                 src_data_rank=None)

    def place(self, x, spec):
        pl = placements(spec)
        if not isinstance(x, DTensor):
            return self.dtensor(x, spec)
        if tuple(x.placements) == pl:
            return x
        return x.redistribute(self.mesh, pl)

    # -- the forward -----------------------------------------------------
    def forward(self, inputs, step, micro, first=0, last=None):
        env = dict(inputs)
        cache = {}
        last = len(self.nodes) if last is None else last
        for k in range(first, last):
            n = self.nodes[k]
            opi = self.owner[k]
            op = self.ops[opi] if opi is not None else None
            args = []
            for v in n.input:
                if v == "":
                    args.append(None)
                    continue
                x = self.value(env, v)
                if op is not None and v in op["inputs"]:
                    key = (v, tuple(op["inputs"][v]))
                    if key not in cache:
                        cache[key] = self.place(x, op["inputs"][v])
                    x = cache[key]
                args.append(x)
            outs = run_node(self, n, args, step, micro)
            for v, x in zip(n.output, outs):
                if op is not None and v in op["outputs"] and \
                        isinstance(x, DTensor):
                    x = self.place(x, op["outputs"][v])
                env[v] = x

        return env

    def segment_io(self, env, k, end):
        """The tensors nodes [k, end) read from `env`, and the values they
        write."""
        needed, produced = [], set()
        for j in range(k, end):
            for v in self.nodes[j].input:
                if v and v not in produced and v in env and \
                        isinstance(env[v], torch.Tensor) and v not in needed:
                    needed.append(v)
            produced.update(self.nodes[j].output)
        outs = [v for j in range(k, end) for v in self.nodes[j].output if v]
        return needed, outs

    def run_segment(self, env, k, end, step, micro):
        """Nodes [k, end) of one op; an op with ZeRO-3 weights runs inside
        their FSDP module's forward, which all-gathers them (and again
        before its backward), then reshards them."""
        mods = []
        for j in range(k, end):
            for v in self.nodes[j].input:
                m = self.fsdp_weight.get(v)
                if m is not None and all(m is not x for x in mods):
                    mods.append(m)
        if not mods:
            return self.forward(env, step, micro, k, end)
        needed, outs = self.segment_io(env, k, end)

        def run(ws, *xs):
            local = dict(zip(needed, xs))
            local.update(ws)
            local = self.forward(local, step, micro, k, end)
            return tuple(local.get(v) for v in outs)

        def nest(i, ws, *xs):
            if i == len(mods):
                return run(ws, *xs)
            return mods[i](lambda w, *ys: nest(i + 1, {**ws, **w}, *ys),
                           *xs)

        vals = nest(0, {}, *[env[v] for v in needed])
        for m in mods:
            m.reshard()
        env.update(zip(outs, vals))
        return env

    def value(self, env, v):
        if v in env:
            return env[v]
        if v in self.params:
            return self.params[v]
        if v in self.consts:
            a = numpy_helper.to_array(self.consts[v]) \
                if onnx_has_data(self.consts[v]) else \
                np.zeros([d for d in self.consts[v].dims], np.float32)
            t = torch.from_numpy(np.array(a))
            env[v] = t
            return t
        raise KeyError("%s: value '%s' has no producer" % (sys.argv[0], v))

    def loss(self, env):
        """Mean softmax cross-entropy over every position (soapc's appended
        loss). The classes may be split (a vocabulary-parallel loss): the
        row maximum, the sum of exponentials and the picked logit are then
        each combined over the ranks that share a row."""
        spec = PLAN["loss"]
        logits = self.place(env[spec["logits"]], spec["placement"])
        classes = logits.shape[-1]
        count = math.prod(logits.shape[:-1])
        cls = logits.ndim - 1
        split = [d for d, p in enumerate(logits.placements)
                 if isinstance(p, Shard) and p.dim == cls]
        # The row maximum, only to keep exp() finite: no gradient.
        mx = logits.to_local().detach().amax(dim=-1, keepdim=True)
        for d in split:
            from torch.distributed._functional_collectives import all_reduce
            mx = all_reduce(mx, "max", (self.mesh, d))
        rows = [Replicate() if isinstance(p, Shard) and p.dim == cls else p
                for p in logits.placements]
        mx = DTensor.from_local(mx, self.mesh, rows, run_check=False)
        z = logits - mx
        sumexp = torch.exp(z).sum(dim=-1, keepdim=True)
        lse = torch.log(sumexp.redistribute(self.mesh, [
            Replicate() if isinstance(p, Partial) else p
            for p in sumexp.placements]))
        # The one-hot of the labels, cut as the logits are.
        onehot = torch.zeros(list(logits.shape), dtype=logits.dtype)
        onehot.scatter_(-1, env["whole:" + spec["labels"]].cpu().unsqueeze(-1),
                        1.0)
        onehot = self.dtensor(onehot, [plstr(p) for p in logits.placements])
        picked = (z * onehot).sum(dim=-1, keepdim=True)
        return (lse - picked).sum() / count


class OpWeights(nn.Module):
    """One ZeRO-3 op's weights, for FSDP2's fully_shard: called before the
    op runs (FSDP all-gathers them), it gives them as DTensors replicated on
    the mesh whose gradients stay partial sums, which FSDP's reduce-scatter
    adds up."""

    def __init__(self, mesh, weights):
        super().__init__()
        self.mesh = mesh
        self.names = {}
        self.order = []
        for k, (name, t) in enumerate(weights):
            key = "w%d" % k
            setattr(self, key, nn.Parameter(t.clone()))
            self.names[key] = name
            self.order.append(name)

    def forward(self, fn, *xs):
        return fn({name: AsReplicated.apply(getattr(self, "w%d" % k),
                                            self.mesh)
                   for k, name in enumerate(self.order)}, *xs)


class AsReplicated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, mesh):
        ctx.mesh = mesh
        return DTensor.from_local(t, mesh, [Replicate()] * mesh.ndim,
                                  run_check=False)

    @staticmethod
    def backward(ctx, g):
        mesh = ctx.mesh
        pl = [Partial() if isinstance(p, Partial) else Replicate()
              for p in g.placements]
        if list(g.placements) != pl:
            g = g.redistribute(mesh, pl)
        local = g.to_local()
        for d, p in enumerate(pl):
            if isinstance(p, Replicate):
                local = local / mesh.size(d)
        return local, None


def onnx_has_data(t):
    return bool(t.raw_data) or len(t.float_data) or len(t.int64_data) or \
        len(t.int32_data) or len(t.double_data) or not math.prod(t.dims)


# -- ONNX nodes as torch ops ------------------------------------------------
def attr(n, name, default=None):
    for a in n.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def ints(x):
    if isinstance(x, DTensor):
        x = x.full_tensor()
    return [int(v) for v in x.reshape(-1).tolist()]


def lift(rt, xs):
    """Plain tensors beside DTensors become replicated DTensors; all plain
    stays plain (shape arithmetic)."""
    if not any(isinstance(x, DTensor) for x in xs):
        return xs
    return [rt.dtensor(x) if isinstance(x, torch.Tensor) and
            not isinstance(x, DTensor) else x for x in xs]


def binary(f):
    def run(rt, n, a, step, micro):
        x, y = lift(rt, a)
        return [f(x, y)]
    return run


def unary(f):
    return lambda rt, n, a, step, micro: [f(a[0])]


def op_reshape(rt, n, a, step, micro):
    x, shape = a[0], ints(a[1])
    shape = [x.shape[i] if s == 0 and not attr(n, "allowzero", 0) else s
             for i, s in enumerate(shape)]
    return [x.reshape(shape)]


def op_matmul(rt, n, a, step, micro):
    x, y = lift(rt, a)
    # A batched product (attention's scores and context) whose operands
    # split their batch dims alike runs on each rank's part: DTensor's
    # matmul flattens the batch dims into one for bmm, and where two mesh
    # dims split two of them (a [2, 2] mesh: batch and heads) it gathers
    # one of them first.
    if isinstance(x, DTensor) and isinstance(y, DTensor) and \
            x.ndim == y.ndim and x.ndim > 3 and \
            tuple(x.placements) == tuple(y.placements) and \
            all(isinstance(p, Replicate) or
                (isinstance(p, Shard) and p.dim < x.ndim - 2)
                for p in x.placements) and \
            list(x.shape[:-2]) == list(y.shape[:-2]):
        z = torch.matmul(x.to_local(), y.to_local())
        shape = list(x.shape[:-1]) + [y.shape[-1]]
        stride = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        return [DTensor.from_local(z, rt.mesh, x.placements, run_check=False,
                                   shape=torch.Size(shape),
                                   stride=tuple(stride))]
    return [torch.matmul(x, y)]


def op_gemm(rt, n, a, step, micro):
    x, w = a[0], a[1]
    c = a[2] if len(a) > 2 else None
    if attr(n, "transA", 0):
        x = x.transpose(-1, -2)
    if attr(n, "transB", 0):
        w = w.transpose(-1, -2)
    x, w = lift(rt, [x, w])
    y = torch.matmul(x, w)
    alpha, beta = attr(n, "alpha", 1.0), attr(n, "beta", 1.0)
    if alpha != 1.0:
        y = y * alpha
    if c is not None:
        c = lift(rt, [y, c])[1]
        y = y + (c * beta if beta != 1.0 else c)
    return [y]


def op_softmax(rt, n, a, step, micro):
    return [torch.softmax(a[0], dim=attr(n, "axis", -1))]


def op_layernorm(rt, n, a, step, micro):
    x, w = a[0], a[1]
    b = a[2] if len(a) > 2 else None
    axis = attr(n, "axis", -1) % x.ndim
    return [F.layer_norm(x, list(x.shape[axis:]), w, b,
                         attr(n, "epsilon", 1e-5))]


def op_batchnorm(rt, n, a, step, micro):
    # Training-mode batch statistics written as reductions, so that DTensor
    # combines a split batch's statistics (its partial sums all-reduced).
    x, w, b = a[0], a[1], a[2]
    dims = [0] + list(range(2, x.ndim))
    mean = mean_of(x, dims)
    var = mean_of((x - mean) * (x - mean), dims)
    shape = [1, -1] + [1] * (x.ndim - 2)
    y = (x - mean) / torch.sqrt(var + attr(n, "epsilon", 1e-5))
    return [y * w.reshape(shape) + b.reshape(shape)]


def mean_of(x, dims, keep=True):
    """A mean as a sum and a division: over a split dim the sum is a
    partial sum, which every backend all-reduces (Gloo has no average)."""
    count = math.prod(x.shape[d] for d in dims)
    return x.sum(dim=dims, keepdim=keep) / count


def op_conv(rt, n, a, step, micro):
    # DTensor's convolution handler exchanges halos along the width (its
    # tensor-parallel convolution); a plan's convolution splits only the
    # batch here (soapc emit falls back otherwise), so each rank convolves
    # its samples: the weights' gradients are partial sums over the ranks
    # that split the batch.
    x, w = a[0], a[1]
    b = a[2] if len(a) > 2 and a[2] is not None else None
    pads = attr(n, "pads", [0] * (2 * (x.ndim - 2)))
    k = len(pads) // 2
    if pads[:k] != pads[k:]:
        raise SystemExit("%s: Conv '%s': asymmetric padding" % (sys.argv[0],
                                                                n.name))
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[k]
    if not isinstance(x, DTensor):
        return [conv(x, w, b, attr(n, "strides", [1] * k), pads[:k],
                     attr(n, "dilations", [1] * k), attr(n, "group", 1))]
    w, b = (rt.dtensor(t) if t is not None else None for t in (w, b))
    grad = [Partial() if isinstance(p, Shard) else Replicate()
            for p in x.placements]
    y = conv(x.to_local(), w.to_local(grad_placements=grad),
             b.to_local(grad_placements=grad) if b is not None else None,
             attr(n, "strides", [1] * k), pads[:k],
             attr(n, "dilations", [1] * k), attr(n, "group", 1))
    return [DTensor.from_local(y, rt.mesh, x.placements, run_check=False)]


def op_dropout(rt, n, a, step, micro):
    x = a[0]
    ratio = float(ints_or_float(a[1])) if len(a) > 1 and a[1] is not None \
        else attr(n, "ratio", 0.5)
    training = bool(ints_or_float(a[2])) if len(a) > 2 and a[2] is not None \
        else False
    if not training or ratio == 0:
        return [x, None]
    # soap-run's mask: element i of the whole micro-batch's tensor is kept
    # when hashUniform(seed, fnv1a(node) ^ step * golden, i) >= ratio.
    numel = math.prod(x.shape)
    stream = fnv1a(n.name) ^ ((step * GOLDEN) & MASK)
    keep = hash_uniforms(rt.args.seed, stream, numel, micro * numel) >= ratio
    scale = np.float32(1 / (1 - ratio))
    mask = torch.tensor(np.where(keep, scale, np.float32(0)).astype(
        np.float32)).reshape(list(x.shape))
    if isinstance(x, DTensor):
        if any(isinstance(p, Partial) for p in x.placements):
            x = x.redistribute(rt.mesh, [Replicate() if isinstance(
                p, Partial) else p for p in x.placements])
        mask = rt.dtensor(mask, [plstr(p) for p in x.placements])
    return [x * mask, None]


def plstr(p):
    return "R" if isinstance(p, Replicate) else "P" if isinstance(
        p, Partial) else "S%d" % p.dim


def ints_or_float(x):
    if isinstance(x, DTensor):
        x = x.full_tensor()
    return x.reshape(-1)[0].item()


def op_gather(rt, n, a, step, micro):
    data, idx = a[0], a[1]
    axis = attr(n, "axis", 0)
    if isinstance(data, DTensor) and axis == 0 and data.ndim == 2:
        if not isinstance(idx, DTensor):
            idx = rt.dtensor(idx)
        if any(isinstance(p, Shard) and p.dim == 0 for p in data.placements):
            return [vocab_parallel_embedding(rt, idx, data)]
        return [F.embedding(idx, data)]
    idx = torch.as_tensor(ints(idx) if idx.ndim else int(idx.item()))
    return [torch.index_select(data, axis, idx.reshape(-1)).reshape(
        list(data.shape[:axis]) + list(idx.shape) +
        list(data.shape[axis + 1:]))]


def vocab_parallel_embedding(rt, idx, table):
    """Megatron-LM's VocabParallelEmbedding: a table split by rows (Shard(0)
    on some mesh dims), each rank looking up the ids in its rows (the others
    read row 0 and are zeroed), the lookups partial sums (Partial()) on those
    mesh dims, which the consumers' placements reduce (all-reduce, or
    reduce-scatter along the sequence). A mesh dim that splits the ids
    splits the output alike (the table's gradient then a partial sum there);
    one that splits the table's columns splits the output's last dim."""
    from torch.distributed.tensor._utils import \
        compute_local_shape_and_global_offset
    # The ids whole on the mesh dims that split the rows: each rank of a
    # group looks up every id of its part of the batch.
    want = [Replicate() if isinstance(t, Shard) and t.dim == 0 else p
            for t, p in zip(table.placements, idx.placements)]
    if tuple(want) != tuple(idx.placements):
        idx = idx.redistribute(rt.mesh, want)
    out_pl, grad_pl = [], []
    for t, p in zip(table.placements, idx.placements):
        if isinstance(t, Shard):
            out_pl.append(Partial() if t.dim == 0 else Shard(idx.ndim))
            grad_pl.append(t)
        else:  # a replicated table: the ids' split, their partial gradient
            out_pl.append(p)
            grad_pl.append(Partial() if isinstance(p, Shard) else t)
    rows, offset = compute_local_shape_and_global_offset(
        table.shape, rt.mesh, table.placements)
    lo, hi = offset[0], offset[0] + rows[0]
    local = table.to_local(grad_placements=grad_pl)
    ids = idx.to_local()
    outside = (ids < lo) | (ids >= hi)
    y = F.embedding(torch.where(outside, torch.zeros_like(ids), ids - lo),
                    local)
    y = y.masked_fill(outside.unsqueeze(-1), 0.0)
    shape = list(idx.shape) + [table.shape[1]]
    stride = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    return DTensor.from_local(y, rt.mesh, out_pl, run_check=False,
                              shape=torch.Size(shape), stride=tuple(stride))


def op_split(rt, n, a, step, micro):
    x = a[0]
    axis = attr(n, "axis", 0)
    if len(a) > 1 and a[1] is not None:
        sizes = ints(a[1])
    else:
        parts = len(n.output)
        sizes = [x.shape[axis] // parts] * parts
    return list(torch.split(x, sizes, dim=axis))


def op_slice(rt, n, a, step, micro):
    x = a[0]
    starts, ends = ints(a[1]), ints(a[2])
    axes = ints(a[3]) if len(a) > 3 and a[3] is not None else \
        list(range(len(starts)))
    steps = ints(a[4]) if len(a) > 4 and a[4] is not None else \
        [1] * len(starts)
    idx = [slice(None)] * x.ndim
    for s, e, ax, st in zip(starts, ends, axes, steps):
        dim = x.shape[ax]
        s = max(0, min(dim, s + dim if s < 0 else s))
        e = max(0, min(dim, e + dim if e < 0 else e))
        idx[ax] = slice(s, e, st)
    return [x[tuple(idx)]]


def op_concat(rt, n, a, step, micro):
    xs = lift(rt, [x for x in a])
    return [torch.cat(xs, dim=attr(n, "axis", 0))]


def op_unsqueeze(rt, n, a, step, micro):
    x = a[0]
    axes = ints(a[1]) if len(a) > 1 else attr(n, "axes")
    for ax in sorted(ax % (x.ndim + len(axes)) for ax in axes):
        x = x.unsqueeze(ax)
    return [x]


def op_squeeze(rt, n, a, step, micro):
    x = a[0]
    axes = ints(a[1]) if len(a) > 1 else attr(n, "axes")
    if axes is None:
        return [x.squeeze()]
    for ax in sorted((ax % x.ndim for ax in axes), reverse=True):
        x = x.squeeze(ax)
    return [x]


def op_constant(rt, n, a, step, micro):
    for at in n.attribute:
        if at.name == "value":
            return [torch.from_numpy(np.array(numpy_helper.to_array(at.t)))]
        if at.name == "value_float":
            return [torch.tensor(at.f)]
        if at.name == "value_int":
            return [torch.tensor(at.i)]
        if at.name == "value_ints":
            return [torch.tensor(list(at.ints))]
        if at.name == "value_floats":
            return [torch.tensor(list(at.floats))]
    raise SystemExit("%s: Constant '%s' without a value" % (sys.argv[0],
                                                            n.name))


def op_constant_of_shape(rt, n, a, step, micro):
    v = attr(n, "value")
    fill = torch.from_numpy(np.array(numpy_helper.to_array(v))) \
        if v is not None else torch.tensor([0.0])
    return [torch.full(ints(a[0]), fill.reshape(-1)[0].item(),
                       dtype=fill.dtype)]


def op_trilu(rt, n, a, step, micro):
    k = ints(a[1])[0] if len(a) > 1 and a[1] is not None else 0
    return [torch.triu(a[0], k) if attr(n, "upper", 1) else
            torch.tril(a[0], k)]


def op_where(rt, n, a, step, micro):
    c, x, y = a
    if isinstance(x, DTensor) or isinstance(y, DTensor):
        c, x, y = lift(rt, [c, x, y])
    return [torch.where(c, x, y)]


def op_cast(rt, n, a, step, micro):
    to = onnx.helper.tensor_dtype_to_np_dtype(attr(n, "to"))
    return [a[0].to(torch.from_numpy(np.zeros(1, to)).dtype)]


def op_flatten(rt, n, a, step, micro):
    x = a[0]
    axis = attr(n, "axis", 1) % max(1, x.ndim)
    return [x.reshape(math.prod(x.shape[:axis]), -1)]


def op_pow(rt, n, a, step, micro):
    x, e = a
    if not isinstance(e, DTensor) and e.numel() == 1:
        return [x ** e.reshape(-1)[0].item()]
    x, e = lift(rt, [x, e])
    return [x ** e]


def op_transpose(rt, n, a, step, micro):
    perm = attr(n, "perm", list(reversed(range(a[0].ndim))))
    return [a[0].permute(perm)]


def op_gap(rt, n, a, step, micro):
    return [mean_of(a[0], list(range(2, a[0].ndim)))]


def op_reduce_mean(rt, n, a, step, micro):
    axes = ints(a[1]) if len(a) > 1 else attr(n, "axes")
    keep = bool(attr(n, "keepdims", 1))
    axes = [ax % a[0].ndim for ax in axes]
    return [mean_of(a[0], axes, keep)]


def op_shape(rt, n, a, step, micro):
    return [torch.tensor(list(a[0].shape), dtype=torch.int64)]


def op_expand(rt, n, a, step, micro):
    return [a[0] * torch.ones(ints(a[1]), dtype=a[0].dtype)]


OPS = {
    "Add": binary(torch.add), "Sub": binary(torch.sub),
    "Mul": binary(torch.mul), "Div": binary(torch.div),
    "MatMul": op_matmul, "Equal": binary(torch.eq),
    "Relu": unary(torch.relu), "Erf": unary(torch.erf),
    "Tanh": unary(torch.tanh), "Sigmoid": unary(torch.sigmoid),
    "Sqrt": unary(torch.sqrt), "Neg": unary(torch.neg),
    "Exp": unary(torch.exp), "Log": unary(torch.log),
    "Identity": unary(lambda x: x), "Not": unary(torch.logical_not),
    "Gemm": op_gemm, "Reshape": op_reshape, "Transpose": op_transpose,
    "Softmax": op_softmax, "LayerNormalization": op_layernorm,
    "BatchNormalization": op_batchnorm, "Conv": op_conv,
    "Dropout": op_dropout, "Gather": op_gather, "Split": op_split,
    "Slice": op_slice, "Concat": op_concat, "Unsqueeze": op_unsqueeze,
    "Squeeze": op_squeeze, "Constant": op_constant,
    "ConstantOfShape": op_constant_of_shape, "Trilu": op_trilu,
    "Where": op_where, "Cast": op_cast, "Flatten": op_flatten,
    "Pow": op_pow, "GlobalAveragePool": op_gap,
    "ReduceMean": op_reduce_mean, "Shape": op_shape, "Expand": op_expand,
}


def run_node(rt, n, args, step, micro):
    f = OPS.get(n.op_type)
    if f is None:
        raise SystemExit("%s: node '%s': ONNX op %s is not supported"
                         % (sys.argv[0], n.name, n.op_type))
    return f(rt, n, args, step, micro)


# -- training ---------------------------------------------------------------
class Trainer:
    def __init__(self, rt):
        self.rt = rt
        self.args = rt.args
        self.state = {}
        self.batch_inputs = {s["name"]: rt.draw_input(s, self.args.seed)
                             for s in PLAN["inputs"]}

    def micro_inputs(self, micro, m):
        """Micro-batch `micro` of m: its samples of every input, in the
        placement its first user takes."""
        out = {}
        for s in PLAN["inputs"]:
            t = self.batch_inputs[s["name"]]
            size = t.shape[0] // m
            part = t[micro * size:(micro + 1) * size]
            out[s["name"]] = self.rt.dtensor(part, s["placement"])
            # The loss's one-hot is cut from the whole labels, as every
            # rank draws them.
            out["whole:" + s["name"]] = part
        return out

    def step(self, step):
        rt = self.rt
        m = PLAN["micro_batches"]
        total = None
        for micro in range(m):
            env = run_forward(rt, self.micro_inputs(micro, m), step, micro)
            loss = rt.loss(env) / m
            # The loss is a partial sum where the batch is split; its
            # gradient is 1 on every rank (replicated), not a partial 1.
            one = DTensor.from_local(
                torch.ones((), dtype=loss.dtype, device=rt.device), rt.mesh,
                [Replicate()] * rt.mesh.ndim, run_check=False)
            loss.backward(one)
            loss = loss.detach().redistribute(
                rt.mesh, [Replicate()] * rt.mesh.ndim)
            total = loss if total is None else total + loss
        self.sync_gradients()
        self.update(step)
        return total

    def sync_gradients(self):
        """Every gradient in its weight's own placement: partial sums over
        the ranks that split the batch (or another loop the weight lacks)
        all-reduced or reduce-scattered, as data parallelism does."""
        for name, p in self.rt.params.items():
            if p.grad is None:
                continue
            if tuple(p.grad.placements) != tuple(p.placements):
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)

    def update(self, step):
        """soap-run's optimizer on each rank's part (lib/Exec)."""
        lr = self.args.lr
        opt = PLAN["optimizer"]
        with torch.no_grad():
            for name, p in self.rt.params.items():
                if p.grad is None:
                    continue
                w = p.to_local()
                g = p.grad.to_local()
                if opt == "momentum":
                    buf = self.state.setdefault(name, torch.zeros_like(w))
                    buf.mul_(0.9).add_(g)
                    w.sub_(lr * buf)
                elif opt == "adam":
                    mom, var = self.state.setdefault(
                        name, (torch.zeros_like(w), torch.zeros_like(w)))
                    mom.mul_(0.9).add_(0.1 * g)
                    var.mul_(0.999).add_(0.001 * g * g)
                    t = step + 1
                    mh = mom.double() / (1 - 0.9 ** t)
                    vh = var.double() / (1 - 0.999 ** t)
                    w.sub_((lr * mh / (vh.sqrt() + 1e-8)).to(w.dtype))
                else:
                    w.sub_(lr * g)
                p.grad = None


class StageModule(nn.Module):
    """One pipeline stage: it takes the local parts of the values live into
    the stage, runs the stage's nodes on DTensors over its group's mesh and
    gives the local parts of the values live after it (the logits at the
    last stage)."""

    def __init__(self, trainer, stage, ins, outs):
        super().__init__()
        self.tr, self.stage, self.ins, self.outs = trainer, stage, ins, outs
        self.micro = 0

    def forward(self, *xs):
        rt = self.tr.rt
        env = {}
        for name, x in zip(self.ins, xs):
            # A plan value as its DTensor; shape arithmetic as it is.
            env[name] = DTensor.from_local(
                x, rt.mesh, placements(rt.placement[name]),
                run_check=False) if name in rt.placement else x
        env = run_forward(rt, env, self.tr.step_no, self.micro, self.stage)
        return [rt.place(env[name], rt.placement[name]).to_local()
                if name in rt.placement else env[name]
                for name in self.outs]


class PipeTrainer(Trainer):
    """A pipelined plan: each rank runs its group's stage over the
    micro-batches in the plan's schedule's order (GPipe: every forward, then
    every backward; 1F1B: the warm-up forwards, then one forward and one
    backward in turn), the stages' boundary values and their gradients sent
    point to point between the ranks of equal mesh position."""

    def __init__(self, rt):
        super().__init__(rt)
        nstages = PLAN["stages"]
        if PLAN["chunks"] > 1:
            sys.exit("%s: interleaved stages (%d per device group) are not "
                     "run by this program" % (sys.argv[0], PLAN["chunks"]))
        self.step_no = 0
        inputs = [sp["name"] for sp in PLAN["inputs"]]
        self.feed = [v for v in inputs if v != PLAN["loss"]["labels"]]
        # The values live after each stage: made at or before it, read
        # after it; the last stage gives the logits.
        made = set(self.feed)
        live = []
        for st in range(nstages):
            for k, n in enumerate(rt.nodes):
                if st in rt.stage_of[k]:
                    made.update(n.output)
            later = rt.uses(set(range(st + 1, nstages)))
            live.append(sorted(v for v in made if v in later))
        live[-1] = [PLAN["loss"]["logits"]]
        # Plan values that carry gradients: all but integer graph inputs.
        self.floating = set(rt.placement) - {
            sp["name"] for sp in PLAN["inputs"] if sp["range"]}
        self.stage = rt.my_stages()[0]
        st = self.stage
        self.module = StageModule(self, st, self.feed if st == 0 else
                                  live[st - 1], live[st])
        groups = PLAN["groups"]
        pos = groups[rt.group].index(rt.rank)
        self.prev = groups[st - 1][pos] if st > 0 else None
        self.next = groups[st + 1][pos] if st + 1 < nstages else None
        # Weights that stages of several groups read (tied embeddings):
        # their gradients summed over those groups, rank by mesh position.
        self.shared = []
        for w in PLAN["weights"]:
            holders = [g for g in range(len(groups))
                       if w["name"] in rt.uses({g})]
            if len(holders) < 2:
                continue
            for p in range(len(groups[0])):
                ranks = [groups[g][p] for g in holders]
                pg = dist.new_group(ranks)
                if rt.rank in ranks:
                    self.shared.append((w["name"], pg))

    def order(self):
        m, nst, st = PLAN["micro_batches"], PLAN["stages"], self.stage
        if PLAN["schedule"] == "gpipe":
            return [("F", j) for j in range(m)] + [("B", j)
                                                   for j in range(m)]
        # 1F1B (zb-h1 too: its weight gradients' order is not PyTorch's)
        warm = min(nst - 1 - st, m)
        out = [("F", j) for j in range(warm)]
        for j in range(m - warm):
            out += [("F", warm + j), ("B", j)]
        return out + [("B", j) for j in range(m - warm, m)]

    DTYPES = (torch.float32, torch.int64, torch.bool, torch.float64,
              torch.int32)

    def send(self, tensors, peer, pending):
        for t in tensors:
            head = torch.zeros(8, dtype=torch.int64, device=self.rt.device)
            head[0] = t.ndim
            head[1:1 + t.ndim] = torch.tensor(t.shape)
            head[7] = self.DTYPES.index(t.dtype)
            pending.append(dist.isend(head, peer))
            pending.append(dist.isend(t.detach().contiguous(), peer))

    def recv(self, count, peer):
        out = []
        for _ in range(count):
            head = torch.zeros(8, dtype=torch.int64, device=self.rt.device)
            dist.recv(head, peer)
            head = head.tolist()
            t = torch.empty(head[1:1 + head[0]], dtype=self.DTYPES[head[7]],
                            device=self.rt.device)
            dist.recv(t, peer)
            out.append(t)
        return out

    def carries_grad(self, names):
        """Which of `names` take a gradient back (floating plan values)."""
        return [n in self.rt.placement and n in self.floating for n in names]

    def local_micro(self, name, j):
        m = PLAN["micro_batches"]
        t = self.batch_inputs[name]
        size = t.shape[0] // m
        return self.rt.dtensor(t[j * size:(j + 1) * size],
                               self.rt.placement[name]).to_local()

    def step(self, step):
        rt = self.rt
        self.step_no = step
        m = PLAN["micro_batches"]
        pending, saved, losses = [], {}, []
        for kind, j in self.order():
            if kind == "F":
                if self.prev is None:
                    xs = [self.local_micro(v, j) for v in self.feed]
                else:
                    xs = self.recv(len(self.module.ins), self.prev)
                    for x, g in zip(xs, self.carries_grad(self.module.ins)):
                        if g and x.is_floating_point():
                            x.requires_grad_(True)
                self.module.micro = j
                outs = self.module(*xs)
                if self.next is None:
                    outs = [self.loss_of(outs[0], j, m, losses)]
                else:
                    self.send(outs, self.next, pending)
                saved[j] = (xs, outs)
            else:
                xs, outs = saved.pop(j)
                if self.next is None:
                    torch.autograd.backward(outs)
                else:
                    outs = [o for o, g in zip(outs, self.carries_grad(
                        self.module.outs)) if g]
                    grads = self.recv(len(outs), self.next)
                    torch.autograd.backward(
                        [o for o in outs if o.requires_grad],
                        [g for o, g in zip(outs, grads) if o.requires_grad])
                if self.prev is not None:
                    xs = [x for x, g in zip(xs, self.carries_grad(
                        self.module.ins)) if g]
                    self.send([x.grad if x.grad is not None else
                               torch.zeros_like(x) for x in xs], self.prev,
                              pending)
        for w in pending:
            w.wait()
        for name, pg in self.shared:
            g = rt.params[name].grad
            if g is not None:
                dist.all_reduce(g.to_local(), group=pg)
        self.sync_gradients()
        self.update(step)
        # The step's loss, from the last stage's group to every rank.
        value = [0.0]
        if self.next is None:
            total = sum(losses)
            value = [total.redistribute(rt.mesh, [Replicate()] *
                                        rt.mesh.ndim).to_local().item()]
        src = PLAN["groups"][-1][0]
        dist.broadcast_object_list(value, src=src)
        return torch.tensor(value[0])

    def loss_of(self, out, j, m, losses):
        """Micro-batch j's loss / m: the local partial sum, its gradient 1
        on every rank."""
        rt = self.rt
        logits = DTensor.from_local(
            out, rt.mesh, placements(rt.placement[PLAN["loss"]["logits"]]),
            run_check=False)
        labels = self.batch_inputs[PLAN["loss"]["labels"]]
        size = labels.shape[0] // m
        env = {PLAN["loss"]["logits"]: logits,
               "whole:" + PLAN["loss"]["labels"]:
               labels[j * size:(j + 1) * size]}
        loss = rt.loss(env) / m
        losses.append(loss.detach())
        return loss.to_local(grad_placements=[Replicate()] * rt.mesh.ndim)


def run_forward(rt, inputs, step, micro, stage=None):
    """The forward (of one stage's nodes when given), nodes of recomputed
    ops checkpointed: their activations dropped after the forward and
    computed again in the backward."""
    from torch.utils.checkpoint import checkpoint
    env = dict(inputs)
    k = 0
    n = len(rt.nodes)
    keep = [stage is None or stage in st for st in rt.stage_of]
    while k < n:
        if not keep[k]:
            k += 1
            continue
        opi = rt.owner[k]
        end = k + 1
        if opi is None or not rt.ops[opi]["recompute"]:
            while end < n and keep[end] and rt.owner[end] == opi and \
                    opi is not None:
                end += 1
            env = rt.run_segment(env, k, end, step, micro)
            k = end
            continue
        while end < n and keep[end] and rt.owner[end] is not None and \
                rt.ops[rt.owner[end]]["recompute"]:
            end += 1
        needed, outs = rt.segment_io(env, k, end)

        def segment(*xs, k=k, end=end, needed=needed, outs=outs):
            local = dict(zip(needed, xs))
            local = rt.forward(local, step, micro, k, end)
            return tuple(local.get(v) for v in outs)

        vals = checkpoint(segment, *[env[v] for v in needed],
                          use_reentrant=False)
        env.update(zip(outs, vals))
        k = end
    return env


def dump(rt, path, losses):
    """Rank 0 writes the losses and every final weight whole (.npz),
    gathered from the groups that hold them."""
    arrays = {}
    for name, p in sorted(rt.params.items()):
        full = p.full_tensor() if isinstance(p, DTensor) else p
        arrays["w:" + name] = full.detach().cpu().numpy()
    if rt.pipelined:
        parts = [None] * rt.world
        dist.all_gather_object(parts, arrays)
        for part in parts:
            arrays.update(part)
    arrays["losses"] = np.array(losses, dtype=np.float64)
    if rt.rank == 0:
        np.savez(path, **arrays)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Trains %s under %s as DTensor placements "
        "(written by soapc emit --target dtensor)" % (PLAN["model"],
                                                      PLAN["plan"]))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0,
                    help="weights, inputs and dropout masks (soap-run's)")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--model", help="the ONNX file, when not at the path "
                    "the plan records")
    ap.add_argument("--dump", help="write the losses and final weights to "
                    "this .npz (rank 0)")
    ap.add_argument("--count-collectives", action="store_true",
                    help="count the collectives of each step by kind and "
                    "compare them with the plan's")
    ap.add_argument("--device", choices=["auto", "cpu"], default="auto",
                    help="auto: CUDA (nccl) when there is a GPU, else CPU "
                    "(gloo)")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and args.device != "cpu"
    # A launcher that runs several programs in one process group (tests)
    # starts it once; a program started alone starts its own.
    own = not dist.is_initialized()
    if own:
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "nccl" if cuda else "gloo"
        if "RANK" in os.environ:
            dist.init_process_group(backend)
        else:  # one process, started without a launcher
            dist.init_process_group(backend, store=dist.HashStore(), rank=0,
                                    world_size=1)
    torch.manual_seed(args.seed)
    rt = Runtime(args)
    rt.init_weights(args.seed)
    tr = PipeTrainer(rt) if rt.pipelined else Trainer(rt)
    if rt.rank == 0:
        print("dtensor: %s (batch %d) under %s: %d rank%s (%s), mesh %s, "
              "%d steps, seed %d" % (
                  os.path.basename(args.model or PLAN["model"]),
                  PLAN["batch"], os.path.basename(PLAN["plan"]), rt.world,
                  "" if rt.world == 1 else "s",
                  "nccl" if cuda else "gloo",
                  list(rt.mesh.shape), args.steps, args.seed), flush=True)
        for f in PLAN["fallbacks"]:
            print("fallback: %s" % f)
    losses = []
    for step in range(args.steps):
        if args.count_collectives:
            with Collectives() as counted:
                loss = tr.step(step)
        else:
            loss = tr.step(step)
        value = loss.full_tensor().item() if isinstance(loss, DTensor) \
            else loss.item()
        losses.append(value)
        if rt.rank == 0:
            print("step %d loss %.8f" % (step + 1, value), flush=True)
            if args.count_collectives:
                print("collectives step %d: %s" % (step + 1, ", ".join(
                    "%s %d" % (k, counted.counts[k])
                    for k in Collectives.KINDS)))
                want = PLAN["collectives"]
                if want is not None and rt.mesh.device_type == "cpu":
                    # DTensor runs an all-to-all on a CPU mesh (Gloo has
                    # none) as an all-gather and a local chunk
                    # (shard_dim_alltoall in torch.distributed.tensor).
                    want = dict(want)
                    want["all_gather"] += want["all_to_all"]
                    want["all_to_all"] = 0
                if rt.world == 1:
                    pass
                elif want is None:
                    print("collectives: the plan's not compared (ops fell "
                          "back)")
                elif all(want[k] == counted.counts[k]
                         for k in Collectives.KINDS):
                    print("collectives: equal the plan's")
                else:
                    print("collectives: differ from the plan's (%s)" % (
                        ", ".join("%s %d" % (k, want[k])
                                  for k in Collectives.KINDS)))
    if args.dump:
        dump(rt, args.dump, losses)
    if own:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
