"""Small models for importer fixes, and their PyTorch reference:

  flow  parameters reach the ops that compute with them through shape ops:
        a class token expanded to the batch and concatenated to the input,
        a position table added, a weight transposed before a MatMul;
  mha   nn.MultiheadAttention (batch_first) and a linear head: PyTorch's
        attention merges sequence and batch ([T, N*h, d] -> [T*N, E]) for
        its output projection, which soapc computes unmerged.

Both are exported without constant folding, so weights keep PyTorch's names
and the Transposes and Slices of them stay in the graph.

    weight_flow.py export MODEL OUT.onnx
    weight_flow.py compare MODEL SEED RUN.out RUN_DIR

`compare` trains it in PyTorch as soap-run does on one rank (weights,
inputs and labels drawn from the seed by global element index, SGD at 0.1,
mean cross-entropy over the last axis) and compares every step's loss and
final weight with soap-run's output and --dump-weights directory; prints
one line, exits 1 on a difference beyond float rounding."""
import array
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "exec", "Inputs"))
from torch_reference import fnv1a, hash_uniform  # noqa: E402

TOKENS, WIDTH, CLASSES = 4, 8, 6


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(WIDTH, 2, dropout=0.0,
                                         batch_first=True)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x):                             # [N, TOKENS, WIDTH]
        y, _ = self.mha(x, x, x, need_weights=False)
        return self.head(y)                           # [N, TOKENS, CLASSES]


class Flow(nn.Module):
    def __init__(self):
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, WIDTH))
        self.w = nn.Parameter(torch.randn(CLASSES, WIDTH))
        self.pos = nn.Parameter(torch.randn(TOKENS + 1, WIDTH))

    def forward(self, x):                             # [N, TOKENS, WIDTH]
        c = self.cls.expand(x.shape[0], -1, -1)
        h = torch.cat([c, x], dim=1) + self.pos
        return torch.matmul(h, self.w.t())            # [N, TOKENS+1, CLASSES]


MODELS = {"flow": Flow, "mha": Attention}


def export(name, path):
    torch.manual_seed(0)
    model = MODELS[name]().train()
    torch.onnx.export(model, (torch.randn(2, TOKENS, WIDTH),), path,
                      opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, input_names=["input"],
                      output_names=["logits"],
                      dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}})


def train_and_compare(model, x, classes, seed, run_out, run_dir):
    """Trains `model` on `x` for 3 SGD steps (labels of `classes` classes
    drawn from `seed`, as soap-run draws them); exits with DIFFERENT unless
    soap-run's losses (`run_out`) and dumped weights (`run_dir`) match."""
    rows = model(x).numel() // classes
    labels = torch.tensor([min(int(hash_uniform(seed, fnv1a("labels") ^
                                                0x5EED, i) * classes),
                               classes - 1) for i in range(rows)])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = F.cross_entropy(model(x).reshape(rows, classes), labels)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    with open(run_out) as f:
        ran = [float(line.split()[3]) for line in f
               if line.startswith("step ")]
    if len(ran) != len(losses):
        sys.exit("DIFFERENT: %d steps ran, 3 expected" % len(ran))
    for k, (a, b) in enumerate(zip(losses, ran)):
        if abs(a - b) > 1e-5 * abs(a):
            sys.exit("DIFFERENT: step %d loss %.9g (torch) %.9g (soap-run)"
                     % (k + 1, a, b))
    with open(os.path.join(run_dir, "weights.json")) as f:
        dumped = json.load(f)["weights"]
    params = dict(model.named_parameters())
    if sorted(w["name"] for w in dumped) != sorted(params):
        sys.exit("DIFFERENT: weights %s, PyTorch has %s"
                 % (sorted(w["name"] for w in dumped), sorted(params)))
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


def compare(name, seed, run_out, run_dir, batch=8):
    model = MODELS[name]().train()
    with torch.no_grad():
        for k, p in model.named_parameters():
            n = p.numel()
            a = 1 / math.sqrt(n / p.shape[0]) if p.dim() >= 2 else 0.1
            u = [2 * hash_uniform(seed, fnv1a(k), i) - 1 for i in range(n)]
            p.copy_(torch.tensor([a * v for v in u]).reshape(p.shape))
    shape = [batch, TOKENS, WIDTH]
    x = torch.tensor([2 * hash_uniform(seed, fnv1a("input") ^ 0x5EED, i) - 1
                      for i in range(math.prod(shape))]).reshape(shape)
    train_and_compare(model, x, CLASSES, seed, run_out, run_dir)


if __name__ == "__main__":
    if sys.argv[1] == "export":
        export(sys.argv[2], sys.argv[3])
    else:
        compare(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
