# SPDX-License-Identifier: GPL-3.0-or-later
"""End-to-end tests of the playbooks on the fleet nodes of the session's lab.

The lab is tests/conftest.py's `session_lab` (one per pytest run, shared with tests/lab and the
operations tests); this fleet is its first nodes (default two: a healthy ``l40s-4x-switch`` and the
``l40s-x8-degraded`` node that must never be registered; ``GPUFLEET_FLEET_PROFILES=a,b,...``
picks others), reached through an inventory of those nodes only (``<state>/hosts-fleet.yml``).  The ``fleet``
fixture is that lab itself (tests.harness.lab.Lab: ``lab`` verbs, playbook runs, the pool,
testinfra).
``ansible-playbook`` runs from the repository root; the drift report goes to ``<state>/drift``
(never the repository's ``./drift``).  Node state is read with pytest-testinfra (``ansible://``
backend on the fleet's inventory: plain SSH with its key).

No test depends on the order of the files or of the tests: every test that needs the converged
fleet asks for the ``converged`` fixture, and a test that needs one node converged calls
``fleet.converge(nodes=[node])``: site.yml runs, limited to them, only on the nodes not known to be
converged (``fleet.changed(node)``: a reboot, a power cycle, a fault, a refused run; a test that
puts a node back as site.yml leaves it says ``fleet.restored(node)``); ``first_run`` is site.yml's
first run on the fresh fleet, made by whichever test asks first.  Wall times of every playbook run are printed at the end.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.harness import VENV_BIN
from tests.harness.lab import lab_prerequisites

_MISSING = lab_prerequisites()


def pytest_collection_modifyitems(config, items):
    """Without the lab's prerequisites every fleet test is skipped, saying why."""
    if not _MISSING:
        return
    skip = pytest.mark.skip(reason=f"lab prerequisites: {_MISSING}")
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(skip)


def _ensure_path():
    # testinfra's ansible backend calls ansible-inventory from PATH.
    path = os.environ.get("PATH", "")
    if str(VENV_BIN) not in path.split(os.pathsep):
        os.environ["PATH"] = f"{VENV_BIN}{os.pathsep}{path}"


@pytest.fixture(scope="session")
def fleet(session_lab):
    """The session's lab, whose fleet nodes (its first nodes, of GPUFLEET_FLEET_PROFILES) these
    tests run the playbooks on."""
    if _MISSING:
        pytest.skip(f"lab prerequisites: {_MISSING}")
    _ensure_path()
    return session_lab


@pytest.fixture(scope="session")
def first_run(fleet):
    """site.yml's first run on the fresh fleet (whatever ran since)."""
    if fleet.first_run is None:
        fleet.converge()
    return fleet.first_run


@pytest.fixture
def converged(fleet):
    """The fleet as site.yml leaves it (site.yml runs only on the nodes an earlier test changed)."""
    fleet.converge()
    return fleet
