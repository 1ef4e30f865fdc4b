# SPDX-License-Identifier: GPL-3.0-or-later
"""Test-wide set-up: import paths for the collection and the lab, and lab-tree fixtures."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"

# `ansible_collections.gpufleet.node` resolves through the committed .collections link;
# `lab` is a top-level package of the repository.
for entry in (REPO / ".collections", REPO):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

import lab.hwmodel as hw  # noqa: E402  (needs the path above)


@pytest.fixture
def lab_node(tmp_path):
    """Build a simulated machine for a profile: ``node = lab_node('l40s-4x-switch')``."""

    def _build(profile: str) -> hw.Node:
        return hw.build(profile, tmp_path / profile)

    return _build


@pytest.fixture(params=sorted(hw.PROFILES))
def any_profile(request):
    """Every lab profile, one test per profile."""
    return request.param


@pytest.fixture
def ansible_env():
    """Environment for ansible-playbook runs from the repository root."""
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.setdefault("ANSIBLE_NOCOLOR", "1")
    return env



@pytest.fixture
def run_module():
    """``run_module('pcie_acs', {...}, check_mode=True, diff=True)`` -> the module's result."""
    from tests.support import run_module as run

    return run
