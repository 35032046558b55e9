#!/usr/bin/python3
"""A whole training iteration on one GPU, as soapc's simulator predicts it and
as PyTorch runs it.

    bench/fidelity-iter.py plans   [--dir D] [--gpu h100|h200] [--models M:B,..]
    bench/fidelity-iter.py measure [--dir D] [--repeats N] [--warmup N] [--only S,..]
    bench/fidelity-iter.py table   [--dir D] [--gpu G] [--profile P] [--out F]

plans (CPU, Debian's /usr/bin/python3 or any): for each model at its batch,
  the one-GPU data plan (soapc --search data) in fp32 with m = 1, 2, 4
  micro-batches (gradient accumulation: pipeline.micro_batches of the plan) and
  in bf16 with m = 1, 4, written as D/iter-<model>-<precision>-m<m>.plan.json.
  bench/fidelity.sh's profile stage measures their tiles with the others.
measure (on the GPU, a python3 with CUDA PyTorch): each plan's iteration run by
  PyTorch: the model from examples/models/export.py in training mode (the
  graph soapc imported), the loss soapc appends (softmax cross-entropy over the
  class axis), m micro-batches whose gradients accumulate, one SGD step; bf16 as
  soapc plans it (bf16 weights, activations and gradients, an fp32 master copy
  of every weight that takes the step). cuDNN picks its algorithms by
  heuristics and neither cuDNN nor cuBLAS uses TF32, as soap-profile measures.
  Each iteration is timed with CUDA events, eagerly (Python enqueues every
  kernel) and replayed as one captured CUDA graph (the GPU's own time, the
  host's launch overhead gone: what a device-resident executor achieves);
  the median of --repeats iterations after --warmup. Also the peak of
  PyTorch's allocator over the eager iterations. Results go to
  D/iter-measured.json, rewritten after every plan.
table (CPU): soapc simulate of each plan under the profile (and the roofline)
  against both measurements; per model, whether the plans are ordered alike
  (pairs predicted more than 5% apart). Prints the table and writes --out
  (default bench/results/fidelity-iter.json).

Nothing here asserts a time: it prints tables and writes JSON.
"""

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Inception-v3 is left out by default: its 500 tile signatures over the five
# variants would double the profile's device time.
DEFAULT_MODELS = ("lenet:64,mlp:64,alexnet:64,vgg16:64,resnet101:64,"
                  "rnntc:64,rnnlm:64,nmt:64,gpt2:8")
VARIANTS = [("fp32", 1), ("fp32", 2), ("fp32", 4), ("bf16", 1), ("bf16", 4)]


def plan_name(model, prec, m):
    return f"iter-{model}-{prec}-m{m}.plan.json"


def plans(args):
    os.makedirs(args.dir, exist_ok=True)
    topo = os.path.join(ROOT, f"bench/fidelity-{args.gpu}x1.json")
    for spec in args.models.split(","):
        model, batch = spec.split(":")
        for prec in sorted({p for p, _ in VARIANTS}):
            base = os.path.join(args.dir, f"iter-{model}-{prec}.base.json")
            cmd = [os.path.join(args.bin, "soapc"),
                   os.path.join(ROOT, f"examples/models/{model}.onnx"),
                   "--topology", topo, "--search", "data", "--batch", batch,
                   "--precision", prec, "-o", base]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"fidelity-iter: no {prec} plan for {model}: "
                      f"{r.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                continue
            with open(base) as f:
                plan = json.load(f)
            os.remove(base)
            for p, m in VARIANTS:
                if p != prec or int(batch) % m:
                    continue
                plan["pipeline"]["micro_batches"] = m
                with open(os.path.join(args.dir, plan_name(model, p, m)),
                          "w") as f:
                    json.dump(plan, f, indent=1)
    print(len([f for f in os.listdir(args.dir) if f.startswith("iter-")
               and f.endswith(".plan.json")]), "plans")


def plan_files(d):
    return sorted(os.path.join(d, f) for f in os.listdir(d)
                  if f.startswith("iter-") and f.endswith(".plan.json"))


