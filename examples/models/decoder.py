#!/usr/bin/python3
"""Decoder-only transformers of 2023-26 (Llama-style and others) as ONNX
graphs whose weights are absent, written the way gpt3.py writes GPT-3.

Run from the repository root with Debian's Python (onnx 1.12; torch is not
needed to write the models, only to check them):

    /usr/bin/python3 examples/models/decoder.py [--out DIR] [--only name,name]
        [--config NAME:key=value,key=value,...]

build() writes, node by node with onnx.helper, the graph that
torch.onnx.export writes (opset 17, TrainingMode.TRAINING, constant folding
on, batch axis "N", as export.py exports the zoo) for torch_decoder(), the
PyTorch module defined below with the same configuration.
test/cli/zoo/decoder.test holds it to that on small configurations of every
option: it exports the torch module and compares the graphs op by op.

A configuration (Config) chooses:
    layers, hidden, heads, kv_heads   heads == kv_heads: multi-head attention;
                                      1 < kv_heads < heads: grouped-query;
                                      kv_heads == 1: multi-query. Head dim
                                      hidden / heads. K and V are repeated to
                                      the query heads before attention
                                      (transformers' repeat_kv: Unsqueeze,
                                      Expand, Reshape).
    ffn                               the MLP's inner width
    activation  gelu | swiglu | squared-relu
                gelu: tanh GELU (GPT-2/3); swiglu: down(silu(gate(x)) * up(x))
                (Llama); squared-relu: relu(x)^2 (Primer, Nemotron-4)
    norm        layernorm | rmsnorm (x * rsqrt(mean(x^2) + eps) * w)
    positions   learned (a table added to the token embedding) | rope
                (rotary, rotate-half form, theta `rope_theta`; the cos and
                sin tables are computed in the graph from the traced
                sequence length, so they are no initializers)
    vocab, seq, tied (LM head shares the token table) or untied, bias
                (every Linear but the LM head has a bias, or none has;
                LayerNorm keeps its bias either way, as torch 1.13's
                nn.LayerNorm does)

No dropout (none of these models trains with it). Pre-norm blocks, a final
norm, causal self-attention.

Bundled configurations (Llama 3.1, Llama Team 2024, Table 3; untied
embeddings, rmsnorm eps 1e-5, rope theta 500,000, no biases):

    name          layers  hidden  heads  kv  ffn     vocab    seq
    llama3_8b         32    4096     32   8  14336   128256   8192
    llama3_70b        80    8192     64   8  28672   128256   8192
    llama3_405b      126   16384    128   8  53248   128256   8192

--config writes any other configuration, named NAME, from the keys of
Config (e.g. "tiny:layers=2,hidden=256,heads=8,kv_heads=2,ffn=512,
vocab=1024,seq=128,activation=swiglu,norm=rmsnorm,positions=rope").
"""

import math
import os
import sys
from collections import OrderedDict

import numpy as np
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from gpt3 import (OPSET, Writer, causal_mask, cli, f32,  # noqa: E402
                  i64, save_shape_only)

ACTIVATIONS = ("gelu", "swiglu", "squared-relu")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope")


