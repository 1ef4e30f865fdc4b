# SPDX-License-Identifier: GPL-3.0-or-later
"""The collection's code as Ansible runs it: a module (JSON arguments on stdin), a node-side agent
installed as its role installs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.harness import REPO


def run_module(name, args, check_mode=False, diff=False, env=None):
    """Run plugins/modules/<name>.py as Ansible runs it (JSON args on stdin); return its JSON."""
    payload = {"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=check_mode, _ansible_diff=diff)}
    environ = dict(os.environ, **(env or {}))
    environ["PYTHONPATH"] = os.pathsep.join([str(REPO / ".collections"), str(REPO)])
    proc = subprocess.run(
        [sys.executable, str(REPO / "plugins" / "modules" / f"{name}.py")],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=environ,
        timeout=300,
    )
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"{name} printed no JSON: {proc.stdout!r} {proc.stderr!r}") from None


def install_agent(agent, lib_dir):
    """``agent`` (its script) and the collection's code it imports, written under ``lib_dir`` as
    its role writes them (the entries of gpufleet.node.agent_files); returns the installed script."""
    from ansible_collections.gpufleet.node.plugins.filter.agent_files import agent_files

    lib_dir = Path(lib_dir)
    for entry in agent_files(str(agent), str(lib_dir)):
        dest = Path(entry["dest"])
        dest.parent.mkdir(parents=True, exist_ok=True)
        if "file" in entry:
            shutil.copyfile(entry["file"], dest)
        else:
            dest.write_text(entry["content"])
    lib_dir.mkdir(parents=True, exist_ok=True)
    script = lib_dir / Path(agent).name
    shutil.copyfile(agent, script)
    return script
