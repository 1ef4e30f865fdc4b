# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One nvbandwidth run: the ``--help`` probe that decides the format, the bounded run, its result
(judged by ``_copy_judge``), and the results of a run that did not happen (no binary, check mode).

Plain Python (no Ansible imports), runs on target Python 3.8+.
"""

from __future__ import annotations

import time

from ansible_collections.gpufleet.node.plugins.module_utils.common import _proc
from ansible_collections.gpufleet.node.plugins.module_utils.diag import _copy_judge, _nvbandwidth
from ansible_collections.gpufleet.node.plugins.module_utils.health import _verdict

#: Result statuses besides the check ones (pass/warn/fail).
NOT_RUN, UNAVAILABLE = "not_run", "unavailable"

#: nvbandwidth numbers devices as CUDA does; with this CUDA numbers them in PCI bus order, as NVML
#: and nvidia-smi (and so the topology facts) do.
RUN_ENVIRONMENT = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
HELP_TIMEOUT = 60


def base_result(cmd, fmt=None):
    return {
        "changed": False,
        "available": True,
        "cmd": cmd,
        "version": None,
        "format": fmt,
        "matrices": {},
        "cells": [],
        "slow_cells": [],
        "checks": [],
        "passed": False,
        "status": _verdict.FAIL,
        "reason": None,
        "duration_s": 0.0,
    }


def unavailable(reason):
    """The result when there is no binary to run: never passed."""
    result = base_result(None)
    result.update(available=False, status=UNAVAILABLE, reason=reason)
    return result


def not_run(binary, testcases, buffer_size=None, iterations=None):
    """The check-mode result: nothing was run."""
    result = base_result(_nvbandwidth.build_argv(binary, testcases, False, buffer_size, iterations))
    result.update(
        passed=None,
        status=NOT_RUN,
        reason="check mode: nvbandwidth was not run (it loads every copy engine of every GPU, which a drift"
        " check on a serving node must not do); cmd is the text-mode command, -j is added when the"
        " binary's --help lists --json",
    )
    return result


def _failed(result, text):
    result.update(
        passed=False,
        status=_verdict.FAIL,
        reason=text,
        checks=[_verdict.check("nvbandwidth_output", _verdict.FAIL, [], text, _verdict.CONFIGURE)],
    )
    return result


def measure(binary, p, run):
    """Probe ``binary --help``, run the testcases of ``p`` (the module's parameters), judge.

    ``run(argv, timeout, environment)`` returns ``(rc, output, timed_out, seconds)``
    (:func:`run_bounded`). Returns the result; ``stdout`` is in it when the run failed."""
    testcases = list(p["testcases"])
    help_argv = [binary, "--help"]
    rc, out, timed_out, help_seconds = run(help_argv, min(HELP_TIMEOUT, p["timeout"]), RUN_ENVIRONMENT)
    result = base_result(help_argv)
    result["duration_s"] = round(help_seconds, 3)
    if timed_out:
        return _failed(result, _proc.describe_timeout(help_argv, min(HELP_TIMEOUT, p["timeout"])))
    caps = _nvbandwidth.parse_help(out)
    if not caps["nvbandwidth"]:
        return _failed(
            dict(result, stdout=out),
            "`%s --help` (exit %s) printed no nvbandwidth option list: is %s nvbandwidth? (%s)"
            % (binary, rc, binary, (out or "").strip()[-300:] or "no output"),
        )
    missing = [
        flag
        for flag, wanted, have in (
            ("-t/--testcase", True, caps["testcase"]),
            ("--bufferSize", p.get("buffer_size") is not None, caps["buffer_size"]),
            ("--testSamples", p.get("iterations") is not None, caps["test_samples"]),
        )
        if wanted and not have
    ]
    if missing:
        return _failed(
            result,
            "%s (%s) has no %s option: install a newer nvbandwidth (github.com/NVIDIA/nvbandwidth) or leave the"
            " option out" % (binary, caps["version"] or "version unknown", ", ".join(missing)),
        )
    fmt = "json" if caps["json"] else "text"
    argv = _nvbandwidth.build_argv(binary, testcases, caps["json"], p.get("buffer_size"), p.get("iterations"))
    rc, out, timed_out, seconds = run(argv, p["timeout"], RUN_ENVIRONMENT)
    parsed = _nvbandwidth.parse_output(out, fmt)
    run_problems = []
    if timed_out:
        run_problems.append((_proc.describe_timeout(argv, p["timeout"]), _verdict.INSPECT))
    elif rc != 0:
        # its own error lines; without any, what it printed last (a CUDA failure before any testcase)
        last = [e for entry in parsed["testcases"].values() for e in entry["errors"]] + parsed["errors"]
        last = last or parsed["other_lines"]
        run_problems.append(
            (
                "nvbandwidth exited %d%s" % (rc, ": " + last[-1] if last else ""),
                _verdict.INSPECT,
            )
        )
    judged = _copy_judge.judge(
        parsed,
        testcases,
        p.get("topology") or {},
        p["threshold_fraction"],
        p.get("peer_medians") or {},
        p["baseline_fraction"],
        p.get("acs"),
        run_problems,
    )
    result = base_result(argv, fmt)
    result.update(judged)
    result["duration_s"] = round(help_seconds + seconds, 3)
    if rc is not None:
        result["rc"] = rc
    result["timestamp"] = time.time()
    if not judged["passed"]:
        result["stdout"] = out
    return result


def run_bounded(argv, timeout, environment):
    """One run through ``common._proc`` (own process group, killed on expiry; stderr merged into
    stdout, where nvbandwidth's error lines belong to the testcase they interrupt)."""
    outcome = _proc.run(argv, timeout, environment, merge_stderr=True)
    return outcome.rc, outcome.stdout, outcome.timed_out, outcome.seconds


def failure_message(result):
    return "nvbandwidth copy matrix judged unhealthy on `%s`: %s" % (" ".join(result["cmd"] or []), result["reason"])
