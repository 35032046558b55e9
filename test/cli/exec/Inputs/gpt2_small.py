"""A small GPT-2 (examples/models/export.py's GPT2: pre-LN blocks, tied
embedding, GELU, dropout 0.1, the causal mask built in-graph by
ConstantOfShape + Trilu) exported as the zoo exports gpt2.onnx: vocabulary
128, width 16, 2 layers, 2 heads, a context of 128 tokens, so its causal
mask (128 x 128 = 16,384 elements) is past what soapc keeps for searching
(4,096) and soap-run must ask for it.

    gpt2_small.py OUT.onnx"""
import os
import sys

import onnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "..", "..", "examples", "models"))
import export  # noqa: E402

if __name__ == "__main__":
    export.torch.manual_seed(0)
    model = export.GPT2(vocab=128, hidden=16, layers=2, heads=2, n_ctx=128)
    proto = export.export_model(model, [("ids", ["N", 128], "int64")], 2)
    onnx.save(proto, sys.argv[1])
