# SPDX-License-Identifier: GPL-3.0-or-later
"""The hardware model: real pciutils read its trees, stand-ins see the current registers."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

import lab.hwmodel as hw

pytestmark = pytest.mark.skipif(not shutil.which("lspci"), reason="pciutils is not installed")


def lspci(node, *args):
    out = subprocess.run(
        ["lspci", "-O", f"sysfs.path={node.sysfs}", "-A", "linux-sysfs", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout


def setpci(node, bdf, reg):
    return subprocess.run(
        ["setpci", "-O", f"sysfs.path={node.sysfs}", "-s", bdf, reg], check=True, capture_output=True, text=True
    ).stdout.strip()


def test_lspci_sees_every_function_with_its_class(lab_node, any_profile):
    node = lab_node(any_profile)
    listed = {line.split()[0]: line for line in lspci(node, "-D").splitlines()}
    assert set(listed) == set(node.devices)
    for gpu in node.gpus:
        # class 0x0302 (data-center parts) or 0x0300 (RTX workstation/consumer boards)
        assert re.search(r" (3D|VGA compatible) controller: NVIDIA Corporation", listed[gpu.bdf]), listed[gpu.bdf]
    for bridge in node.bridges:
        assert "PCI bridge" in listed[bridge.bdf]


def test_lspci_decodes_the_links_as_trained(lab_node):
    node = lab_node("l40s-x8-degraded")
    text = lspci(node, "-vv", "-s", node.gpus[2].bdf)
    assert re.search(r"LnkCap:\s+Port #0, Speed 16GT/s, Width x16", text)
    assert re.search(r"LnkSta:\s+Speed 16GT/s, Width x8", text)
    assert node.gpus[2].width_current == 8 and node.gpus[1].width_current == 16


def test_bus_numbers_nest_as_lspci_tree_shows(lab_node):
    node = lab_node("l40s-4x-switch")
    tree = lspci(node, "-t")
    # Root port 40:01.1 -> switch 41-45 with three downstream ports (two GPUs, one NIC).
    assert "01.1-[41-45]----00.0-[42-45]--+-00.0-[43]----00.0" in tree


def test_topology_classes(lab_node):
    seed = lab_node("l40s-4x-switch")
    assert [seed.link_type(0, j) for j in range(4)] == ["X", "PIX", "PHB", "PHB"]
    assert seed.path_bridges(0, 1) == ["0000:42:00.0", "0000:42:01.0"]
    assert seed.path_bridges(1, 2) == [
        "0000:42:01.0",
        "0000:41:00.0",
        "0000:40:01.1",
        "0000:40:03.1",
        "0000:46:00.0",
        "0000:47:00.0",
    ]
    h100 = lab_node("h100-sxm-8x")
    assert h100.link_type(0, 7) == "NV18" and h100.pcie_link_type(0, 7) == "SYS"
    assert h100.pcie_link_type(0, 2) == "NODE"
    epyc = lab_node("epyc-rootport-acs")
    assert epyc.link_type(0, 1) == "PHB" and epyc.path_bridges(0, 1) == ["0000:00:01.1", "0000:00:01.2"]


def test_live_registers_drive_p2p_and_reset_restores_firmware(lab_node):
    node = lab_node("l40s-4x-switch")
    assert setpci(node, "0000:42:00.0", "ECAP_ACS+0x6.w") == "001d"
    assert node.redirected(0, 1) and node.p2p_status(0, 1, "r") == "CNS"
    for bdf in node.path_bridges(0, 1):
        setpci(node, bdf, "ECAP_ACS+0x6.w=0000:002c")
    assert setpci(node, "0000:42:00.0", "ECAP_ACS+0x6.w") == "0011"
    assert not node.redirected(0, 1) and node.p2p_status(0, 1, "read") == "OK"
    assert node.redirected(2, 3), "only the bridges written may change"
    node.reset_firmware()
    assert node.redirected(0, 1) and setpci(node, "0000:42:00.0", "ECAP_ACS+0x6.w") == "001d"


def test_nvlink_p2p_ignores_pcie_acs(lab_node):
    node = lab_node("h100-sxm-8x")
    assert node.redirected(0, 1)
    assert node.p2p_status(0, 1, "read") == "OK" and node.p2p_status(0, 1, "nvlink") == "OK"
    assert node.p2p_status(0, 1, "pcie") == "CNS"


def test_vfio_bound_gpu_is_not_peer_capable(lab_node):
    node = lab_node("vfio-passthrough")
    assert node.gpus[3].driver == "vfio-pci"
    assert node.p2p_status(2, 3, "read") == "NS"


def test_build_refuses_to_overwrite_and_load_needs_a_machine(tmp_path):
    hw.build("epyc-rootport-acs", tmp_path)
    with pytest.raises(FileExistsError):
        hw.build("epyc-rootport-acs", tmp_path)
    with pytest.raises(RuntimeError, match="not a lab machine"):
        hw.Node.load(tmp_path / "nothing")
    with pytest.raises(KeyError, match="unknown lab profile"):
        hw.describe("no-such-profile")
