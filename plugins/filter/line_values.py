# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The shared value check of every template that writes an env file or a systemd unit line.

    KEY={{ my_value | gpufleet.node.env_value('my_value') }}
    ExecStart={{ my_bin | gpufleet.node.unit_value('my_bin') }} --flag

Each returns the value as text or fails the task naming the variable (never its value); the
rules are in ``plugins/module_utils/common/_linevalue.py``.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.module_utils.common import _linevalue


def _checked(check, *args):
    try:
        return check(*args)
    except _linevalue.LineValueError as exc:
        raise AnsibleFilterError("%s: %s" % (check.__name__, exc)) from None


def line_value(value, name):
    """One value that stays on its line of any line-oriented file: no control characters."""
    return _checked(_linevalue.line_value, value, name)


def unit_value(value, name):
    """One value of a systemd unit line: no control characters, no trailing backslash."""
    return _checked(_linevalue.unit_value, value, name)


def env_value(value, name):
    """One value of an env file read by systemd and docker: also no quotes, backslashes, outer spaces."""
    return _checked(_linevalue.env_value, value, name)


def env_name(value):
    """An environment variable name."""
    return _checked(_linevalue.env_name, value)


class FilterModule:
    def filters(self):
        return {"line_value": line_value, "unit_value": unit_value, "env_value": env_value, "env_name": env_name}
