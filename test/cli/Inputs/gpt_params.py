"""Prints a FileCheck line pinning a GPT's parameter count, computed from
its configuration (not from the model file or params.json):

    gpt_params.py LAYERS D_MODEL [VOCAB [CONTEXT]]

token table V x d (tied LM head) + position table C x d + per block
12 d^2 (attention 4 d^2, MLP 8 d^2) + 13 d (biases 3d + d + 4d + d, two
LayerNorms 4d) + the final LayerNorm 2 d."""
import sys

layers, d = int(sys.argv[1]), int(sys.argv[2])
vocab = int(sys.argv[3]) if len(sys.argv) > 3 else 50257
ctx = int(sys.argv[4]) if len(sys.argv) > 4 else 2048
params = (vocab + ctx) * d + layers * (12 * d * d + 13 * d) + 2 * d
print("CHECK: parameters: {:,}".format(params))
