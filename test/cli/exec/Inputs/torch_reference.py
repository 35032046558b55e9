#!/usr/bin/python3
"""Train a zoo model in PyTorch exactly as soap-run does on one rank (same
weights, inputs and labels: drawn from the seed by global element index with
soapc's hashUniform; SGD, mean cross-entropy) and compare each step's loss
and every final weight with a soap-run output and --dump-weights directory.

    torch_reference.py MODEL SEED RUN.out RUN_DIR

Prints one line; exits 1 on a difference beyond float rounding. Only models
whose ONNX weight names are PyTorch's parameter names (lenet, resnet_small,
mobilenet_small)."""
import array
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..",
                                "..", "examples", "models"))
import export  # noqa: E402

MASK = (1 << 64) - 1


def splitmix(x):
    x = (x + 0x9e3779b97f4a7c15) & MASK
    z = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & MASK
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & MASK
    return z ^ (z >> 31)


def fnv1a(s):
    h = 0xcbf29ce484222325
    for c in s.encode():
        h = ((h ^ c) * 0x100000001b3) & MASK
    return h


def hash_uniform(seed, stream, index):
    a = splitmix((seed * 0xd1342543de82ef95 + stream) & MASK)
    return (splitmix(a ^ index) >> 11) * 2.0 ** -53


def main():
    name, seed, run_out, run_dir = sys.argv[1], int(sys.argv[2]), \
        sys.argv[3], sys.argv[4]
    builder, specs = export.MODELS[name]
    torch.manual_seed(0)
    model = builder()
    model.train()
    scales = {m + ".weight" for m, mod in model.named_modules()
              if isinstance(mod, (nn.BatchNorm2d, nn.LayerNorm))}
    with torch.no_grad():
        for k, p in model.named_parameters():
            n = p.numel()
            a = 1 / math.sqrt(n / p.shape[0]) if p.dim() >= 2 else 0.1
            u = [2 * hash_uniform(seed, fnv1a(k), i) - 1 for i in range(n)]
            v = [1 + 0.1 * x if k in scales else a * x for x in u]
            p.copy_(torch.tensor(v, dtype=torch.float32).reshape(p.shape))
    batch = 8
    shape = [batch] + specs[0][1][1:]
    n = math.prod(shape)
    x = torch.tensor([2 * hash_uniform(seed, fnv1a("input") ^ 0x5EED, i) - 1
                      for i in range(n)], dtype=torch.float32).reshape(shape)
    classes = model(x).shape[-1]
    labels = torch.tensor([min(int(hash_uniform(seed, fnv1a("labels") ^
                                                0x5EED, i) * classes),
                               classes - 1) for i in range(batch)])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), labels)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    with open(run_out) as f:
        ran = [float(l.split()[3]) for l in f if l.startswith("step ")]
    for k, (a, b) in enumerate(zip(losses, ran)):
        if abs(a - b) > 1e-5 * abs(a):
            sys.exit("DIFFERENT: step %d loss %.9g (torch) %.9g (soap-run)"
                     % (k + 1, a, b))
    with open(os.path.join(run_dir, "weights.json")) as f:
        dumped = json.load(f)["weights"]
    params = dict(model.named_parameters())
    for w in dumped:
        got = array.array("f")
        with open(os.path.join(run_dir, w["file"]), "rb") as f:
            got.frombytes(f.read())
        want = params[w["name"]].detach().flatten().tolist()
        for i, (a, b) in enumerate(zip(want, got)):
            if abs(a - b) > max(1e-5 * abs(a), 1e-6):
                sys.exit("DIFFERENT: %s[%d] %.9g (torch) %.9g (soap-run)"
                         % (w["name"], i, a, b))
    print("SAME AS PYTORCH: %d losses, %d weights" % (len(ran), len(dumped)))


if __name__ == "__main__":
    main()
