#!/usr/bin/python3
"""bench/published.py [--only ID,PREFIX,..] [--max-gpus N] [--timeout S]
                      [--max-rss GiB] [--soapc PATH] [--topology-dir DIR]
                      [--set PREFIX:KEY=VALUE] [--list]
                      [--out bench/results/published.json]

Published large-scale GPT training runs against soapc's prediction: each
row's configuration is given to `soapc simulate --strategy megatron:...`
(a what-if, no search) and the predicted iteration time is compared with the
published one.

* Megatron-LM, Narayanan et al. SC21 (arXiv 2104.04473), Table 1: GPT from
  1.7B to 1T parameters on 32 to 3,072 A100-80GB (dgx-a100-N), fp16 with
  activation recomputation. The paper gives TFLOP/s per GPU counted with its
  Eq. 3, F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) (the recomputation's
  forward included), so the published iteration time is
  F / (GPUs * TFLOP/s). The models are written by examples/models/gpt3.py
  --config into build/published-models/ at first use.
* NVIDIA NeMo GPT-3 175B in bf16 on 128 to 2,048 H100 (dgx-h100-N):
  measured seconds per step (NVIDIA/dgxc-benchmarking,
  nemo_megatron/README_175b.md, NeMo 24.11), on GPT-3 175B with the
  vocabulary Megatron pads to (50,688 at tp 4), written like the SC21 ones.
* NVIDIA NeMo Llama 3.1 8B and 70B in bf16 on 8 to 2,048 H100: measured
  seconds per step (NVIDIA/dgxc-benchmarking, llama3.1/README_8b.md and
  README_70b.md, NeMo 24.09), on the bundled examples/models/llama3_8b.onnx
  and llama3_70b.onnx (examples/models/decoder.py). Their FLOP/s column is
  the README's own "model flops" formula.
* The same READMEs' FP8 tables (Transformer Engine's delayed-scaling
  "hybrid" recipe), same configurations, simulated with --precision fp8;
  held out like every row but the calibration ones.

A configuration soapc cannot express yet (exit 2 naming a key such as vp,
sp or cp) is printed as such, and the nearest configuration it can express
(that key at its plain value: vp=1, sp=0, cp=1) is simulated on a separate
"without ..." line, which the summary does not count. Rows are "calibration"
(the only ones the cost model's physical constants may be fitted to) or
"held-out". Prints a table and a summary (median and worst |error|), writes
JSON with sorted keys (rows not run this time are kept from the file).
Asserts nothing."""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples", "models"))
import gpt3  # noqa: E402  (examples/models/gpt3.py: gpt_params, the writer)

SEQ = 2048
SC21_VOCAB = 51200
SC21_SOURCE = ("Narayanan et al., SC21 (arXiv 2104.04473), Table 1; mbs and "
               "interleaving: NVIDIA/Megatron-LM examples/sc21/run_table_1.sh")
NEMO_SOURCE = ("NVIDIA/dgxc-benchmarking nemo_megatron/README_175b.md (NeMo "
               "24.11 BF16) and gpt3_175b_hydra.yaml")

# SC21 Table 1: (billions, heads, hidden, layers, t, p, GPUs, batch,
# TFLOP/s per GPU), then from run_table_1.sh the micro-batch size (MBS) and
# the layers per virtual stage (--num-layers-per-virtual-pipeline-stage;
# None: not set there, i.e. the non-interleaved schedule).
SC21 = [
    ("1.7", 24, 2304, 24, 1, 1, 32, 512, 137, 16, None),
    ("3.6", 32, 3072, 30, 2, 1, 64, 512, 138, 16, None),
    ("7.5", 32, 4096, 36, 4, 1, 128, 512, 142, 16, None),
    ("18.4", 48, 6144, 40, 8, 1, 256, 1024, 135, 8, None),
    ("39.1", 64, 8192, 48, 8, 2, 512, 1536, 138, 4, None),
    ("76.1", 80, 10240, 60, 8, 4, 1024, 1792, 140, 2, 5),
    ("145.6", 96, 12288, 80, 8, 8, 1536, 2304, 148, 2, 5),
    ("310.1", 128, 16384, 96, 8, 16, 1920, 2160, 155, 1, 3),
    ("529.6", 128, 20480, 105, 8, 35, 2520, 2520, 163, 1, 1),
    ("1008", 160, 25600, 128, 8, 64, 3072, 3072, 163, 1, None),
]
SC21_CALIBRATION = {"1.7", "18.4", "145.6"}

