#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark: the collection's ACS audit against the 4x L40S field report's one-setpci-per-device loop.

Builds a lab machine of 256 PCI functions with lab.hwmodel: 8 root ports, each with a Gen5
switch of 15 downstream ports holding 2 H100 GPUs, 1 ConnectX-7 and 12 NVMe drives (16 GPUs,
8 RDMA NICs, 96 NVMe drives, 136 bridges in all). Then it times, in the same run and on the
same tree:

* the audit ``pcie_acs_info`` runs (``_topology.PciTopology.scan(...).audit()``), in this process and
  as a fresh Python process (interpreter start-up included);
* the 4x L40S field report's approach: list the devices with ``lspci``, then one ``setpci -v -s BDF
  ECAP_ACS+0x6.w`` process per device (read only; the seed's loop then writes).

Usage: python3 benchmarks/bench_acs_audit.py [--repeat N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for entry in (REPO / ".collections", REPO):
    sys.path.insert(0, str(entry))

import lab.hwmodel as hw  # noqa: E402
from ansible_collections.gpufleet.node.plugins.module_utils.pcie import _topology  # noqa: E402
from lab.hwmodel import profiles as P  # noqa: E402

PROFILE = "bench-256"
ROOT_PORTS = 8
CHILDREN = 15  # per switch: 2 GPUs + 1 NIC + 12 NVMe -> 2 + 2*15 = 32 functions per root port
# An NVMe drive, laid out by the model like any other endpoint below a switch port (the model
# calls every non-GPU endpoint a NIC; the audit goes by class code: 0x0108 is not a NIC).
NVME = {
    "name": "Samsung NVMe SSD Controller PM173X",
    "vendor_id": 0x144D,
    "device_id": 0xA824,
    "class": 0x010802,
    "gen_max": 4,
    "width_max": 4,
}


def bench_profile():
    def children():
        return [P.gpu("H100-SXM"), P.gpu("H100-SXM"), P.nic("CX7")] + [P.nic("bench-nvme") for _ in range(CHILDREN - 3)]

    return {
        "description": "Benchmark: 256 PCI functions, 8 Gen5 switches with ACS on",
        "cpu": {"sockets": 1, "cpulists": ["0-63"]},
        "kernel_cmdline": "BOOT_IMAGE=/boot/vmlinuz ro intel_iommu=on",
        "iommu": {"vendor": "intel", "group_type": "DMA-FQ"},
        "interconnect": {"p2p_across_sockets": True},
        "host_bridges": [
            {
                "bus": 0x00,
                "numa_node": 0,
                "root_ports": [
                    P.root_port("intel-rp", P.switch("pex-gen5", children()), dev=n + 1, fn=0)
                    for n in range(ROOT_PORTS)
                ],
            }
        ],
        "expect_registered": False,
    }


def build(root):
    P.PROFILES[PROFILE] = bench_profile()
    P.NIC_MODELS["bench-nvme"] = NVME
    try:
        return hw.build(PROFILE, root)
    finally:
        del P.PROFILES[PROFILE]
        del P.NIC_MODELS["bench-nvme"]


def audit_in_process(sysfs):
    return _topology.PciTopology.scan(sysfs).audit()


AUDIT_SNIPPET = (
    "import sys; sys.path.insert(0, %r)\n"
    "from ansible_collections.gpufleet.node.plugins.module_utils.pcie._topology import PciTopology\n"
    "a = PciTopology.scan(%r).audit(); print(a['summary']['blocked_gpu_pairs'])\n"
)


def audit_fresh_process(sysfs):
    subprocess.run(
        [sys.executable, "-c", AUDIT_SNIPPET % (str(REPO / ".collections"), sysfs)], check=True, capture_output=True
    )


def seed_loop(sysfs):
    """The 4x L40S field report's loop, read half: `lspci` to list, then one setpci per device."""
    opt = ["-O", "sysfs.path=%s" % sysfs]
    listing = subprocess.run(["lspci", *opt, "-D", "-d", "*:*:*"], check=True, capture_output=True, text=True).stdout
    values = {}
    for line in listing.splitlines():
        bdf = line.split()[0]
        proc = subprocess.run(["setpci", *opt, "-v", "-s", bdf, "ECAP_ACS+0x6.w"], capture_output=True, text=True)
        if proc.returncode == 0:
            values[bdf] = int(proc.stdout.split()[-1], 16)
    return values


def best_of(func, repeat):
    times = []
    result = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = func()
        times.append(time.perf_counter() - start)
    return min(times), result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per method; the best is kept")
    parser.add_argument("--keep", help="build the tree here and keep it")
    args = parser.parse_args()
    for tool in ("lspci", "setpci"):
        if not shutil.which(tool):
            sys.exit("%s not found: install the Debian/Ubuntu package pciutils" % tool)

    root = args.keep or tempfile.mkdtemp(prefix="bench-acs-")
    try:
        node = build(root)
        sysfs = str(node.sysfs)
        functions = len(os.listdir(os.path.join(sysfs, "devices")))

        t_audit, audit = best_of(lambda: audit_in_process(sysfs), args.repeat)
        t_fresh, _ = best_of(lambda: audit_fresh_process(sysfs), args.repeat)
        # The floor of any fresh process: this interpreter starting and doing nothing.
        t_python, _ = best_of(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), args.repeat)
        t_seed, seed_values = best_of(lambda: seed_loop(sysfs), max(1, min(args.repeat, 3)))

        # Both read the same registers.
        ours = {p["bdf"]: p["acs_ctl"] for p in audit["ports"] if p["acs_ctl"] is not None}
        if ours != seed_values:
            sys.exit("the two methods disagree: %r vs %r" % (ours, seed_values))

        s = audit["summary"]
        print(
            "tree: %d PCI functions (%d GPUs, %d RDMA NICs, %d bridges, %d ACS-capable ports), %s"
            % (
                functions,
                s["gpus"],
                s["nics"],
                sum(1 for p in audit["ports"] if p["is_bridge"]),
                s["acs_capable_ports"],
                sysfs,
            )
        )
        print("audit also computes %d GPU pairs and %d GPU-NIC pairs" % (s["gpu_pairs"], len(audit["gpu_nic_pairs"])))
        print("%-58s %9.1f ms" % ("the 4x L40S field report loop (lspci + one setpci per device)", t_seed * 1000))
        print("%-58s %9.1f ms" % ("pcie audit, in process (what pcie_acs_info runs)", t_audit * 1000))
        print("%-58s %9.1f ms" % ("pcie audit, fresh python process", t_fresh * 1000))
        print("%-58s %9.1f ms" % ("(python -c pass: interpreter start-up alone)", t_python * 1000))
        print(
            "speed-up in process: %.0fx; as a fresh process: %.1fx (target >= 10x); "
            "the fresh process minus start-up: %.0fx"
            % (t_seed / t_audit, t_seed / t_fresh, t_seed / max(t_fresh - t_python, 1e-6))
        )
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
