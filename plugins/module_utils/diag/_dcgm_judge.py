# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""``dcgmi diag`` judged test by test, and the run that feeds it: one GPU health check per DCGM
test (``dcgm:<DCGM's test name>``), in the vocabulary of ``health/_verdict``.

Plain Python (no Ansible imports), runs on target Python 3.8+. :func:`judge` is a pure function
(the record of ``_dcgm.parse_output`` in, the result out); :func:`measure` runs dcgmi through
``common._proc`` and calls it.

* **Status.** DCGM's ``Fail`` on any GPU fails the test and the run; ``Warn`` warns; ``Skip`` (or
  ``Not Run``) warns, naming DCGM's reason where it gives one: a skipped test verified nothing.
* **Reason.** DCGM's own words: its warnings (with the DCGM error id where the JSON gives one),
  else its info lines for a skip.
* **Action.** From DCGM's message where it names the cause (:data:`MESSAGE_ACTIONS`), else from
  the test (:data:`TEST_ACTIONS`): software and deployment checks call for fixing the node's
  configuration, memory, PCIe and stress tests for draining and inspecting the hardware.
"""

from __future__ import annotations

import re
import time

from ansible_collections.gpufleet.node.plugins.module_utils.common import _proc
from ansible_collections.gpufleet.node.plugins.module_utils.diag import _dcgm
from ansible_collections.gpufleet.node.plugins.module_utils.health import _verdict

NOT_RUN, UNAVAILABLE = "not_run", "unavailable"
OUTPUT_CHECK = "dcgm_output"
ENGINE_HINT = "start the DCGM host engine (systemctl start nvidia-dcgm, or nv-hostengine) and run again"

#: The cause DCGM's message names, first match wins. Row remaps pending clear with a GPU reset
#: (NVIDIA's row remapping guide; the collection's health checks read them the same way); CUDA's
#: "system not yet initialized" is the fabric manager missing on an NVSwitch system (CUDA error
#: 802); persistence mode, and DCGM's own internal errors (a child process that died, output it
#: could not parse), are the node's configuration, not its hardware.
MESSAGE_ACTIONS = (
    (
        re.compile(r"remappings? (?:are|is) pending|pending (?:page )?retirement|retirements? pending", re.I),
        _verdict.RESET_GPU,
    ),
    (re.compile(r"remapping failure|uncorrectable|\bECC\b|row remap", re.I), _verdict.INSPECT),
    (re.compile(r"system not yet initialized", re.I), _verdict.CONFIGURE),
    (re.compile(r"persistence mode", re.I), _verdict.CONFIGURE),
    (re.compile(r"internal error during the test", re.I), _verdict.CONFIGURE),
)

#: DCGM's test names (2.x/3.x and 4.x spellings, lower case) and what a failure of each calls for.
_CONFIGURE_TESTS = (
    "denylist",
    "blacklist",
    "nvml library",
    "cuda main library",
    "cuda toolkit libraries",
    "permissions and os blocks",
    "permissions and os-related blocks",
    "persistence mode",
    "environment variables",
    "environmental variables",
    "graphics processes",
    "software",
    "fabric manager",
)
_INSPECT_TESTS = (
    "page retirement/row remap",
    "inforom",
    "pcie",
    "nvbandwidth",
    "gpu memory",
    "memory",
    "memtest",
    "memory bandwidth",
    "memory_bandwidth",
    "diagnostic",
    "targeted stress",
    "targeted_stress",
    "targeted power",
    "targeted_power",
    "sm stress",
    "sm_stress",
    "pulse test",
    "pulse_test",
    "eud test",
    "eud",
    "cpu_eud",
    "nvlink",
)
TEST_ACTIONS = dict(
    [(t, _verdict.CONFIGURE) for t in _CONFIGURE_TESTS] + [(t, _verdict.INSPECT) for t in _INSPECT_TESTS]
)

_GPU_PREFIX_RE = re.compile(r"^GPU (\d+)\b")


class JudgeError(ValueError):
    """The options cannot be run as given (nothing was run)."""


def check_options(level, gpus, timeout, parameters):
    """Raise JudgeError on options that cannot be run."""
    if level not in _dcgm.LEVELS:
        raise JudgeError("level must be one of 1, 2, 3, 4, got %r" % (level,))
    gpus = gpus or []
    if any(not isinstance(g, int) or isinstance(g, bool) or g < 0 for g in gpus):
        raise JudgeError("gpus must be GPU indices (0 or more), got %r" % (gpus,))
    if len(set(gpus)) != len(gpus):
        raise JudgeError("gpus names a GPU twice: %s" % ", ".join(str(g) for g in gpus))
    if timeout is not None and timeout < 1:
        raise JudgeError("timeout must be at least 1 second, got %r" % (timeout,))
    try:
        _dcgm.render_parameters(parameters)
    except _dcgm.ParameterError as exc:
        raise JudgeError(str(exc)) from None


def timeout_for(level, timeout):
    return timeout if timeout is not None else _dcgm.DEFAULT_TIMEOUTS[level]


# -- the judgement -----------------------------------------------------------------------------
def _action(test, messages):
    """The first rule of :data:`MESSAGE_ACTIONS` each message matches, the strongest over the
    messages; else the test's own action."""
    per_message = []
    for text in messages:
        for rx, action in MESSAGE_ACTIONS:
            if rx.search(text):
                per_message.append(action)
                break
    if per_message:
        return max(per_message, key=_verdict.ACTIONS.index)
    return TEST_ACTIONS.get(test["name"].lower(), _verdict.INSPECT)


