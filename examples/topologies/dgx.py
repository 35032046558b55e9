#!/usr/bin/env python3
"""Writes the DGX cluster files dgx-a100-N.json and dgx-h100-N.json.

    python3 examples/topologies/dgx.py [--check]

--check compares the files on disk with what this script writes and exits 1
if any differs. Sources of every figure: examples/topologies/README.md
("DGX A100 and DGX H100 clusters"). The `nccl` objects are fitted to
published nccl-tests bus bandwidths (bench/README.md, bench-collectives).
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

SYSTEMS = {
    # NVIDIA DGX A100 80GB as in NVIDIA Selene (Narayanan et al., SC21):
    # NVLink 3 via NVSwitch, 600 GB/s bidirectional = 300 GB/s = 2400 Gb/s
    # per direction per GPU; PCIe 4.0 x16 (252 Gb/s) from each GPU and NIC
    # to its PCIe switch; 8 x 200 Gb/s HDR InfiniBand, one per GPU;
    # SuperPOD scalable units of 20 nodes under a non-blocking fat tree.
    "a100": {
        "device": "A100-SXM4-80GB",
        "title": "NVIDIA DGX A100 80GB (8 A100 SXM4 80 GB)",
        "nvswitch_gbps": 2400,
        "pcie_gbps": 252,
        "nic_gbps": 200,
        "nic_name": "HDR",
        "su": 20,
        "sizes": [4, 8, 16, 32, 64, 128, 192, 240, 315, 384],
        "nccl": {
            # Fitted to the 8-GPU all-reduce curve of Azure ND A100 v4 (8 x
            # A100 SXM4 80 GB on NVSwitch, NCCL 2.18.5), 1 MiB to 8 GiB.
            "launch_us": 0,
            "links": {
                "nvswitch": {"efficiency": 0.79, "step_latency_us": 0.75},
                "pcie": {"step_latency_us": 0},
                # 192 GB/s all-reduce busbw over 8 x 200 Gb/s HDR per node
                # (AddyLaddy, NVIDIA, in NVIDIA/nccl#812): 192/200.
                "network": {"efficiency": 0.96, "step_latency_us": 1.5},
            },
        },
    },
    # NVIDIA DGX H100: NVLink 4 via NVSwitch, 900 GB/s bidirectional = 450
    # GB/s = 3600 Gb/s per direction per GPU; PCIe 5.0 x16 (504 Gb/s);
    # 8 x 400 Gb/s NDR InfiniBand, one per GPU; SuperPOD scalable units of
    # 32 nodes (as dgx-h100-128.json).
    "h100": {
        "device": "H100-SXM",
        "title": "NVIDIA DGX H100 (8 H100 SXM5)",
        "nvswitch_gbps": 3600,
        "pcie_gbps": 504,
        "nic_gbps": 400,
        "nic_name": "NDR",
        "su": 32,
        "sizes": [4, 16, 32, 64, 256],
        "nccl": {
            # Launch, NVSwitch efficiency and step latency fitted to the
            # 8-GPU ring reduce-scatter of NVIDIA/nccl#1047 (311 to 362 GB/s
            # busbw, 128 MiB to 8 GiB); NVLS efficiency and step latency
            # to the 8-GPU NVLS all-reduce curve of Azure ND H100 v5 (NCCL
            # 2.18.5), 1 MiB to 8 GiB, with that launch.
            "launch_us": 20,
            "nvls_efficiency": 0.74,
            "nvls_step_latency_us": 3.3,
            "links": {
                "nvswitch": {"efficiency": 0.81, "step_latency_us": 0.25},
                "pcie": {"step_latency_us": 0},
                # CX-7 at NDR "should achieve up to 48-49GB/s per NIC"
                # (AddyLaddy, NVIDIA, NVIDIA/nccl-tests#267): 48.5/50.
                "network": {"efficiency": 0.97, "step_latency_us": 1.5},
            },
        },
    },
}


def cluster(kind, nodes):
    s = SYSTEMS[kind]
    racks = (nodes + s["su"] - 1) // s["su"]
    where = (
        f"racks of {s['su']} nodes (a SuperPOD scalable unit) under a "
        f"non-blocking spine"
        if racks > 1
        else "one leaf (at most one SuperPOD scalable unit)"
    )
    doc = {
        "$schema": "../../schemas/topology.schema.json",
        "name": f"dgx-{kind}-{nodes}",
        "description": (
            f"{nodes} x {s['title']}: {nodes * 8} GPUs, NVSwitch inside each "
            f"node, 8 x {s['nic_gbps']} Gb/s {s['nic_name']} InfiniBand per "
            f"node (one per GPU), {where}; NCCL calibration from published "
            f"nccl-tests results (examples/topologies/README.md)"
        ),
        "device": s["device"],
        "nodes": nodes,
        "node": {
            "gpus": 8,
            "intra": {
                "kind": "nvswitch",
                "bandwidth_gbps": s["nvswitch_gbps"],
                "latency_us": 0.5,
            },
            "pcie": {"bandwidth_gbps": s["pcie_gbps"], "latency_us": 0.5},
        },
        "inter": {
            "nics_per_node": 8,
            "bandwidth_gbps": s["nic_gbps"],
            "latency_us": 1.0,
        },
    }
    if racks > 1:
        # Non-blocking: a rack's uplink carries every NIC of a full rack.
        doc["racks"] = {
            "nodes_per_rack": s["su"],
            "uplink_bandwidth_gbps": s["su"] * 8 * s["nic_gbps"],
            "uplink_latency_us": 0.5,
        }
    doc["nccl"] = s["nccl"]
    return doc


def render(doc):
    # One line per top-level object, like the hand-written files.
    lines = ["{"]
    items = list(doc.items())
    for i, (k, v) in enumerate(items):
        comma = "," if i + 1 < len(items) else ""
        if k == "node":
            inner = ",\n".join(
                f"    {json.dumps(nk)}: {json.dumps(nv)}" for nk, nv in v.items()
            )
            lines.append(f'  "node": {{\n{inner}\n  }}{comma}')
        else:
            lines.append(f"  {json.dumps(k)}: {json.dumps(v)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main():
    check = sys.argv[1:] == ["--check"]
    if sys.argv[1:] and not check:
        sys.exit("usage: dgx.py [--check]")
    stale = []
    for kind, s in SYSTEMS.items():
        for n in s["sizes"]:
            path = os.path.join(HERE, f"dgx-{kind}-{n}.json")
            text = render(cluster(kind, n))
            if check:
                with open(path) as f:
                    if f.read() != text:
                        stale.append(path)
                continue
            with open(path, "w") as f:
                f.write(text)
    if stale:
        sys.exit("stale (rerun examples/topologies/dgx.py): " + " ".join(stale))


if __name__ == "__main__":
    main()
