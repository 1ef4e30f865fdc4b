# SPDX-License-Identifier: GPL-3.0-or-later
"""The auto threshold model of the NCCL gate (plugins/module_utils/nccl/_threshold.py), on every lab profile."""

from __future__ import annotations

import pytest

import lab.hwmodel as hw
from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _diagnose, _threshold
from tests.harness.facts import topology_facts

# What a healthy node of each design reaches, and why (the weakest hop of the best ring).
EXPECTED = {
    "l40s-4x-switch": (24.58, "PHB", 4),  # Gen4 x16 31.51 x 0.78; the ring leaves each switch
    "l40s-x8-degraded": (24.58, "PHB", 4),  # the same design: x8 must fail, not lower the bar
    "vfio-passthrough": (24.58, "PHB", 3),  # GPU 3 on vfio-pci is invisible to CUDA/NVML
    "epyc-rootport-acs": (24.58, "PHB", 2),  # two root ports of one host bridge
    "h100-sxm-8x": (450.0, "NV18", 8),  # 18 links x 25 GB/s x 1.0 through NVSwitches (NVLS)
    "a6000-4090-hetero": (24.58, "PHB", 2),  # two root ports of one host bridge (the mixed A6000/4090 field report)
}


def test_every_profile_has_an_expectation():
    assert set(EXPECTED) == set(hw.PROFILES)


def test_auto_threshold_on_every_profile(lab_node, any_profile):
    node = lab_node(any_profile)
    facts = topology_facts(node)
    gbps, worst, ngpus = EXPECTED[any_profile]
    model = _threshold.expected_busbw(facts)
    assert model["expected_gbps"] == pytest.approx(gbps, abs=0.01)
    assert model["worst_link"] == worst
    assert sorted(model["ring"]) == list(range(ngpus))


def test_l40s_physics_floor_under_seed_000s_22_gbps(lab_node):
    # The physics floor (x0.85) sits under the 4x L40S field report's 22 GB/s and over every fault the model
    # knows (ACS redirect ~x0.5, x8 x0.5, host memory x0.72); the peers judge closer.
    model = _threshold.expected_busbw(topology_facts(lab_node("l40s-4x-switch")))
    assert round(model["expected_gbps"] * 0.85, 2) == 20.89
    # The best ring keeps each switch's pair adjacent: two PIX hops, two PHB hops.
    ring = model["ring"]
    assert {frozenset(ring[k : k + 2]) for k in range(0, 4, 2)} == {frozenset({0, 1}), frozenset({2, 3})}
    assert model["basis"] == "PHB: PCIe Gen4 x16 31.51 GB/s x 0.78"


def test_degraded_link_does_not_lower_the_bar(lab_node):
    healthy = _threshold.expected_busbw(topology_facts(lab_node("l40s-4x-switch")))
    facts = topology_facts(lab_node("l40s-x8-degraded"))
    assert facts["gpus"][2]["pcie"]["width_current"] == 8
    assert _threshold.expected_busbw(facts)["expected_gbps"] == healthy["expected_gbps"]


def test_gpu_subset_and_visible_devices(lab_node):
    facts = topology_facts(lab_node("l40s-4x-switch"))
    pair = _threshold.expected_busbw(facts, count=2)
    assert pair["worst_link"] == "PIX" and pair["expected_gbps"] == pytest.approx(25.21, abs=0.01)
    across = _threshold.expected_busbw(facts, visible=[1, 2])
    assert across["worst_link"] == "PHB" and across["worst_pair"] == [1, 2]
    with pytest.raises(ValueError, match="at least 2 GPUs"):
        _threshold.expected_busbw(facts, count=1)
    with pytest.raises(ValueError, match="5 GPUs requested"):
        _threshold.expected_busbw(facts, count=5)
    with pytest.raises(ValueError, match="GPU 7"):
        _threshold.expected_busbw(facts, visible=[0, 7])


def _synthetic(links, names=("NVIDIA A100-SXM4-80GB",) * 2, gen=4):
    n = len(names)
    gpus = [
        {
            "index": i,
            "name": names[i],
            "pcie": {"gen_max": gen, "width_max": 16, "gen_current": gen, "width_current": 16},
        }
        for i in range(n)
    ]
    return {"gpus": gpus, "links": links}


def test_worst_link_of_the_best_ring_mixed_nvlink_bridges():
    # A40-style: NVLink bridges between pairs (NV4), PCIe SYS across sockets for the rest.
    links = {
        "GPU0": {"GPU1": "NV4", "GPU2": "SYS", "GPU3": "SYS"},
        "GPU1": {"GPU0": "NV4", "GPU2": "SYS", "GPU3": "SYS"},
        "GPU2": {"GPU0": "SYS", "GPU1": "SYS", "GPU3": "NV4"},
        "GPU3": {"GPU0": "SYS", "GPU1": "SYS", "GPU2": "NV4"},
    }
    model = _threshold.expected_busbw(_synthetic(links, names=("NVIDIA A40",) * 4))
    assert model["worst_link"] == "SYS"
    assert model["expected_gbps"] == pytest.approx(31.51 * 0.5, abs=0.01)


