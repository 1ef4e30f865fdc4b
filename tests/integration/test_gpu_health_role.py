# SPDX-License-Identifier: GPL-3.0-or-later
"""The gpu_health role end to end with `ansible-playbook -c local` on a simulated 8x H100 SXM
machine (lab.hwmodel's sysfs tree and boot id), a fake nvidia-smi printing reports made from the
real H100 `nvidia-smi -q` sample (tests/data/nvidia-smi-q), and a kernel-log file: a healthy node
passes and a second run changes nothing; an XID 79, a pending row remap and unreadable GPUs each
fail the host naming the check and its action, with the verdict of this boot and the metrics
written whole, and the node's HAProxy agent rule answering `down`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.gpufleet.node.plugins.filter.agent_files import agent_files
from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _readiness
from tests.harness.playbook import run_playbook
from tests.integration.test_gpu_health_module import nvlinks, report

PLAYBOOK = Path(__file__).resolve().parent / "playbooks" / "gpu_health_role.yml"
CLEAR = Path(__file__).resolve().parent / "playbooks" / "gpu_health_clear.yml"
WATCHER = Path(__file__).resolve().parents[2] / "roles" / "gpu_health" / "files" / "gpufleet_gpu_health_watch.py"
XID_79 = "[ 8123.456789] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"

pytestmark = pytest.mark.integration


class Node:
    """A lab machine, a stand-in for its /, and what the fake nvidia-smi prints."""

    def __init__(self, tmp_path, lab_node):
        self.machine = lab_node("h100-sxm-8x")
        self.bdfs = [gpu.bdf for gpu in self.machine.gpus]
        self.state = tmp_path / "state"
        (self.state / "proc").mkdir(parents=True)
        (self.state / "proc" / "modules").write_text("nvidia_peermem 16384 0 - Live 0x0000000000000000\n")
        (self.state / "sys" / "module" / "nvidia_peermem").mkdir(parents=True)
        self.kernel_log = tmp_path / "kern.log"
        self.kernel_log.write_text("[    0.000000] Linux version 6.8.0-49-generic (buildd@lcy02-amd64-046)\n")
        self.tmp = tmp_path
        self.smi = tmp_path / "nvidia-smi"
        self.set_report(report(self.bdfs))
        (tmp_path / "nvlink.txt").write_text(nvlinks(len(self.bdfs)))

    def set_report(self, text):
        (self.tmp / "q.txt").write_text(text)
        self.smi.write_text(
            '#!/bin/sh\ncase "$1" in\n  -q) cat %s/q.txt ;;\n  nvlink) cat %s/nvlink.txt ;;\n'
            "  *) exit 2 ;;\nesac\n" % (self.tmp, self.tmp)
        )
        self.smi.chmod(0o755)

    def run(self, *args, playbook=PLAYBOOK):
        return run_playbook(
            playbook,
            *args,
            extra_vars={
                "lab_root": str(self.machine.root),
                "state_dir": str(self.state),
                "smi": str(self.smi),
                "kernel_log": str(self.kernel_log),
            },
            timeout=600,
        )

    @property
    def verdict_path(self):
        return self.state / "run" / "gpufleet" / "gpu-health.json"

    def verdict(self):
        return json.loads(self.verdict_path.read_text())

    def boot_id(self):
        return (self.machine.root / "proc/sys/kernel/random/boot_id").read_text().strip()

    def metrics(self):
        text = (self.state / "var/lib/node_exporter/textfile_collector/gpufleet_gpu_health.prom").read_text()
        samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.setdefault(s.name, []).append((s.labels, s.value))
        return samples

    def agent(self):
        """The HAProxy agent's answer on this node (the gate's marker would sit beside the verdict)."""
        return _readiness.agent_answer(
            str(self.verdict_path.parent / "nccl-gate.json"), str(self.machine.root / "proc/sys/kernel/random/boot_id")
        )

    def leftovers(self):
        """Files of the verdict's and the metrics' directories other than the two the role writes."""
        dirs = [self.verdict_path.parent, self.state / "var/lib/node_exporter/textfile_collector"]
        return sorted(
            p.name
            for d in dirs
            for p in d.iterdir()
            if p.name not in ("gpu-health.json", "gpufleet_gpu_health.prom", "gpufleet_gpu_health_xid.prom")
        )


@pytest.fixture
def node(tmp_path, lab_node):
    return Node(tmp_path, lab_node)


def check_status(node):
    return {labels["check"]: value for labels, value in node.metrics()["gpufleet_gpu_health_check_status"]}


@pytest.mark.slow
def test_a_healthy_node_passes_and_a_second_run_changes_nothing(node):
    first = node.run()
    assert first.rc == 0, first.explain()
    assert first.host("localhost")["changed"] > 0
    verdict = node.verdict()
    assert verdict == {
        "boot_id": node.boot_id(),
        "passed": True,
        "source": "gpu_health",
        "checks": [],
        "warnings": [],
        "action": "none",
        "reason": "every check passed",
    }
    metrics = node.metrics()
    assert metrics["gpufleet_gpu_health_passed"] == [({}, 1.0)]
    assert set(check_status(node).values()) == {0.0} and "xid" in check_status(node)
    assert sorted(labels["gpu"] for labels, _v in metrics["gpufleet_gpu_health_gpu_status"]) == sorted(node.bdfs)
    assert ({"gpu": node.bdfs[0], "field": "pending"}, 0.0) in metrics["gpufleet_gpu_health_remapped_rows"]
    assert ({"gpu": node.bdfs[0]}, 1.0) in metrics["gpufleet_gpu_health_persistence_mode"]
    # The watcher and the rules it copies, and its unit with this node's knobs.
    lib = node.state / "usr/local/lib/gpufleet/gpu-health-watch"
    libs = [os.path.relpath(e["dest"], lib) for e in agent_files(str(WATCHER), str(lib))]
    assert sorted(str(p.relative_to(lib)) for p in lib.rglob("*") if p.is_file()) == sorted(
        libs + ["gpufleet_gpu_health_watch.py"]
    )
    unit = (node.state / "etc/systemd/system/gpufleet-gpu-health-watch.service").read_text()
    assert f"--verdict {node.verdict_path} " in unit and f"--kernel-log {node.kernel_log} " in unit
    assert f"--nvidia-smi {node.smi} " in unit
    assert node.agent().startswith("down #no NCCL gate marker"), node.agent()  # health says nothing against

    second = node.run()
    assert second.rc == 0 and second.host("localhost")["changed"] == 0, second.explain()
    checked = node.run("--check")
    assert checked.rc == 0 and checked.host("localhost")["changed"] == 0, checked.explain()


@pytest.mark.slow
def test_an_xid_79_fails_the_host_with_the_check_and_its_action(node):
    assert node.run().rc == 0
    with node.kernel_log.open("a") as log:
        log.write(XID_79)
    run = node.run()
    assert run.rc == 2 and run.host("localhost")["failed"] == 1, run.explain()
    failure = " ".join(" ".join(run.host_failures("localhost")).split())
    assert "GPU health check failed on localhost" in failure
    assert "xid: XID 79 on 0000:3b:00.0 (GPU has fallen off the bus, fail) -> action: reboot" in failure
    verdict = node.verdict()
    assert verdict["passed"] is False and verdict["boot_id"] == node.boot_id()
    assert [(c["name"], c["action"], c["gpus"]) for c in verdict["checks"]] == [("xid", "reboot", ["0000:3b:00.0"])]
    assert verdict["action"] == "reboot"
    metrics = node.metrics()
    assert metrics["gpufleet_gpu_health_passed"] == [({}, 0.0)] and check_status(node)["xid"] == 2.0
    assert metrics["gpufleet_gpu_health_xid_events"] == [({"bdf": "0000:3b:00", "code": "79"}, 1.0)]
    assert node.leftovers() == []
    assert node.agent().startswith(
        "down #GPU health failed (gpu_health): xid: XID 79 on 0000:3b:00.0 (GPU has fallen off the bus, fail) "
        "(action: reboot)"
    ), node.agent()
    # A new boot: the verdict of the old one says nothing (the gate's marker decides again).
    (node.machine.root / "proc/sys/kernel/random/boot_id").write_text("0c4e3a52-0b43-4d0b-9b0e-1f3e5d0f8a11\n")
    assert node.agent().startswith("down #no NCCL gate marker"), node.agent()


@pytest.mark.slow
def test_a_pending_row_remap_fails_the_host(node):
    def remap_pending(index, block):
        return (
            block.replace(
                "        Pending                           : No\n        Remapping",
                "        Pending                           : Yes\n        Remapping",
            )
            if index == 5
            else block
        )

    node.set_report(report(node.bdfs, remap_pending))
    run = node.run()
    assert run.rc == 2 and run.host("localhost")["failed"] == 1, run.explain()
    failure = " ".join(" ".join(run.host_failures("localhost")).split())
    assert f"row_remap: row remapping pending on {node.bdfs[5]}" in failure and "action: reset the GPU" in failure
    verdict = node.verdict()
    assert [(c["name"], c["gpus"]) for c in verdict["checks"]] == [("row_remap", [node.bdfs[5]])]
    metrics = node.metrics()
    assert ({"gpu": node.bdfs[5], "field": "pending"}, 1.0) in metrics["gpufleet_gpu_health_remapped_rows"]
    assert ({"gpu": node.bdfs[5]}, 2.0) in metrics["gpufleet_gpu_health_gpu_status"]
    assert node.leftovers() == []


@pytest.mark.slow
def test_gpus_that_cannot_be_read_fail_the_host_with_a_verdict(node):
    node.smi.write_text(
        "#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
        'driver. Make sure that the latest NVIDIA driver is installed and running."\nexit 9\n'
    )
    run = node.run()
    assert run.rc == 2 and run.host("localhost")["failed"] == 1, run.explain()
    assert "gpu_facts: " in " ".join(run.host_failures("localhost"))
    verdict = node.verdict()
    assert verdict["passed"] is False and verdict["checks"][0]["name"] == "gpu_facts"
    assert "couldn't communicate with the NVIDIA driver" in verdict["checks"][0]["reason"]
    assert node.metrics()["gpufleet_gpu_health_passed"] == [({}, 0.0)]


@pytest.mark.slow
def test_the_same_xid_after_a_reboot_holds_the_node_until_the_documented_clear(node):
    """XID 79 on the same GPU in two boots: the host fails held for hardware inspection, in a
    third boot without the XID too; the clear (check mode and diff first, changed only with a
    hold) lets the next check pass."""
    boot_id = node.machine.root / "proc/sys/kernel/random/boot_id"
    history = node.state / "var/lib/gpufleet/gpu-xid-history.json"
    banner = node.kernel_log.read_text()

    def boot(n, log):
        boot_id.write_text("0c4e3a52-0b43-4d0b-9b0e-1f3e5d0f8a1%d\n" % n)
        node.kernel_log.write_text(banner + log)
        return node.run()

    first = boot(1, XID_79)
    assert first.rc == 2 and "Held for hardware inspection" not in " ".join(first.host_failures("localhost"))
    assert [e["code"] for e in json.loads(history.read_text())["events"]] == [79]
    held = boot(2, XID_79)
    assert held.rc == 2, held.explain()
    failure = " ".join(" ".join(held.host_failures("localhost")).split())
    assert "msg: 'Held for hardware inspection (the same fatal XID came back" in failure, failure
    assert "xid_recurrence: XID 79 on 0000:3b:00.0 in 2 boots" in failure
    assert "Strongest action: hardware inspection." in failure
    again = boot(3, "")
    assert again.rc == 2 and node.verdict()["action"] == "hardware inspection", again.explain()
    assert [c["name"] for c in node.verdict()["checks"]] == ["xid_recurrence"]
    assert node.agent().startswith("down #GPU health failed (gpu_health): xid_recurrence: "), node.agent()
    xid_metrics = node.state / "var/lib/node_exporter/textfile_collector/gpufleet_gpu_health_xid.prom"
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(xid_metrics.read_text())
        for s in family.samples
    }
    assert samples[("gpufleet_gpu_health_hold", ())] == 1.0
    assert samples[("gpufleet_gpu_health_xid_boots", (("code", "79"), ("gpu", "0000:3b:00.0")))] == 2.0
    key = ("gpufleet_gpu_health_xid_count", (("code", "79"), ("gpu", "0000:3b:00.0"), ("scope", "boot")))
    assert samples[key] == 0.0  # none in this boot; two in the history
    before = history.read_text()
    checked = node.run("--check", "--diff", playbook=CLEAR)
    assert checked.rc == 0 and checked.host("localhost")["changed"] == 1, checked.explain()
    assert "XID 79 on 0000:3b:00.0 in 2 boots" in checked.stdout and history.read_text() == before
    cleared = node.run(playbook=CLEAR)
    assert cleared.rc == 0 and cleared.host("localhost")["changed"] >= 1, cleared.explain()
    assert "\ngpufleet_gpu_health_hold 0\n" in xid_metrics.read_text()
    assert node.run(playbook=CLEAR).host("localhost")["changed"] == 0  # no hold: nothing to do
    passed = node.run()
    assert passed.rc == 0 and node.verdict()["passed"] is True, passed.explain()
