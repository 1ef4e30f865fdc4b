# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet-gpu-health-watch: takes a serving node out of rotation when a GPU fails.

Run by gpufleet-gpu-health-watch.service (installed by the gpufleet.node.gpu_health role). It
follows this boot's kernel log (``journalctl -k -b -f``, or a file such as a lab machine's) for
NVRM Xid and NVSwitch SXid lines, and polls ``nvidia-smi -q`` every few seconds for pending or
failed row remapping, pending page retirement, volatile uncorrectable ECC errors and health
facts it cannot read (``[Unknown Error]``). The checks
are gpufleet.node's own (module_utils ``health/``: the XID table and the kernel-log parser of
``_kernel_log``, the row-remap, ECC and retired-page checks of ``_checks``, with the gpu_health
role's thresholds).

On a failure it writes the GPU health verdict of this boot (``passed: false``, the failed checks
with their reasons and actions) atomically to ``--verdict`` and logs why. The node's HAProxy
agent (``nccl/_readiness``, the same rule as ``node_readiness_info``) then answers ``down``: the
balancer stops sending traffic at its next agent check. Nothing is restarted. The watcher never
writes a pass: the gpu_health role does, when it judges the node again (boot validation).

With ``--history`` it records each fatal XID of this boot in the node's XID history across boots
(``health/_history``, the same record and rules as the role's check): the same fatal XID on the
same GPU in ``--recurrence-boots`` boots holds the node for hardware inspection, the same fatal
XID on every GPU is a software or driver event; the history's metrics go to ``--history-metrics``.

Kernel events are final for the boot (as for the role's check); the GPU conditions are judged as
they are now. A verdict rewritten by someone else while a failure stands is written again.

    python3 /usr/local/lib/gpufleet/gpu-health-watch/gpufleet_gpu_health_watch.py \\
        --verdict /run/gpufleet/gpu-health.json [--kernel-log FILE] [--nvidia-smi PATH] [--once]

Exit status: 0 (``--once``: no failure), 1 (``--once``: a failure, verdict written), 2 (bad
arguments or the collection's code missing beside this file).
"""

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
import types

#: The collection's module_utils, as the role copies them into the lib dir.
TREE = "ansible_collections/gpufleet/node/plugins/module_utils"


def log(message):
    print(message, flush=True)


def load_rules(lib_dir):
    """The collection's health rules (``health/``: ``_checks``, ``_kernel_log``, ``_thresholds``,
    ``_verdict``) and what the watcher needs besides (``_atomic``, ``_proc``, ``_nvsmi``,
    ``_nvsmi_q``, ``_readiness``), imported by their collection names (as a module imports them)
    from the copy of the collection's module_utils the role installs under ``lib_dir`` (no Ansible
    needed)."""
    lib_dir = os.path.abspath(lib_dir)
    if not os.path.isdir(os.path.join(lib_dir, TREE)):
        raise ImportError("no %s under %s" % (TREE, lib_dir))
    if lib_dir not in sys.path:
        sys.path.insert(0, lib_dir)
    from ansible_collections.gpufleet.node.plugins.module_utils.common import _atomic, _proc
    from ansible_collections.gpufleet.node.plugins.module_utils.gpu import _nvsmi, _nvsmi_q
    from ansible_collections.gpufleet.node.plugins.module_utils.health import (
        _checks,
        _history,
        _kernel_log,
        _thresholds,
        _verdict,
    )
    from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _readiness

    return types.SimpleNamespace(
        _history=_history,
        _atomic=_atomic,
        _proc=_proc,
        _nvsmi=_nvsmi,
        _nvsmi_q=_nvsmi_q,
        _checks=_checks,
        _kernel_log=_kernel_log,
        _thresholds=_thresholds,
        _verdict=_verdict,
        _readiness=_readiness,
    )


class FileLog:
    """New complete lines of a kernel-log file, from its start. A file that is replaced or shrinks
    is read again from its start: when it starts with the line the file started with before, it
    is the same log written again whole (``reset``: judge it anew); when it starts otherwise it
    was rotated (logrotate's new file, or one emptied by copytruncate) and continues the log, so
    the events of this boot read so far stand."""

    def __init__(self, path):
        self.path = path
        self.handle = None
        self.inode = None
        self.partial = ""
        self.first = None  # the first line of the file, once read
        self.at_start = False  # no complete line of the open file read yet
        self.reopened = False  # the file was replaced or shrank since its first line was read

    def read(self):
        """``(lines, reset)``."""
        try:
            st = os.stat(self.path)
        except OSError:
            return [], False
        if self.handle is not None and (st.st_ino != self.inode or st.st_size < self.handle.tell()):
            self.handle.close()
            self.handle = None
            self.reopened = self.first is not None
        if self.handle is None:
            try:
                self.handle = open(self.path, "rb")
            except OSError:
                return [], False
            self.inode = st.st_ino
            self.partial = ""
            self.at_start = True
        data = self.handle.read()
        if not data:
            return [], False
        text = self.partial + data.decode("utf-8", "replace")
        lines = text.split("\n")
        self.partial = lines.pop()
        reset = False
        if lines and self.at_start:
            self.at_start = False
            if self.reopened:
                reset = lines[0] == self.first
                log(
                    "the kernel log %s was written again from its first line: judged anew" % self.path
                    if reset
                    else "the kernel log %s was rotated: the events of this boot read so far stand" % self.path
                )
            self.first, self.reopened = lines[0], False
        return lines, reset


class JournalLog:
    """This boot's kernel messages from ``journalctl -k -b -f -n all`` (the whole boot first, then
    each new one), read by a thread; journalctl is started again if it exits."""

    def __init__(self, journalctl):
        self.argv = [journalctl, "-k", "-b", "-f", "-n", "all", "-o", "short-precise", "--no-pager"]
        self.lines = queue.Queue()
        thread = threading.Thread(target=self._follow, name="journal", daemon=True)
        thread.start()

    def _follow(self):
        while True:
            try:
                proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    env=dict(os.environ, LC_ALL="C"),
                )
            except OSError as exc:
                log("cannot run %s: %s; trying again in 10 s" % (self.argv[0], exc))
                time.sleep(10)
                continue
            for raw in proc.stdout:
                self.lines.put(raw.decode("utf-8", "replace").rstrip("\n"))
            proc.wait()
            log("`%s` exited %s; following the kernel log again" % (" ".join(self.argv), proc.returncode))
            time.sleep(2)

    def read(self):
        lines = []
        while True:
            try:
                lines.append(self.lines.get_nowait())
            except queue.Empty:
                return lines, False


class JournalBoot:
    """This boot's kernel messages so far (``journalctl -k -b``), for ``--once``."""

    def __init__(self, rules, journalctl, timeout):
        self.rules, self.timeout = rules, timeout
        self.argv = [journalctl, "-k", "-b", "-o", "short-precise", "--no-pager"]

    def read(self):
        result = self.rules._proc.run(self.argv, self.timeout, environment={"LC_ALL": "C"})
        if result.timed_out or result.rc != 0:
            raise SystemExit("`%s` failed: %s" % (" ".join(self.argv), (result.stderr or "timed out").strip()))
        return (result.stdout or "").splitlines(), False


class GpuPoller:
    """``nvidia-smi -q`` every ``interval`` seconds in a thread (a slow or hung nvidia-smi never
    delays the kernel log); ``latest()`` is ``(gpus, error, consecutive errors, whether the error
    fails at once)`` of the last poll. An error fails at once when no later poll can mend it: a
    report that came back but cannot be trusted, an nvidia-smi that is not there or cannot run.
    ``gpus`` is ``[]`` (with its error) when nvidia-smi finds no GPU. ``binary`` None: nvidia-smi
    is looked up on PATH at each poll."""

    def __init__(self, rules, binary, interval, timeout):
        self.rules, self.binary, self.interval, self.timeout = rules, binary, interval, timeout
        self.lock = threading.Lock()
        self.state = (None, None, 0, False)
        self.polled = threading.Event()

    def start(self):
        threading.Thread(target=self._loop, name="nvidia-smi", daemon=True).start()

    def _loop(self):
        while True:
            started = time.monotonic()
            self.poll()
            time.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    def poll(self):
        gpus, error, malformed = self._query()
        with self.lock:
            errors = self.state[2]
            self.state = (gpus, error, errors + 1 if error else 0, malformed)
        self.polled.set()

    def _query(self):
        rules = self.rules
        binary = self.binary or find_nvidia_smi()
        if binary is None:
            return None, "nvidia-smi is not on PATH (%s): the GPUs cannot be read" % search_path(), True
        argv = [binary, "-q"]
        try:
            result = rules._proc.run(argv, self.timeout, environment={"LC_ALL": "C"})
        except (FileNotFoundError, PermissionError) as exc:
            return None, "cannot run %s: %s" % (binary, exc), True
        except OSError as exc:
            return None, "cannot run %s: %s" % (binary, exc), False
        if result.timed_out:
            return None, rules._proc.describe_timeout(argv, self.timeout), False
        text = (result.stdout or "") + "\n" + (result.stderr or "")
        try:
            rules._nvsmi.check_failure(text)
            if rules._nvsmi.no_devices(text):
                return [], "`%s` finds no GPU" % " ".join(argv), False
            if result.rc != 0:
                return None, "`%s` exited %s: %s" % (" ".join(argv), result.rc, text.strip()[-300:]), False
        except rules._nvsmi.NvidiaSmiError as exc:
            return None, str(exc), False
        try:
            return rules._nvsmi_q.parse_query(result.stdout)["gpus"], None, False
        except rules._nvsmi.NvidiaSmiParseError as exc:
            # nvidia-smi exited 0 with a report cut short or not whole: no pass, at once.
            return None, "cannot read the output of `%s`: %s" % (" ".join(argv), exc), True

    def latest(self):
        with self.lock:
            return self.state


class Watch:
    """The judgement: fatal kernel events of this boot, and the GPUs as last polled."""

    def __init__(self, rules, args):
        self.rules, self.args = rules, args
        self.xids, self.sxids = {}, {}
        self.carry = []
        self.bus_ids = []
        self.known = set()  # every GPU nvidia-smi has reported since the watcher started
        self.written = None  # the failures of the verdict last written
        self.wrote = None  # that verdict's text, and the text it replaced (None: no file)
        self.replaced = None
        self.earlier_boot = False  # events forgotten because the log showed a later boot start
        self.boot_id = None  # the last boot id read
        self.boot_id_problem = None
        self.warned = set()
        self.history_metrics = None  # the history's metrics last written
        self.history_problem = None

    def forget(self):
        self.xids, self.sxids, self.carry = {}, {}, []

    def feed(self, lines, reset=False):
        """Take new kernel-log lines (``reset``: the log was written again whole, judge it anew).
        A boot start among them (``_kernel_log.is_boot_start``: the kernel's own banner, or
        journalctl's boot separator) ends the boot of every event read before it."""
        if reset:
            self.forget()
        if not lines:
            return
        starts = [n for n, line in enumerate(lines) if self.rules._kernel_log.is_boot_start(line)]
        if starts:
            if self.xids or self.sxids:
                log(
                    "a boot starts in the kernel log (%s): the events read before it are an earlier boot's"
                    % lines[starts[-1]].strip()[:120]
                )
                self.earlier_boot = True
            self.forget()
            lines = lines[starts[-1] :]
        # A few lines of the previous read go again: the loss of a GPU is printed over several
        # lines; events seen twice count once.
        xids, sxids = self.rules._kernel_log.parse_kernel_log("\n".join(self.carry + lines))
        self.carry = (self.carry + lines)[-4:]
        for store, events in ((self.xids, xids), (self.sxids, sxids)):
            for event in events:
                # A line the parser cannot read (code None) counts by its text.
                code = event["code"] if event["code"] is not None else event["message"]
                store.setdefault((event["bdf"], code), event)

    def failures(self, gpus, error, errors, at_once=False):
        """The failed checks of the kernel events so far and of the last poll (``gpus``, its
        ``error``, ``errors`` failed polls in a row, ``at_once``: an error no later poll mends).
        ``--once`` has one poll: any error of it fails."""
        checks, kernel_log, verdict = self.rules._checks, self.rules._kernel_log, self.rules._verdict
        if gpus:
            self.bus_ids = [g["bus_id"] for g in gpus]
        # Fatal and other events judged apart: the verdict's reason names the fatal ones only.
        codes = self.args.sxid_fatal_code
        fatal_xids = [e for e in self.xids.values() if kernel_log.xid_verdict(e)[0] == verdict.FAIL]
        fatal_sxids = [e for e in self.sxids.values() if kernel_log.sxid_verdict(e, codes)[0] == verdict.FAIL]
        judged = [
            checks.check_xid([e for e in self.xids.values() if e not in fatal_xids], self.bus_ids),
            checks.check_sxid([e for e in self.sxids.values() if e not in fatal_sxids], codes),
            checks.check_xid(fatal_xids, self.bus_ids),
            checks.check_sxid(fatal_sxids, codes),
        ]
        expected = self.args.expect_gpu_count
        # No GPU reported at all counts as the loss of GPUs once the node had some (or a count is
        # expected); before that it is an nvidia-smi error like any other.
        if gpus is not None and (gpus or self.known or expected is not None):
            judged += [
                checks.check_row_remap(gpus),
                checks.check_ecc(gpus, self.args.ecc_volatile_uncorrectable_max),
                checks.check_retired_pages(gpus, self.args.retired_pages_max),
                checks.check_readable(gpus),
                checks.check_gpus_kept(gpus, self.known, expected),
            ]
            self.known.update(g["bus_id"] for g in gpus)
        elif error and (at_once or self.args.once or errors >= self.args.nvidia_smi_failures):
            judged.append(
                verdict.check(
                    "nvidia_smi",
                    verdict.FAIL,
                    [],
                    error if at_once or errors <= 1 else "%s (%d polls in a row)" % (error, errors),
                    verdict.REBOOT,
                )
            )
        judged += self.judge_history(fatal_xids)
        for c in judged:
            if c["status"] == verdict.WARN and (c["name"], c["reason"]) not in self.warned:
                self.warned.add((c["name"], c["reason"]))
                log("GPU health warning, the node stays in rotation: %s: %s" % (c["name"], c["reason"]))
        return [c for c in judged if c["status"] == verdict.FAIL]

    def judge_history(self, fatal_xids):
        """The failed checks of the node's XID history (``--history``), with this boot's fatal Xid
        events recorded there first (written when they add to it); a history that cannot be read
        fails (the node's hold would be lost)."""
        if not self.args.history:
            return []
        history, verdict = self.rules._history, self.rules._verdict
        path = self.args.history
        try:
            record = history.load(path)
        except history.HistoryError as exc:
            if str(exc) != self.history_problem:
                self.history_problem = str(exc)
                log(str(exc))
            return [verdict.check("xid_history", verdict.FAIL, [], str(exc), verdict.INSPECT)]
        self.history_problem = None
        boot_id, _problem = self.read_boot_id()
        if boot_id is None:
            # Not bound to a boot, the events cannot be counted by boot; the boot_id check says why.
            return history.judge(record, None)
        record, changed = history.observe(
            record, boot_id, list(fatal_xids), sorted(self.known | set(self.bus_ids)), boots=self.args.recurrence_boots
        )
        if changed:
            self.rules._atomic.write(path, history.dump(record))
            for h in record["holds"]:
                log(
                    "XID %d on %s in %d boots: the node is held for hardware inspection until the hold is cleared"
                    % (h["code"], h["gpu"], len(h["boots"]))
                )
        metrics = history.textfile(record, boot_id)
        if self.args.history_metrics and metrics != self.history_metrics:
            self.rules._atomic.write(self.args.history_metrics, metrics)
            self.history_metrics = metrics
        return history.judge(record, boot_id)

    def read_boot_id(self):
        """``(boot id, problem)``: the boot id now, else the one read last (a boot id does not
        change while the watcher runs: a reboot starts it again) with why it could not be read."""
        path = self.args.boot_id
        try:
            self.boot_id = self.rules._readiness.read_boot_id(path)
        except OSError as exc:
            return self.boot_id, "cannot read the boot id at %s: %s" % (path, exc.strerror or exc)
        return self.boot_id, None

    def read_current(self):
        """``(verdict, text)`` of the verdict file now: a malformed one is no verdict (it is
        replaced), ``text`` None when there is no file."""
        path = self.args.verdict
        try:
            with open(path, "rb") as handle:
                text = handle.read().decode("utf-8", "replace")
        except OSError:
            text = None
        try:
            current, problem = self.rules._readiness.read_health(path)
        except RecursionError:
            current, problem = None, "unreadable GPU health verdict at %s: nested too deep" % path
        if problem:
            log("the GPU health verdict at %s is replaced: %s" % (path, problem))
        return current, text

    def enforce(self, failed):
        """Write the failing verdict when there is a failure and the file does not say so; take
        the watcher's own verdict back when its only failures were an earlier boot's events."""
        if not failed:
            if self.earlier_boot and self.written is not None:
                self.withdraw()
            self.earlier_boot = False
            return False
        self.earlier_boot = False
        rules, path = self.rules, self.args.verdict
        current, text = self.read_current()
        boot_id, problem = self.read_boot_id()
        if problem != self.boot_id_problem:
            self.boot_id_problem = problem
            if problem:
                log(
                    "%s; the verdict is bound to %s"
                    % (problem, "the boot id read before, %s" % boot_id if boot_id else "no boot: fix the file")
                )
        if boot_id is None:
            # Unreadable from the start: the verdict says why. The node's HAProxy agent reads the
            # same file and answers `down` (boot-id-unreadable) while it cannot read it either; a
            # verdict is bound again, and written again, as soon as the boot id reads.
            failed = failed + [
                rules._verdict.check(
                    "boot_id",
                    rules._verdict.FAIL,
                    [],
                    "%s: this verdict is bound to no boot, and the node's readiness rule counts a verdict "
                    "of the current boot only; make the boot id readable" % problem,
                    rules._verdict.INSPECT,
                )
            ]
        summary = [(c["name"], c["reason"]) for c in failed]
        if (
            current
            and current.get("boot_id") == boot_id
            and current.get("passed") is False
            and current.get("source") == rules._verdict.WATCH_SOURCE
            and self.written == summary
        ):
            return True
        # The failures of this boot that the watcher does not judge (the role's full check: clocks,
        # AER, fabric, ...) stand beside its own until the role judges the node again.
        # Its warnings stay too, and the verdict names the strongest action, as the role's does.
        own = [c["name"] for c in failed]
        standing, warnings = [], []
        if current and current.get("boot_id") == boot_id:
            warnings = [w for w in records(current.get("warnings")) if w.get("name") not in own]
            if current.get("passed") is False:
                standing = [c for c in records(current.get("checks")) if c.get("name") not in own]
        verdict = rules._verdict.record(
            boot_id, failed + standing, warnings, rules._verdict.WATCH_SOURCE, timestamp=round(time.time(), 3)
        )
        new = json.dumps(verdict, indent=2, sort_keys=True) + "\n"
        if text != self.wrote:
            self.replaced = text
        rules._atomic.write(path, new)
        self.wrote = new
        if self.written != summary:
            for c in failed:
                log(
                    "GPU health failed, taking the node out of rotation: %s: %s (action: %s)"
                    % (c["name"], c["reason"], c["action"])
                )
        else:
            log("GPU health verdict at %s was rewritten while the failure stands; written again" % path)
        self.written = summary
        return True

    def withdraw(self):
        """Put back what the watcher's verdict replaced (or remove it where there was none), when
        the file still holds that verdict."""
        path = self.args.verdict
        _current, text = self.read_current()
        if text != self.wrote:
            log(
                "the failures of the verdict at %s were an earlier boot's; the file changed since: left as it is" % path
            )
        elif self.replaced is None:
            os.unlink(path)
            log("the failures the watcher wrote were an earlier boot's: its verdict at %s is removed" % path)
        else:
            self.rules._atomic.write(path, self.replaced)
            log("the failures the watcher wrote were an earlier boot's: the verdict it replaced is back at %s" % path)
        self.written = self.wrote = self.replaced = None


def records(value):
    """The check records of a verdict's list (``checks``, ``warnings``) that are objects: a
    malformed previous verdict is carried over as far as it can be, never a crash."""
    return [c for c in value if isinstance(c, dict)] if isinstance(value, list) else []


def search_path():
    return os.environ.get("PATH", "") + ":/usr/bin:/usr/local/bin"


def find_nvidia_smi():
    return shutil.which("nvidia-smi", path=search_path())


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verdict", required=True, help="the GPU health verdict file (JSON, under /run)")
    parser.add_argument("--boot-id", default="/proc/sys/kernel/random/boot_id")
    parser.add_argument("--kernel-log", help="a file of kernel messages to follow instead of journalctl -k")
    parser.add_argument("--nvidia-smi", help="nvidia-smi (default: looked up on PATH)")
    parser.add_argument(
        "--lib-dir",
        default=os.path.dirname(os.path.abspath(__file__)),
        help="where the role installed the collection's module_utils tree (%s; default: beside this file)" % TREE,
    )
    parser.add_argument("--log-interval", type=float, default=1.0, help="seconds between reads of the kernel log")
    parser.add_argument("--gpu-interval", type=float, default=5.0, help="seconds between nvidia-smi polls")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds one nvidia-smi may take")
    parser.add_argument(
        "--nvidia-smi-failures", type=int, default=3, help="nvidia-smi polls failing in a row that take the node out"
    )
    parser.add_argument(
        "--ecc-volatile-uncorrectable-max", type=int, help="default: gpu_health_info's (_thresholds.DEFAULT_THRESHOLDS)"
    )
    parser.add_argument("--retired-pages-max", type=int, help="default: gpu_health_info's")
    parser.add_argument("--sxid-fatal-code", type=int, action="append", default=[])
    parser.add_argument(
        "--expect-gpu-count", type=int, help="GPUs nvidia-smi must report (default: those it reported first)"
    )
    parser.add_argument("--history", help="the node's XID history across boots (JSON, persistent storage)")
    parser.add_argument("--history-metrics", help="the textfile the history's metrics are written to")
    parser.add_argument(
        "--recurrence-boots",
        type=int,
        default=2,
        help="boots with the same fatal XID on the same GPU that hold the node for hardware inspection",
    )
    parser.add_argument("--no-gpu-poll", action="store_true", help="follow the kernel log only")
    parser.add_argument("--once", action="store_true", help="judge once (whole log, one poll) and exit")
    args = parser.parse_args(argv)
    if args.log_interval <= 0 or args.gpu_interval <= 0 or args.timeout <= 0 or args.nvidia_smi_failures < 1:
        parser.error("intervals and --timeout must be positive, --nvidia-smi-failures at least 1")
    if args.recurrence_boots < 1:
        parser.error("--recurrence-boots must be at least 1")
    if args.expect_gpu_count is not None and args.expect_gpu_count < 1:
        parser.error("--expect-gpu-count must be at least 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        rules = load_rules(args.lib_dir)
    except ImportError as exc:
        log(
            "cannot load gpufleet.node's health rules from %s: %s (the gpu_health role installs them)"
            % (args.lib_dir, exc)
        )
        return 2
    for name in ("ecc_volatile_uncorrectable_max", "retired_pages_max"):
        if getattr(args, name) is None:
            setattr(args, name, rules._thresholds.DEFAULT_THRESHOLDS[name])
    source = FileLog(args.kernel_log) if args.kernel_log else None
    if source is None:
        journalctl = shutil.which("journalctl")
        if journalctl is None:
            log("journalctl is not installed: give --kernel-log FILE")
            return 2
        source = JournalBoot(rules, journalctl, args.timeout) if args.once else JournalLog(journalctl)
    poller = None
    if not args.no_gpu_poll:
        binary = args.nvidia_smi or find_nvidia_smi()
        if binary is None:
            log(
                "nvidia-smi is not on PATH (%s): the GPUs count as unreadable (failing) until it is; the kernel "
                "log is followed all the same (give --nvidia-smi PATH, or --no-gpu-poll)" % search_path()
            )
        poller = GpuPoller(rules, args.nvidia_smi, args.gpu_interval, args.timeout)
    watch = Watch(rules, args)
    log(
        "watching %s%s; verdict at %s"
        % (
            args.kernel_log or "the kernel journal of this boot",
            " and `%s -q` every %g s" % (poller.binary or "nvidia-smi", args.gpu_interval) if poller else "",
            args.verdict,
        )
    )
    if args.once:
        watch.feed(*source.read())
        if poller:
            poller.poll()
        failed = watch.failures(*(poller.latest() if poller else (None, None, 0, False)))
        return 1 if watch.enforce(failed) else 0
    if poller:
        poller.start()
    while True:
        watch.feed(*source.read())
        watch.enforce(watch.failures(*(poller.latest() if poller else (None, None, 0, False))))
        time.sleep(args.log_interval)


if __name__ == "__main__":
    sys.exit(main())
