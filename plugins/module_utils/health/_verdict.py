# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A GPU health check's record and the node's verdict: the statuses, the actions a check can call
for (mildest first), the worst of several, and the GPU health verdict of a boot as it is written
to ``gpu-health.json``.

Plain Python (no Ansible imports), runs on target Python 3.8+. The checks (``_checks``), the
module ``gpu_health_info`` and the node's GPU health watcher all speak this vocabulary; the
verdict file's one builder is :func:`record`, its readers are ``nccl/_readiness`` (the module
``node_readiness_info``, boot validation and the node's HAProxy agent).
"""

from __future__ import annotations

PASS, WARN, FAIL = "pass", "warn", "fail"
_RANK = {PASS: 0, WARN: 1, FAIL: 2}

# The actions a check can call for, mildest first (NVIDIA's XID catalog and GPUd's repair actions).
NONE = "none"
RESTART_APP = "restart the application"
RESET_GPU = "reset the GPU"
REBOOT = "reboot"
INSPECT = "drain and inspect the hardware"
CONFIGURE = "fix the node configuration"
# The history's rules (``_history``): the same fatal XID on every GPU in one boot (NVSentinel's
# software fault), and the same fatal XID on one GPU in several boots (GPUd's hardware
# inspection), which holds the node out until an operator clears it.
SOFTWARE_EVENT = "check the driver and software (a software or driver event)"
HARDWARE_INSPECTION = "hardware inspection"
ACTIONS = (NONE, RESTART_APP, CONFIGURE, RESET_GPU, REBOOT, SOFTWARE_EVENT, INSPECT, HARDWARE_INSPECTION)

#: Who wrote a verdict (its ``source``): the gpu_health role (the module's full check) or the
#: node's watcher.
ROLE_SOURCE = "gpu_health"
WATCH_SOURCE = "gpu-health-watch"


def check(name, status, gpus, reason, action=NONE):
    return {
        "name": name,
        "status": status,
        "gpus": sorted(set(gpus)),
        "reason": reason,
        "action": action if status != PASS else NONE,
    }


def judged(name, fails, failed, warns, warned, fail_action, pass_reason, fail_prefix=""):
    """FAIL (naming the warnings too) when there are ``fails``, else WARN (INSPECT) when there are
    ``warns``, else PASS with ``pass_reason``."""
    if fails:
        return check(name, FAIL, failed + warned, fail_prefix + "; ".join(fails + warns), fail_action)
    if warns:
        return check(name, WARN, warned, "; ".join(warns), INSPECT)
    return check(name, PASS, [], pass_reason)


def worst(verdicts):
    """The worst (status, action) of ``[(status, action)]``; pass/none when empty."""
    status, action = PASS, NONE
    for s, a in verdicts:
        if _RANK[s] > _RANK[status] or (s == status and ACTIONS.index(a) > ACTIONS.index(action)):
            status, action = s, a
    return status, action


def verdict(checks):
    """``(passed, failed_names, warned_names)``."""
    failed = [c["name"] for c in checks if c["status"] == FAIL]
    warned = [c["name"] for c in checks if c["status"] == WARN]
    return not failed, failed, warned


def strongest_action(checks):
    """The strongest of the ``action`` of ``checks`` in :data:`ACTIONS` order; ``none`` when none
    of them names one of :data:`ACTIONS`."""
    known = [c.get("action") for c in checks if c.get("action") in ACTIONS]
    return max(known, key=ACTIONS.index) if known else NONE


def record(boot_id, failed, warnings, source, timestamp=None):
    """The GPU health verdict of the boot ``boot_id``, as written to ``gpu-health.json``.

    ``failed`` and ``warnings`` are check records (``name``, ``status``, ``gpus``, ``reason``,
    ``action``). ``passed`` is a JSON true only when nothing failed: the readers
    (``nccl/_readiness``) keep the node out on anything else of this boot. ``action`` is the
    strongest action the failures call for, ``reason`` each failure as ``name: reason``.
    ``timestamp`` (seconds since the epoch) is written when given (the watcher's verdicts)."""
    failed, warnings = list(failed), list(warnings)
    verdict = {
        "boot_id": boot_id,
        "passed": not failed,
        "source": source,
        "checks": failed,
        "warnings": warnings,
        "action": strongest_action(failed),
        "reason": "; ".join("%s: %s" % (c.get("name") or "?", c.get("reason") or "no reason recorded") for c in failed)
        if failed
        else "every check passed",
    }
    if timestamp is not None:
        verdict["timestamp"] = timestamp
    return verdict


def record_of_checks(boot_id, checks, source=ROLE_SOURCE):
    """:func:`record` of a whole check run (the module's): its failed checks and its warnings."""
    return record(
        boot_id,
        [c for c in checks if c["status"] == FAIL],
        [c for c in checks if c["status"] == WARN],
        source,
    )
