# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a node's OS family uses (role gpufleet.node.pcie_p2p): its paths, and how a kernel parameter
reaches every boot."""

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


class FilterModule:
    def filters(self):
        return {"kernel_param_plan": kernel_param_plan, "os_family_paths": os_family_paths}
