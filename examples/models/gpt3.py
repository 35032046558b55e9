#!/usr/bin/python3
"""GPT-3 (Brown et al. 2020, Table 2.1) as ONNX graphs whose weights are absent.

Run from the repository root with Debian's Python (onnx 1.12; torch is not
needed):

    /usr/bin/python3 examples/models/gpt3.py [--out DIR] [--only name,name]
        [--config NAME:layers,hidden,heads[,vocab[,seq]] ...]

175B parameters are 700 GB in fp32: no torch model of that size can be built
here, and torch.onnx.export could not write it (protobuf stops at 2 GB). So
this script writes, node by node with onnx.helper, the graph that
torch.onnx.export writes for export.py's GPT2 class (opset 17,
TrainingMode.TRAINING, constant folding on, batch axis "N"): the same ops in
the same order with the same attributes, constants and initializer shapes.
test/cli/zoo/gpt3.test holds it to that: it exports a small GPT2 with torch
and compares the two graphs op by op.

The weights are "external data that is absent": every floating initializer
with more than 16 elements keeps its name, dims and data type and says that
its bytes lie in <name>.weights (location, offset, length), a file that does
not exist. soapc needs only the dims; soap-run refuses such a model.

Configurations (context 2048, vocabulary 50257, FFN 4 x d_model, learned
position embeddings, pre-LayerNorm blocks, tanh GELU, LM head tied to the
token embedding as in export.py's GPT2):

    name        layers  d_model  heads  d_head
    gpt3_1_3b       24     2048     16     128
    gpt3_6_7b       32     4096     32     128
    gpt3_13b        40     5120     40     128   (the paper prints 5140;
                                                   40 x 128 = 5120 is what
                                                   implementations use)
    gpt3_175b       96    12288     96     128

--config writes a GPT of any other shape with the same architecture (e.g.
Narayanan et al. SC21's weak-scaling models, vocabulary 51,200), named NAME,
instead of the configurations above (unless --only names some of those too);
vocab defaults to 50257 and seq to 2048.
"""

import argparse
import json
import math
import os
import sys
from collections import Counter, OrderedDict

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
STRIP_MIN_ELEMS = 16  # as export.py: larger floating initializers hold no data
N_CTX = 2048
VOCAB = 50257
HERE = os.path.dirname(os.path.abspath(__file__))

# name -> (layers, d_model, heads); d_head = d_model / heads = 128
CONFIGS = OrderedDict([
    ("gpt3_1_3b", (24, 2048, 16)),
    ("gpt3_6_7b", (32, 4096, 32)),
    ("gpt3_13b", (40, 5120, 40)),
    ("gpt3_175b", (96, 12288, 96)),
])


def gpt_params(vocab, hidden, layers, n_ctx):
    """sum(p.numel() for p in GPT2(...).parameters()): token and position
    tables, per block two LayerNorms (2d each), c_attn (d x 3d + 3d), the
    attention projection (d x d + d), c_fc (d x 4d + 4d), c_proj (4d x d +
    d), and the final LayerNorm; the LM head is the token table."""
    d = hidden
    block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + \
        (4 * d * d + 4 * d) + (4 * d * d + d)
    return vocab * d + n_ctx * d + layers * block + 2 * d


class Writer:
    """Names nodes and values the way torch.onnx.export does: a node in
    module scope /a/b is "/a/b/<Op>", then "/a/b/<Op>_1", ...; its outputs
    are "<node>_output_<k>"."""

    def __init__(self):
        self.nodes = []
        self.inits = []
        self.counts = Counter()
        self.anon = 0

    def op(self, scope, kind, inputs, outputs=1, **attrs):
        k = self.counts[(scope, kind)]
        self.counts[(scope, kind)] += 1
        name = "%s/%s%s" % (scope, kind, "_%d" % k if k else "")
        outs = ["%s_output_%d" % (name, i) for i in range(outputs)]
        self.nodes.append(helper.make_node(kind, inputs, outs, name=name,
                                           **attrs))
        return outs[0] if outputs == 1 else outs

    def const(self, scope, array):
        """A Constant node in `scope` holding `array` (numpy)."""
        return self.op(scope, "Constant", [],
                       value=numpy_helper.from_array(array, ""))

    def helper_const(self, array, use):
        """A Constant that a symbolic function adds outside any scope
        (Unsqueeze axes, Where's fill value): torch names these
        "Constant_<k>" with output "onnx::<Use>_<k>"."""
        self.anon += 1
        out = "onnx::%s_%d" % (use, self.anon)
        self.nodes.append(helper.make_node(
            "Constant", [], [out], name="Constant_%d" % self.anon,
            value=numpy_helper.from_array(array, "")))
        return out

    def weight(self, name, dims):
        t = TensorProto()
        t.name = name
        t.data_type = TensorProto.FLOAT
        t.dims.extend(dims)
        self.inits.append(t)
        return name