# NeMo 24.11 BF16, TP=4, PP=8, MBS=1, VP=12, GBS = 2 x GPUs: GPUs -> s/step.
NEMO = [(128, 8.91), (256, 8.95), (512, 9.09), (1024, 9.01), (2048, 9.02)]
NEMO_CALIBRATION = {128}

# The same README's FP8 table, "NeMo Megatron 24.11 FP8 (TP=4, PP=8, MBS=1,
# VP=12, SEQ=2048)", its gpt3_175b_hydra.yaml: fp8_hybrid, margin 0,
# interval 1, amax history 1024, algo max. All held out.
NEMO_FP8 = [(128, 5.92), (256, 5.96), (512, 6.44), (1024, 6.72),
            (2048, 6.24)]
NEMO_FP8_SOURCE = ("NVIDIA/dgxc-benchmarking nemo_megatron/README_175b.md "
                   "(NeMo 24.11 FP8) and gpt3_175b_hydra.yaml")

# NeMo 24.09 Llama 3.1, bf16 (dgxc-benchmarking llama3.1/README_8b.md and
# README_70b.md): (model, layers, hidden, heads, kv-heads, ffn, batch per
# GPU, strategy, [(GPUs, seconds per step)]). 8B: TP 1, PP 1, CP 2, MBS 1,
# GBS 128 per node. 70B: TP 4, PP 4, VP 5, CP 2, MBS 1, GBS 16 per node;
# NeMo's Llama 3.1 70B recipe sets sequence_parallel: true (with tp > 1)
# and, like the GPT-3 recipe, no activation recomputation; both use the
# distributed fused Adam. All held out.
LLAMA_SOURCE = ("NVIDIA/dgxc-benchmarking llama3.1/README_%s.md (NeMo 24.09 "
                "BF16)")
LLAMA_VOCAB, LLAMA_SEQ = 128256, 8192
LLAMA = [
    ("8b", 32, 4096, 32, 8, 14336, 16,
     {"tp": 1, "pp": 1, "vp": 1, "cp": 2, "mbs": 1, "sp": 0,
      "recompute": "none", "distopt": 1, "tp_comm_overlap": 0},
     [(8, 12.91), (16, 13.00), (32, 13.05), (64, 13.08), (128, 13.10)]),
    ("70b", 80, 8192, 64, 8, 28672, 2,
     {"tp": 4, "pp": 4, "vp": 5, "cp": 2, "mbs": 1, "sp": 1,
      "recompute": "none", "distopt": 1, "tp_comm_overlap": 1},
     [(64, 14.72), (128, 14.73), (256, 14.80), (512, 14.89), (1024, 14.92),
      (2048, 14.98)]),
]
# The same READMEs' FP8 tables, "Llama 3.1 8b 24.09 FP8 (TP=1, PP=1, CP=2,
# MBS=1, GA=32)" and "Llama 3.1 70b 24.09 FP8 (TP=4, PP=4, CP=2, VP=5,
# MBS=1, GA=64)": the bf16 rows' strategies; configure.sh sets model.fp8,
# model.fp8_hybrid and model.fp8_params (the weights kept in FP8 with no
# bf16 copy, and gathered in FP8), the yaml amax history 1024, algo max.
LLAMA_FP8_SOURCE = ("NVIDIA/dgxc-benchmarking llama3.1/README_%s.md (NeMo "
                    "24.09 FP8) and configure.sh")
LLAMA_FP8 = {
    "8b": [(8, 9.67), (16, 9.73), (32, 9.75), (64, 9.80), (128, 9.82)],
    "70b": [(64, 11.01), (128, 10.93), (256, 11.16), (512, 11.18),
            (1024, 11.28), (2048, 11.39)],
}


def llama_model_flops(layers, hidden, heads, kv, ffn, vocab, seq):
    """The dgxc-benchmarking READMEs' model FLOPs per sequence: seq x
    (12 l h^2 (1 + kv/heads + seq/h) + 18 l ffn h + 6 V h)."""
    attention = 12 * layers * hidden * hidden * (1 + kv / heads + seq / hidden)
    return seq * (attention + 18 * layers * ffn * hidden + 6 * vocab * hidden)


def llama_params(name):
    """The bundled model's parameter count (examples/models/params.json)."""
    with open(os.path.join(ROOT, "examples", "models", "params.json")) as f:
        return json.load(f)["llama3_" + name]["pytorch_params"]

# What a key soapc cannot honour yet falls back to for the nearest
# configuration, and how the "without" line names it.
FALLBACK = {
    "vp": (1, "interleaving"),
    "sp": (0, "SP"),
    "cp": (1, "CP"),
    "distopt": (0, "distopt"),
    "tp_comm_overlap": (0, "TP overlap"),
}
KEY_ORDER = ["tp", "pp", "vp", "cp", "mbs", "sp", "recompute", "distopt",
             "tp_comm_overlap"]
# Which named key falls back first when a message names several (sp=1 with
# cp=2): the one whose plain value changes the run least.
FALLBACK_ORDER = ["tp_comm_overlap", "sp", "distopt", "vp", "cp"]

DESCRIPTION = ("Published large-scale GPT training runs (Megatron-LM SC21 "
               "Table 1, NVIDIA NeMo GPT-3 175B) against soapc simulate "
               "--strategy megatron:... (a what-if, no search)")
NOTES = [
    "SC21 rows: fp16 in the paper, simulated as --precision bf16 (same "
    "kernel cost and bytes); recompute=full (activation recomputation), "
    "distopt=0 (SC21 predates the distributed optimizer), sp=0; A100 80 GB "
    "(Selene).",
    "SC21 micro-batch sizes are not in the paper; they are MBS of Megatron-"
    "LM's released script for Table 1 (examples/sc21/run_table_1.sh). The "
    "paper says Table 1 uses the interleaved schedule; the script sets "
    "--num-layers-per-virtual-pipeline-stage 5/5/3/1 for 76.1B/145.6B/"
    "310.1B/529.6B (vp = layers / p / that = 3/2/2/3) and none for 39.1B "
    "and 1008B (vp=1 here).",
    "NeMo rows: tp=4, pp=8, vp=12, mbs=1, batch 2 x GPUs (the README's "
    "table); sp=1 (sequence_parallel: true), distopt=1 (optim "
    "distributed_fused_adam), recompute=none (activations_checkpoint_"
    "granularity: null; Transformer Engine's fused attention recomputes "
    "the scores in backward, which soapc's --kernels fused attention does "
    "too). The recipe also overlaps tensor-parallel communication with "
    "GEMMs (ub_tp_comm_overlap), pipeline sends (overlap_p2p_comm) and the "
    "gradient reduce-scatter / parameter all-gather. Model: GPT-3 175B "
    "written by gpt3.py with the vocabulary Megatron-Core pads GPT-2's "
    "50,257 to (_vocab_size_with_padding: a multiple of "
    "make_vocab_size_divisible_by 128 x tp 4 = 512, so 50,688), which the "
    "tensor-parallel LM head splits evenly.",
    "Llama 3.1 rows: NeMo 24.09 BF16 (dgxc-benchmarking llama3.1/README_8b.md, "
    "README_70b.md): 8B tp=1, pp=1, cp=2, mbs=1, batch 16 x GPUs; 70B tp=4, "
    "pp=4, vp=5, cp=2, mbs=1, batch 2 x GPUs, sp=1 (NeMo's recipe); "
    "distopt=1, recompute=none; the bundled llama3_8b/llama3_70b.onnx "
    "(seq 8,192, vocabulary 128,256, GQA with 8 kv-heads). Their TFLOP/s "
    "column is the README's model-flops formula.",
    "FP8 rows: the same READMEs' FP8 tables at the bf16 rows' "
    "configurations, simulated with --precision fp8 (Transformer Engine's "
    "delayed-scaling hybrid recipe: linear-layer GEMMs at the FP8 rate, the "
    "LM head and attention in bf16). The Llama FP8 runs also set "
    "fp8_params (weights held and gathered in FP8), which soapc does not "
    "model: it holds bf16 weights plus an FP8 copy and gathers bf16. "
    "MFU below stays against the bf16 peak (the READMEs' FP8 MFU uses "
    "1,979 TFLOP/s).",
    "MFU = 6 N tokens / (time GPUs peak), N = the graph's parameters, peak "
    "= dense fp16/bf16 of lib/Machine/DeviceCatalog.cpp (A100 312, H100 "
    "989.5 TFLOP/s). TFLOP/s = SC21's Eq. 3 F / (time GPUs) with the row's "
    "own l, h, s, V (it counts a recomputation forward, which the NeMo "
    "runs do not do).",
]


def padded_vocab(vocab, tp, divisible_by=128):
    """Megatron-LM's padded vocabulary (_vocab_size_with_padding)."""
    multiple = divisible_by * tp
    return (vocab + multiple - 1) // multiple * multiple


def sc21_name(billions):
    return "sc21_" + billions.replace(".", "_") + "b"


