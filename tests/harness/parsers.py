# SPDX-License-Identifier: GPL-3.0-or-later
"""Test-only parsers (not shipped in the collection): lspci's ACS lines and config-space dumps,
KEY=value env files."""

from __future__ import annotations

import re
import shutil

import pytest

needs_lspci = pytest.mark.skipif(not shutil.which("lspci"), reason="pciutils is not installed")

DEV_LINE = re.compile(r"^((?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ")
_ACS_LINE = re.compile(r"^\t\t(ACSCap|ACSCtl):\t(.*)$")
_DUMP_DEV_RE = re.compile(r"^((?:[0-9a-fA-F]{4,}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s")
_DUMP_HEX_RE = re.compile(r"^([0-9a-fA-F]{2,3}):((?:\s[0-9a-fA-F]{2})+)\s*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def lspci_acs(text):
    """``{bdf: {'ACSCap': {name: bool}, 'ACSCtl': {...}}}`` from `lspci -vvv` output."""
    result, current = {}, None
    for line in text.splitlines():
        match = DEV_LINE.match(line)
        if match:
            current = match.group(1)
            result[current] = {}
            continue
        match = _ACS_LINE.match(line)
        if match and current:
            result[current][match.group(1)] = {flag[:-1]: flag[-1] == "+" for flag in match.group(2).split()}
    return result


def parse_lspci_dump(text):
    """Parse ``lspci -x/-xxx/-xxxx`` output (also with ``-vvv`` text between) into ``{bdf: bytes}``.

    This is the format ``lspci -F FILE`` reads. BDFs are kept as printed (``00:02.0``).
    """
    result = {}
    current = None
    for line in text.splitlines():
        match = _DUMP_DEV_RE.match(line)
        if match:
            current = match.group(1)
            result[current] = bytearray()
            continue
        match = _DUMP_HEX_RE.match(line)
        if match and current is not None:
            off = int(match.group(1), 16)
            values = bytes(int(x, 16) for x in match.group(2).split())
            blob = result[current]
            if len(blob) < off:
                blob.extend(b"\xff" * (off - len(blob)))
            blob[off : off + len(values)] = values
    return {bdf: bytes(blob) for bdf, blob in result.items() if blob}


def parse_env_file(text):
    """KEY=value lines (systemd EnvironmentFile / docker --env-file); comments and blanks skipped."""
    env = {}
    for num, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not _ENV_NAME.match(key):
            raise ValueError("line %d is not KEY=value: %r" % (num, line))
        env[key] = value
    return env
