"""Holds examples/models/decoder.py to what torch.onnx.export really writes.

For small configurations that together take every option (MHA, GQA and
MQA; gelu, swiglu and squared-relu; layernorm and rmsnorm; learned and
rotary positions; tied and untied embeddings; biases on and off), exports
decoder.torch_decoder with torch as export.py exports the zoo and builds the
same configuration with decoder.build, then compares the two graphs with
gpt3_pattern.py's comparison (every node in order up to names: op type,
operands, attributes, constant values, initializer dims, inferred types).
Also checks that decoder.decoder_params gives PyTorch's sum(p.numel()),
that the parameters torch holds are exactly the floating initializers
(the rotary tables and the mask are computed in the graph), and that the
comparison notices a changed attribute.

Prints one line per configuration ("SAME OP PATTERN: ..."), or the first
difference and exits 1.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "..", "..", "..", "examples", "models")
sys.path.insert(0, os.path.abspath(MODELS))
sys.path.insert(0, HERE)

import onnx  # noqa: E402
import torch  # noqa: E402

import decoder  # noqa: E402
import export  # noqa: E402
from gpt3 import mark_external  # noqa: E402
from gpt3_pattern import (compare_patterns, first_difference,  # noqa: E402
                          pattern, report_same)

C = decoder.Config
CONFIGS = [
    # Llama 3 in small: GQA, rope, rmsnorm, swiglu, untied, no biases.
    C(2, 64, 4, kv_heads=2, ffn=96, activation="swiglu", norm="rmsnorm",
      positions="rope", vocab=128, seq=16, tied=False, bias=False,
      rope_theta=500000.0),
    # Multi-query, squared ReLU, rope with layernorm, tied, biases.
    C(2, 48, 3, kv_heads=1, ffn=64, activation="squared-relu",
      norm="layernorm", positions="rope", vocab=112, seq=8, tied=True,
      bias=True),
    # GPT-style: MHA, gelu, layernorm, learned, tied, biases.
    C(2, 64, 4, activation="gelu", norm="layernorm", positions="learned",
      vocab=128, seq=16),
    # MHA with rope and rmsnorm, gelu, untied, no biases.
    C(1, 32, 2, activation="gelu", norm="rmsnorm", positions="rope",
      vocab=104, seq=8, tied=False, bias=False),
    # GQA with learned positions (no rope between K's transposes), swiglu
    # with biases.
    C(1, 64, 8, kv_heads=4, ffn=80, activation="swiglu", norm="rmsnorm",
      positions="learned", vocab=120, seq=8, tied=False, bias=True),
]


def main():
    torch.set_num_threads(1)
    failed = False
    for c in CONFIGS:
        what = "decoder(%s)" % c.describe()
        torch.manual_seed(0)
        model = decoder.torch_decoder(c)
        n_params = sum(p.numel() for p in model.parameters())
        real = export.export_model(model, [("ids", ["N", c.seq], "int64")],
                                   2)
        made = decoder.build(c)
        mark_external(made, "absent.weights")
        want = compare_patterns(what, real, made, "decoder.py")
        if want is None:
            failed = True
            continue
        formula = decoder.decoder_params(c)
        held = export.weight_params(real)
        if formula != n_params or held != n_params:
            print("PARAMETERS: %s: decoder_params %d, the export's floating "
                  "initializers %d, PyTorch %d"
                  % (what, formula, held, n_params))
            failed = True
            continue
        bad = onnx.ModelProto()
        bad.CopyFrom(made)
        for n in bad.graph.node:
            if n.op_type == "Softmax":
                n.attribute[0].i = 2
                break
        if first_difference(want, pattern(bad)) is None:
            print("VACUOUS: %s: a changed Softmax axis compares equal" % what)
            failed = True
        report_same(what, want, n_params)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
