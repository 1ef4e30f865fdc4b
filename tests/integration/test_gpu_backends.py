# SPDX-License-Identifier: GPL-3.0-or-later
"""Both backends on every lab profile: the NVML stand-in and the nvidia-smi stand-in answer from
the same model and registers, so the facts must be identical; expectations and failures. And the
serving backend (vLLM or llama.cpp) that `auto` chooses from those facts and the plans."""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lab.hwmodel as hw
from ansible_collections.gpufleet.node.plugins.module_utils.gpu import _topology_facts
from lab.standins import nvidia_smi as smi
from tests.harness.playbook import run_playbook

REPO = Path(__file__).resolve().parents[2]
STUB = REPO / "lab" / "standins" / "nvml" / "pynvml.py"
NVSMI = str(REPO / "lab" / "bin" / "nvidia-smi")


def load_stub():
    name = "gpufleet_lab_pynvml"
    spec = importlib.util.spec_from_file_location(name, STUB)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def nvml():
    return load_stub()


@pytest.fixture
def machine(lab_node, monkeypatch):
    """Build a profile, point the stand-ins at it and put `fault` (of GPU `gpu`) into its model."""

    def _machine(profile, fault=None, gpu=0):
        node = lab_node(profile)
        monkeypatch.setenv("GPUFLEET_LAB_ROOT", str(node.root))
        if fault:
            node.inject(fault, gpu)
        return node

    return _machine


def in_process(argv):
    """run(argv) for collect_nvidia_smi: the stand-in without a subprocess."""
    assert argv[0] == "nvidia-smi"
    return smi.run(argv[1:])


class Recorder:
    def __init__(self, binary):
        self.calls = []
        self.binary = binary

    def __call__(self, argv):
        self.calls.append(list(argv))
        proc = subprocess.run(argv, capture_output=True, text=True)
        return proc.returncode, proc.stdout, proc.stderr


def facts_both(node, nvml, expect=None):
    sysfs = str(node.sysfs)
    a = _topology_facts.build_facts(_topology_facts.collect_nvml(nvml), "b", sysfs, expect)
    b = _topology_facts.build_facts(_topology_facts.collect_nvidia_smi(in_process, "nvidia-smi"), "b", sysfs, expect)
    return a, b


def test_both_backends_identical_on_every_profile(machine, any_profile, nvml):
    node = machine(any_profile)
    expect = {"gpu_count": len(node.gpus), "min_pcie_width": 16, "min_pcie_gen": 4, "p2p_all_pairs": True}
    a, b = facts_both(node, nvml, expect)
    assert a == b
    visible = [g for g in node.gpus if g.driver == "nvidia"]
    assert a["gpu_count"] == len(visible) and not a["no_gpus"]
    for fact, gpu in zip(a["gpus"], visible, strict=False):
        assert fact["pci_bus_id"] == gpu.bdf
        assert fact["uuid"] == gpu.uuid and fact["name"] == gpu.name
        assert fact["memory_total_mib"] == gpu.memory_total_mib
        assert fact["pcie"] == {
            "gen_current": gpu.gen_current,
            "gen_max": gpu.gen_max,
            "width_current": gpu.width_current,
            "width_max": gpu.width_max,
        }
        assert fact["numa_node"] == gpu.numa_node and fact["cpu_affinity"] == gpu.cpu_affinity
        assert fact["nvlinks"] == gpu.nvlinks and fact["gpu_numa_id"] is None
        assert fact["upstream_port"] == gpu.parent
    for i, gi in enumerate(visible):
        for j, gj in enumerate(visible):
            assert a["links"]["GPU%d" % i]["GPU%d" % j] == node.link_type(gi.index, gj.index)
            for mode in ("read", "write", "nvlink"):
                assert a["p2p"][mode]["GPU%d" % i]["GPU%d" % j] == node.p2p_status(gi.index, gj.index, mode)
            if i != j:
                assert a["bridges"]["GPU%d" % i]["GPU%d" % j] == node.path_bridges(gi.index, gj.index)
                assert a["pci_tree"]["redirecting"]["GPU%d" % i]["GPU%d" % j] == node.redirecting_bridges(
                    gi.index, gj.index
                )
    assert a["driver_version"] == smi.DEFAULT_DRIVER
    assert a["pci_tree"]["checked"] and a["pci_tree"]["config_readable"] and a["pci_tree"]["missing"] == []


