# SPDX-License-Identifier: GPL-3.0-or-later
"""The design key of the NCCL gate (plugins/module_utils/nccl/_design.py): equal for the same hardware
however it trained today, different for other hardware."""

from __future__ import annotations

import copy

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _design
from tests.harness.facts import topology_facts


def facts(node):
    """Topology facts as gpu_topology_facts reports them, with the bridges between each pair."""
    out = topology_facts(node)
    idx = [i for i, g in enumerate(node.gpus) if g.driver == "nvidia"]
    out["bridges"] = {
        f"GPU{a}": {f"GPU{b}": node.path_bridges(i, j) for b, j in enumerate(idx) if b != a} for a, i in enumerate(idx)
    }
    for a, i in enumerate(idx):  # like NVML: the links active now
        out["gpus"][a]["nvlinks"] = node.nvlinks_active(i)
    return out


def key(node):
    return _design.design_key(facts(node), _design.rdma_nics(str(node.sysfs)))[0]


def test_same_hardware_same_key(lab_node, tmp_path):
    import lab.hwmodel as hw

    first = key(lab_node("l40s-4x-switch"))
    again = key(hw.build("l40s-4x-switch", tmp_path / "again"))
    assert first == again and first.startswith("l40s-4x-pcie-")


def test_a_gpu_trained_to_x8_keeps_the_key(lab_node):
    degraded = lab_node("l40s-x8-degraded")
    assert facts(degraded)["gpus"][2]["pcie"]["width_current"] == 8
    assert key(degraded) == key(lab_node("l40s-4x-switch"))


def test_an_inactive_nvlink_keeps_the_key(lab_node):
    node = lab_node("h100-sxm-8x")
    healthy = key(node)
    assert healthy.startswith("h100-80gb-hbm3-8x-nvswitch-")
    node.inject("nvlink-down", gpu=5)
    down = facts(node)
    assert down["gpus"][5]["nvlinks"] == 17
    # nvidia-smi topo -m counts the active links of a pair: NV17 where one is down.
    for other in range(8):
        if other != 5:
            down["links"]["GPU5"][f"GPU{other}"] = down["links"][f"GPU{other}"]["GPU5"] = "NV17"
    assert _design.design_key(down, _design.rdma_nics(str(node.sysfs)))[0] == healthy


def test_other_gpu_model_count_layout_or_nics_change_the_key(lab_node):
    node = lab_node("l40s-4x-switch")
    base = facts(node)
    nics = _design.rdma_nics(str(node.sysfs))
    assert nics == ["15b3:101b"]
    ref = _design.design_key(base, nics)[0]

    other_model = copy.deepcopy(base)
    for g in other_model["gpus"]:
        g["name"] = "NVIDIA A100 80GB PCIe"
    assert _design.design_key(other_model, nics)[0].startswith("a100-80gb-pcie-4x-pcie-")

    fewer = key(lab_node("vfio-passthrough"))  # GPU 3 on vfio-pci: three GPUs for CUDA
    assert fewer.startswith("l40s-3x-pcie-")

    one_switch = copy.deepcopy(base)  # all four below one switch: PIX everywhere, two bridges
    for a in range(4):
        for b in range(4):
            if a != b:
                one_switch["links"][f"GPU{a}"][f"GPU{b}"] = "PIX"
                one_switch["bridges"][f"GPU{a}"][f"GPU{b}"] = ["x", "y"]
    gen5 = copy.deepcopy(base)
    gen5["gpus"][0]["pcie"]["gen_max"] = 5
    keys = {
        ref,
        _design.design_key(other_model, nics)[0],
        fewer,
        _design.design_key(one_switch, nics)[0],
        _design.design_key(gen5, nics)[0],
        _design.design_key(base, [])[0],  # no RDMA NIC
    }
    assert len(keys) == 6


def test_nvlink_capability_by_model():
    assert _design.nvlink_capability("NVIDIA H100 80GB HBM3") == 18
    assert _design.nvlink_capability("NVIDIA H100 PCIe") == 0
    assert _design.nvlink_capability("NVIDIA A100-SXM4-80GB") == 12
    assert _design.nvlink_capability("NVIDIA L40S") == 0
    assert _design.nvlink_capability("Some Future GPU") is None


def test_no_gpu_no_design():
    with pytest.raises(ValueError, match="no GPU"):
        _design.design_key({"gpus": []})
