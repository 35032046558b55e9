#!/usr/bin/python3
"""Writes ONNX models at and past soapc's limits (README, "Limits") for the
tests in test/cli/limits/, at test time: they are too large to commit.
Plain Python (no onnx package): the few protobuf messages are encoded here.

    make_limit_models.py ops N OUT        x -> Relu x N -> y (N nodes)
    make_limit_models.py nesting D OUT    an If whose then-branch holds an
                                          If ... D subgraphs deep
"""

import sys


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def key(field, wire):
    return varint(field << 3 | wire)


def vint(field, n):
    return key(field, 0) + varint(n)


def ld(field, payload):
    if isinstance(payload, str):
        payload = payload.encode()
    return key(field, 2) + varint(len(payload)) + payload


def value_info(name, dims):
    # ValueInfoProto{name=1, type=2}; TypeProto{tensor_type=1};
    # Tensor{elem_type=1 (FLOAT=1), shape=2}; TensorShapeProto{dim=1};
    # Dimension{dim_value=1, dim_param=2}.
    shape = b"".join(ld(1, ld(2, d) if isinstance(d, str) else vint(1, d))
                     for d in dims)
    return ld(1, name) + ld(2, ld(1, vint(1, 1) + ld(2, shape)))


def node(op, inputs, outputs, name, attrs=b""):
    # NodeProto{input=1, output=2, name=3, op_type=4, attribute=5}
    return (b"".join(ld(1, i) for i in inputs) +
            b"".join(ld(2, o) for o in outputs) + ld(3, name) + ld(4, op) +
            attrs)


def graph(nodes, name, inputs, outputs):
    # GraphProto{node=1, name=2, input=11, output=12}
    return (b"".join(ld(1, n) for n in nodes) + ld(2, name) +
            b"".join(ld(11, value_info(*i)) for i in inputs) +
            b"".join(ld(12, value_info(*o)) for o in outputs))


def model(g):
    # ModelProto{ir_version=1, producer_name=2, graph=7, opset_import=8};
    # OperatorSetIdProto{domain=1, version=2}.
    return (vint(1, 8) + ld(2, "make_limit_models") + ld(7, g) +
            ld(8, ld(1, "") + vint(2, 17)))


def ops(n):
    nodes = [node("Relu", ["x" if i == 0 else f"t{i - 1}"],
                  ["y" if i == n - 1 else f"t{i}"], f"relu{i}")
             for i in range(n)]
    return model(graph(nodes, "ops", [("x", ["N", 8])], [("y", ["N", 8])]))


def nesting(depth):
    # The innermost body: Identity of the outer scope's x.
    body = graph([node("Identity", ["x"], [f"o{depth}"], f"id{depth}")],
                 f"body{depth}", [], [(f"o{depth}", ["N", 8])])
    for level in range(depth, 0, -1):
        # AttributeProto{name=1, g=6, type=20 (GRAPH=5)}
        attr = ld(5, ld(1, "then_branch") + ld(6, body) + vint(20, 5))
        n = node("If", ["c"], [f"o{level - 1}"], f"if{level - 1}", attr)
        if level > 1:
            body = graph([n], f"body{level - 1}", [],
                         [(f"o{level - 1}", ["N", 8])])
    return model(graph([n], "nesting", [("x", ["N", 8]), ("c", [1])],
                       [("o0", ["N", 8])]))


def main():
    kind, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    data = {"ops": ops, "nesting": nesting}[kind](n)
    with open(out, "wb") as f:
        f.write(data)


if __name__ == "__main__":
    main()
