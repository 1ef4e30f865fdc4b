# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet-gpu-health-watch (roles/gpu_health/files): the watcher that takes a serving node out
of rotation. As installed (the script with the role's copies of the collection's rules beside it,
run by a bare Python) it writes a failing verdict on an XID line appended to the kernel log or a
pending row remap in `nvidia-smi -q`, and the node's HAProxy agent rule then
answers `down`; its judgement in-process for the edge cases."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.health import (
    _checks,  # noqa: F401 (loaded first)
    _history,
)
from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _readiness
from tests.harness import REPO
from tests.harness.modules import install_agent, run_module
from tests.smi_samples import whole

ROLE = REPO / "roles" / "gpu_health"
TREE = "ansible_collections/gpufleet/node/plugins/module_utils"
WATCHER = ROLE / "files" / "gpufleet_gpu_health_watch.py"
H100 = whole("h100-hbm3-535.183.01.txt")
PENDING = H100.replace(
    "        Pending                           : No\n        Remapping",
    "        Pending                           : Yes\n        Remapping",
)
BOOT = "5d2c6f0e-8a51-4c11-a3f0-6a2b1f0e9c77"
BANNER = "[    0.000000] Linux version 6.8.0-49-generic (buildd@lcy02-amd64-046)\n"
XID_79 = "[ 8123.456789] NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
XID_13 = "[ 8120.000001] NVRM: Xid (PCI:0000:53:00): 13, pid=4242, name=python3, Graphics Exception\n"

spec = importlib.util.spec_from_file_location("gpufleet_gpu_health_watch", WATCHER)
watch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(watch)


def smi(tmp_path, text, name="nvidia-smi"):
    (tmp_path / f"{name}.txt").write_text(text)
    binary = tmp_path / name
    # each run leaves a line in <name>.calls: a test waits on it to know the watcher has polled
    binary.write_text(
        f'#!/bin/sh\n[ "$1" = "-q" ] || exit 2\necho >> {tmp_path}/{name}.calls\ncat {tmp_path}/{name}.txt\n'
    )
    binary.chmod(0o755)
    return binary


@pytest.fixture
def node(tmp_path):
    """A node's files: boot id, kernel log, the installed watcher (script and the role's copies)."""
    (tmp_path / "boot_id").write_text(BOOT + "\n")
    (tmp_path / "kern.log").write_text(BANNER)
    install_agent(WATCHER, tmp_path / "lib")
    (tmp_path / "run").mkdir()
    return tmp_path


def argv(node, *extra):
    return [
        sys.executable,
        "-I",
        str(node / "lib" / WATCHER.name),
        "--verdict",
        str(node / "run" / "gpu-health.json"),
        "--boot-id",
        str(node / "boot_id"),
        "--kernel-log",
        str(node / "kern.log"),
        *extra,
    ]


def agent(node):
    return _readiness.agent_answer(str(node / "run" / "nccl-gate.json"), str(node / "boot_id"))


# Functional waits: a bound for a watcher that never answers, not a target (how fast it answers is
# a figure for benchmarks, never an assertion here).
WAIT_S = 60


