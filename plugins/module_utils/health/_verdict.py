# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A GPU health check's record and the node's verdict: the statuses, the actions a check can call
for (mildest first), the worst of several.

Plain Python (no Ansible imports), runs on target Python 3.8+. The checks (``_checks``), the
module ``gpu_health_info`` and the node's GPU health watcher all speak this vocabulary.
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
ACTIONS = (NONE, RESTART_APP, CONFIGURE, RESET_GPU, REBOOT, INSPECT)


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