def test_seed000_facts(machine, nvml):
    node = machine("l40s-4x-switch")
    a, _b = facts_both(node, nvml, {"p2p_all_pairs": True})
    assert a["links"]["GPU0"] == {"GPU0": "X", "GPU1": "PIX", "GPU2": "PHB", "GPU3": "PHB"}
    assert a["p2p"]["read"]["GPU0"] == {"GPU0": "X", "GPU1": "CNS", "GPU2": "CNS", "GPU3": "CNS"}
    assert a["bridges"]["GPU0"]["GPU1"] == ["0000:42:00.0", "0000:42:01.0"]
    assert a["summary"] == {
        "gpu_count": 4,
        "pairs": 6,
        "p2p_all_pairs": False,
        "p2p_pairs_not_ok": [
            ["GPU0", "GPU1"],
            ["GPU0", "GPU2"],
            ["GPU0", "GPU3"],
            ["GPU1", "GPU2"],
            ["GPU1", "GPU3"],
            ["GPU2", "GPU3"],
        ],
        "worst_link": "PHB",
        "best_link": "PIX",
        "nvlink": False,
        "nvlink_all_pairs": False,
        "numa_nodes": [0],
        "pcie_downtrained": [],
    }
    first = a["violations"][0]
    assert first["check"] == "p2p" and first["gpus"] == ["GPU0", "GPU1"]
    assert first["bridges"] == ["0000:42:00.0", "0000:42:01.0"]
    assert "GPU0 (0000:43:00.0, NVIDIA L40S) and GPU1 (0000:44:00.0, NVIDIA L40S)" in first["message"]
    assert "read CNS (chipset not supported)" in first["message"]
    assert "ACS redirects peer traffic at 0000:42:00.0, 0000:42:01.0" in first["message"]


def setpci(node, bdf, reg):
    subprocess.run(["setpci", "-O", "sysfs.path=%s" % node.sysfs, "-s", bdf, reg], check=True, capture_output=True)


@pytest.mark.skipif(not shutil.which("setpci"), reason="pciutils is not installed")
def test_p2p_follows_the_current_acs_registers(machine, nvml):
    node = machine("l40s-4x-switch")
    for bdf in node.path_bridges(0, 1):
        setpci(node, bdf, "ECAP_ACS+0x6.w=0000:002c")
    a, b = facts_both(node, nvml, {"p2p_all_pairs": True})
    assert a == b
    assert a["p2p"]["read"]["GPU0"]["GPU1"] == "OK" and a["p2p"]["write"]["GPU1"]["GPU0"] == "OK"
    assert a["pci_tree"]["redirecting"]["GPU0"]["GPU1"] == []
    assert ["GPU0", "GPU1"] not in a["summary"]["p2p_pairs_not_ok"]
    assert ["GPU2", "GPU3"] in a["summary"]["p2p_pairs_not_ok"]
    for bdf in node.devices:
        if node.devices[bdf].acs_ctl is not None:
            setpci(node, bdf, "ECAP_ACS+0x6.w=0000:002c")
    a, b = facts_both(node, nvml, {"p2p_all_pairs": True})
    assert a == b and a["summary"]["p2p_all_pairs"] and a["violations"] == []


def test_degraded_gpu_names_the_gpu_and_its_port(machine, nvml):
    node = machine("l40s-x8-degraded")
    a, b = facts_both(node, nvml, {"min_pcie_width": 16, "min_pcie_gen": 4})
    assert a == b
    assert a["summary"]["pcie_downtrained"] == ["GPU2"]
    assert a["violations"] == [
        {
            "check": "pcie_width",
            "gpus": ["GPU2"],
            "bridges": ["0000:47:00.0"],
            "message": "GPU2 (0000:48:00.0, NVIDIA L40S) PCIe link trained to x8 below port 0000:47:00.0, "
            "expected at least x16 (the GPU can do x16): reseat the card, check the slot, riser "
            "and BIOS lane settings",
        }
    ]


def test_gen_is_judged_on_the_maximum_not_the_idle_current(machine, nvml):
    node = machine("l40s-4x-switch")
    gpu = node.gpus[1]
    data = bytearray(gpu.config_path.read_bytes())
    data[0x60 + 0x12] = (data[0x60 + 0x12] & 0xF0) | 1  # idle: Gen1 now, Gen4 possible
    gpu.config_path.write_bytes(bytes(data))
    a, b = facts_both(node, nvml, {"min_pcie_gen": 4})
    assert a == b and a["gpus"][1]["pcie"]["gen_current"] == 1 and a["violations"] == []
    a, _b = facts_both(node, nvml, {"min_pcie_gen": 5})
    assert [v["gpus"] for v in a["violations"]] == [["GPU0"], ["GPU1"], ["GPU2"], ["GPU3"]]
    assert "can reach Gen4 at most below port 0000:42:01.0, expected Gen5" in a["violations"][1]["message"]


