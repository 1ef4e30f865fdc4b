# SPDX-License-Identifier: GPL-3.0-or-later
"""Counts module runs per host, for benchmarks/bench_fleet.py (not part of the collection).

An action plugin reaches a host only through ``_execute_module`` (a template is a ``stat`` and a
``file`` or ``copy``; ``set_fact``, ``assert`` and the collection's controller-side actions are
none). Loading this callback wraps that method, in ``ActionBase`` and in Mitogen's action mixin,
before the strategy forks its workers, so every worker appends one line per module run
(``host<TAB>module<TAB>delegated host or -<TAB>task``) to ``$BENCH_MODULE_RUNS_LOG``. Enabled with
``ANSIBLE_CALLBACK_PLUGINS=benchmarks/callback_plugins ANSIBLE_CALLBACKS_ENABLED=module_runs``.
"""

from __future__ import annotations

import os

from ansible.plugins.action import ActionBase
from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: module_runs
type: aggregate
short_description: counts module runs per host into $BENCH_MODULE_RUNS_LOG
description: [Benchmark helper of gpufleet.node, see benchmarks/bench_fleet.py.]
"""


def _wrap(cls):
    original = cls.__dict__.get("_execute_module")
    if original is None or getattr(original, "_bench_wrapped", False):
        return

    def _execute_module(self, module_name=None, *args, **kwargs):
        path = os.environ.get("BENCH_MODULE_RUNS_LOG")
        if path:
            task_vars = kwargs.get("task_vars") or (args[2] if len(args) > 2 else None) or {}
            host = task_vars.get("inventory_hostname", "?")
            name = module_name or self._task.action
            task = " ".join(str(self._task.get_name()).split())
            line = f"{host}\t{name}\t{self._task.delegate_to or '-'}\t{task}\n"
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        return original(self, module_name, *args, **kwargs)

    _execute_module._bench_wrapped = True
    cls._execute_module = _execute_module


_wrap(ActionBase)
try:
    from ansible_mitogen.mixins import ActionModuleMixin
except ImportError:  # the stock strategy only
    pass
else:
    _wrap(ActionModuleMixin)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "module_runs"
    CALLBACK_NEEDS_ENABLED = True
