# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action of gpufleet.node.planned_change: check mode's answer for commands a role runs outside
it, computed by the role beforehand (see the module's documentation). Runs in the controller's
process; nothing runs on the node."""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

ARGUMENT_SPEC = {
    "commands": {"type": "list", "elements": "list", "required": True},
    "header": {"type": "str", "default": ""},
    "before": {"type": "str", "default": ""},
    "after": {"type": "str", "default": ""},
}


def report(commands, header="", before="", after="", diff=False):
    """The task's result: changed when there is a command, each command as one line, and the
    diff (``before`` to ``after``, both named ``header``) when diff mode asks for it and they
    differ."""
    lines = [" ".join(str(word) for word in argv) for argv in commands]
    result = {"changed": bool(lines), "commands": lines}
    if diff and lines and before != after:
        result["diff"] = {"before_header": header, "after_header": header, "before": before, "after": after}
    return result


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)[1]
        if not self._task.check_mode:
            raise AnsibleActionFail(
                "planned_change reports in check mode only: outside it the role runs the commands themselves"
                " (give the task `when: ansible_check_mode`)"
            )
        result.update(report(args["commands"], args["header"], args["before"], args["after"], bool(self._task.diff)))
        return result
