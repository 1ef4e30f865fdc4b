# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU health (role gpu_health): each injected fault keeps a node out at site.yml and at boot
validation, and a fatal XID on a serving node takes it out of rotation (how fast is a figure the
run prints with the lab's timings, not an assertion).

Faults go in with `python -m lab fault NODE KIND` (lab/faults.py) and take effect at once.  To
keep the suite short each fault costs one `site.yml --limit NODE --tags gpu_health` (the role,
then site.yml's rescue, which runs under any tags: the node leaves the pool); at the end of a
test the node goes back with `--tags gpu_health,lb_registration` where its gate verdict of this
boot holds (fleet.restore), else the next converge runs site.yml with a fresh gate.  Every
fault kind, the NVSwitch ones included, at site.yml and at boot validation (validate.yml), and
what a reboot clears: tests/fleet/test_fleet_5_health_every_fault.py, on a lab of its own.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.harness.lab import LAB_TIMINGS

pytestmark = pytest.mark.slow

VERDICT = "/run/gpufleet/gpu-health.json"

# One fault per GPU, all at once: (fault argv after NODE, the check that fails, words of its
# reason, the action it names; None: whatever action the driver's line calls for).
L40S_FAULTS = [
    (["xid", "79", "--gpu", "0"], "xid", "XID 79", "reboot"),
    (["remap-pending", "--gpu", "1"], "row_remap", "row remapping pending", "reset the GPU"),
    (["ecc-uncorrectable", "--gpu", "2"], "ecc", "volatile uncorrectable ECC errors", "reset the GPU"),
    (["hw-slowdown", "--gpu", "3"], "clocks", "hw_slowdown", "drain and inspect the hardware"),
    (["aer", "--gpu", "0"], "pcie_aer", "non-fatal AER", "drain and inspect the hardware"),
]


def _flat(text):
    return re.sub(r"\s+", " ", text).replace("''", "'")


def _node_of(fleet, profile):
    for node in fleet.fleet_nodes:
        if fleet.nodes[node]["profile"] == profile and fleet.nodes[node]["expect_registered"]:
            return node
    return None


def _verdict(fleet, node):
    f = fleet.host(node).file(VERDICT)
    return json.loads(f.content_string) if f.exists else None


def _clear(fleet, node):
    """The lab's faults cleared (a repaired machine), and the node's XID history with them: the
    fatal XIDs these tests inject in turn on one GPU would otherwise hold the node for hardware
    inspection (an operator's playbooks/clear_gpu_hold.yml: tests/fleet/test_fleet_11_recurrence.py)."""
    fleet.lab("fault", node, "clear")
    fleet.sh(node, "rm -f /var/lib/gpufleet/gpu-xid-history.json")


def _health_run(fleet, node, label, extra_vars=None):
    return fleet.site(
        "--tags",
        "gpu_health",
        limit=node,
        extra_vars=extra_vars,
        label=f"site.yml --limit {node} --tags gpu_health ({label})",
    )


def _assert_kept_out(fleet, node, run, check, words, action):
    _assert_kept_out_by(fleet, node, run, [(None, check, words, action)])


def _assert_kept_out_by(fleet, node, run, faults):
    """The node failed its play, is out of the pool, and every fault's check is named in the
    failure ("CHECK: REASON -> action: ACTION"), in the verdict of this boot and by the agent."""
    assert run.rc != 0 and run.recap[node]["failed"] == 1, run.explain()
    failures = _flat("\n".join(run.host_failures(node)))
    assert f"{node} is out of the pool" in failures, failures
    assert "GPU health check failed" in failures, failures
    assert re.search(r"-> action: (reboot|reset the GPU|drain and inspect|fix the node|restart the app)", failures)
    verdict = _verdict(fleet, node)
    assert verdict and verdict["passed"] is False and verdict["boot_id"] == fleet.nodes[node]["boot_id"], verdict
    failed = [c["name"] for c in verdict["checks"]]
    for _fault, check, words, action in faults:
        assert f"{check}: " in failures and words in failures, (check, failures)
        if action:
            assert f"-> action: {action}" in failures, (check, failures)
        assert check in failed, (check, verdict)
    fleet.assert_drained(node)
    assert fleet.agent_verdict(node) == "down #gpu-health-failed"  # one word: the details stay on the node


def _restore(fleet, node, label):
    """The fault cleared, the node's gate verdict of this boot intact: gpu_health judges it again
    and registration puts it back (cheaper than site.yml with a fresh gate, which converge runs
    when this does not bring the node back)."""
    fleet.restore(
        node,
        "gpu_health,lb_registration",
        f"site.yml --limit {node} --tags gpu_health,lb_registration ({label} cleared)",
    )


def _inject_and_check(fleet, node, faults):
    """Every fault at once, one on each GPU: one site.yml run must name each check."""
    fleet.changed(node)
    label = ", ".join(" ".join(fault) for fault, *_ in faults)
    try:
        for fault, *_ in faults:
            fleet.lab("fault", node, *fault)
        run = _health_run(fleet, node, label)
        _assert_kept_out_by(fleet, node, run, faults)
    finally:
        _clear(fleet, node)
    _restore(fleet, node, label)


def _faults_on(fleet, profile):
    node = _node_of(fleet, profile)
    if node is None:
        pytest.skip(f"no healthy {profile} node in this fleet (GPUFLEET_FLEET_PROFILES)")
    fleet.converge(nodes=[node])
    return node


def test_each_fault_keeps_the_node_out_at_site(fleet, first_run):
    node = _faults_on(fleet, "l40s-4x-switch")
    _inject_and_check(fleet, node, L40S_FAULTS)


def test_a_link_trained_down_and_peermem_unloaded_warn_and_fail_when_judged(fleet, first_run):
    """Idle GPUs downshift, so gpu_health only warns about a narrow link (a width does not drop
    with idling, hence the warning); the NCCL gate, which loads the link, keeps the node out.
    nvidia_peermem missing where a ConnectX NIC is on the GPUs' path: a warning (gpu_health
    passes), a failure with gpu_health_require_peermem.  Both faults at once: the checks are
    independent, and each run judges both."""
    node = _faults_on(fleet, "l40s-4x-switch")
    fleet.changed(node)
    fleet.lab("fault", node, "link-degrade")
    fleet.lab("fault", node, "peermem-unload")
    try:
        # site.yml's real path: gpu_health warns twice and passes, the gate fails the node
        run = fleet.site(
            limit=node,
            extra_vars=["nccl_gate_force=true"],
            label=f"site.yml --limit {node} (link-degrade, peermem-unload)",
        )
        failures = _flat("\n".join(run.host_failures(node)))
        assert run.rc != 0 and "NCCL gate failed" in failures and "trained to x8 of x16" in failures, failures
        assert "GPU health check failed" not in failures, failures
        assert f"{node} is out of the pool" in failures, failures
        fleet.assert_drained(node)
        verdict = _verdict(fleet, node)
        assert verdict["passed"] is True and verdict["boot_id"] == fleet.nodes[node]["boot_id"], verdict
        warned = {w["name"]: w for w in verdict["warnings"]}
        assert "pcie_link" in warned and "idle; judged under load" in warned["pcie_link"]["reason"], verdict
        assert "nvidia_peermem" in warned.get("peermem", {}).get("reason", ""), verdict
        # under load (busy=true, as when sampled during the gate) the module fails the link itself,
        # and peermem when required
        run = _health_run(
            fleet,
            node,
            "link-degrade, busy; peermem-unload, required",
            extra_vars=["gpu_health_busy=true", "gpu_health_require_peermem=true"],
        )
        _assert_kept_out_by(
            fleet,
            node,
            run,
            [
                (None, "pcie_link", "below its maximum under load", "drain and inspect the hardware"),
                (None, "peermem", "nvidia_peermem", "fix the node configuration"),
            ],
        )
    finally:
        _clear(fleet, node)


def _validation(fleet, node):
    state = fleet.unit_state(node, "gpufleet-validate.service")
    journal = _flat(fleet.sh(node, "journalctl -b --no-pager -o cat -u gpufleet-validate.service"))
    return state, journal


def test_boot_validation_clears_what_a_reboot_clears_and_keeps_the_rest_out(fleet, converged):
    node = _node_of(fleet, "l40s-4x-switch")
    fleet.changed(node)
    try:
        # a pending remap is applied by the reboot, the XID belongs to the old boot: healthy again
        fleet.lab("fault", node, "remap-pending")
        fleet.lab("fault", node, "xid", "79")
        fleet.reboot(node)
        state, journal = _validation(fleet, node)
        assert state["Result"] == "success" and state["ActiveState"] == "active", (state, journal[-3000:])
        verdict = _verdict(fleet, node)
        assert verdict["passed"] is True and verdict["boot_id"] == fleet.nodes[node]["boot_id"], verdict
        assert fleet.agent_verdict(node) == "up"
        pool = fleet.wait_pool(lambda p: p.get(node, {}).get("op_state") == "running")
        assert pool.get(node, {}).get("op_state") == "running", pool

        # a GPU in hardware slowdown stays so across a reboot: validation fails, the agent says down
        fleet.lab("fault", node, "hw-slowdown")
        fleet.reboot(node)
        state, journal = _validation(fleet, node)
        assert state["ActiveState"] == "failed", (state, journal[-3000:])
        assert f"{node} failed its validation and is out of the pool" in journal, journal[-3000:]
        assert "clocks:" in journal and "hw_slowdown" in journal, journal[-3000:]
        verdict = _verdict(fleet, node)
        assert verdict["passed"] is False and verdict["boot_id"] == fleet.nodes[node]["boot_id"], verdict
        assert fleet.agent_verdict(node) == "down #gpu-health-failed"
        assert fleet.unit_state(node, "vllm.service")["ActiveState"] == "inactive"
        pool = fleet.wait_pool(lambda p: p.get(node, {}).get("op_state") != "running")
        assert pool.get(node, {}).get("op_state") != "running", pool
    finally:
        _clear(fleet, node)
    fleet.converge(why=f"{node}: after the boot validation faults", nodes=[node])


def test_a_fatal_xid_takes_a_serving_node_out_of_rotation(fleet, converged):
    node = _node_of(fleet, "l40s-4x-switch")
    assert fleet.agent_verdict(node) == "up" and fleet.pool()[node]["op_state"] == "running"
    vllm_pid = fleet.sh(node, "systemctl show -p MainPID --value vllm.service").strip()
    fleet.changed(node)
    try:
        t0 = time.monotonic()
        fleet.lab("fault", node, "xid", "79")
        deadline = t0 + 120  # a bound for a hung watcher, not a target: the time is printed below
        answer, pool = None, {}
        while time.monotonic() < deadline:
            answer = fleet.agent_verdict(node)
            pool = fleet.pool()
            if answer.startswith("down") and pool.get(node, {}).get("op_state") != "running":
                break
            time.sleep(0.3)
        seconds = time.monotonic() - t0
        LAB_TIMINGS.append((f"fatal XID on {node} to out of rotation", seconds, 0))
        assert answer == "down #gpu-health-failed", (answer, seconds)  # XID 79: in the journal below
        assert pool.get(node, {}).get("op_state") != "running", (pool, seconds)
        journal = fleet.sh(node, "journalctl -b --no-pager -o cat -u gpufleet-gpu-health-watch.service")
        assert "XID 79" in journal, journal[-2000:]
        # nothing was restarted
        assert fleet.sh(node, "systemctl show -p MainPID --value vllm.service").strip() == vllm_pid

        drift = fleet.drift(limit=node, label=f"drift.yml --limit {node} (fatal XID while serving)")
        out = " ".join(i["detail"] for i in drift.report["nodes"].get(node, []) if i["kind"] == "out_of_service")
        assert "GPU health check failed" in _flat(out) and "XID 79" in out, drift.table
    finally:
        _clear(fleet, node)
    # the XID cleared and the gate's verdict of this boot intact: gpu_health judges it again
    _restore(fleet, node, "fatal XID")
