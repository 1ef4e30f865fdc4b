# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet.node.pcie_acs_info, pcie_acs and iommu_info run by `ansible-playbook -c local` against
the lab's generated trees; writes go through the real `setpci`, results are checked with the real
`lspci` and the hardware model."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import playbook as runner

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = Path(__file__).resolve().parent / "playbooks"

pytestmark = pytest.mark.skipif(
    not (shutil.which("setpci") and shutil.which("lspci")), reason="pciutils is not installed"
)

SEED000_DSPS = ["0000:42:00.0", "0000:42:01.0", "0000:42:02.0", "0000:47:00.0", "0000:47:01.0"]


def run_playbook(ansible_env, tmp_path, playbook, node, **extra):
    out_file = tmp_path / ("result-%d.json" % len(list(tmp_path.glob("result-*.json"))))
    extra_vars = dict(extra, lab_root=str(node.root), out_file=str(out_file))
    vars_file = tmp_path / "vars.json"
    vars_file.write_text(json.dumps(extra_vars))
    proc = runner.run_playbook(
        PLAYBOOKS / playbook,
        local=True,
        env=ansible_env,
        timeout=300,
        extra_vars=["ansible_python_interpreter=%s" % sys.executable, "@%s" % vars_file],
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out_file.read_text())
    data["stdout"] = proc.stdout + proc.stderr
    return data


def fix(ansible_env, tmp_path, node, **options):
    return run_playbook(ansible_env, tmp_path, "acs_fix.yml", node, **options)


def tree_digest(node):
    digest = hashlib.sha256()
    for bdf in sorted(node.devices):
        digest.update((node.sysfs / "devices" / bdf / "config").read_bytes())
    return digest.hexdigest()


def lspci_ctl(node, bdf):
    out = subprocess.run(
        ["lspci", "-vvv", "-O", "sysfs.path=%s" % node.sysfs, "-s", bdf], check=True, capture_output=True, text=True
    ).stdout
    return [line.split("\t")[-1] for line in out.splitlines() if "ACSCtl:" in line][0]


