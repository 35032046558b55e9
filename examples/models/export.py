#!/usr/bin/python3
"""Export the soapc model zoo to ONNX (training-mode graphs, weights stripped).

Run from the repository root with Debian's Python (torch 1.13, torchvision 0.14,
onnx 1.12):

    /usr/bin/python3 examples/models/export.py [--out DIR] [--only name,name]
                                               [--check-batch]

For every model this script
  1. builds the network (torchvision or plain torch.nn, torch.manual_seed(0)),
  2. exports it with torch.onnx.export, opset 17, TrainingMode.TRAINING
     (BatchNormalization stays unfused, Dropout is kept), constant folding on,
     and a symbolic batch axis "N" on every input and on the output,
  3. runs onnx.checker.check_model and strict shape inference on the full
     model (fails loudly if either fails),
  4. checks that the floating trainable initializers add up to exactly
     sum(p.numel() for p in model.parameters()),
  5. strips the weight data: every floating initializer with more than 16
     elements keeps name, dims and data_type but loses its data; integer and
     tiny initializers (shape constants, scalars) keep their data,
  6. writes <name>.onnx with onnx.save and records everything in params.json.

Every model ends with logits (no loss); the compiler appends the loss itself.

--check-batch exports each model a second time with another dummy batch size
and verifies that the two graphs are identical apart from weight values, i.e.
that nothing in the graph was specialised to the example batch size.
"""

import argparse
import io
import json
import math
import os
import sys
import time
from collections import Counter, OrderedDict

import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from onnx import TensorProto, numpy_helper

OPSET = 17
STRIP_MIN_ELEMS = 16  # floating initializers with more elements lose their data

SUPPORTED_OPS = {
    "Conv", "Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Relu", "Gelu",
    "Sigmoid", "Tanh", "Erf", "Sqrt", "Pow", "MaxPool", "AveragePool",
    "GlobalAveragePool", "BatchNormalization", "LayerNormalization",
    "ReduceMean", "ReduceSum", "Softmax", "LogSoftmax", "Concat", "Split",
    "Slice", "Flatten", "Reshape", "Squeeze", "Unsqueeze", "Expand",
    "Transpose", "Cast", "Where", "Gather", "Dropout", "Identity", "LSTM",
    "SoftmaxCrossEntropyLoss", "Shape", "Constant", "ConstantOfShape",
    "Range", "Equal", "Neg", "Trilu", "Clip", "HardSigmoid", "HardSwish",
}

FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16,
               TensorProto.BFLOAT16}

HERE = os.path.dirname(os.path.abspath(__file__))


# --------------------------------------------------------------------------
# Model definitions
# --------------------------------------------------------------------------

class LeNet(nn.Module):
    """LeNet-5 style 6-layer CNN (FlexFlow section 8.4 'LeNet')."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class MLP(nn.Module):
    """SOYBEAN's MLP: x_{l+1} = f(x_l . W_l), 4 layers of 8192x8192 weights."""

    def __init__(self, width=8192, layers=4):
        super().__init__()
        self.layers = nn.ModuleList(
            [nn.Linear(width, width, bias=False) for _ in range(layers)])

    def forward(self, x):
        for i, fc in enumerate(self.layers):
            x = fc(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return x


class RNNTC(nn.Module):
    """FlexFlow RNNTC: embedding + 4 LSTM(1024) + softmax linear (2 classes)."""

    def __init__(self, vocab=20000, embed=1024, hidden=1024, layers=4,
                 classes=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, layers, batch_first=True,
                            dropout=0.0)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, ids):                       # ids [N, T] int64
        out, _ = self.lstm(self.embed(ids))       # [N, T, H]
        return self.fc(out[:, -1])                # last step -> [N, classes]


class RNNLM(nn.Module):
    """FlexFlow RNNLM: embedding (10k) + 2 LSTM(2048) + softmax linear (10k)."""

    def __init__(self, vocab=10000, embed=2048, hidden=2048, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, layers, batch_first=True,
                            dropout=0.0)
        self.fc = nn.Linear(hidden, vocab)

    def forward(self, ids):                       # ids [N, T]
        out, _ = self.lstm(self.embed(ids))       # [N, T, H]
        return self.fc(out)                       # [N, T, vocab]


