#!/usr/bin/python3
"""bench/import-coverage.py [--models a,b] [--opsets 13,17] [--modes eval,train]
                            [--cache DIR] [--build DIR] [--out FILE]
                            [--merge PARTIAL.json,...]

Every classification model of torchvision.models
(list_models(), 80 in torchvision 0.14) plus nn.TransformerEncoder and a GPT
block, each exported by torch.onnx.export at opset 13 and 17, in eval mode
(TrainingMode.EVAL: BatchNorm folded, Dropout gone) and in training mode
(TrainingMode.TRAINING: BatchNorm and Dropout kept), constant folding on
(off for training exports of models with a relative_position_bias_table:
Swin and MaxViT, see export_one), a symbolic batch axis, weights stripped (floating initializers past 16
elements keep dims only, as the zoo's). Then for each export:

  imports    soapc dump imports it (else the error, shortened)
  params     soapc's parameter count against the reference: PyTorch's
             sum(p.numel()) in training mode, the ONNX file's trainable
             initializers (floating, > 1 element, not BatchNorm statistics)
             in eval mode
  S share    of the ops that carry the batch (an output or input dim changes
             between imports at batch 32 and 33), the share with a
             splittable S loop
  data fits  soapc --search data on dgx-h100-1 (8 H100) at 32 per GPU
             gives a plan that fits (exit 0; 3: does not fit)
  soap-run   soap-run's op support check accepts it (bench-exec-check; the
             model is not trained)

Exports are cached in --cache (default /tmp/soap-import-coverage), so a rerun
only imports. Prints a table and writes JSON (default
bench/results/import-coverage.json). Asserts nothing.

Run with Debian's Python (torch 1.13, torchvision 0.14, onnx 1.12).
"""

import argparse
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STRIP_MIN_ELEMS = 16
EXTRA = ["transformer_encoder", "gpt_block"]


# --------------------------------------------------------------------------
# Export (run in a child process: one model at a time, memory returned)
# --------------------------------------------------------------------------

def build_model(name):
    import torch
    import torch.nn as nn
    import torchvision
    if name == "transformer_encoder":
        layer = nn.TransformerEncoderLayer(d_model=512, nhead=8,
                                           dim_feedforward=2048,
                                           batch_first=True)
        return nn.TransformerEncoder(layer, num_layers=6), [2, 128, 512]
    if name == "gpt_block":
        sys.path.insert(0, os.path.join(ROOT, "examples", "models"))
        import export

        class GPTBlock(nn.Module):
            """export.py's GPT-2 block (768 wide, 12 heads) on a
            64-token context with its causal mask."""

            def __init__(self):
                super().__init__()
                self.block = export.GPT2Block(768, 12, 64, 0.1)

            def forward(self, x):
                t = x.shape[1]
                mask = torch.ones(t, t, dtype=torch.bool).tril()
                return self.block(x, mask)
        return GPTBlock(), [2, 64, 768]
    kw = {}
    if name == "inception_v3":
        kw = {"aux_logits": False, "init_weights": False}
    elif name == "googlenet":
        kw = {"aux_logits": False, "init_weights": False}
    model = torchvision.models.get_model(name, weights=None, **kw)
    side = 299 if name == "inception_v3" else 224
    return model, [2, 3, side, side]


def numel(t):
    return math.prod(t.dims)


