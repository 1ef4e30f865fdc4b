# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet.node.gpu_topology_facts as a module: backend choice, argv, failures, expectations."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.node.plugins.module_utils.common import _proc
from ansible_collections.gpufleet.node.plugins.modules import gpu_topology_facts as mod

REPO = Path(__file__).resolve().parents[2]
NVSMI = str(REPO / "lab" / "bin" / "nvidia-smi")


class Exited(Exception):
    def __init__(self, failed, result):
        super().__init__(result.get("msg"))
        self.failed = failed
        self.result = result


@pytest.fixture(scope="module")
def stub():
    name = "gpufleet_lab_pynvml_module"
    spec = importlib.util.spec_from_file_location(name, REPO / "lab" / "standins" / "nvml" / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def run_module(monkeypatch):
    calls = []

    def exit_json(self, **kwargs):
        raise Exited(False, kwargs)

    def fail_json(self, **kwargs):
        raise Exited(True, kwargs)

    original = _proc.run

    def run(argv, timeout, environment=None, **kwargs):
        calls.append((list(argv), environment))
        return original(argv, timeout, environment, **kwargs)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)
    monkeypatch.setattr(_proc, "run", run)

    def _run(args, check_mode=False):
        calls.clear()
        if check_mode:
            args = dict(args, _ansible_check_mode=True)
        with patch_module_args(args):
            with pytest.raises(Exited) as info:
                mod.main()
        info.value.calls = list(calls)
        return info.value

    return _run


@pytest.fixture
def lab(lab_node, monkeypatch):
    def _lab(profile, fault=None, pynvml=None, gpu=0):
        node = lab_node(profile)
        monkeypatch.setenv("GPUFLEET_LAB_ROOT", str(node.root))
        if fault:
            node.inject(fault, gpu)  # into the machine's model, which both stand-ins read
        monkeypatch.setattr(mod, "pynvml", pynvml)
        return node

    return _lab


def test_auto_uses_nvml_and_matches_nvidia_smi(lab, run_module, stub):
    node = lab("l40s-4x-switch", pynvml=stub)
    sysfs = str(node.sysfs)
    nvml = run_module({"sysfs_path": sysfs})
    assert not nvml.failed and nvml.result["backend"] == "nvml" and nvml.calls == []
    smi_run = run_module({"backend": "nvidia_smi", "nvidia_smi_path": NVSMI, "sysfs_path": sysfs})
    assert not smi_run.failed and smi_run.result["backend"] == "nvidia_smi"
    a = dict(nvml.result["ansible_facts"]["gpu_topology"], backend=None)
    b = dict(smi_run.result["ansible_facts"]["gpu_topology"], backend=None)
    assert a == b
    assert nvml.result["changed"] is False


def test_nvidia_smi_argv_and_locale(lab, run_module):
    node = lab("h100-sxm-8x")
    run = run_module({"backend": "nvidia_smi", "nvidia_smi_path": NVSMI, "sysfs_path": str(node.sysfs)})
    assert not run.failed
    assert run.calls == [
        (
            [
                NVSMI,
                "--query-gpu=index,uuid,name,pci.bus_id,memory.total,pcie.link.gen.current,"
                "pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,driver_version",
                "--format=csv,noheader,nounits",
            ],
            {"LC_ALL": "C"},
        ),
        ([NVSMI, "topo", "-m"], {"LC_ALL": "C"}),
        ([NVSMI, "topo", "-p2p", "r"], {"LC_ALL": "C"}),
        ([NVSMI, "topo", "-p2p", "w"], {"LC_ALL": "C"}),
        ([NVSMI, "topo", "-p2p", "n"], {"LC_ALL": "C"}),
        ([NVSMI, "nvlink", "-s"], {"LC_ALL": "C"}),
    ]
    facts = run.result["ansible_facts"]["gpu_topology"]
    assert facts["summary"]["worst_link"] == "NV18" and facts["gpu_count"] == 8


def test_auto_falls_back_to_nvidia_smi_on_path(lab, run_module, monkeypatch):
    node = lab("epyc-rootport-acs", pynvml=None)
    monkeypatch.setenv("PATH", str(REPO / "lab" / "bin") + ":" + "/usr/bin:/bin")
    run = run_module({"sysfs_path": str(node.sysfs)})
    assert not run.failed and run.result["backend"] == "nvidia_smi"
    assert run.result["backend_notes"] == ["NVML: the pynvml module (nvidia-ml-py) is not installed"]
    assert run.calls[0][0][0] == NVSMI


