#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark: site.yml (first run, idempotent second run), drift.yml, boot validation and a reboot
on lab fleets of growing size.

For each fleet size (default 1, 4 and 16 nodes, the lab's default profile list cycled:
l40s-4x-switch, l40s-4x-switch, h100-sxm-8x, l40s-x8-degraded, ...) it brings a lab up in a state
directory of its own (``<state-prefix>-<N>``, default ``.lab-state/bench-fleet-<N>``; the time of
``lab up`` and the lab's memory per node are reported), runs from the repository root, with
``forks`` = N:

* ``ansible-playbook -i <state>/hosts.yml playbooks/site.yml``            (first run)
* the same again                                                           (idempotent run)
* ``ansible-playbook -i <state>/hosts.yml playbooks/drift.yml --check --diff``
* ``ansible-playbook -i <state>/hosts.yml playbooks/validate.yml --limit node1`` (boot validation,
  from the controller: its module runs; at boot the node runs the same play itself)

each with ``ansible.posix.profile_tasks`` and ``benchmarks/callback_plugins/module_runs.py`` (the
module runs per host: every ``_execute_module`` of an action plugin), then ``lab reboot node1``
and the time until HAProxy has node1 UP again (reboot to back in rotation; the gate's own
measurement, ``duration_s`` of its verdict, shown separately), then takes the lab down.  It
prints per phase the wall time, the controller's CPU time (ansible-playbook and its children) and
the nodes' (the lab's cgroup), module runs per node, and the targets.

This is not a test: it is heavy (minutes), run it on demand, as root, on an otherwise idle machine:

    .venv/bin/python benchmarks/bench_fleet.py [--nodes 1,4,16] [--state-prefix DIR] [--json FILE] [--keep]
