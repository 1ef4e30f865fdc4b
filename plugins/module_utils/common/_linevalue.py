# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one check for values written into line-oriented files: env files and systemd units.

Plain Python, no Ansible. A value that carries a newline (or any other control character) into
``KEY=value`` of an env file, or into a ``Setting=value`` line of a unit, adds a line of its own
choosing (``LD_PRELOAD=...`` in an env file, ``ExecStartPre=...`` in a unit). Every such value is
refused here, naming the variable it came from, never echoing the value (it may be a secret).

Used by the filters ``gpufleet.node.env_value`` / ``unit_value`` / ``env_name`` that every role
template writing an env file or a unit line applies (``line_value`` for other line-oriented files:
comment lines of config.yaml, Prometheus textfile labels), and by the runtime-env derivation in
Python.
"""

from __future__ import annotations

import re

# C0 controls, DEL and the C1 controls; systemd and docker split lines on \n, \r is kept by some
# readers and dropped by others, NUL ends a C string early.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\x00": "a NUL byte"}


class LineValueError(ValueError):
    """A value that would change the structure of the line-oriented file it is written into."""


def _text(value):
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _control(text, name, where):
    match = _CONTROL.search(text)
    if match:
        char = match.group(0)
        raise LineValueError(
            "%s contains %s (character %d of its value) and would add a line to %s; "
            "set it to a single line without control characters"
            % (name, _NAMES.get(char, "the control character U+%04X" % ord(char)), match.start() + 1, where)
        )


def line_value(value, name, where="a line-oriented file"):
    """``value`` as text that stays on its line (no control characters), or :class:`LineValueError`."""
    text = _text(value)
    _control(text, name, where)
    return text


def unit_value(value, name, where="a systemd unit"):
    """``value`` as text for a unit line, or :class:`LineValueError` naming ``name``.

    Refused: any control character, and a trailing backslash (systemd joins the next line to it).
    """
    text = line_value(value, name, where)
    if text.endswith("\\"):
        raise LineValueError(
            "%s ends with a backslash, which joins the next line of %s to it; remove it" % (name, where)
        )
    return text


def env_value(value, name, where="an env file"):
    """``value`` as text for ``KEY=value`` in an env file read by both systemd and docker.

    systemd's EnvironmentFile= removes quotes and backslash escapes and strips spaces, docker's
    --env-file keeps them all: a value with quotes, backslashes or surrounding spaces means two
    different things to the two readers, so it is refused along with control characters.
    """
    text = line_value(value, name, where)
    if any(c in text for c in "\"'\\") or text != text.strip():
        raise LineValueError(
            "%s cannot be written to %s read by both systemd and docker: no quotes, "
            "backslashes or surrounding spaces in its value" % (name, where)
        )
    return text


def env_name(value, where="an env file"):
    """An environment variable name (letters, digits, underscores; not starting with a digit)."""
    text = _text(value)
    if not _ENV_NAME.match(text):
        raise LineValueError(
            "%r is not an environment variable name for %s: letters, digits and "
            "underscores, not starting with a digit" % (text, where)
        )
    return text
