# SPDX-License-Identifier: GPL-3.0-or-later
"""nccl-tests' `all_reduce_perf` for a lab machine: the real output format, a bandwidth that
follows the hardware model and the CURRENT registers of the machine's sysfs tree.

The machine is the one `lab.hwmodel.build()` laid out under $GPUFLEET_LAB_ROOT.  Bus bandwidth
comes from the best ring through the GPUs, each hop valued from what the node is NOW:

* NVLink (`NV#` between the two GPUs): 0.979 of the model's rate per link that is up right now
  (26.0 of the H100's 26.562 GB/s; 8x H100 NV18: ~470 GB/s at the largest sizes; one link down,
  `lab fault NODE nvlink-down`, costs 1/18), whatever the PCIe bridges do;
* PCIe: the practical x16 peak of the generation the two links trained to (Gen3 ~12, Gen4 ~24,
  Gen5 ~47.5 GB/s) scaled by the trained width (a GPU at x8 halves its hops) and by the path
  class (PIX 1.0 ... SYS 0.52); if any bridge on the path has ACS ReqRedir, CmpltRedir or
  EgressCtrl set right now (`Node.redirected`), the traffic goes up through the root complex:
  x0.48; with P2P off (NCCL_P2P_DISABLE=1, NCCL_P2P_LEVEL below the path, or across sockets
  on a machine without cross-socket P2P) NCCL copies through host memory: x0.72;
* small sizes ramp up (half the peak at about peak x 25 kB: ~0.6 MB on PCIe Gen4, ~12 MB on
  NVLink);
* spread like real hardware at large messages: each machine has its own factor (its silicon,
  riser and firmware lottery; a gaussian of 0.5 %, at most 1.5 %, fixed by its host name,
  GPUFLEET_LAB_HOSTNAME where several machines share one) and
  each figure its own run-to-run noise (0.4 %; GPUFLEET_LAB_SEED makes it repeatable): about
  1 % between runs and nodes, as nccl-tests outputs of healthy 8x H100/H200 show.

These constants are the lab's own, deliberately not the collection's threshold model
(plugins/module_utils/nccl/): the stand-in must not share the bugs of what it tests.

Like CUDA, only GPUs bound to the `nvidia` driver exist (CUDA_VISIBLE_DEVICES, by index or UUID,
filters further);
`-g` beyond them fails with nccl-tests' "invalid device ordinal".

Flags honoured: -b -e -f -i -g -t -n -w -c -d -o -T (and their long forms); -J FILE writes the
results as JSON too.  NCCL_DEBUG=INFO interleaves NCCL log lines as the real library does.
Faults, from the machine's health state (`lab fault NODE allreduce-KIND`): `wrong` (wrong results
from 1 MB up, `FAILED` footer, exit 1), `hang` (stops after a few rows until killed, or until -T
expires), `truncate` (dies mid-table, killed by SIGKILL like the OOM killer would), `crash` (an
NCCL failure before the first row, exit 1), `slow` (every figure x 0.93: a node slower than its
peers for a reason the facts do not show, such as a GPU held back by its clocks).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import socket
import sys
import time

from lab.hwmodel import Node

SEED_ENV = "GPUFLEET_LAB_SEED"
#: The machine's host name where several lab machines share one (tests running them locally).
HOST_ENV = "GPUFLEET_LAB_HOSTNAME"

PCIE_X16_PEAK = {1: 3.0, 2: 6.0, 3: 12.2, 4: 24.3, 5: 47.5, 6: 90.0}
PATH_FACTOR = {"PIX": 1.0, "PXB": 0.98, "PHB": 0.96, "NODE": 0.74, "SYS": 0.52}
P2P_LEVELS = ["LOC", "PIX", "PXB", "PHB", "NODE", "SYS"]
REDIRECT_FACTOR = 0.48
HOST_MEMORY_FACTOR = 0.72
#: The share of an NVLink's rate (the model's `nvlink_gbps`) an all-reduce's bus bandwidth reaches:
#: 26.0 GB/s per link of an H100's 26.562.
NVLINK_EFFICIENCY = 0.979
RAMP_BYTES_PER_GBPS = 25_000
NODE_SPREAD, NODE_SPREAD_MAX = 0.005, 0.015
RUN_NOISE = 0.004
SLOW_FACTOR = 0.93
LATENCY_US = {"pcie": 11.0, "nvlink": 14.0}

TYPES = {
    "int8": 1,
    "char": 1,
    "uint8": 1,
    "int32": 4,
    "int": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
    "half": 2,
    "float16": 2,
    "float": 4,
    "float32": 4,
    "double": 8,
    "float64": 8,
    "bfloat16": 2,
    "f8e4m3": 1,
    "f8e5m2": 1,
}
OPS = ("sum", "prod", "max", "min", "avg", "mulsum")


def parse_size(text):
    text = text.strip()
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    if text and text[-1].lower() in units:
        return int(float(text[:-1]) * units[text[-1].lower()])
    return int(text)


def arg_parser():
    p = argparse.ArgumentParser(prog="all_reduce_perf", add_help=True)
    p.add_argument("-t", "--nthreads", type=int, default=1)
    p.add_argument("-g", "--ngpus", type=int, default=1)
    p.add_argument("-b", "--minbytes", type=parse_size, default=32 << 20)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=32 << 20)
    p.add_argument("-i", "--stepbytes", type=parse_size, default=1 << 20)
    p.add_argument("-f", "--stepfactor", type=int, default=None)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-m", "--agg_iters", type=int, default=1)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("-p", "--parallel_init", type=int, default=0)
    p.add_argument("-c", "--check", type=int, default=1)
    p.add_argument("-o", "--op", default="sum")
    p.add_argument("-d", "--datatype", default="float")
    p.add_argument("-r", "--root", type=int, default=0)
    p.add_argument("-z", "--blocking", type=int, default=0)
    p.add_argument("-G", "--cudagraph", type=int, default=0)
    p.add_argument("-a", "--average", type=int, default=1)
    p.add_argument("-T", "--timeout", type=int, default=0)
    p.add_argument("-J", "--output_file", default=None)
    return p


def node_factor(node, host):
    """This machine's own factor around 1.0, the same at every run (seeded by its host name and
    its GPUs' UUIDs: the lab derives the UUIDs from the profile alone)."""
    seed = host + "/" + ",".join(sorted(str(g.uuid) for g in node.gpus))
    draw = random.Random("node-spread:" + seed).gauss(1.0, NODE_SPREAD)
    return min(1.0 + NODE_SPREAD_MAX, max(1.0 - NODE_SPREAD_MAX, draw))


