#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_health_hold
short_description: Read or clear a node's hold for hardware inspection (a fatal XID that came back)
description:
  - A node on which the same fatal XID hit the same GPU in several boots is held out of the
    balancer with the action C(hardware inspection) (M(gpufleet.node.gpu_health_info), option
    C(recurrence_boots)). The hold is kept in the node's XID history across boots and stays,
    reboot after reboot, until this module clears it.
  - Clear it after the GPU was inspected, repaired or replaced (RMA); the next GPU health check
    (the boot validation after a reboot, or C(site.yml)) then judges the node afresh.
  - V(cleared) removes the holds and the recorded XIDs of the held GPUs and codes (each clear is
    kept in the file's C(cleared) list); changed only when there was a hold.
version_added: 0.3.0
author:
  - gpufleet.node developers (@gpufleet)
options:
  history_path:
    description:
      - The node's XID history (C(gpu_health_history_path) of the gpu_health role).
    type: path
    required: true
  boot_id_path:
    description:
      - The file holding this boot's id; given, the module returns RV(metrics), the history's
        textfile metrics after the run (for the caller to write).
    type: path
  state:
    description:
      - V(queried) returns the holds and changes nothing; V(cleared) clears them.
    type: str
    choices: [queried, cleared]
    default: queried
attributes:
  check_mode:
    support: full
    description: Says whether a hold would be cleared, writes nothing.
  diff_mode:
    support: full
    description: The history's holds before and after.
notes:
  - A history that cannot be read fails the task naming the file; it is not rewritten.
  - The file is replaced atomically (mode 0644).
seealso:
  - module: gpufleet.node.gpu_health_info
"""

EXAMPLES = r"""
- name: Clear the hold after the GPU was replaced
  gpufleet.node.gpu_health_hold:
    history_path: /var/lib/gpufleet/gpu-xid-history.json
    state: cleared

- name: Show the holds
  gpufleet.node.gpu_health_hold:
    history_path: /var/lib/gpufleet/gpu-xid-history.json
  register: hold
"""

RETURN = r"""
holds:
  description: The holds before the run, each C(gpu), C(code), C(boots) (boot ids) and C(since).
  returned: always
  type: list
  elements: dict
  sample:
    - gpu: "0000:3b:00.0"
      code: 79
      boots: [5d2c6f0e-8a51-4c11-a3f0-6a2b1f0e9c77, 0b3e1f0c-2b9e-4a55-9c1d-4d2f6a8e7b10]
      since: 1764651600.0
cleared:
  description: The holds this run cleared (or would clear, in check mode); empty when there was none.
  returned: always
  type: list
  elements: dict
metrics:
  description: The history's node-exporter textfile after the run (C(gpufleet_gpu_health_hold) 0 once cleared).
  returned: when O(boot_id_path) is given
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.node.plugins.module_utils.common import _atomic
from ansible_collections.gpufleet.node.plugins.module_utils.health import _history
from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _readiness


def describe(holds):
    return "".join("XID %d on %s in %d boots\n" % (h["code"], h["gpu"], len(h["boots"])) for h in holds)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            history_path=dict(type="path", required=True),
            boot_id_path=dict(type="path"),
            state=dict(type="str", default="queried", choices=["queried", "cleared"]),
        ),
        supports_check_mode=True,
    )
    path = module.params["history_path"]
    try:
        history = _history.load(path)
    except _history.HistoryError as exc:
        module.fail_json(msg=str(exc), cause="history")
    holds = history["holds"]
    result = dict(changed=False, holds=holds, cleared=[])
    updated = history
    if module.params["state"] == "cleared" and holds:
        updated, cleared = _history.clear(history)
        result.update(changed=True, cleared=cleared)
        if module._diff:
            result["diff"] = {
                "before": describe(holds),
                "after": "",
                "before_header": "%s (holds)" % path,
                "after_header": "%s (holds)" % path,
            }
        if not module.check_mode:
            try:
                _atomic.write(path, _history.dump(updated))
            except OSError as exc:
                module.fail_json(msg="cannot write the GPU XID history %s: %s" % (path, exc.strerror or exc))
    if module.params["boot_id_path"]:
        try:
            boot_id = _readiness.read_boot_id(module.params["boot_id_path"])
        except OSError as exc:
            module.fail_json(
                msg="cannot read the boot id at boot_id_path %s: %s"
                % (module.params["boot_id_path"], exc.strerror or exc)
            )
        result["metrics"] = _history.textfile(updated, boot_id)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
