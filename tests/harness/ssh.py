# SPDX-License-Identifier: GPL-3.0-or-later
"""A command on a lab node over SSH, as root, with the lab's key."""

from __future__ import annotations

import subprocess


def ssh(key, spec, command, check=True, timeout=60):
    """Run a shell command as root over SSH on the lab node ``spec`` (its entry in the lab's
    state); its stdout (AssertionError on failure)."""
    argv = ["ssh", "-i", str(key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    argv += ["-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-p", str(spec["ssh_port"]), f"root@{spec['address']}"]
    proc = subprocess.run([*argv, command], capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode:
        raise AssertionError(f"ssh {spec['name']} {command!r} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout
