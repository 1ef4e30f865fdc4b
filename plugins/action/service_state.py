# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action of gpufleet.node.service_state: ansible.builtin.systemd_service on the node, with a unit
that is not installed judged here, once, for every role (see the module's documentation)."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

# systemd_service's message (module_utils.service.fail_if_missing) for a unit systemd cannot find.
NOT_FOUND = "Could not find the requested service"
WANTS_RUNNING = ("started", "restarted", "reloaded")

ARGUMENT_SPEC = {
    "name": {"type": "str"},
    "state": {"type": "str", "choices": ["started", "stopped", "restarted", "reloaded"]},
    "enabled": {"type": "bool"},
    "daemon_reload": {"type": "bool", "default": False},
}


def module_args(args):
    """The arguments of ansible.builtin.systemd_service for this task, or None when there is
    nothing to ask (no unit, and no reload)."""
    if not args.get("name"):
        return {"daemon_reload": True} if args.get("daemon_reload") else None
    return {key: args[key] for key in ("name", "state", "enabled", "daemon_reload") if args.get(key) is not None}


def judge(args, result, check_mode):
    """systemd_service's result, with a unit that is not installed as a state of its own:
    nothing to stop or disable there; in check mode, a unit to be started or enabled is a change
    (an earlier task of the run would write it); otherwise a failure that says what to do."""
    name = args.get("name")
    if not name:
        return result
    if not (result.get("failed") and NOT_FOUND in str(result.get("msg", ""))):
        if not result.get("failed"):
            result["found"] = True
        return result
    wants = [
        verb
        for verb, wanted in (("enable", args.get("enabled") is True), ("start", args.get("state") in WANTS_RUNNING))
        if wanted
    ]
    kept = {
        key: value
        for key, value in result.items()
        if key not in ("failed", "msg", "exception", "rc", "stdout", "stderr", "stdout_lines", "stderr_lines")
    }
    if not wants:
        return dict(
            kept, changed=False, found=False, name=name, msg=f"{name} is not installed: nothing to stop or disable"
        )
    if check_mode:
        return dict(
            kept,
            changed=True,
            found=False,
            name=name,
            msg=f"{name} is not installed (yet): a run would {' and '.join(wants)} it once its unit is written",
        )
    return dict(
        result,
        found=False,
        msg=f"{result['msg'].rstrip(': ')}: {name} is not installed on this host. Write its unit file "
        f"(or install its package) before this task, or do not ask to {' or '.join(wants)} it.",
    )


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        dummy, args = self.validate_argument_spec(
            argument_spec=ARGUMENT_SPEC, required_by={"state": "name", "enabled": "name"}
        )
        margs = module_args(args)
        if margs is None:
            result.update(changed=False, msg="nothing to do: no unit named and no reload asked for")
            return result
        res = self._execute_module(module_name="ansible.legacy.systemd_service", module_args=margs, task_vars=task_vars)
        result.update(judge(args, res, bool(self._task.check_mode)))
        return result
