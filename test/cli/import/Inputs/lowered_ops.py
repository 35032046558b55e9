"""Small real exports of what the torchvision catalogue needed beyond the
zoo, and their PyTorch reference:

  einsum  MaxViT's attention as torchvision writes it (einsum "B G H I D,
          B G H J D -> B G H I J" and back), a head as einsum with a
          weight ("b t w, o w -> b t o") and a sum over tokens ("bto->bo");
  forms   the other two-operand shapes the lowering takes (ellipsis, a
          weight on the left, two contracted or two free letters merged, an
          outer product, an implicit output);
  swin    torchvision's ShiftedWindowAttention (shift 1 on a 4 x 4 grid of
          2 x 2 windows): the exporter builds the shifted-window mask with
          ScatterND from the input's shape, then a mean and a linear head;
  bn      a DenseNet-style block exported in eval mode at opset 17: a
          BatchNormalization after a Concat stays in the graph with
          training_mode = 0.

Exported at opset 17 without constant folding (PyTorch's parameter names
kept); einsum, forms and swin in training mode, bn in eval mode.

    lowered_ops.py export MODEL OUT.onnx
    lowered_ops.py compare MODEL SEED RUN.out RUN_DIR
    lowered_ops.py bad NAME OUT.onnx

`bad` writes what soapc refuses: an Einsum taking a diagonal ("bii->bi"),
an Einsum of three operands, a ScatterND writing into the input's data.

`compare` trains the model in PyTorch as soap-run does on one rank (weights,
inputs and labels drawn from the seed by global element index, SGD at 0.1,
mean cross-entropy over the last axis; BatchNorm with batch statistics, as
soap-run trains every BatchNormalization) and compares every step's loss and
final weight with soap-run's output and --dump-weights directory; prints one
line, exits 1 on a difference beyond float rounding."""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision.models.swin_transformer import ShiftedWindowAttention

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "exec", "Inputs"))
from torch_reference import fnv1a, hash_uniform  # noqa: E402
from weight_flow import train_and_compare  # noqa: E402

CLASSES = 5


class Einsum(nn.Module):
    TOKENS, WIDTH, HEADS = 4, 8, 2

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(self.WIDTH, 3 * self.WIDTH)
        self.head = nn.Parameter(torch.randn(CLASSES, self.WIDTH))

    def forward(self, x):                             # [N, T, W]
        n, t, w = x.shape
        d = w // self.HEADS
        qkv = self.qkv(x).reshape(n, 1, t, 3, self.HEADS, d)
        q, k, v = qkv.permute(3, 0, 1, 4, 2, 5)       # [N, 1, H, T, d]
        a = torch.einsum("B G H I D, B G H J D -> B G H I J", q, k)
        a = (a * d ** -0.5).softmax(dim=-1)
        y = torch.einsum("B G H I J, B G H J D -> B G H I D", a, v)
        y = y.permute(0, 1, 3, 2, 4).reshape(n, t, w)
        y = torch.einsum("b t w, o w -> b t o", y, self.head)
        return torch.einsum("bto->bo", y)             # [N, CLASSES]