def export_one(name, opset, mode, path):
    """Exports one model to `path` (weights stripped) and writes
    `path`.json with the reference counts."""
    import onnx
    import torch
    from onnx import TensorProto
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, shape = build_model(name)
    training = mode == "train"
    model.train(training)
    # torch 1.13 cannot export stochastic depth's Bernoulli in training
    # mode (ConvNeXt, EfficientNet, Swin, MaxViT): drop it (p = 0 makes it
    # the identity; eval mode never draws it), and say so.
    dropped = 0
    if training:
        from torchvision.ops import StochasticDepth
        for m in model.modules():
            if isinstance(m, StochasticDepth) and m.p > 0:
                m.p = 0.0
                dropped += 1
    # torch 1.13's constant folding in training mode replaces a parameter
    # gathered by a constant index (Swin's and MaxViT's
    # relative_position_bias_table[relative_position_index]) by a new
    # initializer of the gathered size ([2401, heads] for [169, heads]):
    # the file no longer holds the parameter. Those models are exported
    # without folding in training mode (soapc folds the shape arithmetic).
    fold = not (training and any(
        k.endswith("relative_position_bias_table")
        for k, _ in model.named_parameters()))
    x = torch.randn(*shape)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(path))
    onnx_path = os.path.join(tmp, "m.onnx")
    t0 = time.time()
    # A path, not a buffer: past 2 GB the exporter writes external data.
    torch.onnx.export(
        model, (x,), onnx_path, opset_version=opset,
        training=torch.onnx.TrainingMode.TRAINING if training
        else torch.onnx.TrainingMode.EVAL,
        do_constant_folding=fold, input_names=["input"],
        output_names=["output"],
        dynamic_axes={"input": {0: "N"}, "output": {0: "N"}})
    seconds = time.time() - t0
    proto = onnx.load(onnx_path, load_external_data=False)
    floats = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16,
              TensorProto.BFLOAT16}
    bn_stats = set()
    for n in proto.graph.node:
        if n.op_type == "BatchNormalization":
            bn_stats.update(n.input[3:5])
    onnx_params = sum(numel(t) for t in proto.graph.initializer
                      if t.data_type in floats and t.name not in bn_stats
                      and numel(t) > 1)
    for t in proto.graph.initializer:
        if t.data_type in floats and numel(t) > STRIP_MIN_ELEMS:
            for field in ("raw_data", "float_data", "double_data",
                          "int32_data", "external_data", "data_location"):
                t.ClearField(field)
    for f in os.listdir(tmp):
        os.unlink(os.path.join(tmp, f))
    os.rmdir(tmp)
    onnx.save(proto, path)
    info = {"pytorch_params": sum(p.numel() for p in model.parameters()),
            "onnx_params": onnx_params, "export_s": round(seconds, 1),
            "nodes": len(proto.graph.node),
            "stochastic_depth_dropped": dropped,
            "constant_folding": fold}
    with open(path + ".json", "w") as f:
        json.dump(info, f)


# --------------------------------------------------------------------------
# Measure
# --------------------------------------------------------------------------

def run(cmd, timeout):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        return None, "", "timed out after %d s" % timeout


def short(msg, limit=160):
    lines = msg.strip().splitlines()
    # a Python traceback: its exception line; else the last line
    errors = [l for l in lines if not l.startswith(" ") and "Error: " in l]
    msg = (errors or lines or [""])[-1]
    # drop the path prefix; keep what and where
    if ".onnx: " in msg:
        msg = msg.split(".onnx: ", 1)[1]
    return msg if len(msg) <= limit else msg[:limit - 3] + "..."


def dump(build, path, batch, timeout):
    code, out, err = run([os.path.join(build, "bin", "soapc"), "dump", path,
                          "--batch", str(batch), "--format", "json"],
                         timeout)
    if code != 0:
        return None, short(err)
    return json.loads(out), None


def batch_ops(d32, d33):
    """Names of the ops whose inputs or outputs change with the batch, and
    of those the ones with a splittable S loop."""
    other = {o["name"]: o for o in d33["ops"]}
    carrying, with_s = [], []
    for o in d32["ops"]:
        p = other.get(o["name"])
        if p is None:
            continue
        shapes = [v.get("shape") for v in o["inputs"] + o["outputs"] if v]
        shapes2 = [v.get("shape") for v in p["inputs"] + p["outputs"] if v]
        if shapes == shapes2:
            continue
        carrying.append(o["name"])
        if any(lp["class"] == "S" and lp["splittable"] for lp in o["loops"]):
            with_s.append(o["name"])
    return carrying, with_s


