# SPDX-License-Identifier: GPL-3.0-or-later
"""Every health/_checks check firing and staying quiet, on records parsed from real reports."""

from __future__ import annotations

import copy
import importlib.util
import re
import sys
from pathlib import Path

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.gpu import _nvsmi, _nvsmi_q
from ansible_collections.gpufleet.node.plugins.module_utils.health import _checks, _collect, _pci_facts, _thresholds
from tests.harness import REPO
from tests.smi_samples import as_posted, whole

Q = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi-q"
H100 = _nvsmi_q.parse_query(whole("h100-hbm3-535.183.01.txt"))["gpus"][0]
V100 = _nvsmi_q.parse_query(whole("v100-pcie-470.129.06.txt"))["gpus"][0]
T = dict(_thresholds.DEFAULT_THRESHOLDS)
NO_PCI = {"error": None, "gpus": {}, "bridges": {}, "nvswitches": [], "rdma_nics": [], "nics_on_gpu_paths": []}


def gpu(base=H100, **changes):
    record = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(record.get(key), dict):
            record[key].update(value)
        else:
            record[key] = value
    return record


def links(n=18, down=(), speed=26.562, **counters):
    return [
        dict(
            {
                "link": i,
                "active": i not in down,
                "speed_gbps": None if i in down else speed,
                "crc_errors": None,
                "replay_errors": None,
                "recovery_errors": None,
            },
            **counters,
        )
        for i in range(n)
    ]


def test_xid():
    assert _checks.check_xid([], ["0000:3b:00.0"])["status"] == "pass"
    fatal = _checks.check_xid(
        [{"bdf": "0000:3b:00", "code": 79, "pid": None, "message": "GPU has fallen off the bus."}], ["0000:3b:00.0"]
    )
    assert fatal["status"] == "fail" and fatal["action"] == "reboot" and fatal["gpus"] == ["0000:3b:00.0"]
    app = _checks.check_xid([{"bdf": "0000:3b:00", "code": 13, "pid": 7, "message": "x"}] * 2, ["0000:3b:00.0"])
    assert app["status"] == "warn" and app["action"] == "restart the application" and "2 times" in app["reason"]
    assert _checks.check_xid([], [], "journalctl exited 1")["status"] == "warn"


@pytest.mark.parametrize("code", [48, 63, 64, 74, 79, 92, 94, 95, 119, 120])
def test_fatal_xid_codes_fail(code):
    assert _checks.check_xid([{"bdf": "0000:3b:00", "code": code, "pid": None, "message": ""}], [])["status"] == "fail"


@pytest.mark.parametrize("code", [13, 31, 43, 45])
def test_application_xid_codes_warn(code):
    assert _checks.check_xid([{"bdf": "0000:3b:00", "code": code, "pid": 1, "message": ""}], [])["status"] == "warn"


def test_sxid():
    assert _checks.check_sxid([])["status"] == "pass"
    nonfatal = [{"bdf": "0000:04:00.0", "code": 22013, "pid": None, "message": "Non-fatal, Link 44"}]
    assert _checks.check_sxid(nonfatal)["status"] == "warn"
    assert _checks.check_sxid(nonfatal, fatal_codes=[22013])["status"] == "fail"
    fatal = [{"bdf": "0000:04:00.0", "code": 12028, "pid": None, "message": "Fatal, Link 3 egress"}]
    assert _checks.check_sxid(fatal)["status"] == "fail"


def test_row_remap():
    assert _checks.check_row_remap([H100, V100])["status"] == "pass"
    pending = _checks.check_row_remap([gpu(remapped_rows={"pending": True})])
    assert pending["status"] == "fail" and pending["action"] == "reset the GPU"
    failed = _checks.check_row_remap([gpu(remapped_rows={"failure": True})])
    assert failed["status"] == "fail" and failed["action"] == "drain and inspect the hardware"


def test_ecc():
    assert _checks.check_ecc([H100, V100], 0)["status"] == "pass"
    bad = _checks.check_ecc([gpu(ecc={"volatile_uncorrectable": 2})], 0)
    assert bad["status"] == "fail" and bad["gpus"] == ["0000:53:00.0"]
    assert _checks.check_ecc([gpu(ecc={"volatile_uncorrectable": 2})], 5)["status"] == "pass"


