# SPDX-License-Identifier: GPL-3.0-or-later
"""Every health/_checks check firing and staying quiet, on records parsed from real reports."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.gpu import _nvsmi_q
from ansible_collections.gpufleet.node.plugins.module_utils.health import _checks, _collect, _pci_facts, _thresholds

Q = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi-q"
H100 = _nvsmi_q.parse_query((Q / "h100-hbm3-535.183.01.txt").read_text())["gpus"][0]
V100 = _nvsmi_q.parse_query((Q / "v100-pcie-470.129.06.txt").read_text())["gpus"][0]
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


class FakeNvml:
    """The nvidia-ml-py names collect_nvml calls (checked against pynvml 13.615.71); functions a
    driver lacks raise NVMLError (NotSupported / FunctionNotFound) and give null facts."""

    class NVMLError(Exception):
        pass

    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 4

    class c_nvmlGpuFabricInfo_t:
        state = 0
        status = 0

    class _Pci:
        busId = b"00000000:53:00.0"

    def __init__(self, pending=0, reasons=0x1, fabric_state=3):
        self.pending, self.reasons, self.fabric_state = pending, reasons, fabric_state

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
            raise self.NVMLError("Not Supported")
        return 1 if link == 0 else 0

    def nvmlDeviceGetNvLinkErrorCounter(self, handle, link, counter):
        return {0: 0, 1: 0, 2: 150, 3: 1}[counter]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        raise self.NVMLError("Function Not Found")


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