def wait_for(condition, proc, what):
    """Poll ``condition()`` until it is true (returned) or WAIT_S pass (AssertionError naming
    ``what``); the watcher must stay up meanwhile."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        assert proc.poll() is None, "the watcher exited:\n" + "\n".join(proc.lines)
        time.sleep(0.05)
    raise AssertionError("no %s within %d s; the watcher printed:\n%s" % (what, WAIT_S, "\n".join(proc.lines)))


def wait_for_verdict(node, proc):
    path = node / "run" / "gpu-health.json"
    return wait_for(lambda: path.exists() and json.loads(path.read_text()), proc, "verdict")


def wait_for_line(proc, text):
    """Wait until the watcher has printed a line holding ``text``: the event that shows it read
    what came before."""
    return wait_for(lambda: any(text in line for line in proc.lines), proc, "line %r" % text)


@pytest.fixture
def started():
    """Start the watcher; its output lines collect in ``proc.lines`` as it prints them."""
    procs = []

    def start(args):
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        proc.lines = []
        proc.reader = threading.Thread(target=lambda: proc.lines.extend(line.rstrip("\n") for line in proc.stdout))
        proc.reader.start()
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()
        proc.reader.join(10)


def pass_marker(node):
    (node / "run" / "nccl-gate.json").write_text(json.dumps({"boot_id": BOOT, "passed": True}))


def test_an_xid_line_appended_takes_the_node_out(node, started):
    pass_marker(node)
    proc = started(argv(node, "--no-gpu-poll", "--log-interval", "0.5"))
    with (node / "kern.log").open("a") as log:
        log.write(XID_13)  # an application fault: logged, the node stays in
    # its warning shows the watcher has read the log up to there: no verdict, the node in
    wait_for_line(proc, "GPU health warning, the node stays in rotation: xid: XID 13")
    assert not (node / "run" / "gpu-health.json").exists() and agent(node) == "up"
    with (node / "kern.log").open("a") as log:
        log.write(XID_79)
    verdict = wait_for_verdict(node, proc)
    assert verdict["boot_id"] == BOOT and verdict["passed"] is False and verdict["source"] == "gpu-health-watch"
    assert [(c["name"], c["action"]) for c in verdict["checks"]] == [("xid", "reboot")]
    assert agent(node).startswith(
        "down #GPU health failed (gpu-health-watch): xid: XID 79 on 0000:53:00.0 (GPU has fallen off the bus, fail)"
    )
    proc.kill()
    proc.wait()
    proc.reader.join(10)
    out = "\n".join(proc.lines)
    assert "GPU health warning, the node stays in rotation: xid: XID 13" in out
    assert "GPU health failed, taking the node out of rotation: xid: XID 79 on 0000:53:00.0" in out
    assert "(action: reboot)" in out
    assert sorted(p.name for p in (node / "run").iterdir()) == ["gpu-health.json", "nccl-gate.json"]


def test_a_pending_row_remap_takes_the_node_out(node, started):
    pass_marker(node)
    binary = smi(node, H100)
    proc = started(argv(node, "--nvidia-smi", str(binary), "--gpu-interval", "1", "--log-interval", "0.2"))
    calls = node / "nvidia-smi.calls"
    # a second run of nvidia-smi shows the watcher has judged the first, healthy report
    wait_for(lambda: calls.exists() and len(calls.read_text().splitlines()) >= 2, proc, "second poll")
    assert not (node / "run" / "gpu-health.json").exists() and agent(node) == "up"
    (node / "nvidia-smi.txt").write_text(PENDING)
    verdict = wait_for_verdict(node, proc)
    assert [(c["name"], c["gpus"], c["action"]) for c in verdict["checks"]] == [
        ("row_remap", ["0000:53:00.0"], "reset the GPU")
    ]
    assert agent(node).startswith("down #GPU health failed (gpu-health-watch): row_remap: row remapping pending")


def test_once_judges_the_whole_boot_and_says_so_in_its_exit_status(node):
    binary = smi(node, H100)
    healthy = subprocess.run(argv(node, "--nvidia-smi", str(binary), "--once"), capture_output=True, text=True)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert not (node / "run" / "gpu-health.json").exists()
    # An XID of an earlier boot (before the banner) does not count; one of this boot does.
    (node / "kern.log").write_text(XID_79 + BANNER)
    assert subprocess.run(argv(node, "--nvidia-smi", str(binary), "--once"), capture_output=True).returncode == 0
    (node / "kern.log").write_text(BANNER + XID_79)
    failed = subprocess.run(argv(node, "--nvidia-smi", str(binary), "--once"), capture_output=True, text=True)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert json.loads((node / "run" / "gpu-health.json").read_text())["checks"][0]["name"] == "xid"


def test_missing_rules_beside_the_watcher_is_a_clear_error(node):
    (node / "lib" / TREE / "gpu" / "_nvsmi_q.py").unlink()
    proc = subprocess.run(argv(node, "--no-gpu-poll", "--once"), capture_output=True, text=True)
    assert proc.returncode == 2 and "cannot load gpufleet.node's health rules" in proc.stdout


# -- in-process: the judgement ------------------------------------------------------------------
def judge(node, **extra):
    args = watch.parse_args(
        ["--verdict", str(node / "run" / "gpu-health.json"), "--boot-id", str(node / "boot_id"), "--no-gpu-poll"]
        + [a for k, v in extra.items() for a in ("--" + k.replace("_", "-"), v)]
    )
    args.ecc_volatile_uncorrectable_max, args.retired_pages_max = 0, 60
    return watch.Watch(watch.load_rules(str(REPO / ".collections")), args)


def test_the_loss_of_a_gpu_printed_over_two_reads_is_seen(node):
    w = judge(node)
    w.feed(["[ 99.1] NVRM: GPU at PCI:0000:53:00: GPU-566e6f65", "[ 99.1] NVRM: The NVIDIA GPU 0000:53:00.0"])
    assert w.failures(None, None, 0) == []
    w.feed(
        [
            "[ 99.1] NVRM: (PCI ID: 10de:2330) installed in this system has",
            "[ 99.1] NVRM: fallen off the bus and is not responding to commands.",
        ]
    )
    failed = w.failures(None, None, 0)
    assert [(c["name"], c["gpus"]) for c in failed] == [("xid", ["0000:53:00.0"])]


def test_a_verdict_rewritten_while_the_failure_stands_is_written_again(node):
    w = judge(node)
    w.feed([XID_79.strip()])
    assert w.enforce(w.failures(None, None, 0))
    path = node / "run" / "gpu-health.json"
    path.write_text(json.dumps({"boot_id": BOOT, "passed": True, "source": "gpu_health", "checks": []}))
    assert w.enforce(w.failures(None, None, 0))
    assert json.loads(path.read_text())["passed"] is False
    # Unchanged and still failing: not rewritten.
    before = path.stat().st_mtime_ns
    time.sleep(0.01)
    w.enforce(w.failures(None, None, 0))
    assert path.stat().st_mtime_ns == before


def test_uncorrectable_ecc_and_a_failing_nvidia_smi(node):
    from ansible_collections.gpufleet.node.plugins.module_utils.gpu import _nvsmi_q

    w = judge(node)
    gpus = _nvsmi_q.parse_query(H100)["gpus"]
    assert w.failures(gpus, None, 0) == []
    gpus[0]["ecc"]["volatile_uncorrectable"] = 2
    assert [c["name"] for c in w.failures(gpus, None, 0)] == ["ecc"]
    # nvidia-smi failing: the node goes out only after --nvidia-smi-failures polls in a row.
    assert w.failures(None, "`nvidia-smi -q` timed out", 2) == []
    failed = w.failures(None, "`nvidia-smi -q` timed out", 3)
    assert [(c["name"], c["action"]) for c in failed] == [("nvidia_smi", "reboot")]


def test_a_log_written_again_from_its_first_line_is_judged_anew(node):
    """The same log written again whole (its first line unchanged, as the lab's `fault clear`
    does): read again from its start, and the events before are forgotten."""
    log = watch.FileLog(str(node / "kern.log"))
    assert log.read() == ([BANNER.rstrip("\n")], False)
    with (node / "kern.log").open("a") as handle:
        handle.write("[ 1.0] partial")
    assert log.read() == ([], False)
    with (node / "kern.log").open("a") as handle:
        handle.write(" line\n")
    assert log.read() == (["[ 1.0] partial line"], False)
    (node / "kern.log").write_text(BANNER)  # shorter, from the same first line
    assert log.read() == ([BANNER.rstrip("\n")], True)


ROTATED = "[ 9000.000001] systemd-journald[412]: Received SIGUSR1\n"


@pytest.mark.parametrize("how", ["renamed", "copytruncate"])
def test_log_rotation_keeps_this_boots_xid_events(node, how):
    """logrotate's new file (the old one renamed) or copytruncate (the file emptied, then written
    on): the log goes on, and this boot's XID 79 read before still fails the node."""
    path = node / "kern.log"
    path.write_text(BANNER + XID_79)
    log, w = watch.FileLog(str(path)), judge(node)
    w.feed(*log.read())
    assert [c["name"] for c in w.failures(None, None, 0)] == ["xid"]
    if how == "renamed":
        path.rename(node / "kern.log.1")
        path.write_text("")
    else:
        path.write_text("")
    assert log.read() == ([], False)
    with path.open("a") as handle:
        handle.write(ROTATED)
    lines, reset = log.read()
    assert (lines, reset) == ([ROTATED.strip()], False)
    w.feed(lines, reset)
    failed = w.failures(None, None, 0)
    assert [(c["name"], c["gpus"]) for c in failed] == [("xid", ["0000:53:00.0"])], failed


