"""onnxruntime as an independent reference for soapc's importer and
soap-run's forward: a model's outputs from soap-run (one rank, step 1, its
--dump-forward directory) against onnxruntime's on the same file, inputs
and weights. Runs with the project virtual environment (onnx,
onnxruntime, numpy).

    ort_reference.py prepare MODEL.onnx OUT.onnx
    ort_reference.py compare MODEL.onnx FORWARD_DIR
    ort_reference.py run --soapc SOAPC --soap-run SOAP_RUN --topology ONE.json
                     --out DIR [--batch 2] [--seed 3] [--kernels eager,fused]
                     [--max-params N] [--json FILE] MODEL.onnx...

`prepare` writes the copy both runtimes run: every training-mode Dropout
set to eval mode (its training_mode input false: the identity), since the
two draw different masks. Nothing else changes.

`compare` runs onnxruntime (CPU) on MODEL with soap-run's dumped inputs and
weights in place of the file's initializers, and compares every dumped
output. The one rewrite: each BatchNormalization becomes the same
arithmetic on batch statistics in ONNX primitives (mean and biased
variance over every axis but the channel), because soap-run trains every
BatchNormalization with batch statistics (docs/soap-run.md) and
onnxruntime's CPU kernel computes no training mode. Match: every element
within 1e-4 of the output's largest magnitude — float32 rounding that
differs in summation order, never a wrong index map or kernel, which moves
outputs by their own size. onnxruntime's outputs are written beside
soap-run's (FORWARD_DIR/onnxruntime/, the same file names). Prints one
line; exits 1 on a difference.

`run` does both for each model: a model whose initializers are external
data that is not there (the shape-only GPT-3 and Llama 3 files) or with
more than --max-params parameters is skipped with the reason; else the
prepared copy is planned with `soapc --search data` on the one-device
topology under each --kernels mode, run by soap-run for one step with
--dump-forward, and compared. One line per model and mode; exits 1 if any
differs or fails."""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

TOLERANCE = 1e-4
NP_TYPES = {"f32": np.float32, "f16": np.float16, "f64": np.float64,
            "bf16": np.float32, "i64": np.int64, "i32": np.int32,
            "bool": np.bool_, "i8": np.int8, "u8": np.uint8}


def opset_of(model):
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return 0


def prepare(src, dst):
    model = onnx.load(src, load_external_data=False)
    g = model.graph
    eval_mode = "soapc.ort.eval_mode"
    count = 0
    for n in g.node:
        if n.op_type != "Dropout" or n.domain not in ("", "ai.onnx"):
            continue
        while len(n.input) < 3:
            n.input.append("")
        n.input[2] = eval_mode
        count += 1
    if count:
        g.initializer.append(numpy_helper.from_array(
            np.array(False), eval_mode))
    onnx.save(model, dst)
    return count


def load_f32(path, shape, dtype=np.float32):
    a = np.fromfile(path, dtype="<f4")
    return a.reshape(shape).astype(dtype)


def expand_batch_norms(model):
    """Every BatchNormalization as batch-statistics arithmetic."""
    g = model.graph
    inferred = onnx.shape_inference.infer_shapes(model)
    ranks = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            ranks[vi.name] = len(t.shape.dim)
    opset = opset_of(model)
    nodes = []
    consts = []
    for n in g.node:
        if n.op_type != "BatchNormalization":
            nodes.append(n)
            continue
        if any(o for o in n.output[1:]):
            used = {i for m in g.node for i in m.input}
            if any(o in used for o in n.output[1:] if o):
                raise SystemExit("DIFFERENT: %s: running statistics read by "
                                 "the graph" % n.name)
        x, scale, bias = n.input[0], n.input[1], n.input[2]
        rank = ranks.get(x)
        if rank is None:
            raise SystemExit("DIFFERENT: %s: the rank of %s is unknown"
                             % (n.name, x))
        eps = next((a.f for a in n.attribute if a.name == "epsilon"), 1e-5)
        p = "soapc.ort." + (n.name or n.output[0]) + "."
        axes = [0] + list(range(2, rank))

        def mean(src, dst):
            if opset >= 18:
                consts.append(numpy_helper.from_array(
                    np.array(axes, np.int64), p + "axes"))
                return helper.make_node("ReduceMean", [src, p + "axes"],
                                        [dst], keepdims=1)
            return helper.make_node("ReduceMean", [src], [dst], axes=axes,
                                    keepdims=1)
        consts.append(numpy_helper.from_array(
            np.array([-1] + [1] * (rank - 2), np.int64), p + "cshape"))
        consts.append(numpy_helper.from_array(np.array(eps, np.float32),
                                              p + "eps"))
        nodes += [
            mean(x, p + "mean"),
            helper.make_node("Sub", [x, p + "mean"], [p + "d"]),
            helper.make_node("Mul", [p + "d", p + "d"], [p + "d2"]),
            mean(p + "d2", p + "var"),
            helper.make_node("Add", [p + "var", p + "eps"], [p + "ve"]),
            helper.make_node("Sqrt", [p + "ve"], [p + "sd"]),
            helper.make_node("Div", [p + "d", p + "sd"], [p + "xhat"]),
            helper.make_node("Reshape", [scale, p + "cshape"], [p + "s"]),
            helper.make_node("Reshape", [bias, p + "cshape"], [p + "b"]),
            helper.make_node("Mul", [p + "xhat", p + "s"], [p + "ys"]),
            helper.make_node("Add", [p + "ys", p + "b"], [n.output[0]]),
        ]
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(consts)


