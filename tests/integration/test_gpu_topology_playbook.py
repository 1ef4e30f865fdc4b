# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_topology_facts through ansible-playbook (-c local) on lab machines: both backends, the
facts they set, and a gate that fails on a degraded node."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.harness.playbook import run_playbook

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "tests" / "integration" / "playbooks" / "gpu_topology.yml"
NVSMI = REPO / "lab" / "bin" / "nvidia-smi"


def play(node, env, out, expect=None):
    env = dict(env)
    env["GPUFLEET_LAB_ROOT"] = str(node.root)
    env["PATH"] = "%s:%s" % (REPO / "lab" / "bin", env["PATH"])
    env["PYTHONPATH"] = str(REPO / "lab" / "standins" / "nvml")  # `import pynvml` -> the NVML stand-in
    extra = {
        "nvidia_smi": str(NVSMI),
        "gpu_topology_out": str(out),
        "ansible_python_interpreter": sys.executable,
        "gpu_topology_expect": expect or {},
    }
    return run_playbook(PLAYBOOK, local=True, extra_vars=extra, env=env, timeout=300)


@pytest.mark.parametrize("profile", ["l40s-4x-switch", "h100-sxm-8x"])
def test_both_backends_through_ansible_playbook(lab_node, ansible_env, tmp_path, profile):
    node = lab_node(profile)
    out = tmp_path / "topology.json"
    expect = {"gpu_count": len(node.gpus), "min_pcie_width": 16}
    proc = play(node, ansible_env, out, expect)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(out.read_text())
    smi = got["nvidia_smi"]["ansible_facts"]["gpu_topology"]
    nvml = got["nvml"]["ansible_facts"]["gpu_topology"]
    assert (smi["backend"], nvml["backend"], got["facts"]["backend"]) == ("nvidia_smi", "nvml", "nvml")
    assert dict(smi, backend=None) == dict(nvml, backend=None) == dict(got["facts"], backend=None)
    assert [g["pci_bus_id"] for g in smi["gpus"]] == [g.bdf for g in node.gpus]
    assert got["nvidia_smi"]["changed"] is False and smi["violations"] == []
    if profile == "h100-sxm-8x":
        assert smi["summary"]["nvlink_all_pairs"] and smi["links"]["GPU0"]["GPU7"] == "NV18"
    else:
        assert smi["links"]["GPU0"] == {"GPU0": "X", "GPU1": "PIX", "GPU2": "PHB", "GPU3": "PHB"}
        assert smi["p2p"]["read"]["GPU0"]["GPU1"] == "CNS"
        assert smi["bridges"]["GPU0"]["GPU1"] == ["0000:42:00.0", "0000:42:01.0"]


def test_degraded_node_fails_the_gate(lab_node, ansible_env, tmp_path):
    node = lab_node("l40s-x8-degraded")
    proc = play(node, ansible_env, tmp_path / "t.json", {"gpu_count": 4, "min_pcie_width": 16})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "1 GPU topology violation(s): GPU2 (0000:48:00.0, NVIDIA L40S) PCIe link trained to x8" in proc.stdout
    assert "failed=1" in proc.stdout


def test_lost_gpu_fails_naming_it(lab_node, ansible_env, tmp_path):
    node = lab_node("h100-sxm-8x")
    node.inject("gpu-lost", 5)
    proc = play(node, ansible_env, tmp_path / "t.json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Unable to determine the device handle for GPU%s: Unknown Error" % node.gpus[5].bdf.upper() in proc.stdout
