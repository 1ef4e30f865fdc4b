# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU health: every fault kind of `python -m lab fault` keeps a node out at site.yml and at boot
validation (playbooks/validate.yml, with its gate), and a reboot clears what a reboot clears.

On a lab of its own (module scope, so the session's fleet stays small and fast): node1 and node3
are ``h100-sxm-8x`` (the NVSwitch faults need one), node2 an ``l40s-4x-switch``.  The checks are
independent, so every fault goes into an H100 node at once, one per GPU (or per node: the fabric
manager, nvidia_peermem, an NVSwitch), and one run judges them all: each check must fail naming
its fault's GPU, and no other check may fail.  A link trained down is a failure only under load
(idle GPUs downshift): `gpu_health_busy=true` at site.yml; at boot validation the idle check
warns and the NCCL gate of node2 (a PCIe-only node: all-reduce runs over the link) keeps it out
(an H100's all-reduce runs over NVLink).  nvidia_peermem missing is a warning unless required
(`gpu_health_require_peermem=true` here; the warning is tests/fleet/test_fleet_5_health.py's).

Two playbook runs: site.yml --tags gpu_health on node1, and validate.yml on the three nodes at
once, node3 rebooted after its faults went in: the XID and SXid of the old boot, the pending remap
(now applied), the volatile ECC count, the stopped fabric manager and the unloaded peermem are
gone, and the hardware faults (NVLink down, HW slowdown, AER, the link trained down) still keep
it out.  Before each run the nodes are put in the balancer, in rotation, so that "out" (drained,
its line kept in the config file: a node taken out is not forgotten) can fail.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lab import haproxy
from tests.harness.lab import Lab, own_lab

pytestmark = [pytest.mark.slow, pytest.mark.needs_lab]

H100, L40S, REBOOTED = "node1", "node2", "node3"
VERDICT = "/run/gpufleet/gpu-health.json"
BACKEND = "vllm_pool"


class Fault:
    """One injected fault: `lab fault NODE KIND [CODE] --gpu GPU`, the check it must fail, words of
    that check's reason, the action it names, whether a reboot clears it, and what the check must
    name: `gpu` (the GPU's bus id among its GPUs), `switch` (NVSwitch GPU modulo 4's bus id in its
    reason), `all` (every GPU's bus id in its reason), None (a node-wide fault)."""

    def __init__(self, kind, check, words, action, cleared_by_reboot, gpu=0, code=None, names="gpu"):
        self.kind, self.check, self.words, self.action = kind, check, words, action
        self.cleared_by_reboot, self.gpu, self.code, self.names = cleared_by_reboot, gpu, code, names

    def __repr__(self):
        return f"{self.kind}{' ' + str(self.code) if self.code else ''} (GPU {self.gpu})"


# One of each kind on node1 (h100-sxm-8x, 8 GPUs), each on a GPU of its own.
H100_FAULTS = [
    Fault("xid", "xid", "XID 79", "reboot", True, gpu=0, code=79),
    Fault("sxid", "sxid", "SXid 20034 on NVSwitch", "reboot", True, gpu=0, code=20034, names="switch"),
    Fault("remap-pending", "row_remap", "row remapping pending", "reset the GPU", True, gpu=1),
    Fault("ecc-uncorrectable", "ecc", "volatile uncorrectable ECC errors", "reset the GPU", True, gpu=2),
    Fault("hw-slowdown", "clocks", "hw_slowdown", "drain and inspect the hardware", False, gpu=3),
    Fault("aer", "pcie_aer", "1 non-fatal AER error(s)", "drain and inspect the hardware", False, gpu=4),
    Fault("nvlink-down", "nvlink", "link(s) 0 inactive", "reset the GPU", False, gpu=5),
    Fault("link-degrade", "pcie_link", "x8 below port", "drain and inspect the hardware", False, gpu=6),
    Fault(
        "fabric-manager-stop",
        "fabric_manager",
        "nvidia-fabricmanager is inactive",
        "fix the node configuration",
        True,
        names="all",
    ),
    Fault("peermem-unload", "peermem", "nvidia_peermem is not loaded", "fix the node configuration", True, names=None),
]
IDLE_WARNS = {"pcie_link"}  # judged under load only: the idle check warns (boot validation)


def _flat(text):
    return re.sub(r"\s+", " ", text).replace("''", "'")


PROFILES = ["h100-sxm-8x", "l40s-4x-switch", "h100-sxm-8x"]  # node1, node2, node3


class HealthLab(Lab):
    """The module's lab (own_lab: no spare node), with the faults' and the balancer's helpers."""

    def read_hardware(self):
        """Each node's GPU and NVSwitch bus ids."""
        self.bdfs, self.switches = {}, {}
        for node in self.fleet_nodes:
            gpus = sorted((d for d in self.hw(node).data["devices"] if d["kind"] == "gpu"), key=lambda d: d["index"])
            self.bdfs[node] = [g["bdf"] for g in gpus]
            self.switches[node] = (self.hw(node).data.get("nvswitch") or {}).get("bdfs", [])

    def fault(self, node, kind, code=None, gpu=0):
        from lab import faults
        from lab.fleet import Fleet

        return faults.inject(Fleet(self.state), node, kind, code, gpu, log=lambda *_: None)

    def inject_all(self, *nodes):
        """After a clear: every fault of H100_FAULTS on an H100 node, a link trained down on node2."""
        for node in nodes:
            self.fault(node, "clear")
            if node == L40S:
                self.fault(L40S, "link-degrade", gpu=0)
            else:
                for f in H100_FAULTS:
                    self.fault(node, f.kind, f.code, f.gpu)

    # --- the balancer: put a node in, as registration leaves it, so that "out" can fail ---------
    def socket(self):
        return self.state / "haproxy.sock"

    def config(self):
        return Path(self.fleet.balancer().spec["config"])

    def register(self, *nodes):
        sock, config = self.socket(), self.config()
        for node in nodes:
            if node not in haproxy.pool(sock, BACKEND):
                haproxy.add_server(sock, BACKEND, node, self.spec(node)["address"], 8000)
            else:  # drained by an earlier run: in rotation again
                haproxy.run(sock, f"set server {BACKEND}/{node} state ready")
            config.write_text(
                haproxy.config_with_server(config.read_text(), BACKEND, node, self.spec(node)["address"], 8000)
            )
        pool = haproxy.pool(sock, BACKEND)
        assert all(pool.get(node, {}).get("state") == "ready" for node in nodes), pool

    def balancer_state(self):
        """(the backend's servers at runtime, the config file's text): what `out` is judged on."""
        return haproxy.pool(self.socket(), BACKEND), self.config().read_text()

    def assert_out(self, node, state=None):
        """Out of rotation, not forgotten: drained at runtime, its line kept in the config file."""
        servers, config = state or self.balancer_state()
        assert servers.get(node, {}).get("state") == "drain", servers
        assert re.search(rf"^\s+server\s+{node}\s", config, re.M), config

    def verdict(self, node):
        return json.loads(self.ssh(node, f"cat {VERDICT}"))

    def boot_id(self, node):
        return self.ssh(node, "cat /proc/sys/kernel/random/boot_id").strip()


@pytest.fixture(scope="module")
def health_lab():
    with own_lab(PROFILES, "health", lab_class=HealthLab) as lab:
        lab.read_hardware()
        yield lab


@pytest.fixture(scope="module")
def validation(health_lab):
    """validate.yml on the three nodes, every fault in, node3 rebooted since, all in the balancer."""
    lab = health_lab
    lab.inject_all(H100, L40S, REBOOTED)
    old_boot = lab.boot_id(REBOOTED)
    lab.lab("reboot", REBOOTED)
    assert lab.boot_id(REBOOTED) != old_boot
    lab.register(H100, L40S, REBOOTED)
    run = lab.playbook(
        "validate.yml",
        extra_vars=["gpu_health_require_peermem=true"],
        label="validate.yml (node1: every fault kind; node2: link trained down; node3: the same, rebooted)",
    )
    assert run.rc != 0, run.explain()
    # what the run left, whichever test of this module runs next
    return run, {n: lab.verdict(n) for n in (H100, L40S, REBOOTED)}, lab.balancer_state()


def _assert_each_fault_named(lab, node, failures, verdict, faults, warned=()):
    """Exactly the faults' checks failed, each naming its fault (GPU, words, action), in the
    play's failure and in the verdict of this boot; `warned` checks are warnings instead."""
    assert verdict["passed"] is False and verdict["boot_id"] == lab.boot_id(node), verdict
    failed = {c["name"]: c for c in verdict["checks"]}
    expected = {f.check for f in faults} - set(warned)
    assert set(failed) == expected, (sorted(failed), sorted(expected), verdict)
    for f in faults:
        bdf = lab.bdfs[node][f.gpu]
        if f.check in warned:
            warning = {w["name"]: w for w in verdict["warnings"]}.get(f.check)
            assert warning and bdf in warning["gpus"] and f.words in warning["reason"], (f, verdict)
            assert f"{f.check}: " not in failures, (f, failures)
            continue
        check = failed[f.check]
        assert f.words in check["reason"] and check["action"] == f.action, (f, check)
        if f.names == "gpu":
            assert bdf in check["gpus"], (f, check)
        elif f.names == "switch":
            assert lab.switches[node][f.gpu % 4] in check["reason"], (f, check)
        elif f.names == "all":
            assert all(b in check["reason"] for b in lab.bdfs[node]), (f, check)
        assert f"{f.check}: " in failures and f.words in failures, (f, failures)
        assert f"-> action: {f.action}" in failures, (f, failures)


def test_every_fault_keeps_the_node_out_at_site(health_lab):
    lab = health_lab
    lab.inject_all(H100)
    lab.register(H100)
    run = lab.playbook(
        "site.yml",
        "--tags",
        "gpu_health",
        limit=H100,
        extra_vars=["gpu_health_busy=true", "gpu_health_require_peermem=true"],
        label=f"site.yml --limit {H100} --tags gpu_health (every fault kind, h100-sxm-8x)",
    )
    assert run.rc != 0 and run.recap[H100]["failed"] == 1 and run.recap[H100]["rescued"] == 1, run.explain()
    failures = _flat("\n".join(run.host_failures(H100)))
    assert f"{H100} is out of the pool" in failures and "GPU health check failed" in failures, failures
    _assert_each_fault_named(lab, H100, failures, lab.verdict(H100), H100_FAULTS)
    lab.assert_out(H100)


def test_every_fault_keeps_the_node_out_at_boot_validation(health_lab, validation):
    lab, (run, verdicts, balancer) = health_lab, validation
    for node in (H100, L40S):
        assert run.recap[node]["failed"] == 1, run.explain()
        lab.assert_out(node, balancer)
    # node1: every check but the idle PCIe link fails; the gate never runs on a failing node
    failures = _flat("\n".join(run.host_failures(H100)))
    assert f"{H100} failed its validation and is out of the pool" in failures, failures
    assert "GPU health check failed" in failures and "NCCL" not in failures, failures
    _assert_each_fault_named(lab, H100, failures, verdicts[H100], H100_FAULTS, warned=IDLE_WARNS)
    # node2: gpu_health warns about its idle x8 link, the gate (all-reduce over PCIe) fails it
    failures = _flat("\n".join(run.host_failures(L40S)))
    assert f"{L40S} failed its validation and is out of the pool" in failures, failures
    assert "NCCL all-reduce gate failed" in failures and "trained to x8 of x16" in failures, failures
    verdict = verdicts[L40S]
    assert verdict["passed"] is True and verdict["boot_id"] == lab.boot_id(L40S), verdict
    assert [w["name"] for w in verdict["warnings"]] == ["pcie_link"], verdict
    assert lab.bdfs[L40S][0] in verdict["warnings"][0]["gpus"], verdict


def test_a_reboot_clears_what_it_clears_and_boot_validation_keeps_the_rest_out(health_lab, validation):
    import lab.hwmodel as hw

    lab, (run, verdicts, balancer) = health_lab, validation
    remaining = [f for f in H100_FAULTS if not f.cleared_by_reboot]
    assert run.recap[REBOOTED]["failed"] == 1, run.explain()
    failures = _flat("\n".join(run.host_failures(REBOOTED)))
    assert f"{REBOOTED} failed its validation and is out of the pool" in failures, failures
    _assert_each_fault_named(lab, REBOOTED, failures, verdicts[REBOOTED], remaining, warned=IDLE_WARNS)
    for f in H100_FAULTS:
        if f.cleared_by_reboot:
            assert f"{f.check}: " not in failures, (f, failures)
    lab.assert_out(REBOOTED, balancer)
    # the lab's own judgement agrees: only the hardware's faults remain
    node = lab.hw(REBOOTED)
    assert len(hw.health.keeps_out(node.root, node.data)) == len(remaining), hw.health.keeps_out(node.root, node.data)
    # the pending remap was applied by the reset; nvidia-fabricmanager runs again
    state = hw.health.load(node.root, node.data)
    assert state["gpus"]["1"]["remapped_rows"] == {
        "correctable": 0,
        "uncorrectable": 1,
        "pending": False,
        "failure": False,
    }
    assert lab.ssh(REBOOTED, "systemctl is-active nvidia-fabricmanager").strip() == "active"