def compare(model_path, fwd_dir):
    """(ok, message)."""
    with open(os.path.join(fwd_dir, "forward.json")) as f:
        fwd = json.load(f)
    model = onnx.load(model_path, load_external_data=False)
    g = model.graph
    weights = {w["name"]: w for w in fwd["weights"]}
    used = set()
    for init in g.initializer:
        w = weights.get(init.name)
        if w is None:
            continue
        size = int(np.prod(init.dims)) if init.dims else 1
        if int(np.prod(w["shape"])) != size:
            return False, ("weight %s: soap-run dumped %s, the file has %s"
                           % (init.name, w["shape"], list(init.dims)))
        a = load_f32(os.path.join(fwd_dir, w["file"]), list(init.dims))
        init.CopyFrom(numpy_helper.from_array(a, init.name))
        used.add(init.name)
    missing = sorted(set(weights) - used)
    if missing:
        return False, ("soap-run's weights %s are no initializer of the file"
                       % ", ".join(missing))
    # What is left without data is read by nothing once BatchNormalization
    # computes batch statistics (its running mean and variance).
    for init in g.initializer:
        if init.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16,
                              TensorProto.DOUBLE, TensorProto.BFLOAT16) \
                and not init.raw_data and not init.float_data \
                and not init.double_data and not init.int32_data \
                and init.data_location != TensorProto.EXTERNAL:
            size = int(np.prod(init.dims)) if init.dims else 1
            if size:
                init.CopyFrom(numpy_helper.from_array(
                    np.zeros(list(init.dims), np.float32), init.name))
    expand_batch_norms(model)
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3  # no warning per unused running statistic
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    drawn = {i["name"]: i for i in fwd["inputs"]}
    feeds = {}
    for i in sess.get_inputs():
        d = drawn.get(i.name)
        if d is None:
            return False, "graph input %s was not dumped" % i.name
        feeds[i.name] = load_f32(os.path.join(fwd_dir, d["file"]),
                                 d["shape"], NP_TYPES[d["dtype"]])
    names = [o.name for o in sess.get_outputs()]
    got = sess.run(names, feeds)
    if len(fwd["outputs"]) != 1 and len(fwd["outputs"]) != len(names):
        return False, ("soap-run dumped %d outputs, the graph has %d"
                       % (len(fwd["outputs"]), len(names)))
    worst, top = 0.0, 0.0
    shapes = []
    for out, ref in zip(fwd["outputs"], got):
        ref = np.asarray(ref, np.float64)
        if list(ref.shape) != out["shape"]:
            return False, ("output %s: soap-run [%s], onnxruntime [%s]"
                           % (out["name"], out["shape"], list(ref.shape)))
        mine = load_f32(os.path.join(fwd_dir, out["file"]), out["shape"],
                        np.float64)
        scale = float(np.abs(ref).max()) or 1.0
        os.makedirs(os.path.join(fwd_dir, "onnxruntime"), exist_ok=True)
        ref.astype("<f4").tofile(os.path.join(fwd_dir, "onnxruntime",
                                              out["file"]))
        if not np.isfinite(mine).all():
            return False, "output %s: soap-run's is not finite" % out["name"]
        err = float(np.abs(mine - ref).max()) / scale
        worst = max(worst, err)
        top = max(top, float(np.abs(ref).max()))
        shapes.append("%s [%s]" % (out["name"],
                                   ", ".join(map(str, ref.shape))))
        if err > TOLERANCE:
            at = np.unravel_index(int(np.abs(mine - ref).argmax()),
                                  ref.shape)
            return False, ("output %s%s: %.9g (soap-run) %.9g "
                           "(onnxruntime), %.2g of its scale %.4g"
                           % (out["name"], list(map(int, at)), mine[at],
                              ref[at], err, scale))
    return True, "%s, largest %.3g, max difference %.1e of scale" % (
        ", ".join(shapes), top, worst)


def skip_reason(path, max_params):
    model = onnx.load(path, load_external_data=False)
    params = 0
    for init in model.graph.initializer:
        if init.data_location == TensorProto.EXTERNAL:
            loc = next((e.value for e in init.external_data
                        if e.key == "location"), "")
            where = os.path.join(os.path.dirname(path), loc)
            if not os.path.exists(where):
                return ("shape-only: initializer '%s' stores its data in "
                        "'%s', which does not exist" % (init.name, loc))
        if init.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16,
                              TensorProto.BFLOAT16, TensorProto.DOUBLE):
            params += int(np.prod(init.dims)) if init.dims else 1
    if max_params and params > max_params:
        return ("%s floating initializer elements, past --max-params %s"
                % (format(params, ","), format(max_params, ",")))
    return None


def run(args):
    os.makedirs(args.out, exist_ok=True)
    rows, bad = [], 0
    for path in args.models:
        name = os.path.splitext(os.path.basename(path))[0]
        reason = skip_reason(path, args.max_params)
        if reason:
            print("%s: SKIPPED: %s" % (name, reason))
            rows.append({"model": name, "skipped": reason})
            continue
        prepared = os.path.join(args.out, name + ".onnx")
        prepare(path, prepared)
        for mode in args.kernels.split(","):
            row = {"model": name, "kernels": mode}
            rows.append(row)
            plan = os.path.join(args.out, "%s-%s.json" % (name, mode))
            fwd = os.path.join(args.out, "%s-%s" % (name, mode))
            t0 = time.time()
            steps = [[args.soapc, prepared, "--topology", args.topology,
                      "--search", "data", "--batch", str(args.batch),
                      "--kernels", mode, "-o", plan],
                     [args.soap_run, prepared, plan, "--steps", "1",
                      "--seed", str(args.seed), "--dump-forward", fwd]]
            failed = None
            for cmd in steps:
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode:
                    failed = "%s exit %d: %s" % (
                        os.path.basename(cmd[0]), p.returncode,
                        (p.stderr.strip().splitlines() or [""])[-1])
                    break
            row["soap_run_seconds"] = round(time.time() - t0, 2)
            if failed:
                ok, msg = False, failed
            else:
                ok, msg = compare(prepared, fwd)
            row["same"] = ok
            row["detail"] = msg
            bad += not ok
            print("%s (%s): %s: %s" % (name, mode, "SAME AS ONNXRUNTIME"
                                       if ok else "DIFFERENT", msg))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"batch": args.batch, "seed": args.seed,
                       "tolerance": TOLERANCE, "rows": rows}, f, indent=1)
            f.write("\n")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("model")
    p.add_argument("out")
    c = sub.add_parser("compare")
    c.add_argument("model")
    c.add_argument("forward_dir")
    r = sub.add_parser("run")
    r.add_argument("models", nargs="+")
    r.add_argument("--soapc", required=True)
    r.add_argument("--soap-run", dest="soap_run", required=True)
    r.add_argument("--topology", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--batch", type=int, default=2)
    r.add_argument("--seed", type=int, default=3)
    r.add_argument("--kernels", default="eager,fused")
    r.add_argument("--max-params", type=int, default=0)
    r.add_argument("--json")
    args = ap.parse_args()
    if args.cmd == "prepare":
        print("%d Dropout set to eval mode" % prepare(args.model, args.out))
        return 0
    if args.cmd == "compare":
        ok, msg = compare(args.model, args.forward_dir)
        print("%s: %s" % ("SAME AS ONNXRUNTIME" if ok else "DIFFERENT", msg))
        return 0 if ok else 1
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
