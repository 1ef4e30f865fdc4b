# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: drift
type: aggregate
short_description: Records, per host, every task that a check-mode run would change
version_added: 0.1.0
description:
  - Used by C(gpufleet.node.drift). While the play runs in check mode, every task result that
    says C(changed), every failure and every unreachable host is recorded per host, with the
    task's role and name and the files its diff names, in a JSON file that the playbook's last
    play reads to report the drift and fail the run.
  - The record carries the token that the playbook writes beside it (C(token)) at its start and
    removes at its end (M(gpufleet.node.drift_report), which also judges the record and writes the
    report, in the controller's process), so that the playbook can tell a record of this run from a stale one.
    Without a token (any other playbook) nothing is written.
  - A changed task is recorded with the file or object it manages (for a template or copy, its
    C(dest), not the temporary copy its diff names); a loop, once per changed item; a
    M(gpufleet.node.files) task, once per changed file or directory (a C(no_log) one, once per
    file it writes).
  - Tasks tagged C(drift_report) (the playbook's own bookkeeping) are not recorded. A failure of a
    task tagged C(drift_known_state) (a node that is out of service for a reason already recorded
    in this boot, such as a failed gate) is recorded as C(out_of_service), which the report shows
    and does not count as drift.
author:
  - gpufleet.node developers (@gpufleet)
requirements:
  - enable it, for example with C(ANSIBLE_CALLBACKS_ENABLED=gpufleet.node.drift) (the
    repository's C(ansible.cfg) does)
options:
  dir:
    description:
      - Directory of the record (C(record.json)) and of the token beside it; a relative path is
        taken from the directory C(ansible-playbook) runs in.
    type: str
    default: drift
    env:
      - name: GPUFLEET_DRIFT_DIR
    ini:
      - section: gpufleet_drift
        key: dir
"""

import json
import os
import tempfile

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpufleet.node.drift"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._record = None
        self._path = None

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        self._path = os.path.join(os.path.abspath(self.get_option("dir")), "record.json")

    def v2_playbook_on_play_start(self, play):
        if self._record is None:
            self._record = {"recorder": "gpufleet.node.drift", "hosts": {}, "check_mode": bool(play.check_mode)}
            self._flush()

    def _add(self, result, kind, detail):
        task = result._task
        if self._record is None or "drift_report" in task.tags:
            return
        entry = {
            "kind": kind,
            "role": task._role.get_name(include_role_fqcn=False) if task._role else "",
            "task": task.get_name(),
            "detail": detail,
        }
        self._record["hosts"].setdefault(result._host.get_name(), []).append(entry)
        self._flush()

    def _seen(self, result):
        # written when a host is first seen; later results of a host change nothing to write
        hosts = None if self._record is None else self._record["hosts"]
        if hosts is not None and "drift_report" not in result._task.tags and result._host.get_name() not in hosts:
            hosts[result._host.get_name()] = []
            self._flush()

    def v2_runner_on_ok(self, result):
        self._seen(result)
        res = result._result
        if not res.get("changed"):
            return
        # gpufleet.node.files: one row per changed file (a no_log task's result is censored:
        # each file its arguments name)
        dests = _changed_dests(res, _task_args(result))
        if dests is not None:
            for dest in dests:
                self._add(result, "changed", f"dest: {dest}")
        # a loop's own result only sums up its items, each recorded already
        elif not isinstance(res.get("results"), list):
            self._add(result, "changed", _what(res, _task_args(result)))

    def v2_runner_item_on_ok(self, result):
        self.v2_runner_on_ok(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._seen(result)
        if ignore_errors:
            return
        kind = "out_of_service" if "drift_known_state" in result._task.tags else "failed"
        self._add(result, kind, str(result._result.get("msg", ""))[:500])

    def v2_runner_on_unreachable(self, result):
        self._seen(result)
        self._add(result, "unreachable", str(result._result.get("msg", ""))[:500])

    def _flush(self):
        directory = os.path.dirname(self._path)
        # The playbook writes a fresh token beside the record before the hosts run; carrying it
        # back tells the playbook that this record is from this run, not a stale one.
        # Without a token no drift check is running (a site.yml run, say): nothing is written.
        try:
            with open(os.path.join(directory, "token")) as f:
                self._record["token"] = f.read().strip()
        except FileNotFoundError:
            return
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".record.")
        with os.fdopen(fd, "w") as f:
            json.dump(self._record, f, indent=1, sort_keys=True)
        os.replace(tmp, self._path)


def _task_args(result):
    """The task's arguments as this host (and loop item) ran them: templated."""
    fields = getattr(result, "task_fields", None) or getattr(result, "_task_fields", None) or {}
    args = fields.get("args")
    return args if isinstance(args, dict) else {}


def _changed_dests(res, args):
    """The files a changed gpufleet.node.files task manages: those its result says changed, or
    (its result censored by no_log) every file its arguments name; None for any other task."""
    if isinstance(res.get("changed_dests"), list):
        return [str(d) for d in res["changed_dests"]]
    files = args.get("files")
    if res.get("censored") and isinstance(files, list) and files and all(isinstance(f, dict) for f in files):
        dests = [f.get("dest") for f in files]
        if all(isinstance(d, str) and d and "{{" not in d for d in dests):
            return dests
    return None


def _what(res, args=None):
    """A short description of what would change: the file or object the task manages (from its
    result, else from its arguments: a template or copy in check mode returns no C(dest)), else the
    headers of its diff, the destination first (a template's C(after_header) is the temporary copy
    rendered on the controller)."""
    for key in ("dest", "path", "changed_ports", "commands", "name"):
        if res.get(key):
            value = res[key]
            return f"{key}: {', '.join(map(str, value)) if isinstance(value, list) else value}"
    for key in ("dest", "path"):
        value = (args or {}).get(key)
        if isinstance(value, str) and value and "{{" not in value:
            return f"{key}: {value}"
    diffs = res.get("diff") or []
    if isinstance(diffs, dict):
        diffs = [diffs]
    names = [d.get("before_header") or d.get("after_header") for d in diffs if isinstance(d, dict)]
    return ", ".join(dict.fromkeys(n for n in names if n))
