# SPDX-License-Identifier: GPL-3.0-or-later
"""The node's HAProxy agent (role lb_registration): its answers, run as systemd's Accept=yes runs
it, with the socket as standard output."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "roles" / "lb_registration" / "files" / "gpufleet_lb_agent.py"
RULE = REPO / "plugins" / "module_utils" / "_readiness.py"
BOOT = "2b95257e-cc50-4a2b-8260-36f6af9dc4dc"


def installed(tmp_path):
    """The agent as the role installs it: the script with _readiness.py beside it."""
    lib = tmp_path / "lib"
    lib.mkdir(exist_ok=True)
    shutil.copy(AGENT, lib / AGENT.name)
    shutil.copy(RULE, lib / RULE.name)
    return lib / AGENT.name


def answer(tmp_path, marker=None, boot_id=BOOT, raw=None):
    (tmp_path / "boot_id").write_text(boot_id + "\n")
    path = tmp_path / "nccl-gate.json"
    if raw is not None:
        path.write_text(raw)
    elif marker is not None:
        path.write_text(json.dumps(marker))
    proc = subprocess.run(
        [sys.executable, str(installed(tmp_path)), "--marker", str(path), "--boot-id", str(tmp_path / "boot_id")],
        capture_output=True,
        text=True,
        check=True,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout.endswith("\n") and proc.stdout.count("\n") == 1, proc.stdout
    return proc.stdout.rstrip("\n")


def test_up_only_with_a_passing_marker_of_this_boot(tmp_path):
    assert answer(tmp_path, {"boot_id": BOOT, "passed": True}) == "up"


@pytest.mark.parametrize(
    "marker, raw, why",
    [
        (None, None, "no NCCL gate marker at"),
        (
            {"boot_id": "0f2c-old-boot", "passed": True},
            None,
            f"the gate marker is from another boot (0f2c-old-boot), not the current {BOOT}",
        ),
        (
            {"boot_id": BOOT, "passed": False, "reason": "bus bandwidth 11.5 GB/s\nunder 22.1"},
            None,
            "the NCCL gate failed: bus bandwidth 11.5 GB/s under 22.1",
        ),
        ({"boot_id": BOOT, "passed": "true"}, None, "the NCCL gate failed"),  # only a JSON true passes
        (None, "{not json", "unreadable NCCL gate marker"),
        (None, "[1, 2]", "not a JSON object"),
    ],
)
def test_down_with_a_reason_haproxy_can_read(tmp_path, marker, raw, why):
    line = answer(tmp_path, marker, raw=raw)
    # HAProxy needs the space before '#': "down#why" is not understood and changes nothing
    assert line.startswith("down #") and why in line, line


def test_unreadable_boot_id_is_down(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(installed(tmp_path)),
            "--marker",
            str(tmp_path / "m"),
            "--boot-id",
            str(tmp_path / "missing"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.startswith("down #cannot read the boot id")
