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

  onnxruntime  (--ort) soap-run's forward (one rank, eager kernels,
             batch 2, step 1's --dump-forward) against onnxruntime's on the
             same file, inputs and weights (test/cli/exec/Inputs/
             ort_reference.py)

Exports are cached in --cache (default /tmp/soap-import-coverage), so a rerun
only imports. Prints a table and writes JSON (default
bench/results/import-coverage.json). Asserts nothing.

--transformers measures the transformers section instead: the models of
examples/models/hf_export.py (a small Llama and Mixtral built from a config
and exported by torch.onnx), each: imports, soapc's parameters against
PyTorch's, every op with the batch's sample loop (eager and fused), the
fused op kinds, soap-run trains it as PyTorch does (3 SGD steps on one rank
under eager and fused kernels, hf_export.py compare), and onnxruntime's
forward (ort_reference.py). Table to stdout, JSON to --out (default
bench/results/import-coverage-transformers.json).

--zoo-ort runs ort_reference.py on every model of examples/models under
eager and fused kernels (JSON: --out, default
bench/results/onnxruntime-zoo.json).

Run with Debian's Python (torch 1.13, torchvision 0.14, onnx 1.12); the
transformers section, --ort and --zoo-ort run their parts with the project
virtual environment (--venv-python, default .venv/bin/python: torch 2.7,
transformers, onnxruntime).
"""

import argparse
import io
import json
import math
import os
import re
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


def dump(build, path, batch, timeout, kernels="eager", limit=160):
    code, out, err = run([os.path.join(build, "bin", "soapc"), "dump", path,
                          "--batch", str(batch), "--format", "json",
                          "--kernels", kernels], timeout)
    if code != 0:
        return None, short(err, limit)
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
    if a.ort and row["soap_run_accepts"]:
        ort = ort_rows(a, [path], "eager", os.path.join(a.cache, "ort"))[0]
        row["onnxruntime_same"] = ort.get("same", False)
        row["onnxruntime_detail"] = ort.get("detail", ort.get("skipped"))
    return row


ORT = os.path.join(ROOT, "test", "cli", "exec", "Inputs", "ort_reference.py")
ONE = os.path.join(ROOT, "test", "cli", "exec", "Inputs", "one.json")


def ort_rows(a, paths, kernels, out):
    """ort_reference.py run on `paths`: its JSON rows."""
    os.makedirs(out, exist_ok=True)
    result = os.path.join(out, "ort.json")
    _, _, err = run([a.venv_python, ORT, "run", "--soapc",
                     os.path.join(a.build, "bin", "soapc"), "--soap-run",
                     os.path.join(a.build, "bin", "soap-run"),
                     "--topology", ONE, "--out", out, "--kernels", kernels,
                     "--max-params", str(a.ort_max_params),
                     "--json", result] + paths, a.timeout * len(paths))
    if not os.path.exists(result):
        return [{"same": False, "detail": short(err)}]
    with open(result) as f:
        rows = json.load(f)["rows"]
    os.unlink(result)
    return rows


def cell(row):
    if "export_error" in row:
        return ["export failed", "", "", "", "", ""]
    if not row.get("imports"):
        return ["no", "", "", "", "", ""]
    ref, got = row["reference_params"], row["soapc_params"]
    params = "%s%s" % ("{:,}".format(got),
                       "" if got == ref else " (ref {:,})".format(ref))
    share = ("%d/%d" % (row["batch_ops_with_s"], row["batch_ops"])
             if "batch_ops" in row else "?")
    ort = ("" if "onnxruntime_same" not in row else
           "same" if row["onnxruntime_same"] else "differs")
    return ["yes", params, share, "yes" if row["data_fits"] else
            "no (%s)" % row["data_exit"],
            "yes" if row["soap_run_accepts"] else "no", ort]


COLS = ["model", "opset", "mode", "imports", "params (soapc)", "S share",
        "data fits", "soap-run", "onnxruntime"]
WIDTHS = [22, 5, 5, 7, 36, 9, 10, 8, 11]


def header():
    return "  ".join(c.ljust(w) for c, w in zip(COLS, WIDTHS))


def row_lines(row):
    cells = [row["model"], str(row["opset"]), row["mode"]] + cell(row)
    lines = ["  ".join(c.ljust(w) for c, w in zip(cells, WIDTHS))]
    for key in ("export_error", "import_error", "data_error",
                "soap_run_error"):
        if key in row:
            lines.append("      %s: %s" % (key, row[key]))
    if row.get("onnxruntime_same") is False:
        lines.append("      onnxruntime: %s" % row["onnxruntime_detail"])
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
        "onnxruntime_same": share(
            lambda r: r.get("onnxruntime_same"),
            [r for r in imported if "onnxruntime_same" in r]),
    }


def summary_line(summary):
    return ("exported %d of %d (the rest: PyTorch's exporter fails); imports "
            "%s; exact parameters %s; every batch op with S %s (ops: %s); "
            "data parallel fits %s; soap-run accepts %s" % (
                summary["exported"], summary["exports"], summary["imports"],
                summary["exact_params"], summary["all_batch_ops_with_s"],
                summary["batch_ops_with_s"], summary["data_fits"],
                summary["soap_run_accepts"])) + (
        "; onnxruntime's forward the same %s" % summary["onnxruntime_same"]
        if summary.get("onnxruntime_same", "0/0") != "0/0" else "")


# --------------------------------------------------------------------------
# The transformers section and the zoo's onnxruntime reference
# --------------------------------------------------------------------------

HF = os.path.join(ROOT, "examples", "models", "hf_export.py")
FUSED_KINDS = ("RMSNormalization", "RotaryEmbedding", "FlashAttention",
               "FusedElementwise", "FusedSoftmax")


def keeps_sample_loop(d):
    """Whether every op of a dump has a splittable S loop of its batch."""
    return all(any(l["class"] == "S" and l["splittable"] and
                   l["size"] == d["batch"] for l in o["loops"])
               for o in d["ops"])


def trains_as_pytorch(a, name, path, kernels, work):
    """soap-run on one rank (3 SGD steps, seed 3, batch 2) against
    hf_export.py compare: (same, its line)."""
    plan = os.path.join(work, "%s-%s-plan.json" % (name, kernels))
    fwd = os.path.join(work, "%s-%s-forward" % (name, kernels))
    wts = os.path.join(work, "%s-%s-weights" % (name, kernels))
    log = os.path.join(work, "%s-%s.out" % (name, kernels))
    code, _, err = run([os.path.join(a.build, "bin", "soapc"), path,
                        "--topology", ONE, "--search", "data", "--batch", "2",
                        "--kernels", kernels, "-o", plan], a.timeout)
    if code != 0:
        return False, short(err)
    code, out, err = run([os.path.join(a.build, "bin", "soap-run"), path, plan,
                          "--steps", "3", "--seed", "3", "--dump-forward", fwd,
                          "--dump-weights", wts], a.timeout)
    if code != 0:
        return False, short(err)
    with open(log, "w") as f:
        f.write(out)
    code, out, err = run([a.venv_python, HF, "compare", name, path, "3", fwd,
                          log, wts], a.timeout)
    line = (out.strip() or err.strip()).splitlines()[-1:] or [""]
    return code == 0, line[0]


def transformers_section(a):
    work = os.path.join(a.cache, "transformers")
    os.makedirs(work, exist_ok=True)
    code, out, err = run([a.venv_python, HF, "export", work],
                         a.export_timeout)
    if code != 0:
        sys.exit("hf_export.py export: %s" % short(err))
    rows = []
    for line in out.splitlines():
        m = re.match(r"(\S+): ([\d,]+) parameters in PyTorch; ops (.*)", line)
        if not m:
            continue
        name = m.group(1)
        path = os.path.join(work, name + ".onnx")
        row = {"model": name,
               "pytorch_params": int(m.group(2).replace(",", "")),
               "export_ops": m.group(3)}
        rows.append(row)
        d, err = dump(a.build, path, 4, a.timeout, limit=1000)
        row["imports"] = d is not None
        if d is None:
            row["import_error"] = err
            continue
        row["soapc_params"] = d["parameters"]
        row["eager_ops"] = len(d["ops"])
        row["sample_loop_eager"] = keeps_sample_loop(d)
        f, err = dump(a.build, path, 4, a.timeout, "fused")
        row["fused_ops"] = len(f["ops"])
        row["sample_loop_fused"] = keeps_sample_loop(f)
        row["fused_kinds"] = {k: sum(1 for o in f["ops"] if o["kind"] == k)
                              for k in FUSED_KINDS}
        for kernels in ("eager", "fused"):
            same, detail = trains_as_pytorch(a, name, path, kernels, work)
            row["trains_as_pytorch_" + kernels] = same
            row["trains_detail_" + kernels] = detail
        ort = ort_rows(a, [path], "eager,fused", os.path.join(work, "ort"))
        row["onnxruntime_same"] = all(r.get("same") for r in ort)
        row["onnxruntime_detail"] = [r.get("detail") for r in ort]
    cols = ["model", "PyTorch params", "imports", "soapc params", "ops e/f",
            "S loop e/f", "trains e/f", "onnxruntime"]
    widths = [11, 14, 7, 12, 7, 10, 10, 11]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    yn = {True: "yes", False: "no"}
    for r in rows:
        if r["imports"]:
            cells = [r["model"], "{:,}".format(r["pytorch_params"]), "yes",
                     "{:,}".format(r["soapc_params"]),
                     "%d/%d" % (r["eager_ops"], r["fused_ops"]),
                     "%s/%s" % (yn[r["sample_loop_eager"]],
                                yn[r["sample_loop_fused"]]),
                     "%s/%s" % (yn[r["trains_as_pytorch_eager"]],
                                yn[r["trains_as_pytorch_fused"]]),
                     "same" if r["onnxruntime_same"] else "differs"]
        else:
            cells = [r["model"], "{:,}".format(r["pytorch_params"]), "no",
                     "", "", "", "", ""]
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths)))
        if not r["imports"]:
            print("      import_error: %s" % r["import_error"])
        else:
            print("      fused: %s" % ", ".join(
                "%s %d" % kv for kv in r["fused_kinds"].items() if kv[1]))
            for k in ("eager", "fused"):
                print("      %s: %s" % (k, r["trains_detail_" + k]))
    write_json(a.out, {"rows": rows})


ENVELOPE = 4  # as compare.py: how much further than float32 a run may be


def float64_verdict(fwd_dir, name, seed, batch):
    """Where soap-run's logits and onnxruntime's differ past the tolerance:
    their distances from PyTorch's float64 forward of the same model (the
    weights and inputs soap-run draws, torch_reference.py's; every Dropout
    the identity, as the compared copy has it), and PyTorch's float32
    forward's, each relative to the largest float64 logit. soap-run is
    within float32 when it is no further than ENVELOPE times the furthest
    float32 runtime. None for a model torch_reference.py cannot build."""
    sys.path.insert(0, os.path.join(ROOT, "test", "cli", "exec", "Inputs"))
    import numpy as np
    import torch
    import torch_reference as tr
    if name not in tr.export.MODELS or \
            tr.export.MODELS[name][1][0][2] != "float32":
        return None
    logits = {}
    for dtype, key in ((torch.float64, "f64"), (torch.float32, "f32")):
        model, x = tr.setup(name, seed, batch, dtype)[:2]
        for m in model.modules():
            if isinstance(m, tr.SoapDropout):
                m.p = 0
        with torch.no_grad():
            logits[key] = model(x).double().numpy()
    with open(os.path.join(fwd_dir, "forward.json")) as f:
        out = json.load(f)["outputs"][0]
    mine = np.fromfile(os.path.join(fwd_dir, out["file"]), "<f4")
    ref = np.fromfile(os.path.join(fwd_dir, "onnxruntime", out["file"]),
                      "<f4")
    exact = logits["f64"].reshape(-1)
    scale = float(np.abs(exact).max())
    dist = {k: float(np.abs(v.astype(np.float64) - exact).max()) / scale
            for k, v in (("soap_run", mine), ("onnxruntime", ref),
                         ("torch_f32", logits["f32"].reshape(-1)))}
    dist["within_float32"] = dist["soap_run"] <= ENVELOPE * max(
        dist["onnxruntime"], dist["torch_f32"])
    return dist


def zoo_ort(a):
    zoo = os.path.join(ROOT, "examples", "models")
    paths = sorted(os.path.join(zoo, f) for f in os.listdir(zoo)
                   if f.endswith(".onnx"))
    if a.models:
        keep = set(a.models.split(","))
        paths = [p for p in paths if os.path.basename(p)[:-5] in keep]
    work = os.path.join(a.cache, "zoo-ort")
    rows = ort_rows(a, paths, "eager,fused", work)
    for r in rows:
        if "skipped" in r:
            print("%-18s skipped: %s" % (r["model"], r["skipped"]))
            continue
        if not r["same"]:
            fwd = os.path.join(work, "%s-%s" % (r["model"], r["kernels"]))
            if os.path.exists(os.path.join(fwd, "onnxruntime")):
                r["float64"] = float64_verdict(fwd, r["model"], 3, 2)
        f64 = r.get("float64")
        print("%-18s %-6s %-8s %6.1f s  %s" % (
            r["model"], r["kernels"], "same" if r["same"] else
            "within float32" if f64 and f64["within_float32"] else "DIFFERS",
            r["soap_run_seconds"], r["detail"]))
        if f64:
            print("%-18s from float64: soap-run %.1e, onnxruntime %.1e, "
                  "PyTorch float32 %.1e" % ("", f64["soap_run"],
                                            f64["onnxruntime"],
                                            f64["torch_f32"]))
    write_json(a.out, {"max_params": a.ort_max_params, "batch": 2,
                       "seed": 3, "envelope": ENVELOPE, "rows": rows})


def write_json(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(value, f, indent=1)
        f.write("\n")
    print("wrote %s" % path)


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
    ap.add_argument("--out", default=None,
                    help="JSON results (default bench/results/"
                    "import-coverage.json, import-coverage-transformers.json "
                    "with --transformers, onnxruntime-zoo.json with "
                    "--zoo-ort)")
    ap.add_argument("--transformers", action="store_true",
                    help="measure the transformers section (hf_export.py)")
    ap.add_argument("--zoo-ort", action="store_true",
                    help="onnxruntime's forward against soap-run's for every "
                    "model of examples/models")
    ap.add_argument("--ort", action="store_true",
                    help="add the onnxruntime column to the torchvision rows")
    ap.add_argument("--ort-max-params", type=int, default=500_000_000,
                    help="models with more floating initializer elements are "
                    "skipped by the onnxruntime check")
    ap.add_argument("--venv-python", default=os.path.join(
        ROOT, ".venv", "bin", "python"))
    ap.add_argument("--export-only", action="store_true",
                    help="fill the cache with exports; measure nothing")
    ap.add_argument("--no-export", action="store_true",
                    help="measure only what the cache holds")
    ap.add_argument("--merge", default="",
                    help="JSON files of partial runs (comma-separated): "
                    "replace their rows in --out, print the whole table; "
                    "measure nothing")
    a = ap.parse_args()
    results = os.path.join(HERE, "results")
    default_out = os.path.join(results, "import-coverage.json")
    if a.out is None:
        a.out = os.path.join(results, "import-coverage-transformers.json"
                             if a.transformers else "onnxruntime-zoo.json"
                             if a.zoo_ort else "import-coverage.json")
    if a.transformers:
        os.makedirs(a.cache, exist_ok=True)
        transformers_section(a)
        return
    if a.zoo_ort:
        os.makedirs(a.cache, exist_ok=True)
        zoo_ort(a)
        return
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
    if not a.models or a.out != default_out:
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=1)
            f.write("\n")
        print("wrote %s" % a.out)


if __name__ == "__main__":
    main()
