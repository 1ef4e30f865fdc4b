# SPDX-License-Identifier: GPL-3.0-or-later
"""A power cycle: firmware turns ACS redirect back on and /run (the gate's marker) is empty.

With the boot units enabled, gpufleet-acs.service clears ACS again before anything opens the GPUs
and gpufleet-validate.service (playbook validate.yml, run on the node itself) measures the node
again, starts vLLM and lets the node's HAProxy agent say `up`: the node is back in rotation and
the drift check is clean.  With the boot units disabled, nothing measures the node: vLLM does not
start (boot validation starts it), the agent says `down`, the node is out of rotation, and the
drift check reports ACS re-enabled and the missing marker; site.yml then brings it back.  A node
whose validation fails at boot (the x8-degraded one) stays out.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

MARKER = "/run/gpufleet/nccl-gate.json"
UNIT = "/etc/systemd/system/gpufleet-acs.service"
SETPCI = "setpci -O sysfs.path=/lab/hw/sys/bus/pci"
REPO = Path(__file__).resolve().parents[2]
RUNTIME = "/opt/gpufleet"  # what role boot_validation installs: venv, collection
NODE_INVENTORY = "/etc/gpufleet/validate/inventory.yml"  # boot validation's, written by site.yml
SECRETS_ENV = "/etc/vllm/secrets.env"  # vLLM's, 0600: where the node's run reads the API key


def _leaked(fleet, text):
    """The names of the lab's vaulted secrets whose plain text is in text."""
    return [name for name, value in fleet.secrets.items() if value in text]


def _acs_writes(unit_text):
    found = re.findall(
        r"^ExecStart=\S*setpci .*?-s (\S+) ECAP_ACS\+0x6\.w=([0-9a-f]+):([0-9a-f]+)\s*$", unit_text, re.M | re.I
    )
    return [(bdf, int(v, 16), int(m, 16)) for bdf, v, m in found]


def _firmware_acs(fleet, node):
    """{bdf: ACS Control as firmware leaves it} from the node's hardware description."""
    data = json.loads((fleet.state / "nodes" / node / "hw" / "lab-node.json").read_text())
    return {d["bdf"]: d["acs_ctl"] for d in data["devices"] if d.get("acs_cap") is not None}


def _registers(fleet, node, writes):
    return {bdf: int(fleet.sh(node, f"{SETPCI} -s {bdf} ECAP_ACS+6.w").strip(), 16) for bdf, _, _ in writes}


def _items(drift, node, role=None, kind=None):
    return [
        i
        for i in drift.report["nodes"].get(node, [])
        if (role is None or i["role"] == role) and (kind is None or i["kind"] == kind)
    ]


def _drift(fleet, node, label):
    """drift.yml on the rebooted node only (the whole fleet's drift check after site.yml is
    tests/fleet/test_fleet_1_site.py's); its report covers that node alone."""
    drift = fleet.drift(limit=node, label=f"drift.yml --limit {node} ({label})")
    assert list(drift.report.get("nodes", {})) == [node], drift.run.explain()
    return drift


def _assert_others_unchanged(fleet, node):
    """The other nodes kept their place: healthy ones in the pool and ready, refused ones drained."""
    pool = fleet.pool()
    for other in fleet.healthy:
        if other != node:
            assert pool.get(other, {}).get("state") == "ready", pool
    for other in fleet.refused:
        if other != node:
            assert pool.get(other, {}).get("state") == "drain", pool


def _journal(fleet, node, unit):
    return fleet.sh(node, f"journalctl -b --no-pager -o cat -u {unit}")