def slow_factor(fault):
    """SLOW_FACTOR for the `slow` fault, 1.0 for any other."""
    return SLOW_FACTOR if fault == "slow" else 1.0


class Machine:
    """The GPUs CUDA would see, and what each ring hop between them carries right now."""

    def __init__(self, node, env):
        self.node = node
        self.env = env
        cuda = [i for i, g in enumerate(node.gpus) if g.driver == "nvidia"]
        visible = env.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            by_uuid = {node.gpus[i].uuid: i for i in cuda}
            picked = []
            for item in (v.strip() for v in visible.split(",") if v.strip()):
                if item.isdigit() and int(item) < len(cuda):
                    picked.append(cuda[int(item)])
                elif item in by_uuid:
                    picked.append(by_uuid[item])
                else:
                    break  # CUDA stops at the first invalid entry
            cuda = picked
        self.cuda = cuda  # model GPU index per CUDA device

    def _p2p_allowed(self, cls):
        if str(self.env.get("NCCL_P2P_DISABLE", "0")) not in ("0", ""):
            return False
        level = str(self.env.get("NCCL_P2P_LEVEL", "")).upper()
        if level in ("NVL",):
            return False
        if level in P2P_LEVELS:
            return P2P_LEVELS.index(cls) <= P2P_LEVELS.index(level)
        if level.isdigit():
            return P2P_LEVELS.index(cls) <= int(level)
        if cls == "SYS" and not self.node.data["interconnect"]["p2p_across_sockets"]:
            return False
        return True

    def hop(self, a, b):
        """(busbw peak GB/s, transport) between CUDA devices a and b."""
        i, j = self.cuda[a], self.cuda[b]
        nvlink = self.node.nvlink_path(i, j)
        if nvlink:
            # Only the links up right now carry traffic (a link down costs its share: 1/18 on H100).
            links, rate = nvlink
            return links * rate * NVLINK_EFFICIENCY, "P2P/CUMEM/NVLink"
        kind = self.node.pcie_link_type(i, j)
        gi, gj = self.node.gpus[i], self.node.gpus[j]
        gen = min(gi.gen_current, gj.gen_current)
        width = min(gi.width_current, gj.width_current)
        peak = PCIE_X16_PEAK.get(gen, 1.0) * width / 16.0 * PATH_FACTOR[kind]
        if not self._p2p_allowed(kind):
            return peak * HOST_MEMORY_FACTOR, "SHM/direct/direct"
        if self.node.redirected(i, j):
            return peak * REDIRECT_FACTOR, "P2P/IPC/read"
        return peak, "P2P/IPC/read"

    def ring(self, n):
        """Best ring over the first n CUDA devices: (peak busbw, order, transports)."""
        hops = {(a, b): self.hop(a, b) for a in range(n) for b in range(n) if a != b}
        best = None
        for perm in itertools.permutations(range(1, n)):
            order = (0,) + perm
            weakest = min(hops[(order[k], order[(k + 1) % n])][0] for k in range(n))
            if best is None or weakest > best[0]:
                best = (weakest, order)
        peak, order = best
        transports = [hops[(order[k], order[(k + 1) % n])][1] for k in range(n)]
        return peak, order, transports


