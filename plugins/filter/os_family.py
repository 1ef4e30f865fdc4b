# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a node's OS family uses (roles gpufleet.node.pcie_p2p, monitoring, worker_recycle): its
paths, the packages that install what a role needs, and how a kernel parameter reaches every boot."""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.module_utils.common import _os_family


def os_family_paths(facts):
    """``{'family', 'pkg_mgr', 'kernel_param', 'setpci'}`` (see module_utils/common/_os_family.py)."""
    if not isinstance(facts, Mapping):
        raise AnsibleFilterError("os_family_paths: expects the node's ansible_facts, got %s" % type(facts).__name__)
    try:
        return _os_family.paths(dict(facts))
    except ValueError as exc:
        raise AnsibleFilterError("os_family_paths: %s" % exc) from exc


def kernel_param_plan(facts, param, grubby_info=""):
    """``{'family', 'route', 'commands'}`` (see module_utils/common/_os_family.py)."""
    if not isinstance(facts, Mapping):
        raise AnsibleFilterError("kernel_param_plan: expects the node's ansible_facts, got %s" % type(facts).__name__)
    try:
        return _os_family.kernel_param_plan(dict(facts), str(param), str(grubby_info or ""))
    except ValueError as exc:
        raise AnsibleFilterError("kernel_param_plan: %s" % exc) from exc


def os_packages(facts, what, override=None, variable="", advice=""):
    """``{'family', 'pkg_mgr', 'packages', 'refused', 'query'}`` (see module_utils/common/_os_family.py)."""
    if not isinstance(facts, Mapping):
        raise AnsibleFilterError("os_packages: expects the node's ansible_facts, got %s" % type(facts).__name__)
    if what not in _os_family.PACKAGES:
        raise AnsibleFilterError("os_packages: %r is none of %s" % (what, ", ".join(sorted(_os_family.PACKAGES))))
    if override is not None and not isinstance(override, (str, list)):
        raise AnsibleFilterError(
            "os_packages: %s must be a package name or a list of them, got %s"
            % (variable or "the override", type(override).__name__)
        )
    return _os_family.package_plan(dict(facts), what, override, str(variable or ""), str(advice or ""))


def os_packages_missing(query, plan):
    """Whether the packages of an os_packages plan must be installed, from the registered result of
    running its ``query`` (see module_utils/common/_os_family.py packages_missing)."""
    if not isinstance(query, Mapping) or not isinstance(plan, Mapping):
        raise AnsibleFilterError(
            "os_packages_missing: expects the registered result of the plan's query and the os_packages plan"
        )
    if not plan.get("packages"):
        return False
    if query.get("skipped"):
        raise AnsibleFilterError(
            "os_packages_missing: the plan's query was skipped: run it where the packages are judged"
        )
    return _os_family.packages_missing(dict(plan), query.get("rc"), query.get("stdout", ""))


class FilterModule:
    def filters(self):
        return {
            "kernel_param_plan": kernel_param_plan,
            "os_family_paths": os_family_paths,
            "os_packages": os_packages,
            "os_packages_missing": os_packages_missing,
        }