def build_rows():
    rows = []
    for (b, heads, hidden, layers, t, p, gpus, batch, tflops, mbs,
         per_virtual) in SC21:
        vp = layers // p // per_virtual if per_virtual else 1
        rows.append({
            "id": "sc21-%sb" % b, "source": SC21_SOURCE,
            "role": "calibration" if b in SC21_CALIBRATION else "held-out",
            "model": sc21_name(b), "generated": True,
            "layers": layers, "hidden": hidden, "heads": heads,
            "vocab": SC21_VOCAB, "seq": SEQ,
            "gpus": gpus, "topology": "dgx-a100-%d" % (gpus // 8),
            "device": "A100-SXM4-80GB", "batch": batch,
            "published_precision": "fp16",
            # Megatron-LM in 2021: fused bias-GELU, bias-dropout-add and
            # scale-mask-softmax kernels, no FlashAttention (2022).
            "kernels": "no-flash",
            "strategy": {"tp": t, "pp": p, "vp": vp, "cp": 1, "mbs": mbs,
                         "sp": 0, "recompute": "full", "distopt": 0,
                         "tp_comm_overlap": 0},
            "published_tflops": float(tflops)})
    for gpus, step in NEMO:
        rows.append({
            "id": "nemo-175b-%d" % gpus, "source": NEMO_SOURCE,
            "role": "calibration" if gpus in NEMO_CALIBRATION else "held-out",
            "model": "nemo_gpt3_175b", "generated": True,
            "layers": 96, "hidden": 12288, "heads": 96,
            "vocab": padded_vocab(gpt3.VOCAB, 4),
            "seq": SEQ, "gpus": gpus, "topology": "dgx-h100-%d" % (gpus // 8),
            "device": "H100-SXM", "batch": 2 * gpus,
            "published_precision": "bf16",
            "kernels": "fused",
            "strategy": {"tp": 4, "pp": 8, "vp": 12, "cp": 1, "mbs": 1,
                         "sp": 1, "recompute": "none", "distopt": 1,
                         "tp_comm_overlap": 1},
            "published_s": step})
    for gpus, step in NEMO_FP8:
        rows.append({
            "id": "nemo-175b-fp8-%d" % gpus, "source": NEMO_FP8_SOURCE,
            "role": "held-out", "model": "nemo_gpt3_175b", "generated": True,
            "layers": 96, "hidden": 12288, "heads": 96,
            "vocab": padded_vocab(gpt3.VOCAB, 4),
            "seq": SEQ, "gpus": gpus, "topology": "dgx-h100-%d" % (gpus // 8),
            "device": "H100-SXM", "batch": 2 * gpus,
            "published_precision": "fp8", "precision": "fp8",
            "kernels": "fused",
            "strategy": {"tp": 4, "pp": 8, "vp": 12, "cp": 1, "mbs": 1,
                         "sp": 1, "recompute": "none", "distopt": 1,
                         "tp_comm_overlap": 1},
            "published_s": step})
    for r in rows:
        r["parameters"] = gpt3.gpt_params(r["vocab"], r["hidden"],
                                          r["layers"], r["seq"])
        r["flops_eq3"] = eq3_flops(r)
    for (name, layers, hidden, heads, kv, ffn, per_gpu, strategy,
         bf16_runs) in LLAMA:
        runs = [(gpus, step, "bf16") for gpus, step in bf16_runs] + \
            [(gpus, step, "fp8") for gpus, step in LLAMA_FP8[name]]
        for gpus, step, precision in runs:
            fp8 = precision == "fp8"
            rows.append({
                "id": "llama3.1-%s-%s%d" % (name, "fp8-" if fp8 else "",
                                            gpus),
                "source": (LLAMA_FP8_SOURCE if fp8 else LLAMA_SOURCE) % name,
                "role": "held-out",
                "model": "llama3_" + name, "generated": False,
                "layers": layers, "hidden": hidden, "heads": heads,
                "vocab": LLAMA_VOCAB, "seq": LLAMA_SEQ, "gpus": gpus,
                "topology": "dgx-h100-%d" % (gpus // 8),
                "device": "H100-SXM", "batch": per_gpu * gpus,
                "published_precision": precision, "precision": precision,
                "kernels": "fused",
                "strategy": dict(strategy), "published_s": step,
                "parameters": llama_params(name),
                "flops_eq3": per_gpu * gpus * llama_model_flops(
                    layers, hidden, heads, kv, ffn, LLAMA_VOCAB,
                    LLAMA_SEQ)})
    for r in rows:
        derive(r)
        if "published_s" not in r:
            r["published_s"] = r["flops_eq3"] / (
                r["gpus"] * r["published_tflops"] * 1e12)
        else:
            r["published_tflops"] = r["flops_eq3"] / (
                r["gpus"] * r["published_s"]) / 1e12
    return rows


def derive(r):
    """dp and the micro-batch count from the row's strategy."""
    s = r["strategy"]
    r["dp"] = r["gpus"] // (s["tp"] * s["pp"] * s["cp"])
    r["micro_batches"] = r["batch"] // (r["dp"] * s["mbs"])


def eq3_flops(r):
    """SC21 Eq. 3: F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))."""
    B, s, l, h, V = r["batch"], r["seq"], r["layers"], r["hidden"], r["vocab"]
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def catalog_peaks():
    """Dense fp16/bf16 peak per device name, read from the catalog's
    source (its entries: name, description, fp64, fp32, tf32, fp16)."""
    path = os.path.join(ROOT, "lib", "Machine", "DeviceCatalog.cpp")
    text = open(path).read()
    peaks = {}
    num = r"([0-9.]+) \* T"
    for m in re.finditer(r'\{"([^"]+)",\s*"[^"]*",\s*' +
                         r",\s*".join([num] * 4), text):
        peaks[m.group(1)] = float(m.group(5)) * 1e12
    return peaks


def strategy_text(s):
    return "megatron:" + ",".join("%s=%s" % (k, s[k]) for k in KEY_ORDER)


def shape_text(r, s):
    return "%d/%d/%d/%d/%d" % (s["tp"], s["pp"], s["vp"], s["mbs"],
                               r["micro_batches"])


def ensure_models(rows, models_dir):
    """Writes the generated rows' models that are not there yet."""
    missing = {}
    for r in rows:
        path = os.path.join(models_dir, r["model"] + ".onnx")
        if r["generated"] and not os.path.exists(path):
            missing[r["model"]] = "%s:%d,%d,%d,%d,%d" % (
                r["model"], r["layers"], r["hidden"], r["heads"], r["vocab"],
                r["seq"])
    if not missing:
        return
    cmd = [sys.executable, os.path.join(ROOT, "examples/models/gpt3.py"),
           "--out", models_dir]
    for c in missing.values():
        cmd += ["--config", c]
    print("writing %s into %s" % (", ".join(missing), rel(models_dir)),
          flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def rel(path):
    return os.path.relpath(path, ROOT) if path.startswith(ROOT) else path


def model_path(r, models_dir):
    if r["generated"]:
        return os.path.join(models_dir, r["model"] + ".onnx")
    return os.path.join(ROOT, "examples", "models", r["model"] + ".onnx")


def rss_bytes(pid):
    """Resident bytes of a running process (Linux), 0 when unknown."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def mem_total():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def run_watched(cmd, timeout, max_rss):
    """Runs cmd, killed past timeout seconds or max_rss resident bytes
    (a task graph too big for this machine is stopped before the kernel's
    OOM killer picks a process, perhaps someone else's). Returns (exit code
    or "timeout"/"memory", stdout, stderr, wall, peak RSS)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.time()
        p = subprocess.Popen(cmd, stdout=out, stderr=err)
        peak, why = 0, None
        while True:
            # wait4 reaps the child with its own peak RSS (Linux: KiB).
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                p.returncode = os.waitstatus_to_exitcode(status)
                peak = max(peak, usage.ru_maxrss * 1024)
                break
            peak = max(peak, rss_bytes(p.pid))
            if time.time() - t0 > timeout:
                why = "timeout"
            elif max_rss and peak > max_rss:
                why = "memory"
            if why:
                p.kill()
                p.wait()
                break
            time.sleep(0.2)
        wall = time.time() - t0
        out.seek(0)
        err.seek(0)
        return (why or p.returncode, out.read().decode(errors="replace"),
                err.read().decode(errors="replace"), wall, peak)


def simulate(a, r, strategy, models_dir):
    """One `soapc simulate`; returns (status, report or None, message,
    wall seconds, peak RSS bytes)."""
    cmd = [a.soapc, "simulate", model_path(r, models_dir), "--topology",
           os.path.join(a.topology_dir, r["topology"] + ".json"),
           "--batch", str(r["batch"]),
           "--precision", r.get("precision", "bf16"),
           "--optimizer", "adam", "--strategy", a.strategy or strategy,
           "--format", "json"]
    cmd += ["--kernels", a.kernels or r["kernels"]]
    max_rss = int(a.max_rss * 2**30)
    for attempt in range(a.retries + 1):
        try:
            rc, out, err, wall, peak = run_watched(cmd, a.timeout, max_rss)
        except OSError as e:  # being relinked: ETXTBSY, ENOENT
            if attempt == a.retries:
                return ("error", None, "cannot run %s: %s" % (a.soapc, e),
                        0.0, 0)
            time.sleep(a.retry_wait)
            continue
        if rc == "timeout":
            return "timeout", None, "over --timeout %gs" % a.timeout, \
                wall, peak
        if rc == "memory":
            return "memory", None, "over --max-rss %.1f GiB" % a.max_rss, \
                wall, peak
        lines = err.strip().splitlines()
        message = lines[-1] if lines else ""
        if rc == 0:
            try:
                return "ok", json.loads(out), message, wall, peak
            except ValueError:
                return "error", None, "soapc printed no JSON", wall, peak
        if rc == 2:
            return "unsupported", None, message, wall, peak
        return "error", None, "exit %s: %s" % (rc, message), wall, peak
    return "error", None, "unreachable", 0.0, 0


def named_key(message, strategy):
    """The strategy key a soapc exit-2 message names, if it is one that
    has a plain value to fall back to and is not at it already (the first
    in FALLBACK_ORDER where it names several)."""
    for key in FALLBACK_ORDER:
        if key in FALLBACK and strategy[key] != FALLBACK[key][0] and \
                re.search(r"(?<![A-Za-z_])%s(?![A-Za-z_])" % key, message):
            return key
    return None


def fill(entry, r, rep, peak):
    it = rep["iteration_s"]
    tokens = r["batch"] * r["seq"]
    mem = rep.get("memory", {})
    entry.update({
        "predicted_s": it,
        "error": it / r["published_s"] - 1,
        "mfu_predicted": 6 * r["parameters"] * tokens / (it * r["gpus"] * peak)
        if peak else None,
        "tflops_predicted": r["flops_eq3"] / (it * r["gpus"]) / 1e12,
        "memory_peak": mem.get("peak"), "memory_capacity": mem.get("capacity"),
        "fits": mem.get("fits"), "compute_s": rep.get("compute_s"),
        "critical_path": rep.get("critical_path"), "tasks": rep.get("tasks"),
        "fold": rep.get("fold")})


def run_row(a, r, models_dir, peaks):
    s = dict(r["strategy"])
    out = {k: v for k, v in r.items() if k not in ("generated",)}
    out["strategy_text"] = strategy_text(s)
    topo = os.path.join(a.topology_dir, r["topology"] + ".json")
    if os.path.exists(topo):  # the topology's device, where it exists
        with open(topo) as f:
            out["device"] = json.load(f).get("device", r["device"])
    peak = peaks.get(out["device"])
    out["peak_flops"] = peak
    tokens = r["batch"] * r["seq"]
    out["mfu_published"] = (6 * r["parameters"] * tokens /
                            (r["published_s"] * r["gpus"] * peak)
                            if peak else None)
    if not os.path.exists(topo):
        out.update(status="topology missing", message=rel(topo), wall_s=0.0)
        return out
    status, rep, message, wall, rss = simulate(a, r, strategy_text(s),
                                               models_dir)
    out.update(status=status, message=message, wall_s=round(wall, 1),
               soapc_rss_gib=round(rss / 2**30, 1))
    if status == "ok":
        fill(out, r, rep, peak)
        return out
    # The nearest configuration soapc can express: each key it names at its
    # plain value, one at a time.
    lacking = []
    while status == "unsupported":
        key = named_key(message, s)
        if key is None:
            break
        s[key] = FALLBACK[key][0]
        lacking.append(key)
        status, rep, message, wall, rss = simulate(a, r, strategy_text(s),
                                                   models_dir)
    if lacking:
        near = {"without": lacking, "strategy": dict(s),
                "strategy_text": strategy_text(s), "status": status,
                "message": message, "wall_s": round(wall, 1),
                "soapc_rss_gib": round(rss / 2**30, 1)}
        if status == "ok":
            fill(near, r, rep, peak)
        out["nearest"] = near
        out["lacks"] = lacking
    return out


def markdown(path):
    """bench/README's table from a results file (what the last run wrote)."""
    with open(path) as f:
        d = json.load(f)
    print("| row | role | GPUs | t/p/vp/mbs/m | kernels | published s | "
          "predicted s | error | TFLOP/s publ / pred | peak / capacity GiB |")
    print("|---|---|---:|---|---|---:|---:|---:|---:|---|")

    def line(label, role, r, x):
        s = x.get("strategy", r["strategy"])
        shape = "%d/%d/%d/%d/%d" % (s["tp"], s["pp"], s["vp"], s["mbs"],
                                    r["micro_batches"])
        if x.get("status") != "ok":
            print("| %s | %s | %d | %s | %s | %.3f | %s | | | |" % (
                label, role, r["gpus"], shape, r.get("kernels", "?"), r["published_s"],
                "needs " + ", ".join(r.get("lacks", [])) if r.get("lacks")
                else x.get("status", "")))
            return
        print("| %s | %s | %d | %s | %s | %.3f | %.3f | %s | %.0f / %.0f | "
              "%.1f / %.0f%s |" % (
                  label, role, r["gpus"], shape, r.get("kernels", "?"),
                  r["published_s"], x["predicted_s"], pct(x["error"]),
                  r["published_tflops"], x["tflops_predicted"],
                  x["memory_peak"] / 2**30, x["memory_capacity"] / 2**30,
                  "" if x["fits"] else " **does not fit**"))

    for r in d["rows"]:
        line(r["id"], r["role"], r, r)
        if "nearest" in r:
            line("↳ without " + " and ".join(r["nearest"]["without"]), "", r,
                 r["nearest"])


def pct(x, digits=1):
    return "-" if x is None else "%+.*f" % (digits, 100 * x)


def gib(x):
    return "-" if x is None else "%.1f" % (x / 2**30)


def print_line(label, r, e, s):
    pred = e.get("predicted_s")
    mem = "-"
    if e.get("memory_peak") is not None:
        mem = "%s/%s %s" % (gib(e["memory_peak"]), gib(e["memory_capacity"]),
                            "fits" if e["fits"] else "NO FIT")
    mfu = "%s/%s" % ("-" if r.get("mfu_published") is None
                     else "%.1f" % (100 * r["mfu_published"]),
                     "-" if e.get("mfu_predicted") is None
                     else "%.1f" % (100 * e["mfu_predicted"]))
    tf = "%.0f/%s" % (r["published_tflops"],
                      "-" if e.get("tflops_predicted") is None
                      else "%.0f" % e["tflops_predicted"])
    tail = "" if e["status"] == "ok" else "%s: %s" % (e["status"],
                                                      e["message"])
    print("%-26s %-11s %5d %-14s %8.3f %8s %7s %11s %9s %-18s %7.1f %5.1f  %s"
          % (label, r["role"] if label == r["id"] else "", r["gpus"],
             shape_text(r, s), r["published_s"],
             "-" if pred is None else "%.3f" % pred, pct(e.get("error")), mfu,
             tf, mem, e.get("wall_s", 0.0), e.get("soapc_rss_gib", 0.0),
             tail), flush=True)


def summary(rows):
    def stats(sel):
        errs = [abs(r["error"]) for r in sel if r.get("status") == "ok"]
        if not errs:
            return "none expressible"
        return "median %.1f%%, worst %.1f%% (%d rows)" % (
            100 * statistics.median(errs), 100 * max(errs), len(errs))
    lines = [
        "calibration: " + stats([r for r in rows
                                 if r["role"] == "calibration"]),
        "held-out:    " + stats([r for r in rows if r["role"] == "held-out"]),
        "all:         " + stats(rows),
        "of which fp8 (held out): " + stats(
            [r for r in rows if r.get("precision") == "fp8"]),
        "bf16 held-out: " + stats(
            [r for r in rows if r["role"] == "held-out" and
             r.get("precision", "bf16") != "fp8"])]
    near = [r for r in rows if r.get("nearest", {}).get("status") == "ok"]
    if near:
        lines.append("nearest expressible configurations (not counted "
                     "above): " + ", ".join(
                         "%s without %s %s%%" % (
                             r["id"], "+".join(r["nearest"]["without"]),
                             pct(r["nearest"]["error"])) for r in near))
    return lines


def selected(r, a):
    if a.max_gpus and r["gpus"] > a.max_gpus:
        return False
    if not a.only:
        return True
    return any(r["id"] == k or r["id"].startswith(k)
               for k in a.only.split(",") if k)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="",
                    help="row ids or id prefixes, comma-separated "
                    "(sc21, sc21-145.6b, nemo, nemo-175b-128)")
    ap.add_argument("--max-gpus", type=int, default=0,
                    help="skip rows with more GPUs")
    ap.add_argument("--timeout", type=float, default=1800,
                    help="seconds per soapc simulate (default 1800)")
    ap.add_argument("--max-rss", type=float,
                    default=round(0.75 * mem_total() / 2**30, 1),
                    help="GiB of resident memory past which a simulation is "
                    "stopped (default: 3/4 of this machine's)")
    ap.add_argument("--soapc", default=os.path.join(ROOT, "build/bin/soapc"))
    ap.add_argument("--kernels", default="",
                    help="soapc's --kernels for every row (default: each "
                    "row's own: no-flash for SC21, which predates "
                    "FlashAttention, fused for NeMo)")
    ap.add_argument("--strategy", default="",
                    help="simulate this --strategy instead of each row's "
                    "megatron:... (a check of the bench on older binaries)")
    ap.add_argument("--set", action="append", default=[],
                    metavar="PREFIX:KEY=VALUE",
                    help="change a strategy key of the rows whose id starts "
                    "with PREFIX (e.g. nemo:recompute=selective; repeatable)")
    ap.add_argument("--topology-dir",
                    default=os.path.join(ROOT, "examples/topologies"),
                    help="where dgx-a100-N.json and dgx-h100-N.json are")
    ap.add_argument("--models-dir",
                    default=os.path.join(ROOT, "build/published-models"))
    ap.add_argument("--retries", type=int, default=3,
                    help="retries while soapc cannot be started (relinked)")
    ap.add_argument("--retry-wait", type=float, default=30)
    ap.add_argument("--markdown", action="store_true",
                    help="print bench/README's table from --out (the last "
                    "run's results) and run nothing")
    ap.add_argument("--list", action="store_true",
                    help="print the rows and their settings, run nothing")
    ap.add_argument("--out", default=os.path.join(HERE,
                                                  "results/published.json"))
    a = ap.parse_args()
    rows = build_rows()
    for text in a.set:
        m = re.fullmatch(r"([^:]*):([a-z]+)=([A-Za-z0-9]+)", text)
        if not m or m.group(2) not in KEY_ORDER:
            sys.exit("--set %r: expected PREFIX:KEY=VALUE with KEY one of %s"
                     % (text, ", ".join(KEY_ORDER)))
        prefix, key, value = m.groups()
        for r in rows:
            if r["id"].startswith(prefix):
                r["strategy"][key] = int(value) if value.isdigit() else value
                derive(r)
    peaks = catalog_peaks()
    todo = [r for r in rows if selected(r, a)]
    if a.markdown:
        markdown(a.out)
        return
    if a.list:
        for r in todo:
            print("%-16s %-11s %5d GPUs %-18s batch %5d  %s  published %.3f s"
                  % (r["id"], r["role"], r["gpus"], r["topology"], r["batch"],
                     strategy_text(r["strategy"]), r["published_s"]))
        return
    os.makedirs(a.models_dir, exist_ok=True)
    ensure_models(todo, a.models_dir)
    print("soapc simulate --precision bf16 (fp8 for the FP8 rows) "
          "--optimizer adam --kernels %s; "
          "each simulation stopped past %gs or %.1f GiB resident (RSS "
          "column: soapc's peak GiB)" % (
              a.kernels or "no-flash (SC21) / fused (NeMo)", a.timeout,
              a.max_rss))
    print("%-26s %-11s %5s %-14s %8s %8s %7s %11s %9s %-18s %7s %5s  %s" % (
        "row", "role", "GPUs", "t/p/vp/mbs/m", "publ s", "pred s", "err %",
        "MFU % p/s", "TF/s p/s", "peak/cap GiB", "wall s", "RSS",
        "notes"))
    results = []
    for r in todo:
        e = run_row(a, r, a.models_dir, peaks)
        print_line(r["id"], e, e, e["strategy"])
        if "nearest" in e:
            n = e["nearest"]
            print_line("  without " + "+".join(
                FALLBACK[k][1] for k in n["without"]), e, n, n["strategy"])
        results.append(e)
    # Rows not run this time are kept from the last run, in table order.
    old = {}
    if os.path.exists(a.out):
        with open(a.out) as f:
            old = {r["id"]: r for r in json.load(f).get("rows", [])}
    for e in results:
        old[e["id"]] = e
    order = [r["id"] for r in rows]
    merged = [old[i] for i in order if i in old]
    print()
    for line in summary(merged):
        print(line)
    print()
    for n in NOTES:
        print("* " + n)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"description": DESCRIPTION, "kernels": a.kernels,
                   "topology_dir": rel(a.topology_dir), "notes": NOTES,
                   "summary": summary(merged), "rows": merged},
                  f, indent=2, sort_keys=True)
        f.write("\n")
    print("wrote %s" % rel(a.out))


if __name__ == "__main__":
    main()
