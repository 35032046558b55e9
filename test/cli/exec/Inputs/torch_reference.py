#!/usr/bin/python3
"""Train a zoo model in PyTorch exactly as soap-run does on one rank (same
weights, inputs and labels: drawn from the seed by global element index with
soapc's hashUniform; SGD, mean cross-entropy) and compare each step's loss
and every final weight with a soap-run output and --dump-weights directory.

    torch_reference.py MODEL SEED RUN.out RUN_DIR
    torch_reference.py --write [--float32] MODEL SEED BATCH STEPS MICRO_BATCHES
                       OUT DIR [LR]

The first form (batch 8, 3 steps, float32) prints one line and exits 1 on a
difference beyond float rounding. The second trains in float64 (an exact
reference, to float32's rounding) at BATCH for STEPS steps, each step's
batch run as MICRO_BATCHES equal micro-batches whose gradients add up (as
soap-run's gradient accumulation) at learning rate LR (0.1, soap-run's
default), and writes the losses to OUT and the
final weights to DIR as soap-run's --dump-weights does (float64 files,
"dtype": "f64" in weights.json), for compare.py --exact-ref; with
--float32 the same in float32 (PyTorch's kernels round otherwise than
soap-run's: a second float32 sample for compare.py --float32-ref). Only models
whose ONNX weight names are PyTorch's parameter names (the torchvision
models and export.py's own CNNs) and whose inputs are images. Every
nn.Dropout takes soap-run's masks (SoapDropout): the zoo's exports are in
training mode, so their Dropouts drop."""
import array
import json
import math
import os
import sys

import numpy as np
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


def hash_uniforms(seed, stream, n, start=0):
    """hash_uniform(seed, stream, i) for i in range(start, start + n), as a
    numpy array."""
    u64 = np.uint64
    with np.errstate(over="ignore"):
        def mix(x):
            x = x + u64(0x9e3779b97f4a7c15)
            z = (x ^ (x >> u64(30))) * u64(0xbf58476d1ce4e5b9)
            z = (z ^ (z >> u64(27))) * u64(0x94d049bb133111eb)
            return z ^ (z >> u64(31))
        a = u64(splitmix((seed * 0xd1342543de82ef95 + stream) & MASK))
        return (mix(a ^ np.arange(start, start + n, dtype=np.uint64))
                >> u64(11)).astype(np.float64) * 2.0 ** -53


class SoapDropout(nn.Module):
    """nn.Dropout with soap-run's masks: element i of the op's output (its
    index in the whole batch's tensor) is kept when hash_uniform(seed,
    fnv1a(node name) ^ step * golden, i) >= p. `step` (0-based) and
    `micro` (the micro-batch, of equal ones) are set before each pass."""

    def __init__(self, node, p, seed):
        super().__init__()
        self.node, self.p, self.seed = node, p, seed
        self.step, self.micro = 0, 0

    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        stream = fnv1a(self.node) ^ ((self.step * 0x9E3779B97F4A7C15) & MASK)
        keep = hash_uniforms(self.seed, stream, x.numel(),
                             self.micro * x.numel()) >= self.p
        mask = torch.tensor(keep.reshape(x.shape), dtype=x.dtype)
        scale = torch.tensor(1 / (1 - self.p), dtype=torch.float32).to(x.dtype)
        return x * scale * mask


def soap_dropouts(model, seed):
    """Replaces every nn.Dropout by a SoapDropout named as PyTorch's ONNX
    exporter names its node ('classifier.0' -> '/classifier/classifier.0/
    Dropout'); returns them."""
    out = []
    for path, mod in list(model.named_modules()):
        if not isinstance(mod, nn.Dropout):
            continue
        parts = path.split(".")
        node = "".join("/" + ".".join(parts[:i + 1])
                       for i in range(len(parts))) + "/Dropout"
        d = SoapDropout(node, mod.p, seed)
        parent = model.get_submodule(".".join(parts[:-1])) if len(parts) > 1 \
            else model
        setattr(parent, parts[-1], d)
        out.append(d)
    return out