def test_auto_falls_back_when_nvml_cannot_initialise(lab, run_module, stub, monkeypatch):
    node = lab("epyc-rootport-acs", pynvml=stub)
    monkeypatch.setattr(stub, "nvmlInit", lambda: (_ for _ in ()).throw(stub.NVMLError_LibraryNotFound()))
    run = run_module({"nvidia_smi_path": NVSMI, "sysfs_path": str(node.sysfs)})
    assert not run.failed and run.result["backend"] == "nvidia_smi"
    assert run.result["backend_notes"] == ["NVML: nvmlInit() failed: NVML Shared Library Not Found"]


def test_driver_not_loaded_fails_naming_the_cause(lab, run_module, stub):
    node = lab("l40s-4x-switch", fault="driver-not-loaded", pynvml=stub)
    run = run_module({"nvidia_smi_path": NVSMI, "sysfs_path": str(node.sysfs)})
    assert run.failed and run.result["cause"] == "driver_not_loaded"
    assert "couldn't communicate with the NVIDIA driver" in run.result["msg"]
    assert "NVIDIA kernel driver is not loaded" in run.result["msg"]
    assert run.result["backend_notes"] == ["NVML: nvmlInit() failed: Driver Not Loaded"]


def test_driver_not_loaded_without_gpus_in_the_tree_is_no_gpus(lab, run_module, tmp_path):
    lab("l40s-4x-switch", fault="driver-not-loaded")
    empty = tmp_path / "empty-tree"
    (empty / "devices").mkdir(parents=True)
    (empty / "devices" / "0000:00:00.0").mkdir()
    (empty / "devices" / "0000:00:00.0" / "vendor").write_text("0x8086\n")
    (empty / "devices" / "0000:00:00.0" / "class").write_text("0x060000\n")
    run = run_module({"nvidia_smi_path": NVSMI, "sysfs_path": str(empty)})
    assert not run.failed
    facts = run.result["ansible_facts"]["gpu_topology"]
    assert facts["no_gpus"] and facts["backend"] == "none"


def test_backend_nvml_needs_nvidia_ml_py(lab, run_module):
    node = lab("l40s-4x-switch", pynvml=None)
    run = run_module({"backend": "nvml", "sysfs_path": str(node.sysfs)})
    assert run.failed and "pip install nvidia-ml-py" in run.result["msg"]


def test_gpu_lost_fails_naming_the_gpu(lab, run_module, stub):
    node = lab("l40s-4x-switch", fault="gpu-lost", gpu=3, pynvml=stub)
    nvml = run_module({"sysfs_path": str(node.sysfs)})
    assert nvml.failed and nvml.result["cause"] == "gpu_lost"
    assert "NVML cannot get a handle for GPU 3 (Unknown Error)" in nvml.result["msg"]
    via_smi = run_module({"backend": "nvidia_smi", "nvidia_smi_path": NVSMI, "sysfs_path": str(node.sysfs)})
    assert via_smi.failed and via_smi.result["cause"] == "gpu_lost"
    assert "Unable to determine the device handle for GPU0000:49:00.0: Unknown Error" in via_smi.result["msg"]
    assert "fallen off the bus" in via_smi.result["msg"]


@pytest.mark.parametrize("fault", ["no-devices", "empty-output"])
def test_no_devices_with_nvidia_bound_gpus_fails(lab, run_module, tmp_path, fault):
    """The driver sees no GPU while the PCI tree has GPUs bound to it: a driver problem."""
    node = lab("l40s-4x-switch", fault=fault if fault == "no-devices" else None)
    binary = NVSMI
    if fault == "empty-output":
        binary = str(tmp_path / "nvidia-smi")
        Path(binary).write_text("#!/bin/sh\nexit 0\n")
        Path(binary).chmod(0o755)
    run = run_module({"backend": "nvidia_smi", "nvidia_smi_path": binary, "sysfs_path": str(node.sysfs)})
    assert run.failed and run.result["cause"] == "driver_no_devices"
    assert "nvidia-smi reports no GPU" in run.result["msg"]
    assert "0000:43:00.0, 0000:44:00.0, 0000:48:00.0, 0000:49:00.0 bound to the nvidia driver" in run.result["msg"]