def test_reboot_with_the_boot_units(fleet, converged):
    node = fleet.healthy[0]
    host = fleet.host(node)
    writes = _acs_writes(host.file(UNIT).content_string)
    firmware = _firmware_acs(fleet, node)
    # firmware turns redirect on again on at least one of the bridges the unit writes
    assert any(firmware[bdf] & mask != value & mask for bdf, value, mask in writes), (writes, firmware)
    old_boot = fleet.nodes[node]["boot_id"]
    # the node sees neither the controller's checkout (but the lab package and the vLLM stand-in's
    # model shapes) nor its venv: boot validation runs the runtime site.yml installed from the wheelhouse
    assert fleet.sh(node, f"ls -A {REPO}").split() == ["lab", "plugins"]
    assert fleet.sh(node, f"ls -A {REPO}/plugins/module_utils").split() == ["serving"]
    assert fleet.sh(node, f"ls -A {REPO}/plugins/module_utils/serving").split() == ["_model_profiles.py"]
    assert fleet.sh(node, f"test -e {sys.prefix}/bin/ansible-playbook || echo hidden").strip() == "hidden"
    unit = host.file("/etc/systemd/system/gpufleet-validate.service").content_string
    assert f"ExecStart={RUNTIME}/venv/bin/ansible-playbook gpufleet.node.validate\n" in unit, unit
    assert "2.19.14" in fleet.sh(node, f"{RUNTIME}/venv/bin/ansible-playbook --version | head -1")
    assert host.file(f"{RUNTIME}/collections/ansible_collections/gpufleet/node/playbooks/validate.yml").exists
    # under Mitogen, from the venv's own copy (ansible-playbook refuses a strategy it cannot find)
    cfg = host.file("/etc/gpufleet/validate/ansible.cfg").content_string
    assert "\nstrategy = mitogen_linear\n" in cfg and f"\nstrategy_plugins = {RUNTIME}/venv/mitogen-strategy\n" in cfg
    assert host.file(f"{RUNTIME}/venv/mitogen-strategy/mitogen_linear.py").exists

    t0 = time.monotonic()
    fleet.reboot(node)

    boot = fleet.nodes[node]["boot_id"]
    assert boot != old_boot
    acs = fleet.unit_state(node, "gpufleet-acs.service")
    assert acs == {"ActiveState": "active", "SubState": "exited", "Result": "success"}, acs
    validation = fleet.unit_state(node, "gpufleet-validate.service")
    assert validation == {"ActiveState": "active", "SubState": "exited", "Result": "success"}, (
        validation,
        _journal(fleet, node, "gpufleet-validate.service")[-4000:],
    )
    now = _registers(fleet, node, writes)
    for bdf, value, mask in writes:
        assert now[bdf] & mask == value & mask, f"{bdf}: ACSCtl {now[bdf]:#06x} after boot"
    # the gate ran again in this boot, on idle GPUs, and passed
    marker = json.loads(host.file(MARKER).content_string)
    assert marker["boot_id"] == boot and marker["passed"] is True, marker
    journal = _journal(fleet, node, "gpufleet-validate.service")
    assert re.search(rf"^{node}\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=0", journal, re.M), journal[-3000:]
    assert host.service("vllm.service").is_running
    assert fleet.agent_verdict(node) == "up"
    pool = fleet.wait_pool(lambda p: p.get(node, {}).get("op_state") == "running")
    assert pool[node]["state"] == "ready" and pool[node]["op_state"] == "running", pool
    print(f"\n{node}: from reboot to back in rotation in {time.monotonic() - t0:.1f} s")
    # the node's run read the vaulted API key from vLLM's secrets file (its readiness check passed
    # on /v1/models, which asks for it) and logged neither secret
    assert not _leaked(fleet, fleet.sh(node, "journalctl -b --no-pager -o cat")), "a secret in the journal"

    drift = _drift(fleet, node, "after reboot, boot units on")
    assert drift.run.rc == 0, drift.run.explain()
    assert drift.report["nodes"][node] == [] and drift.report["drifted"] == [], drift.table
    _assert_others_unchanged(fleet, node)

    # validate.yml from the controller, in the same boot: the verdict holds, nothing changes
    run = fleet.playbook("validate.yml", limit=node, label=f"validate.yml --limit {node} (controller)")
    assert run.rc == 0 and run.recap[node]["changed"] == 0, run.explain()
    assert json.loads(host.file(MARKER).content_string) == marker
    fleet.restored(node)