def test_nvlink_node(machine, nvml):
    node = machine("h100-sxm-8x")
    a, b = facts_both(node, nvml, {"nvlink_required": True, "p2p_all_pairs": True, "gpu_count": 8})
    assert a == b and a["violations"] == []
    assert a["summary"]["nvlink_all_pairs"] and a["summary"]["worst_link"] == "NV18"
    assert [g["nvlinks"] for g in a["gpus"]] == [18] * 8
    assert a["summary"]["numa_nodes"] == [0, 1]
    assert a["p2p"]["nvlink"]["GPU0"]["GPU7"] == "OK"


def test_nvlink_required_on_a_pcie_node(machine, nvml):
    node = machine("epyc-rootport-acs")
    a, _b = facts_both(node, nvml, {"nvlink_required": True})
    assert [v["message"] for v in a["violations"]] == [
        "GPU0 (0000:01:00.0, NVIDIA A100 80GB PCIe) has no active NVLink",
        "GPU1 (0000:02:00.0, NVIDIA A100 80GB PCIe) has no active NVLink",
        "no NVLink between GPU0 and GPU1 (they talk over PHB)",
    ]


def test_vfio_gpu_is_invisible_and_reported_from_the_tree(machine, nvml):
    node = machine("vfio-passthrough")
    a, b = facts_both(node, nvml, {"gpu_count": 4})
    assert a == b and a["gpu_count"] == 3
    assert a["pci_tree"]["other_gpus"] == [{"pci_bus_id": "0000:49:00.0", "driver": "vfio-pci"}]
    assert a["violations"][0]["message"] == (
        "3 GPU(s) visible to the NVIDIA driver, expected 4; NVIDIA GPUs in the PCI tree the driver does "
        "not manage: 0000:49:00.0 (driver vfio-pci)"
    )


def test_p2p_message_without_redirecting_bridge(machine, nvml):
    node = machine("l40s-4x-switch")
    a, _b = facts_both(node, nvml)
    facts = copy.deepcopy(a)
    facts["pci_tree"]["redirecting"]["GPU0"]["GPU1"] = []
    violations = _topology_facts.evaluate(facts, {"p2p_all_pairs": True})
    assert violations[0]["bridges"] == ["0000:42:00.0", "0000:42:01.0"]
    assert "no bridge on that path redirects (ACS)" in violations[0]["message"]


def test_nvidia_smi_argv_through_the_real_wrapper(machine):
    machine("l40s-4x-switch")
    recorder = Recorder(NVSMI)
    record = _topology_facts.collect_nvidia_smi(recorder, NVSMI)
    assert recorder.calls == [
        [
            NVSMI,
            "--query-gpu=index,uuid,name,pci.bus_id,memory.total,pcie.link.gen.current,"
            "pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,driver_version",
            "--format=csv,noheader,nounits",
        ],
        [NVSMI, "topo", "-m"],
        [NVSMI, "topo", "-p2p", "r"],
        [NVSMI, "topo", "-p2p", "w"],
        [NVSMI, "topo", "-p2p", "n"],
        [NVSMI, "nvlink", "-s"],
    ]
    assert len(record["gpus"]) == 4


@pytest.mark.parametrize(
    "fault,gpu,cause,text",
    [
        ("driver-not-loaded", 0, "driver_not_loaded", "NVIDIA kernel driver is not loaded"),
        ("library-mismatch", 0, "driver_library_mismatch", "Driver/library version mismatch"),
        ("gpu-lost", 2, "gpu_lost", "(GPU 0000:48:00.0)"),
    ],
)
def test_nvidia_smi_failures_name_the_cause(machine, fault, gpu, cause, text):
    machine("l40s-4x-switch", fault=fault, gpu=gpu)
    with pytest.raises(_topology_facts.GpuTopologyError) as info:
        _topology_facts.collect_nvidia_smi(Recorder(NVSMI), NVSMI)
    assert info.value.cause == cause and text in str(info.value)