def test_log_rotation_keeps_this_boots_xid_events_while_watching(node, started):
    """The running watcher: its verdict stands over a rotation, and a pass written over it while
    the XID stands is written over again."""
    pass_marker(node)
    (node / "kern.log").write_text(BANNER + XID_79)
    proc = started(argv(node, "--no-gpu-poll", "--log-interval", "0.2"))
    wait_for_verdict(node, proc)
    (node / "kern.log").rename(node / "kern.log.1")
    (node / "kern.log").write_text(ROTATED)
    wait_for_line(proc, "was rotated: the events of this boot read so far stand")
    path = node / "run" / "gpu-health.json"
    path.write_text(json.dumps({"boot_id": BOOT, "passed": True, "source": "gpu_health", "checks": []}))
    verdict = wait_for(lambda: json.loads(path.read_text())["passed"] is False and json.loads(path.read_text()),
                       proc, "the failure written again")  # fmt: skip
    assert [c["name"] for c in verdict["checks"]] == ["xid"] and agent(node).startswith("down #GPU health failed")


def test_a_previous_boots_xid_at_the_tail_does_not_hold_a_healthy_node_down(node, started):
    """The log's tail is the previous boot's (its XID 79) until this boot's banner is written
    after it: the events before the banner are forgotten, and the verdict the watcher wrote for
    them gives way to the one it replaced (the role's pass of this boot)."""
    pass_marker(node)
    role_pass = json.dumps({"boot_id": BOOT, "passed": True, "source": "gpu_health", "checks": [], "warnings": [],
                            "action": "none", "reason": "every check passed"}, indent=4, sort_keys=True) + "\n"  # fmt: skip
    path = node / "run" / "gpu-health.json"
    path.write_text(role_pass)
    (node / "kern.log").write_text(BANNER + XID_79)
    proc = started(argv(node, "--no-gpu-poll", "--log-interval", "0.2"))
    wait_for(lambda: json.loads(path.read_text())["passed"] is False, proc, "the earlier boot's XID judged")
    with (node / "kern.log").open("a") as log:
        log.write(BANNER + "[    5.117804] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  535.183.01\n")
    wait_for_line(proc, "the verdict it replaced is back")
    assert path.read_text() == role_pass and agent(node) == "up"
    # a banner a process writes later (stamped when written) is no boot: this XID stands
    with (node / "kern.log").open("a") as log:
        log.write(XID_79 + BANNER.replace("[    0.000000]", "[ 8124.000001]"))
    verdict = wait_for(lambda: json.loads(path.read_text())["passed"] is False and json.loads(path.read_text()),
                       proc, "this boot's XID judged")  # fmt: skip
    assert [c["name"] for c in verdict["checks"]] == ["xid"] and agent(node).startswith("down #")


