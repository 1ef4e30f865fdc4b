#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark: how long a wedged engine takes to leave rotation, per backend, and to come back.

It brings up a lab of its own (a vLLM node, ``l40s-4x-switch``, and a llama.cpp node,
``a6000-4090-hetero``; state in ``.lab-state/bench-probe``), converges it with site.yml (the
serving prober installed by role lb_registration), then per backend, ``--rounds`` times:

* vLLM: ``python -m lab fault NODE engine-wedge`` (the stand-in's /health and /metrics answer,
  completions never return), then ``systemctl restart vllm.service`` and ``lab fault NODE clear``;
* llama.cpp: ``kill -STOP`` on llama-server's main PID, then ``kill -CONT``;

and prints the seconds from the wedge until HAProxy (the lab's own reader of the runtime API)
reports the server out of rotation, and from the end of the wedge until it is back. The target is
at most 30 s to leave (the prober's interval, 5 s, and deadline, 10 s, and the agent's check,
2 s). This is not a test: it takes minutes; run it on demand, as root, on an otherwise idle
machine:

    .venv/bin/python benchmarks/bench_probe_wedge.py [--rounds N] [--json FILE] [--keep]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.harness.lab import Lab, lab_prerequisites  # noqa: E402

PROFILES = ["l40s-4x-switch", "a6000-4090-hetero"]
TARGET_S = 30.0
BOUND_S = 180.0  # a prober that does not work: give up


def _until(lab, node, running):
    t0 = time.monotonic()
    while time.monotonic() - t0 < BOUND_S:
        if (lab.pool().get(node, {}).get("op_state") == "running") == running:
            return time.monotonic() - t0
        time.sleep(0.2)
    raise SystemExit(f"{node}: not {'back in' if running else 'out of'} rotation after {BOUND_S:.0f} s")


def vllm_round(lab, node):
    lab.lab("fault", node, "engine-wedge")
    out = _until(lab, node, running=False)
    lab.sh(node, "systemctl restart vllm.service")
    lab.lab("fault", node, "clear")
    back = _until(lab, node, running=True)
    return out, back


def llamacpp_round(lab, node):
    pid = lab.sh(node, "systemctl show -p MainPID --value llama-server.service").strip()
    lab.sh(node, f"kill -STOP {pid}")
    try:
        out = _until(lab, node, running=False)
    finally:
        lab.sh(node, f"kill -CONT {pid}")
    back = _until(lab, node, running=True)
    return out, back


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default="", help="write the figures here too")
    parser.add_argument("--keep", action="store_true", help="leave the lab up")
    args = parser.parse_args(argv)
    missing = lab_prerequisites()
    if missing:
        raise SystemExit(f"lab prerequisites: {missing}")
    lab = Lab(REPO / ".lab-state" / "bench-probe", PROFILES, spare=False)
    figures = {}
    try:
        lab.up()
        lab.converge()
        for backend, node, one in (("vllm", "node1", vllm_round), ("llamacpp", "node2", llamacpp_round)):
            assert lab.pool().get(node, {}).get("op_state") == "running", f"{node} is not in rotation after site.yml"
            rounds = [one(lab, node) for _ in range(args.rounds)]
            figures[backend] = {
                "to_out_s": [round(o, 1) for o, _b in rounds],
                "to_back_s": [round(b, 1) for _o, b in rounds],
            }
    finally:
        if not args.keep:
            lab.down()
    print(f"{'backend':<10} {'wedge to out of rotation (s)':<32} {'end to back (s)':<20} target")
    for backend, f in figures.items():
        out = f["to_out_s"]
        print(
            f"{backend:<10} {statistics.median(out):>5.1f} median, {max(out):>5.1f} max{'':<12}"
            f"{statistics.median(f['to_back_s']):>5.1f} median{'':<7}<= {TARGET_S:.0f} s"
            f" {'met' if max(out) <= TARGET_S else 'MISSED'}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0 if all(max(f["to_out_s"]) <= TARGET_S for f in figures.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