def test_no_devices_gives_empty_facts(machine, nvml):
    node = machine("l40s-4x-switch", fault="no-devices")
    record = _topology_facts.collect_nvidia_smi(in_process, "nvidia-smi")
    assert record == _topology_facts.empty_record()
    assert _topology_facts.collect_nvml(nvml)["gpus"] == []
    facts = _topology_facts.build_facts(record, "nvidia_smi", str(node.sysfs))
    assert facts["no_gpus"] and facts["gpu_count"] == 0 and facts["violations"] == []
    assert len(facts["pci_tree"]["other_gpus"]) == 4
    facts = _topology_facts.build_facts(record, "nvidia_smi", str(node.sysfs), {"gpu_count": 4})
    assert facts["violations"][0]["check"] == "gpu_count"


def test_nvml_failures(machine, nvml, monkeypatch):
    node = machine("l40s-4x-switch", fault="driver-not-loaded")
    with pytest.raises(_topology_facts.NvmlUnavailable, match="Driver Not Loaded") as info:
        _topology_facts.collect_nvml(nvml)
    assert info.value.code == nvml.NVML_ERROR_DRIVER_NOT_LOADED
    node.inject("clear")
    node.inject("gpu-lost", 1)
    with pytest.raises(_topology_facts.GpuTopologyError, match="handle for GPU 1 .Unknown Error.") as lost:
        _topology_facts.collect_nvml(nvml)
    assert lost.value.cause == "gpu_lost"
    monkeypatch.delenv("GPUFLEET_LAB_ROOT")
    with pytest.raises(_topology_facts.NvmlUnavailable, match="NVML Shared Library Not Found"):
        _topology_facts.collect_nvml(nvml)


def test_stub_refuses_the_tuple_read_index(machine, nvml):
    """NVML_P2P_CAPS_INDEX_READ is (0,) in nvidia-ml-py 13.615.71; the backend passes integers."""
    import ctypes

    machine("epyc-rootport-acs")
    nvml.nvmlInit()
    try:
        h0, h1 = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
        with pytest.raises(ctypes.ArgumentError):
            nvml.nvmlDeviceGetP2PStatus(h0, h1, nvml.NVML_P2P_CAPS_INDEX_READ)
        assert nvml.nvmlDeviceGetP2PStatus(h0, h1, 0) == nvml.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED
    finally:
        nvml.nvmlShutdown()


def test_nvml_bytes_strings_are_decoded(machine, nvml):
    """Older nvidia-ml-py releases return bytes (busId, names, versions)."""
    machine("epyc-rootport-acs")

    class BytesNvml:
        def __getattr__(self, name):
            value = getattr(nvml, name)
            if not callable(value) or isinstance(value, type):
                return value

            def call(*args):
                result = value(*args)
                if isinstance(result, str):
                    return result.encode()
                if isinstance(result, nvml.nvmlPciInfo_t):
                    result.busId = result.busId.encode()
                return result

            return call

    expected = _topology_facts.collect_nvml(nvml)
    assert _topology_facts.collect_nvml(BytesNvml()) == expected
    assert expected["gpus"][0]["pci_bus_id"] == "0000:01:00.0"


REAL_NAMES = [
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetTopologyCommonAncestor",
    "nvmlDeviceGetP2PStatus",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkRemoteDeviceType",
    "nvmlDeviceGetNvLinkRemotePciInfo",
    "nvmlDeviceGetCpuAffinity",
    "nvmlDeviceGetMemoryAffinity",
    "nvmlDeviceGetNumaNodeId",
    "NVMLError",
    "NVMLError_DriverNotLoaded",
    "NVMLError_LibraryNotFound",
    "NVMLError_NotSupported",
    "NVMLError_Unknown",
    "NVMLError_GpuIsLost",
    "NVMLError_InvalidArgument",
]
REAL_CONSTANTS = [
    "NVML_NVLINK_MAX_LINKS",
    "NVML_FEATURE_ENABLED",
    "NVML_NVLINK_DEVICE_TYPE_GPU",
    "NVML_NVLINK_DEVICE_TYPE_SWITCH",
    "NVML_TOPOLOGY_SINGLE",
    "NVML_TOPOLOGY_MULTIPLE",
    "NVML_TOPOLOGY_HOSTBRIDGE",
    "NVML_TOPOLOGY_NODE",
    "NVML_TOPOLOGY_SYSTEM",
    "NVML_P2P_CAPS_INDEX_READ",
    "NVML_P2P_CAPS_INDEX_WRITE",
    "NVML_P2P_CAPS_INDEX_NVLINK",
    "NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED",
    "NVML_P2P_STATUS_NOT_SUPPORTED",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_AFFINITY_SCOPE_NODE",
]