"""

from __future__ import annotations

import argparse
import configparser
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
TARGETS = {
    "drift of 1 node": 5.0,  # s wall
    "idempotent site.yml of 4 nodes": 15.0,  # s wall
    "controller CPU per added node (drift)": 1.5,  # s
    "reboot to back in rotation, without the gate": 10.0,  # s
    "lab up of 16 nodes": 30.0,  # s
    "controller CPU per node, 16 against 4 nodes (drift)": 1.2,  # ratio
}
CALLBACKS = REPO / "benchmarks" / "callback_plugins"

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


def lab_memory_bytes(state):
    """Memory of the lab (nodes and HAProxy): cgroup v2 memory.current where the memory controller
    is there, else the sum of the proportional set sizes (Pss) of the processes in its cgroups."""
    sys.path.insert(0, str(REPO))
    from lab.fleet import Fleet

    cgroup = Fleet(state).cgroup
    try:
        return int((cgroup / "memory.current").read_text())
    except (OSError, ValueError):
        pass
    total = 0
    for procs in cgroup.rglob("cgroup.procs"):
        try:
            pids = procs.read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                text = Path(f"/proc/{pid}/smaps_rollup").read_text()
            except OSError:
                continue
            m = re.search(r"^Pss:\s+(\d+) kB", text, re.M)
            total += int(m[1]) * 1024 if m else 0
    return total


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


def _configured_callbacks():
    config = configparser.ConfigParser()
    config.read(REPO / "ansible.cfg")
    listed = config.get("defaults", "callbacks_enabled", fallback="")
    return [name.strip() for name in listed.split(",") if name.strip()]


def playbook(state, forks, *args):
    runs_log = state / "module-runs.log"
    runs_log.unlink(missing_ok=True)
    env = dict(os.environ)
    env.update(
        {
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "PATH": f"{VENV_BIN}:{env.get('PATH', '')}",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORKS": str(forks),
            # the repository's callbacks (ansible.cfg) and the benchmark's two
            "ANSIBLE_CALLBACKS_ENABLED": ",".join(
                [*_configured_callbacks(), "ansible.posix.profile_tasks", "module_runs"]
            ),
            "ANSIBLE_CALLBACK_PLUGINS": str(CALLBACKS),
            "BENCH_MODULE_RUNS_LOG": str(runs_log),
            "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "all",
            "GPUFLEET_DRIFT_DIR": str(state / "drift"),
            "ANSIBLE_VAULT_PASSWORD_FILE": str(state / "vault-password"),  # the lab's vaulted secrets
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
    # module runs per inventory host (those delegated elsewhere, e.g. to the balancer, among them)
    runs, delegated, modules = defaultdict(int), defaultdict(int), defaultdict(int)
    by_task = defaultdict(int)  # of the first host, "task (module)"
    lines = runs_log.read_text().splitlines() if runs_log.exists() else []
    first = lines[0].split("\t")[0] if lines else None
    for line in lines:
        host, module, to, task = (line.split("\t") + [""])[:4]
        if host == first:
            by_task[f"{task} ({module.rsplit('.', 1)[-1]})"] += 1
        runs[host] += 1
        delegated[host] += to != "-"
        modules[module.rsplit(".", 1)[-1]] += 1
    hosts = [h for h in recap if h != "localhost"] or list(recap)
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
        "module_runs": dict(sorted(runs.items())),
        "module_runs_delegated": dict(sorted(delegated.items())),
        "module_runs_per_node": round(sum(runs.get(h, 0) for h in hosts) / max(len(hosts), 1), 1),
        "modules": dict(sorted(modules.items(), key=lambda kv: -kv[1])),
        "module_runs_by_task": {"host": first, "tasks": dict(by_task)},
    }


def _pool(state):
    """A function: HAProxy's record of a node in the lab's vLLM backend, or None."""
    sys.path.insert(0, str(REPO))
    from ansible_collections.gpufleet.node.plugins.module_utils.lb._haproxy import RuntimeAPI

    balancer = json.loads(lab(state, "status", "--json"))["balancer"]
    api = RuntimeAPI(balancer["runtime_socket"])

    def server(node):
        try:
            return api.servers(balancer["backend"]).get(node)
        except Exception:  # a busy balancer is polled again
            return None

    return server


def _in_rotation(server):
    return bool(server) and server["op_state"] == "running" and server["state"] == "ready"


def _ssh(state, node, command):
    status = json.loads(lab(state, "status", "--json"))
    spec = next(x for x in status["nodes"] if x["name"] == node)
    argv = ["ssh", "-i", str(state / "ssh" / "id_ed25519"), "-o", "StrictHostKeyChecking=no"]
    argv += ["-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes"]
    argv += ["-p", str(spec["ssh_port"]), f"root@{spec['address']}", command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False).stdout


def reboot_to_rotation(state, node, timeout=300):
    """`lab reboot NODE` (it returns once the node's boot, its validation included, is done),
    watching HAProxy meanwhile: the time until the node, once seen out, is in rotation again; the
    gate's own measurement from its verdict of the new boot."""
    server = _pool(state)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lab", "reboot", node, "--state-dir", str(state)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    booted = seen_out = back = None
    while time.monotonic() - t0 < timeout:
        if booted is None and proc.poll() is not None:
            booted = time.monotonic() - t0
        up = _in_rotation(server(node))
        if not up and seen_out is None:
            seen_out = time.monotonic() - t0
        if up and seen_out is not None:
            back = time.monotonic() - t0
            break
        time.sleep(0.2)
    if proc.wait(timeout=max(1, timeout - (time.monotonic() - t0))) != 0:
        raise SystemExit(f"lab reboot {node} failed ({proc.returncode})")
    booted = booted if booted is not None else time.monotonic() - t0
    try:
        gate = json.loads(_ssh(state, node, "cat /var/lib/gpufleet/nccl-gate.json") or "{}").get("duration_s")
        gate = float(gate)
    except (TypeError, ValueError):
        gate = None
    return {
        "node": node,
        "booted_s": round(booted, 1),
        "seen_out_s": None if seen_out is None else round(seen_out, 1),
        "in_rotation_s": None if back is None else round(back, 1),
        "gate_s": None if gate is None else round(gate, 1),
        "without_gate_s": None if back is None or gate is None else round(back - gate, 1),
    }


def bench(n, keep=False, log=print, prefix=None):
    state = Path(f"{prefix}-{n}") if prefix else REPO / ".lab-state" / f"bench-fleet-{n}"
    subprocess.run(
        [sys.executable, "-m", "lab", "down", "--state-dir", str(state)], cwd=REPO, capture_output=True, check=False
    )
    t0 = time.monotonic()
    lab(state, "up", "--nodes", str(n), timeout=600)
    up = time.monotonic() - t0
    status = json.loads(lab(state, "status", "--json"))
    mem = lab_memory_bytes(state)
    result = {
        "nodes": n,
        "forks": n,
        "lab_up_s": round(up, 1),
        "lab_memory_mib_per_node_up": round(mem / n / 2**20),
        "profiles": [x["profile"] for x in status["nodes"]],
    }
    log(f"  {n} node(s) lab up {up:.1f} s, {result['lab_memory_mib_per_node_up']} MiB per node", flush=True)
    try:
        for key, args in (
            ("first", ["playbooks/site.yml"]),
            ("second", ["playbooks/site.yml"]),
            ("drift", ["playbooks/drift.yml", "--check", "--diff"]),
            ("validate", ["playbooks/validate.yml", "--limit", "node1"]),
        ):
            r = playbook(state, n, *args)
            result[key] = r
            changed = sum(h["changed"] for h in r["recap"].values())
            log(
                f"  {n} node(s) {key:<8} {r['seconds']:6.1f} s  rc={r['rc']}  changed={changed}  "
                f"tasks={r['tasks']}  module runs/node={r['module_runs_per_node']}  CPU: controller "
                f"{r['controller_cpu_s']} s, nodes {r['nodes_cpu_s']} s  "
                f"top: {', '.join(f'{k} {v}s' for k, v in list(r['roles'].items())[:3])}",
                flush=True,
            )
        result["lab_memory_mib_per_node_served"] = round(lab_memory_bytes(state) / n / 2**20)
        result["reboot"] = reboot_to_rotation(state, "node1")
        log(f"  {n} node(s) reboot of node1: {result['reboot']}", flush=True)
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


def _verdict(value, target, unit="s"):
    if value is None:
        return "not measured"
    if value < target:
        return f"{value:.2f}{unit} (target < {target}{unit}): met"
    return f"{value:.2f}{unit} (target < {target}{unit}): MISSED by {value - target:.2f}{unit} ({value / target:.2f}x)"


def table(results):
    cpus = os.cpu_count()
    phases = ("first", "second", "drift", "validate")
    lines = [
        "| nodes | lab up | memory/node | phase | wall | controller CPU | nodes CPU | module runs/node | changed | rc |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for i, key in enumerate(phases):
            p = r[key]
            changed = sum(h["changed"] for h in p["recap"].values())
            head = (
                f"| {r['nodes']} | {r['lab_up_s']:.1f} s | {r['lab_memory_mib_per_node_up']}"
                f"/{r.get('lab_memory_mib_per_node_served', '?')} MiB"
                if i == 0
                else "| | |"
            )
            lines.append(
                f"{head} | {key} | {p['seconds']:.1f} s | {p['controller_cpu_s']:.1f} s | {p['nodes_cpu_s']:.1f} s | "
                f"{p['module_runs_per_node']} | {changed} | {p['rc']} |"
            )
    lines.append("")
    lines.append(
        "| nodes | reboot of node1: booted | back in rotation | gate's measurement | rotation without the gate |"
    )
    lines.append("|---|---|---|---|---|")
    for r in results:
        b = r.get("reboot", {})
        lines.append(
            f"| {r['nodes']} | {b.get('booted_s')} s | {b.get('in_rotation_s')} s | {b.get('gate_s')} s | "
            f"{b.get('without_gate_s')} s |"
        )
    lines.append("")
    by_n = {r["nodes"]: r for r in results}
    if 1 in by_n:
        lines.append("drift of 1 node: " + _verdict(by_n[1]["drift"]["seconds"], TARGETS["drift of 1 node"]))
    if 4 in by_n:
        lines.append(
            "idempotent site.yml of 4 nodes: "
            + _verdict(by_n[4]["second"]["seconds"], TARGETS["idempotent site.yml of 4 nodes"])
        )
    if 1 in by_n and 4 in by_n:
        per = (by_n[4]["drift"]["controller_cpu_s"] - by_n[1]["drift"]["controller_cpu_s"]) / 3
        lines.append(
            "controller CPU per added node, drift 1 -> 4: "
            + _verdict(per, TARGETS["controller CPU per added node (drift)"])
        )
    if 4 in by_n and 16 in by_n:
        per4 = by_n[4]["drift"]["controller_cpu_s"] / 4
        per16 = by_n[16]["drift"]["controller_cpu_s"] / 16
        lines.append(
            f"controller CPU per node in a drift run: {per4:.2f} s at 4 nodes, {per16:.2f} s at 16: "
            + _verdict(per16 / per4, TARGETS["controller CPU per node, 16 against 4 nodes (drift)"], "x")
        )
        lines.append("lab up of 16 nodes: " + _verdict(by_n[16]["lab_up_s"], TARGETS["lab up of 16 nodes"]))
        lines.append(f"drift check of 16 nodes: rc={by_n[16]['drift']['rc']}")
    for r in results:
        b = r.get("reboot", {})
        lines.append(
            f"reboot to back in rotation without the gate ({r['nodes']} node(s) up): "
            + _verdict(b.get("without_gate_s"), TARGETS["reboot to back in rotation, without the gate"])
        )
    if 1 in by_n:
        for key in ("second", "drift", "validate"):
            d = by_n[1][key]
            lines.append(
                f"1-node {key}: {d['tasks']} tasks, {d['module_runs_per_node']} module runs on behalf of the node "
                f"({sum(d['module_runs_delegated'].values())} delegated); by module: "
                + ", ".join(f"{m} {c}" for m, c in list(d["modules"].items())[:8])
            )
    lines.append(
        f"CPU bound when (controller + nodes CPU) / {cpus} CPUs is close to the wall time: the lab's "
        "nodes run on the controller's CPUs."
    )
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="1,4,16", help="fleet sizes, comma-separated (default 1,4,16)")
    p.add_argument(
        "--state-prefix", metavar="DIR", help="lab state directories DIR-<N> (default .lab-state/bench-fleet-<N>)"
    )
    p.add_argument("--json", metavar="FILE", help="write every figure as JSON too")
    p.add_argument("--keep", action="store_true", help="leave each lab up (state .lab-state/bench-fleet-N)")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("the lab needs root")
    sizes = [int(x) for x in args.nodes.split(",") if x.strip()]
    results = []
    t0 = time.monotonic()
    load0 = os.getloadavg()
    for n in sizes:
        print(f"fleet of {n} node(s):", flush=True)
        results.append(bench(n, keep=args.keep, prefix=args.state_prefix))
        if args.json:  # every size as soon as it is measured
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    print()
    print(table(results))
    print(
        f"(load average {load0[0]:.1f} at the start, {os.getloadavg()[0]:.1f} now, {os.cpu_count()} CPUs; benchmark took "
        f"{time.monotonic() - t0:.0f} s)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
