# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The variables a node's own boot validation runs with (role gpufleet.node.boot_validation)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError


def _is_task_result(value):
    """A registered result (e.g. pcie_p2p_acs): this run's output, not the node's settings."""
    return isinstance(value, Mapping) and ("changed" in value or "failed" in value)


def boot_validation_vars(host_vars, prefixes, exclude=(), overrides=None):
    """The host's variables whose names start with one of ``prefixes``, for the node-local run.

    ``host_vars`` is ``hostvars[inventory_hostname]``: inventory, group and extra variables (role
    defaults are not there, so the node's run computes those from its own facts at boot). Left
    out: names that match one of the regular expressions in ``exclude`` whole (a plain name
    matches itself), private names (``__...``), and registered task results.
    ``overrides`` are applied last. The result is sorted by name so that the file it is written
    to only changes when a setting does.
    """
    if not isinstance(prefixes, (list, tuple)) or not all(isinstance(p, str) and p for p in prefixes):
        raise AnsibleFilterError("boot_validation_vars: prefixes must be a list of non-empty strings")
    wanted = re.compile("^(?:%s)" % "|".join(re.escape(p) for p in prefixes))
    try:
        skip = re.compile("|".join("(?:%s)" % e for e in exclude or ()) or "(?!)")
    except re.error as exc:
        raise AnsibleFilterError(
            "boot_validation_vars: an exclude pattern is not a regular expression: %s" % exc
        ) from exc
    out = {}
    for name in sorted(host_vars):
        if name.startswith("__") or skip.fullmatch(name) or not wanted.match(name):
            continue
        value = host_vars[name]
        if _is_task_result(value):
            continue
        out[name] = value
    out.update(overrides or {})
    return dict(sorted(out.items()))


class FilterModule:
    def filters(self):
        return {"boot_validation_vars": boot_validation_vars}
