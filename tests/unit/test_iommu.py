# SPDX-License-Identifier: GPL-3.0-or-later
"""IOMMU mode, groups, vfio-pci and recommendation (_iommu) on the lab's generated machines."""

from __future__ import annotations

import shutil

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.pcie import _iommu, _sysfs


def audit(node):
    return _iommu.audit(str(node.root / "sys"), str(node.root / "proc"))


@pytest.mark.parametrize(
    "cmdline,expected",
    [
        ("BOOT_IMAGE=/vmlinuz ro amd_iommu=on iommu=pt quiet", {"amd_iommu": "on", "iommu": "pt"}),
        ("intel_iommu=on,sm_on iommu.strict=1", {"intel_iommu": "on,sm_on", "iommu.strict": "1"}),
        ("iommu.passthrough=1", {"iommu.passthrough": "1"}),
        ("root=/dev/sda1 quiet", {}),
    ],
)
def test_parse_cmdline(cmdline, expected):
    params = _iommu.parse_cmdline(cmdline)
    assert params.pop("disable_acs_redir") == []
    assert params == expected


def test_parse_disable_acs_redir():
    params = _iommu.parse_cmdline(
        "ro pci=noaer,disable_acs_redir=0000:42:00.0;0000:42:01.0;pci:10b5:8796,realloc quiet"
    )
    assert params["disable_acs_redir"] == ["0000:42:00.0", "0000:42:01.0", "pci:10b5:8796"]


@pytest.mark.parametrize(
    "params,mode",
    [
        ({"intel_iommu": "off"}, "off"),
        ({"amd_iommu": "off"}, "off"),
        ({"iommu": "pt"}, "passthrough"),
        ({"iommu.passthrough": "1"}, "passthrough"),
        ({"iommu.strict": "1"}, "translated-strict"),
        ({"intel_iommu": "on,strict"}, "translated-strict"),
        ({"iommu.strict": "0"}, "translated-lazy"),
        ({}, None),
    ],
)
def test_cmdline_mode(params, mode):
    assert _iommu._cmdline_mode(params)[0] == mode


def test_seed000_passthrough_no_recommendation(lab_node):
    result = audit(lab_node("l40s-4x-switch"))
    assert result["mode"] == "passthrough" and result["enabled"]
    assert result["mode_source"] == "iommu_groups/*/type = identity"
    assert result["units"] == ["ivhd0", "ivhd1"]
    assert result["cmdline_params"] == {"amd_iommu": "on", "iommu": "pt"}
    assert len(result["gpus"]) == 4
    assert all(g["group_type"] == "identity" and g["group_devices"] == [g["bdf"]] for g in result["gpus"])
    assert result["vfio_devices"] == []
    assert result["recommendation"]["action"] == "none"


def test_translated_multi_gpu_host_gets_iommu_pt(lab_node):
    result = audit(lab_node("epyc-rootport-acs"))
    assert result["mode"] == "translated-lazy"
    assert result["recommendation"] == {
        "action": "set_kernel_param",
        "kernel_param": "iommu=pt",
        "reason": result["recommendation"]["reason"],
    }
    assert "bare-metal host with 2 GPUs" in result["recommendation"]["reason"]


def test_vfio_host_keeps_its_iommu(lab_node):
    node = lab_node("vfio-passthrough")
    result = audit(node)
    assert result["vfio_devices"] == [{"bdf": node.gpus[3].bdf, "iommu_group": str(node.gpus[3].rec["iommu_group"])}]
    assert [g["driver"] for g in result["gpus"]] == ["nvidia", "nvidia", "nvidia", "vfio-pci"]
    assert result["recommendation"]["action"] == "keep"


def test_strict_from_group_types(lab_node):
    node = lab_node("epyc-rootport-acs")
    for type_file in (node.root / "sys" / "kernel" / "iommu_groups").glob("*/type"):
        type_file.write_text("DMA\n")
    assert audit(node)["mode"] == "translated-strict"


def test_old_kernel_without_type_files_uses_cmdline(lab_node):
    node = lab_node("l40s-4x-switch")
    for type_file in (node.root / "sys" / "kernel" / "iommu_groups").glob("*/type"):
        type_file.unlink()
    result = audit(node)
    assert result["mode"] == "passthrough"
    assert result["mode_source"] == "kernel command line iommu=pt"


def test_no_iommu_is_off(lab_node):
    node = lab_node("epyc-rootport-acs")
    shutil.rmtree(node.root / "sys" / "class" / "iommu")
    shutil.rmtree(node.root / "sys" / "kernel" / "iommu_groups")
    (node.root / "proc" / "cmdline").write_text("ro amd_iommu=off\n")
    result = audit(node)
    assert result["mode"] == "off" and not result["enabled"]
    assert all(g["iommu_group"] is None or g["group_type"] is None for g in result["gpus"])
    assert result["recommendation"]["action"] == "none"


def test_disable_acs_redir_reported(lab_node):
    node = lab_node("l40s-4x-switch")
    (node.root / "proc" / "cmdline").write_text("ro iommu=pt pci=disable_acs_redir=0000:42:00.0;0000:42:01.0\n")
    assert audit(node)["disable_acs_redir"] == ["0000:42:00.0", "0000:42:01.0"]


def test_virtual_machine_gets_no_recommendation(lab_node):
    node = lab_node("epyc-rootport-acs")
    (node.root / "proc" / "cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu vme de hypervisor avx2\n")
    result = audit(node)
    assert result["virtual_machine"] is True
    assert result["recommendation"]["action"] == "none"
    (node.root / "proc" / "cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu vme de avx2\n")
    assert audit(node)["virtual_machine"] is False


@pytest.mark.parametrize("missing", ["sysfs_root", "proc_path", "sysfs_path"])
def test_missing_sysfs_tree_is_an_error(lab_node, tmp_path, missing):
    """A tree that is not there is an error, never "IOMMU off, no GPUs"."""
    node = lab_node("l40s-4x-switch")
    args = {"sysfs_root": str(node.root / "sys"), "proc_path": str(node.root / "proc"), "sysfs_path": str(node.sysfs)}
    args[missing] = str(tmp_path / "nope")
    with pytest.raises((_iommu.IommuError, _sysfs.PciTreeMissing), match=str(tmp_path / "nope")):
        _iommu.audit(**args)


@pytest.mark.parametrize("tree", ["none", "empty"])
def test_empty_iommu_root_fails(lab_node, tmp_path, tree):
    """A sysfs root that exists but holds no PCI tree (none, or one without devices) is an error,
    like one that does not exist - never "IOMMU off, no GPUs"."""
    node = lab_node("l40s-4x-switch")
    root = tmp_path / "sys"
    shutil.copytree(node.root / "sys" / "class", root / "class", symlinks=True)
    if tree == "empty":
        (root / "bus" / "pci" / "devices").mkdir(parents=True)
    match = "holds no PCI tree" if tree == "none" else "no PCI devices under"
    with pytest.raises((_iommu.IommuError, _sysfs.PciTreeMissing), match=match):
        _iommu.audit(str(root), str(node.root / "proc"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(_iommu.IommuError, match="sysfs_root %s holds no PCI tree" % (tmp_path / "empty")):
        _iommu.audit(str(tmp_path / "empty"), str(node.root / "proc"))


def test_proc_without_cmdline_is_an_error(lab_node, tmp_path):
    node = lab_node("l40s-4x-switch")
    (tmp_path / "proc").mkdir()
    with pytest.raises(_iommu.IommuError, match="cmdline"):
        _iommu.audit(str(node.root / "sys"), str(tmp_path / "proc"))