class NMT(nn.Module):
    """FlexFlow NMT: 2-layer LSTM encoder, 2-layer LSTM decoder (initialised
    with the encoder's final state, teacher forcing), additive (Bahdanau)
    attention on top of the last decoder layer, attentional hidden state
    tanh(W_c [context; h_t]) and a softmax linear over the target vocab."""

    def __init__(self, src_vocab=32000, tgt_vocab=32000, embed=1024,
                 hidden=1024, layers=2, attn=1024):
        super().__init__()
        self.src_embed = nn.Embedding(src_vocab, embed)
        self.tgt_embed = nn.Embedding(tgt_vocab, embed)
        self.encoder = nn.LSTM(embed, hidden, layers, batch_first=True,
                               dropout=0.0)
        self.decoder = nn.LSTM(embed, hidden, layers, batch_first=True,
                               dropout=0.0)
        self.attn_key = nn.Linear(hidden, attn, bias=False)   # W_1 h_s
        self.attn_query = nn.Linear(hidden, attn)              # W_2 h_t + b
        self.attn_v = nn.Linear(attn, 1, bias=False)           # v^T tanh(.)
        self.combine = nn.Linear(2 * hidden, hidden, bias=False)
        self.fc = nn.Linear(hidden, tgt_vocab)

    def forward(self, src, tgt):                  # [N, S], [N, T]
        enc, state = self.encoder(self.src_embed(src))          # [N, S, H]
        dec, _ = self.decoder(self.tgt_embed(tgt), state)       # [N, T, H]
        keys = self.attn_key(enc)                               # [N, S, A]
        query = self.attn_query(dec)                            # [N, T, A]
        e = self.attn_v(torch.tanh(query.unsqueeze(2) + keys.unsqueeze(1)))
        a = torch.softmax(e.squeeze(-1), dim=-1)                # [N, T, S]
        ctx = torch.matmul(a, enc)                              # [N, T, H]
        h = torch.tanh(self.combine(torch.cat([ctx, dec], dim=-1)))
        return self.fc(h)                                       # [N, T, V]


class SelfAttention(nn.Module):
    """Multi-head self-attention written with plain Linear/MatMul/Softmax."""

    def __init__(self, hidden, heads, seq_len, dropout, fused_qkv):
        super().__init__()
        self.seq_len = seq_len     # static sequence length (only N is dynamic)
        self.h = heads
        self.d = hidden // heads
        self.hidden = hidden
        self.fused_qkv = fused_qkv
        if fused_qkv:                      # GPT-2 style c_attn
            self.qkv = nn.Linear(hidden, 3 * hidden)
        else:                              # BERT style query/key/value
            self.query = nn.Linear(hidden, hidden)
            self.key = nn.Linear(hidden, hidden)
            self.value = nn.Linear(hidden, hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)
        self.scale = 1.0 / math.sqrt(self.d)

    def forward(self, x, mask=None):
        T = self.seq_len
        if self.fused_qkv:
            q, k, v = self.qkv(x).split(self.hidden, dim=2)
        else:
            q, k, v = self.query(x), self.key(x), self.value(x)
        q = q.reshape(-1, T, self.h, self.d).transpose(1, 2)   # [N, h, T, d]
        k = k.reshape(-1, T, self.h, self.d).transpose(1, 2)
        v = v.reshape(-1, T, self.h, self.d).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) * self.scale  # [N,h,T,T]
        if mask is not None:
            att = torch.where(mask, att,
                              torch.tensor(torch.finfo(att.dtype).min,
                                           dtype=att.dtype))
        att = self.attn_drop(torch.softmax(att, dim=-1))
        y = torch.matmul(att, v).transpose(1, 2).reshape(-1, T, self.hidden)
        return self.resid_drop(self.proj(y))


class BertLayer(nn.Module):
    """Post-LN BERT encoder layer."""

    def __init__(self, hidden, heads, ffn, seq_len, dropout):
        super().__init__()
        self.attn = SelfAttention(hidden, heads, seq_len, dropout,
                                  fused_qkv=False)
        self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
        self.ffn_in = nn.Linear(hidden, ffn)
        self.ffn_out = nn.Linear(ffn, hidden)
        self.drop = nn.Dropout(dropout)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x):
        x = self.ln1(x + self.attn(x))
        y = self.drop(self.ffn_out(F.gelu(self.ffn_in(x))))   # exact (erf) GELU
        return self.ln2(x + y)