def setpci_stand_in(tmp_path, body):
    """A `setpci` earlier on PATH than the real one (lockdown and broken-port stand-ins)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    script = bindir / "setpci"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return {"PATH": "%s:%s" % (bindir, os.environ.get("PATH", "/usr/bin:/bin"))}


# -- read-only modules ---------------------------------------------------------------------------
def test_info_modules_on_seed000(ansible_env, tmp_path, lab_node):
    node = lab_node("l40s-4x-switch")
    data = run_playbook(ansible_env, tmp_path, "acs_info.yml", node)
    assert not data["failed"]
    acs = data["acs"]
    assert acs["changed"] is False
    assert acs["summary"]["blocked_gpu_pairs"] == 6
    assert [p["bdf"] for p in acs["ports"] if p["redirect"]] == SEED000_DSPS
    port = [p for p in acs["ports"] if p["bdf"] == "0000:42:00.0"][0]
    assert port["acs_cap"] == 0x5F and port["acs_ctl"] == 0x1D
    assert port["acs_ctl_flags"]["ReqRedir"] is True and port["acs_ctl_flags"]["EgressCtrl"] is False
    assert port["port_type"] == "downstream_port" and port["vendor_id"] == "0x1000"
    assert [g["bdf"] for g in acs["gpus"]] == sorted(g.bdf for g in node.gpus)
    assert acs["gpus"][0]["upstream"] == ["0000:40:01.1", "0000:41:00.0", "0000:42:00.0"]
    assert [n["bdf"] for n in acs["nics"]] == [node.nics[0].bdf]
    iommu = data["iommu"]
    assert iommu["mode"] == "passthrough" and iommu["recommendation"]["action"] == "none"


def test_info_fails_clearly_on_truncated_config(ansible_env, tmp_path, lab_node):
    node = lab_node("l40s-4x-switch")
    with open(node.sysfs / "devices" / "0000:47:00.0" / "config", "r+b") as handle:
        handle.truncate(64)
    data = run_playbook(ansible_env, tmp_path, "acs_info.yml", node)
    assert data["failed"]
    assert "read only 64 bytes" in data["result"]["msg"] and "become: true" in data["result"]["msg"]


def test_info_fails_clearly_on_missing_tree(ansible_env, tmp_path, lab_node):
    node = lab_node("epyc-rootport-acs")
    data = run_playbook(ansible_env, tmp_path, "acs_info.yml", node, acs_sysfs_path=str(tmp_path / "no-such-tree"))
    assert data["failed"]
    assert "no PCI devices directory at %s/devices" % (tmp_path / "no-such-tree") in data["result"]["msg"]


# -- writes through the real setpci --------------------------------------------------------------
def test_check_then_fix_then_idempotent(ansible_env, tmp_path, lab_node):
    node = lab_node("l40s-4x-switch")
    assert all(node.redirected(i, j) for i in range(4) for j in range(i + 1, 4))
    before = tree_digest(node)

    checked = fix(ansible_env, tmp_path, node, acs_check=True)
    check = checked["result"]
    assert check["changed"] is True and check["changed_ports"] == SEED000_DSPS
    assert [p["acs_ctl_after"] for p in check["ports"] if p["changed"]] == [0x11] * 5
    assert tree_digest(node) == before, "check mode wrote to config space"
    assert "-0000:42:00.0 ACSCtl 0x001d: SrcValid+ TransBlk- ReqRedir+ CmpltRedir+" in checked["stdout"]
    assert "+0000:42:00.0 ACSCtl 0x0011: SrcValid+ TransBlk- ReqRedir- CmpltRedir-" in checked["stdout"]

    done = fix(ansible_env, tmp_path, node)
    result = done["result"]
    assert result["changed"] is True
    assert result["changed_ports"] == SEED000_DSPS and result["failed_port"] is None
    assert result["unchanged_ports"] == ["0000:40:01.1", "0000:40:03.1"]
    assert result["kernel_param"] == "pci=disable_acs_redir=" + ";".join(
        ["0000:40:01.1", "0000:40:03.1"] + SEED000_DSPS
    )
    assert {
        p["bdf"]: (p["acs_ctl_before"], p["acs_ctl_after"]) for p in result["ports"] if p["changed"]
    } == dict.fromkeys(SEED000_DSPS, (29, 17))
    assert result["persist"][2] == {
        "bdf": "0000:42:00.0",
        "value": "0000",
        "mask": "002c",
        "setpci_arg": "ECAP_ACS+0x6.w=0000:002c",
    }
    assert "+0000:42:00.0 ACSCtl 0x0011: SrcValid+ TransBlk- ReqRedir- CmpltRedir- UpstreamFwd+" in done["stdout"]
    # The real lspci reads the new registers; only the redirect bits moved.
    for bdf in SEED000_DSPS:
        assert lspci_ctl(node, bdf) == (
            "SrcValid+ TransBlk- ReqRedir- CmpltRedir- UpstreamFwd+ EgressCtrl- DirectTrans-"
        )
    assert not any(node.redirected(i, j) for i in range(4) for j in range(i + 1, 4))
    assert node.p2p_status(0, 1, "read") == "OK"

    after = tree_digest(node)
    again = fix(ansible_env, tmp_path, node)["result"]
    assert again["changed"] is False and again["changed_ports"] == []
    assert again["unchanged_ports"] == ["0000:40:01.1", "0000:40:03.1"] + SEED000_DSPS
    assert fix(ansible_env, tmp_path, node, acs_check=True)["result"]["changed"] is False
    assert tree_digest(node) == after


def test_set_bits_back_on_every_bridge(ansible_env, tmp_path, lab_node):
    node = lab_node("epyc-rootport-acs")
    fix(ansible_env, tmp_path, node)
    assert not node.redirected(0, 1)
    result = fix(
        ansible_env,
        tmp_path,
        node,
        acs_scope="all_bridges",
        acs_state="set",
        acs_bits=["ReqRedir", "CmpltRedir", "EgressCtrl"],
    )["result"]
    # EgressCtrl is not in the AMD root ports' capability, so only the two redirect bits return.
    assert result["changed_ports"] == ["0000:00:01.1", "0000:00:01.2"]
    assert result["kernel_param"] == ""
    assert [p["acs_ctl_after"] for p in result["ports"]] == [0x1D, 0x1D]
    assert node.redirected(0, 1)


def test_explicit_devices(ansible_env, tmp_path, lab_node):
    node = lab_node("l40s-4x-switch")
    result = fix(ansible_env, tmp_path, node, acs_scope="devices", acs_devices=["42:00.0", "0000:42:01.0"])["result"]
    assert result["changed_ports"] == ["0000:42:00.0", "0000:42:01.0"]
    assert result["kernel_param"] == "pci=disable_acs_redir=0000:42:00.0;0000:42:01.0"
    assert not node.redirected(0, 1) and node.redirected(2, 3)


# -- the VFIO interlock --------------------------------------------------------------------------
def test_vfio_interlock(ansible_env, tmp_path, lab_node):
    node = lab_node("vfio-passthrough")
    vfio_gpu = node.gpus[3].bdf
    before = tree_digest(node)
    refused = fix(ansible_env, tmp_path, node)
    assert refused["failed"]
    assert "vfio-pci" in refused["result"]["msg"] and vfio_gpu in refused["result"]["msg"]
    assert "force: true" in refused["result"]["msg"]
    assert {c["port"] for c in refused["result"]["vfio_conflicts"]} == {"0000:47:00.0", "0000:47:01.0"}
    assert tree_digest(node) == before

    # The switch that routes no passed-through device can be opened up.
    allowed = fix(
        ansible_env, tmp_path, node, acs_scope="devices", acs_devices=["0000:42:00.0", "0000:42:01.0", "0000:42:02.0"]
    )["result"]
    assert allowed["changed_ports"] == ["0000:42:00.0", "0000:42:01.0", "0000:42:02.0"]
    assert not node.redirected(0, 1) and node.redirected(2, 3)

    forced = fix(ansible_env, tmp_path, node, acs_force=True)
    assert not forced["failed"]
    assert forced["result"]["changed_ports"] == ["0000:47:00.0", "0000:47:01.0"]
    assert "force: clearing ACS although %s is bound to vfio-pci" % vfio_gpu in forced["stdout"]


# -- error paths ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "devices,needle",
    [
        (["0000:4g:00.0"], "malformed PCI address '0000:4g:00.0'"),
        (["0000:99:00.0"], "PCI device 0000:99:00.0 is not present under"),
        (["0000:43:00.0"], "PCI device 0000:43:00.0 has no ACS extended capability"),
    ],
)
def test_bad_devices(ansible_env, tmp_path, lab_node, devices, needle):
    node = lab_node("l40s-4x-switch")
    data = fix(ansible_env, tmp_path, node, acs_scope="devices", acs_devices=devices)
    assert data["failed"] and needle in data["result"]["msg"]


def test_setpci_missing_names_the_package(ansible_env, tmp_path, lab_node):
    node = lab_node("l40s-4x-switch")
    before = tree_digest(node)
    data = fix(ansible_env, tmp_path, node, acs_environment={"PATH": str(tmp_path / "empty")})
    assert data["failed"]
    assert "setpci was not found" in data["result"]["msg"] and "pciutils" in data["result"]["msg"]
    assert tree_digest(node) == before


def test_lockdown_refusal_is_named(ansible_env, tmp_path, lab_node):
    """Under lockdown the kernel fails the write with EPERM; pciutils prints a warning and still
    exits 0 (see the sysfs_write source), so the stand-in does exactly that."""
    node = lab_node("l40s-4x-switch")
    before = tree_digest(node)
    env = setpci_stand_in(tmp_path, "echo 'pcilib: sysfs_write: write failed: Operation not permitted' >&2\nexit 0\n")
    data = fix(ansible_env, tmp_path, node, acs_environment=env)
    result = data["result"]
    assert data["failed"]
    assert "kernel lockdown (Secure Boot)" in result["msg"]
    assert "pci=disable_acs_redir=" in result["msg"]
    assert result["failed_port"] == SEED000_DSPS[0]
    assert result["changed_ports"] == [] and result["not_attempted_ports"] == SEED000_DSPS[1:]
    assert tree_digest(node) == before


def test_read_back_mismatch_stops_and_reports(ansible_env, tmp_path, lab_node):
    """A port that ignores the write (the stand-in passes every other write to the real setpci)."""
    node = lab_node("l40s-4x-switch")
    broken = SEED000_DSPS[2]
    env = setpci_stand_in(
        tmp_path, 'for a in "$@"; do [ "$a" = "%s" ] && exit 0; done\nexec %s "$@"\n' % (broken, shutil.which("setpci"))
    )
    data = fix(ansible_env, tmp_path, node, acs_environment=env)
    result = data["result"]
    assert data["failed"]
    assert "reads back 0x001d after writing 0x0011" in result["msg"]
    assert result["failed_port"] == broken
    assert result["changed_ports"] == SEED000_DSPS[:2]
    assert result["not_attempted_ports"] == SEED000_DSPS[3:]
    assert result["changed"] is True
    assert lspci_ctl(node, SEED000_DSPS[0]).startswith("SrcValid+ TransBlk- ReqRedir-")
    assert lspci_ctl(node, SEED000_DSPS[3]).startswith("SrcValid+ TransBlk- ReqRedir+")


def _chattr(flag, path):
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


def test_real_setpci_failure_stops_and_reports(ansible_env, tmp_path, lab_node):
    """An immutable config file: the real setpci cannot open it for writing and fails."""
    if not shutil.which("chattr") or os.geteuid() != 0:
        pytest.skip("needs chattr and root")
    node = lab_node("l40s-4x-switch")
    target = (node.sysfs / "devices" / SEED000_DSPS[1] / "config").resolve()
    if not _chattr("+i", target):
        pytest.skip("this filesystem has no immutable flag")
    try:
        data = fix(ansible_env, tmp_path, node)
    finally:
        _chattr("-i", target)
    result = data["result"]
    assert data["failed"]
    assert "setpci failed on %s with rc 1" % SEED000_DSPS[1] in result["msg"]
    assert "Cannot open" in result["stderr"]
    assert result["failed_port"] == SEED000_DSPS[1]
    assert result["changed_ports"] == SEED000_DSPS[:1]
    assert result["not_attempted_ports"] == SEED000_DSPS[2:]


# -- the plan, unknown ports, deadlines ----------------------------------------------------------
def test_check_mode_shows_the_plan(ansible_env, tmp_path, lab_node):
    node = lab_node("l40s-4x-switch")
    before = tree_digest(node)
    result = fix(ansible_env, tmp_path, node, acs_check=True)["result"]
    assert [p["bdf"] for p in result["plan"]] == ["0000:40:01.1", "0000:40:03.1"] + SEED000_DSPS
    dsp = [p for p in result["plan"] if p["bdf"] == SEED000_DSPS[0]][0]
    assert (dsp["current"], dsp["target"], dsp["mask"]) == (0x1D, 0x11, 0x2C)
    assert dsp["setpci_arg"] == "ECAP_ACS+0x6.w=0000:002c" and dsp["write"] is True
    assert dsp["why"] == "crossed by GPU-GPU or GPU-RDMA-NIC peer traffic; clear ReqRedir CmpltRedir"
    assert result["changed_ports"] == [p["bdf"] for p in result["plan"] if p["write"]]
    assert tree_digest(node) == before


@pytest.mark.parametrize("size", [256, 128])
def test_short_config_space_is_unknown_not_clear(ansible_env, tmp_path, lab_node, size):
    """A downstream port on the GPU path whose extended config space was not read: the audit says
    unknown (never clear) and pcie_acs refuses to write anything, naming the port and the cause."""
    node = lab_node("l40s-4x-switch")
    short = SEED000_DSPS[3]
    with open(node.sysfs / "devices" / short / "config", "r+b") as handle:
        handle.truncate(size)
    info = run_playbook(ansible_env, tmp_path, "acs_info.yml", node)
    assert not info["failed"]
    acs = info["acs"]
    assert acs["summary"]["peer_to_peer_clear"] is False and acs["summary"]["acs_unknown_path_ports"] == 1
    assert [p["bdf"] for p in acs["acs_unknown_ports"]] == [short]
    assert any(short in w and "unknown, not absent" in w for w in acs["warnings_found"])
    before = tree_digest(node)
    for check in (True, False):
        data = fix(ansible_env, tmp_path, node, acs_check=check)
        assert data["failed"]
        msg = data["result"]["msg"]
        assert "ACS state of %s is unknown" % short in msg and "%d bytes" % size in msg
        assert "run as root" in msg and "lspci -xxxx" in msg and "Nothing was written" in msg
        assert data["result"]["failed_port"] == short and data["result"]["changed_ports"] == []
        assert tree_digest(node) == before


def test_setpci_hang_times_out(ansible_env, tmp_path, lab_node):
    node = lab_node("l40s-4x-switch")
    before = tree_digest(node)
    env = setpci_stand_in(tmp_path, "sleep 300\n")
    data = fix(ansible_env, tmp_path, node, acs_environment=env, acs_timeout=1)
    result = data["result"]
    assert data["failed"]
    assert "did not finish within 1 s; its process group was killed" in result["msg"]
    assert "setpci -O sysfs.path=" in result["msg"] and "Changed so far: none" in result["msg"]
    # The root ports already hold the target: the first write is the first downstream port.
    assert result["failed_port"] == SEED000_DSPS[0] and result["changed_ports"] == []
    assert result["not_attempted_ports"] == SEED000_DSPS[1:]
    assert tree_digest(node) == before
