# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet.node.gpu_health_info as Ansible runs it (tests.harness.modules.run_module), with backend
nvidia_smi: a fake nvidia-smi in tmp prints reports made from the real H100 sample (one block per
GPU of the lab's h100-sxm-8x tree, the bus id and one value changed where a test says so), over the
lab's sysfs tree."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.harness import REPO, VENV_BIN
from tests.harness.modules import run_module

DATA = REPO / "tests" / "data"
H100 = (DATA / "nvidia-smi-q" / "h100-hbm3-535.183.01.txt").read_text()
HEADER, BLOCK = H100.split("GPU 00000000:53:00.0\n", 1)
NVLINK_GPU0 = (DATA / "nvidia-smi-q" / "nvlink-s-h100.txt").read_text().split("GPU 1:")[0]


def report(bdfs, change=None):
    """A -q report for ``bdfs``; ``change(index, block) -> block`` alters one GPU's block."""
    blocks = []
    for index, bdf in enumerate(bdfs):
        block = BLOCK.replace("00000000:53:00.0", "0000" + bdf.upper()).replace(
            "GPU-566e6f65-c38e-b12f-4824-6944218668b9", "GPU-566e6f65-c38e-b12f-4824-69442186680%d" % index
        )
        blocks.append("GPU 0000%s\n%s" % (bdf.upper(), change(index, block) if change else block))
    return re.sub(r"(?m)^(Attached GPUs\s*:\s*)\d+$", lambda m: "%s%d" % (m.group(1), len(bdfs)), HEADER) + "".join(
        blocks
    )


def nvlinks(count, down=None):
    text = ""
    for index in range(count):
        gpu = NVLINK_GPU0.replace("GPU 0:", "GPU %d:" % index)
        if index == down:
            gpu = gpu.replace("Link 7: 26.562 GB/s", "Link 7: <inactive>")
        text += gpu
    return text


@pytest.fixture
def node(lab_node, tmp_path):
    machine = lab_node("h100-sxm-8x")
    bdfs = [gpu.bdf for gpu in machine.gpus]
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "modules").write_text("nvidia_peermem 16384 0 - Live 0x0000000000000000\n")
    (tmp_path / "module").mkdir()
    (tmp_path / "kern.log").write_text("[    0.000000] Linux version 6.8.0-49-generic\n")

    def args(q=None, nvlink=None, log=None, **extra):
        (tmp_path / "q.txt").write_text(q if q is not None else report(bdfs))
        (tmp_path / "nvlink.txt").write_text(nvlink if nvlink is not None else nvlinks(len(bdfs)))
        if log is not None:
            (tmp_path / "kern.log").write_text(log)
        binary = tmp_path / "nvidia-smi"
        binary.write_text(
            '#!/bin/sh\necho "$@" >> %s/argv\ncase "$1" in\n  -q) cat %s/q.txt ;;\n'
            "  nvlink) cat %s/nvlink.txt ;;\n  *) exit 2 ;;\nesac\n" % (tmp_path, tmp_path, tmp_path)
        )
        binary.chmod(0o755)
        base = {
            "backend": "nvidia_smi",
            "nvidia_smi_path": str(binary),
            "sysfs_path": str(machine.sysfs),
            "kernel_log_path": str(tmp_path / "kern.log"),
            "proc_path": str(tmp_path / "proc"),
            "sys_module_path": str(tmp_path / "module"),
            "fabric_manager_state": "active",
            "expect_gpu_count": 8,
        }
        base.update(extra)
        return base

    args.machine = machine
    args.bdfs = bdfs
    args.tmp = tmp_path
    return args


def statuses(result):
    return {c["name"]: c["status"] for c in result["gpu_health"]["checks"]}


def test_healthy_node_passes_every_check(node):
    result = run_module("gpu_health_info", node())
    assert not result.get("failed"), result
    health = result["gpu_health"]
    assert result["changed"] is False and result["backend"] == "nvidia_smi"
    assert set(statuses(result).values()) == {"pass"} and health["passed"] is True
    assert [g["bus_id"] for g in health["gpus"]] == node.bdfs
    assert all(
        len(g["nvlinks"]) == 18 and g["fabric"] == {"state": "completed", "status": "success"} for g in health["gpus"]
    )
    assert (node.tmp / "argv").read_text().splitlines() == ["-q", "nvlink -s"]
    assert health["pci_tree"]["nics_on_gpu_paths"] and health["kernel_log"]["source"] == str(node.tmp / "kern.log")
    checked = run_module("gpu_health_info", node(), check_mode=True)
    assert checked["gpu_health"] == health


