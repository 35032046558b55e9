"""Small Llama and Mixtral models built with Hugging Face transformers from
a configuration (random initialisation; nothing is downloaded) and exported
with torch.onnx.export, as a user exports a model to plan it with soapc.

Run with the project virtual environment (scripts/setup.sh --venv: torch,
transformers and onnx at the versions scripts/requirements.txt pins):

    .venv/bin/python examples/models/hf_export.py export OUT_DIR [--only hf_llama,...]
    .venv/bin/python examples/models/hf_export.py compare NAME MODEL.onnx SEED FWD_DIR RUN.out RUN_DIR

`export` writes OUT_DIR/NAME.onnx for each model and prints one line per
model: its PyTorch parameter count and op histogram. The export is the
TorchScript exporter (dynamo=False) at opset 17 in training mode with
constant folding on (as examples/models/export.py exports the zoo; torch
folds the rotary inverse frequencies into a constant and pre-transposes
every Linear weight into an `onnx::MatMul_*` initializer), input `ids`
[N, SEQ] int64 with a symbolic batch axis, output `logits` [N, SEQ, VOCAB].
The weights are in the file (not stripped): soap-run trains from them.

    model        transformers class   config
    hf_llama     LlamaForCausalLM     2 layers, hidden 64, 4 heads over 2 kv
                                      heads (GQA), head dim 16, SwiGLU ffn
                                      128, RMSNorm (eps 1e-5), RoPE (theta
                                      10,000), vocab 128, untied, seq 16
    hf_mixtral   MixtralForCausalLM   the same decoder with a sparse MoE
                                      block of 4 experts (SwiGLU ffn 96),
                                      top-2 routing, in every layer

Both use eager attention (attn_implementation="eager": matmul, additive
causal mask, softmax, dropout with p = 0, matmul), no KV cache, and
return logits only.

`compare` trains NAME in PyTorch as soap-run trains the export on one rank
and compares every step's loss and every final weight with soap-run's
output (RUN.out) and --dump-weights directory (RUN_DIR): one line, exit 1
on a difference beyond float rounding. It first matches each initializer
of the export with the PyTorch parameter it came from (by name, else by
value, as the transposed copy) and exits 1 unless every parameter has
exactly one; then starts from the weights soap-run's step 1 read (its
--dump-forward directory FWD_DIR: soap-run draws weights from its seed),
draws the token ids and labels from the seed by global element index as
soap-run does, and takes as many SGD steps (lr 0.1, mean cross-entropy
over the vocabulary) as soap-run ran."""
import argparse
import array
import collections
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import onnx  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from onnx import numpy_helper  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SEQ, VOCAB, OPSET = 16, 128, 17
MODELS = ("hf_llama", "hf_mixtral")


def config(name):
    from transformers import LlamaConfig, MixtralConfig
    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64, rms_norm_eps=1e-5,
                  rope_theta=10000.0, tie_word_embeddings=False,
                  attention_dropout=0.0, use_cache=False,
                  attn_implementation="eager")
    if name == "hf_llama":
        return LlamaConfig(intermediate_size=128, **common)
    if name == "hf_mixtral":
        return MixtralConfig(intermediate_size=96, num_local_experts=4,
                             num_experts_per_tok=2, router_aux_loss_coef=0.0,
                             **common)
    raise SystemExit("hf_export: unknown model %r (one of %s)"
                     % (name, ", ".join(MODELS)))