class Config:
    """One decoder's shape and architecture (see the module docstring)."""

    KEYS = OrderedDict([
        ("layers", int), ("hidden", int), ("heads", int), ("kv_heads", int),
        ("ffn", int), ("activation", str), ("norm", str), ("positions", str),
        ("vocab", int), ("seq", int), ("tied", int), ("bias", int),
        ("eps", float), ("rope_theta", float),
    ])

    def __init__(self, layers, hidden, heads, kv_heads=None, ffn=None,
                 activation="gelu", norm="layernorm", positions="learned",
                 vocab=50257, seq=2048, tied=True, bias=True, eps=1e-5,
                 rope_theta=10000.0):
        self.layers, self.hidden, self.heads = layers, hidden, heads
        self.kv_heads = heads if kv_heads is None else kv_heads
        self.ffn = 4 * hidden if ffn is None else ffn
        self.activation, self.norm, self.positions = activation, norm, \
            positions
        self.vocab, self.seq = vocab, seq
        self.tied, self.bias = bool(tied), bool(bias)
        self.eps, self.rope_theta = float(eps), float(rope_theta)
        self.check()

    def check(self):
        for key in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab",
                    "seq"):
            if getattr(self, key) <= 0:
                raise ValueError("%s must be positive" % key)
        if self.hidden % self.heads:
            raise ValueError("hidden %d is not a multiple of heads %d"
                             % (self.hidden, self.heads))
        if self.heads % self.kv_heads:
            raise ValueError("heads %d is not a multiple of kv_heads %d"
                             % (self.heads, self.kv_heads))
        if self.activation not in ACTIVATIONS:
            raise ValueError("activation %r: one of %s"
                             % (self.activation, ", ".join(ACTIVATIONS)))
        if self.norm not in NORMS:
            raise ValueError("norm %r: one of %s" % (self.norm,
                                                     ", ".join(NORMS)))
        if self.positions not in POSITIONS:
            raise ValueError("positions %r: one of %s"
                             % (self.positions, ", ".join(POSITIONS)))
        if self.positions == "rope" and self.head_dim % 2:
            raise ValueError("rope needs an even head dim, not %d"
                             % self.head_dim)

    @property
    def head_dim(self):
        return self.hidden // self.heads

    def as_dict(self):
        d = OrderedDict((k, getattr(self, k)) for k in self.KEYS)
        d["tied"], d["bias"] = int(self.tied), int(self.bias)
        d["head_dim"] = self.head_dim
        return d

    def describe(self):
        return ("layers %d, hidden %d, heads %d, kv %d, ffn %d, %s, %s, %s, "
                "vocab %d, seq %d, %s, %s"
                % (self.layers, self.hidden, self.heads, self.kv_heads,
                   self.ffn, self.activation, self.norm, self.positions,
                   self.vocab, self.seq, "tied" if self.tied else "untied",
                   "bias" if self.bias else "no bias"))


def llama3(layers, hidden, heads, ffn):
    return Config(layers, hidden, heads, kv_heads=8, ffn=ffn,
                  activation="swiglu", norm="rmsnorm", positions="rope",
                  vocab=128256, seq=8192, tied=False, bias=False, eps=1e-5,
                  rope_theta=500000.0)


CONFIGS = OrderedDict([
    ("llama3_8b", llama3(32, 4096, 32, 14336)),
    ("llama3_70b", llama3(80, 8192, 64, 28672)),
    ("llama3_405b", llama3(126, 16384, 128, 53248)),
])


def decoder_params(c):
    """sum(p.numel() for p in torch_decoder(c).parameters())."""
    d, dh, f = c.hidden, c.head_dim, c.ffn
    norm = 2 * d if c.norm == "layernorm" else d
    attn = d * c.heads * dh + 2 * d * c.kv_heads * dh + c.heads * dh * d
    mats = 3 if c.activation == "swiglu" else 2
    mlp = mats * d * f
    if c.bias:
        attn += c.heads * dh + 2 * c.kv_heads * dh + d
        mlp += (mats - 1) * f + d
    total = c.vocab * d + c.layers * (2 * norm + attn + mlp) + norm
    if c.positions == "learned":
        total += c.seq * d
    if not c.tied:
        total += c.vocab * d
    return total


def rope_inv_freq(c):
    """1 / theta^(2i / head_dim), i < head_dim / 2, as torch computes it
    in float32 (the power correctly rounded, then the reciprocal); shape
    [1, head_dim / 2]."""
    dh = c.head_dim
    e = np.arange(0, dh, 2, dtype=np.float32) / np.float32(dh)
    power = np.power(np.float64(c.rope_theta), e.astype(np.float64))
    inv = np.float32(1.0) / power.astype(np.float32)
    return inv.astype(np.float32).reshape(1, -1)


