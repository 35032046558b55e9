#!/usr/bin/python3
"""Writes a small two-layer LSTM classifier as ONNX for soap-run's tests:

    ids [N, 6] -> Gather (embedding 20 x 8) -> LSTM, batch first,
    bidirectional, hidden 5, with biases -> Reshape [N, 6, 10] ->
    Transpose [6, N, 10] -> LSTM, sequence first, hidden 4 -> last hidden
    state [N, 4] -> Gemm -> logits [N, 3]

    lstm_model.py OUT.onnx"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def weight(name, *dims):
    rng = np.random.default_rng(len(name))
    return numpy_helper.from_array(
        (rng.standard_normal(dims) * 0.3).astype(np.float32), name)


def main():
    inits = [
        weight("emb", 20, 8),
        weight("W1", 2, 20, 8), weight("R1", 2, 20, 5), weight("B1", 2, 40),
        weight("W2", 1, 16, 10), weight("R2", 1, 16, 4),
        weight("fc.weight", 4, 3), weight("fc.bias", 3),
        numpy_helper.from_array(np.array([0, 6, 10], np.int64), "shape1"),
        numpy_helper.from_array(np.array([0], np.int64), "axes0"),
    ]
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["x"], axis=0),
        helper.make_node("LSTM", ["x", "W1", "R1", "B1"], ["y1"],
                         hidden_size=5, layout=1, direction="bidirectional"),
        helper.make_node("Reshape", ["y1", "shape1"], ["y1r"]),
        helper.make_node("Transpose", ["y1r"], ["x2"], perm=[1, 0, 2]),
        helper.make_node("LSTM", ["x2", "W2", "R2"], ["y2", "h2"],
                         hidden_size=4),
        helper.make_node("Squeeze", ["h2", "axes0"], ["h"]),
        helper.make_node("Gemm", ["h", "fc.weight", "fc.bias"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "lstm_small",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 6])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                       ["N", 3])],
        inits)
    model = helper.make_model(graph,
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, sys.argv[1])


if __name__ == "__main__":
    main()
