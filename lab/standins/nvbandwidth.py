# SPDX-License-Identifier: GPL-3.0-or-later
"""NVIDIA's nvbandwidth for a lab machine: v0.8's command line, its text and JSON (`-j`) output
(tests/data/nvbandwidth holds the real ones), and copy figures that follow the hardware model and
the machine's CURRENT registers.

Testcases: `host_to_device_memcpy_ce`, `device_to_host_memcpy_ce`,
`device_to_device_memcpy_read_ce`, `device_to_device_memcpy_write_ce` (every testcase when no
`-t` is given); an unknown name prints nvbandwidth's `ERROR: Testcase NAME not found!`, a peer
testcase on a machine of one GPU is `Waived:`, as nvbandwidth prints them.  Each cell is valued
from what the node is NOW:

* host <-> device: a copy engine's x16 figure for the generation the GPU's link trained to (Gen3
  13.1, Gen4 26.1, Gen5 55.3 GB/s: the real outputs' H100 Gen5 55.2-55.4, the README's Gen4
  26.0), scaled by the trained width (a GPU at x8 halves it);
* device <-> device over NVLink: the links up right now on both GPUs (`lab fault NODE
  nvlink-down` costs one) x the model's per-link rate x 0.826 (8x H100 NV18: 395 GB/s, as the
  v0.10.0 outputs); over PCIe: the host figure of the slower link x the path class (PIX/PXB 1.0,
  PHB 0.85, NODE 0.83, SYS 0.70: 6x RTX A6000 copy 26.3 within a switch and 21.8-22.7 across);
  a pair without peer access now (`nvidia-smi topo -p2p r` not OK: ACS redirect on the path, no
  P2P across sockets) prints `N/A`, as nvbandwidth prints a pair CUDA gives no peer access;
* `lab fault NODE copy-engine-slow --gpu N`: every copy to, from or between GPU N x0.45,
  while nothing nvidia-smi or NVML shows changes;
* each cell its own run-to-run noise (0.15 %; GPUFLEET_LAB_SEED makes it repeatable).

These constants are the lab's own, deliberately not the collection's copy physics
(plugins/module_utils/diag/_copy_physics.py): the stand-in must not share the bugs of what it
tests.  Like CUDA, only GPUs bound to the `nvidia` driver exist.  A driver fault, no GPUs or a
lost GPU: nvbandwidth's CUDA initialisation fails before any testcase (the message is the lab's
choice, in the `[CUDA_ERROR_...]` shape of nvbandwidth's CU_ASSERT), exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

from lab.hwmodel import Node

SEED_ENV = "GPUFLEET_LAB_SEED"
VERSION = "v0.8"
CUDA_VERSION = 12080

HOST_TO_DEVICE = "host_to_device_memcpy_ce"
DEVICE_TO_HOST = "device_to_host_memcpy_ce"
PEER_READ = "device_to_device_memcpy_read_ce"
PEER_WRITE = "device_to_device_memcpy_write_ce"
#: Each testcase's matrix title, as nvbandwidth prints it.
TITLES = {
    HOST_TO_DEVICE: "memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)",
    DEVICE_TO_HOST: "memcpy CE CPU(row) <- GPU(column) bandwidth (GB/s)",
    PEER_READ: "memcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)",
    PEER_WRITE: "memcpy CE GPU(row) <- GPU(column) bandwidth (GB/s)",
}
HOST_X16_GBPS = {1: 3.3, 2: 6.5, 3: 13.1, 4: 26.1, 5: 55.3, 6: 108.0}
PATH_FACTOR = {"PIX": 1.0, "PXB": 1.0, "PHB": 0.85, "NODE": 0.83, "SYS": 0.70}
NVLINK_EFFICIENCY = 0.826
SLOW_ENGINE_FACTOR = 0.45
RUN_NOISE = 0.0015

#: nvbandwidth v0.8's --help (its README), after the version lines it prints first.
HELP = """nvbandwidth CLI:
  -h [ --help ]                  Produce help message
  -b [ --bufferSize ] arg (=512) Memcpy buffer size in MiB
  -l [ --list ]                  List available testcases
  -t [ --testcase ] arg          Testcase(s) to run (by name or index)
  -p [ --testcasePrefixes ] arg  Testcase(s) to run (by prefix))
  -v [ --verbose ]               Verbose output
  -s [ --skipVerification ]      Skips data verification after copy
  -d [ --disableAffinity ]       Disable automatic CPU affinity control
  -i [ --testSamples ] arg (=3)  Iterations of the benchmark
  -m [ --useMean ]               Use mean instead of median for results
  -j [ --json ]                  Print output in json format instead of plain
                                 text."""


def arg_parser():
    p = argparse.ArgumentParser(prog="nvbandwidth", add_help=False)
    p.add_argument("-h", "--help", action="store_true")
    p.add_argument("-t", "--testcase", action="append", default=[])
    p.add_argument("-b", "--bufferSize", type=int, default=512)
    p.add_argument("-i", "--testSamples", type=int, default=3)
    p.add_argument("-j", "--json", action="store_true")
    for flag in ("-v", "-s", "-d", "-m"):
        p.add_argument(flag, action="store_true")
    return p


class Machine:
    """The GPUs CUDA sees (model indices, bound to nvidia) and what each copy reaches now."""

    def __init__(self, node, rng):
        self.node = node
        self.rng = rng
        self.cuda = [i for i, g in enumerate(node.gpus) if g.driver == "nvidia"]

    def _slow(self, *model_gpus):
        return SLOW_ENGINE_FACTOR if any(self.node.copy_engine_slow(i) for i in model_gpus) else 1.0

    def _noisy(self, value):
        return value * self.rng.gauss(1.0, RUN_NOISE)

    def host(self, i):
        g = self.node.gpus[i]
        return self._noisy(HOST_X16_GBPS.get(g.gen_current, 1.0) * g.width_current / 16.0 * self._slow(i))

    def peer(self, i, j):
        """GB/s between model GPUs i and j, or None (N/A) without peer access."""
        if self.node.p2p_status(i, j, "read") != "OK":
            return None
        nvlink = self.node.nvlink_path(i, j)
        if nvlink:
            links, rate = nvlink
            value = links * rate * NVLINK_EFFICIENCY
        else:
            gi, gj = self.node.gpus[i], self.node.gpus[j]
            gen = min(gi.gen_current, gj.gen_current)
            width = min(gi.width_current, gj.width_current)
            value = HOST_X16_GBPS.get(gen, 1.0) * width / 16.0 * PATH_FACTOR[self.node.pcie_link_type(i, j)]
        return self._noisy(value * self._slow(i, j))

    def matrix(self, testcase):
        """Rows of cells (None: N/A) for one testcase, nvbandwidth's layout."""
        if testcase in (HOST_TO_DEVICE, DEVICE_TO_HOST):
            return [[self.host(i) for i in self.cuda]]
        return [[None if a == b else self.peer(i, j) for b, j in enumerate(self.cuda)] for a, i in enumerate(self.cuda)]