def test_nvidia_smi_hang_times_out(lab, run_module, tmp_path):
    """A hung nvidia-smi (and what it forked) is killed at the deadline; the task names the command."""
    node = lab("l40s-4x-switch")
    pidfile = tmp_path / "child.pid"
    binary = tmp_path / "nvidia-smi"
    binary.write_text("#!/bin/sh\nsleep 300 &\necho $! > %s\nwait\n" % pidfile)
    binary.chmod(0o755)
    run = run_module(
        {"backend": "nvidia_smi", "nvidia_smi_path": str(binary), "timeout": 1, "sysfs_path": str(node.sysfs)}
    )
    assert run.failed and run.result["cause"] == "nvidia_smi_timeout"
    assert "`%s --query-gpu=" % binary in run.result["msg"]
    assert "did not finish within 1 s; its process group was killed" in run.result["msg"]
    child = int(pidfile.read_text())
    assert process_gone(child), "the hung command's child survived"


def process_gone(pid, wait=5.0):
    """Dead, or a zombie waiting for a reaper (killed all the same), within ``wait`` seconds: the
    module returns once the killed group has closed its pipes, and a process that closed them may
    still be on its way out (state R) for a moment on a loaded machine."""
    deadline = time.monotonic() + wait
    while True:
        try:
            stat = Path("/proc/%d/stat" % pid).read_text()
        except FileNotFoundError:
            return True
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_no_devices_only_fails_when_gpus_are_expected(lab, run_module):
    node = lab("l40s-4x-switch", fault="no-devices")
    # The GPUs are bound to vfio-pci (a VM has them): rightly invisible to the driver.
    for gpu in node.gpus:
        link = node.sysfs / "devices" / gpu.bdf / "driver"
        target = Path(os.readlink(link))
        link.unlink()
        link.symlink_to(target.parent / "vfio-pci")
    args = {"backend": "nvidia_smi", "nvidia_smi_path": NVSMI, "sysfs_path": str(node.sysfs)}
    run = run_module(args)
    assert not run.failed
    facts = run.result["ansible_facts"]["gpu_topology"]
    assert facts["no_gpus"] is True and facts["gpus"] == [] and facts["links"] == {}
    assert facts["p2p"] == {"read": {}, "write": {}, "nvlink": {}}
    run = run_module(dict(args, expect={"gpu_count": 4}))
    assert run.failed and "0 GPU(s) visible to the NVIDIA driver, expected 4" in run.result["msg"]


def test_no_tools_with_gpus_in_the_tree_fails(lab, run_module, monkeypatch):
    node = lab("l40s-4x-switch", pynvml=None)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, *a, **k: None)
    run = run_module({"sysfs_path": str(node.sysfs)})
    assert run.failed
    assert "nvidia-smi is not on PATH" in run.result["msg"]
    assert "0000:43:00.0, 0000:44:00.0, 0000:48:00.0, 0000:49:00.0" in run.result["msg"]


def test_violations_fail_unless_report_only(lab, run_module, stub):
    node = lab("l40s-x8-degraded", pynvml=stub)
    args = {"sysfs_path": str(node.sysfs), "expect": {"gpu_count": 4, "min_pcie_width": 16}}
    run = run_module(args)
    assert run.failed
    assert run.result["msg"].startswith(
        "1 GPU topology violation(s): GPU2 (0000:48:00.0, NVIDIA L40S) PCIe link trained to x8 below port 0000:47:00.0"
    )
    assert [v["gpus"] for v in run.result["violations"]] == [["GPU2"]]
    report = run_module(dict(args, report_only=True))
    assert not report.failed and report.result["violations"] == run.result["violations"]
    assert report.result["ansible_facts"]["gpu_topology"]["violations"] == run.result["violations"]
    checked = run_module(dict(args, report_only=True), check_mode=True)
    assert checked.result == report.result


def test_p2p_violation_names_gpus_and_bridges(lab, run_module, stub):
    node = lab("epyc-rootport-acs", pynvml=stub)
    run = run_module({"sysfs_path": str(node.sysfs), "expect": {"p2p_all_pairs": True}})
    assert run.failed
    (violation,) = run.result["violations"]
    assert violation["gpus"] == ["GPU0", "GPU1"] and violation["bridges"] == ["0000:00:01.1", "0000:00:01.2"]
    assert "ACS redirects peer traffic at 0000:00:01.1, 0000:00:01.2" in violation["message"]
