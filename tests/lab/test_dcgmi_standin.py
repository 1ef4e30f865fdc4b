# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab's `dcgmi diag` stand-in (lab/standins/dcgmi.py) through the module gpufleet.node.dcgm_diag:
the tests of each level, and each fault kind failing the test, GPU and figure it names."""

from __future__ import annotations

import os
import subprocess

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.diag import _dcgm
from tests.harness import REPO
from tests.harness.modules import run_module

STANDIN = REPO / "lab" / "bin" / "dcgmi"


def diag(node, level, gpus=None, check_mode=False):
    args = {"binary": str(STANDIN), "level": level}
    if gpus is not None:
        args["gpus"] = gpus
    return run_module("dcgm_diag", args, check_mode=check_mode, env={"GPUFLEET_LAB_ROOT": str(node.root)})


def failed(result):
    return {c["name"]: c for c in result["checks"] if c["status"] == "fail"}


@pytest.mark.parametrize(
    "level, tests",
    [
        (1, {"Denylist", "Persistence Mode", "Page Retirement/Row Remap", "Inforom"}),
        (2, {"PCIe", "GPU Memory"}),
        (3, {"Diagnostic", "Targeted Stress", "Targeted Power", "Memory Bandwidth"}),
        (4, {"Pulse Test", "Memtest"}),
    ],
)
def test_a_healthy_node_passes_each_level_with_its_tests(lab_node, level, tests):
    node = lab_node("l40s-4x-switch")
    result = diag(node, level)
    assert not result.get("failed"), result
    assert result["passed"] is True and result["dcgm_version"] == "3.3.9"
    names = {c["name"] for c in result["checks"]}
    assert {"dcgm:" + t for t in tests} <= names
    if level < 4:
        assert "dcgm:Memtest" not in names
    if level >= 3:  # no EUD package on the machine: skipped, and a skip is a warning
        eud = next(c for c in result["checks"] if c["name"] == "dcgm:EUD Test")
        assert eud["status"] == "warn"


def test_text_table_parses_as_the_json_does(lab_node):
    node = lab_node("h100-sxm-8x")
    node.inject("dcgm-memory", gpu=5)
    env = dict(os.environ, GPUFLEET_LAB_ROOT=str(node.root))
    text = subprocess.run([str(STANDIN), "diag", "-r", "2"], capture_output=True, text=True, env=env, timeout=30)
    js = subprocess.run([str(STANDIN), "diag", "-r", "2", "-j"], capture_output=True, text=True, env=env, timeout=30)
    a, b = _dcgm.parse_output(text.stdout), _dcgm.parse_output(js.stdout)
    assert a["problems"] == [] and b["problems"] == []
    assert a["format"] == "text" and b["format"] == "json"

    def statuses(record):
        return {t["name"]: t["status"] for t in record["tests"]}

    assert statuses(a) == statuses(b)
    assert statuses(a)["GPU Memory"] == "fail" and statuses(a)["PCIe"] == "pass"


def test_memory_fault_fails_gpu_memory_naming_the_gpu(lab_node):
    node = lab_node("h100-sxm-8x")
    node.inject("dcgm-memory", gpu=3)
    result = diag(node, 2)
    assert result.get("failed") and result["passed"] is False
    fails = failed(result)
    assert set(fails) == {"dcgm:GPU Memory"}
    assert fails["dcgm:GPU Memory"]["gpus"] == [3]
    assert "Found 4 faulty memory elements on GPU 3" in fails["dcgm:GPU Memory"]["reason"]
    assert fails["dcgm:GPU Memory"]["action"] == "drain and inspect the hardware"
    # level 1 does not run the memory test: the fault is DCGM level 2's to find
    result = diag(node, 1)
    assert not result.get("failed") and result["passed"] is True


def test_pcie_fault_fails_pcie_with_the_figure(lab_node):
    node = lab_node("l40s-4x-switch")
    node.inject("dcgm-pcie", gpu=1)
    result = diag(node, 2)
    fails = failed(result)
    assert result.get("failed") and set(fails) == {"dcgm:PCIe"}
    assert fails["dcgm:PCIe"]["gpus"] == [1]
    assert (
        "Bandwidth of GPU 1 in direction h2d of 4.21 did not exceed minimum required bandwidth of 20.00"
        in (fails["dcgm:PCIe"]["reason"])
    )


def test_a_link_trained_down_fails_pcie(lab_node):
    node = lab_node("l40s-x8-degraded")  # GPU 2 trained to x8 in its x16 slot
    result = diag(node, 2)
    fails = failed(result)
    assert result.get("failed") and set(fails) == {"dcgm:PCIe"}
    assert fails["dcgm:PCIe"]["gpus"] == [2]
    assert "GPU 2 is running at PCI link width 8X" in fails["dcgm:PCIe"]["reason"]


def test_pending_row_remap_fails_level_one_and_asks_for_a_reset(lab_node):
    node = lab_node("h100-sxm-8x")
    node.inject("remap-pending", gpu=6)
    result = diag(node, 1)
    fails = failed(result)
    assert result.get("failed") and set(fails) == {"dcgm:Page Retirement/Row Remap"}
    assert (
        "GPU 6 has uncorrectable memory errors and row remappings are pending"
        in (fails["dcgm:Page Retirement/Row Remap"]["reason"])
    )
    assert fails["dcgm:Page Retirement/Row Remap"]["action"] == "reset the GPU"


def test_driver_fault_is_a_host_engine_down_failure(lab_node):
    node = lab_node("l40s-4x-switch")
    node.inject("driver-not-loaded")
    result = diag(node, 1)
    assert result.get("failed") and result["passed"] is False
    assert "host engine" in result["msg"]


def test_gpus_option_and_check_mode(lab_node):
    node = lab_node("h100-sxm-8x")
    node.inject("dcgm-memory", gpu=7)
    result = diag(node, 2, gpus=[0, 1])  # the faulty GPU is not asked for
    assert not result.get("failed") and result["passed"] is True
    result = diag(node, 2, gpus=[8])  # no GPU 8: dcgmi refuses before any test
    assert result.get("failed") and result["passed"] is False
    result = diag(node, 2, check_mode=True)
    assert not result.get("failed") and result["status"] == "not_run" and result["passed"] is None