def _describe(message):
    if message.get("error_id") is not None:
        return "%s (DCGM error %d)" % (message["message"], message["error_id"])
    return message["message"]


def _gpus_of(test, statuses, all_gpus):
    """The GPUs whose results have one of ``statuses``; a result that names no GPU ("Fail - All")
    stands for every GPU of the run."""
    gpus = set()
    for result in test["results"]:
        if result["status"] in statuses:
            gpus.update(result["gpus"] if result["gpus"] else all_gpus)
    for message in test["warnings"] + [w for r in test["results"] for w in r["warnings"]]:
        match = _GPU_PREFIX_RE.match(message["message"])
        if match:
            gpus.add(int(match.group(1)))
    return sorted(gpus)


def test_check(test, all_gpus):
    """The check record of one parsed DCGM test."""
    name = "dcgm:%s" % test["name"]
    warnings = test["warnings"] + [w for r in test["results"] for w in r["warnings"]]
    texts = [w["message"] for w in warnings]
    described = []
    for w in warnings:
        text = _describe(w)
        if text not in described:
            described.append(text)
    status = test["status"]
    if status == _dcgm.PASS:
        return _verdict.check(name, _verdict.PASS, [], "DCGM passed it")
    if status is None:
        return _verdict.check(
            name,
            _verdict.FAIL,
            [],
            "DCGM's result for it is unreadable (%s): update the collection or read dcgmi's output"
            % ", ".join(repr(r["raw_status"]) for r in test["results"]),
            _verdict.INSPECT,
        )
    if status in (_dcgm.SKIP, _dcgm.NOT_RUN):
        info = test["info"] + [i for r in test["results"] for i in r["info"]]
        why = "; ".join(described + info) or "DCGM gave no reason"
        return _verdict.check(
            name,
            _verdict.WARN,
            _gpus_of(test, (_dcgm.SKIP, _dcgm.NOT_RUN), all_gpus),
            "DCGM %s it: %s" % ("skipped" if status == _dcgm.SKIP else "did not run", why),
            _verdict.CONFIGURE,
        )
    verdict = _verdict.FAIL if status == _dcgm.FAIL else _verdict.WARN
    gpus = _gpus_of(test, (_dcgm.FAIL, _dcgm.WARN), all_gpus)
    reason = "; ".join(described) or "DCGM reports %s without a message" % status
    if status == _dcgm.FAIL and not [r for r in test["results"] if r["status"] == _dcgm.FAIL]:
        reason += " (DCGM failed the test while passing every GPU in it)"
    return _verdict.check(name, verdict, gpus, reason, _action(test, texts))


def _run_gpus(record):
    """Every GPU index the results name."""
    found = set()
    for test in record["tests"]:
        for result in test["results"]:
            found.update(result["gpus"])
    return sorted(found)


def _output_problems(record, gpus, rc, timed_out, timeout, argv):
    """``[(problem, action)]`` about the run and its output as a whole."""
    if timed_out:
        return [
            (_proc.describe_timeout(argv, timeout) + ": a diagnostic that hangs is a GPU to inspect", _verdict.INSPECT)
        ]
    if record["engine_down"]:
        return [
            (
                "dcgmi cannot reach the DCGM host engine (%s): %s" % (record["engine_down"], ENGINE_HINT),
                _verdict.CONFIGURE,
            )
        ]
    problems = [(p, _verdict.INSPECT) for p in record["problems"]]
    if record["runtime_error"]:
        problems.append(("DCGM reports a runtime error: %s" % record["runtime_error"], _verdict.CONFIGURE))
    if not record["tests"] and not problems:
        problems.append(("dcgmi printed no test result", _verdict.INSPECT))
    named = _run_gpus(record)
    if gpus and named and named != sorted(gpus):
        problems.append(
            (
                "DCGM reported GPUs %s where the run asked for %s (results from another GPU set)"
                % (", ".join(map(str, named)) or "none", ", ".join(map(str, sorted(gpus)))),
                _verdict.INSPECT,
            )
        )
    if gpus and record["device_ids"] and len(record["device_ids"]) != len(gpus):
        problems.append(
            (
                "DCGM detected %d GPU(s) where the run asked for %d" % (len(record["device_ids"]), len(gpus)),
                _verdict.INSPECT,
            )
        )
    failed = any(t["status"] == _dcgm.FAIL for t in record["tests"])
    if rc not in (None, 0) and not failed and not problems:
        problems.append(("dcgmi exited %d although no test failed" % rc, _verdict.INSPECT))
    if rc not in (None, 0) and not record["tests"]:
        problems.append(("dcgmi exited %d without a test result" % rc, _verdict.INSPECT))
    return problems


