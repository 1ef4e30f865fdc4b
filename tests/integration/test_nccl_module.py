# SPDX-License-Identifier: GPL-3.0-or-later
"""The nccl_allreduce module end to end: run as Ansible runs it (JSON arguments in, JSON out),
against the lab's all_reduce_perf stand-in and against small fake binaries that replay real
outputs, so that every fail-closed path is exercised through the module itself."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.harness import modules
from tests.harness.facts import topology_facts

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "lab" / "bin" / "all_reduce_perf"
DATA = REPO / "tests" / "data" / "nccl"


def run_module(args, check_mode=False):
    return modules.run_module("nccl_allreduce", args, check_mode=check_mode)


def clear_acs(node):
    """What pcie_acs does, with the real setpci on the lab tree: redirect bits off."""
    bridges = sorted(
        {b for i in range(len(node.gpus)) for j in range(len(node.gpus)) for b in node.redirecting_bridges(i, j)}
    )
    for bdf in bridges:
        subprocess.run(["setpci", "-O", f"sysfs.path={node.sysfs}", "-s", bdf, "ECAP_ACS+0x6.w=0000:002c"], check=True)
    assert not any(node.redirected(i, j) for i in range(len(node.gpus)) for j in range(len(node.gpus)))
    return bridges


def lab_args(node, **extra):
    args = {
        "binary": str(STANDIN),
        "min_busbw_gbps": "auto",
        "topology": topology_facts(node),
        "min_bytes": "256M",
        "max_bytes": "4G",
        "environment": {"GPUFLEET_LAB_ROOT": str(node.root), "GPUFLEET_LAB_SEED": "7"},
        "sysfs_path": str(node.sysfs),
    }
    args.update(extra)
    return args


def fake_binary(tmp_path, body, name="fake_all_reduce_perf"):
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def replay(tmp_path, sample, rc=0, text=None):
    out = tmp_path / "replay.txt"
    out.write_text(text if text is not None else (DATA / f"{sample}.txt").read_text())
    return fake_binary(tmp_path, f'cat "{out}"\necho "$@" > "{tmp_path}/argv"\nexit {rc}\n')


# --- the lab: ACS on, ACS cleared, a link trained down -----------------------------------------


def test_acs_on_fails_with_measured_expected_and_cause(lab_node):
    node = lab_node("l40s-4x-switch")
    res = run_module(lab_args(node))
    assert res["failed"] and res["passed"] is False and res["kind"] == "low_bandwidth"
    assert res["threshold_gbps"] == 20.89 and res["expected_busbw_gbps"] == 24.58
    assert res["rule"] == "physics_floor" and res["physics_floor_gbps"] == 20.89
    assert res["design_key"].startswith("l40s-4x-pcie-") and res["design"]["nics"] == ["15b3:101b"]
    assert 9.0 < res["judged_busbw_gbps"] < 13.0  # about half: through the root complex
    assert res["model"] == {
        "worst_link": "PHB",
        "worst_pair": [1, 2],
        "ring": [0, 1, 2, 3],
        "basis": "PHB: PCIe Gen4 x16 31.51 GB/s x 0.78",
    }
    assert (
        "is under the threshold 20.89 GB/s: under the physics floor 20.89 GB/s (0.85 x the 24.58 GB/s "
        "the model gives a healthy node of this design); no peer baseline yet for design l40s-4x-pcie-"
    ) in res["reason"]
    assert "ACS redirect on a bridge between the GPUs" in res["reason"]
    assert res["msg"].startswith(f"NCCL all-reduce gate failed on {STANDIN} -b 268435456 -e 4294967296")
    assert "# Out of bounds values : 0 OK" in res["stdout"]


def test_acs_cleared_passes(lab_node):
    node = lab_node("l40s-4x-switch")
    clear_acs(node)
    res = run_module(lab_args(node, topology=topology_facts(node)))
    assert not res.get("failed") and res["passed"] is True and res["kind"] == "ok"
    assert res["changed"] is False
    assert 22.12 <= res["judged_busbw_gbps"] < 25.0
    assert res["reason"].endswith(
        ": the physics floor 20.89 GB/s (0.85 x the 24.58 GB/s the model gives a healthy node "
        f"of this design); no peer baseline yet for design {res['design_key']}"
    )
    assert [r["size"] for r in res["rows"]] == [256 << 20, 512 << 20, 1 << 30, 2 << 30, 4 << 30]
    assert res["cmd"] == [
        str(STANDIN),
        "-b",
        "268435456",
        "-e",
        "4294967296",
        "-f",
        "2",
        "-g",
        "4",
        "-n",
        "20",
        "-w",
        "5",
        "-c",
        "1",
    ]
    assert res["out_of_bounds"] == 0 and res["avg_busbw_gbps"] > 22
    assert len(res["runs"]) == 1 and res["rc"] == 0 and res["timestamp"] > 1.7e9
    assert "stdout" not in res


def test_link_trained_down_fails_even_with_acs_cleared(lab_node):
    node = lab_node("l40s-x8-degraded")
    clear_acs(node)
    res = run_module(lab_args(node, topology=topology_facts(node), repeats=2))
    assert res["failed"] and res["kind"] == "low_bandwidth" and len(res["runs"]) == 2
    assert res["threshold_gbps"] == 20.89  # the design's bar, not the degraded link's
    healthy = run_module(lab_args(lab_node("l40s-4x-switch"), check=False), check_mode=True)
    assert res["design_key"] == healthy["design_key"]  # ... and the design's key
    assert "GPU2 (0000:48:00.0) trained to x8 of x16 below port 0000:47:00.0: a link trained down" in res["reason"]


def test_nvlink_node_passes_whatever_acs_says(lab_node):
    node = lab_node("h100-sxm-8x")
    res = run_module(lab_args(node, min_bytes="1G", max_bytes="8G"))
    assert res["passed"] is True and res["threshold_gbps"] == 382.5  # 0.85 x 450 (NVLS)
    assert res["judged_busbw_gbps"] > 430


def _peers(median, count=7, design=None):
    return {
        "samples": [
            {"host": f"peer{i}", "gbps": median + (i - count // 2) * 0.5, "timestamp": 1.7e9 + i} for i in range(count)
        ]
    }


def test_one_nvlink_down_fails_against_the_peers_but_not_the_physics_floor(lab_node):
    node = lab_node("h100-sxm-8x")
    healthy = run_module(lab_args(node, min_bytes="2G", max_bytes="4G"), check_mode=True)
    key = healthy["design_key"]
    assert key.startswith("h100-80gb-hbm3-8x-nvswitch-") and healthy["design"]["nics"] == ["15b3:1021"] * 4
    node.inject("nvlink-down", gpu=3)  # at once, no reboot: 17 of 18 links carry traffic
    alone = run_module(lab_args(node, min_bytes="2G", max_bytes="4G"))
    assert alone["passed"] is True and alone["rule"] == "physics_floor" and alone["design_key"] == key
    assert 430 < alone["judged_busbw_gbps"] < 450  # 1/18 under the healthy ~466
    # Four peers are not enough (min 5): the physics floor still decides, and says so.
    few = run_module(lab_args(node, min_bytes="2G", max_bytes="4G", baselines={key: _peers(466.0, 4)}))
    assert few["passed"] is True and few["rule"] == "physics_floor"
    assert f"the peer baseline of design {key} has 4 of the 5 healthy nodes it needs" in few["reason"]
    # Its own earlier figure is not a peer's; an outlier and another design do not count.
    peers = _peers(466.0, 7)
    peers["samples"] += [
        {"host": "node-under-test", "gbps": 300.0, "timestamp": 1.8e9},
        {"host": "odd", "gbps": 120.0, "timestamp": 1.8e9},
    ]
    res = run_module(
        lab_args(
            node,
            min_bytes="2G",
            max_bytes="4G",
            host="node-under-test",
            baselines={key: peers, "l40s-4x-pcie-00000000": _peers(23.0)},
        )
    )
    assert res["failed"] and res["kind"] == "low_bandwidth" and res["rule"] == "peer_median"
    assert res["threshold_gbps"] == 447.36 and res["physics_floor_gbps"] == 382.5
    assert res["baseline"]["count"] == 7 and res["baseline"]["outliers"] == [{"host": "odd", "gbps": 120.0}]
    assert (
        f"is under the threshold 447.36 GB/s: under 0.96 x the median 466.0 GB/s of 7 healthy nodes of design {key}"
    ) in res["reason"]
    assert "% under the median of this design's healthy peers" in res["reason"]
    # A corrupt file of its design is reported in the verdict; the physics floor decides.
    broken = run_module(lab_args(node, min_bytes="2G", max_bytes="4G", baselines={key: {"error": "not JSON"}}))
    assert broken["passed"] is True and broken["rule"] == "physics_floor"
    assert "the baseline store's file for this design is corrupt: not JSON" in broken["reason"]
    assert broken["baseline"]["problem"] == "not JSON"


def test_vfio_bound_gpu_is_not_there_for_cuda(lab_node):
    node = lab_node("vfio-passthrough")
    res = run_module(lab_args(node, gpus=4, min_busbw_gbps="22"))
    assert res["failed"] and res["kind"] == "exit" and res["rc"] == 1
    assert "invalid device ordinal" in res["reason"]


# --- faults of the lab stand-in ----------------------------------------------------------------


def test_wrong_results_fail(lab_node):
    node = lab_node("h100-sxm-8x")
    node.inject("allreduce-wrong")
    res = run_module(lab_args(node, environment={"GPUFLEET_LAB_ROOT": str(node.root)}))
    assert res["failed"] and res["kind"] == "wrong" and res["rc"] == 1
    assert res["rows"][0]["wrong_oop"] > 0 and "data corruption" in res["reason"]


def test_hang_is_killed_at_the_timeout(lab_node):
    node = lab_node("l40s-4x-switch")
    node.inject("allreduce-hang")
    # The stand-in never finishes: the module's answer at all is its deadline at work.
    res = run_module(
        lab_args(
            node,
            timeout=3,
            repeats=3,
            environment={"GPUFLEET_LAB_ROOT": str(node.root)},
        )
    )
    assert res["failed"] and res["kind"] == "timeout" and "rc" not in res
    assert len(res["runs"]) == 1  # a hang is not retried
    assert "did not finish within 3 s" in res["reason"] and len(res["rows"]) == 3


def test_death_mid_table_fails(lab_node):
    node = lab_node("l40s-4x-switch")
    node.inject("allreduce-truncate")
    res = run_module(lab_args(node, environment={"GPUFLEET_LAB_ROOT": str(node.root)}))
    assert res["failed"] and res["kind"] == "exit" and res["rc"] == -9
    assert "was killed by signal 9 (last size measured: 536870912 B)" in res["reason"]


def test_nccl_failure_before_the_first_row(lab_node):
    node = lab_node("epyc-rootport-acs")
    node.inject("allreduce-crash")
    res = run_module(
        lab_args(
            node,
            environment={
                "GPUFLEET_LAB_ROOT": str(node.root),
                "NCCL_DEBUG": "INFO",
            },
        )
    )
    assert res["failed"] and res["kind"] == "exit" and res["rows"] == []
    assert "it said: vm: Test NCCL failure common.cu:392" in res["reason"].replace(
        os.uname().nodename.split(".")[0], "vm"
    )


# --- real outputs replayed: paths the stand-in cannot take --------------------------------------


def test_truncated_output_with_exit_zero(tmp_path):
    res = run_module({"binary": replay(tmp_path, "p4de-2node-srun-nofooter"), "min_busbw_gbps": "50", "gpus": 8})
    assert res["failed"] and res["kind"] == "truncated" and res["rc"] == 0
    assert len(res["rows"]) == 29


def test_out_of_bounds_footer_with_exit_zero(tmp_path):
    text = (
        (DATA / "gh200-2node-v2.17-good.txt")
        .read_text()
        .replace("# Out of bounds values : 0 OK", "# Out of bounds values : 12 FAILED")
    )
    res = run_module({"binary": replay(tmp_path, None, text=text), "min_busbw_gbps": "100", "gpus": 4})
    assert res["failed"] and res["kind"] == "out_of_bounds" and res["out_of_bounds"] == 12


def test_no_rows(tmp_path):
    res = run_module({"binary": replay(tmp_path, "5090-2x-debug-crash"), "min_busbw_gbps": "40", "gpus": 2})
    assert res["failed"] and res["kind"] == "no_rows"


def test_wrong_rows_with_exit_zero(tmp_path):
    res = run_module({"binary": replay(tmp_path, "dgx-h100-2node-wrong"), "min_busbw_gbps": "1", "gpus": 1})
    assert res["failed"] and res["kind"] == "wrong"


def test_old_format_with_numeric_threshold_passes(tmp_path):
    binary = replay(tmp_path, "a100-sxm-8x-old-c0")
    res = run_module(
        {"binary": binary, "min_busbw_gbps": "228", "gpus": 8, "check": False, "min_bytes": "1", "max_bytes": "8G"}
    )
    assert res["passed"] is True and res["judged_busbw_gbps"] == 234.37 and res["expected_busbw_gbps"] is None
    assert (tmp_path / "argv").read_text().split() == [
        "-b",
        "1",
        "-e",
        "8589934592",
        "-f",
        "2",
        "-g",
        "8",
        "-n",
        "20",
        "-w",
        "5",
        "-c",
        "0",
    ]


def test_best_of_n(tmp_path):
    low, good = DATA / "gh200-2node-v2.17-noofi.txt", DATA / "gh200-2node-v2.17-good.txt"
    counter = tmp_path / "n"
    binary = fake_binary(
        tmp_path,
        f'n=$(cat "{counter}" 2>/dev/null || echo 0); echo $((n+1)) > "{counter}"\n'
        f'if [ "$n" = 0 ]; then cat "{low}"; else cat "{good}"; fi\n',
    )
    res = run_module({"binary": binary, "min_busbw_gbps": "100", "gpus": 8, "repeats": 3})
    assert res["passed"] is True and [r["kind"] for r in res["runs"]] == ["low_bandwidth", "ok"]
    assert res["judged_busbw_gbps"] == 107.69


def test_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    binary = fake_binary(
        tmp_path, f'sleep 300 &\necho $! > "{pidfile}"\nhead -n 20 "{DATA}/h100-a3mega-2node-new.txt"\nsleep 300\n'
    )
    res = run_module({"binary": binary, "min_busbw_gbps": "300", "gpus": 8, "timeout": 2})
    assert res["failed"] and res["kind"] == "timeout"
    child = int(pidfile.read_text())
    time.sleep(0.2)
    assert not _alive(child), "the test's background child outlived the timeout"


def _alive(pid):
    """Running (not gone, not a zombie waiting for a reaper that this container may lack)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_check_mode_does_not_run(tmp_path, lab_node):
    node = lab_node("l40s-4x-switch")
    ran = tmp_path / "ran"
    binary = fake_binary(tmp_path, f'touch "{ran}"\n')
    res = run_module(lab_args(node, binary=binary), check_mode=True)
    assert not res.get("failed") and res["passed"] is None and res["kind"] == "check_mode"
    assert "rc" not in res, "Ansible fails any result whose rc is not 0, None included"
    assert res["threshold_gbps"] == 20.89 and res["cmd"][0] == binary
    assert not ran.exists()