class BertLarge(nn.Module):
    """BERT-large-like encoder + masked-LM head (decoder tied to the token
    embedding). Token + position embeddings, no segment embeddings, no
    pooler, no attention-mask input (all positions attend to all)."""

    def __init__(self, vocab=30522, hidden=1024, layers=24, heads=16,
                 ffn=4096, max_pos=512, dropout=0.1):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(max_pos, hidden)
        self.ln = nn.LayerNorm(hidden, eps=1e-12)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            [BertLayer(hidden, heads, ffn, max_pos, dropout)
             for _ in range(layers)])
        # MLM head: transform (dense + GELU + LN), then tied decoder + bias
        self.head_dense = nn.Linear(hidden, hidden)
        self.head_ln = nn.LayerNorm(hidden, eps=1e-12)
        self.head_bias = nn.Parameter(torch.zeros(vocab))
        self.vocab = vocab
        self.hidden = hidden
        self.seq_len = max_pos

    def forward(self, ids):                       # [N, T], T == max_pos
        T = self.seq_len
        # whole position table added directly (sequence length == max_pos),
        # so the parameter is used as-is and never sliced/folded
        x = self.drop(self.ln(self.tok(ids) + self.pos.weight))
        for layer in self.layers:
            x = layer(x)
        x = self.head_ln(F.gelu(self.head_dense(x)))
        # tied decoder: 2-D Gemm(x, W_tok, bias, transB=1) so the token
        # embedding stays ONE initializer shared by Gather and Gemm
        logits = F.linear(x.reshape(-1, self.hidden), self.tok.weight,
                          self.head_bias)
        return logits.reshape(-1, T, self.vocab)


class GPT2Block(nn.Module):
    def __init__(self, hidden, heads, seq_len, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden, eps=1e-5)
        self.attn = SelfAttention(hidden, heads, seq_len, dropout,
                                  fused_qkv=True)
        self.ln_2 = nn.LayerNorm(hidden, eps=1e-5)
        self.c_fc = nn.Linear(hidden, 4 * hidden)
        self.c_proj = nn.Linear(4 * hidden, hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask):
        x = x + self.attn(self.ln_1(x), mask)
        y = F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")  # gelu_new
        return x + self.drop(self.c_proj(y))


