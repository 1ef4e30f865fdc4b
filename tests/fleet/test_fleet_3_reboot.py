# SPDX-License-Identifier: GPL-3.0-or-later
"""A power cycle of a healthy node: firmware turns ACS redirect back on and /run is empty.

With the boot unit enabled, gpufleet-acs.service clears ACS again at boot; the gate marker is
gone, so the drift check reports the node (registered without a marker of this boot).  With the
boot unit (and what pulls it in) disabled, the drift check also reports ACS re-enabled, and
site.yml brings the node back: registered, drift clean.
"""
from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.slow

MARKER = "/run/gpufleet/nccl-gate.json"
UNIT = "/etc/systemd/system/gpufleet-acs.service"
SETPCI = "setpci -O sysfs.path=/lab/hw/sys/bus/pci"


def _acs_writes(unit_text):
    found = re.findall(r"^ExecStart=\S*setpci .*?-s (\S+) ECAP_ACS\+0x6\.w=([0-9a-f]+):([0-9a-f]+)\s*$",
                       unit_text, re.M | re.I)
    return [(bdf, int(v, 16), int(m, 16)) for bdf, v, m in found]


def _firmware_acs(fleet, node):
    """{bdf: ACS Control as firmware leaves it} from the node's hardware description."""
    data = json.loads((fleet.state / "nodes" / node / "hw" / "lab-node.json").read_text())
    return {d["bdf"]: d["acs_ctl"] for d in data["devices"] if d.get("acs_cap") is not None}


def _registers(fleet, node, writes):
    return {bdf: int(fleet.sh(node, f"{SETPCI} -s {bdf} ECAP_ACS+6.w").strip(), 16) for bdf, _, _ in writes}


def _items(drift, node, role=None, kind=None):
    return [i for i in drift.report["nodes"].get(node, [])
            if (role is None or i["role"] == role) and (kind is None or i["kind"] == kind)]


def _assert_others_unchanged(fleet, drift, node):
    for other in fleet.healthy:
        if other != node:
            assert drift.report["nodes"][other] == [], drift.report["nodes"][other]
    for other in fleet.refused:
        assert {i["kind"] for i in drift.report["nodes"][other]} == {"out_of_service"}


def test_reboot_with_the_boot_unit(fleet, converged):
    node = fleet.healthy[0]
    host = fleet.host(node)
    writes = _acs_writes(host.file(UNIT).content_string)
    firmware = _firmware_acs(fleet, node)
    # firmware turns redirect on again on at least one of the bridges the unit writes
    assert any(firmware[bdf] & mask != value & mask for bdf, value, mask in writes), (writes, firmware)
    old_boot = fleet.nodes[node]["boot_id"]

    fleet.reboot(node)

    assert fleet.nodes[node]["boot_id"] != old_boot
    assert not host.file(MARKER).exists and not host.file("/run/gpufleet").exists, "/run survived the reboot"
    unit = fleet.sh(node, "systemctl show -p ActiveState,SubState,Result gpufleet-acs.service")
    assert "ActiveState=active" in unit and "SubState=exited" in unit and "Result=success" in unit, unit
    now = _registers(fleet, node, writes)
    for bdf, value, mask in writes:
        assert now[bdf] & mask == value & mask, f"{bdf}: ACSCtl {now[bdf]:#06x} after boot, the unit did not clear it"
    # nothing took the node out: it is still in the pool, without a marker of this boot
    assert node in fleet.pool()

    drift = fleet.drift(label="drift.yml (after reboot, boot unit on)")
    assert drift.run.rc != 0, drift.run.explain()
    assert node in drift.report["drifted"], drift.report
    assert not _items(drift, node, role="pcie_p2p"), "ACS was re-applied at boot: no ACS drift expected"
    failed = " ".join(i["detail"] for i in _items(drift, node, "lb_registration", "failed"))
    assert f"no NCCL gate marker at {MARKER}" in failed, drift.table
    registered = " ".join(i["detail"] for i in _items(drift, node, "lb_registration", "changed"))
    assert f"del server vllm_pool/{node}" in registered, drift.table  # registered without a current marker
    assert f'gpufleet_drift_detected{{node="{node}"}} 1' in drift.prom
    _assert_others_unchanged(fleet, drift, node)
    # the check only looked
    assert node in fleet.pool() and not host.file(MARKER).exists


def test_reboot_without_the_boot_unit_then_site_restores(fleet, first_run):
    node = fleet.healthy[0]
    host = fleet.host(node)
    writes = _acs_writes(host.file(UNIT).content_string)
    firmware = _firmware_acs(fleet, node)
    # vllm.service Wants= the boot unit: disabling the boot unit alone still runs it at boot
    wants = fleet.sh(node, "systemctl show -p Wants --value vllm.service").split()
    assert "gpufleet-acs.service" in wants, wants
    fleet.sh(node, "systemctl disable --quiet gpufleet-acs.service vllm.service")

    fleet.reboot(node)

    now = _registers(fleet, node, writes)
    assert now == {bdf: firmware[bdf] for bdf, _, _ in writes}, "registers are not at their firmware values"
    model = fleet.hw(node)
    assert any(model.redirected(i.index, j.index) for i in model.gpus for j in model.gpus if i.index < j.index)
    assert not host.file(MARKER).exists
    assert not host.service("gpufleet-acs.service").is_running

    drift = fleet.drift(label="drift.yml (after reboot, boot unit off)")
    assert drift.run.rc != 0, drift.run.explain()
    assert node in drift.report["drifted"], drift.report
    acs = _items(drift, node, "pcie_p2p", "changed")
    acs_tasks = {i["task"].split(" : ")[-1] for i in acs}
    assert "Clear ACS redirect (gpu_paths)" in acs_tasks, drift.table  # ACS re-enabled
    assert "Enable gpufleet-acs.service" in acs_tasks, drift.table     # the unit is off
    cleared = next(i["detail"] for i in acs if i["task"].endswith("Clear ACS redirect (gpu_paths)"))
    redirecting = [bdf for bdf, value, mask in writes if firmware[bdf] & mask != value & mask]
    assert all(bdf in cleared for bdf in redirecting), (cleared, redirecting)
    failed = " ".join(i["detail"] for i in _items(drift, node, "lb_registration", "failed"))
    assert f"no NCCL gate marker at {MARKER}" in failed, drift.table  # the missing marker
    assert drift.report["nodes"][node], drift.table
    assert re.search(rf"^{node}\s+changed\s+pcie_p2p\s", drift.table, re.M), drift.table
    _assert_others_unchanged(fleet, drift, node)

    run = fleet.site(limit=node, label=f"site.yml --limit {node} (restore)")
    assert fleet.recap_ok(run, node), run.explain()
    assert run.rc == 0, run.explain()
    pool = fleet.pool()
    assert pool.get(node, {}).get("state") == "ready", pool
    assert fleet.config_servers().get(node) == f"{fleet.nodes[node]['address']}:8000"
    marker = json.loads(host.file(MARKER).content_string)
    assert marker["passed"] is True and marker["boot_id"] == fleet.nodes[node]["boot_id"]
    assert host.service("gpufleet-acs.service").is_enabled and host.service("vllm.service").is_enabled
    now = _registers(fleet, node, writes)
    assert all(now[bdf] & mask == value & mask for bdf, value, mask in writes)

    drift = fleet.drift(label="drift.yml (after restore)")
    assert drift.run.rc == 0, drift.run.explain()
    assert drift.report["nodes"][node] == [] and drift.report["drifted"] == [], drift.table
    fleet.dirty = False