def test_faults_fail_their_checks(node):
    def remap_pending(index, block):
        return (
            block.replace(
                "        Pending                           : No\n        Remapping",
                "        Pending                           : Yes\n        Remapping",
            )
            if index == 3
            else block
        )

    log = (
        "Jun 21 02:10:01 hgx kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus.\n"
    )
    result = run_module(
        "gpu_health_info",
        node(q=report(node.bdfs, remap_pending), nvlink=nvlinks(8, down=2), log=log, fabric_manager_state="inactive"),
    )
    got = statuses(result)
    assert got["row_remap"] == got["xid"] == got["nvlink"] == got["fabric_manager"] == "fail"
    assert result["gpu_health"]["passed"] is False
    checks = {c["name"]: c for c in result["gpu_health"]["checks"]}
    assert checks["row_remap"]["gpus"] == [node.bdfs[3]] and checks["row_remap"]["action"] == "reset the GPU"
    assert checks["xid"]["gpus"] == ["0000:3b:00.0"] and checks["xid"]["action"] == "reboot"
    assert checks["nvlink"]["gpus"] == [node.bdfs[2]]
    assert result["gpu_health"]["xid_events"] == [
        {"bdf": "0000:3b:00", "code": 79, "pid": None, "message": "name=<unknown>, GPU has fallen off the bus."}
    ]


def test_aer_on_a_bridge_of_a_gpu_path_fails(node):
    args = node()
    gpu = node.machine.sysfs / "devices" / node.bdfs[0]
    bridge = gpu.resolve().parent
    (bridge / "aer_dev_nonfatal").write_text(
        "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 1\n"
        "CmpltAbrt 0\nUnxCmplt 0\nRxOF 0\nMalfTLP 0\nECRC 0\nUnsupReq 0\n"
        "ACSViol 0\nTOTAL_ERR_NONFATAL 1\n"
    )
    result = run_module("gpu_health_info", args)
    check = [c for c in result["gpu_health"]["checks"] if c["name"] == "pcie_aer"][0]
    assert check["status"] == "fail" and bridge.name in check["reason"] and check["gpus"] == [node.bdfs[0]]


def test_peermem_missing_warns_persistence_off_and_count_fail(node):
    (node.tmp / "proc" / "modules").write_text("nvidia 1 0 - Live 0x0\n")
    report_off = report(
        node.bdfs[:7],
        lambda i, b: b.replace(
            "Persistence Mode                      : Enabled", "Persistence Mode                      : Disabled"
        ),
    )
    result = run_module("gpu_health_info", node(q=report_off, nvlink=nvlinks(7)))
    got = statuses(result)
    assert got["peermem"] == "warn" and got["persistence_mode"] == "fail" and got["gpu_count"] == "fail"
    count = [c for c in result["gpu_health"]["checks"] if c["name"] == "gpu_count"][0]
    assert count["gpus"] == [node.bdfs[7]]


def test_nvidia_smi_failure_text_fails_the_task(node, tmp_path):
    binary = tmp_path / "broken-smi"
    binary.write_text(
        "#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
        'driver. Make sure that the latest NVIDIA driver is installed and running."\nexit 9\n'
    )
    binary.chmod(0o755)
    result = run_module("gpu_health_info", node(nvidia_smi_path=str(binary)))
    assert result["failed"] and result["cause"] == "driver_not_loaded"


def test_unknown_error_field_fails(node):
    def unreadable(index, block):
        if index != 2:
            return block
        return block.replace(
            "        Pending                           : No\n        Remapping",
            "        Pending                           : [Unknown Error]\n        Remapping",
        )

    result = run_module("gpu_health_info", node(q=report(node.bdfs, unreadable)))
    assert not result.get("failed"), result
    health = result["gpu_health"]
    assert health["passed"] is False and statuses(result)["readable"] == "fail"
    (check,) = [c for c in health["checks"] if c["name"] == "readable"]
    assert check["gpus"] == [node.bdfs[2]] and check["action"] == "reset the GPU"
    assert "GPU %s: Remapped Rows > Pending ([Unknown Error])" % node.bdfs[2] in check["reason"]
    assert health["gpus"][2]["unreadable"] == [{"field": "Remapped Rows > Pending", "error": "[Unknown Error]"}]