def export_cached(a, name, opset, mode):
    """The cached export's path, or None and the exporter's error (kept in
    the cache too, so that a rerun does not try again)."""
    path = os.path.join(a.cache, "%s-o%d-%s.onnx" % (name, opset, mode))
    failed = path + ".error"
    if os.path.exists(path + ".json"):
        return path, None
    if os.path.exists(failed):
        return None, open(failed).read()
    if a.no_export:
        return None, "not exported (--no-export)"
    code, _, err = run([sys.executable, os.path.abspath(__file__),
                        "--export-one", name, str(opset), mode, path],
                       a.export_timeout)
    if code != 0:
        with open(failed, "w") as f:
            f.write(short(err))
        return None, short(err)
    return path, None


def measure(a, name, opset, mode):
    row = {"model": name, "opset": opset, "mode": mode}
    path, err = export_cached(a, name, opset, mode)
    if path is None:
        row["export_error"] = err
        return row
    info = json.load(open(path + ".json"))
    row.update(info)
    ref = info["pytorch_params"] if mode == "train" else info["onnx_params"]
    row["reference_params"] = ref
    d32, err = dump(a.build, path, 32, a.timeout)
    row["imports"] = d32 is not None
    if d32 is None:
        row["import_error"] = err
        return row
    row["soapc_params"] = d32["parameters"]
    d33, err = dump(a.build, path, 33, a.timeout)
    if d33 is not None:
        carrying, with_s = batch_ops(d32, d33)
        row["batch_ops"] = len(carrying)
        row["batch_ops_with_s"] = len(with_s)
        row["without_s"] = sorted(set(carrying) - set(with_s))[:10]
    plan = os.path.join(a.cache, "plan.json")
    code, _, err = run([os.path.join(a.build, "bin", "soapc"), path,
                        "--topology", a.topology, "--search", "data",
                        "--batch", str(32 * 8), "-o", plan], a.timeout)
    row["data_exit"] = code
    row["data_fits"] = code == 0
    if code not in (0,):
        row["data_error"] = short(err)
    code, out, err = run([os.path.join(a.build, "bin", "bench-exec-check"),
                          path], a.timeout)
    verdict = out.strip().split("\t", 1)[-1] if out.strip() else short(err)
    row["soap_run_accepts"] = verdict == "ok"
    if verdict != "ok":
        row["soap_run_error"] = short(verdict)
    return row


def cell(row):
    if "export_error" in row:
        return ["export failed", "", "", "", ""]
    if not row.get("imports"):
        return ["no", "", "", "", ""]
    ref, got = row["reference_params"], row["soapc_params"]
    params = "%s%s" % ("{:,}".format(got),
                       "" if got == ref else " (ref {:,})".format(ref))
    share = ("%d/%d" % (row["batch_ops_with_s"], row["batch_ops"])
             if "batch_ops" in row else "?")
    return ["yes", params, share, "yes" if row["data_fits"] else
            "no (%s)" % row["data_exit"],
            "yes" if row["soap_run_accepts"] else "no"]


COLS = ["model", "opset", "mode", "imports", "params (soapc)", "S share",
        "data fits", "soap-run"]
WIDTHS = [22, 5, 5, 7, 36, 9, 10, 8]


def header():
    return "  ".join(c.ljust(w) for c, w in zip(COLS, WIDTHS))


def row_lines(row):
    cells = [row["model"], str(row["opset"]), row["mode"]] + cell(row)
    lines = ["  ".join(c.ljust(w) for c, w in zip(cells, WIDTHS))]
    for key in ("export_error", "import_error", "data_error",
                "soap_run_error"):
        if key in row:
            lines.append("      %s: %s" % (key, row[key]))
    return "\n".join(lines)


def summarise(rows):
    done = [r for r in rows if "export_error" not in r]
    imported = [r for r in done if r.get("imports")]

    def share(pred, pool):
        return "%d/%d" % (sum(1 for r in pool if pred(r)), len(pool))
    return {
        "exports": len(rows),
        "exported": len(done),
        "imports": share(lambda r: r.get("imports"), done),
        "exact_params": share(
            lambda r: r["soapc_params"] == r["reference_params"], imported),
        "all_batch_ops_with_s": share(
            lambda r: r.get("batch_ops") == r.get("batch_ops_with_s"),
            imported),
        "batch_ops_with_s": "%d/%d" % (
            sum(r.get("batch_ops_with_s", 0) for r in imported),
            sum(r.get("batch_ops", 0) for r in imported)),
        "data_fits": share(lambda r: r.get("data_fits"), imported),
        "soap_run_accepts": share(lambda r: r.get("soap_run_accepts"),
                                  imported),
    }