@pytest.mark.parametrize(
    "args,message",
    [
        ({"min_busbw_gbps": "fast", "gpus": 2}, "min_busbw_gbps must be a number of GB/s or 'auto', got 'fast'"),
        ({"min_busbw_gbps": "-3", "gpus": 2}, "min_busbw_gbps must be positive"),
        (
            {"min_busbw_gbps": "auto", "gpus": 2},
            "min_busbw_gbps is auto but all of the following are missing: topology",
        ),
        ({"min_busbw_gbps": "22", "gpus": 2, "min_bytes": "1G", "max_bytes": "1M"}, "is larger than max_bytes"),
        ({"min_busbw_gbps": "22", "gpus": 2, "max_bytes": "lots"}, "'lots' is not a size"),
        ({"min_busbw_gbps": "22", "gpus": 2, "binary": "/nonexistent/all_reduce_perf"}, "is not an executable file"),
        ({"min_busbw_gbps": "auto", "topology": {"gpus": [], "links": {}}}, "no GPUs to test"),
    ],
)
def test_argument_errors(args, message):
    res = run_module(args)
    assert res["failed"] and message in res["msg"]


def test_cuda_visible_devices_pick_the_gpus_the_model_judges(lab_node):
    node = lab_node("l40s-4x-switch")
    clear_acs(node)
    facts = topology_facts(node)
    uuid1 = facts["gpus"][1]["uuid"]
    res = run_module(
        lab_args(
            node,
            topology=facts,
            environment={"GPUFLEET_LAB_ROOT": str(node.root), "CUDA_VISIBLE_DEVICES": f"0,{uuid1}"},
        )
    )
    assert res["cmd"][res["cmd"].index("-g") + 1] == "2"
    assert res["model"]["worst_link"] == "PIX" and res["expected_busbw_gbps"] == 25.21
    assert res["passed"] is True and res["judged_busbw_gbps"] > 22.69  # a PIX pair: the switch alone


