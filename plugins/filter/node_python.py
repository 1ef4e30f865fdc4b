# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The Python a node's own boot validation runs on (role gpufleet.node.boot_validation)."""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.module_utils.runtime import _node_python


def node_python(facts, interpreters, requested="", host="the node"):
    """``{'python', 'version', 'packages', 'pkg_mgr', 'how', 'refused'}`` for a node (see
    module_utils/runtime/_node_python.py): ``facts`` are its ``ansible_facts``, ``interpreters``
    what module node_python_info found there, ``requested`` the operator's interpreter ('':
    choose), ``host`` the name a refusal gives the node."""
    if not isinstance(facts, Mapping):
        raise AnsibleFilterError("node_python: expects the node's ansible_facts, got %s" % type(facts).__name__)
    if not isinstance(interpreters, list) or not all(
        isinstance(i, Mapping) and {"name", "path", "version", "venv"} <= set(i) for i in interpreters
    ):
        raise AnsibleFilterError("node_python: interpreters must be node_python_info's interpreters")
    found = [
        {
            "name": str(i["name"]),
            "path": str(i["path"]),
            "version": [int(v) for v in i["version"]],
            "venv": bool(i["venv"]),
        }
        for i in interpreters
    ]
    return _node_python.choose(dict(facts), found, str(requested or ""), str(host))


class FilterModule:
    def filters(self):
        return {"node_python": node_python}
