# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU health faults in the hardware model, as the stand-ins show them (no lab boot).

Each test builds one machine (`lab.hwmodel.build`), injects a fault the way `python -m lab fault`
does, and runs the stand-ins as the module would: `nvidia-smi -q`, `nvidia-smi nvlink -s` and
`all_reduce_perf` as subprocesses, the NVML stub through its functions, the kernel log and the
sysfs/procfs files as files.  The expectations are the real formats (tests/data/nvidia-smi-q,
tests/data/kernel-log), checked here with plain regular expressions, not with the collection's
parsers: the lab is the independent oracle the module is tested against.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lab.hwmodel as hw
from lab import cli

REPO = Path(__file__).resolve().parents[2]
NVSMI = str(REPO / "lab" / "bin" / "nvidia-smi")
ALLREDUCE = str(REPO / "lab" / "bin" / "all_reduce_perf")
FABRICMANAGER = str(REPO / "lab" / "bin" / "nv-fabricmanager")


def run(node, *argv):
    env = dict(os.environ, **{hw.ROOT_ENV: str(node.root), "GPUFLEET_LAB_SEED": "1"})
    proc = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def gpu_block(report, bus_id):
    """The `-q` block of one GPU (from its `GPU 00000000:...` line to the next)."""
    blocks = re.split(r"^(?=GPU [0-9A-F]{8}:)", report, flags=re.M)
    return next(b for b in blocks if b.startswith("GPU " + bus_id))


def field(block, *path):
    """Value of a label under nested section labels, by indentation (4 spaces a level)."""
    lines = block.splitlines()
    start, depth = 1, 1  # after the `GPU 00000000:...` line
    for label in path[:-1]:
        start = (
            next(
                i
                for i in range(start, len(lines))
                if re.match(r"^%s%s\s*$" % (" " * 4 * depth, re.escape(label)), lines[i])
            )
            + 1
        )
        depth += 1
    for line in lines[start:]:
        indent = len(line) - len(line.lstrip(" "))
        if indent < 4 * depth:
            break
        m = re.match(r"^%s%s\s*: (.*)$" % (" " * 4 * depth, re.escape(path[-1])), line)
        if m:
            return m.group(1)
    raise KeyError(path)


def smi_q(node, gpu=0):
    return gpu_block(run(node, NVSMI, "-q"), "0000" + _bus(node.gpus[gpu].bdf))


def _bus(bdf):
    return ("%08X:%s" % (int(bdf[:4], 16), bdf[5:])).upper()[4:]


def busbw(node):
    out = run(node, ALLREDUCE, "-b", "8G", "-e", "8G", "-g", str(len(node.gpus)))
    rows = [line.split() for line in out.splitlines() if line.strip() and not line.startswith("#")]
    return float(rows[-1][7])


@pytest.fixture
def nvml(monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "gpufleet_lab_pynvml_faults", REPO / "lab" / "standins" / "nvml" / "pynvml.py"
    )
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def h100(lab_node, monkeypatch):
    node = lab_node("h100-sxm-8x")
    monkeypatch.setenv(hw.ROOT_ENV, str(node.root))
    return node


@pytest.fixture
def l40s(lab_node, monkeypatch):
    node = lab_node("l40s-4x-switch")
    monkeypatch.setenv(hw.ROOT_ENV, str(node.root))
    return node


# -- a healthy machine -----------------------------------------------------------------------------
def test_healthy_q_report_has_the_real_layout(h100):
    report = run(h100, NVSMI, "-q")
    assert re.search(r"^Driver Version\s+: 570\.133\.20$", report, re.M)
    assert re.search(r"^Attached GPUs\s+: 8$", report, re.M)
    block = gpu_block(report, "00000000:18:00.0")
    assert field(block, "Persistence Mode") == "Enabled"
    assert field(block, "PCI", "GPU Link Info", "PCIe Generation", "Current") == "5"
    assert field(block, "PCI", "GPU Link Info", "Link Width", "Current") == "16x"
    assert field(block, "Clocks Event Reasons", "Idle") == "Active"
    assert field(block, "Clocks Event Reasons", "HW Slowdown") == "Not Active"
    assert field(block, "ECC Errors", "Volatile", "DRAM Uncorrectable") == "0"
    assert field(block, "Remapped Rows", "Pending") == "No"
    assert field(block, "Fabric", "State") == "Completed"
    assert field(block, "Fabric", "Status") == "Success"
    # The same label layout as the real 535 report (tests/data/nvidia-smi-q), section for section.
    real = (REPO / "tests/data/nvidia-smi-q/h100-hbm3-535.183.01.txt").read_text()

    def sections(text):
        return [line.strip() for line in text.splitlines() if re.match(r"^    \S.*\S$", line) and ":" not in line]

    assert [s for s in sections(real) if s in sections(block)] == sections(block)