def test_truncated_report_fails(node):
    text = report(node.bdfs)
    cut = text.rindex("    Fabric\n")
    result = run_module("gpu_health_info", node(q=text[:cut]))
    assert result["failed"] and result["cause"] == "nvidia_smi_output"
    assert "cut short inside the block of GPU 0000%s" % node.bdfs[-1].upper() in result["msg"]


def test_attached_count_mismatch_fails(node):
    text = report(node.bdfs).replace(
        "Attached GPUs                             : 8", "Attached GPUs                             : 9"
    )
    result = run_module("gpu_health_info", node(q=text))
    assert result["failed"] and result["cause"] == "nvidia_smi_output"
    assert "says 9 GPU(s) are attached but prints 8 GPU block(s)" in result["msg"]


def test_nvlink_design_without_link_lines_fails(node):
    text = nvlinks(len(node.bdfs))
    start, end = text.index("GPU 5:"), text.index("GPU 6:")
    text = text[:start] + text[start:end].splitlines()[0] + "\n" + text[end:]
    result = run_module("gpu_health_info", node(nvlink=text))
    assert not result.get("failed"), result
    (check,) = [c for c in result["gpu_health"]["checks"] if c["name"] == "nvlink"]
    assert check["status"] == "fail" and check["gpus"] == [node.bdfs[5]]
    assert check["reason"].startswith("no NVLink state read for GPU(s) %s although" % node.bdfs[5])