def judge(record, gpus=None, rc=0, timed_out=False, timeout=None, argv=None):
    """``{"passed", "status", "reason", "checks", "tests", "dcgm_version", "driver_version",
    "format"}`` of one parsed run."""
    gpus = list(gpus or [])
    problems = _output_problems(record, gpus, rc, timed_out, timeout, argv or [])
    all_gpus = gpus or _run_gpus(record)
    if problems:
        action = max((a for _p, a in problems), key=_verdict.ACTIONS.index)
        output = _verdict.check(OUTPUT_CHECK, _verdict.FAIL, [], "; ".join(p for p, _a in problems), action)
    else:
        output = _verdict.check(
            OUTPUT_CHECK,
            _verdict.PASS,
            [],
            "dcgmi printed %d test result(s) (%s)" % (len(record["tests"]), record["format"]),
        )
    checks = [output]
    if not (timed_out or record["engine_down"]):
        checks += [test_check(t, all_gpus) for t in record["tests"]]
    passed, failed, warned = _verdict.verdict(checks)
    status, _action_ = _verdict.worst([(c["status"], c["action"]) for c in checks])
    if failed:
        reason = "; ".join("%s: %s" % (c["name"], c["reason"]) for c in checks if c["status"] == _verdict.FAIL)
    elif warned:
        reason = "every DCGM test passed or warned; warnings: " + "; ".join(
            "%s: %s" % (c["name"], c["reason"]) for c in checks if c["status"] == _verdict.WARN
        )
    else:
        reason = "every DCGM test passed"
    return {
        "passed": passed,
        "status": status,
        "reason": reason,
        "checks": checks,
        "tests": record["tests"],
        "dcgm_version": record["dcgm_version"],
        "driver_version": record["driver_version"],
        "format": record["format"],
    }


# -- the run -----------------------------------------------------------------------------------
def base_result(cmd, level):
    return {
        "changed": False,
        "available": True,
        "cmd": cmd,
        "level": level,
        "dcgm_version": None,
        "driver_version": None,
        "format": None,
        "tests": [],
        "checks": [],
        "passed": False,
        "status": _verdict.FAIL,
        "reason": None,
        "duration_s": 0.0,
    }


def unavailable(reason, level):
    """The result when there is no dcgmi to run: never passed."""
    result = base_result(None, level)
    result.update(available=False, status=UNAVAILABLE, reason=reason)
    return result


def not_run(binary, level, gpus=None, parameters=None):
    """The check-mode result: nothing was run."""
    result = base_result(_dcgm.build_argv(binary, level, gpus, parameters), level)
    result.update(
        passed=None,
        status=NOT_RUN,
        reason="check mode: dcgmi diag was not run (its tests load the GPUs, which a drift check on a serving"
        " node must not do); cmd is the command a real run would run",
    )
    return result


def measure(binary, level, gpus, parameters, timeout, run):
    """Run ``dcgmi diag`` and judge it. ``run(argv, timeout)`` returns ``(rc, output, timed_out,
    seconds)`` (:func:`run_bounded`). ``stdout`` is in the result when it did not pass."""
    argv = _dcgm.build_argv(binary, level, gpus, parameters)
    limit = timeout_for(level, timeout)
    rc, out, timed_out, seconds = run(argv, limit)
    record = _dcgm.parse_output(out)
    result = base_result(argv, level)
    result.update(judge(record, gpus, rc, timed_out, limit, argv))
    result["duration_s"] = round(seconds, 3)
    if rc is not None:
        result["rc"] = rc
    result["timestamp"] = time.time()
    if not result["passed"]:
        result["stdout"] = out
    return result


def run_bounded(argv, timeout):
    """One run through ``common._proc`` (own process group, killed on expiry; stderr merged)."""
    outcome = _proc.run(argv, timeout, merge_stderr=True)
    return outcome.rc, outcome.stdout, outcome.timed_out, outcome.seconds


def failure_message(result):
    return "DCGM diagnostic (level %s) judged the node unhealthy on `%s`: %s" % (
        result["level"],
        " ".join(result["cmd"] or []),
        result["reason"],
    )
