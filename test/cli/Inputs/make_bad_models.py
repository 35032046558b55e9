#!/usr/bin/python3
"""Writes the small ONNX files under test/cli/Inputs/bad/ that the lit tests
in test/cli/import-errors/ feed to `soapc dump`: malformed files and graphs
that the importer must reject with a clear message (exit code 2), and a few
unusual but valid ones that it must accept.

Run from anywhere with Debian's Python (onnx 1.12):

    /usr/bin/python3 test/cli/Inputs/make_bad_models.py

The output is deterministic; commit it.
"""

import os
import random
import struct

import onnx
from onnx import TensorProto, helper

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bad")
F = TensorProto.FLOAT
I64 = TensorProto.INT64


def model(nodes, inputs, outputs, inits=(), name="bad"):
    g = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    return helper.make_model(g, producer_name="make_bad_models",
                             opset_imports=[helper.make_opsetid("", 17)])


def write(name, m_or_bytes):
    data = m_or_bytes if isinstance(m_or_bytes, bytes) else \
        m_or_bytes.SerializeToString(deterministic=True)
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


def inp(name, shape, t=F):
    return helper.make_tensor_value_info(name, t, shape)


def out(name, t=F):
    return helper.make_tensor_value_info(name, t, None)


def stripped(name, dims):
    """A floating initializer with dims and no data (as examples/models)."""
    t = TensorProto()
    t.name = name
    t.data_type = F
    t.dims.extend(dims)
    return t