def test_retired_pages():
    assert _checks.check_retired_pages([H100, V100], 60)["status"] == "pass"
    assert _checks.check_retired_pages([gpu(V100, retired_pages={"pending": True})], 60)["status"] == "fail"
    over = _checks.check_retired_pages([gpu(V100, retired_pages={"single_bit_ecc": 50, "double_bit_ecc": 10})], 60)
    assert over["status"] == "fail" and over["action"] == "drain and inspect the hardware"


def test_fabric_manager():
    assert _checks.check_fabric([V100], NO_PCI, "auto", None)["status"] == "pass"
    assert _checks.check_fabric([H100], NO_PCI, "auto", "active")["status"] == "pass"
    stopped = _checks.check_fabric([H100], NO_PCI, "auto", "inactive")
    assert stopped["status"] == "fail" and "system not yet initialized" in stopped["reason"]
    progress = _checks.check_fabric([gpu(fabric={"state": "in_progress", "status": None})], NO_PCI, "auto", "active")
    assert progress["status"] == "fail" and progress["gpus"] == ["0000:53:00.0"]
    # NVSwitches in the PCI tree make it an NVSwitch system even when the GPUs print no fabric.
    pci = dict(NO_PCI, nvswitches=["0000:05:00.0"])
    assert _checks.check_fabric([gpu(fabric=None)], pci, "auto", "active")["status"] == "fail"
    assert _checks.check_fabric([V100], NO_PCI, "required", "inactive")["status"] == "fail"
    assert _checks.check_fabric([H100], NO_PCI, "not_required", "inactive")["status"] == "pass"


def test_nvlink():
    assert _checks.check_nvlink([V100], T)["status"] == "pass"
    assert (
        _checks.check_nvlink([gpu(nvlinks=links()), gpu(bus_id="0000:64:00.0", nvlinks=links())], T)["status"] == "pass"
    )
    down = _checks.check_nvlink([gpu(nvlinks=links(down=(5,)))], T)
    assert down["status"] == "fail" and "link(s) 5 inactive" in down["reason"]
    slow = _checks.check_nvlink([gpu(nvlinks=links())], T, expected_speed=50.0)
    assert slow["status"] == "fail"
    crc = _checks.check_nvlink([gpu(nvlinks=links(crc_errors=101, replay_errors=0, recovery_errors=0))], T)
    assert crc["status"] == "warn" and "crc errors above 100" in crc["reason"]
    assert _checks.check_nvlink([gpu(nvlinks=links(crc_errors=100))], T)["status"] == "pass"


def test_clocks():
    assert _checks.check_clocks([gpu(clocks_event_reasons=["gpu_idle", "sw_power_cap"])])["status"] == "pass"
    for reason in ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"):
        assert _checks.check_clocks([gpu(clocks_event_reasons=[reason])])["status"] == "fail"
    assert _checks.check_clocks([gpu(clocks_event_reasons=["sw_thermal_slowdown"])])["status"] == "warn"


def test_pcie_link():
    pci = dict(
        NO_PCI,
        gpus={"0000:53:00.0": {"driver": "nvidia", "chain": ["0000:52:00.0"], "aer": {}, "link": {}}},
        bridges={"0000:52:00.0": {"aer": {}, "link": {"gen_max": 5, "width_max": 16}}},
    )
    idle = gpu(pcie={"gen_current": 1})
    assert _checks.check_pcie([idle], pci, False, T)["status"] == "pass"
    busy = _checks.check_pcie([idle], pci, True, T)
    assert busy["status"] == "fail" and "below port 0000:52:00.0" in busy["reason"]
    narrow = gpu(pcie={"width_current": 8})
    assert _checks.check_pcie([narrow], pci, False, T)["status"] == "warn"
    assert _checks.check_pcie([narrow], pci, True, T)["status"] == "fail"
    # A Gen5 GPU under a Gen4 port is at its maximum at Gen4.
    gen4 = dict(pci, bridges={"0000:52:00.0": {"aer": {}, "link": {"gen_max": 4, "width_max": 16}}})
    assert _checks.check_pcie([gpu(pcie={"gen_current": 4})], gen4, True, T)["status"] == "pass"
    assert _checks.check_pcie([H100], pci, True, dict(T, pcie_replays_max=100))["status"] == "warn"