def test_healthy_l40s_has_no_fabric_and_no_nvlink(l40s):
    block = smi_q(l40s)
    assert field(block, "Fabric", "State") == "N/A" and field(block, "Product Architecture") == "Ada Lovelace"
    assert "Link 0" not in run(l40s, NVSMI, "nvlink", "-s")
    assert not re.search(r"Xid", l40s.kernel_log.read_text())


def test_healthy_machine_files(h100):
    assert "nvidia_peermem" in (h100.root / "proc/modules").read_text().split()
    assert (h100.root / "sys/module/nvidia_peermem").is_dir()
    aer = (h100.sysfs / "devices" / h100.gpus[0].bdf / "aer_dev_correctable").read_text()
    assert aer.splitlines()[0] == "RxErr 0" and aer.splitlines()[-1] == "TOTAL_ERR_COR 0"
    assert re.match(r"^\[ {4}\d\.\d{6}\] ", h100.kernel_log.read_text())


# -- each fault ------------------------------------------------------------------------------------
def test_xid_line_is_the_drivers(h100):
    h100.inject("xid", 3, 79)
    h100.inject("xid", 1, 13)
    log = h100.kernel_log.read_text().splitlines()
    bus3 = h100.gpus[3].bdf[:-2]
    assert re.match(
        r"^\[\s*\d+\.\d{6}\] NVRM: Xid \(PCI:%s\): 79, pid='<unknown>', name=<unknown>, "
        r"GPU has fallen off the bus\.$" % re.escape(bus3),
        log[-2],
    )
    assert re.search(r"NVRM: Xid \(PCI:%s\): 13, pid=\d+, name=python3, " % re.escape(h100.gpus[1].bdf[:-2]), log[-1])


def test_sxid_only_on_nvswitch_machines(h100, lab_node):
    l40s = lab_node("l40s-4x-switch")
    h100.inject("sxid", 2, 20034)
    lines = [line_ for line_ in h100.kernel_log.read_text().splitlines() if "SXid" in line_]
    assert re.search(r"\] nvidia-nvswitch2: SXid \(PCI:0000:07:00\.0\): 20034, Fatal, Link \d+ ", lines[0])
    assert len(lines) == 3
    with pytest.raises(hw.health.FaultError, match="NVSwitch"):
        l40s.inject("sxid", 0, 20034)


def test_remap_pending_then_reboot_applies_it(h100, nvml):
    h100.inject("remap-pending", 2)
    assert field(smi_q(h100, 2), "Remapped Rows", "Pending") == "Yes"
    assert field(smi_q(h100, 1), "Remapped Rows", "Pending") == "No"
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetRemappedRows(nvml.nvmlDeviceGetHandleByIndex(2)) == (0, 0, 1, 0)
    h100.inject("xid", 2, 63)
    h100.reset_firmware()
    block = smi_q(h100, 2)
    assert field(block, "Remapped Rows", "Pending") == "No"
    assert field(block, "Remapped Rows", "Uncorrectable Error") == "1"
    assert nvml.nvmlDeviceGetRemappedRows(nvml.nvmlDeviceGetHandleByIndex(2)) == (0, 1, 0, 0)
    assert "Xid" not in h100.kernel_log.read_text()  # the old boot's log is gone
    nvml.nvmlShutdown()