def external(name, dims, location):
    t = stripped(name, dims)
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"),
                 ("length", str(4 * dims[0] * dims[1]))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def mlp(w):
    """x[N,8] -> MatMul(w[8,4]) -> Relu -> y: a valid model around `w`."""
    return model([helper.make_node("MatMul", ["x", w.name], ["h"], name="mm"),
                  helper.make_node("Relu", ["h"], ["y"], name="relu")],
                 [inp("x", ["N", 8])], [out("y")], [w])


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = random.Random(1234)

    # Not ONNX at all.
    write("not_onnx.onnx", b"this is a text file, not an ONNX model\n")
    write("empty.onnx", b"")
    write("random.onnx", bytes(rng.randrange(256) for _ in range(512)))
    write("no_graph.onnx", onnx.ModelProto(ir_version=8).SerializeToString())

    # A protobuf cut in the middle of an initializer's raw data.
    w = helper.make_tensor("w", F, [8, 4], [0.5] * 32)
    w.raw_data = bytes(4 * 32)
    del w.float_data[:]
    full = mlp(w).SerializeToString(deterministic=True)
    write("truncated.onnx", full[:len(full) // 2])
    # A whole model followed by a field (doc_string, 6) whose length runs
    # 1 MiB past the end of the file.
    write("length_past_end.onnx",
          full + bytes([6 << 3 | 2, 0x80, 0x80, 0x40]) + b"short")

    # Valid: an initializer that keeps its data; external data whose file
    # is missing (only dims are needed); nodes out of topological order.
    write("initializer_data.onnx", mlp(w))
    write("external_missing.onnx",
          mlp(external("w", [8, 4], "weights_missing.bin")))
    # 4 GiB of external weights (the test makes big.bin as a sparse file).
    big = external("w", [8, 134217728], "big.bin")
    write("external_big.onnx", model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [inp("x", ["N", 8])], [out("y")], [big]))
    m = mlp(stripped("w", [8, 4]))
    m.graph.node.reverse()
    write("unsorted.onnx", m)

    # External data that would escape the model's directory.
    write("external_dotdot.onnx",
          mlp(external("w", [8, 4], "../outside/w.bin")))
    write("external_absolute.onnx",
          mlp(external("w", [8, 4], "/etc/passwd")))

    # Structure: a cycle and a dangling input.
    write("cycle.onnx", model(
        [helper.make_node("Add", ["x", "b"], ["a"], name="add_a"),
         helper.make_node("Relu", ["a"], ["b"], name="relu_b"),
         helper.make_node("Relu", ["a"], ["y"], name="relu_y")],
        [inp("x", ["N", 8])], [out("y")]))
    write("dangling.onnx", model(
        [helper.make_node("Add", ["x", "ghost"], ["y"], name="add")],
        [inp("x", ["N", 8])], [out("y")]))

    # Operators soapc does not know.
    boxes, scores = inp("boxes", ["N", 16, 4]), inp("scores", ["N", 1, 16])
    write("unsupported_op.onnx", model(
        [helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["sel"],
                          name="nms")],
        [boxes, scores], [out("sel", I64)]))
    m = model([helper.make_node("FancyNorm", ["x"], ["y"], name="fancy",
                                domain="com.example")],
              [inp("x", ["N", 8])], [out("y")])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    write("custom_domain.onnx", m)

    # Shapes: unknown after inference, non-positive dims, int64 overflow.
    write("shape_unknown.onnx", model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
        [inp("x", ["N", 8]), inp("shape", [2], I64)], [out("y")]))
    write("dim_zero.onnx", model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [inp("x", ["N", 0])], [out("y")]))
    write("dim_negative.onnx", model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [inp("x", ["N", -3])], [out("y")]))
    write("dim_int64max.onnx", model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [inp("x", [9223372036854775807])], [out("y")]))
    write("dim_int64max_weight.onnx",
          mlp(stripped("w", [8, 9223372036854775807])))
    write("overflow.onnx", model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [inp("x", ["N", 4294967296, 4294967296])], [out("y")]))

    # Conv weights of rank 3 for a 2-D convolution.
    write("conv_weight_rank.onnx", model(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv",
                          kernel_shape=[3, 3])],
        [inp("x", ["N", 3, 8, 8])], [out("y")], [stripped("w", [4, 3, 3])]))

    # A stride of 0: onnx 1.12's shape inference divides by it (SIGFPE).
    write("conv_stride_zero.onnx", model(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv",
                          kernel_shape=[3, 3], strides=[0, 1])],
        [inp("x", ["N", 3, 8, 8])], [out("y")],
        [stripped("w", [4, 3, 3, 3])]))

    # A Conv whose output name is empty (absent; found by fuzz-onnx: the
    # semantics builder read the missing output).
    write("conv_no_output.onnx", model(
        [helper.make_node("Conv", ["x", "w"], [""], name="conv",
                          kernel_shape=[3, 3]),
         helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [inp("x", ["N", 3, 8, 8])], [out("y")],
        [stripped("w", [4, 3, 3, 3])]))

    # An initializer and a graph input of element type 0 (UNDEFINED): onnx
    # 1.12's shape inference crashed on the former (found by fuzz-onnx).
    w = stripped("w", [8, 4])
    w.data_type = TensorProto.UNDEFINED
    write("initializer_type_undefined.onnx", mlp(w))
    write("input_type_undefined.onnx", model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [inp("x", ["N", 8], TensorProto.UNDEFINED)], [out("y")]))

    # ONNX's own (strict) shape inference fails; the loss cannot be appended.
    write("incompatible.onnx", model(
        [helper.make_node("Add", ["x", "z"], ["y"], name="add")],
        [inp("x", ["N", 8]), inp("z", ["N", 5])], [out("y")]))
    write("loss_rank1.onnx", model(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="sum",
                          keepdims=0)],
        [inp("x", ["N", 8])], [out("y")],
        [helper.make_tensor("axes", I64, [1], [1])]))

    # an opset past what ONNX 1.12 knows, and one before opset 7's
    # broadcasting; initializer data shorter than its dims (raw_data: 31
    # floats' bytes of 32, and a float_data of 3 values for 32).
    m = mlp(stripped("w", [8, 4]))
    m.opset_import[0].version = 99
    write("opset99.onnx", m)
    m = mlp(stripped("w", [8, 4]))
    m.opset_import[0].version = 6
    write("opset6.onnx", m)
    w = helper.make_tensor("w", F, [8, 4], struct.pack("<32f", *[0.5] * 32),
                           raw=True)
    w.raw_data = w.raw_data[:124]
    write("raw_short.onnx", mlp(w))
    w = helper.make_tensor("w", F, [8, 4], [0.5] * 32)
    del w.float_data[3:]
    write("float_data_short.onnx", mlp(w))
    # Clip whose bound is a graph input, not a constant; and min > max.
    write("clip_nonconst.onnx", model(
        [helper.make_node("Clip", ["x", "lo"], ["y"], name="clip")],
        [inp("x", ["N", 8]), inp("lo", [])], [out("y")]))
    write("clip_bounds.onnx", model(
        [helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="clip")],
        [inp("x", ["N", 8])], [out("y")],
        [helper.make_tensor("lo", F, [], [6.0]),
         helper.make_tensor("hi", F, [], [0.0])]))
    # Valid: ReLU6 with its bounds as scalar initializers (not Constants).
    write("clip_init.onnx", model(
        [helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="clip")],
        [inp("x", ["N", 8])], [out("y")],
        [helper.make_tensor("lo", F, [], [0.0]),
         helper.make_tensor("hi", F, [], [6.0])]))


if __name__ == "__main__":
    main()
