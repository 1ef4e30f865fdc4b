# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab's all_reduce_perf stand-in (lab/standins/all_reduce_perf.py): the real format, flags
honoured, and a bus bandwidth that follows the machine's profile and CURRENT registers."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _judge, _output

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "lab" / "bin" / "all_reduce_perf"


def run(node, *args, **env):
    full_env = dict(os.environ, GPUFLEET_LAB_ROOT=str(node.root), GPUFLEET_LAB_SEED="1", **env)
    proc = subprocess.run([str(STANDIN), *args], capture_output=True, text=True, env=full_env, timeout=60)
    return proc.returncode, proc.stdout, _output.parse(proc.stdout)


def busbw(parsed):
    return _output.judged_busbw(parsed["rows"], 2)[0]


def clear_acs(node):
    for i in range(len(node.gpus)):
        for j in range(len(node.gpus)):
            for bdf in node.redirecting_bridges(i, j):
                subprocess.run(
                    ["setpci", "-O", f"sysfs.path={node.sysfs}", "-s", bdf, "ECAP_ACS+0x6.w=0000:002c"], check=True
                )


def test_real_format_and_flags(lab_node):
    node = lab_node("l40s-4x-switch")
    rc, out, parsed = run(
        node, "-b", "8", "-e", "128M", "-f", "2", "-g", "4", "-n", "5", "-w", "1", "-c", "0", "-d", "half"
    )
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == "# Collective test starting: all_reduce_perf"
    assert lines[1] == (
        "# nThread 1 nGpus 4 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 1 "
        "iters: 5 agg iters: 1 validation: 0 graph: 0"
    )
    assert lines[4].startswith("#  Rank  0 Group  0 Pid ") and lines[4].endswith("device  0 [0000:43:00] NVIDIA L40S")
    assert [r["size"] for r in parsed["rows"]] == [8 << k for k in range(25)]
    assert all(r["wrong_oop"] is None and r["type"] == "half" for r in parsed["rows"])
    assert parsed["rows"][3]["count"] == 32 and parsed["columns"] == "new" and parsed["footer"]
    assert lines[-2:] == ["# Collective test concluded: all_reduce_perf", "#"]


def test_bandwidth_follows_acs_registers_and_trained_width(lab_node):
    node = lab_node("l40s-4x-switch")
    acs_on = busbw(run(node, "-b", "1G", "-e", "2G", "-g", "4")[2])
    clear_acs(node)
    cleared = busbw(run(node, "-b", "1G", "-e", "2G", "-g", "4")[2])
    assert 10.5 < acs_on < 12.5 and 22.5 < cleared < 25.0  # ~half through the root complex
    no_p2p = busbw(run(node, "-b", "1G", "-e", "2G", "-g", "4", NCCL_P2P_DISABLE="1")[2])
    assert 15.5 < no_p2p < 18.0
    node.reset_firmware()  # a reboot puts the firmware's ACS back
    assert busbw(run(node, "-b", "1G", "-e", "2G", "-g", "4")[2]) == pytest.approx(acs_on, rel=0.05)

    degraded = lab_node("l40s-x8-degraded")
    clear_acs(degraded)
    assert busbw(run(degraded, "-b", "1G", "-e", "2G", "-g", "4")[2]) == pytest.approx(cleared / 2, rel=0.05)


def test_nvlink_ignores_pcie_acs_and_ramps_up(lab_node):
    node = lab_node("h100-sxm-8x")
    assert node.redirected(0, 1)
    _, _, parsed = run(node, "-b", "1M", "-e", "8G", "-f", "2", "-g", "8")
    rows = {r["size"]: r["busbw_oop"] for r in parsed["rows"]}
    assert 440 < rows[8 << 30] < 490 and rows[1 << 20] < 100


def test_cuda_sees_only_nvidia_bound_gpus(lab_node):
    node = lab_node("vfio-passthrough")
    rc, out, parsed = run(node, "-b", "1G", "-e", "1G", "-g", "4")
    assert rc == 1 and "Test CUDA failure common.cu:1227 'invalid device ordinal'" in out and not parsed["rows"]
    rc, _, parsed = run(node, "-b", "1G", "-e", "1G", "-g", "3")
    assert rc == 0 and len(parsed["rows"]) == 1


@pytest.mark.parametrize("fault,rc", [("wrong", 1), ("truncate", -9), ("crash", 1)])
def test_faults_of_the_model(lab_node, fault, rc):
    node = lab_node("l40s-4x-switch")
    node.inject("allreduce-" + fault)
    code, _out, parsed = run(node, "-b", "256K", "-e", "16M", "-f", "2", "-g", "4")
    assert code == rc
    verdict = _judge.judge(parsed, 1.0, rc=code)
    assert not verdict["passed"]
    if fault == "wrong":
        assert parsed["oob_status"] == "FAILED" and parsed["rows"][0]["wrong_oop"] == 0
        assert parsed["rows"][-1]["wrong_oop"] > 0 and verdict["kind"] == "wrong"
    elif fault == "truncate":
        assert 0 < len(parsed["rows"]) < 7 and not parsed["footer"]
    else:
        assert not parsed["rows"] and "Test NCCL failure" in parsed["failures"][0]


def test_hang_honours_the_test_timeout(lab_node):
    node = lab_node("l40s-4x-switch")
    node.inject("allreduce-hang")
    rc, out, parsed = run(node, "-b", "1M", "-e", "64M", "-f", "2", "-g", "4", "-T", "1")
    assert rc == 1 and "Test timeout (-T 1) expired" in out and len(parsed["rows"]) == 3


def test_nccl_debug_info_is_interleaved_and_still_parses(lab_node):
    node = lab_node("epyc-rootport-acs")
    _, out, parsed = run(node, "-b", "64M", "-e", "128M", "-f", "2", "-g", "2", NCCL_DEBUG="INFO")
    assert "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read" in out
    assert len(parsed["rows"]) == 2 and parsed["noise_lines"] >= 8
