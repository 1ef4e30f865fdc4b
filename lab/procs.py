# SPDX-License-Identifier: GPL-3.0-or-later
"""Processes the lab started, told apart from a later process that reused their PID."""

from __future__ import annotations


def starttime(pid):
    """Field 22 of /proc/PID/stat and whether the process is a zombie, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(rest[19]), rest[0] == "Z"