def describe(path):
    with open(path) as f:
        plan = json.load(f)
    model = os.path.splitext(os.path.basename(plan["model"]["path"]))[0]
    return (model, plan["model"]["batch"], plan["search"]["precision"],
            plan["pipeline"]["micro_batches"])


# --------------------------------------------------------------------------
# measure: PyTorch on the GPU
# --------------------------------------------------------------------------

def measure(args):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(ROOT, "examples/models"))
    import export

    if args.dry_run:  # the harness on the CPU: no events, no graphs
        class Ev:
            def __init__(self, **_):
                self.t = 0.0

            def record(self):
                self.t = time.perf_counter()

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return (other.t - self.t) * 1e3

        class Cuda:
            Event = Ev
            synchronize = reset_peak_memory_stats = empty_cache = \
                staticmethod(lambda: None)
            max_memory_allocated = staticmethod(lambda: 0)

            @staticmethod
            def get_device_name(_):
                return "cpu (dry run)"
        cuda = Cuda
    else:
        cuda = torch.cuda
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cpu" if args.dry_run else "cuda")
    out_path = os.path.join(args.dir, "iter-measured.json")
    results = {"gpu": cuda.get_device_name(0),
               "torch": torch.__version__,
               "cudnn": torch.backends.cudnn.version(),
               "cuda": torch.version.cuda,
               "repeats": args.repeats, "warmup": args.warmup, "plans": {}}

    def timed(fn, n):
        ts = []
        for _ in range(n):
            a = cuda.Event(enable_timing=True)
            b = cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) / 1e3)
        return statistics.median(ts), min(ts), max(ts)

    # Models that make tensors in forward (GPT-2's causal mask and its LM
    # head's zero bias) make them where and as the weights are.
    if not args.dry_run:
        torch.set_default_device(dev)

    def run(model_name, batch, prec, m):
        prev = torch.get_default_dtype()
        try:
            if prec == "bf16":
                torch.set_default_dtype(torch.bfloat16)
            return run_in(model_name, batch, prec, m)
        finally:
            torch.set_default_dtype(prev)

    def run_in(model_name, batch, prec, m):
        row = {}
        dtype = torch.bfloat16 if prec == "bf16" else torch.float32
        builder, specs = export.MODELS[model_name]
        torch.manual_seed(0)
        model = builder().to(dev, dtype).train()
        vocab = min((e.num_embeddings for e in model.modules()
                     if isinstance(e, nn.Embedding)), default=2)
        xs = []
        for _, shape, dt in specs:
            shape = [batch] + list(shape[1:])
            if dt == "int64":
                xs.append(torch.randint(0, vocab, shape, device=dev))
            else:
                xs.append(torch.randn(shape, device=dev, dtype=dtype))
        with torch.no_grad():
            y = model(*xs)
        classes = y.shape[-1]
        lshape = [batch] if y.dim() == 2 else list(y.shape[:-1])
        labels = torch.randint(0, classes, lshape, device=dev)
        del y
        xs_mb = [x.chunk(m) for x in xs]
        labels_mb = labels.chunk(m)
        params = [p for p in model.parameters() if p.requires_grad]
        lr = 0.1
        if prec == "bf16":
            masters = [p.detach().float().clone() for p in params]

            def update():
                with torch.no_grad():
                    torch._foreach_add_(masters, [p.grad for p in params],
                                        alpha=-lr)
                    if hasattr(torch, "_foreach_copy_"):
                        torch._foreach_copy_(params, masters)
                    else:  # PyTorch before 2.2 (the --dry-run on Debian's)
                        for p, q in zip(params, masters):
                            p.copy_(q)
        else:
            opt = torch.optim.SGD(params, lr=lr, foreach=True)
            update = opt.step

        def step():
            for k in range(m):
                out = model(*[x[k] for x in xs_mb])
                # each micro-batch's share of the batch's mean
                loss = F.cross_entropy(out.reshape(-1, classes),
                                       labels_mb[k].reshape(-1),
                                       reduction="sum") / labels.numel()
                loss.backward()
            update()

        def eager():
            for p in params:
                p.grad = None
            step()

        for _ in range(args.warmup):
            eager()
        cuda.synchronize()
        cuda.reset_peak_memory_stats()
        row["eager_s"], row["eager_min_s"], row["eager_max_s"] = timed(
            eager, args.repeats)
        row["peak_bytes"] = cuda.max_memory_allocated()
        # The whole iteration captured once and replayed (PyTorch's
        # whole-network capture: warm-ups on a side stream, gradients
        # allocated inside the graph by its first backward).
        if args.dry_run:
            return row
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    eager()
            torch.cuda.current_stream().wait_stream(s)
            for p in params:
                p.grad = None
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
            for _ in range(args.warmup):
                g.replay()
            row["graph_s"], row["graph_min_s"], row["graph_max_s"] = timed(
                g.replay, args.repeats)
        except Exception as e:  # not every kernel is capturable
            row["graph_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            torch.cuda.synchronize()
        return row

    if args.only and os.path.exists(out_path):
        with open(out_path) as f:
            results["plans"] = json.load(f)["plans"]
    for path in plan_files(args.dir):
        name = os.path.basename(path)
        if args.only and not any(o in name for o in args.only.split(",")):
            continue
        model_name, batch, prec, m = describe(path)
        row = {"model": model_name, "batch": batch, "precision": prec,
               "micro_batches": m}
        t0 = time.time()
        try:
            row.update(run(model_name, batch, prec, m))
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        gc.collect()
        cuda.synchronize()
        cuda.empty_cache()
        row["wall_s"] = round(time.time() - t0, 1)
        results["plans"][name] = row
        print(f"{name}: " + " ".join(
            f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in row.items() if k != "model"), flush=True)
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)