def torch_decoder(c):
    """The PyTorch module whose export build(c) writes (needs torch)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class RMSNorm(nn.Module):
        def __init__(self, d, eps):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))
            self.eps = eps

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) +
                                   self.eps) * self.weight

    def norm():
        if c.norm == "rmsnorm":
            return RMSNorm(c.hidden, c.eps)
        return nn.LayerNorm(c.hidden, eps=c.eps)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            d, dh = c.hidden, c.head_dim
            self.q = nn.Linear(d, c.heads * dh, bias=c.bias)
            self.k = nn.Linear(d, c.kv_heads * dh, bias=c.bias)
            self.v = nn.Linear(d, c.kv_heads * dh, bias=c.bias)
            self.o = nn.Linear(c.heads * dh, d, bias=c.bias)
            self.scale = 1.0 / math.sqrt(dh)

        def forward(self, x, mask, rope):
            T, H, G, dh = c.seq, c.heads, c.kv_heads, c.head_dim
            q = self.q(x).reshape(-1, T, H, dh).transpose(1, 2)
            k = self.k(x).reshape(-1, T, G, dh).transpose(1, 2)
            v = self.v(x).reshape(-1, T, G, dh).transpose(1, 2)
            if rope is not None:
                cos, sin = rope

                def rotate(t):  # rotate_half
                    return torch.cat((-t[..., dh // 2:], t[..., :dh // 2]),
                                     dim=-1)
                q = q * cos + rotate(q) * sin
                k = k * cos + rotate(k) * sin
            if G < H:  # repeat_kv
                k = k[:, :, None].expand(-1, G, H // G, T, dh) \
                    .reshape(-1, H, T, dh)
                v = v[:, :, None].expand(-1, G, H // G, T, dh) \
                    .reshape(-1, H, T, dh)
            att = torch.matmul(q, k.transpose(-2, -1)) * self.scale
            att = torch.where(mask, att,
                              torch.tensor(torch.finfo(att.dtype).min,
                                           dtype=att.dtype))
            att = torch.softmax(att, dim=-1)
            y = torch.matmul(att, v).transpose(1, 2).reshape(-1, T, H * dh)
            return self.o(y)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            d, f = c.hidden, c.ffn
            if c.activation == "swiglu":
                self.gate = nn.Linear(d, f, bias=c.bias)
            self.up = nn.Linear(d, f, bias=c.bias)
            self.down = nn.Linear(f, d, bias=c.bias)

        def forward(self, x):
            if c.activation == "swiglu":
                h = F.silu(self.gate(x)) * self.up(x)
            elif c.activation == "gelu":
                h = F.gelu(self.up(x), approximate="tanh")
            else:
                h = torch.square(F.relu(self.up(x)))
            return self.down(h)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = norm()
            self.attn = Attention()
            self.ln_2 = norm()
            self.mlp = MLP()

        def forward(self, x, mask, rope):
            x = x + self.attn(self.ln_1(x), mask, rope)
            return x + self.mlp(self.ln_2(x))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(c.vocab, c.hidden)
            if c.positions == "learned":
                self.wpe = nn.Embedding(c.seq, c.hidden)
            self.h = nn.ModuleList([Block() for _ in range(c.layers)])
            self.ln_f = norm()
            if not c.tied:
                self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)

        def forward(self, ids):  # [N, T], T == seq
            # Mask and rotary tables from the traced input shape, so that
            # constant folding stores neither in the file.
            t = ids.shape[1]
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            rope = None
            if c.positions == "rope":
                dh = c.head_dim
                inv = 1.0 / (c.rope_theta ** (
                    torch.arange(0, dh, 2, dtype=torch.float32) / dh))
                pos = torch.arange(t, dtype=torch.float32)
                freqs = pos[:, None] * inv[None, :]
                emb = torch.cat((freqs, freqs), dim=-1)
                rope = (emb.cos(), emb.sin())
            x = self.wte(ids)
            if c.positions == "learned":
                x = x + self.wpe.weight
            for block in self.h:
                x = block(x, mask, rope)
            x = self.ln_f(x)
            if not c.tied:
                return self.lm_head(x)
            # As export.py's GPT2: a 2-D Gemm against the token table keeps
            # it one initializer.
            logits = torch.addmm(torch.zeros(()), x.reshape(-1, c.hidden),
                                 self.wte.weight.t())
            return logits.reshape(-1, c.seq, c.vocab)

    return Decoder()


def build(c, name="decoder"):
    """The graph torch.onnx.export writes for torch_decoder(c) in training
    mode at opset 17, with initializers that have dims but no data."""
    d, T, H, G, dh, f = c.hidden, c.seq, c.heads, c.kv_heads, c.head_dim, \
        c.ffn
    R = H // G
    w = Writer()

    def linear(scope, x, weight, bias=None):
        # MatMul against the folded [in, out] weight, then Add(bias, y).
        y = w.op(scope, "MatMul", [x, weight])
        return w.op(scope, "Add", [bias, y]) if bias else y

    def norm(scope, x, prefix):
        if c.norm == "layernorm":
            return w.op(scope, "LayerNormalization",
                        [x, prefix + ".weight", prefix + ".bias"], axis=-1,
                        epsilon=c.eps)
        sq = w.op(scope, "Pow", [x, w.const(scope, f32(2.0))])
        ms = w.op(scope, "ReduceMean", [sq], axes=[-1], keepdims=1)
        ms = w.op(scope, "Add", [ms, w.const(scope, f32(c.eps))])
        root = w.op(scope, "Sqrt", [ms])
        rs = w.op(scope, "Div", [w.const(scope, f32(1.0)), root])
        return w.op(scope, "Mul", [w.op(scope, "Mul", [x, rs]),
                                   prefix + ".weight"])

    def slice_last(scope, x, start, end):
        # x[..., start:end] on a rank-4 tensor: axes, starts, ends, steps.
        axes = w.const(scope, i64([3]))
        starts = w.const(scope, i64([start]))
        ends = w.const(scope, i64([end]))
        steps = w.const(scope, i64([1]))
        return w.op(scope, "Slice", [x, starts, ends, axes, steps])

    def rotary(scope, x, cos, sin):
        a = w.op(scope, "Mul", [x, cos])
        rot = w.op(scope, "Neg", [slice_last(scope, x, dh // 2,
                                             np.iinfo(np.int64).max)])
        rot = w.op(scope, "Concat", [rot, slice_last(scope, x, 0, dh // 2)],
                   axis=-1)
        return w.op(scope, "Add", [a, w.op(scope, "Mul", [rot, sin])])

    def repeat_kv(scope, x):
        # x[:, :, None].expand(-1, G, R, T, dh).reshape(-1, H, T, dh): the
        # exporter resolves expand's -1 with a Where over the sizes.
        x = w.op(scope, "Unsqueeze", [x, w.const(scope, i64([2]))])
        sizes = i64([-1, G, R, T, dh])
        fallback = w.const(scope, sizes)
        ones = w.op(scope, "ConstantOfShape", [w.const(scope, i64([5]))],
                    value=numpy_helper.from_array(i64([1]), ""))
        minus = w.op(scope, "Mul", [ones, w.const(scope, i64(-1))])
        eq = w.op(scope, "Equal", [w.const(scope, sizes), minus])
        shape = w.op(scope, "Where", [eq, ones, fallback])
        x = w.op(scope, "Expand", [x, shape])
        return w.op(scope, "Reshape", [x, w.const(scope, i64([-1, H, T, dh]))],
                    allowzero=0)

    # Parameters in module order, then the folded MatMul weights.
    w.weight("wte.weight", [c.vocab, d])
    if c.positions == "learned":
        w.weight("wpe.weight", [T, d])

    def norm_params(prefix):
        w.weight(prefix + ".weight", [d])
        if c.norm == "layernorm":
            w.weight(prefix + ".bias", [d])

    mlp_mats = (["gate"] if c.activation == "swiglu" else []) + ["up", "down"]
    for i in range(c.layers):
        p = "h.%d." % i
        norm_params(p + "ln_1")
        if c.bias:
            w.weight(p + "attn.q.bias", [H * dh])
            w.weight(p + "attn.k.bias", [G * dh])
            w.weight(p + "attn.v.bias", [G * dh])
            w.weight(p + "attn.o.bias", [d])
        norm_params(p + "ln_2")
        if c.bias:
            for m in mlp_mats:
                w.weight(p + "mlp.%s.bias" % m, [d if m == "down" else f])
    norm_params("ln_f")
    for i in range(c.layers):
        p = "h.%d." % i
        w.weight(p + "attn.q.weight", [d, H * dh])
        w.weight(p + "attn.k.weight", [d, G * dh])
        w.weight(p + "attn.v.weight", [d, G * dh])
        w.weight(p + "attn.o.weight", [H * dh, d])
        for m in mlp_mats:
            w.weight(p + "mlp.%s.weight" % m,
                     [f, d] if m == "down" else [d, f])
    if not c.tied:
        w.weight("lm_head.weight", [d, c.vocab])

    def bias_of(name):
        return name + ".bias" if c.bias else None

    t, mask = causal_mask(w)
    cos = sin = None
    if c.positions == "rope":
        # Rotary tables: cat(pos x inv_freq, twice) -> cos, sin [t, dh].
        tf = w.op("", "Cast", [t], to=TensorProto.FLOAT)
        pos = w.op("", "Range", [w.const("", f32(0.0)), tf,
                                 w.const("", f32(1.0))])
        pos = w.op("", "Unsqueeze", [pos, w.const("", i64([1]))])
        freqs = w.op("", "Mul", [pos, w.const("", rope_inv_freq(c))])
        emb = w.op("", "Concat", [freqs, freqs], axis=-1)
        cos = w.op("", "Cos", [emb])
        sin = w.op("", "Sin", [emb])

    x = w.op("/wte", "Gather", ["wte.weight", "ids"])
    if c.positions == "learned":
        x = w.op("", "Add", [x, "wpe.weight"])
    fill = None
    for i in range(c.layers):
        s, p = "/h.%d" % i, "h.%d." % i
        a = s + "/attn"
        y = norm(s + "/ln_1", x, p + "ln_1")
        q = linear(a + "/q", y, p + "attn.q.weight", bias_of(p + "attn.q"))
        q = w.op(a, "Reshape", [q, w.const(a, i64([-1, T, H, dh]))],
                 allowzero=0)
        q = w.op(a, "Transpose", [q], perm=[0, 2, 1, 3])
        k = linear(a + "/k", y, p + "attn.k.weight", bias_of(p + "attn.k"))
        k = w.op(a, "Reshape", [k, w.const(a, i64([-1, T, G, dh]))],
                 allowzero=0)
        # Without rope or repeat_kv between them, the exporter merges K's
        # two transposes into one, after V's.
        merged = c.positions != "rope" and G == H
        if not merged:
            k = w.op(a, "Transpose", [k], perm=[0, 2, 1, 3])
        v = linear(a + "/v", y, p + "attn.v.weight", bias_of(p + "attn.v"))
        v = w.op(a, "Reshape", [v, w.const(a, i64([-1, T, G, dh]))],
                 allowzero=0)
        v = w.op(a, "Transpose", [v], perm=[0, 2, 1, 3])
        if c.positions == "rope":
            q = rotary(a, q, cos, sin)
            k = rotary(a, k, cos, sin)
        if G < H:
            k = repeat_kv(a, k)
            v = repeat_kv(a, v)
        k = w.op(a, "Transpose", [k],
                 perm=[0, 2, 3, 1] if merged else [0, 1, 3, 2])
        att = w.op(a, "Mul", [w.op(a, "MatMul", [q, k]),
                              w.const(a, f32(1.0 / math.sqrt(dh)))])
        if fill is None:  # one constant, shared by every layer's Where
            fill = w.helper_const(f32(np.finfo(np.float32).min), "Where")
        att = w.op(a, "Where", [mask, att, fill])
        att = w.op(a, "Softmax", [att], axis=-1)
        y = w.op(a, "Transpose", [w.op(a, "MatMul", [att, v])],
                 perm=[0, 2, 1, 3])
        y = w.op(a, "Reshape", [y, w.const(a, i64([-1, T, H * dh]))],
                 allowzero=0)
        y = linear(a + "/o", y, p + "attn.o.weight", bias_of(p + "attn.o"))
        x = w.op(s, "Add", [x, y])
        m = s + "/mlp"
        y = norm(s + "/ln_2", x, p + "ln_2")
        if c.activation == "swiglu":
            g = linear(m + "/gate", y, p + "mlp.gate.weight",
                       bias_of(p + "mlp.gate"))
            g = w.op(m, "Mul", [g, w.op(m, "Sigmoid", [g])])
            u = linear(m + "/up", y, p + "mlp.up.weight",
                       bias_of(p + "mlp.up"))
            h = w.op(m, "Mul", [g, u])
        elif c.activation == "gelu":
            # tanh GELU as torch 1.13 exports it (gpt3.py)
            h = linear(m + "/up", y, p + "mlp.up.weight",
                       bias_of(p + "mlp.up"))
            cube = w.op(m, "Mul", [h, w.op(m, "Mul", [h, h])])
            inner = w.op(m, "Add", [h, w.op(m, "Mul", [
                w.const(m, f32(0.044715)), cube])])
            th = w.op(m, "Tanh", [w.op(m, "Mul", [
                w.const(m, f32(math.sqrt(2.0 / math.pi))), inner])])
            h = w.op(m, "Mul", [h, w.op(m, "Add", [w.const(m, f32(1.0)),
                                                   th])])
            h = w.op(m, "Mul", [w.const(m, f32(0.5)), h])
        else:
            h = w.op(m, "Relu", [linear(m + "/up", y, p + "mlp.up.weight",
                                        bias_of(p + "mlp.up"))])
            h = w.op(m, "Mul", [h, h])
        y = linear(m + "/down", h, p + "mlp.down.weight",
                   bias_of(p + "mlp.down"))
        x = w.op(s, "Add", [x, y])
    x = norm("/ln_f", x, "ln_f")
    if c.tied:
        x = w.op("", "Reshape", [x, w.const("", i64([-1, d]))], allowzero=0)
        x = w.op("", "Gemm", [x, "wte.weight", w.const("", f32(0.0))],
                 alpha=1.0, beta=1.0, transB=1)
        w.op("", "Reshape", [x, w.const("", i64([-1, T, c.vocab]))],
             allowzero=0)
    else:
        linear("/lm_head", x, "lm_head.weight")
    w.nodes[-1].output[0] = "logits"  # the graph output keeps its name

    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", T])
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                        ["N", T, c.vocab])
    graph = helper.make_graph(w.nodes, name, [ids], [out],
                              initializer=w.inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="soapc decoder.py")
    model.ir_version = 8  # what torch 1.13 writes at opset 17
    return model


def generate(name, out_dir, c):
    """Writes <name>.onnx into out_dir; returns its params.json entry."""
    expected = decoder_params(c)
    model, params, data_bytes, path, ops = save_shape_only(
        build(c, name=name), name, out_dir, expected, "decoder")
    weights = name + ".weights"
    print("%-12s layers %3d  hidden %5d  heads %3d  kv %2d  ffn %5d  "
          "params %15s  nodes %5d  absent weights %7.1f GB  %7.1f KiB"
          % (name, c.layers, c.hidden, c.heads, c.kv_heads, c.ffn,
             "{:,}".format(params), len(model.graph.node), data_bytes / 1e9,
             os.path.getsize(path) / 1024.0), flush=True)
    return {
        "pytorch_params": expected,
        "onnx_weight_params": params,
        "file": name + ".onnx",
        "inputs": [{"name": "ids", "shape": ["N", c.seq], "dtype": "int64"}],
        "opset": OPSET,
        "ops": dict(sorted(ops.items())),
        "file_bytes": os.path.getsize(path),
        "config": c.as_dict(),
        "external_data": weights,
    }


def parse_config(text):
    """NAME:key=value,... -> (name, Config)."""
    name, sep, body = text.partition(":")
    if not sep or not name:
        raise ValueError("--config %r: expected NAME:key=value,..." % text)
    kw = {}
    for item in body.split(","):
        key, eq, value = item.partition("=")
        if not eq or key not in Config.KEYS:
            raise ValueError("--config %r: %r is not key=value with a key "
                             "of %s" % (text, item, ", ".join(Config.KEYS)))
        try:
            kw[key] = Config.KEYS[key](value)
        except ValueError:
            raise ValueError("--config %r: %s=%r is not a %s"
                             % (text, key, value, Config.KEYS[key].__name__))
    for key in ("layers", "hidden", "heads"):
        if key not in kw:
            raise ValueError("--config %r: %s is required" % (text, key))
    try:
        return name, Config(**kw)
    except ValueError as e:
        raise ValueError("--config %r: %s" % (text, e))


def main():
    cli(__doc__.split("\n")[0], CONFIGS, parse_config, generate,
        ("NAME:key=value,...",
         "write a decoder of this configuration (repeatable)"))


if __name__ == "__main__":
    main()