def test_ansible_doc_renders():
    doc = shutil.which("ansible-doc", path=str(VENV_BIN))
    proc = subprocess.run(
        [doc, "-M", str(REPO / "plugins" / "modules"), "gpu_health_info"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PATH": str(VENV_BIN) + ":/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "fabric_manager_state" in proc.stdout and "DCGM_LIMIT_MAX_RETIRED_PAGES" in proc.stdout


def test_the_verdict_of_this_boot_comes_ready_to_write(node):
    """With boot_id_path the module returns the verdict file's record (the role writes it as it
    is, the watcher builds its own with the same builder): failures, warnings, the strongest
    action, every reason."""
    boot_id = node.tmp / "boot_id"
    boot_id.write_text("5d2c6f0e-8a51-4c11-a3f0-6a2b1f0e9c77\n")
    log = (
        "[ 8123.456789] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
    )
    result = run_module("gpu_health_info", node(log=log, boot_id_path=str(boot_id), require_peermem=True))
    verdict = result["verdict"]
    failed = [c for c in result["gpu_health"]["checks"] if c["status"] == "fail"]
    assert [c["name"] for c in failed] == ["xid"], result["gpu_health"]["checks"]
    assert verdict == {
        "boot_id": "5d2c6f0e-8a51-4c11-a3f0-6a2b1f0e9c77",
        "passed": False,
        "source": "gpu_health",
        "checks": failed,
        "warnings": [c for c in result["gpu_health"]["checks"] if c["status"] == "warn"],
        "action": "reboot",
        "reason": "xid: " + failed[0]["reason"],
    }
    assert "verdict" not in run_module("gpu_health_info", node())


def test_a_boot_id_that_cannot_be_read_fails_and_failure_returns_a_failing_verdict(node):
    (node.tmp / "empty").write_text("\n")
    for path in (node.tmp / "missing", node.tmp / "empty"):
        result = run_module("gpu_health_info", node(boot_id_path=str(path)))
        assert result.get("failed") and result["cause"] == "boot_id" and str(path) in result["msg"], result
        assert "verdict" not in result
    (node.tmp / "boot_id").write_text("5d2c6f0e-8a51-4c11-a3f0-6a2b1f0e9c77\n")
    result = run_module(
        "gpu_health_info", {"boot_id_path": str(node.tmp / "boot_id"), "failure": "nvidia-smi timed out"}
    )
    assert not result.get("failed"), result
    check = {"name": "gpu_facts", "status": "fail", "gpus": [], "reason": "nvidia-smi timed out",
             "action": "drain and inspect the hardware"}  # fmt: skip
    assert result["verdict"] == {
        "boot_id": "5d2c6f0e-8a51-4c11-a3f0-6a2b1f0e9c77",
        "passed": False,
        "source": "gpu_health",
        "checks": [check],
        "warnings": [],
        "action": "drain and inspect the hardware",
        "reason": "gpu_facts: nvidia-smi timed out",
    }
    assert result["gpu_health"]["checks"] == [check] and result["gpu_health"]["passed"] is False
    refused = run_module("gpu_health_info", {"failure": "x"})
    assert refused.get("failed") and "boot_id_path" in refused["msg"], refused


def test_the_same_fatal_xid_in_two_boots_holds_the_node_until_the_hold_is_cleared(node):
    """history_path: each boot's fatal XIDs recorded (the role writes ``history.content``); the
    second boot with XID 79 on the same GPU holds the node, also in a third boot without it."""
    history = node.tmp / "gpu-xid-history.json"
    gpu = node.bdfs[0]
    xid = "[ 8123.456789] NVRM: Xid (PCI:%s): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
    banner = "[    0.000000] Linux version 6.8.0-49-generic\n"

    def boot(n, log):
        (node.tmp / "boot_id").write_text("boot-%d\n" % n)
        result = run_module(
            "gpu_health_info", node(log=log, boot_id_path=str(node.tmp / "boot_id"), history_path=str(history))
        )
        assert not result.get("failed"), result
        if result["history"]["changed"]:
            history.write_text(result["history"]["content"])
        return result

    first = boot(1, banner + xid % gpu[:-2])
    assert first["history"]["holds"] == [] and first["verdict"]["action"] == "reboot"
    assert 'gpufleet_gpu_health_xid_count{gpu="%s",code="79",scope="boot"} 1' % gpu in first["history"]["metrics"]
    assert boot(1, banner + xid % gpu[:-2])["history"]["changed"] is False  # the same boot again
    second = boot(2, banner + xid % gpu[:-2])
    assert [(h["gpu"], h["code"], h["boots"]) for h in second["history"]["holds"]] == [(gpu, 79, ["boot-1", "boot-2"])]
    third = boot(3, banner)
    assert third["verdict"]["passed"] is False and third["verdict"]["action"] == "hardware inspection"
    assert [c["name"] for c in third["verdict"]["checks"]] == ["xid_recurrence"]
    assert third["gpu_health"]["passed"] is False
    cleared = run_module("gpu_health_hold", {"history_path": str(history), "state": "cleared"})
    assert cleared["changed"] is True
    fourth = boot(4, banner)
    assert fourth["verdict"]["passed"] is True and fourth["history"]["holds"] == []


def test_the_same_fatal_xid_on_every_gpu_is_a_software_or_driver_event(node):
    (node.tmp / "boot_id").write_text("boot-1\n")
    log = "".join(
        "[ 8123.45678%d] NVRM: Xid (PCI:%s): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
        % (n, bdf[:-2])
        for n, bdf in enumerate(node.bdfs)
    )
    history = node.tmp / "gpu-xid-history.json"
    result = run_module(
        "gpu_health_info", node(log=log, boot_id_path=str(node.tmp / "boot_id"), history_path=str(history))
    )
    checks = {c["name"]: c for c in result["verdict"]["checks"]}
    assert checks["xid_node_wide"]["gpus"] == sorted(node.bdfs)
    assert "XID 79 on every GPU of the node in this boot (8 GPUs)" in checks["xid_node_wide"]["reason"]
    assert result["verdict"]["action"] == "check the driver and software (a software or driver event)"
    assert not history.exists()  # the module only reads it


def test_an_unreadable_history_fails_the_task_naming_the_file(node):
    (node.tmp / "boot_id").write_text("boot-1\n")
    history = node.tmp / "gpu-xid-history.json"
    history.write_text('{"version": 1, "events": 3, "holds": []}')
    result = run_module("gpu_health_info", node(boot_id_path=str(node.tmp / "boot_id"), history_path=str(history)))
    assert result.get("failed") and result["cause"] == "history" and str(history) in result["msg"], result
    assert "clear_gpu_hold" in result["msg"]
    refused = run_module("gpu_health_info", node(history_path=str(history)))
    assert refused.get("failed") and "boot_id_path" in refused["msg"], refused