# --------------------------------------------------------------------------
# table: simulate each plan, compare
# --------------------------------------------------------------------------

def simulate(args, path, cost_model, profile=None):
    model, *_ = describe(path)
    cmd = [os.path.join(args.bin, "soapc"), "simulate",
           os.path.join(ROOT, f"examples/models/{model}.onnx"),
           "--topology", os.path.join(ROOT, f"bench/fidelity-{args.gpu}x1.json"),
           "--strategy", path, "--cost-model", cost_model, "--format", "json"]
    if cost_model == "profile":
        cmd += ["--profile", profile or args.profile]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"fidelity-iter: {' '.join(cmd)}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def err(pred, meas):
    return abs(pred - meas) / meas


def ordered(rows, key, pkey):
    """Pairs of plans (of one model) predicted (pkey) more than 5% apart,
    and how many of them the measurement (key) orders alike."""
    agree = total = 0
    for i in range(len(rows)):
        for j in range(i + 1, len(rows)):
            a, b = rows[i], rows[j]
            if key not in a or key not in b:
                continue
            pa, pb = a[pkey], b[pkey]
            if abs(pa - pb) <= 0.05 * min(pa, pb):
                continue
            total += 1
            agree += (pa < pb) == (a[key] < b[key])
    return agree, total


def table(args):
    with open(os.path.join(args.dir, "iter-measured.json")) as f:
        measured = json.load(f)
    # The same profile without the host's enqueue times: what the device
    # runs when nothing waits for the host (a captured CUDA graph).
    with open(args.profile) as f:
        prof = json.load(f)
    for k in prof["kernels"]:
        if "launch_s" in k:
            k["launch_s"] = [0.0] * len(k["launch_s"])
    gpu_only = os.path.join(args.dir, "iter-gpu-only.profile.json")
    with open(gpu_only, "w") as f:
        json.dump(prof, f)
    rows = []
    for path in plan_files(args.dir):
        name = os.path.basename(path)
        meas = measured["plans"].get(name)
        if meas is None or "eager_s" not in meas:
            continue
        model, batch, prec, m = describe(path)
        prof = simulate(args, path, "profile")
        dev = simulate(args, path, "profile", gpu_only)
        roof = simulate(args, path, "analytic")
        row = dict(meas)
        row.update(predicted_s=prof["iteration_s"],
                   predicted_gpu_s=dev["iteration_s"],
                   predicted_analytic_s=roof["iteration_s"],
                   predicted_peak_bytes=prof["memory"]["peak"])
        rows.append(row)
    head = ("| model | batch | precision | m | eager ms | predicted ms | err |"
            " graph ms | GPU-only ms | err | analytic ms | err |"
            " peak pred/meas |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        ref = r.get("graph_s", r["eager_s"])
        pref = r["predicted_gpu_s"] if "graph_s" in r else r["predicted_s"]
        print(f"| {r['model']} | {r['batch']} | {r['precision']} |"
              f" {r['micro_batches']} | {r['eager_s'] * 1e3:.3f} |"
              f" {r['predicted_s'] * 1e3:.3f} |"
              f" {err(r['predicted_s'], r['eager_s']):.1%} |"
              + (f" {r['graph_s'] * 1e3:.3f} | {r['predicted_gpu_s'] * 1e3:.3f} |"
                 f" {err(r['predicted_gpu_s'], r['graph_s']):.1%} |"
                 if "graph_s" in r else " - | - | - |")
              + f" {r['predicted_analytic_s'] * 1e3:.3f} |"
              f" {err(r['predicted_analytic_s'], ref):.1%} |"
              + (f" {r['predicted_peak_bytes'] / r['peak_bytes']:.2f} |"
                 if r["peak_bytes"] else " - |"))
    summary = {}
    for key, pkey in (("eager_s", "predicted_s"), ("graph_s", "predicted_gpu_s")):
        es = [err(r[pkey], r[key]) for r in rows if key in r]
        if not es:
            continue
        agree = total = 0
        for model in sorted({r["model"] for r in rows}):
            a, t = ordered([r for r in rows if r["model"] == model], key, pkey)
            agree += a
            total += t
        summary[key] = {"plans": len(es), "median_error": statistics.median(es),
                        "worst_error": max(es), "pairs_ordered_alike": agree,
                        "pairs_separated": total}
        print(f"{pkey} against {key}: {len(es)} plans, median error "
              f"{statistics.median(es):.1%}, worst {max(es):.1%}; "
              f"{agree} of {total} pairs predicted >5% apart ordered alike")
    missing = [n for n, r in measured["plans"].items() if "eager_s" not in r]
    for n in missing:
        print(f"not measured: {n}: {measured['plans'][n].get('error')}")
    with open(args.out, "w") as f:
        json.dump({"measured_on": {k: v for k, v in measured.items()
                                   if k != "plans"},
                   "profile": args.profile, "rows": rows,
                   "summary": summary, "not_measured": missing}, f, indent=1)
    print(f"wrote {args.out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("stage", choices=["plans", "measure", "table"])
    ap.add_argument("--dir", default=os.path.join(ROOT, "bench/results/fidelity"))
    ap.add_argument("--bin", default=os.environ.get(
        "BIN", os.path.join(ROOT, "build/bin")))
    ap.add_argument("--gpu", default=os.environ.get("GPU", "h100"),
                    choices=["h100", "h200"])
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--profile")
    ap.add_argument("--only", default="",
                    help="measure: only the plans whose names contain one "
                    "of these (comma-separated), kept with the others' "
                    "earlier results")
    ap.add_argument("--dry-run", action="store_true",
                    help="measure: run the harness on the CPU (no timing "
                    "worth keeping, no graphs)")
    ap.add_argument("--out", default=os.path.join(
        ROOT, "bench/results/fidelity-iter.json"))
    args = ap.parse_args()
    if args.profile is None:
        args.profile = os.path.join(
            ROOT, "profiles", f"{args.gpu}-sxm.json")
    {"plans": plans, "measure": measure, "table": table}[args.stage](args)


if __name__ == "__main__":
    main()