def test_pcie_aer():
    def tree(gpu_aer, bridge_aer):
        return dict(
            NO_PCI,
            gpus={
                "0000:53:00.0": {
                    "driver": "nvidia",
                    "chain": ["0000:51:00.0", "0000:52:00.0"],
                    "aer": gpu_aer,
                    "link": {},
                }
            },
            bridges={"0000:51:00.0": {"aer": {}, "link": {}}, "0000:52:00.0": {"aer": bridge_aer, "link": {}}},
        )

    clean = {"fatal": 0, "nonfatal": 0, "correctable": 3}
    assert _checks.check_aer([H100], tree(clean, clean), 480)["status"] == "pass"
    bad = _checks.check_aer([H100], tree(clean, dict(clean, nonfatal=1)), 480)
    assert bad["status"] == "fail" and "0000:52:00.0" in bad["reason"] and bad["gpus"] == ["0000:53:00.0"]
    assert _checks.check_aer([H100], tree(dict(clean, fatal=1), clean), 480)["status"] == "fail"
    assert _checks.check_aer([H100], tree(dict(clean, correctable=481), clean), 480)["status"] == "warn"


def test_peermem():
    with_nic = dict(NO_PCI, nics_on_gpu_paths=["0000:54:00.0"])
    assert _checks.check_peermem(with_nic, True, False)["status"] == "pass"
    assert _checks.check_peermem(with_nic, False, False)["status"] == "warn"
    assert _checks.check_peermem(NO_PCI, False, False)["status"] == "pass"
    assert _checks.check_peermem(NO_PCI, False, True)["status"] == "fail"


def test_gpu_count():
    pci = dict(
        NO_PCI,
        gpus={
            "0000:53:00.0": {"driver": "nvidia", "chain": [], "aer": {}, "link": {}},
            "0000:64:00.0": {"driver": "nvidia", "chain": [], "aer": {}, "link": {}},
            "0000:75:00.0": {"driver": "vfio-pci", "chain": [], "aer": {}, "link": {}},
        },
    )
    assert _checks.check_gpu_count([H100, gpu(bus_id="0000:64:00.0")], pci, 2)["status"] == "pass"
    lost = _checks.check_gpu_count([H100], pci)
    assert lost["status"] == "fail" and lost["gpus"] == ["0000:64:00.0"]
    assert _checks.check_gpu_count([H100], NO_PCI, 8)["status"] == "fail"


def test_persistence_mode():
    assert _checks.check_persistence([H100, V100])["status"] == "pass"
    off = _checks.check_persistence([gpu(persistence_mode=False)])
    assert off["status"] == "fail" and off["gpus"] == ["0000:53:00.0"]


def test_peermem_loaded(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "module").mkdir()
    (tmp_path / "proc" / "modules").write_text("nvidia_uvm 1 0 - Live 0x0\nnvidia 1 0 - Live 0x0\n")
    assert not _pci_facts.peermem_loaded(str(tmp_path / "proc"), str(tmp_path / "module"))
    (tmp_path / "proc" / "modules").write_text("nvidia_peermem 16384 0 - Live 0x0000000000000000\n")
    assert _pci_facts.peermem_loaded(str(tmp_path / "proc"), str(tmp_path / "module"))