def test_stub_matches_nvidia_ml_py(nvml):
    """The stand-in has the names and values of the real nvidia-ml-py (a test dependency)."""
    stub_dir = str(STUB.parent)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(stub_dir).resolve()]
    try:
        spec = importlib.util.find_spec("pynvml")
        if spec is None or Path(spec.origin).resolve() == STUB.resolve():
            pytest.skip("nvidia-ml-py is not installed")
        real = importlib.util.module_from_spec(spec)
        previous = sys.modules.get("pynvml")
        sys.modules["pynvml"] = real
        try:
            spec.loader.exec_module(real)
        finally:
            if previous is None:
                sys.modules.pop("pynvml", None)
            else:
                sys.modules["pynvml"] = previous
    finally:
        sys.path[:] = saved
    for name in REAL_NAMES:
        assert hasattr(real, name) and hasattr(nvml, name), name
    for name in REAL_CONSTANTS:
        assert getattr(real, name) == getattr(nvml, name), name
    assert real.NVML_P2P_CAPS_INDEX_READ == (0,)
    assert (
        type(nvml.NVMLError(nvml.NVML_ERROR_DRIVER_NOT_LOADED)).__name__
        == type(real.NVMLError(real.NVML_ERROR_DRIVER_NOT_LOADED)).__name__
        == "NVMLError_DriverNotLoaded"
    )
    assert str(nvml.NVMLError_Unknown()) == "Unknown Error"


# --- the serving backend (gpufleet_serving_backend auto) in the NCCL gate's marker ----------------


@pytest.mark.skipif(not shutil.which("setpci"), reason="pciutils is not installed")
def test_auto_backend_and_its_reason_reach_the_gate_marker(ansible_env, tmp_path):
    """One run, three lab machines: GPUs of different sizes (llama.cpp); four L40S that hold a 70B
    FP8 model with tensor parallelism (vLLM's plan fits: vLLM); the same machine limited to one
    GPU (vLLM's plan does not fit, a Q4_K_M layer offload does: llama.cpp). Each choice and the
    planners' numbers that decided it are printed and written to the gate's marker."""
    model = {"vllm_server_model": "Llama-3.3-70B-Instruct-FP8", "llamacpp_server_model": "Llama-3.3-70B-Instruct"}
    hosts = {
        "hetero": ("a6000-4090-hetero", model),
        "tp4": ("l40s-4x-switch", model),
        "tp1": ("l40s-4x-switch", dict(model, vllm_server_gpu_count=1, llamacpp_server_gpu_memory_mib=[46068])),
    }
    inventory = {"all": {"hosts": {}}}
    for name, (profile, host_vars) in hosts.items():
        node = hw.build(profile, tmp_path / name)
        inventory["all"]["hosts"][name] = dict(
            host_vars,
            ansible_connection="local",
            ansible_python_interpreter=sys.executable,
            lab_root=str(node.root),
            state_dir=str(tmp_path / "state" / name),
        )
    (tmp_path / "hosts.yml").write_text(json.dumps(inventory))
    proc = run_playbook(
        Path(__file__).resolve().parent / "playbooks" / "serving_backend.yml",
        inventory=tmp_path / "hosts.yml",
        extra_vars={"repo": str(REPO), "nccl_gate_repeats": 1},
        env=ansible_env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    markers = {n: json.loads((tmp_path / "state" / n / "run/gpufleet/nccl-gate.json").read_text()) for n in hosts}
    assert all(m["passed"] for m in markers.values()), markers
    assert markers["hetero"]["serving_backend"] == "llamacpp"
    assert "differ in size (49140, 24564 MiB)" in markers["hetero"]["serving_backend_reason"]
    assert markers["tp4"]["serving_backend"] == "vllm"
    assert (
        "4 identical GPUs (46068 MiB): vLLM's tensor-parallel plan fits (tensor_parallel_size 4"
        in (markers["tp4"]["serving_backend_reason"])
    )
    assert markers["tp1"]["serving_backend"] == "llamacpp"
    reason = markers["tp1"]["serving_backend_reason"]
    assert "does not fit (tensor_parallel_size 1: weights alone exceed the budget: 67.67 GiB" in reason
    assert "llama.cpp's layer-offload plan fits (Llama-3.3-70B-Instruct with 74 of 80 layers" in reason
    # printed as well (the YAML callback folds long lines and doubles quotes)
    printed = " ".join(proc.stdout.replace("''", "'").split())
    for name, marker in markers.items():
        line = " ".join(f"serving backend: {marker['serving_backend']} ({marker['serving_backend_reason']})".split())
        assert line in printed, name