def summary_line(summary):
    return ("exported %d of %d (the rest: PyTorch's exporter fails); imports "
            "%s; exact parameters %s; every batch op with S %s (ops: %s); "
            "data parallel fits %s; soap-run accepts %s" % (
                summary["exported"], summary["exports"], summary["imports"],
                summary["exact_params"], summary["all_batch_ops_with_s"],
                summary["batch_ops_with_s"], summary["data_fits"],
                summary["soap_run_accepts"]))


def merge(out, partials):
    """Replaces the rows of `out` by those of the partial runs' JSON files
    (same model, opset and mode), rewrites `out` and prints the table."""
    key = (lambda r: (r["model"], r["opset"], r["mode"]))
    with open(out) as f:
        rows = json.load(f)["rows"]
    index = {key(r): i for i, r in enumerate(rows)}
    for path in partials.split(","):
        with open(path) as f:
            for r in json.load(f)["rows"]:
                if key(r) in index:
                    rows[index[key(r)]] = r
                else:
                    index[key(r)] = len(rows)
                    rows.append(r)
    print(header())
    for r in rows:
        print(row_lines(r))
    summary = summarise(rows)
    print("\n" + summary_line(summary))
    with open(out, "w") as f:
        json.dump({"summary": summary, "rows": rows}, f, indent=1)
        f.write("\n")
    print("wrote %s" % out)


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "--export-one":
        export_one(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    ap.add_argument("--models", default="")
    ap.add_argument("--skip", default="",
                    help="models to leave out (comma-separated)")
    ap.add_argument("--opsets", default="13,17")
    ap.add_argument("--modes", default="eval,train")
    ap.add_argument("--cache", default="/tmp/soap-import-coverage")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--topology", default=os.path.join(
        ROOT, "examples", "topologies", "dgx-h100-1.json"))
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--export-timeout", type=int, default=1800)
    ap.add_argument("--out", default=os.path.join(
        HERE, "results", "import-coverage.json"))
    ap.add_argument("--export-only", action="store_true",
                    help="fill the cache with exports; measure nothing")
    ap.add_argument("--no-export", action="store_true",
                    help="measure only what the cache holds")
    ap.add_argument("--merge", default="",
                    help="JSON files of partial runs (comma-separated): "
                    "replace their rows in --out, print the whole table; "
                    "measure nothing")
    a = ap.parse_args()
    if a.merge:
        merge(a.out, a.merge)
        return
    os.makedirs(a.cache, exist_ok=True)
    if a.models:
        names = a.models.split(",")
    else:
        import torchvision
        names = sorted(torchvision.models.list_models(
            module=torchvision.models)) + EXTRA
    skip = set(filter(None, a.skip.split(",")))
    names = [n for n in names if n not in skip]
    if a.export_only:
        for name in names:
            for opset in map(int, a.opsets.split(",")):
                for mode in a.modes.split(","):
                    t0 = time.time()
                    path, err = export_cached(a, name, opset, mode)
                    print("%-22s %2d %-5s %6.1fs %s" % (
                        name, opset, mode, time.time() - t0,
                        "ok" if path else err), flush=True)
        return
    rows = []
    print(header(), flush=True)
    for name in names:
        for opset in map(int, a.opsets.split(",")):
            for mode in a.modes.split(","):
                row = measure(a, name, opset, mode)
                rows.append(row)
                print(row_lines(row), flush=True)
    summary = summarise(rows)
    print("\n" + summary_line(summary))
    if not a.models or a.out != ap.get_default("out"):
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=1)
            f.write("\n")
        print("wrote %s" % a.out)


if __name__ == "__main__":
    main()
