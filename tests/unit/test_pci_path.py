# SPDX-License-Identifier: GPL-3.0-or-later
"""The PCIe/GPU path vocabulary (pcie/_path.py): each rule pinned once, here. The modules, the gate's
model and the runtime env use these functions; their own tests check how they use them."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.pcie import _path


# -- path classes and their order ----------------------------------------------------------------
def test_link_rank_orders_best_to_worst():
    links = ["SYS", "PIX", "NV4", "NODE", "PHB", "X", "PXB", "NV18", "SOC"]
    assert sorted(links, key=_path.link_rank) == ["X", "NV18", "NV4", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC"]


def test_host_bridge_classes_stop_at_phb():
    assert _path.PATH_CLASSES == ("PIX", "PXB", "PHB", "NODE", "SYS")
    assert _path.HOST_BRIDGE_CLASSES == ("PIX", "PXB", "PHB")


def test_nvml_common_ancestor_levels_map_onto_the_classes():
    # INTERNAL 0, SINGLE 10, MULTIPLE 20, HOSTBRIDGE 30, NODE 40, SYSTEM 50 (nvidia-ml-py)
    assert _path.NVML_TOPOLOGY_LEVELS == {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
    assert set(_path.NVML_TOPOLOGY_LEVELS.values()) == set(_path.PATH_CLASSES)


def test_nvlink_count():
    assert _path.nvlink_count("NV18") == 18
    assert _path.nvlink_count("NVL") is None and _path.nvlink_count("PIX") is None
    assert _path.nvlink_count(None) is None


# -- the bandwidth model -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "gen,width,gbps", [(3, 16, 15.75), (4, 16, 31.51), (5, 16, 63.02), (4, 8, 15.75), (2, 16, 8.0), (6, 16, 121.0)]
)
def test_pcie_raw_rates(gen, width, gbps):
    assert _path.pcie_raw_gbps(gen, width) == pytest.approx(gbps, abs=0.01)


def test_path_efficiency_falls_with_the_class():
    effs = [_path.PATH_EFFICIENCY[c] for c in _path.PATH_CLASSES]
    assert effs == sorted(effs, reverse=True) and effs == [0.80, 0.80, 0.78, 0.60, 0.50]


def test_hop_values():
    gbps, basis = _path.hop_gbps("PIX", 4, 16)
    assert gbps == pytest.approx(25.2, abs=0.01) and basis == "PIX: PCIe Gen4 x16 31.51 GB/s x 0.8"
    assert _path.hop_gbps("NV12", names="NVIDIA A100-SXM4-80GB")[0] == pytest.approx(240.0)
    assert _path.hop_gbps("NV18", names="NVIDIA B200")[0] == pytest.approx(720.0)
    with pytest.raises(ValueError, match="unknown link type"):
        _path.hop_gbps("SOC", 4, 16)
    with pytest.raises(ValueError, match="unknown PCIe link"):
        _path.hop_gbps("PIX", 9, 16)


# -- bridges crossed and redirect blocking -------------------------------------------------------
def test_crossed_bridges_in_the_order_traffic_crosses_them():
    rp, usp, dsp_a, dsp_b = "0000:40:01.1", "0000:41:00.0", "0000:42:00.0", "0000:42:01.0"
    # below one switch: only the two downstream ports
    assert _path.crossed_bridges([rp, usp, dsp_a], [rp, usp, dsp_b]) == [dsp_a, dsp_b]
    assert _path.crossed_bridges(["0000:00:01.1"], ["0000:00:01.2"]) == ["0000:00:01.1", "0000:00:01.2"]
    # below different root ports: up A's chain (leaf first), then down B's (root first)
    other = ["0000:40:03.1", "0000:46:00.0", "0000:47:00.0"]
    assert _path.crossed_bridges([rp, usp, dsp_a], other) == [dsp_a, usp, rp] + other
    assert _path.crossed_bridges([rp, usp], [rp, usp]) == []


def test_redirect_bits_are_nccl_guidance():
    assert _path.ACS_REDIRECT_MASK == 0x002C  # ReqRedir | CmpltRedir | EgressCtrl
    assert _path.ACS_REDIRECT_NAMES == ("ReqRedir", "CmpltRedir", "EgressCtrl")
    assert _path.redirects(0x0004) and _path.redirects(0x0008) and _path.redirects(0x0020)
    assert not _path.redirects(0x0011) and not _path.redirects(0x0100) and not _path.redirects(None)


def test_redirecting_keeps_order_and_skips_ports_without_acs():
    ctl = {"a": 0x001D, "b": 0x0011, "c": None, "d": 0x0020}
    assert _path.redirecting(["d", "c", "b", "a"], ctl.get) == ["d", "a"]


# -- device classes ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "vendor,cls,expected",
    [
        (0x10DE, 0x0302, True),
        (0x10DE, 0x0300, True),  # 3D controller, VGA
        (0x10DE, 0x0403, False),  # the GPU's HDMI audio function
        (0x10DE, 0x0680, False),  # NVSwitch (bridge class)
        (0x1002, 0x0302, False),  # not NVIDIA
    ],
)
def test_gpu_rule(vendor, cls, expected):
    assert _path.is_gpu(vendor, cls) is expected


@pytest.mark.parametrize(
    "vendor,cls,driver,expected",
    [
        (0x15B3, 0x0207, "mlx5_core", True),  # ConnectX in InfiniBand mode
        (0x8086, 0x0207, None, True),  # any InfiniBand controller
        (0x15B3, 0x0200, None, True),  # ConnectX in Ethernet mode: RoCE
        (0x1D0F, 0x0200, "efa", True),  # AWS EFA: the PCI driver is the RDMA provider
        (0x14E4, 0x0200, "bnxt_en", False),  # Broadcom Ethernet: RoCE only via an auxiliary driver
        (0x8086, 0x0200, "ice", False),  # Intel E810: same (irdma binds an auxiliary device)
        (0x8086, 0x0200, None, False),
        (0x15B3, 0x0604, None, False),  # a Mellanox bridge is no NIC
    ],
)
def test_rdma_nic_rule(vendor, cls, driver, expected):
    assert _path.is_rdma_nic(vendor, cls, driver) is expected