def _cells_sum(rows):
    return sum(v for row in rows for v in row if v is not None)


def print_text(out, header, device_lines, results):
    print(header, file=out)
    for line in device_lines:
        print("Device %s" % line, file=out)
    print("", file=out)
    for name, status, rows in results:
        if status == "not found":
            print("ERROR: Testcase %s not found!" % name, file=out)
            continue
        if status == "waived":
            print("Waived: ", file=out)
            continue
        print("Running %s." % name, file=out)
        print(TITLES[name], file=out)
        print("  " + "".join("%10d" % c for c in range(len(rows[0]))), file=out)
        for r, row in enumerate(rows):
            print("%2d" % r + "".join("%10s" % ("N/A" if v is None else "%.2f" % v) for v in row), file=out)
        print("", file=out)
        print("SUM %s %.2f" % (name, _cells_sum(rows)), file=out)
        print("", file=out)
    print("NOTE: The reported results may not reflect the full capabilities of the platform.", file=out)
    print("Performance can vary with software drivers, hardware clocks, and system topology.", file=out)


def print_json(out, node, device_lines, results):
    testcases = []
    for name, status, rows in results:
        item = {"name": name, "status": {"not found": "ERROR"}.get(status, status.capitalize())}
        if rows is not None:
            item["bandwidth_description"] = TITLES[name] + " "
            item["bandwidth_matrix"] = [["N/A" if v is None else "%.6g" % v for v in row] for row in rows]
            item["sum"] = _cells_sum(rows)
        testcases.append(item)
    document = {
        "nvbandwidth": {
            "CUDA Runtime Version": CUDA_VERSION,
            "Driver Version": node.driver_version,
            "GPU Device list": device_lines,
            "git_version": VERSION,
            "testcases": testcases,
            "version": VERSION,
        }
    }
    print(json.dumps(document, indent="\t", sort_keys=True), file=out)


def main(argv=None):
    args = arg_parser().parse_args(argv)
    out = sys.stdout
    try:
        node = Node.load()
    except RuntimeError as e:
        print("nvbandwidth (lab): %s" % e, file=sys.stderr)
        return 2
    header = "nvbandwidth Version: %s\nBuilt from Git version: %s\n" % (VERSION, VERSION)
    if args.help:
        print(header, file=out)
        print(HELP, file=out)
        return 0
    machine = Machine(node, random.Random(os.environ.get(SEED_ENV) or None))
    lost = any(node.gpu_lost(i) for i in machine.cuda)
    if node.driver_fault() or not machine.cuda or lost:
        print(header, file=out)
        print(
            "[CUDA_ERROR_NO_DEVICE] in expression cuInit(0) in nvbandwidth.cpp (lab: no CUDA device reachable)",
            file=out,
        )
        return 1
    header += "\nCUDA Runtime Version: %d\nCUDA Driver Version: %d\nDriver Version: %s\n" % (
        CUDA_VERSION,
        CUDA_VERSION,
        node.driver_version,
    )
    device_lines = [
        "%d: %s (%s)" % (c, node.gpus[i].name, node.gpus[i].bdf.rsplit(".", 1)[0].replace("0000:", "00000000:", 1))
        for c, i in enumerate(machine.cuda)
    ]
    results = []
    for name in args.testcase or list(TITLES):
        if name not in TITLES:
            results.append((name, "not found", None))
        elif name in (PEER_READ, PEER_WRITE) and len(machine.cuda) < 2:
            results.append((name, "waived", None))
        else:
            results.append((name, "passed", machine.matrix(name)))
    if args.json:
        print_json(out, node, device_lines, results)
    else:
        print_text(out, header, device_lines, results)
    return 0
