# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The serving probe's record: what the node's prober (``serving/_probe``, run by
``gpufleet_serving_probe.py``) writes after each probe, JSON beside the NCCL gate's marker
(:func:`record`), and its judgement (:func:`record_problem`), which the readiness rule in
``nccl/_readiness`` applies as it reads the marker.

Kept apart from the prober, with the standard library only: HAProxy's agent-check starts the node's
agent (``gpufleet_lb_agent.py``) every few seconds, and the agent reads this record, never the
prober's HTTP client or Prometheus parser. Runs on the node's Python 3.9+.
"""

from __future__ import annotations

import math
import time

#: The probe record's file name, beside the gate's marker (gpufleet_probe_record_path).
RECORD_FILE = "serving-probe.json"
VERDICTS = ("serving", "busy", "wedged", "down")
#: The verdicts that keep a node in rotation.
SERVES = ("serving", "busy")
#: The record's fields.
RECORD_FIELDS = ("boot_id", "time", "verdict", "reason", "elapsed_s", "backend", "interval_s", "timeout_s")


def max_age(interval, timeout):
    """Seconds after which a probe record is stale: two of the prober's longest cycles (a scrape
    before and after the completion, each bounded by 5 s or the deadline, the completion's deadline,
    or the interval when that is longer) and a margin. Older, the prober has stopped."""
    cycle = max(float(interval), float(timeout) + 2 * min(float(timeout), 5.0))
    return 2 * cycle + 5.0


def record(verdict, reason, boot_id, elapsed=None, backend=None, interval=None, timeout=None, now=None):
    """The probe record as the prober writes it (JSON object)."""
    return {
        "boot_id": boot_id,
        "time": round(time.time() if now is None else now, 3),
        "verdict": verdict,
        "reason": reason,
        "elapsed_s": elapsed,
        "backend": backend or None,
        "interval_s": interval,
        "timeout_s": timeout,
    }


def record_problem(data, problem, boot_id, path, max_age, now=None):
    """``(word, reason)`` of why the probe record keeps the node out, ``(None, None)`` when it
    says the engine serves (``serving`` or ``busy``, of this boot, not older than ``max_age``)."""
    if problem:
        return "probe-unreadable", problem
    if data is None:
        return "probe-missing", "no serving probe record at %s: the prober has not probed since boot" % path
    stamp = data.get("time")
    if data.get("boot_id") != boot_id or isinstance(stamp, bool) or not isinstance(stamp, (int, float)):
        return "probe-stale", "the serving probe record at %s is not of this boot" % path
    age = (time.time() if now is None else now) - stamp
    if not math.isfinite(age) or age > max_age:
        return "probe-stale", "the serving probe record at %s is %.0f s old (at most %g s): is the prober running?" % (
            path,
            age,
            max_age,
        )
    verdict = data.get("verdict")
    if verdict in SERVES:
        return None, None
    reason = data.get("reason") if isinstance(data.get("reason"), str) else "no reason recorded"
    if verdict == "wedged":
        return "engine-wedged", "the serving probe finds the engine wedged: %s" % reason
    if verdict == "down":
        return "engine-down", "the serving probe finds the engine down: %s" % reason
    return "probe-unreadable", "the serving probe record at %s has no verdict of %s" % (path, ", ".join(VERDICTS))