def _stub_pynvml():
    """The repository's pynvml stand-in (lab/standins/nvml/pynvml.py), for its NVMLError classes and codes
    (built as nvidia-ml-py builds them), loaded under another name so the real binding stays."""
    spec = importlib.util.spec_from_file_location(
        "gpufleet_lab_pynvml", REPO / "lab" / "standins" / "nvml" / "pynvml.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its error classes are built from sys.modules[__name__]
    spec.loader.exec_module(module)
    return module


STUB = _stub_pynvml()


class FakeNvml:
    """The nvidia-ml-py names collect_nvml calls (checked against pynvml 13.615.71); functions a
    driver lacks raise NVMLError (NotSupported / FunctionNotFound) and give null facts.
    ``errors={function name: NVML_ERROR_* code}`` makes a function raise that error."""

    NVMLError = STUB.NVMLError
    NVMLError_NotSupported = STUB.NVMLError_NotSupported
    NVMLError_FunctionNotFound = STUB.NVMLError_FunctionNotFound
    NVML_ERROR_NOT_SUPPORTED = STUB.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_FUNCTION_NOT_FOUND = STUB.NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_INVALID_ARGUMENT = STUB.NVML_ERROR_INVALID_ARGUMENT

    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 4

    def __getattribute__(self, name):
        errors = object.__getattribute__(self, "errors")
        if name in errors:
            code = errors[name]

            def failing(*_args):
                raise STUB.NVMLError(code)

            return failing
        return object.__getattribute__(self, name)

    class c_nvmlGpuFabricInfo_t:
        state = 0
        status = 0

    class _Pci:
        busId = b"00000000:53:00.0"

    def __init__(self, pending=0, reasons=0x1, fabric_state=3, errors=None):
        self.pending, self.reasons, self.fabric_state = pending, reasons, fabric_state
        self.errors = dict(errors or {})

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return b"535.183.01"

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetPciInfo(self, handle):
        return self._Pci()

    def nvmlDeviceGetPersistenceMode(self, handle):
        return 1

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter_type):
        return 2 if (error_type, counter_type) == (1, 0) else 0

    def nvmlDeviceGetRemappedRows(self, handle):
        return (0, 1, self.pending, 0)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self.reasons

    def nvmlDeviceGetGpuFabricInfo(self, handle, info):
        info.state, info.status = self.fabric_state, 0

    def nvmlDeviceGetNvLinkState(self, handle, link):
        if link >= 2:
            raise self.NVMLError(STUB.NVML_ERROR_INVALID_ARGUMENT)
        return 1 if link == 0 else 0

    def nvmlDeviceGetNvLinkErrorCounter(self, handle, link, counter):
        return {0: 0, 1: 0, 2: 150, 3: 1}[counter]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        raise self.NVMLError(STUB.NVML_ERROR_FUNCTION_NOT_FOUND)


def test_collect_nvml_uses_nvidia_ml_py_names():
    import pynvml

    for name in (
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetGpuFabricInfo",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetPersistenceMode",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetNvLinkErrorCounter",
        "c_nvmlGpuFabricInfo_t",
    ):
        assert hasattr(pynvml, name), name
    (gpu,) = _collect.collect_nvml(FakeNvml(pending=1, reasons=0x1 | 0x40, fabric_state=2))["gpus"]
    assert gpu["bus_id"] == "0000:53:00.0" and gpu["persistence_mode"] is True
    assert gpu["ecc"]["volatile_uncorrectable"] == 2 and gpu["remapped_rows"]["pending"] is True
    assert gpu["retired_pages"] is None and gpu["pcie"]["gen_current"] is None  # not supported -> null
    assert gpu["clocks_event_reasons"] == ["gpu_idle", "hw_thermal_slowdown"]
    assert gpu["fabric"] == {"state": "in_progress", "status": "success"}
    assert [(nvl["link"], nvl["active"], nvl["crc_errors"]) for nvl in gpu["nvlinks"]] == [
        (0, True, 151),
        (1, False, 151),
    ]
    checks = {
        c["name"]: c["status"]
        for c in _checks.run_checks({"gpus": [gpu]}, [], [], NO_PCI, {"fabric_manager_state": "active"})
    }
    assert checks["row_remap"] == checks["ecc"] == checks["clocks"] == checks["fabric_manager"] == "fail"
    assert checks["nvlink"] == "fail"


# -- unreadable is not healthy ------------------------------------------------------------------
H100_TEXT = whole("h100-hbm3-535.183.01.txt")
BUS = "0000:53:00.0"


def readable(gpus):
    (result,) = [c for c in _checks.run_checks({"gpus": gpus}, [], [], NO_PCI, {}) if c["name"] == "readable"]
    return result


def test_readable_passes_on_the_real_reports():
    assert readable([H100, V100])["status"] == "pass"