class GPT2(nn.Module):
    """GPT-2 small: 12 layers, 768 hidden, 12 heads, vocab 50257, context
    1024, pre-LN, tied input/output embedding, causal mask."""

    def __init__(self, vocab=50257, hidden=768, layers=12, heads=12,
                 n_ctx=1024, dropout=0.1):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(n_ctx, hidden)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(
            [GPT2Block(hidden, heads, n_ctx, dropout) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(hidden, eps=1e-5)
        self.vocab = vocab
        self.hidden = hidden
        self.seq_len = n_ctx

    def forward(self, ids):                       # [N, T], T == n_ctx
        T = self.seq_len
        # causal mask built in-graph (ConstantOfShape + Trilu) from the
        # traced input shape; a python-int size would be constant-folded
        # into a T x T bool tensor stored in the file
        t = ids.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        x = self.drop(self.wte(ids) + self.wpe.weight)
        for block in self.h:
            x = block(x, mask)
        x = self.ln_f(x)
        # tied LM head, written as a 2-D Gemm(x, W_te, 0, transB=1) so that
        # wte stays ONE initializer (a 3-D matmul against W^T would make the
        # constant folder materialise a transposed copy)
        logits = torch.addmm(torch.zeros(()), x.reshape(-1, self.hidden),
                             self.wte.weight.t())
        return logits.reshape(-1, T, self.vocab)


# --------------------------------------------------------------------------
# Exporter tweak: padded average pooling as a single AveragePool
# --------------------------------------------------------------------------

@torch.onnx.symbolic_helper.parse_args("v", "is", "is", "is", "i", "i", "v")
def _avg_pool2d(g, x, kernel_size, stride, padding, ceil_mode,
                count_include_pad, divisor_override):
    """torch 1.13 exports avg_pool2d(padding=p, count_include_pad=True) as
    Pad + AveragePool (Pad is not in soapc's op set). ONNX AveragePool has a
    count_include_pad attribute, so emit one AveragePool with pads instead:
    identical math (zero padding counted in the divisor). Used by
    inception_v3's branch_pool (3x3, stride 1, pad 1)."""
    if not divisor_override.node().mustBeNone():
        raise RuntimeError("avg_pool2d: divisor_override not supported")
    pair = torch.nn.modules.utils._pair
    k = list(pair(kernel_size))
    s = list(pair(stride)) if stride else k
    p = list(pair(padding))
    return g.op("AveragePool", x, kernel_shape_i=k, strides_i=s,
                pads_i=p + p, ceil_mode_i=ceil_mode,
                count_include_pad_i=count_include_pad)


torch.onnx.register_custom_op_symbolic("aten::avg_pool2d", _avg_pool2d, OPSET)


class SmallResNet(nn.Module):
    """A reduced ResNet for soap-run's tool test: a BN stem, one basic block
    and one strided basic block with a 1x1 downsample, global average pool,
    classifier (torchvision's BasicBlock wiring at widths 8 and 16)."""

    def __init__(self, width=8, num_classes=10):
        super().__init__()
        from torchvision.models.resnet import BasicBlock
        w = width
        self.stem = nn.Sequential(nn.Conv2d(3, w, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(w), nn.ReLU())
        self.block1 = BasicBlock(w, w)
        down = nn.Sequential(nn.Conv2d(w, 2 * w, 1, stride=2, bias=False),
                             nn.BatchNorm2d(2 * w))
        self.block2 = BasicBlock(w, 2 * w, stride=2, downsample=down)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * w, num_classes)

    def forward(self, x):
        x = self.block2(self.block1(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class SmallMobileNet(nn.Module):
    """A reduced MobileNetV2/V3 for soap-run's tool test (issue 19): a
    Conv-BN-ReLU6 stem (ReLU6 exports as Clip with constant bounds) with
    SqueezeNet's 3x3/2 max pool in ceil_mode, one
    inverted residual block with Hardswish, a depthwise 3x3 convolution and
    a squeeze-and-excitation gate with Hardsigmoid (torchvision's
    SqueezeExcitation wiring), a linear bottleneck, global average pool and
    classifier."""

    def __init__(self, width=8, expand=16, num_classes=10):
        super().__init__()
        from torchvision.ops.misc import SqueezeExcitation
        w, e = width, expand
        self.stem = nn.Sequential(nn.Conv2d(3, w, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(w), nn.ReLU6())
        # SqueezeNet's pooling: windows past the edge (ceil_mode).
        self.stem_pool = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.expand = nn.Sequential(nn.Conv2d(w, e, 1, bias=False),
                                    nn.BatchNorm2d(e), nn.Hardswish())
        self.depthwise = nn.Sequential(
            nn.Conv2d(e, e, 3, padding=1, groups=e, bias=False),
            nn.BatchNorm2d(e), nn.Hardswish())
        self.se = SqueezeExcitation(e, e // 4,
                                    scale_activation=nn.Hardsigmoid)
        self.project = nn.Sequential(nn.Conv2d(e, w, 1, bias=False),
                                     nn.BatchNorm2d(w))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(w, num_classes)

    def forward(self, x):
        x = self.stem_pool(self.stem(x))
        x = x + self.project(self.se(self.depthwise(self.expand(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


# --------------------------------------------------------------------------
# Registry: name -> (builder, [(input name, shape with 'N', dtype)], notes)
# --------------------------------------------------------------------------

def _tv(fn, **kw):
    return lambda: fn(weights=None, **kw)


IMG224 = [("input", ["N", 3, 224, 224], "float32")]
MODELS = OrderedDict([
    ("lenet", (LeNet, [("input", ["N", 1, 32, 32], "float32")])),
    ("alexnet", (_tv(torchvision.models.alexnet), IMG224)),
    ("vgg16", (_tv(torchvision.models.vgg16), IMG224)),
    ("resnet101", (_tv(torchvision.models.resnet101), IMG224)),
    ("inception_v3", (_tv(torchvision.models.inception_v3, aux_logits=False,
                          init_weights=False),
                      [("input", ["N", 3, 299, 299], "float32")])),
    ("wide_resnet101_2", (_tv(torchvision.models.wide_resnet101_2), IMG224)),
    ("mlp", (MLP, [("input", ["N", 8192], "float32")])),
    ("rnntc", (RNNTC, [("ids", ["N", 40], "int64")])),
    ("rnnlm", (RNNLM, [("ids", ["N", 40], "int64")])),
    ("nmt", (NMT, [("src", ["N", 40], "int64"), ("tgt", ["N", 40], "int64")])),
    ("transformer", (BertLarge, [("ids", ["N", 512], "int64")])),
    ("gpt2", (GPT2, [("ids", ["N", 1024], "int64")])),
    # Reduced variants for soap-run's tool test (test/cli/exec).
    ("mlp_small", (lambda: MLP(width=32, layers=3),
                   [("input", ["N", 32], "float32")])),
    ("resnet_small", (SmallResNet, [("input", ["N", 3, 8, 8], "float32")])),
    ("mobilenet_small", (SmallMobileNet,
                         [("input", ["N", 3, 8, 8], "float32")])),
    ("transformer_small", (lambda: BertLarge(vocab=128, hidden=16, layers=1,
                                             heads=2, ffn=32, max_pos=8),
                           [("ids", ["N", 8], "int64")])),
])




# --------------------------------------------------------------------------
# TensorOpt Table 1 variants (issue 7): batch 256; weights of 7-108 GB cannot
# be built in torch here (nor serialised past protobuf's 2 GB), so these are
# written node by node with onnx.helper, weights as dims-only initializers
# (stripped like the others).
# --------------------------------------------------------------------------

class OnnxGraph:
    """A tiny ONNX graph writer: float weights without data, int64 shape
    constants with data, a symbolic batch axis "N"."""

    def __init__(self, name):
        self.name = name
        self.nodes, self.inits, self.n = [], [], 0
        self.params = 0

    def fresh(self, base):
        self.n += 1
        return "%s_%d" % (base, self.n)

    def weight(self, base, dims):
        t = onnx.TensorProto()
        t.name = self.fresh(base)
        t.data_type = TensorProto.FLOAT
        t.dims.extend(dims)
        self.inits.append(t)
        self.params += math.prod(dims)
        return t.name

    def const(self, base, values, dtype=TensorProto.INT64, dims=None):
        name = self.fresh(base)
        self.inits.append(onnx.helper.make_tensor(
            name, dtype, [len(values)] if dims is None else dims, values))
        return name

    def op(self, kind, inputs, outputs=1, **attrs):
        outs = [self.fresh(kind.lower()) for _ in range(outputs)]
        self.nodes.append(onnx.helper.make_node(
            kind, inputs, outs, name=self.fresh(kind), **attrs))
        return outs[0] if outputs == 1 else outs

    def linear(self, x, din, dout, bias=True):
        y = self.op("MatMul", [x, self.weight("w", [din, dout])])
        return self.op("Add", [y, self.weight("b", [dout])]) if bias else y

    def model(self, inputs, logits, logits_shape):
        out = onnx.helper.make_tensor_value_info(
            "logits", TensorProto.FLOAT, logits_shape)
        self.nodes.append(onnx.helper.make_node(
            "Identity", [logits], ["logits"], name="logits"))
        g = onnx.helper.make_graph(self.nodes, self.name, inputs, [out],
                                   initializer=self.inits)
        return onnx.helper.make_model(
            g, opset_imports=[onnx.helper.make_opsetid("", OPSET)],
            producer_name="soapc export.py")


def to_transformer(layers, hidden=4096, ffn=16384, heads=32, seq=64,
                   vocab=30000):
    """Transformer encoder (TensorOpt's [26]): post-LN layers of multi-head
    self-attention and a ReLU FFN, tied to no other weights."""
    g = OnnxGraph("transformer_to")
    ids = onnx.helper.make_tensor_value_info("ids", TensorProto.INT64,
                                             ["N", seq])
    d = hidden // heads
    x = g.op("Gather", [g.weight("embed", [vocab, hidden]), "ids"])
    x = g.op("Add", [x, g.weight("pos", [seq, hidden])])
    split = g.const("heads", [-1, seq, heads, d])
    merge = g.const("merge", [-1, seq, hidden])
    scale = g.const("scale", [1.0 / math.sqrt(d)], TensorProto.FLOAT, [])
    for _ in range(layers):
        q, k, v = (g.op("Reshape", [g.linear(x, hidden, hidden), split])
                   for _ in range(3))
        q = g.op("Transpose", [q], perm=[0, 2, 1, 3])
        k = g.op("Transpose", [k], perm=[0, 2, 3, 1])
        v = g.op("Transpose", [v], perm=[0, 2, 1, 3])
        s = g.op("Mul", [g.op("MatMul", [q, k]), scale])
        a = g.op("MatMul", [g.op("Softmax", [s], axis=-1), v])
        a = g.op("Reshape", [g.op("Transpose", [a], perm=[0, 2, 1, 3]),
                             merge])
        x = g.op("Add", [x, g.linear(a, hidden, hidden)])
        x = g.op("LayerNormalization", [x, g.weight("ln", [hidden]),
                                        g.weight("ln", [hidden])], axis=-1)
        h = g.op("Relu", [g.linear(x, hidden, ffn)])
        x = g.op("Add", [x, g.linear(h, ffn, hidden)])
        x = g.op("LayerNormalization", [x, g.weight("ln", [hidden]),
                                        g.weight("ln", [hidden])], axis=-1)
    logits = g.linear(x, hidden, vocab, bias=False)
    return g.model([ids], logits, ["N", seq, vocab]), g.params


def to_rnn(layers=8, hidden=16384, steps=20, vocab=300000):
    """LSTM language model (TensorOpt's [21]): a large vocabulary, deep wide
    LSTMs, ~27 G parameters (108 GB)."""
    g = OnnxGraph("rnn_to")
    ids = onnx.helper.make_tensor_value_info("ids", TensorProto.INT64,
                                             ["N", steps])
    x = g.op("Gather", [g.weight("embed", [vocab, hidden]), "ids"])
    x = g.op("Transpose", [x], perm=[1, 0, 2])            # [T, N, H]
    axes = g.const("axes", [1])
    for _ in range(layers):
        y = g.op("LSTM", [x, g.weight("W", [1, 4 * hidden, hidden]),
                          g.weight("R", [1, 4 * hidden, hidden]),
                          g.weight("B", [1, 8 * hidden])],
                 hidden_size=hidden)
        x = g.op("Squeeze", [y, axes])                    # [T, N, H]
    x = g.op("Transpose", [x], perm=[1, 0, 2])            # [N, T, H]
    logits = g.linear(x, hidden, vocab)
    return g.model([ids], logits, ["N", steps, vocab]), g.params


def to_wide_resnet(k=8.85, classes=1000):
    """ResNet-101 bottlenecks (torchvision's wide_resnet layout) with the
    bottleneck width scaled k-fold: ~1.83 G parameters (7.3 GB)."""
    g = OnnxGraph("wide_resnet_to")
    img = onnx.helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                             ["N", 3, 224, 224])

    def conv_bn(x, cin, cout, kernel, stride, relu=True):
        pad = kernel // 2
        y = g.op("Conv", [x, g.weight("conv", [cout, cin, kernel, kernel])],
                 kernel_shape=[kernel, kernel], strides=[stride, stride],
                 pads=[pad] * 4)
        y = g.op("BatchNormalization",
                 [y, g.weight("bn", [cout]), g.weight("bn", [cout]),
                  g.weight("mean", [cout]), g.weight("var", [cout])],
                 outputs=3, training_mode=1)[0]
        return g.op("Relu", [y]) if relu else y

    x = conv_bn("input", 3, 64, 7, 2)
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2],
             pads=[1, 1, 1, 1])
    cin = 64
    for i, (planes, blocks) in enumerate(zip([64, 128, 256, 512],
                                             [3, 4, 23, 3])):
        width, cout = int(planes * k), planes * 4
        for b in range(blocks):
            stride = 2 if b == 0 and i > 0 else 1
            y = conv_bn(x, cin, width, 1, 1)
            y = conv_bn(y, width, width, 3, stride)
            y = conv_bn(y, width, cout, 1, 1, relu=False)
            if b == 0:
                x = conv_bn(x, cin, cout, 1, stride, relu=False)
            x = g.op("Relu", [g.op("Add", [y, x])])
            cin = cout
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    logits = g.op("Gemm", [x, g.weight("fc", [classes, cin]),
                           g.weight("fc_b", [classes])], transB=1)
    return g.model([img], logits, ["N", classes]), g.params


# name -> (builder, TensorOpt Table 1 parameter GB); VGG16 is the zoo's vgg16
VARIANTS = OrderedDict([
    ("transformer_to", (lambda: to_transformer(11), 9.7)),
    ("transformer_10g", (lambda: to_transformer(12), 9.7)),
    ("rnn_to", (to_rnn, 108)),
    ("wide_resnet_to", (to_wide_resnet, 7.3)),
])


def export_variant(name, out_dir):
    builder, paper_gb = VARIANTS[name]
    proto, n_params = builder()
    # BatchNorm running statistics are State, not trainable parameters.
    w = weight_params(proto)
    proto = onnx.shape_inference.infer_shapes(proto, check_type=True,
                                              strict_mode=True)
    fname = name + ".onnx"
    path = os.path.join(out_dir, fname)
    onnx.save(proto, path)
    ops = Counter(n.op_type for n in proto.graph.node)
    unsupported = sorted(set(ops) - SUPPORTED_OPS)
    print("%-17s params %12d (%.2f GB; TensorOpt Table 1: %g GB)  nodes %5d"
          % (name, w, w * 4 / 1e9, paper_gb, len(proto.graph.node)),
          flush=True)
    entry = {
        "pytorch_params": w,
        "onnx_weight_params": w,
        "file": fname,
        "inputs": [{"name": i.name,
                    "shape": [d.dim_param or d.dim_value
                              for d in i.type.tensor_type.shape.dim],
                    "dtype": "int64" if i.type.tensor_type.elem_type ==
                    TensorProto.INT64 else "float32"}
                   for i in proto.graph.input],
        "opset": OPSET,
        "ops": dict(sorted(ops.items())),
        "file_bytes": os.path.getsize(path),
        "tensoropt_table1_gb": paper_gb,
    }
    return entry, unsupported


# --------------------------------------------------------------------------
# Export helpers
# --------------------------------------------------------------------------

def make_inputs(specs, batch):
    g = torch.Generator().manual_seed(1)
    out = []
    for _, shape, dtype in specs:
        shp = [batch if d == "N" else d for d in shape]
        if dtype == "int64":
            out.append(torch.randint(0, 100, shp, dtype=torch.int64,
                                     generator=g))
        else:
            out.append(torch.randn(*shp, generator=g))
    return tuple(out)


def export_proto(name, batch):
    builder, specs = MODELS[name]
    torch.manual_seed(0)
    model = builder()
    proto = export_model(model, specs, batch)
    n_params = sum(p.numel() for p in model.parameters())
    n_bn = sum(isinstance(m, nn.modules.batchnorm._BatchNorm)
               for m in model.modules())
    del model
    return proto, n_params, n_bn, specs


def export_model(model, specs, batch):
    """torch.onnx.export of `model` in training mode as the zoo does it
    (also used by test/cli/zoo's comparison with gpt3.py)."""
    model.train()
    args = make_inputs(specs, batch)
    in_names = [s[0] for s in specs]
    dyn = {n: {0: "N"} for n in in_names}
    dyn["logits"] = {0: "N"}
    buf = io.BytesIO()
    torch.onnx.export(
        model, args, buf,
        export_params=True,
        opset_version=OPSET,
        training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=True,
        input_names=in_names,
        output_names=["logits"],
        dynamic_axes=dyn,
    )
    proto = onnx.load_from_string(buf.getvalue())
    del buf
    return proto


def numel(t):
    n = 1
    for d in t.dims:
        n *= d
    return n


def weight_params(proto):
    """Sum of numel of floating initializers that are trainable weights:
    excludes BatchNormalization inputs 3/4 (running mean/var) and scalar
    (numel 1) constants such as dropout ratios or GELU coefficients;
    num_batches_tracked is int64 and thus never counted."""
    bn_stats = set()
    for n in proto.graph.node:
        if n.op_type == "BatchNormalization":
            bn_stats.update(n.input[3:5])
    total = 0
    for t in proto.graph.initializer:
        if t.data_type in FLOAT_TYPES and t.name not in bn_stats \
                and numel(t) > 1:
            total += numel(t)
    return total


def strip(proto):
    """Drop the data of every floating initializer with > 16 elements."""
    stripped = 0
    for t in proto.graph.initializer:
        if t.data_type in FLOAT_TYPES and numel(t) > STRIP_MIN_ELEMS:
            t.ClearField("raw_data")
            t.ClearField("float_data")
            t.ClearField("double_data")
            t.ClearField("int32_data")
            t.ClearField("external_data")
            t.ClearField("data_location")
            stripped += 1
    # large float tensors hidden in Constant nodes would not be stripped:
    # make sure there are none
    for n in proto.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR and \
                        a.t.data_type in FLOAT_TYPES and \
                        numel(a.t) > STRIP_MIN_ELEMS:
                    raise RuntimeError("large float Constant node %s" % n.name)
    return stripped


def structure_key(proto):
    """Everything but the weight values: nodes, attributes, small/int
    initializers, and initializer dims."""
    p = onnx.ModelProto()
    p.CopyFrom(proto)
    for t in p.graph.initializer:
        if t.data_type in FLOAT_TYPES and numel(t) > STRIP_MIN_ELEMS:
            t.ClearField("raw_data")
            t.ClearField("float_data")
    for n in p.graph.node:
        n.name = ""
    return p.graph.SerializeToString(deterministic=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--only", default="")
    ap.add_argument("--check-batch", action="store_true",
                    help="re-export with batch 3 and compare graph structure")
    opt = ap.parse_args()

    torch.set_num_threads(1)
    names = [n for n in opt.only.split(",") if n] or \
        list(MODELS) + list(VARIANTS)
    for n in names:
        if n not in MODELS and n not in VARIANTS:
            sys.exit("unknown model %r (known: %s)"
                     % (n, ", ".join(list(MODELS) + list(VARIANTS))))
    os.makedirs(opt.out, exist_ok=True)

    pjson = os.path.join(opt.out, "params.json")
    table = {}
    if os.path.exists(pjson):
        with open(pjson) as f:
            table = json.load(f)

    failures = []
    t_all = time.time()
    for name in names:
        if name in VARIANTS:
            table[name], unsupported = export_variant(name, opt.out)
            if unsupported:
                failures.append("%s: unsupported ops %s" % (name, unsupported))
            continue
        t0 = time.time()
        proto, n_params, n_bn, specs = export_proto(name, batch=2)
        t_export = time.time() - t0

        # validate the complete model before stripping
        onnx.checker.check_model(proto)
        proto = onnx.shape_inference.infer_shapes(proto, check_type=True,
                                                  strict_mode=True)

        ops = Counter(n.op_type for n in proto.graph.node)
        if ops.get("BatchNormalization", 0) != n_bn:
            raise RuntimeError("%s: %d BatchNorm modules but %d "
                               "BatchNormalization nodes (fused?)"
                               % (name, n_bn, ops.get("BatchNormalization", 0)))
        w = weight_params(proto)
        if w != n_params:
            raise RuntimeError("%s: pytorch_params %d != onnx_weight_params %d"
                               % (name, n_params, w))

        if opt.check_batch:
            proto3 = export_proto(name, batch=3)[0]
            proto2 = export_proto(name, batch=2)[0]
            if structure_key(proto2) != structure_key(proto3):
                failures.append("%s: graph depends on the example batch size"
                                % name)
            del proto2, proto3

        stripped = strip(proto)
        fname = name + ".onnx"
        path = os.path.join(opt.out, fname)
        onnx.save(proto, path)
        size = os.path.getsize(path)
        unsupported = sorted(set(ops) - SUPPORTED_OPS)
        if unsupported:
            failures.append("%s: unsupported ops %s" % (name, unsupported))

        table[name] = {
            "pytorch_params": n_params,
            "onnx_weight_params": w,
            "file": fname,
            "inputs": [{"name": n, "shape": s, "dtype": d}
                       for n, s, d in specs],
            "opset": OPSET,
            "ops": dict(sorted(ops.items())),
            "file_bytes": size,
        }
        print("%-17s params %12d  nodes %5d  init %4d (stripped %4d)  "
              "%8.1f KiB  export %6.1fs  total %6.1fs"
              % (name, n_params, len(proto.graph.node),
                 len(proto.graph.initializer), stripped, size / 1024.0,
                 t_export, time.time() - t0), flush=True)
        print("    ops: " + ", ".join("%s:%d" % kv for kv in sorted(ops.items())),
              flush=True)
        if unsupported:
            print("    UNSUPPORTED: " + ", ".join(unsupported), flush=True)
        del proto

    ordered = OrderedDict((k, table[k]) for k in list(MODELS) + list(VARIANTS)
                          if k in table)
    # entries that other scripts write (gpt3.py) stay, in their order
    ordered.update((k, v) for k, v in table.items() if k not in ordered)
    with open(pjson, "w") as f:
        json.dump(ordered, f, indent=1)
        f.write("\n")
    print("wrote %s; %d model(s) in %.1fs" % (pjson, len(names),
                                             time.time() - t_all))
    if failures:
        for m in failures:
            print("FAIL: " + m, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
