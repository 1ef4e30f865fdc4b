# SPDX-License-Identifier: GPL-3.0-or-later
"""Helpers shared by the test modules (tests/conftest.py puts the repository on sys.path)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

needs_lspci = pytest.mark.skipif(not shutil.which("lspci"), reason="pciutils is not installed")

DEV_LINE = re.compile(r"^((?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ")
_ACS_LINE = re.compile(r"^\t\t(ACSCap|ACSCtl):\t(.*)$")


def run_module(name, args, check_mode=False, diff=False, env=None):
    """Run plugins/modules/<name>.py as Ansible runs it (JSON args on stdin); return its JSON."""
    payload = {"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=check_mode, _ansible_diff=diff)}
    environ = dict(os.environ, **(env or {}))
    environ["PYTHONPATH"] = os.pathsep.join([str(REPO / ".collections"), str(REPO)])
    proc = subprocess.run([sys.executable, str(REPO / "plugins" / "modules" / f"{name}.py")],
                          input=json.dumps(payload), capture_output=True, text=True, env=environ,
                          timeout=300)
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"{name} printed no JSON: {proc.stdout!r} {proc.stderr!r}") from None


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
            result[current][match.group(1)] = dict(
                (flag[:-1], flag[-1] == "+") for flag in match.group(2).split())
    return result