@pytest.mark.parametrize(
    "line, field",
    [
        ("        Pending                           : No\n        Remapping", "Remapped Rows > Pending"),
        ("            DRAM Uncorrectable            : 0\n", "ECC Errors > Volatile > DRAM Uncorrectable"),
        ("    Persistence Mode                      : Enabled\n", "Persistence Mode"),
    ],
)
def test_unknown_error_field_fails(line, field):
    assert line in H100_TEXT
    label, rest = line.split(":", 1)
    text = H100_TEXT.replace(line, label + ": [Unknown Error]" + rest[rest.index("\n") :], 1)
    (gpu,) = _nvsmi_q.parse_query(text)["gpus"]
    assert {"field": field, "error": "[Unknown Error]"} in gpu["unreadable"]
    result = readable([gpu])
    assert result["status"] == "fail" and result["gpus"] == [BUS] and result["action"] == "reset the GPU"
    assert "GPU %s: %s ([Unknown Error])" % (BUS, field) in result["reason"]


def test_unrecognised_value_of_a_judged_field_fails():
    """A row-remap state that is neither yes nor no reads as None: it is named, not passed."""
    text = H100_TEXT.replace(
        "        Pending                           : No\n        Remapping",
        "        Pending                           : Maybe\n        Remapping",
    )
    (gpu,) = _nvsmi_q.parse_query(text)["gpus"]
    assert gpu["unreadable"] == [{"field": "Remapped Rows > Pending", "error": "unrecognised value 'Maybe'"}]
    assert readable([gpu])["status"] == "fail"


def test_unknown_error_in_every_field_of_a_gpu_fails():
    header, block = H100_TEXT.split("GPU 00000000:53:00.0\n", 1)
    block = re.sub(r"(?m)^(\s+(?!Processes)[^:\n]+?\s*:\s).*$", r"\1[Unknown Error]", block)
    (gpu,) = _nvsmi_q.parse_query(header + "GPU 00000000:53:00.0\n" + block)["gpus"]
    assert (
        gpu["persistence_mode"] is None
        and gpu["remapped_rows"] is None
        and gpu["ecc"]["volatile_uncorrectable"] is None
    )
    result = readable([gpu])
    assert result["status"] == "fail" and "Persistence Mode ([Unknown Error])" in result["reason"]
    # Every check but `readable` passes such a GPU: the failure is the unread values' own.
    others = [c for c in _checks.run_checks({"gpus": [gpu]}, [], [], NO_PCI, {}) if c["name"] != "readable"]
    assert {c["name"] for c in others if c["status"] == "fail"} <= {"fabric_manager"}


def test_not_supported_field_warns_with_the_reason():
    text = H100_TEXT.replace(
        "    Persistence Mode                      : Enabled\n",
        "    Persistence Mode                      : [Not Supported]\n",
    )
    (gpu,) = _nvsmi_q.parse_query(text)["gpus"]
    result = readable([gpu])
    assert result["status"] == "warn" and result["action"] == "none"
    assert result["reason"] == (
        "not supported on this GPU model, so not judged: GPU %s: Persistence Mode (nvidia-smi -q: [Not Supported])"
        % BUS
    )


def test_truncated_report_fails():
    cut = H100_TEXT.index("    Fabric\n")
    with pytest.raises(_nvsmi.NvidiaSmiParseError, match=r"cut short inside the block of GPU 00000000:53:00.0"):
        _nvsmi_q.parse_query(H100_TEXT[:cut])

    def run(argv):
        return 0, H100_TEXT[:cut], ""

    with pytest.raises(_collect.HealthError, match="cut short") as info:
        _collect.collect_nvidia_smi(run, "nvidia-smi")
    assert info.value.cause == "nvidia_smi_output"


def test_attached_count_mismatch_fails():
    # As posted: 8 GPUs attached, the first block kept.
    with pytest.raises(_nvsmi.NvidiaSmiParseError, match=r"says 8 GPU\(s\) are attached but prints 1 GPU block"):
        _nvsmi_q.parse_query(as_posted("h100-hbm3-535.183.01.txt"))
    header, block = H100_TEXT.split("GPU 00000000:53:00.0\n", 1)
    two = header + "GPU 00000000:53:00.0\n" + block + "GPU 00000000:64:00.0\n" + block
    with pytest.raises(_nvsmi.NvidiaSmiParseError, match=r"says 1 GPU\(s\) are attached but prints 2"):
        _nvsmi_q.parse_query(two)
    assert len(_nvsmi_q.parse_query(whole(two))["gpus"]) == 2