def i64(values):
    return np.array(values, dtype=np.int64)


def f32(value):
    return np.array(value, dtype=np.float32)


def causal_mask(w):
    """The traced sequence length t of the input "ids" ([N, t]) and the
    causal mask torch.onnx.export writes for ones(t, t).tril(): (t, mask)."""
    t = w.op("", "Gather", [w.op("", "Shape", ["ids"]),
                            w.const("", i64(1))], axis=0)
    rows = w.op("", "Unsqueeze", [t, w.helper_const(i64([0]), "Unsqueeze")])
    cols = w.op("", "Unsqueeze", [t, w.helper_const(i64([0]), "Unsqueeze")])
    ones = w.op("", "ConstantOfShape",
                [w.op("", "Concat", [rows, cols], axis=0)],
                value=numpy_helper.from_array(np.array([True]), ""))
    return t, w.op("", "Trilu", [ones, w.const("", i64(0))], upper=0)


def build(vocab, hidden, layers, heads, n_ctx, dropout=0.1, name="gpt"):
    """The graph torch.onnx.export writes for export.py's
    GPT2(vocab, hidden, layers, heads, n_ctx, dropout) in training mode at
    opset 17, with initializers that have dims but no data."""
    assert hidden % heads == 0
    d, T, dh = hidden, n_ctx, hidden // heads
    w = Writer()
    true = np.array(True)
    ratio = f32(dropout)

    def dropout_(scope, x):
        return w.op(scope, "Dropout",
                    [x, w.const(scope, ratio), w.const(scope, true)],
                    outputs=2)[0]

    def linear(scope, x, bias, weight):
        # Linear exports as MatMul against the pre-transposed weight that
        # constant folding stores ([in, out]), then Add(bias, product).
        y = w.op(scope, "MatMul", [x, weight])
        return w.op(scope, "Add", [bias, y])

    def layer_norm(scope, x, prefix):
        return w.op(scope, "LayerNormalization",
                    [x, prefix + ".weight", prefix + ".bias"], axis=-1,
                    epsilon=1e-5)

    # Parameters in module order, as the exporter lists them: those used
    # as they are first, then the transposed MatMul weights.
    w.weight("wte.weight", [vocab, d])
    w.weight("wpe.weight", [T, d])
    for i in range(layers):
        p = "h.%d." % i
        w.weight(p + "ln_1.weight", [d])
        w.weight(p + "ln_1.bias", [d])
        w.weight(p + "attn.qkv.bias", [3 * d])
        w.weight(p + "attn.proj.bias", [d])
        w.weight(p + "ln_2.weight", [d])
        w.weight(p + "ln_2.bias", [d])
        w.weight(p + "c_fc.bias", [4 * d])
        w.weight(p + "c_proj.bias", [d])
    w.weight("ln_f.weight", [d])
    w.weight("ln_f.bias", [d])
    # The exporter calls these onnx::MatMul_<k>; they keep the module's
    # name here, in the folded [in, out] layout.
    for i in range(layers):
        p = "h.%d." % i
        w.weight(p + "attn.qkv.weight", [d, 3 * d])
        w.weight(p + "attn.proj.weight", [d, d])
        w.weight(p + "c_fc.weight", [d, 4 * d])
        w.weight(p + "c_proj.weight", [4 * d, d])

    t, mask = causal_mask(w)

    x = w.op("/wte", "Gather", ["wte.weight", "ids"])
    x = dropout_("/drop", w.op("", "Add", [x, "wpe.weight"]))
    fill = None
    for i in range(layers):
        s, p = "/h.%d" % i, "h.%d." % i
        a = s + "/attn"
        # attention: fused qkv, split, heads, causal softmax, projection
        y = layer_norm(s + "/ln_1", x, p + "ln_1")
        y = linear(a + "/qkv", y, p + "attn.qkv.bias", p + "attn.qkv.weight")
        q, k, v = w.op(a, "Split", [y, w.const(a, i64([d, d, d]))],
                       outputs=3, axis=2)
        heads_shape = i64([-1, T, heads, dh])
        q = w.op(a, "Reshape", [q, w.const(a, heads_shape)], allowzero=0)
        q = w.op(a, "Transpose", [q], perm=[0, 2, 1, 3])
        k = w.op(a, "Reshape", [k, w.const(a, heads_shape)], allowzero=0)
        v = w.op(a, "Reshape", [v, w.const(a, heads_shape)], allowzero=0)
        v = w.op(a, "Transpose", [v], perm=[0, 2, 1, 3])
        k = w.op(a, "Transpose", [k], perm=[0, 2, 3, 1])
        att = w.op(a, "Mul", [w.op(a, "MatMul", [q, k]),
                              w.const(a, f32(1.0 / math.sqrt(dh)))])
        if fill is None:  # one constant, shared by every layer's Where
            fill = w.helper_const(f32(np.finfo(np.float32).min), "Where")
        att = w.op(a, "Where", [mask, att, fill])
        att = dropout_(a + "/attn_drop", w.op(a, "Softmax", [att], axis=-1))
        y = w.op(a, "Transpose", [w.op(a, "MatMul", [att, v])],
                 perm=[0, 2, 1, 3])
        y = w.op(a, "Reshape", [y, w.const(a, i64([-1, T, d]))], allowzero=0)
        y = linear(a + "/proj", y, p + "attn.proj.bias",
                   p + "attn.proj.weight")
        x = w.op(s, "Add", [x, dropout_(a + "/resid_drop", y)])
        # MLP with tanh GELU: 0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3)))
        h = linear(s + "/c_fc", layer_norm(s + "/ln_2", x, p + "ln_2"),
                   p + "c_fc.bias", p + "c_fc.weight")
        cube = w.op(s, "Mul", [h, w.op(s, "Mul", [h, h])])
        inner = w.op(s, "Add", [h, w.op(s, "Mul", [w.const(s, f32(0.044715)),
                                                   cube])])
        th = w.op(s, "Tanh", [w.op(s, "Mul", [
            w.const(s, f32(math.sqrt(2.0 / math.pi))), inner])])
        g = w.op(s, "Mul", [h, w.op(s, "Add", [w.const(s, f32(1.0)), th])])
        g = w.op(s, "Mul", [w.const(s, f32(0.5)), g])
        y = linear(s + "/c_proj", g, p + "c_proj.bias", p + "c_proj.weight")
        x = w.op(s, "Add", [x, dropout_(s + "/drop", y)])
    x = layer_norm("/ln_f", x, "ln_f")
    # Tied LM head: Gemm(x [N*T, d], wte, 0, transB=1), back to [N, T, V].
    x = w.op("", "Reshape", [x, w.const("", i64([-1, d]))], allowzero=0)
    x = w.op("", "Gemm", [x, "wte.weight", w.const("", f32(0.0))],
             alpha=1.0, beta=1.0, transB=1)
    w.op("", "Reshape", [x, w.const("", i64([-1, T, vocab]))], allowzero=0)
    w.nodes[-1].output[0] = "logits"  # the graph output keeps its name

    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", T])
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                        ["N", T, vocab])
    graph = helper.make_graph(w.nodes, name, [ids], [out],
                              initializer=w.inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="soapc gpt3.py")
    model.ir_version = 8  # what torch 1.13 writes at opset 17
    return model


