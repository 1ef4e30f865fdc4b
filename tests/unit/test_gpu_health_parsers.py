# SPDX-License-Identifier: GPL-3.0-or-later
"""_nvsmi_q and the kernel-log parser of health/_kernel_log on real outputs (sources: the README beside each
sample in tests/data/nvidia-smi-q and tests/data/kernel-log)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.gpu import _nvsmi, _nvsmi_q
from ansible_collections.gpufleet.node.plugins.module_utils.health import _kernel_log, _pci_facts
from tests.smi_samples import whole

DATA = Path(__file__).resolve().parents[1] / "data"
Q = DATA / "nvidia-smi-q"
LOG = DATA / "kernel-log"


def q(name):
    """A sample as a whole report (``Attached GPUs`` the blocks kept: tests/smi_samples.py)."""
    return (Q / name).read_text() if name.startswith("nvlink-s") else whole(name)


def test_new_driver_h100_report():
    report = _nvsmi_q.parse_query(q("h100-hbm3-535.183.01.txt"))
    assert report["driver_version"] == "535.183.01" and report["attached_gpus"] == 1
    (gpu,) = report["gpus"]
    assert gpu == {
        "bus_id": "0000:53:00.0",
        "uuid": "GPU-566e6f65-c38e-b12f-4824-6944218668b9",
        "name": "NVIDIA H100 80GB HBM3",
        "persistence_mode": True,
        "ecc": {
            "enabled": True,
            "volatile_correctable": 0,
            "volatile_uncorrectable": 0,
            "aggregate_correctable": 0,
            "aggregate_uncorrectable": 0,
        },
        "retired_pages": None,  # all N/A on a GPU that remaps rows
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
        "clocks_event_reasons": ["gpu_idle"],
        "pcie": {"gen_current": 5, "gen_max": 5, "width_current": 16, "width_max": 16, "replays": 120},
        "fabric": {"state": "completed", "status": "success"},
        "nvlinks": None,
        "unreadable": [],
        "unsupported": [],
    }


def test_old_driver_v100_report():
    (gpu,) = _nvsmi_q.parse_query(q("v100-pcie-470.129.06.txt"))["gpus"]
    assert gpu["bus_id"] == "0000:1c:00.0"
    assert gpu["clocks_event_reasons"] == ["gpu_idle"]  # from "Clocks Throttle Reasons"
    assert gpu["remapped_rows"] is None  # "Remapped Rows : N/A"
    assert gpu["retired_pages"] == {"single_bit_ecc": 1, "double_bit_ecc": 0, "pending": False}
    assert gpu["ecc"] == {
        "enabled": True,
        "volatile_correctable": 0,
        "volatile_uncorrectable": 0,
        "aggregate_correctable": 3,
        "aggregate_uncorrectable": 0,
    }
    assert gpu["fabric"] is None and gpu["pcie"]["gen_max"] == 3 and gpu["pcie"]["width_current"] == 16


def test_nested_reasons_and_values_read_by_structure():
    """HW Thermal Slowdown sits under HW Slowdown; a value change anywhere is read by label."""
    text = q("h100-hbm3-535.183.01.txt")
    text = text.replace(
        "            HW Thermal Slowdown           : Not Active", "            HW Thermal Slowdown           : Active"
    )
    text = text.replace(
        "        SW Power Cap                      : Not Active", "        SW Power Cap                      : Active"
    )
    (gpu,) = _nvsmi_q.parse_query(text)["gpus"]
    assert gpu["clocks_event_reasons"] == ["gpu_idle", "sw_power_cap", "hw_thermal_slowdown"]


def test_hyperv_bus_id_and_not_a_report():
    text = q("v100-pcie-470.129.06.txt").replace("GPU 00000000:1C:00.0", "GPU 0000000B:00:00.0")
    assert _nvsmi_q.parse_query(text)["gpus"][0]["bus_id"] == "000b:00:00.0"
    with pytest.raises(_nvsmi.NvidiaSmiParseError):
        _nvsmi_q.parse_query("hello\n")
    with pytest.raises(_nvsmi.NvidiaSmiParseError):
        _nvsmi_q.parse_query("Driver Version : 535.1\nAttached GPUs : 2\n")


def test_nvlink_links_agree_with_the_topology_parser():
    for name, gpus, links, speed in (("nvlink-s-h100.txt", 2, 18, 26.562), ("nvlink-s-a100.txt", 8, 12, 25.0)):
        text = q(name)
        parsed = _nvsmi_q.parse_nvlink_links(text)
        assert len(parsed) == gpus and all(len(g["links"]) == links for g in parsed)
        assert all(link["active"] and link["speed_gbps"] == speed for g in parsed for link in g["links"])
        # One reading of `nvlink -s`: the active counts are _nvsmi's.
        assert _nvsmi.parse_nvlink_status(text) == {g["index"]: links for g in parsed}
    (v100,) = _nvsmi_q.parse_nvlink_links(q("nvlink-s-v100-inactive.txt"))
    assert v100["index"] == 3 and [link["link"] for link in v100["links"] if not link["active"]] == [3, 5]


def test_xid_dmesg_T_unknown_pid_and_pid():
    xids, sxids = _kernel_log.parse_kernel_log((LOG / "dmesg-T-xid13-109.log").read_text())
    assert sxids == [] and [x["code"] for x in xids] == [13, 13, 13, 109]
    assert xids[0]["bdf"] == "0000:cb:00" and xids[0]["pid"] is None
    assert xids[3]["pid"] == 1797828 and xids[3]["message"].startswith("name=pt_main_thread, Ch 00000008")


def test_xid_journalctl_caused_by_previous_keeps_own_code():
    xids, _ = _kernel_log.parse_kernel_log((LOG / "journalctl-k-xid45-caused-by.log").read_text())
    assert {x["code"] for x in xids} == {45} and len(xids) == 7
    assert xids[0] == {
        "bdf": "0000:dc:00",
        "code": 45,
        "pid": 1818990,
        "message": "name=python3, Ch 00000001 caused by previous Xid 149",
    }


def test_xid_old_driver_without_pci_prefix_and_fallen_off_bus_without_xid():
    xids, _ = _kernel_log.parse_kernel_log((LOG / "kern-log-old-xid-no-pci-prefix.log").read_text())
    assert [(x["bdf"], x["code"]) for x in xids] == [("0000:01:00", 16), ("0000:01:00", 16), ("0000:01:00", 8)]
    xids, _ = _kernel_log.parse_kernel_log((LOG / "dmesg-fallen-off-bus.log").read_text())
    assert [(x["bdf"], x["code"]) for x in xids] == [("0000:b3:00", 79)]


def test_sxid_lines_plain_and_iso_prefixes():
    _, sxids = _kernel_log.parse_kernel_log((LOG / "dmesg-sxid-22013.log").read_text())
    assert len(sxids) == 6 and {(s["bdf"], s["code"]) for s in sxids} == {("0000:04:00.0", 22013)}
    _, sxids = _kernel_log.parse_kernel_log((LOG / "dmesg-kern-err-sxid-12028.log").read_text())
    assert [(s["bdf"], s["code"]) for s in sxids] == [("0000:84:00.0", 12028)]


def test_only_this_boot_of_a_captured_journal():
    old = (LOG / "journalctl-k-xid45-caused-by.log").read_text()
    text = old + "-- Boot 0123456789abcdef --\nkernel: Linux version 6.8.0-49-generic\n"
    assert _kernel_log.parse_kernel_log(text) == ([], [])
    text = BANNER + (LOG / "dmesg-fallen-off-bus.log").read_text()
    assert [x["code"] for x in _kernel_log.parse_kernel_log(text)[0]] == [79]


# The kernel's own banner (init/main.c linux_banner), as dmesg prints it at boot.
BANNER = (
    "[    0.000000] Linux version 6.8.0-49-generic (buildd@lcy02-amd64-046) (x86_64-linux-gnu-gcc-13) #49-Ubuntu SMP\n"
)


@pytest.mark.parametrize(
    "banner",
    [
        BANNER,
        "Dec 01 10:00:00.123456 node1 kernel: Linux version 6.8.0-49-generic (buildd@lcy02-amd64-046) #49\n",
        "kernel: Linux version 6.8.0-49-generic (buildd@lcy02-amd64-046) #49\n",
        "[Fri Aug 30 11:43:09 2024] Linux version 6.8.0-49-generic (buildd@lcy02-amd64-046) #49\n",
    ],
)
def test_the_kernels_banner_starts_a_boot(banner):
    old = (LOG / "dmesg-T-xid13-109.log").read_text()
    assert _kernel_log.parse_kernel_log(old + banner) == ([], [])


@pytest.mark.parametrize(
    "injected",
    [
        # What a root process writes to /dev/kmsg: stamped when written, not 0.
        "[ 8130.000001] Linux version 6.8.0-49-generic (buildd@lcy02-amd64-046) #49\n",
        # "Linux version 6..." inside another message.
        "[ 8130.000001] myjob: Linux version 6.8.0-49-generic (buildd@lcy02-amd64-046) #49\n",
        "[ 8130.000001] foo kernel: Linux version 6.8.0 (x)\n",
        "Dec 01 10:00:00 node1 myjob[42]: see Linux version 6.8.0 (x)\n",
    ],
)
def test_injected_banner_is_not_a_boot(injected):
    text = BANNER + (LOG / "dmesg-T-xid13-109.log").read_text() + injected
    xids, _ = _kernel_log.parse_kernel_log(text)
    assert [x["code"] for x in xids] == [13, 13, 13, 109]


def test_unparseable_xid_is_reported():
    from ansible_collections.gpufleet.node.plugins.module_utils.health import _checks

    lines = (LOG / "dmesg-T-xid13-109.log").read_text().splitlines()
    # The Xid 109 line cut after its device, and an SXid line with its code replaced.
    cut = lines[4][: lines[4].index("): ") + 3]
    sxid = (LOG / "dmesg-sxid-22013.log").read_text().splitlines()[2].replace("22013", "2201x")
    xids, sxids = _kernel_log.parse_kernel_log("\n".join(lines[:4] + [cut, sxid]) + "\n")
    assert [x["code"] for x in xids] == [13, 13, 13, None]
    assert xids[3] == {"bdf": "0000:cb:00", "code": None, "pid": None, "message": cut.strip()}
    assert [(s["bdf"], s["code"]) for s in sxids] == [("0000:04:00.0", None)]
    check = _checks.check_xid(xids, ["0000:cb:00.0"])
    assert check["status"] == "fail" and check["action"] == "drain and inspect the hardware"
    assert check["gpus"] == ["0000:cb:00.0"]
    assert "unparseable Xid line on 0000:cb:00.0 (an Xid line this collection cannot parse" in check["reason"]
    assert repr(cut.strip()) in check["reason"]
    check = _checks.check_sxid(sxids)
    assert check["status"] == "fail" and "an SXid line this collection cannot parse" in check["reason"]


def test_nvlink_xid_severity_from_the_line():
    xids, _ = _kernel_log.parse_kernel_log((LOG / "nvlink-xid-144-149.log").read_text())
    verdicts = {x["code"]: _kernel_log.xid_verdict(x)[0] for x in xids}
    assert verdicts == {144: "warn", 149: "fail", 145: "warn", 94: "fail"}
    assert xids[2]["bdf"] == "0018:01:00"


def test_aer_files_and_link_speed():
    text = (
        "RxErr 0\nBadTLP 2\nBadDLLP 1\nRollover 0\nTimeout 0\nNonFatalErr 0\nCorrIntErr 0\n"
        "HeaderOF 0\nTOTAL_ERR_COR 3\n"
    )
    assert _pci_facts.parse_aer(text, "TOTAL_ERR_COR") == 3
    assert _pci_facts.parse_aer("Undefined 0\nDLP 1\n", "TOTAL_ERR_FATAL") == 1
    assert _pci_facts.parse_aer(None, "TOTAL_ERR_FATAL") is None
    assert _pci_facts.link_gen("16.0 GT/s PCIe") == 4 and _pci_facts.link_gen("32.0 GT/s PCIe") == 5
    assert _pci_facts.link_gen("Unknown") is None
