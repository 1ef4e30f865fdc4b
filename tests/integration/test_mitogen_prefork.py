# SPDX-License-Identifier: GPL-3.0-or-later
"""The prefork callback leaves in the controller's process what every forked task worker would
otherwise redo: Galaxy's collection scan (Mitogen's planner calls it per task) and this
collection's filter plugins (one lookup loads every filter file). Run as ansible-playbook runs it:
a fresh interpreter with Ansible's plugin loader configured from the repository's ansible.cfg.
The figure it saves is in the README's benchmark, not asserted here."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.harness import REPO

PROBE = """
import json, sys
from ansible.plugins.loader import init_plugin_loader
init_plugin_loader()
watched = ["ansible.galaxy.collection", "ansible_collections.gpufleet.node.plugins.filter.monitoring",
           "ansible_collections.gpufleet.node.plugins.filter.kvplan", "ansible_collections.community.general"]
before = {m: m in sys.modules for m in watched}
from ansible_collections.gpufleet.node.plugins.callback.mitogen_prefork import CallbackModule
CallbackModule().v2_playbook_on_start(None)
print(json.dumps({"before": before, "after": {m: m in sys.modules for m in watched}}))
"""


def test_prefork_loads_the_scan_and_the_filters(ansible_env):
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, env=ansible_env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert not any(seen["before"].values()), seen
    assert all(seen["after"].values()), seen


def test_enabled_by_the_repository_config():
    config = (REPO / "ansible.cfg").read_text()
    (line,) = [ln for ln in config.splitlines() if ln.startswith("callbacks_enabled")]
    assert "gpufleet.node.mitogen_prefork" in line.split("=", 1)[1].replace(" ", "").split(",")