@pytest.mark.parametrize("code", [STUB.NVML_ERROR_GPU_IS_LOST, STUB.NVML_ERROR_UNKNOWN, STUB.NVML_ERROR_NO_PERMISSION])
@pytest.mark.parametrize(
    "function, field",
    [
        ("nvmlDeviceGetRemappedRows", "remapped_rows"),
        ("nvmlDeviceGetTotalEccErrors", "ecc volatile_uncorrectable"),
        ("nvmlDeviceGetPersistenceMode", "persistence_mode"),
        ("nvmlDeviceGetNvLinkState", "nvlink 0 state"),
    ],
)
def test_gpu_is_lost_fails(function, field, code):
    """GpuIsLost, Unknown, NoPermission: an NVML error other than NotSupported is no pass."""
    (gpu,) = _collect.collect_nvml(FakeNvml(errors={function: code}))["gpus"]
    name = type(STUB.NVMLError(code)).__name__
    assert any(u["field"] == field and name in u["error"] for u in gpu["unreadable"]), gpu["unreadable"]
    result = readable([gpu])
    assert result["status"] == "fail" and result["gpus"] == [BUS]
    assert "GPU %s: " % BUS in result["reason"]
    assert "%s (%s: %s (%s))" % (field, function, STUB.NVMLError(code), name) in result["reason"]


def test_gpu_is_lost_on_its_pci_info_fails():
    with pytest.raises(_collect.HealthError, match="GPU 0 .*GPU is lost.*reset the GPU or reboot") as info:
        _collect.collect_nvml(FakeNvml(errors={"nvmlDeviceGetPciInfo": STUB.NVML_ERROR_GPU_IS_LOST}))
    assert info.value.cause == "gpu_lost"


def test_nvml_not_supported_warns_with_the_reason():
    (gpu,) = _collect.collect_nvml(FakeNvml(errors={"nvmlDeviceGetPersistenceMode": STUB.NVML_ERROR_NOT_SUPPORTED}))[
        "gpus"
    ]
    assert gpu["unreadable"] == [] and gpu["persistence_mode"] is None
    result = readable([gpu])
    assert result["status"] == "warn" and result["reason"] == (
        "not supported on this GPU model, so not judged: GPU %s: persistence_mode "
        "(nvmlDeviceGetPersistenceMode: Not Supported)" % BUS
    )
    # A GPU without row remapping and without page retirement (this binding lacks the functions).
    (gpu,) = _collect.collect_nvml(FakeNvml(errors={"nvmlDeviceGetRemappedRows": STUB.NVML_ERROR_NOT_SUPPORTED}))[
        "gpus"
    ]
    assert readable([gpu])["status"] == "warn" and "remapped_rows" in readable([gpu])["reason"]
    # Everything read: pass, with the FunctionNotFound PCIe generation not worth a warning.
    (gpu,) = _collect.collect_nvml(FakeNvml())["gpus"]
    assert readable([gpu])["status"] == "pass"


def test_nvlink_design_without_link_lines_fails():
    """`nvidia-smi nvlink -s` of an 8x A100 (real sample) with GPU 3's link lines dropped."""
    text = (Q / "nvlink-s-a100.txt").read_text()
    start = text.index("GPU 3:")
    end = text.index("GPU 4:")
    header = text[start:end].splitlines()[0] + "\n"
    parsed = _nvsmi_q.parse_nvlink_links(text[:start] + header + text[end:])
    bdfs = ["0000:%02x:00.0" % (0x10 * (i + 1)) for i in range(8)]
    gpus = [gpu(bus_id=b, uuid=entry["uuid"], fabric=None) for b, entry in zip(bdfs, parsed, strict=True)]
    _nvsmi_q.attach_nvlinks(gpus, parsed)
    assert gpus[3]["nvlinks"] == [] and all(len(g["nvlinks"]) == 12 for i, g in enumerate(gpus) if i != 3)
    result = _checks.check_nvlink(gpus, T)
    assert result["status"] == "fail" and result["gpus"] == [bdfs[3]] and result["action"] == "reset the GPU"
    assert result["reason"].startswith("no NVLink state read for GPU(s) %s although GPU(s) %s" % (bdfs[3], bdfs[0]))
    # A GPU that reports an NVSwitch fabric (the H100 sample) without a link read fails alone too.
    alone = _checks.check_nvlink([gpu(nvlinks=[])], T)
    assert alone["status"] == "fail" and "they report an NVSwitch fabric state" in alone["reason"]
    # A GPU without NVLink and without a fabric (the V100 PCIe sample): nothing to read.
    assert _checks.check_nvlink([gpu(V100, nvlinks=[])], T)["status"] == "pass"


