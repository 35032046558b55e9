"""Holds examples/models/gpt3.py to what torch.onnx.export really writes.

For each small configuration below, exports export.py's GPT2 class with
torch (as export.py exports the zoo: opset 17, training mode, constant
folding) and builds the same configuration with gpt3.build, then compares
the two graphs up to the names of values and initializers: the graph inputs
and outputs, every node in order (op type, domain, which earlier value or
initializer each input is, output count, every attribute, constant values),
every initializer's data type and dims at its first use, and every node
output's type after strict shape inference. Also checks that
gpt3.gpt_params gives PyTorch's sum(p.numel()), and that the comparison
notices a changed attribute and a swapped operand (so it cannot pass
vacuously).

Prints one line per configuration ("SAME OP PATTERN: ..."), or the first
difference and exits 1.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "..", "..", "..", "examples", "models")
sys.path.insert(0, os.path.abspath(MODELS))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import torch  # noqa: E402
from onnx import helper, numpy_helper, shape_inference  # noqa: E402

import export  # noqa: E402
import gpt3  # noqa: E402

# (vocab, d_model, layers, heads, context)
CONFIGS = [(128, 64, 2, 4, 32), (112, 48, 3, 3, 16)]
SMALL = gpt3.STRIP_MIN_ELEMS  # floating initializers past this hold weights


def type_key(tp):
    tt = tp.tensor_type
    if not tt.HasField("shape"):
        return (tt.elem_type, None)
    return (tt.elem_type, tuple(d.dim_value if d.HasField("dim_value")
                                else "?" for d in tt.shape.dim))


def tensor_key(t, values=True):
    """dtype and dims; the values too unless it is a weight."""
    key = (t.data_type, tuple(t.dims))
    weight = t.data_type == onnx.TensorProto.FLOAT and \
        int(np.prod(t.dims)) > SMALL
    if values and not weight:
        key += (tuple(numpy_helper.to_array(t).ravel().tolist()),)
    return key


def attr_key(a):
    v = helper.get_attribute_value(a)
    if isinstance(v, onnx.TensorProto):
        v = tensor_key(v)
    elif isinstance(v, (list, tuple)):
        v = tuple(v)
    return (a.name, a.type, v)


def pattern(model):
    """The model as a list of (label, key) records: the key has every
    name replaced by its order of appearance; the label names the record
    in the file, for messages."""
    model = shape_inference.infer_shapes(model, check_type=True,
                                         strict_mode=True)
    g = model.graph
    types = {vi.name: type_key(vi.type)
             for vi in list(g.value_info) + list(g.output)}
    inits = {t.name: t for t in g.initializer}
    ids = {}
    recs = []
    for vi in g.input:
        ids[vi.name] = "in%d" % len(ids)
        recs.append(("input " + vi.name, ("input", type_key(vi.type))))
    for n in g.node:
        operands = []
        for x in n.input:
            if x and x not in ids:
                if x not in inits:
                    raise RuntimeError("node %s reads %s, which nothing "
                                       "defines" % (n.name, x))
                ids[x] = "w%d" % len(ids)
                recs.append(("initializer " + x,
                             ("initializer", tensor_key(inits[x], False))))
            operands.append(ids.get(x, ""))
        outs = []
        for y in n.output:
            ids[y] = "v%d" % len(ids)
            outs.append(types.get(y))
        recs.append(("node " + n.name,
                     ("node", n.domain, n.op_type, tuple(operands),
                      tuple(outs),
                      tuple(sorted(attr_key(a) for a in n.attribute)))))
    for vi in g.output:
        recs.append(("output " + vi.name,
                     ("output", ids.get(vi.name), type_key(vi.type))))
    recs.append(("all initializers",
                 ("initializers", tuple(sorted(
                     tensor_key(t, False) for t in g.initializer)))))
    return recs


def first_difference(a, b):
    """None when the two patterns agree, else a line on the first record
    where they part."""
    for (la, ka), (lb, kb) in zip(a, b):
        if ka != kb:
            return "torch's %s %r != gpt3.py's %s %r" % (la, ka, lb, kb)
    if len(a) != len(b):
        return "torch's graph has %d records, gpt3.py's %d" % (len(a), len(b))
    return None


def compare_patterns(what, real, made, writer):
    """The op pattern of the export `real`, or None after printing how the
    graph `writer` made (`made`) is ill-typed or differs from it."""
    want = pattern(real)
    try:
        got = pattern(made)
    except shape_inference.InferenceError as e:
        print("ILL-TYPED: %s: %s's graph: %s"
              % (what, writer, str(e).splitlines()[0]))
        return None
    diff = first_difference(want, got)
    if diff:
        print("DIFFERENT OP PATTERN: %s: %s" % (what, diff))
        return None
    return want


def report_same(what, want, n_params):
    ops = sum(1 for _, k in want if k[0] == "node")
    inits = sum(1 for _, k in want if k[0] == "initializer")
    print("SAME OP PATTERN: %s: %d nodes, %d initializers, %d parameters"
          " (PyTorch's count)" % (what, ops, inits, n_params))


def main():
    torch.set_num_threads(1)
    failed = False
    for vocab, d, layers, heads, ctx in CONFIGS:
        torch.manual_seed(0)
        model = export.GPT2(vocab=vocab, hidden=d, layers=layers,
                            heads=heads, n_ctx=ctx)
        n_params = sum(p.numel() for p in model.parameters())
        real = export.export_model(model, [("ids", ["N", ctx], "int64")], 2)
        made = gpt3.build(vocab, d, layers, heads, ctx)
        gpt3.mark_external(made, "absent.weights")
        what = "GPT(vocab %d, d %d, layers %d, heads %d, ctx %d)" % (
            vocab, d, layers, heads, ctx)
        want = compare_patterns(what, real, made, "gpt3.py")
        if want is None:
            failed = True
            continue
        formula = gpt3.gpt_params(vocab, d, layers, ctx)
        if formula != n_params:
            print("PARAMETERS: %s: gpt_params %d, PyTorch %d"
                  % (what, formula, n_params))
            failed = True
            continue
        # The comparison must see a changed attribute and swapped operands.
        for mutate in ("epsilon", "swap"):
            bad = onnx.ModelProto()
            bad.CopyFrom(made)
            for n in bad.graph.node:
                if mutate == "epsilon" and n.op_type == "LayerNormalization":
                    for a in n.attribute:
                        if a.name == "epsilon":
                            a.f = 1e-6
                    break
                if mutate == "swap" and n.op_type == "Add" and \
                        n.name.endswith("c_fc/Add"):
                    n.input[0], n.input[1] = n.input[1], n.input[0]
                    break
            if first_difference(want, pattern(bad)) is None:
                print("VACUOUS: %s: a model with a changed %s compares "
                      "equal" % (what, mutate))
                failed = True
        report_same(what, want, n_params)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