class EinsumForms(nn.Module):
    """The other shapes of two-operand equations the lowering takes: an
    ellipsis, a weight on the left, two contracted letters, two free
    letters of the right operand, an outer product (nothing contracted)
    and an implicit output (the letters used once, sorted)."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(4, CLASSES))
        self.w2 = nn.Parameter(torch.randn(CLASSES, 4))
        self.w3 = nn.Parameter(torch.randn(2, 2, CLASSES))
        self.w4 = nn.Parameter(torch.randn(4, CLASSES, 1))
        self.w5 = nn.Parameter(torch.randn(4, CLASSES))

    def forward(self, x):                             # [N, 4, 4]
        n = x.shape[0]
        a = torch.einsum("...i,io->...o", x, self.w1)
        b = torch.einsum("oi,bti->bot", self.w2, x).transpose(1, 2)
        c = torch.einsum("btij,ijo->bto", x.reshape(n, 4, 2, 2), self.w3)
        d = torch.einsum("bti,ipq->btpq", x, self.w4).reshape(n, 4, CLASSES)
        e = torch.einsum("bo,bt->bto", a.sum(1), x[:, :, 0])
        f = torch.einsum("bti,io", x, self.w5).transpose(1, 2)
        return a + b + c + d + e + f                  # [N, 4, CLASSES]


class Swin(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = ShiftedWindowAttention(8, [2, 2], [1, 1], 2)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x):                             # [N, 4, 4, 8]
        return self.head(self.attn(x).mean(dim=(1, 2)))


class DenseBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv0 = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.conv1 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.norm = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x):                             # [N, 3, 6, 6]
        a = self.conv0(x)
        h = F.relu(self.norm(torch.cat([a, self.conv1(a)], 1)))
        return self.head(h.mean(dim=(2, 3)))


MODELS = {"einsum": (Einsum, [4, 8], torch.onnx.TrainingMode.TRAINING),
          "forms": (EinsumForms, [4, 4], torch.onnx.TrainingMode.TRAINING),
          "swin": (Swin, [4, 4, 8], torch.onnx.TrainingMode.TRAINING),
          "bn": (DenseBn, [3, 6, 6], torch.onnx.TrainingMode.EVAL)}


def export(name, path):
    cls, dims, mode = MODELS[name]
    torch.manual_seed(0)
    model = cls()
    model.train(mode == torch.onnx.TrainingMode.TRAINING)
    torch.onnx.export(model, (torch.randn([2] + dims),), path,
                      opset_version=17, training=mode,
                      do_constant_folding=False, input_names=["input"],
                      output_names=["logits"],
                      dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}})


def compare(name, seed, run_out, run_dir, batch=8):
    cls, dims, _ = MODELS[name]
    model = cls().train()
    scales = {m + ".weight" for m, mod in model.named_modules()
              if isinstance(mod, (nn.BatchNorm2d, nn.LayerNorm))}
    with torch.no_grad():
        for k, p in model.named_parameters():
            n = p.numel()
            a = 1 / math.sqrt(n / p.shape[0]) if p.dim() >= 2 else 0.1
            u = [2 * hash_uniform(seed, fnv1a(k), i) - 1 for i in range(n)]
            v = [1 + 0.1 * x if k in scales else a * x for x in u]
            p.copy_(torch.tensor(v).reshape(p.shape))
    shape = [batch] + dims
    x = torch.tensor([2 * hash_uniform(seed, fnv1a("input") ^ 0x5EED, i) - 1
                      for i in range(math.prod(shape))]).reshape(shape)
    train_and_compare(model, x, CLASSES, seed, run_out, run_dir)


def bad(name, path):
    import onnx
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    x = helper.make_tensor_value_info("x", f, ["N", 4, 4])
    y = helper.make_tensor_value_info("y", f, None)
    inits = []
    if name == "diagonal":
        nodes = [helper.make_node("Einsum", ["x"], ["y"], name="diag",
                                  equation="bii->bi")]
    elif name == "three":
        nodes = [helper.make_node("Einsum", ["x", "x", "x"], ["y"],
                                  name="triple",
                                  equation="bij,bjk,bkl->bil")]
    else:  # scatter
        inits = [helper.make_tensor("idx", TensorProto.INT64, [1, 1], [0]),
                 helper.make_tensor("upd", f, [1, 4, 4], [0.0] * 16)]
        nodes = [helper.make_node("ScatterND", ["x", "idx", "upd"], ["y"],
                                  name="scatter")]
    g = helper.make_graph(nodes, "bad", [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, path)


if __name__ == "__main__":
    if sys.argv[1] == "export":
        export(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "bad":
        bad(sys.argv[2], sys.argv[3])
    else:
        compare(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
