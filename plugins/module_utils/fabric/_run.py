# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One fabric health run, start to end: read sysfs (twice, some seconds apart), fill what it
lacked from the tools, compare the counters with this run's first read and the previous run's
record, judge, and write the new record.

Plain Python (no Ansible imports), runs on target Python 3.8+. The module
``rdma_health_info`` passes its options and the effects it owns (running a tool); the sleep and
the clocks are parameters so that a test runs the whole of it without waiting.
"""

from __future__ import annotations

import math
import time

from ansible_collections.gpufleet.node.plugins.module_utils.fabric import _collect, _judge, _record, _sysfs, _thresholds
from ansible_collections.gpufleet.node.plugins.module_utils.health import _verdict


class FabricError(Exception):
    """The run cannot start or read at all; the message says what and what to do."""


def options(params):
    """The judge's options from the module's parameters; :class:`FabricError` for values that
    cannot be judged against."""
    expect = dict(params.get("expect") or {})
    if expect.get("ports") is not None and expect["ports"] < 0:
        raise FabricError("expect.ports must be 0 or more, not %d" % expect["ports"])
    rate = expect.get("rate_gbps")
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise FabricError("expect.rate_gbps must be a rate above 0 Gb/s, not %r" % rate)
    interval = params.get("sample_interval") or 0
    if not (interval >= 0 and math.isfinite(interval)):
        raise FabricError("sample_interval must be 0 or more seconds, not %r" % interval)
    try:
        limits = _thresholds.limits(params.get("counter_limits"))
    except ValueError as exc:
        raise FabricError(str(exc)) from None
    return {"expect": expect, "devices": list(params.get("devices") or []), "limits": limits}


def _record_check(status, reason):
    return _judge.check("record", status, [], reason, _verdict.CONFIGURE)


def _load_record(path, now, checks):
    if not path:
        return None, None
    try:
        record = _record.load(path)
    except _record.RecordError as exc:
        checks.append(
            _record_check(
                _verdict.FAIL,
                "%s: the counters' growth since the last run was not judged; this run writes a new record" % exc,
            )
        )
        return None, None
    if record is not None and record["timestamp"] >= now:
        checks.append(
            _record_check(
                _verdict.WARN,
                "the counter record %s is dated %.0f s in the future (was the clock set back?): not compared"
                % (path, record["timestamp"] - now),
            )
        )
        return None, record["timestamp"]
    return record, record["timestamp"] if record else None


def run(params, binaries, run_tool, write_record=True, sleep=time.sleep, clock=time.monotonic, wall=time.time):
    """The result of one run: ``devices``, ``checks``, ``status``, ``action``, ``passed``,
    ``windows``, ``record``, ``tools``. ``binaries`` and ``run_tool`` as for
    :func:`_collect.fill`; ``write_record`` False (check mode) leaves the record as it is."""
    opts = options(params)
    sysfs_path, dev_path = params.get("sysfs_path") or _sysfs.DEFAULT_SYSFS_PATH, params.get("dev_path") or "/dev"
    try:
        latest, earlier, seconds = _collect.sample(
            lambda: _sysfs.read_fabric(sysfs_path, dev_path), params.get("sample_interval") or 0, sleep, clock
        )
    except _sysfs.SysfsMissing as exc:
        raise FabricError(str(exc)) from None
    now = wall()
    devices = latest["devices"]
    tools = _collect.fill(devices, binaries, run_tool)
    checks = []
    record, previous = _load_record(params.get("record_path"), now, checks)
    found = _judge.windows(earlier["devices"] if earlier else None, seconds, record, now)
    checks = _judge.judge(devices, latest["verbs_problem"], found, opts, tools) + checks
    record_result = {"path": params.get("record_path"), "previous_timestamp": previous, "written": False, "error": None}
    if params.get("record_path") and write_record:
        try:
            _record.write(params["record_path"], _record.build(devices, now))
            record_result["written"] = True
        except OSError as exc:
            record_result["error"] = "cannot write %s: %s" % (params["record_path"], exc.strerror or exc)
            checks.append(
                _record_check(_verdict.WARN, record_result["error"] + ": the next run has nothing to compare with")
            )
    judged, _unmatched = _judge.select(devices, opts["devices"])
    names = {d["name"] for d in judged}
    for device in devices:
        device["judged"] = device["name"] in names
    status, action = _judge.status(checks)
    return {
        "devices": devices,
        "checks": checks,
        "status": status,
        "action": action,
        "passed": status != _verdict.FAIL,
        "windows": [{"name": w["name"], "seconds": round(w["seconds"], 3)} for w in found],
        "record": record_result,
        "tools": tools,
    }


def failure_message(result):
    """The task's message when the node fails: each failed check as ``name: reason``."""
    failed = [c for c in result["checks"] if c["status"] == _verdict.FAIL]
    return "RDMA fabric unhealthy (%s): %s" % (
        result["action"],
        "; ".join("%s: %s" % (c["name"], c["reason"]) for c in failed),
    )
