#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_python_info
short_description: Find the Python interpreters of a node, their versions and whether venv works
version_added: 0.1.0
description:
  - Looks for each candidate on the node (a name is looked up in C(PATH), a path is taken as it
    is), runs each one found with a short probe and reports its version and whether
    C(python -m venv) can bootstrap pip there (C(ensurepip), which Debian and Ubuntu ship apart
    from the interpreter, in C(python3-venv) and C(python3.X-venv)).
  - A candidate that is not there is left out; one that is there but does not run the probe (a
    pyenv shim of a version not selected, a broken link) is listed under RV(unusable) with why.
  - Read-only. Role gpufleet.node.boot_validation judges the answer with filter
    P(gpufleet.node.node_python#filter).
author:
  - gpufleet.node developers (@gpufleet)
options:
  candidates:
    description: Interpreters to look for, names or absolute paths, in order of preference.
    type: list
    elements: str
    default: [python3.13, python3.12, python3.11, python3]
  timeout:
    description: Seconds each probe may take.
    type: float
    default: 30.0
extends_documentation_fragment:
  - gpufleet.node.attributes.read_only
seealso:
  - module: gpufleet.node.gpu_topology_facts
"""

EXAMPLES = r"""
- name: Look for Python 3.11-3.13 on the node
  gpufleet.node.node_python_info:
  register: node_pythons

- name: Probe one interpreter
  gpufleet.node.node_python_info:
    candidates: [/opt/python3.12/bin/python3.12]
  register: node_pythons
"""

RETURN = r"""
interpreters:
  description: The candidates found, in the order asked, each once (by path).
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: The candidate as asked.
      type: str
      sample: python3.11
    path:
      description: Where it was found.
      type: str
      sample: /usr/bin/python3.11
    version:
      description: Its version, C([major, minor, micro]).
      type: list
      elements: int
      sample: [3, 11, 2]
    venv:
      description: Whether C(import ensurepip, venv) works there.
      type: bool
  sample:
    - {name: python3.11, path: /usr/bin/python3.11, version: [3, 11, 2], venv: true}
unusable:
  description: The candidates found that did not run the probe, each with C(name), C(path) and C(error).
  returned: always
  type: list
  elements: dict
  sample:
    - {name: python3.13, path: /root/.pyenv/shims/python3.13, error: "exit 127: pyenv: python3.13: command not found"}
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.node.plugins.module_utils.common import _proc
from ansible_collections.gpufleet.node.plugins.module_utils.runtime import _node_python


def _locate(module, candidate):
    """The candidate's path, or None when it is not on the node."""
    if os.path.isabs(candidate):
        return candidate if os.path.isfile(candidate) and os.access(candidate, os.X_OK) else None
    return module.get_bin_path(candidate)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            candidates=dict(type="list", elements="str", default=list(_node_python.CANDIDATES)),
            timeout=dict(type="float", default=30.0),
        ),
        supports_check_mode=True,
    )
    found, unusable, seen = [], [], set()
    for candidate in module.params["candidates"]:
        path = _locate(module, candidate)
        if path is None or path in seen:
            continue
        seen.add(path)
        result = _proc.run([path, "-I", "-c", _node_python.PROBE], module.params["timeout"])
        if result.timed_out or result.rc != 0:
            why = "no answer within %s s" % module.params["timeout"] if result.timed_out else "exit %s" % result.rc
            last = (result.stderr.strip().splitlines() or [""])[0][:200]
            unusable.append({"name": candidate, "path": path, "error": "%s%s" % (why, ": " + last if last else "")})
            continue
        try:
            found.append(_node_python.parse_probe(candidate, path, result.stdout))
        except _node_python.ProbeError as exc:
            unusable.append({"name": candidate, "path": path, "error": str(exc)})
    module.exit_json(changed=False, interpreters=found, unusable=unusable)


if __name__ == "__main__":
    main()