def setup(name, seed, batch, dtype):
    """The model with soap-run's initial weights, and its input and labels
    (drawn from the seed by global element index, as soap-run does)."""
    builder, specs = export.MODELS[name]
    torch.manual_seed(0)
    model = builder().to(dtype)
    model.train()
    soap_dropouts(model, seed)
    scales = {m + ".weight" for m, mod in model.named_modules()
              if isinstance(mod, (nn.BatchNorm2d, nn.LayerNorm))}
    with torch.no_grad():
        for k, p in model.named_parameters():
            n = p.numel()
            a = 1 / math.sqrt(n / p.shape[0]) if p.dim() >= 2 else 0.1
            u = 2 * hash_uniforms(seed, fnv1a(k), n) - 1
            v = 1 + 0.1 * u if k in scales else a * u
            # soap-run draws in double and stores float32
            p.copy_(torch.tensor(v.astype(np.float32)).to(dtype)
                    .reshape(p.shape))
    shape = [batch] + specs[0][1][1:]
    n = math.prod(shape)
    u = 2 * hash_uniforms(seed, fnv1a("input") ^ 0x5EED, n) - 1
    x = torch.tensor(u.astype(np.float32)).to(dtype).reshape(shape)
    with torch.no_grad():
        classes = model(x).shape[-1]
    u = hash_uniforms(seed, fnv1a("labels") ^ 0x5EED, batch)
    labels = torch.tensor(np.minimum((u * classes).astype(np.int64),
                                     classes - 1))
    return model, x, labels


def train(model, x, labels, steps, micro_batches=1, lr=0.1):
    """SGD steps of mean cross-entropy; returns each step's loss."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    batch = x.shape[0]
    for step in range(steps):
        opt.zero_grad()
        total = 0.0
        for k, (xs, ls) in enumerate(zip(x.chunk(micro_batches),
                                         labels.chunk(micro_batches))):
            for d in model.modules():
                if isinstance(d, SoapDropout):
                    d.step, d.micro = step, k
            # each micro-batch's share of the batch's mean
            loss = F.cross_entropy(model(xs), ls, reduction="sum") / batch
            loss.backward()
            total += loss.item()
        losses.append(total)
        opt.step()
    return losses


def write(argv):
    dtype = torch.float64
    if argv and argv[0] == "--float32":
        dtype, argv = torch.float32, argv[1:]
    name, seed, batch, steps, m, out, wdir = argv[:7]
    lr = float(argv[7]) if len(argv) > 7 else 0.1
    batch, steps, m = int(batch), int(steps), int(m)
    model, x, labels = setup(name, int(seed), batch, dtype)
    losses = train(model, x, labels, steps, m, lr)
    kind = "float64" if dtype == torch.float64 else "float32"
    with open(out, "w") as f:
        for k, loss in enumerate(losses):
            f.write("step %d loss %.17g (%s PyTorch)\n" % (k + 1, loss, kind))
    os.makedirs(wdir, exist_ok=True)
    man = []
    for k, p in model.named_parameters():
        fname = "%s.f64" % k
        p.detach().numpy().astype(np.float64).tofile(os.path.join(wdir, fname))
        man.append({"file": fname, "name": k, "shape": list(p.shape),
                    "dtype": "f64"})
    with open(os.path.join(wdir, "weights.json"), "w") as f:
        json.dump({"weights": man}, f, indent=1)
    print("%s reference: %d losses, %d weights" % (kind, len(losses), len(man)))


def main():
    if sys.argv[1] == "--write":
        return write(sys.argv[2:])
    name, seed, run_out, run_dir = sys.argv[1], int(sys.argv[2]), \
        sys.argv[3], sys.argv[4]
    model, x, labels = setup(name, seed, 8, torch.float32)
    losses = train(model, x, labels, 3)
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