def test_a_boot_start_in_a_later_read_ends_the_events_before_it(node):
    """The watcher uses the kernel-log parser's boot detection across its reads, not only within
    one: the kernel's banner (stamped 0) forgets the events before it, an injected one does not."""
    w = judge(node)
    w.feed([XID_79.strip()])
    w.feed([BANNER.replace("[    0.000000]", "[ 8124.000001]").strip()])
    assert [c["name"] for c in w.failures(None, None, 0)] == ["xid"]
    w.feed(["Jun 21 02:10:01 hgx kernel: Linux version 6.8.0-49-generic (buildd@lcy02-amd64-046) (gcc 13)"])
    assert w.failures(None, None, 0) == []


def test_the_roles_failures_stand_beside_the_watchers_own(node):
    """A verdict of this boot that the role wrote (a check the watcher does not judge, e.g. clocks)
    keeps its failures when the watcher adds an XID: the file never loses a reason."""
    clocks = {"name": "clocks", "status": "fail", "gpus": ["0000:53:00.0"], "reason": "hw_slowdown active",
              "action": "drain and inspect the hardware"}  # fmt: skip
    peermem = {"name": "peermem", "status": "warn", "gpus": [], "reason": "nvidia_peermem is not loaded",
               "action": "fix the node configuration"}  # fmt: skip
    (node / "run" / "gpu-health.json").write_text(
        json.dumps(
            {
                "boot_id": BOOT,
                "passed": False,
                "source": "gpu_health",
                "checks": [clocks],
                "warnings": [peermem],
                "action": "drain and inspect the hardware",
            }  # fmt: skip
        )
    )
    with (node / "kern.log").open("a") as log:
        log.write(XID_79)
    proc = subprocess.run(argv(node, "--no-gpu-poll", "--once"), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdict = json.loads((node / "run" / "gpu-health.json").read_text())
    assert [c["name"] for c in verdict["checks"]] == ["xid", "clocks"], verdict
    assert "xid: XID 79" in verdict["reason"] and "clocks: hw_slowdown active" in verdict["reason"]
    # nor a warning, and it names the strongest action of them all, as the role's verdict does
    assert verdict["warnings"] == [peermem] and verdict["action"] == "drain and inspect the hardware", verdict


def test_a_watchers_verdict_names_its_strongest_action_and_keeps_this_boots_warnings(node):
    """Over a passing verdict of this boot (the role's, with a warning): the warning stays; over
    one of another boot: nothing of it stays."""
    peermem = {"name": "peermem", "status": "warn", "gpus": [], "reason": "nvidia_peermem is not loaded",
               "action": "fix the node configuration"}  # fmt: skip
    path = node / "run" / "gpu-health.json"
    w = judge(node)
    w.feed([XID_79.strip()])
    for boot, kept in ((BOOT, [peermem]), ("an-older-boot", [])):
        path.write_text(json.dumps({"boot_id": boot, "passed": True, "source": "gpu_health", "checks": [],
                                    "warnings": [peermem], "action": "none"}))  # fmt: skip
        w.written = None
        assert w.enforce(w.failures(None, None, 0))
        verdict = json.loads(path.read_text())
        assert verdict["passed"] is False and [c["name"] for c in verdict["checks"]] == ["xid"], verdict
        assert verdict["action"] == "reboot" and verdict["warnings"] == kept, verdict


def test_unknown_error_field_fails(node):
    """A row-remap field nvidia-smi cannot read takes the node out, as a pending remap does."""
    unreadable = H100.replace(
        "        Pending                           : No\n        Remapping",
        "        Pending                           : [Unknown Error]\n        Remapping",
    )
    binary = smi(node, unreadable)
    failed = subprocess.run(argv(node, "--nvidia-smi", str(binary), "--once"), capture_output=True, text=True)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    verdict = json.loads((node / "run" / "gpu-health.json").read_text())
    assert [(c["name"], c["gpus"], c["action"]) for c in verdict["checks"]] == [
        ("readable", ["0000:53:00.0"], "reset the GPU")
    ]
    assert "GPU 0000:53:00.0: Remapped Rows > Pending ([Unknown Error])" in verdict["reason"]


def test_truncated_report_fails(node):
    """A report cut inside a GPU block fails at the first poll (no polls-in-a-row grace)."""
    binary = smi(node, H100[: H100.index("    Fabric\n")])
    failed = subprocess.run(argv(node, "--nvidia-smi", str(binary), "--once"), capture_output=True, text=True)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    (check,) = json.loads((node / "run" / "gpu-health.json").read_text())["checks"]
    assert check["name"] == "nvidia_smi" and "cut short inside the block of GPU 00000000:53:00.0" in check["reason"]


def test_attached_count_mismatch_fails(node):
    binary = smi(
        node,
        H100.replace("Attached GPUs                             : 1", "Attached GPUs                             : 8"),
    )
    failed = subprocess.run(argv(node, "--nvidia-smi", str(binary), "--once"), capture_output=True, text=True)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    (check,) = json.loads((node / "run" / "gpu-health.json").read_text())["checks"]
    assert check["name"] == "nvidia_smi" and "says 8 GPU(s) are attached but prints 1 GPU block(s)" in check["reason"]


def test_injected_banner_is_not_a_boot(node):
    """A root process writing the kernel's banner to /dev/kmsg (stamped when written) does not
    start a boot: the Xid 79 before it still counts."""
    binary = smi(node, H100)
    (node / "kern.log").write_text(BANNER + XID_79 + BANNER.replace("[    0.000000]", "[ 8124.000001]"))
    failed = subprocess.run(argv(node, "--nvidia-smi", str(binary), "--once"), capture_output=True, text=True)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    (check,) = json.loads((node / "run" / "gpu-health.json").read_text())["checks"]
    assert check["name"] == "xid" and "XID 79 on 0000:53:00.0" in check["reason"]


def test_unparseable_xid_is_reported(node):
    binary = smi(node, H100)
    cut = XID_79[: XID_79.index("): ") + 3] + "\n"
    (node / "kern.log").write_text(BANNER + cut)
    failed = subprocess.run(argv(node, "--nvidia-smi", str(binary), "--once"), capture_output=True, text=True)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    (check,) = json.loads((node / "run" / "gpu-health.json").read_text())["checks"]
    assert check["name"] == "xid" and check["action"] == "drain and inspect the hardware"
    assert "unparseable Xid line on 0000:53:00.0" in check["reason"]


# -- a GPU that drops out, nvidia-smi missing or hung, the boot id, a malformed verdict -----------
BDFS = ["0000:53:00.0", "0000:64:00.0"]


def test_a_gpu_that_drops_out_of_the_report_fails(node, started):
    """Without an Xid line: a GPU the node had at the watcher's first report and a later report
    lacks fails `gpu_count` at once (reboot); so does no GPU at all, once there were GPUs."""
    from tests.integration.test_gpu_health_module import report

    pass_marker(node)
    binary = smi(node, report(BDFS))
    proc = started(argv(node, "--nvidia-smi", str(binary), "--gpu-interval", "0.5", "--log-interval", "0.2"))
    calls = node / "nvidia-smi.calls"
    wait_for(lambda: calls.exists() and len(calls.read_text().splitlines()) >= 2, proc, "second poll")
    assert not (node / "run" / "gpu-health.json").exists() and agent(node) == "up"
    (node / "nvidia-smi.txt").write_text(report(BDFS[:1]))
    verdict = wait_for_verdict(node, proc)
    assert [(c["name"], c["gpus"], c["action"]) for c in verdict["checks"]] == [
        ("gpu_count", ["0000:64:00.0"], "reboot")
    ], verdict
    assert "0000:64:00.0 reported earlier this boot are gone" in verdict["reason"]
    assert agent(node).startswith("down #GPU health failed (gpu-health-watch): gpu_count: ")

    w = judge(node)
    from ansible_collections.gpufleet.node.plugins.module_utils.gpu import _nvsmi_q

    assert w.failures(_nvsmi_q.parse_query(report(BDFS))["gpus"], None, 0) == []
    (lost,) = w.failures([], "`nvidia-smi -q` finds no GPU", 1)
    assert (lost["name"], lost["gpus"], lost["action"]) == ("gpu_count", BDFS, "reboot"), lost


def test_fewer_gpus_than_expected_fail_from_the_first_report(node):
    from tests.integration.test_gpu_health_module import report

    binary = smi(node, report(BDFS[:1]))
    failed = subprocess.run(
        argv(node, "--nvidia-smi", str(binary), "--expect-gpu-count", "2", "--once"), capture_output=True, text=True
    )
    assert failed.returncode == 1, failed.stdout + failed.stderr
    (check,) = json.loads((node / "run" / "gpu-health.json").read_text())["checks"]
    assert check["name"] == "gpu_count" and "1 GPU(s) visible to the driver, expected 2" in check["reason"], check


def test_once_with_nvidia_smi_missing_or_hung_fails(node):
    """`--once` has one poll: an nvidia-smi that is not there, or hangs past --timeout, fails
    (no polls-in-a-row grace)."""
    hung = node / "hung-nvidia-smi"
    hung.write_text("#!/bin/sh\nexec sleep 600\n")
    hung.chmod(0o755)
    for binary, words in ((node / "no-such-nvidia-smi", "cannot run"), (hung, "did not finish within 1.0 s")):
        (node / "run" / "gpu-health.json").unlink(missing_ok=True)
        proc = subprocess.run(
            argv(node, "--nvidia-smi", str(binary), "--timeout", "1", "--once"), capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert proc.returncode == 1, proc.stdout + proc.stderr
        (check,) = json.loads((node / "run" / "gpu-health.json").read_text())["checks"]
        assert check["name"] == "nvidia_smi" and words in check["reason"], check


def test_no_nvidia_smi_on_path_keeps_following_the_kernel_log(node, monkeypatch, capsys):
    """No nvidia-smi on PATH is no exit: the GPUs count as unreadable (failing, at once) and the
    kernel log is read all the same."""
    empty = node / "empty-path"
    empty.mkdir()
    monkeypatch.setattr(watch, "search_path", lambda: str(empty))
    (node / "kern.log").write_text(BANNER + XID_79)
    rc = watch.main(
        ["--verdict", str(node / "run" / "gpu-health.json"), "--boot-id", str(node / "boot_id"),
         "--kernel-log", str(node / "kern.log"), "--lib-dir", str(node / "lib"), "--once"]
    )  # fmt: skip
    assert rc == 1, capsys.readouterr().out
    verdict = json.loads((node / "run" / "gpu-health.json").read_text())
    assert [c["name"] for c in verdict["checks"]] == ["xid", "nvidia_smi"], verdict
    assert "nvidia-smi is not on PATH" in verdict["reason"] and "the kernel log is followed" in capsys.readouterr().out
    poller = watch.GpuPoller(watch.load_rules(str(REPO / ".collections")), None, 1, 5)
    poller.poll()
    gpus, error, errors, at_once = poller.latest()
    assert (gpus, errors, at_once) == (None, 1, True) and "nvidia-smi is not on PATH" in error
    assert [c["name"] for c in judge(node).failures(gpus, error, errors, at_once)] == ["nvidia_smi"]


def test_an_unreadable_boot_id_fails_closed_with_a_verdict_that_says_why(node):
    """Unreadable from the start: the verdict names the boot id's problem (the node's agent, which
    reads the same file, answers down), and is bound again once the boot id reads. Unreadable
    later: the verdict carries the boot id read before, which the agent honours."""
    (node / "boot_id").write_text("")
    (node / "kern.log").write_text(BANNER + XID_79)
    proc = subprocess.run(argv(node, "--no-gpu-poll", "--once"), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    path = node / "run" / "gpu-health.json"
    verdict = json.loads(path.read_text())
    assert verdict["boot_id"] is None and [c["name"] for c in verdict["checks"]] == ["xid", "boot_id"], verdict
    assert f"cannot read the boot id at {node / 'boot_id'}: empty" in verdict["reason"]
    assert agent(node).startswith("down #cannot read the boot id")

    w = judge(node)
    w.feed([XID_79.strip()])
    assert w.enforce(w.failures(None, None, 0)) and json.loads(path.read_text())["boot_id"] is None
    (node / "boot_id").write_text(BOOT + "\n")
    w.enforce(w.failures(None, None, 0))
    verdict = json.loads(path.read_text())
    assert verdict["boot_id"] == BOOT and [c["name"] for c in verdict["checks"]] == ["xid"], verdict
    (node / "boot_id").unlink()
    w.feed([XID_79.replace("53:00", "64:00").strip()])
    w.enforce(w.failures(None, None, 0))
    verdict = json.loads(path.read_text())
    assert verdict["boot_id"] == BOOT and len(verdict["checks"]) == 1 and "0000:64:00.0" in verdict["reason"]
    (node / "boot_id").write_text(BOOT + "\n")
    assert agent(node).startswith("down #GPU health failed (gpu-health-watch): xid: ")


MALFORMED = [
    "not json",
    "[]",
    "[" * 100000,
    json.dumps({"boot_id": BOOT, "passed": False, "checks": "xid", "warnings": {"name": "peermem"}}),
    json.dumps(
        {
            "boot_id": BOOT,
            "passed": False,
            "checks": [1, None, {"name": ["x"]}, {"reason": 3, "action": []}],
            "warnings": [None, "w", {"name": {"a": 1}}],
        }
    ),  # fmt: skip
]


@pytest.mark.parametrize("text", MALFORMED, ids=["not-json", "not-an-object", "nested-too-deep", "wrong-types",
                                                 "wrong-records"])  # fmt: skip
def test_a_malformed_previous_verdict_does_not_stop_the_failure_being_written(node, text):
    pass_marker(node)
    path = node / "run" / "gpu-health.json"
    path.write_text(text)
    (node / "kern.log").write_text(BANNER + XID_79)
    proc = subprocess.run(argv(node, "--no-gpu-poll", "--once"), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdict = json.loads(path.read_text())
    assert verdict["boot_id"] == BOOT and verdict["passed"] is False and verdict["checks"][0]["name"] == "xid"
    assert agent(node).startswith("down #GPU health failed (gpu-health-watch): xid: XID 79"), agent(node)


# -- the node's XID history across boots (--history), as installed, --once per boot ----------------
# It records each fatal XID of a boot, holds the node for hardware inspection when the same XID
# hits the same GPU in a second boot, keeps it held in a later boot without the XID, writes the
# history's metrics, fails on a history it cannot read, and lets the node go once the hold is
# cleared (module gpu_health_hold).
def boot(node, boot_id, log):
    """One boot's judgement: its boot id and kernel log, then ``--once``."""
    (node / "boot_id").write_text(boot_id + "\n")
    (node / "kern.log").write_text(log)
    verdict = node / "run" / "gpu-health.json"
    if verdict.exists():
        verdict.unlink()  # /run is empty at each boot
    proc = subprocess.run(
        argv(
            node,
            "--nvidia-smi",
            str(smi(node, H100)),
            "--history",
            str(node / "state" / "gpu-xid-history.json"),
            "--history-metrics",
            str(node / "textfile" / "gpufleet_gpu_health_xid.prom"),
            "--once",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, json.loads(verdict.read_text()) if verdict.exists() else None


def test_the_same_xid_in_two_boots_holds_the_node_until_cleared(node):
    history = node / "state" / "gpu-xid-history.json"
    metrics = node / "textfile" / "gpufleet_gpu_health_xid.prom"
    proc, verdict = boot(node, "boot-1", BANNER + XID_79)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert [c["name"] for c in verdict["checks"]] == ["xid"] and verdict["action"] == "reboot"
    recorded = _history.load(str(history))
    assert [(e["boot_id"], e["gpu"], e["code"]) for e in recorded["events"]] == [("boot-1", "0000:53:00.0", 79)]
    assert recorded["holds"] == [] and "\ngpufleet_gpu_health_hold 0\n" in metrics.read_text()

    proc, verdict = boot(node, "boot-2", BANNER + XID_79)
    assert proc.returncode == 1 and "held for hardware inspection" in proc.stdout, proc.stdout
    assert verdict["action"] == "hardware inspection" and verdict["source"] == "gpu-health-watch"
    assert {c["name"] for c in verdict["checks"]} == {"xid", "xid_recurrence"}
    assert "\ngpufleet_gpu_health_hold 1\n" in metrics.read_text()
    assert 'gpufleet_gpu_health_xid_boots{gpu="0000:53:00.0",code="79"} 2' in metrics.read_text()

    # a boot where the XID did not come back: still held
    proc, verdict = boot(node, "boot-3", BANNER)
    assert proc.returncode == 1, proc.stdout
    assert [c["name"] for c in verdict["checks"]] == ["xid_recurrence"]
    assert verdict["passed"] is False and verdict["action"] == "hardware inspection"
    # the node's HAProxy agent reads the verdict as it is (nccl/_readiness, unchanged) and answers down
    (node / "run" / "nccl-gate.json").write_text(json.dumps({"boot_id": "boot-3", "passed": True}))
    answer = _readiness.agent_answer(str(node / "run" / "nccl-gate.json"), str(node / "boot_id"))
    assert answer.startswith("down #") and "xid_recurrence" in answer, answer

    # the documented clear (module gpu_health_hold), then the next boot is judged afresh
    assert run_module("gpu_health_hold", {"history_path": str(history), "state": "cleared"})["changed"] is True
    proc, verdict = boot(node, "boot-4", BANNER)
    assert proc.returncode == 0 and verdict is None, proc.stdout
    assert "\ngpufleet_gpu_health_hold 0\n" in metrics.read_text()


def test_an_unreadable_history_fails_with_the_file_named(node):
    (node / "state").mkdir()
    (node / "state" / "gpu-xid-history.json").write_text("not json")
    proc, verdict = boot(node, "boot-1", BANNER)
    assert proc.returncode == 1, proc.stdout
    (check,) = verdict["checks"]
    assert check["name"] == "xid_history" and str(node / "state" / "gpu-xid-history.json") in check["reason"]
    assert (node / "state" / "gpu-xid-history.json").read_text() == "not json"  # never overwritten
