"""A tiny GPT written by examples/models/gpt3.py's build() (the graph
torch.onnx.export writes for export.py's GPT2: causal mask as a Where with
float32's lowest, tanh GELU as element-wise ops, dropout 0.1): vocabulary 64
(or VOCAB), width 16, 2 layers (or LAYERS), 2 heads (or HEADS), a context of
16 tokens; weights stripped, so soap-run seeds them. Needs ONNX's Python
package, not torch.

    gpt_tiny.py OUT.onnx [LAYERS [HEADS [VOCAB]]]"""
import os
import sys

import onnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "..", "..", "examples", "models"))
import gpt3  # noqa: E402

if __name__ == "__main__":
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    heads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    vocab = int(sys.argv[4]) if len(sys.argv) > 4 else 64
    model = gpt3.build(vocab, 16, layers, heads, 16, name="gpt_tiny")
    model = onnx.shape_inference.infer_shapes(model, check_type=True,
                                              strict_mode=True)
    onnx.save(model, sys.argv[1])