def test_ecc_uncorrectable_volatile_resets_at_reboot(l40s, nvml):
    l40s.inject("ecc-uncorrectable", 1)
    block = smi_q(l40s, 1)
    assert field(block, "ECC Errors", "Volatile", "DRAM Uncorrectable") == "1"
    assert field(block, "ECC Errors", "Aggregate", "DRAM Uncorrectable") == "1"
    assert run(l40s, NVSMI, "--query-gpu=ecc.errors.uncorrected.volatile.total", "--format=csv,noheader").split() == [
        "0",
        "1",
        "0",
        "0",
    ]
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetTotalEccErrors(h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC) == 1
    l40s.reset_firmware()
    assert nvml.nvmlDeviceGetTotalEccErrors(h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC) == 0
    assert nvml.nvmlDeviceGetTotalEccErrors(h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_AGGREGATE_ECC) == 1
    nvml.nvmlShutdown()


def test_fabric_manager_stop_and_its_stand_in(h100, nvml, lab_node):
    h100.inject("fabric-manager-stop")
    block = smi_q(h100, 5)
    assert (field(block, "Fabric", "State"), field(block, "Fabric", "Status")) == ("In Progress", "N/A")
    nvml.nvmlInit()
    info = nvml.c_nvmlGpuFabricInfo_t()
    nvml.nvmlDeviceGetGpuFabricInfo(nvml.nvmlDeviceGetHandleByIndex(0), info)
    assert info.state == nvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS
    # The unit's daemon registers the GPUs while it runs and drops them when stopped.
    env = dict(os.environ, **{hw.ROOT_ENV: str(h100.root)})
    daemon = subprocess.Popen(
        [FABRICMANAGER, "-c", "/usr/share/nvidia/nvswitch/fabricmanager.cfg"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert "Successfully configured" in daemon.stdout.readline()
        assert h100.fabric_manager_active() is True
        nvml.nvmlDeviceGetGpuFabricInfo(nvml.nvmlDeviceGetHandleByIndex(0), info)
        assert info.state == nvml.NVML_GPU_FABRIC_STATE_COMPLETED and info.status == nvml.NVML_SUCCESS
    finally:
        daemon.terminate()
        assert daemon.wait(timeout=10) == 0
    assert h100.fabric_manager_active() is False
    h100.reset_firmware()  # enabled: it runs again after a reboot
    assert field(smi_q(h100), "Fabric", "State") == "Completed"
    nvml.nvmlShutdown()
    assert list(hw.units.unit_files(lab_node("l40s-4x-switch").data)) == [
        "etc/systemd/system/nvidia-persistenced.service"
    ]
    assert (
        "ExecStart=/usr/local/bin/nv-fabricmanager"
        in hw.units.unit_files(h100.data)["etc/systemd/system/nvidia-fabricmanager.service"]
    )


def test_nvlink_down_costs_one_link_of_bandwidth(h100, nvml):
    before = busbw(h100)
    h100.inject("nvlink-down", 4)
    after = busbw(h100)
    assert after == pytest.approx(before * 17 / 18, rel=0.03)
    status = run(h100, NVSMI, "nvlink", "-s").splitlines()
    gpu4 = status.index(next(line_ for line_ in status if line_.startswith("GPU 4:")))
    assert status[gpu4 + 1] == "\t Link 0: <inactive>" and status[gpu4 + 2] == "\t Link 1: 26.562 GB/s"
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(4)
    assert nvml.nvmlDeviceGetNvLinkState(h, 0) == nvml.NVML_FEATURE_DISABLED
    assert nvml.nvmlDeviceGetNvLinkState(h, 1) == nvml.NVML_FEATURE_ENABLED
    h100.reset_firmware()  # hardware: a reboot does not bring it back
    assert nvml.nvmlDeviceGetNvLinkState(h, 0) == nvml.NVML_FEATURE_DISABLED
    nvml.nvmlShutdown()


def test_hw_slowdown(l40s, nvml):
    l40s.inject("hw-slowdown", 3)
    assert field(smi_q(l40s, 3), "Clocks Event Reasons", "HW Slowdown") == "Active"
    assert re.search(r"^ {12}HW Thermal Slowdown\s+: Not Active$", smi_q(l40s, 3), re.M)
    nvml.nvmlInit()
    mask = nvml.nvmlDeviceGetCurrentClocksEventReasons(nvml.nvmlDeviceGetHandleByIndex(3))
    assert mask == nvml.nvmlClocksEventReasonGpuIdle | nvml.nvmlClocksEventReasonHwSlowdown
    l40s.reset_firmware()
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(nvml.nvmlDeviceGetHandleByIndex(3)) == mask
    nvml.nvmlShutdown()


def test_link_degrade_trains_the_link_down_like_the_x8_profile(l40s, lab_node):
    gpu = l40s.gpus[1]
    l40s.inject("link-degrade", 1)
    assert gpu.width_current == 8 and l40s.devices[gpu.parent].width_current == 8
    assert (l40s.sysfs / "devices" / gpu.bdf / "current_link_width").read_text() == "8\n"
    assert field(smi_q(l40s, 1), "PCI", "GPU Link Info", "Link Width", "Current") == "8x"
    # The same registers as the profile that trained GPU 2 down to x8.
    x8 = lab_node("l40s-x8-degraded")
    assert (hw.health.device_dir(l40s.root, gpu.bdf) / "config").read_bytes()[0x72:0x74] == (
        hw.health.device_dir(x8.root, x8.gpus[2].bdf) / "config"
    ).read_bytes()[0x72:0x74]
    l40s.reset_firmware()
    assert gpu.width_current == 8
    l40s.inject("clear")
    assert gpu.width_current == 16 and l40s.devices[gpu.parent].width_current == 16


def test_aer_on_the_port_above_the_gpu(l40s):
    l40s.inject("aer", 2)
    port = l40s.gpus[2].parent
    text = (l40s.sysfs / "devices" / port / "aer_dev_nonfatal").read_text().splitlines()
    assert "CmpltTO 1" in text and text[-1] == "TOTAL_ERR_NONFATAL 1" and text[0] == "Undefined 0"
    assert (
        (l40s.sysfs / "devices" / l40s.gpus[2].bdf / "aer_dev_nonfatal").read_text().endswith("TOTAL_ERR_NONFATAL 0\n")
    )


def test_peermem_unload_and_reload_at_reboot(l40s, lab_node):
    l40s.inject("peermem-unload")
    assert "nvidia_peermem" not in (l40s.root / "proc/modules").read_text()
    assert not (l40s.root / "sys/module/nvidia_peermem").exists()
    l40s.reset_firmware()
    assert (l40s.root / "proc/modules").read_text().startswith("nvidia_peermem ")
    no_nic = lab_node("epyc-rootport-acs")
    assert "nvidia_peermem" not in (no_nic.root / "proc/modules").read_text()
    with pytest.raises(hw.health.FaultError):
        no_nic.inject("peermem-unload")


def test_clear_makes_the_machine_healthy_again(h100):
    healthy = run(h100, NVSMI, "nvlink", "-s")
    for kind in (
        "remap-pending",
        "ecc-uncorrectable",
        "fabric-manager-stop",
        "nvlink-down",
        "hw-slowdown",
        "link-degrade",
        "aer",
        "peermem-unload",
    ):
        h100.inject(kind, 1)
    h100.inject("xid", 1, 79)
    h100.inject("sxid", 1, 12028)
    h100.inject("clear")
    block = smi_q(h100, 1)
    assert field(block, "Remapped Rows", "Pending") == "No"
    assert field(block, "Clocks Event Reasons", "HW Slowdown") == "Not Active"
    assert field(block, "Fabric", "State") == "Completed"
    assert run(h100, NVSMI, "nvlink", "-s") == healthy
    assert "Xid" not in h100.kernel_log.read_text()
    assert "nvidia_peermem" in (h100.root / "proc/modules").read_text()


def test_bad_faults_say_why(l40s):
    with pytest.raises(hw.health.FaultError, match="GPU 9 does not exist"):
        l40s.inject("hw-slowdown", 9)
    with pytest.raises(hw.health.FaultError, match="no NVLink"):
        l40s.inject("nvlink-down", 0)
    with pytest.raises(hw.health.FaultError, match="needs a code"):
        l40s.inject("xid", 0)


def test_cli_fault_verb_parses():
    args = cli.parser().parse_args(["fault", "node1", "xid", "79", "--gpu", "3"])
    assert (args.verb, args.node, args.kind, args.code, args.gpu) == ("fault", "node1", "xid", 79, 3)
    args = cli.parser().parse_args(["fault", "node1", "clear"])
    assert (args.kind, args.code, args.gpu) == ("clear", None, 0)


def test_standins_do_not_import_the_collection():
    for path in [
        REPO / "lab/hwmodel/health.py",
        REPO / "lab/standins/nvidia_smi.py",
        REPO / "lab/standins/nvml/pynvml.py",
        REPO / "lab/standins/fabricmanager.py",
    ]:
        assert "module_utils" not in re.sub(r'""".*?"""', "", path.read_text(), flags=re.S).replace("# ", ""), path


HEALTH_NAMES = [
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetMemoryErrorCounter",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetGpuFabricInfo",
    "c_nvmlGpuFabricInfo_t",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetPcieReplayCounter",
]
HEALTH_CONSTANTS = [
    "NVML_MEMORY_ERROR_TYPE_CORRECTED",
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
    "NVML_VOLATILE_ECC",
    "NVML_AGGREGATE_ECC",
    "NVML_MEMORY_LOCATION_DRAM",
    "NVML_MEMORY_LOCATION_SRAM",
    "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS",
    "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR",
    "NVML_NVLINK_ERROR_DL_REPLAY",
    "NVML_NVLINK_ERROR_DL_RECOVERY",
    "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "NVML_NVLINK_ERROR_DL_CRC_DATA",
    "NVML_GPU_FABRIC_STATE_NOT_SUPPORTED",
    "NVML_GPU_FABRIC_STATE_NOT_STARTED",
    "NVML_GPU_FABRIC_STATE_IN_PROGRESS",
    "NVML_GPU_FABRIC_STATE_COMPLETED",
    "NVML_FEATURE_DISABLED",
    "nvmlClocksEventReasonGpuIdle",
    "nvmlClocksEventReasonSwPowerCap",
    "nvmlClocksEventReasonHwSlowdown",
    "nvmlClocksEventReasonHwThermalSlowdown",
    "nvmlClocksEventReasonHwPowerBrakeSlowdown",
    "nvmlClocksEventReasonSwThermalSlowdown",
    "nvmlClocksThrottleReasonHwSlowdown",
]


def test_stub_health_names_match_nvidia_ml_py(nvml, monkeypatch):
    """The health calls and constants have nvidia-ml-py's names and values."""
    stub_dir = str(REPO / "lab" / "standins" / "nvml")
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(stub_dir).resolve()]
    try:
        spec = importlib.util.find_spec("pynvml")
        if spec is None or Path(spec.origin).parent.resolve() == Path(stub_dir).resolve():
            pytest.skip("nvidia-ml-py is not installed")
        real = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, "pynvml", real)  # its error classes register by name
        spec.loader.exec_module(real)
    finally:
        sys.path[:] = saved
    for name in HEALTH_NAMES:
        assert hasattr(real, name) and hasattr(nvml, name), name
    for name in HEALTH_CONSTANTS:
        assert getattr(real, name) == getattr(nvml, name), name
    assert [f[0] for f in real.c_nvmlGpuFabricInfo_t._fields_] == ["clusterUuid", "status", "cliqueId", "state"]
    assert set(vars(nvml.c_nvmlGpuFabricInfo_t())) == {"clusterUuid", "status", "cliqueId", "state"}


def test_keeps_out_is_the_labs_own_judgement_of_each_fault(h100):
    """The report's EXPECTED column: a fault that must keep a node out is named; an application
    XID, a cleared fault and what a reboot clears are not."""
    assert hw.health.keeps_out(h100.root, h100.data) == []
    h100.inject("xid", 1, 13)  # an application error: no reason to drain
    assert hw.health.keeps_out(h100.root, h100.data) == []
    h100.inject("xid", 3, 79)
    h100.inject("remap-pending", 2)
    h100.inject("hw-slowdown", 4)
    h100.inject("fabric-manager-stop")
    h100.inject("sxid", 0, 20034)
    why = hw.health.keeps_out(h100.root, h100.data)
    assert why == [
        "GPU 2: row remap pending",
        "GPU 4: HW slowdown",
        "fabric manager stopped",
        "Xid 79",
        "fatal SXid 20034",
    ], why
    h100.reset_firmware()  # the XID's boot is gone, the remap applied, the fabric manager back
    assert hw.health.keeps_out(h100.root, h100.data) == ["GPU 4: HW slowdown"]
    hw.health.clear(h100.root, h100.data)
    assert hw.health.keeps_out(h100.root, h100.data) == []