class Logits(torch.nn.Module):
    """The causal LM's logits for token ids, nothing else."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(input_ids=ids, use_cache=False, return_dict=False)[0]


def build(name):
    """The model with its random initialisation from seed 0, in training
    mode (the same weights on every call)."""
    from transformers import LlamaForCausalLM, MixtralForCausalLM
    torch.manual_seed(0)
    cfg = config(name)
    cls = LlamaForCausalLM if name == "hf_llama" else MixtralForCausalLM
    return Logits(cls(cfg)).train()


def export(name, out_dir):
    model = build(name)
    path = os.path.join(out_dir, name + ".onnx")
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator()
                        .manual_seed(0))
    torch.onnx.export(model, (ids,), path, dynamo=False, opset_version=OPSET,
                      training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=True, input_names=["ids"],
                      output_names=["logits"],
                      dynamic_axes={"ids": {0: "N"}, "logits": {0: "N"}})
    ops = collections.Counter(n.op_type for n in onnx.load(path).graph.node)
    params = sum(p.numel() for p in model.parameters())
    print("%s: %s parameters in PyTorch; ops %s" % (
        name, format(params, ","),
        ", ".join("%s %d" % kv for kv in sorted(ops.items()))))


MASK = (1 << 64) - 1


def fnv1a(s):
    h = 0xcbf29ce484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001b3) & MASK
    return h


def splitmix(x):
    x = (x + 0x9e3779b97f4a7c15) & MASK
    z = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & MASK
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & MASK
    return z ^ (z >> 31)


def hash_uniform(seed, stream, index):
    """soapc's hashUniform (lib/Support/Rng): a double in [0, 1) from the
    seed, a stream and an index."""
    a = splitmix((seed * 0xd1342543de82ef95 + stream) & MASK)
    return (splitmix(a ^ index) >> 11) * 2.0 ** -53


def draws(seed, name, count, classes):
    """soap-run's integer inputs: class min(floor(u * classes), classes - 1)
    of the uniform u drawn from the seed, the input's name and the element's
    global index."""
    stream = fnv1a(name) ^ 0x5EED
    return [min(int(hash_uniform(seed, stream, i) * classes), classes - 1)
            for i in range(count)]


def match_initializers(path, model):
    """Each floating initializer of the export as (PyTorch name, whether it
    is the transposed copy); exits 1 unless it is one-to-one and exact."""
    params = dict(model.named_parameters())
    left = dict(params)
    found = {}
    inits = [i for i in onnx.load(path).graph.initializer
             if i.data_type == onnx.TensorProto.FLOAT]
    for init in inits:
        value = torch.from_numpy(numpy_helper.to_array(init).copy())
        if init.name in left:
            if not torch.equal(left[init.name].detach(), value):
                sys.exit("DIFFERENT: initializer %s differs from PyTorch's"
                         % init.name)
            found[init.name] = (init.name, False)
            del left[init.name]
            continue
        hits = [k for k, p in left.items() if value.dim() == 2
                and p.dim() == 2 and p.shape == value.t().shape
                and torch.equal(p.detach().t(), value)]
        if len(hits) != 1:
            sys.exit("DIFFERENT: initializer %s matches %d PyTorch "
                     "parameters" % (init.name, len(hits)))
        found[init.name] = (hits[0], True)
        del left[hits[0]]
    if left:
        sys.exit("DIFFERENT: PyTorch parameters without an initializer: %s"
                 % ", ".join(sorted(left)))
    return found


def read_f32(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a


def load_initial(model, found, fwd_dir):
    """Sets every parameter to the weight soap-run's step 1 read (its
    --dump-forward directory): soap-run draws weights from its seed."""
    with open(os.path.join(fwd_dir, "forward.json")) as f:
        dumped = json.load(f)["weights"]
    params = dict(model.named_parameters())
    if sorted(w["name"] for w in dumped) != sorted(found):
        sys.exit("DIFFERENT: soap-run read %d weights, the export has %d"
                 % (len(dumped), len(found)))
    with torch.no_grad():
        for w in dumped:
            torch_name, transposed = found[w["name"]]
            p = params[torch_name]
            v = torch.tensor(read_f32(os.path.join(fwd_dir, w["file"])))
            v = v.reshape(p.t().shape if transposed else p.shape)
            p.copy_(v.t() if transposed else v)


def compare(name, path, seed, fwd_dir, run_out, run_dir, batch):
    model = build(name)
    found = match_initializers(path, model)
    load_initial(model, found, fwd_dir)
    with open(run_out) as f:
        ran = [float(line.split()[3]) for line in f
               if line.startswith("step ")]
    ids = torch.tensor(draws(seed, "ids", batch * SEQ, VOCAB)).reshape(
        batch, SEQ)
    rows = batch * SEQ
    labels = torch.tensor(draws(seed, "labels", rows, VOCAB))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(len(ran)):
        opt.zero_grad()
        loss = F.cross_entropy(model(ids).reshape(rows, VOCAB), labels)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    if not ran:
        sys.exit("DIFFERENT: soap-run ran no steps")
    for k, (a, b) in enumerate(zip(losses, ran)):
        if abs(a - b) > 1e-5 * abs(a):
            sys.exit("DIFFERENT: step %d loss %.9g (torch) %.9g (soap-run)"
                     % (k + 1, a, b))
    with open(os.path.join(run_dir, "weights.json")) as f:
        dumped = json.load(f)["weights"]
    params = dict(model.named_parameters())
    if sorted(w["name"] for w in dumped) != sorted(found):
        sys.exit("DIFFERENT: soap-run dumped %d weights, the export has %d"
                 % (len(dumped), len(found)))
    elements = 0
    for w in dumped:
        got = read_f32(os.path.join(run_dir, w["file"]))
        torch_name, transposed = found[w["name"]]
        want = params[torch_name].detach()
        want = (want.t() if transposed else want).flatten().tolist()
        if len(want) != len(got):
            sys.exit("DIFFERENT: %s has %d elements, soap-run dumped %d"
                     % (w["name"], len(want), len(got)))
        for i, (a, b) in enumerate(zip(want, got)):
            if abs(a - b) > max(1e-5 * abs(a), 1e-6):
                sys.exit("DIFFERENT: %s (%s)[%d] %.9g (torch) %.9g "
                         "(soap-run)" % (w["name"], torch_name, i, a, b))
        elements += len(want)
    print("SAME AS PYTORCH: %s, %d losses, %d weights, %d elements"
          % (name, len(ran), len(dumped), elements))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="write OUT_DIR/NAME.onnx")
    e.add_argument("out_dir")
    e.add_argument("--only", default=",".join(MODELS))
    c = sub.add_parser("compare", help="train in PyTorch, compare with "
                       "soap-run's losses and weights")
    c.add_argument("name", choices=MODELS)
    c.add_argument("model")
    c.add_argument("seed", type=int)
    c.add_argument("forward_dir")
    c.add_argument("run_out")
    c.add_argument("run_dir")
    c.add_argument("--batch", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.cmd == "export":
        os.makedirs(args.out_dir, exist_ok=True)
        for name in args.only.split(","):
            config(name)  # an unknown name stops before any export
        for name in args.only.split(","):
            export(name, args.out_dir)
    else:
        compare(args.name, args.model, args.seed, args.forward_dir, args.run_out, args.run_dir, args.batch)


if __name__ == "__main__":
    main()
