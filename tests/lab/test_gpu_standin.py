# SPDX-License-Identifier: GPL-3.0-or-later
"""The nvidia-smi stand-in prints nvidia-smi's real formats for the lab machine it is given."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import lab.hwmodel as hw
from ansible_collections.gpufleet.node.plugins.module_utils.gpu import _nvsmi
from lab.standins import nvidia_smi as smi

REPO = Path(__file__).resolve().parents[2]
NVSMI = str(REPO / "lab" / "bin" / "nvidia-smi")
DATA = REPO / "tests" / "data" / "nvidia-smi"


@pytest.fixture
def seed(lab_node, monkeypatch):
    return lab_node("l40s-4x-switch")


def test_topo_matrix_has_the_real_shape(seed):
    code, out, _err = smi.run(["topo", "-m"], seed)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == ("\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m")
    assert lines[1] == "GPU0\t X \tPIX\tPHB\tPHB\tPIX\t0-31,64-95\t0\t\tN/A"
    assert lines[5] == "NIC0\tPIX\tPIX\tPHB\tPHB\t X "
    assert "\nLegend:\n\n  X    = Self\n" in out and out.endswith("NIC Legend:\n\n  NIC0: mlx5_0\n\n")
    # The same legend text as the real samples.
    real = (DATA / "nccl-tests-307-8x4090-pix" / "topo-m.txt").read_text()
    assert (
        real[real.index("Legend:") : real.index("NIC Legend:")] == out[out.index("Legend:") : out.index("NIC Legend:")]
    )


def test_p2p_has_the_real_shape_and_follows_acs(seed):
    _code, out, _err = smi.run(["topo", "-p2p", "r"], seed)
    assert out.splitlines()[:3] == [
        " \tGPU0\tGPU1\tGPU2\tGPU3\t",
        " GPU0\tX\tCNS\tCNS\tCNS\t",
        " GPU1\tCNS\tX\tCNS\tCNS\t",
    ]
    real = (DATA / "club3090-1133-2x5090-phb-gns" / "p2p-rw.txt").read_text()
    assert real[real.index("Legend:") :] in out
    for bdf in seed.path_bridges(0, 1):
        subprocess.run(
            ["setpci", "-O", "sysfs.path=%s" % seed.sysfs, "-s", bdf, "ECAP_ACS+0x6.w=0000:002c"], check=True
        )
    _code, out, _err = smi.run(["topo", "-p2p", "w"], seed)
    assert _nvsmi.parse_p2p_matrix(out)["GPU0"] == {"GPU0": "X", "GPU1": "OK", "GPU2": "CNS", "GPU3": "CNS"}
    assert _nvsmi.parse_p2p_matrix(smi.run(["topo", "-p2p", "n"], seed)[1])["GPU0"]["GPU1"] == "NS"


def test_p2p_argument_errors(seed):
    assert smi.run(["topo", "-p2p"], seed) == (2, 'Option "-p2p" is missing its value.\n', "")
    assert smi.run(["topo", "-p2p", "x"], seed)[0] == 2
    assert smi.run(["topo"], seed)[0] == 2


def test_query_forms(seed):
    args = ["--query-gpu=index,name,memory.total,pcie.link.width.current,pci.bus_id"]
    _code, out, _err = smi.run(args + ["--format=csv"], seed)
    assert out.splitlines()[:2] == [
        "index, name, memory.total [MiB], pcie.link.width.current, pci.bus_id",
        "0, NVIDIA L40S, 46068 MiB, 16, 00000000:43:00.0",
    ]
    _code, out, _err = smi.run(args + ["--format=csv,noheader,nounits"], seed)
    assert out.splitlines()[0] == "0, NVIDIA L40S, 46068, 16, 00000000:43:00.0"
    _code, out, _err = smi.run(["--query-gpu", "index,uuid", "--format", "csv,noheader", "-i", "2"], seed)
    assert out == "2, %s\n" % seed.gpus[2].uuid
    assert smi.run(["--query-gpu=index,bogus", "--format=csv"], seed) == (
        2,
        'Field "bogus" is not a valid field to query.\n\n',
        "",
    )


def test_query_width_follows_the_link_status_register(lab_node, monkeypatch):
    node = lab_node("l40s-x8-degraded")
    _code, out, _err = smi.run(
        ["--query-gpu=index,pcie.link.width.current,pcie.link.width.max", "--format=csv,noheader,nounits"], node
    )
    assert out.splitlines() == ["0, 16, 16", "1, 16, 16", "2, 8, 16", "3, 16, 16"]


def test_list_and_nvlink(lab_node, monkeypatch):
    node = lab_node("h100-sxm-8x")
    _code, out, _err = smi.run(["-L"], node)
    assert out.splitlines()[0] == "GPU 0: NVIDIA H100 80GB HBM3 (UUID: %s)" % node.gpus[0].uuid
    _code, out, _err = smi.run(["nvlink", "-s"], node)
    assert _nvsmi.parse_nvlink_status(out) == dict.fromkeys(range(8), 18)
    assert out.splitlines()[1] == "\t Link 0: 26.562 GB/s"


@pytest.mark.parametrize("profile", ["h100-sxm-8x", "a6000-4090-hetero"])
def test_gpu_facts_come_from_the_model_profile(lab_node, monkeypatch, profile):
    """Compute capability (nvidia-smi and NVML) and NVLink rate (nvidia-smi) are the GPU model's."""
    import importlib.util

    node = lab_node(profile)
    models = {m["name"]: m for m in hw.profiles.GPU_MODELS.values()}
    _code, out, _err = smi.run(["--query-gpu=name,compute_cap", "--format=csv,noheader"], node)
    assert out.splitlines() == [f"{g.name}, {models[g.name]['compute_capability']}" for g in node.gpus]
    _code, out, _err = smi.run(["nvlink", "-s"], node)
    rates = {line.split(": ")[1] for line in out.splitlines() if "Link" in line}
    assert rates == ({f"{models[node.gpus[0].name]['nvlink_gbps']:.3f} GB/s"} if node.gpus[0].nvlinks else set())
    spec = importlib.util.spec_from_file_location(
        "gpufleet_lab_pynvml_facts", REPO / "lab" / "standins" / "nvml" / "pynvml.py"
    )
    nvml = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, nvml)  # its error classes register by module name
    spec.loader.exec_module(nvml)
    monkeypatch.setenv("GPUFLEET_LAB_ROOT", str(node.root))
    nvml.nvmlInit()
    caps = [nvml.nvmlDeviceGetCudaComputeCapability(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(len(node.gpus))]
    assert caps == [tuple(int(x) for x in models[g.name]["compute_capability"].split(".")) for g in node.gpus]


def test_vfio_gpu_is_not_listed(lab_node, monkeypatch):
    node = lab_node("vfio-passthrough")
    _code, out, _err = smi.run(["--query-gpu=index,pci.bus_id", "--format=csv,noheader"], node)
    assert out.splitlines() == ["0, 00000000:43:00.0", "1, 00000000:44:00.0", "2, 00000000:48:00.0"]


@pytest.mark.parametrize(
    "fault,gpu,code,first_line",
    [
        (
            "driver-not-loaded",
            0,
            9,
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.",
        ),
        ("no-devices", 0, 6, "No devices were found"),
        ("gpu-lost", 1, 15, "Unable to determine the device handle for GPU0000:44:00.0: Unknown Error"),
        ("library-mismatch", 0, 18, "Failed to initialize NVML: Driver/library version mismatch"),
    ],
)
def test_faults_print_the_real_texts(lab_node, monkeypatch, fault, gpu, code, first_line):
    node = lab_node("l40s-4x-switch")
    monkeypatch.setenv("GPUFLEET_LAB_ROOT", str(node.root))
    node.inject(fault, gpu)
    proc = subprocess.run([NVSMI, "topo", "-m"], capture_output=True, text=True)
    assert proc.returncode == code and proc.stdout.splitlines()[0] == first_line


def test_a_lost_gpu_stays_lost_until_clear(lab_node):
    """The driver faults live in the machine's health state: a reboot keeps them, `clear` ends them."""
    node = lab_node("h100-sxm-8x")
    node.inject("gpu-lost", 7)
    node.reset_firmware()
    code, out, _err = smi.run(["-L"], node)
    assert code == 15 and node.gpus[7].bdf.upper() in out
    assert hw.health.keeps_out(node.root, node.data) == ["GPU 7: lost"]
    node.inject("clear")
    assert smi.run(["-L"], node)[0] == 0 and hw.health.keeps_out(node.root, node.data) == []


def test_without_a_lab_machine_it_is_a_host_without_driver(monkeypatch):
    monkeypatch.delenv("GPUFLEET_LAB_ROOT", raising=False)
    proc = subprocess.run([NVSMI, "-L"], capture_output=True, text=True)
    assert proc.returncode == 9 and "couldn't communicate with the NVIDIA driver" in proc.stdout
    assert "GPUFLEET_LAB_ROOT" in proc.stderr
