# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab's nvbandwidth stand-in (lab/standins/nvbandwidth.py) through the module
gpufleet.node.nvbandwidth: a healthy machine passes, and each thing that slows a copy (ACS redirect,
a link trained down, slow copy engines) fails the cells it slows, naming its cause."""

from __future__ import annotations

import os
import subprocess

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.diag import _nvbandwidth
from tests.harness import REPO
from tests.harness.facts import topology_facts
from tests.harness.modules import run_module

STANDIN = REPO / "lab" / "bin" / "nvbandwidth"


def copy_check(node, **args):
    args = dict({"binary": str(STANDIN), "topology": topology_facts(node)}, **args)
    return run_module("nvbandwidth", args, env={"GPUFLEET_LAB_ROOT": str(node.root)})


def clear_acs_redirect(node):
    """ReqRedir, CmpltRedir and EgressCtrl off on every bridge between the GPUs, with the real setpci."""
    bridges = {b for i in range(len(node.gpus)) for j in range(len(node.gpus)) for b in node.path_bridges(i, j)}
    for bdf in sorted(b for b in bridges if node.devices[b].acs_ctl is not None):
        subprocess.run(
            ["setpci", "-O", "sysfs.path=%s" % node.sysfs, "-s", bdf, "ECAP_ACS+0x6.w=0000:002c"], check=True
        )


def standin(node, *argv):
    env = dict(os.environ, GPUFLEET_LAB_ROOT=str(node.root), GPUFLEET_LAB_SEED="7")
    return subprocess.run([str(STANDIN), *argv], capture_output=True, text=True, env=env, timeout=30)


@pytest.mark.parametrize("profile", ["h100-sxm-8x", "l40s-4x-switch", "epyc-rootport-acs"])
def test_a_healthy_machine_passes_every_cell(lab_node, profile):
    node = lab_node(profile)
    clear_acs_redirect(node)
    result = copy_check(node)
    assert not result.get("failed"), result.get("msg")
    assert result["passed"] is True and result["format"] == "json"
    assert result["slow_cells"] == []


def test_text_and_json_outputs_read_alike(lab_node):
    node = lab_node("h100-sxm-8x")
    text = _nvbandwidth.parse_output(standin(node, "-t", _nvbandwidth.PEER_READ).stdout, "text")
    js = _nvbandwidth.parse_output(standin(node, "-j", "-t", _nvbandwidth.PEER_READ).stdout, "json")
    for record in (text, js):
        assert record["problems"] == [] and record["version"] == "v0.8"
        assert record["testcases"][_nvbandwidth.PEER_READ]["status"] == _nvbandwidth.PASSED
        assert [d["index"] for d in record["devices"]] == list(range(8))
    (matrix,) = text["matrices"].values()
    cells = [v for row in matrix["rows"].values() for v in row.values()]
    assert cells.count(None) == 8  # the diagonal, N/A
    assert all(390 < v < 400 for v in cells if v is not None)  # NV18 at 0.826 of 18 x 26.562 GB/s


def test_unknown_and_waived_testcases_print_as_nvbandwidth_does(lab_node):
    node = lab_node("l40s-4x-switch")
    record = _nvbandwidth.parse_output(standin(node, "-t", "no_such_testcase").stdout, "text")
    assert record["testcases"]["no_such_testcase"]["status"] == _nvbandwidth.NOT_FOUND
    assert "nvbandwidth CLI:" in standin(node, "--help").stdout


def test_acs_redirect_leaves_the_peer_cells_without_figures(lab_node):
    node = lab_node("l40s-4x-switch")  # as built: every bridge redirects peer traffic
    result = copy_check(node)
    assert result.get("failed") and result["passed"] is False
    cells = result["slow_cells"]
    assert cells and {c["status"] for c in cells} == {"no_peer_access"}
    assert all(c["testcase"] == _nvbandwidth.PEER_READ for c in cells)
    assert "a bridge on the path still redirects peer traffic (ACS)" in cells[0]["causes"][0]


def test_one_leftover_redirect_is_named_by_the_cells_it_cuts(lab_node):
    node = lab_node("l40s-4x-switch")
    clear_acs_redirect(node)
    port = node.chain(node.gpus[1].bdf)[0]  # the downstream port above GPU 1 alone
    subprocess.run(["setpci", "-O", "sysfs.path=%s" % node.sysfs, "-s", port, "ECAP_ACS+0x6.w=000c:000c"], check=True)
    result = copy_check(node)
    assert result.get("failed")
    cells = result["slow_cells"]
    assert {c["cell"] for c in cells} == {
        "%s:GPU%d->GPU%d" % (_nvbandwidth.PEER_READ, a, b) for a in range(4) for b in range(4) if a != b and 1 in (a, b)
    }
    assert all(port in c["causes"][0] for c in cells)


def test_a_link_trained_down_fails_its_host_cells(lab_node):
    node = lab_node("l40s-x8-degraded")  # GPU 2 at x8 in its x16 slot
    clear_acs_redirect(node)
    result = copy_check(node, testcases=[_nvbandwidth.HOST_TO_DEVICE, _nvbandwidth.DEVICE_TO_HOST])
    assert result.get("failed")
    assert {c["cell"] for c in result["slow_cells"]} == {
        "host_to_device_memcpy_ce:CPU->GPU2",
        "device_to_host_memcpy_ce:GPU2->CPU",
    }
    assert "GPU2's PCIe link trained to x8 of x16" in result["slow_cells"][0]["causes"][0]


def test_slow_copy_engines_fail_every_cell_of_that_gpu_and_nothing_else(lab_node):
    node = lab_node("h100-sxm-8x")
    node.inject("copy-engine-slow", gpu=5)
    result = copy_check(node)
    assert result.get("failed") and result["passed"] is False
    cells = result["slow_cells"]
    assert all(5 in c["gpus"] and c["status"] == "slow" for c in cells)
    assert len(cells) == 1 + 1 + 14  # its host cells both ways, its 7 peers both ways
    # the facts show nothing wrong with it: the judge says so rather than blaming the link
    assert cells[0]["causes"][0].startswith("the topology facts show no fault on GPU5's link")
    node.inject("clear")
    assert copy_check(node)["passed"] is True


def test_a_driver_fault_fails_before_any_testcase(lab_node):
    node = lab_node("h100-sxm-8x")
    node.inject("driver-not-loaded")
    result = copy_check(node)
    assert result.get("failed") and result["passed"] is False
    assert "CUDA_ERROR_NO_DEVICE" in result["msg"]
