# SPDX-License-Identifier: GPL-3.0-or-later
"""The fleet report: per node, what the playbooks left (gate verdict, pool state) against what a
correct run must leave (`expect_registered` of its profile). A node is registered when its server
is in rotation: admin state ready and UP through its health and agent checks. A drained one (POOL
`drain`) is out of rotation but still known to the balancer, as the collection leaves a node that
may not take traffic; after a restart of HAProxy such a server is back from the config file ready
but DOWN (its checks fail), out of rotation too."""

from __future__ import annotations

import json
import time

import lab.hwmodel as hw

from . import haproxy, llamacpp
from .preflight import LabError

MARKER = "/run/gpufleet/nccl-gate.json"
HEALTH = "/run/gpufleet/gpu-health.json"
#: The GPU health verdict's action for a hold (the collection's health/_verdict.HARDWARE_INSPECTION).
HOLD = "hardware inspection"


def gather(fleet, settle=6.0):
    """[{name, profile, expect_registered, registered, pool_state, gate, gpu_health, busbw, threshold,
    reason, faults, ok}]

    A node is expected in the pool when its profile says so and its hardware model holds no
    fault that must keep it out (`hwmodel.health.keeps_out`, the lab's own judgement), and its
    GPU health verdict holds no hold for hardware inspection (`held`: the same fatal XID came back
    after a reboot; only an operator's clear, which the hardware model cannot know of, ends it).

    A server added seconds ago is down until HAProxy's first health and agent checks (every 2 s)
    have passed: the pool is read again for up to `settle` seconds while a member in service
    is still down, so that the report shows where the checks land rather than their start.
    The pool is the lab's own reading (lab/haproxy.py), not the collection's.
    """
    data = fleet.data()
    if not data:
        raise LabError(f"no lab at {fleet.state}: run `python -m lab up` first")
    bal = fleet.balancer(data)
    deadline = time.monotonic() + settle
    while True:
        try:
            pool = haproxy.pool(bal.spec["socket"], bal.spec["backend"])
            pool_error = None
        except haproxy.HAProxyError as exc:
            pool, pool_error = {}, str(exc)
        settling = [s for s in pool.values() if s["state"] == "ready" and s["op_state"] != "running"]
        if not settling or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    rows = []
    for m in fleet.machines(data):
        name = m.spec["name"]
        marker, health = _read_json(m, MARKER), _read_json(m, HEALTH)
        node = m.hw_node()
        faults = hw.health.keeps_out(m.hw_dir, node.data)
        held = bool(health) and health.get("passed") is False and health.get("action") == HOLD
        expected = m.spec["expect_registered"] and not faults and not held
        server = pool.get(name)
        registered = server is not None and server["state"] == "ready" and server["op_state"] == "running"
        gate = "no marker" if not marker else ("passed" if marker.get("passed") else "FAILED")
        if marker and marker.get("boot_id") != m.boot_id():
            gate += " (old boot)"
        gpu_health = "-" if not health else ("passed" if health.get("passed") is True else "HELD" if held else "FAILED")
        if health and health.get("boot_id") != m.boot_id():
            gpu_health += " (old boot)"
        rows.append(
            {
                "name": name,
                "profile": m.spec["profile"],
                "expect_registered": expected,
                "registered": registered,
                "pool_state": server["state"] if server else "absent",
                "health": server["op_state"] if server else "-",
                "gate": gate,
                "gpu_health": gpu_health,
                "faults": faults,
                "held": held,
                "busbw_gbps": marker.get("judged_busbw_gbps"),
                "threshold_gbps": marker.get("threshold_gbps"),
                "reason": (health.get("reason") if health and health.get("passed") is not True else None)
                or marker.get("reason")
                or "",
                "ok": registered == expected,
                "serving": llamacpp.serving_summary(m, marker),
            }
        )
    return rows, pool_error


def _read_json(machine, path):
    """A JSON file inside a running node; {} when the node is off or the file is not there."""
    if not machine.pid():
        return {}
    out = machine.nsenter("cat", path, timeout=10)
    if out.returncode != 0:
        return {}
    try:
        return json.loads(out.stdout)
    except ValueError:
        return {"reason": f"unreadable {path}: {out.stdout[:80]!r}"}


def render(rows, pool_error=None):
    lines = [
        f"{'NODE':<8} {'PROFILE':<18} {'GATE':<18} {'GPU HEALTH':<11} {'BUSBW/THRESHOLD GB/s':<21} {'POOL':<8} "
        f"{'TRAFFIC':<8} {'EXPECTED':<9} VERDICT"
    ]
    for r in rows:
        bw = (
            f"{r['busbw_gbps']:.1f} / {r['threshold_gbps']:.1f}"
            if r["busbw_gbps"] is not None and r["threshold_gbps"] is not None
            else "-"
        )
        # TRAFFIC: HAProxy's operational state (health check and the node's agent), for a member
        traffic = "-" if r["health"] == "-" else ("up" if r["health"] == "running" else "down")
        lines.append(
            f"{r['name']:<8} {r['profile']:<18} {r['gate']:<18} {r['gpu_health']:<11} {bw:<21} {r['pool_state']:<8} "
            f"{traffic:<8} {'in' if r['expect_registered'] else 'out':<9} {'ok' if r['ok'] else 'WRONG'}"
        )
    for r in rows:
        if r.get("held"):
            lines.append(f"  {r['name']}: held for hardware inspection (playbooks/clear_gpu_hold.yml): {r['reason']}")
        elif r["gate"].startswith("FAILED") or r["gpu_health"].startswith("FAILED"):
            lines.append(f"  {r['name']}: {r['reason']}")
        if r["faults"]:
            lines.append(f"  {r['name']}: the lab holds faults that keep it out: {'; '.join(r['faults'])}")
        if (r.get("serving") or "").startswith("llama.cpp"):
            lines.append(f"  {r['name']}: serves with {r['serving']}")
    if pool_error:
        lines.append(f"  balancer: {pool_error}")
    return "\n".join(lines)