# --- numbers nobody measured ----------------------------------------------------------------------


def _cell(text, size, column, value):
    """``text`` with one cell of the row of ``size`` replaced (5-8 out-of-place, 9-12 in-place)."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        tokens = line.split()
        if tokens and tokens[0] == str(size):
            tokens[column] = value
            lines[index] = "  ".join(tokens)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("value", ["nan", "-nan", "inf"])
def test_non_finite_busbw_fails(tmp_path, value):
    """One NaN in-place value at the largest size: the gate fails, and the result stays JSON."""
    text = _cell((DATA / "gh200-2node-v2.17-good.txt").read_text(), 134217728, 11, value)
    text = text.replace("# Avg bus bandwidth    : 19.7866", f"# Avg bus bandwidth    : {value}")
    res = run_module({"binary": replay(tmp_path, None, text=text), "min_busbw_gbps": "100", "gpus": 4})
    assert res["failed"] and res["passed"] is False and res["kind"] == "non_finite", res
    assert "busbw_ip" in res["reason"] and "134217728 B" in res["reason"]
    assert res["judged_busbw_gbps"] is None and res["avg_busbw_gbps"] is None
    assert res["rows"][-1]["busbw_ip"] is None and res["rows"][-1]["busbw_oop"] == 122.57
    assert res["runs"] == [
        {"judged_busbw_gbps": None, "kind": "non_finite", "rc": 0, "duration_s": res["runs"][0]["duration_s"]}
    ]


@pytest.mark.parametrize("threshold", ["nan", "NaN", " nan ", "inf", "-inf", "Infinity", "1e400", "0", "-1", "-0.0"])
def test_non_finite_threshold_refused(tmp_path, threshold):
    ran = tmp_path / "ran"
    binary = fake_binary(tmp_path, f'touch "{ran}"\n')
    res = run_module({"binary": binary, "min_busbw_gbps": threshold, "gpus": 2})
    assert res["failed"] and "min_busbw_gbps must be" in res["msg"], res
    assert not ran.exists(), "nothing is measured against a threshold that cannot be judged"


@pytest.mark.parametrize("fraction", [float("nan"), float("inf"), 0.0, -0.5])
def test_non_finite_threshold_refused_with_auto(lab_node, fraction):
    res = run_module(lab_args(lab_node("l40s-4x-switch"), threshold_fraction=fraction))
    assert res["failed"] and "threshold_fraction must be in (0, 1.5]" in res["msg"], res


def test_wrong_na_with_check_fails(tmp_path):
    # an all_reduce_perf that printed N/A (a -c 0 run) although the module asked for -c 1
    binary = replay(tmp_path, "a100-sxm-8x-old-c0")
    res = run_module({"binary": binary, "min_busbw_gbps": "228", "gpus": 8, "min_bytes": "1", "max_bytes": "8G"})
    assert res["failed"] and res["passed"] is False and res["kind"] == "unvalidated", res
    assert "data checking was asked (-c 1)" in res["reason"] and "nothing was validated" in res["reason"]
    assert (tmp_path / "argv").read_text().split()[-2:] == ["-c", "1"]
    # the new format, N/A in the #wrong column of the largest size only
    text = _cell((DATA / "gh200-2node-v2.17-good.txt").read_text(), 134217728, 12, "N/A")
    res = run_module({"binary": replay(tmp_path, None, text=text), "min_busbw_gbps": "100", "gpus": 4})
    assert res["failed"] and res["kind"] == "unvalidated" and "#wrong column reads N/A" in res["reason"], res
    res = run_module({"binary": replay(tmp_path, None, text=text), "min_busbw_gbps": "100", "gpus": 4, "check": False})
    assert res["passed"] is True, res