def numel(t):
    return math.prod(t.dims)


def mark_external(model, location):
    """Every floating initializer with more than STRIP_MIN_ELEMS elements
    says its fp32 bytes lie in `location`, back to back in file order."""
    offset = 0
    for t in model.graph.initializer:
        if t.data_type != TensorProto.FLOAT or numel(t) <= STRIP_MIN_ELEMS:
            continue
        length = 4 * numel(t)
        t.data_location = TensorProto.EXTERNAL
        del t.external_data[:]
        for key, value in (("location", location), ("offset", str(offset)),
                           ("length", str(length))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        offset += length
    return offset


def save_shape_only(model, name, out_dir, expected, family):
    """Checks `model` (well typed under strict shape inference, which never
    reads initializer data, so it runs before the data is marked absent),
    marks its weights absent as <name>.weights, checks it holds `expected`
    parameters, and writes <name>.onnx into out_dir. Returns (the model,
    its parameters, the absent bytes, the path, its op counts)."""
    model = onnx.shape_inference.infer_shapes(model, check_type=True,
                                              strict_mode=True)
    weights = name + ".weights"
    data_bytes = mark_external(model, weights)
    params = sum(numel(t) for t in model.graph.initializer
                 if t.data_type == TensorProto.FLOAT and numel(t) > 1)
    if params != expected:
        raise RuntimeError("%s: the graph holds %d parameters, the "
                           "configuration %d" % (name, params, expected))
    if os.path.exists(os.path.join(out_dir, weights)):
        raise RuntimeError("%s exists; the zoo's %s weights must be "
                           "absent" % (weights, family))
    path = os.path.join(out_dir, name + ".onnx")
    onnx.save(model, path)
    ops = Counter(n.op_type for n in model.graph.node)
    return model, params, data_bytes, path, ops


def generate(name, out_dir, shape=None):
    """Writes <name>.onnx into out_dir; returns its params.json entry.
    shape is (layers, hidden, heads, vocab, n_ctx); by default CONFIGS'
    entry with VOCAB and N_CTX."""
    layers, hidden, heads, vocab, n_ctx = \
        shape or CONFIGS[name] + (VOCAB, N_CTX)
    expected = gpt_params(vocab, hidden, layers, n_ctx)
    model, params, data_bytes, path, ops = save_shape_only(
        build(vocab, hidden, layers, heads, n_ctx, name=name), name, out_dir,
        expected, "GPT-3")
    weights = name + ".weights"
    print("%-10s layers %2d  d_model %5d  heads %2d  params %15s  nodes %5d"
          "  absent weights %6.1f GB  %6.1f KiB"
          % (name, layers, hidden, heads, "{:,}".format(params),
             len(model.graph.node), data_bytes / 1e9,
             os.path.getsize(path) / 1024.0), flush=True)
    return {
        "pytorch_params": expected,
        "onnx_weight_params": params,
        "file": name + ".onnx",
        "inputs": [{"name": "ids", "shape": ["N", n_ctx], "dtype": "int64"}],
        "opset": OPSET,
        "ops": dict(sorted(ops.items())),
        "file_bytes": os.path.getsize(path),
        "config": {"layers": layers, "d_model": hidden, "heads": heads,
                   "d_head": hidden // heads, "n_ctx": n_ctx,
                   "vocab": vocab},
        "external_data": weights,
    }


def parse_config(text):
    """NAME:layers,hidden,heads[,vocab[,seq]] -> (name, shape)."""
    name, sep, dims = text.partition(":")
    try:
        values = [int(v) for v in dims.split(",")]
    except ValueError:
        values = []
    if not sep or not name or not 3 <= len(values) <= 5 or \
            min(values) <= 0:
        raise ValueError("--config %r: expected NAME:layers,hidden,heads"
                         "[,vocab[,seq]] with positive integers" % text)
    layers, hidden, heads = values[:3]
    if hidden % heads:
        raise ValueError("--config %r: hidden %d is not a multiple of "
                         "heads %d" % (text, hidden, heads))
    vocab = values[3] if len(values) > 3 else VOCAB
    n_ctx = values[4] if len(values) > 4 else N_CTX
    return name, (layers, hidden, heads, vocab, n_ctx)


def cli(description, configs, parse, generate, config_help):
    """The model writers' command line (gpt3.py, decoder.py): --out DIR,
    --only NAME,..., --config TEXT (repeatable, read by `parse`, which
    returns (name, config) or raises ValueError); writes each named model
    of `configs` (all of them without --only or --config) and each
    --config one with generate(name, out, config), and their records into
    DIR/params.json."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--only", default="")
    ap.add_argument("--config", action="append", default=[],
                    metavar=config_help[0], help=config_help[1])
    opt = ap.parse_args()
    custom = OrderedDict()
    for text in opt.config:
        try:
            name, c = parse(text)
        except ValueError as e:
            sys.exit(str(e))
        custom[name] = c
    names = [n for n in opt.only.split(",") if n] or \
        ([] if custom else list(configs))
    for n in names:
        if n not in configs:
            sys.exit("unknown model %r (known: %s)" % (n, ", ".join(configs)))
    os.makedirs(opt.out, exist_ok=True)
    pjson = os.path.join(opt.out, "params.json")
    table = OrderedDict()
    if os.path.exists(pjson):
        with open(pjson) as f:
            table = json.load(f, object_pairs_hook=OrderedDict)
    for name in names:
        table[name] = generate(name, opt.out, configs[name])
    for name, c in custom.items():
        table[name] = generate(name, opt.out, c)
    with open(pjson, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    print("wrote %s" % pjson)


def main():
    cli(__doc__.split("\n")[0],
        OrderedDict((n, c + (VOCAB, N_CTX)) for n, c in CONFIGS.items()),
        parse_config, generate,
        ("NAME:layers,hidden,heads[,vocab[,seq]]",
         "write a GPT of this shape (repeatable)"))


if __name__ == "__main__":
    main()
