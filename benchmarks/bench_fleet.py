#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark: site.yml (first run, idempotent second run) and drift.yml on lab fleets of growing size.

For each fleet size (default 1, 4 and 8 nodes, the lab's default profile list cycled: l40s-4x-switch,
l40s-4x-switch, h100-sxm-8x, l40s-x8-degraded, ...) it brings a lab up in a state directory of
its own (``.lab-state/bench-fleet-<N>``), runs from the repository root, with ``forks`` = N:

* ``ansible-playbook -i <state>/hosts.yml playbooks/site.yml``            (first run)
* the same again                                                           (idempotent run)
* ``ansible-playbook -i <state>/hosts.yml playbooks/drift.yml --check --diff``

with ``ansible.posix.profile_tasks`` enabled, then takes the lab down.  It prints the wall time of
each run, the 4-node/1-node ratios against the targets (idempotent run and drift of 4 nodes under
1.5x one node, drift of one node under 15 s), and what dominates: the time per role (sum of the
per-task times that profile_tasks reports; a task's time covers all hosts in parallel), the
number of tasks, and the mean cost of one task.

This is not a test: it is heavy (minutes), run it on demand, as root, on an otherwise idle machine:

    .venv/bin/python benchmarks/bench_fleet.py [--nodes 1,4,8] [--json FILE] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
TARGET_RATIO = 1.5
TARGET_DRIFT_ONE_S = 15.0

_RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
# profile_tasks' recap: "gpufleet.node.pcie_p2p : Read ACS on every port ------- 1.53s"
_TASK_TIME = re.compile(r"^(?P<name>.+?) -+ (?P<s>\d+\.\d+)s$", re.M)


def lab(state, *args, timeout=300):
    proc = subprocess.run(
        [sys.executable, "-m", "lab", *args, "--state-dir", str(state)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode:
        raise SystemExit(f"lab {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def lab_cpu_seconds(state):
    """CPU time used so far by everything in the lab's cgroup (nodes' systemd, sshd, modules, HAProxy)."""
    sys.path.insert(0, str(REPO))
    from lab.fleet import Fleet

    try:
        text = (Fleet(state).cgroup / "cpu.stat").read_text()
    except OSError:
        return 0.0
    return int(re.search(r"^usage_usec (\d+)", text, re.M)[1]) / 1e6


def _children_cpu():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def playbook(state, forks, *args):
    env = dict(os.environ)
    env.update(
        {
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "PATH": f"{VENV_BIN}:{env.get('PATH', '')}",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORKS": str(forks),
            "ANSIBLE_CALLBACKS_ENABLED": "gpufleet.node.drift,ansible.posix.profile_tasks",
            "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "all",
            "GPUFLEET_DRIFT_DIR": str(state / "drift"),
        }
    )
    env.pop("ANSIBLE_INVENTORY", None)
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(state / "hosts.yml"), *args]
    cpu0, nodes0, t0 = _children_cpu(), lab_cpu_seconds(state), time.monotonic()
    proc = subprocess.run(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
    )
    seconds = time.monotonic() - t0
    controller_cpu, nodes_cpu = _children_cpu() - cpu0, lab_cpu_seconds(state) - nodes0
    out = proc.stdout
    recap = {
        m[1]: {"ok": int(m[2]), "changed": int(m[3]), "unreachable": int(m[4]), "failed": int(m[5])}
        for m in _RECAP.finditer(out)
    }
    tail = out.split("TASKS RECAP", 1)[-1] if "TASKS RECAP" in out else ""
    tasks = [(m["name"].strip(), float(m["s"])) for m in _TASK_TIME.finditer(tail)]
    roles = defaultdict(float)
    for name, s in tasks:
        role = name.split(" : ", 1)[0].replace("gpufleet.node.", "") if " : " in name else "(play)"
        roles[role] += s
    return {
        "argv": argv[3:],
        "rc": proc.returncode,
        "seconds": round(seconds, 1),
        "recap": recap,
        "controller_cpu_s": round(controller_cpu, 1),
        "nodes_cpu_s": round(nodes_cpu, 1),
        "tasks": len(tasks),
        "task_seconds": round(sum(s for _, s in tasks), 1),
        "roles": {k: round(v, 1) for k, v in sorted(roles.items(), key=lambda kv: -kv[1])},
        "slowest": sorted(tasks, key=lambda t: -t[1])[:5],
    }


def bench(n, keep=False, log=print):
    state = REPO / ".lab-state" / f"bench-fleet-{n}"
    subprocess.run(
        [sys.executable, "-m", "lab", "down", "--state-dir", str(state)], cwd=REPO, capture_output=True, check=False
    )
    t0 = time.monotonic()
    lab(state, "up", "--nodes", str(n))
    up = time.monotonic() - t0
    status = json.loads(lab(state, "status", "--json"))
    result = {"nodes": n, "forks": n, "lab_up_s": round(up, 1), "profiles": [x["profile"] for x in status["nodes"]]}
    try:
        for key, args in (
            ("first", ["playbooks/site.yml"]),
            ("second", ["playbooks/site.yml"]),
            ("drift", ["playbooks/drift.yml", "--check", "--diff"]),
        ):
            r = playbook(state, n, *args)
            result[key] = r
            changed = sum(h["changed"] for h in r["recap"].values())
            log(
                f"  {n} node(s) {key:<6} {r['seconds']:6.1f} s  rc={r['rc']}  changed={changed}  "
                f"tasks={r['tasks']}  CPU: controller {r['controller_cpu_s']} s, nodes {r['nodes_cpu_s']} s  "
                f"top: {', '.join(f'{k} {v}s' for k, v in list(r['roles'].items())[:3])}",
                flush=True,
            )
    finally:
        if not keep:
            subprocess.run(
                [sys.executable, "-m", "lab", "down", "--state-dir", str(state)],
                cwd=REPO,
                capture_output=True,
                check=False,
            )
            shutil.rmtree(state, ignore_errors=True)
    return result


def table(results):
    cpus = os.cpu_count()
    lines = [
        f"{'nodes':>5} {'forks':>5} {'first site.yml':>15} {'second (idem.)':>15} {'drift.yml':>10}  "
        f"{'changed 2nd':>11}  {'drift CPU ctl+nodes':>19}  dominant roles (drift, s)"
    ]
    for r in results:
        changed = sum(h["changed"] for h in r["second"]["recap"].values())
        roles = ", ".join(f"{k} {v}" for k, v in list(r["drift"]["roles"].items())[:3])
        d = r["drift"]
        cpu = f"{d.get('controller_cpu_s', 0):.0f}+{d.get('nodes_cpu_s', 0):.0f} s"
        lines.append(
            f"{r['nodes']:>5} {r['forks']:>5} {r['first']['seconds']:>13.1f} s "
            f"{r['second']['seconds']:>13.1f} s {r['drift']['seconds']:>8.1f} s  {changed:>11}  "
            f"{cpu:>19}  {roles}"
        )
    lines.append(
        f"CPU bound when (controller + nodes CPU) / {cpus} CPUs is close to the wall time: the lab's "
        "nodes run on the controller's CPUs."
    )
    by_n = {r["nodes"]: r for r in results}
    if 1 in by_n:
        one = by_n[1]
        ok = one["drift"]["seconds"] < TARGET_DRIFT_ONE_S
        lines.append(
            f"drift of 1 node: {one['drift']['seconds']:.1f} s (target < {TARGET_DRIFT_ONE_S:.0f} s): "
            f"{'met' if ok else 'MISSED'}"
        )
        for n in sorted(by_n):
            if n == 1:
                continue
            for key in ("second", "drift"):
                ratio = by_n[n][key]["seconds"] / one[key]["seconds"]
                verdict = "" if n != 4 else (" (target < 1.5x): " + ("met" if ratio < TARGET_RATIO else "MISSED"))
                lines.append(f"{key:>6} run, {n} nodes / 1 node: {ratio:.2f}x{verdict}")
        d = one["drift"]
        lines.append(
            f"1-node drift: {d['tasks']} tasks, {d['task_seconds']} s of task time, "
            f"{d['task_seconds'] / max(d['tasks'], 1):.2f} s per task on average; slowest: "
            + ", ".join(f"{name} {s:.2f}s" for name, s in d["slowest"][:3])
        )
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="1,4,8", help="fleet sizes, comma-separated (default 1,4,8)")
    p.add_argument("--json", metavar="FILE", help="write every figure as JSON too")
    p.add_argument("--keep", action="store_true", help="leave each lab up (state .lab-state/bench-fleet-N)")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("the lab needs root")
    sizes = [int(x) for x in args.nodes.split(",") if x.strip()]
    results = []
    t0 = time.monotonic()
    for n in sizes:
        print(f"fleet of {n} node(s):", flush=True)
        results.append(bench(n, keep=args.keep))
    print()
    print(table(results))
    print(
        f"(load average now {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs; benchmark took "
        f"{time.monotonic() - t0:.0f} s)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