def test_nvml_nvlink_design_with_a_lost_link_state_fails():
    class NoLinks(FakeNvml):
        def nvmlDeviceGetNvLinkState(self, handle, link):
            raise self.NVMLError(STUB.NVML_ERROR_NOT_SUPPORTED)

    (gpu_record,) = _collect.collect_nvml(NoLinks(fabric_state=3))["gpus"]
    assert gpu_record["nvlinks"] == [] and gpu_record["fabric"] == {"state": "completed", "status": "success"}
    assert _checks.check_nvlink([gpu_record], T)["status"] == "fail"


def test_gpus_kept_fails_on_a_gpu_gone_since_an_earlier_report_and_on_the_expected_count():
    other = gpu(bus_id="0000:64:00.0")
    assert _checks.check_gpus_kept([H100, other], [])["status"] == "pass"
    assert _checks.check_gpus_kept([H100, other], ["0000:53:00.0", "0000:64:00.0"], 2)["status"] == "pass"
    lost = _checks.check_gpus_kept([H100], ["0000:53:00.0", "0000:64:00.0"])
    assert (lost["status"], lost["gpus"], lost["action"]) == ("fail", ["0000:64:00.0"], "reboot")
    assert "0000:64:00.0 reported earlier this boot are gone" in lost["reason"] and "1 of 2 left" in lost["reason"]
    short = _checks.check_gpus_kept([H100], [], 8)
    assert (short["status"], short["gpus"], short["action"]) == ("fail", [], "drain and inspect the hardware")
    assert short["reason"] == "1 GPU(s) visible to the driver, expected 8"


def test_the_verdict_record_is_the_one_its_readers_read():
    """health/_verdict.record: the file's fields as nccl/_readiness (node_readiness_info, the
    HAProxy agent, boot validation) read them; the strongest action in ACTIONS order."""
    from ansible_collections.gpufleet.node.plugins.module_utils.health import _verdict
    from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _readiness

    xid = _verdict.check("xid", "fail", ["0000:53:00.0"], "XID 79", _verdict.REBOOT)
    fm = _verdict.check("fabric_manager", "fail", [], "inactive", _verdict.CONFIGURE)
    peermem = _verdict.check("peermem", "warn", [], "not loaded", _verdict.CONFIGURE)
    ok = _verdict.check("ecc", "pass", [], "none")
    verdict = _verdict.record_of_checks("b1", [fm, ok, xid, peermem])
    assert verdict == {
        "boot_id": "b1",
        "passed": False,
        "source": "gpu_health",
        "checks": [fm, xid],
        "warnings": [peermem],
        "action": "reboot",
        "reason": "fabric_manager: inactive; xid: XID 79",
    }
    assert _readiness.health_reasons(verdict, None, "b1", "p") == [
        "GPU health failed (gpu_health): fabric_manager: inactive (action: fix the node configuration); "
        "xid: XID 79 (action: reboot)"
    ]
    passed = _verdict.record_of_checks("b1", [ok, peermem])
    assert (passed["passed"], passed["action"], passed["reason"]) == (True, "none", "every check passed")
    assert _readiness.health_reasons(passed, None, "b1", "p") == []
    watched = _verdict.record("b1", [xid, {"name": "odd", "action": "unknown"}], [], _verdict.WATCH_SOURCE, 1.5)
    assert watched["timestamp"] == 1.5 and watched["source"] == "gpu-health-watch"
    assert watched["action"] == "reboot" and watched["reason"] == "xid: XID 79; odd: no reason recorded"
    assert _verdict.strongest_action([{"action": "unknown"}]) == "none"
    assert list(_verdict.ACTIONS) == [
        "none",
        "restart the application",
        "fix the node configuration",
        "reset the GPU",
        "reboot",
        "check the driver and software (a software or driver event)",
        "drain and inspect the hardware",
        "hardware inspection",
    ]