def test_reboot_without_the_boot_units_then_site_restores(fleet, converged):
    node = fleet.healthy[0]
    host = fleet.host(node)
    writes = _acs_writes(host.file(UNIT).content_string)
    firmware = _firmware_acs(fleet, node)
    # nothing pulls the boot units in: vLLM is ordered after the ACS unit, never Wants= it
    assert "gpufleet-acs.service" not in fleet.sh(node, "systemctl show -p Wants --value vllm.service").split()
    fleet.changed(node)
    fleet.sh(node, "systemctl disable --quiet gpufleet-acs.service gpufleet-validate.service")

    fleet.reboot(node)

    now = _registers(fleet, node, writes)
    assert now == {bdf: firmware[bdf] for bdf, _, _ in writes}, "registers are not at their firmware values"
    model = fleet.hw(node)
    assert any(model.redirected(i.index, j.index) for i in model.gpus for j in model.gpus if i.index < j.index)
    assert not host.file(MARKER).exists
    for unit in ("gpufleet-acs.service", "gpufleet-validate.service", "vllm.service"):
        assert fleet.unit_state(node, unit)["ActiveState"] == "inactive", unit
    # out of rotation by itself: still a member of the pool, but its agent says down
    # (one word for the balancer; the reason in full only in the node's journal)
    assert fleet.agent_verdict(node) == "down #no-marker"
    journal = fleet.sh(node, "journalctl -b -t gpufleet-lb-agent --no-pager -o cat")
    assert f"no NCCL gate marker at {MARKER}: the gate has not run since boot" in journal, journal
    pool = fleet.wait_pool(lambda p: p.get(node, {}).get("op_state") == "stopped")
    assert pool[node]["op_state"] == "stopped", pool

    drift = _drift(fleet, node, "after reboot, boot units off")
    assert drift.run.rc != 0, drift.run.explain()
    assert node in drift.report["drifted"], drift.report
    acs = _items(drift, node, "pcie_p2p", "changed")
    acs_tasks = {i["task"].split(" : ")[-1] for i in acs}
    assert "Clear ACS redirect (gpu_paths)" in acs_tasks, drift.table  # ACS re-enabled
    assert "Enable gpufleet-acs.service" in acs_tasks, drift.table  # the unit is off
    boot_validation = {i["task"].split(" : ")[-1] for i in _items(drift, node, "boot_validation", "changed")}
    assert "Enable boot validation" in boot_validation, drift.table
    cleared = next(i["detail"] for i in acs if i["task"].endswith("Clear ACS redirect (gpu_paths)"))
    redirecting = [bdf for bdf, value, mask in writes if firmware[bdf] & mask != value & mask]
    assert all(bdf in cleared for bdf in redirecting), (cleared, redirecting)
    failed = " ".join(i["detail"] for i in _items(drift, node, "lb_registration", "failed"))
    assert f"no NCCL gate marker at {MARKER}" in failed, drift.table  # the missing marker
    assert re.search(rf"^{node}\s+changed\s+pcie_p2p\s", drift.table, re.M), drift.table
    assert f'gpufleet_drift_detected{{node="{node}"}} 1' in drift.prom
    _assert_others_unchanged(fleet, node)

    # site.yml writes vLLM's secrets file and the boot validation inventory again, with -vvv --diff:
    # the vaulted secrets are in neither the output nor the inventory nor the journal
    fleet.sh(node, f"rm -f {SECRETS_ENV} {NODE_INVENTORY}")
    run = fleet.site("-vvv", "--diff", limit=node, label=f"site.yml -vvv --diff --limit {node} (restore)")
    assert fleet.recap_ok(run, node) and run.rc == 0, run.explain()
    assert "Write the vLLM secrets env file" in run.output and "+++ after" in run.output, run.output[-3000:]
    assert not _leaked(fleet, run.output), f"{_leaked(fleet, run.output)} in the output of site.yml -vvv --diff"
    assert host.file(SECRETS_ENV).mode == 0o600
    node_inventory = host.file(NODE_INVENTORY).content_string
    assert not _leaked(fleet, node_inventory) and "$ANSIBLE_VAULT" not in node_inventory, node_inventory
    assert not _leaked(fleet, fleet.sh(node, "journalctl -b --no-pager -o cat")), "a secret in the journal"
    pool = fleet.wait_pool(lambda p: p.get(node, {}).get("op_state") == "running")
    assert pool.get(node, {}).get("state") == "ready" and pool[node]["op_state"] == "running", pool
    assert fleet.config_servers().get(node) == f"{fleet.nodes[node]['address']}:8000"
    marker = json.loads(host.file(MARKER).content_string)
    assert marker["passed"] is True and marker["boot_id"] == fleet.nodes[node]["boot_id"]
    assert host.service("gpufleet-acs.service").is_enabled and host.service("gpufleet-validate.service").is_enabled
    assert fleet.agent_verdict(node) == "up"
    now = _registers(fleet, node, writes)
    assert all(now[bdf] & mask == value & mask for bdf, value, mask in writes)

    drift = _drift(fleet, node, "after restore")
    assert drift.run.rc == 0, drift.run.explain()
    assert drift.report["nodes"][node] == [] and drift.report["drifted"] == [], drift.table
    fleet.restored(node)


def test_a_node_whose_validation_fails_at_boot_stays_out(fleet, first_run):
    if not fleet.refused:
        pytest.skip("no node in this fleet is expected to fail its gate")
    node = fleet.refused[0]
    host = fleet.host(node)

    fleet.reboot(node)

    boot = fleet.nodes[node]["boot_id"]
    validation = fleet.unit_state(node, "gpufleet-validate.service")
    assert validation["ActiveState"] == "failed" and validation["Result"] == "exit-code", validation
    journal = re.sub(r"\s+", " ", _journal(fleet, node, "gpufleet-validate.service"))
    assert f"{node} failed its validation and is out of the pool" in journal, journal[-3000:]
    assert "trained to x8 of x16" in journal, journal[-3000:]
    # measured in this boot (after ACS was re-applied) and failed; no server, not in the pool
    marker = json.loads(host.file(MARKER).content_string)
    assert marker["boot_id"] == boot and marker["passed"] is False, marker
    assert fleet.unit_state(node, "vllm.service")["ActiveState"] == "inactive"
    fleet.assert_drained(node)

    drift = _drift(fleet, node, "after the refused node's reboot")
    assert {i["kind"] for i in drift.report["nodes"][node]} == {"out_of_service"}, drift.table
    fleet.restored(node)  # measured and refused in this boot: as site.yml leaves it