def sizes(args, typesize):
    out, size = [], args.minbytes
    while size <= args.maxbytes:
        out.append(size - size % typesize)
        if args.stepfactor and args.stepfactor > 1:
            size *= args.stepfactor
        else:
            size += max(args.stepbytes, 1)
        if size == 0:
            size = typesize
    return out


def fmt_time(us):
    if us >= 10000.0:
        return "%7.0f" % us
    if us >= 100.0:
        return "%7.1f" % us
    return "%7.2f" % us


def main(argv=None):
    args = arg_parser().parse_args(argv)
    out = sys.stdout
    env = os.environ
    try:
        node = Node.load()
    except RuntimeError as e:
        print(f"all_reduce_perf (lab): {e}", file=sys.stderr)
        return 2
    fault = node.allreduce_fault() or ""
    rng = random.Random(env.get(SEED_ENV) or None)
    host = env.get(HOST_ENV) or socket.gethostname().split(".")[0]
    pid = os.getpid()
    machine = Machine(node, env)
    ngpus = args.ngpus * args.nthreads
    typesize = TYPES.get(args.datatype)
    if typesize is None or args.op not in OPS:
        print(f"{host}: Test failure common.cu:1 invalid type or op", file=out)
        return 1
    debug = str(env.get("NCCL_DEBUG", "")).upper() == "INFO"

    step = ("%d(factor)" % args.stepfactor) if args.stepfactor else ("%d(bytes)" % args.stepbytes)
    print("# Collective test starting: all_reduce_perf", file=out)
    print(
        "# nThread %d nGpus %d minBytes %d maxBytes %d step: %s warmup iters: %d iters: %d agg iters: %d "
        "validation: %d graph: %d"
        % (
            args.nthreads,
            args.ngpus,
            args.minbytes,
            args.maxbytes,
            step,
            args.warmup_iters,
            args.iters,
            args.agg_iters,
            args.check,
            args.cudagraph,
        ),
        file=out,
    )
    print("#", file=out)
    print("# Using devices", file=out)
    if ngpus > len(machine.cuda):
        print(f"{host}: Test CUDA failure common.cu:1227 'invalid device ordinal'", file=out)
        print(f" .. {host} pid {pid}: Test failure common.cu:1090", file=out)
        out.flush()
        return 1
    for rank in range(ngpus):
        g = node.gpus[machine.cuda[rank]]
        dom, bus, rest = g.bdf.split(":")
        print(
            "#  Rank %2d Group  0 Pid %6d on %10s device %2d [%s:%s:%s] %s"
            % (rank, pid, host, rank, dom, bus, rest.split(".")[0], g.name),
            file=out,
        )
    ring_peak, order, transports = machine.ring(ngpus) if ngpus > 1 else (0.0, (0,), [])
    ring_peak *= node_factor(node, host) * slow_factor(fault)
    if debug:
        tid = pid + 11
        print(f"{host}:{pid}:{pid} [0] NCCL INFO Bootstrap : Using eth0:10.20.0.{2 + len(host) % 200}<0>", file=out)
        print(f"{host}:{pid}:{pid} [0] NCCL INFO cudaDriverVersion 12080", file=out)
        print(f"{host}:{pid}:{pid} [0] NCCL INFO NCCL version 2.26.5+cuda12.8", file=out)
        for rank in range(ngpus):
            print(
                f"{host}:{pid}:{tid + rank} [{rank}] NCCL INFO ncclCommInitAll comm 0x55d0c0{rank:04x} rank {rank} "
                f"nranks {ngpus} cudaDev {rank} nvmlDev {machine.cuda[rank]} busId "
                f"{node.gpus[machine.cuda[rank]].bdf[5:7]}000 commId 0x3c1f0a2d9e8b7c61 - Init START",
                file=out,
            )
        print(f"{host}:{pid}:{tid} [0] NCCL INFO Channel 00/02 : " + " ".join(str(r) for r in order), file=out)
        for rank in range(ngpus):
            print(
                f"{host}:{pid}:{tid + rank} [{rank}] NCCL INFO ncclCommInitAll comm 0x55d0c0{rank:04x} rank {rank} "
                f"nranks {ngpus} cudaDev {rank} nvmlDev {machine.cuda[rank]} busId "
                f"{node.gpus[machine.cuda[rank]].bdf[5:7]}000 commId 0x3c1f0a2d9e8b7c61 - Init COMPLETE",
                file=out,
            )
    print("#", file=out)
    print(
        "#                                                              out-of-place                       in-place          ",
        file=out,
    )
    print(
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
        file=out,
    )
    print(
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       ",
        file=out,
    )
    if debug and ngpus > 1:
        for k in range(len(order)):
            a, b = order[k], order[(k + 1) % len(order)]
            print(
                f"{host}:{pid}:{pid + 40} [{a}] NCCL INFO Channel 00/0 : {a}[{a}] -> {b}[{b}] via {transports[k]}",
                file=out,
            )
        print(f"{host}:{pid}:{pid + 40} [0] NCCL INFO Connected all rings", file=out)
    out.flush()
    if fault == "crash":
        print(f"\n{host}:{pid}:{pid} [0] enqueue.cc:1500 NCCL WARN Cuda failure 1 'invalid argument'", file=out)
        print(
            f"{host}: Test NCCL failure common.cu:392 'unhandled cuda error (run with NCCL_DEBUG=INFO for details) / '",
            file=out,
        )
        print(f" .. {host} pid {pid}: Test failure common.cu:590", file=out)
        out.flush()
        return 1

    deadline = time.monotonic() + args.timeout if args.timeout > 0 else None
    factor = 2.0 * (ngpus - 1) / ngpus
    kind = "nvlink" if transports and all("NVLink" in t for t in transports) else "pcie"
    half = max(ring_peak, 1.0) * RAMP_BYTES_PER_GBPS
    results, errors, bw_sum, bw_count = [], 0, 0.0, 0
    size_list = sizes(args, typesize)
    for n, size in enumerate(size_list):
        if fault == "hang" and n >= min(3, len(size_list) - 1):
            out.flush()
            while True:
                if deadline is not None and time.monotonic() > deadline:
                    print(f"{host}: Test timeout (-T {args.timeout}) expired, aborting", file=out)
                    out.flush()
                    return 1
                time.sleep(0.2)
        if fault == "truncate" and n >= len(size_list) // 2 and n > 0:
            out.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        count = size // typesize
        cells = []
        for _place in ("oop", "ip"):
            if ngpus > 1 and size > 0:
                peak_alg = ring_peak * rng.gauss(1.0, RUN_NOISE) / factor
                time_us = LATENCY_US[kind] + size / (peak_alg * 1e3) * (1.0 + half / (size + 65536.0))
                algbw = size / (time_us * 1e3)
                busbw = algbw * factor
            else:
                time_us = (0.14 if size == 0 else 3.5) * rng.uniform(0.95, 1.05)
                algbw = size / (time_us * 1e3)
                busbw = 0.0
            if not args.check:
                wrong = "N/A"
            elif fault == "wrong" and size >= (1 << 20):
                w = max(1, count // 7)
                errors += w
                wrong = str(w)
            else:
                wrong = "0"
            cells.append((time_us, algbw, busbw, wrong))
            bw_sum += busbw
            bw_count += 1
        line = "%12li  %12li  %8s  %6s  %6i" % (size, count, args.datatype, args.op, -1)
        for time_us, algbw, busbw, wrong in cells:
            line += "  %7s  %6.2f  %6.2f  %5s" % (fmt_time(time_us), algbw, busbw, wrong)
        print(line, file=out)
        results.append(
            {
                "size": size,
                "count": count,
                "type": args.datatype,
                "redop": args.op,
                "root": -1,
                "out_of_place": dict(zip(("time", "algbw", "busbw", "wrong"), cells[0], strict=False)),
                "in_place": dict(zip(("time", "algbw", "busbw", "wrong"), cells[1], strict=False)),
            }
        )
    avg = bw_sum / bw_count if bw_count else 0.0
    min_bw = env.get("NCCL_TESTS_MIN_BW")
    verdict = "" if min_bw is None else ("FAILED" if avg < float(min_bw) * 0.9 else "OK")
    print("# Out of bounds values : %d %s" % (errors, "FAILED" if errors else "OK"), file=out)
    print("# Avg bus bandwidth    : %g %s" % (avg, verdict), file=out)
    print("#", file=out)
    print("# Collective test concluded: all_reduce_perf", file=out)
    print("#", file=out)
    if args.output_file:
        with open(args.output_file, "w") as f:
            json.dump(
                {
                    "collective": "all_reduce_perf",
                    "nranks": ngpus,
                    "results": results,
                    "out_of_bounds": errors,
                    "avg_busbw": avg,
                },
                f,
                indent=1,
            )
    out.flush()
    return 1 if errors or verdict == "FAILED" else 0


if __name__ == "__main__":
    sys.exit(main())