def test_nvlink5_per_link_rate():
    links = {"GPU0": {"GPU1": "NV18"}, "GPU1": {"GPU0": "NV18"}}
    b200 = _threshold.expected_busbw(_synthetic(links, names=("NVIDIA B200",) * 2))
    h100 = _threshold.expected_busbw(_synthetic(links, names=("NVIDIA H100 80GB HBM3",) * 2))
    assert b200["expected_gbps"] == 720.0 and h100["expected_gbps"] == 360.0  # a bridge, no NVSwitch


def _all_pairs(n, cls):
    return {f"GPU{a}": {f"GPU{b}": cls for b in range(n) if b != a} for a in range(n)}


def test_nvswitch_model_is_the_nvls_era_figure():
    # 8x H100/H200 with NVLink SHARP reach 440-480 GB/s (nccl-tests issue 272: 475 on 8x H200).
    h100 = _threshold.expected_busbw(_synthetic(_all_pairs(8, "NV18"), names=("NVIDIA H100 80GB HBM3",) * 8))
    h200 = _threshold.expected_busbw(_synthetic(_all_pairs(8, "NV18"), names=("NVIDIA H200",) * 8))
    assert h100["expected_gbps"] == h200["expected_gbps"] == 450.0
    assert "via NVSwitch (NVLS)" in h100["basis"]
    # A100 has no NVLS (230 GB/s measured): 12 x 25 x 0.8; Blackwell has no published figure yet.
    a100 = _threshold.expected_busbw(_synthetic(_all_pairs(8, "NV12"), names=("NVIDIA A100-SXM4-80GB",) * 8))
    b200 = _threshold.expected_busbw(_synthetic(_all_pairs(8, "NV18"), names=("NVIDIA B200",) * 8))
    assert a100["expected_gbps"] == 240.0 and b200["expected_gbps"] == 720.0
    # Four H100 bonded directly (NV6 each, 18 links / 3 peers) is no NVSwitch system.
    assert not _threshold.nvswitch_system(_synthetic(_all_pairs(4, "NV6"), names=("NVIDIA H100 80GB HBM3",) * 4))
    direct = _threshold.expected_busbw(_synthetic(_all_pairs(4, "NV6"), names=("NVIDIA H100 80GB HBM3",) * 4))
    assert direct["expected_gbps"] == 120.0


def test_model_errors_name_what_is_missing():
    with pytest.raises(ValueError, match="no link type between GPU0 and GPU1"):
        _threshold.expected_busbw(_synthetic({}))
    facts = _synthetic({"GPU0": {"GPU1": "PIX"}})
    del facts["gpus"][0]["pcie"]["gen_max"]
    with pytest.raises(ValueError, match="gen_max"):
        _threshold.expected_busbw(facts)
    with pytest.raises(ValueError, match="unknown link type 'FOO'"):
        _threshold.expected_busbw(_synthetic({"GPU0": {"GPU1": "FOO"}}))


def test_diagnose_names_a_link_trained_down(lab_node):
    causes = _diagnose.diagnose(topology_facts(lab_node("l40s-x8-degraded")))
    assert causes[0].startswith("GPU2 (0000:48:00.0) trained to x8 of x16 below port 0000:47:00.0: a link trained down")


def test_diagnose_names_acs_from_p2p_status(lab_node):
    causes = _diagnose.diagnose(topology_facts(lab_node("l40s-4x-switch")))
    assert len(causes) == 1
    assert causes[0].startswith(
        "the topology facts showed peer-to-peer reads not OK between GPU0-GPU1 CNS, GPU0-GPU2 CNS"
    )
    assert (
        "(redirecting bridges: 0000:42:00.0, 0000:42:01.0, 0000:47:00.0, 0000:47:01.0): ACS redirect "
        "on a bridge between the GPUs, unless it was cleared since" in causes[0]
    )
    # NVLink pairs are not blamed for what their PCIe path does.
    assert _diagnose.diagnose(topology_facts(lab_node("h100-sxm-8x"))) == []


def test_diagnose_environment_and_fallback():
    assert _diagnose.diagnose({}, {"NCCL_P2P_DISABLE": "1"}) == [
        "NCCL_P2P_DISABLE is set: NCCL copies through host memory"
    ]
    half = _diagnose.diagnose({}, {}, measured=11.6, expected=24.58)
    assert half[0].startswith("about half the expected bandwidth: typical of ACS P2P redirect")
