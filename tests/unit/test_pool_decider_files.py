# SPDX-License-Identifier: GPL-3.0-or-later
"""What role pool_decider installs beside the pool's decider: the collection code it imports
(gpufleet.node.agent_files; kept apart from tests/unit/test_pool_budget.py, which the node
Pythons run and which therefore imports no Ansible)."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.gpufleet.node.plugins.filter.agent_files import agent_files


def test_the_decider_gets_the_budget_and_the_haproxy_client_it_imports(tmp_path):
    """Role pool_decider installs, beside the decider, what it imports (gpufleet.node.agent_files)."""
    decider = Path(__file__).resolve().parents[2] / "roles" / "pool_decider" / "files" / "gpufleet_pool_decider.py"
    tree = "/lib/ansible_collections/gpufleet/node/plugins/module_utils/"
    dests = {e["dest"][len(tree) :] for e in agent_files(str(decider), "/lib") if e["dest"].startswith(tree)}
    assert dests == {
        "__init__.py",
        "common/__init__.py",
        "common/_atomic.py",
        "lb/__init__.py",
        "lb/_budget.py",
        "lb/_haproxy.py",
    }
