# SPDX-License-Identifier: GPL-3.0-or-later
"""Test-wide set-up: import paths for the collection and the lab, lab-tree fixtures, and the
session's one lab (`session_lab`: booted by the first test that needs it, down at the end).

Tiers (each a directory; run one with `pytest tests/<tier>`):
  tests/unit         plain Python: parsers, planners, models; no subprocess, no lab
  tests/integration  modules and roles through ansible-playbook on localhost (-c local)
  tests/lab          the lab itself and its stand-ins (root and the lab's packages for the fleet)
  tests/fleet        the playbooks end to end on the lab's fleet (root, slow)
"""

from __future__ import annotations

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
    from tests.harness.playbook import ansible_environment

    return ansible_environment()


@pytest.fixture(scope="session")
def session_lab():
    """The run's one lab (tests.harness.lab.Lab, with the spare node), shared by tests/lab,
    tests/fleet and the operations tests; skipped, saying why, where the lab cannot run."""
    from tests.harness.lab import FLEET_PROFILES, own_lab

    with own_lab(FLEET_PROFILES, spare=True) as lab:
        yield lab


TIERS = ("unit", "integration", "lab", "fleet", "vllm_parser")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the markers added here
def pytest_collection_modifyitems(config, items):
    """Each test carries its tier's marker (its directory under tests/), and `needs_lab` when it
    uses the session's lab: `pytest -m "not needs_lab"` runs everything that boots no lab. A test
    marked `needs_lab` by its module that does not use the session's lab (a module's lab of its own)
    carries `own_lab` too: `-m own_lab` and `-m "needs_lab and not own_lab"` split the labs in two."""
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        try:
            tier = Path(str(item.fspath)).resolve().relative_to(tests_dir).parts[0]
        except ValueError:
            continue
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
        if "session_lab" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.needs_lab)
        elif item.get_closest_marker("needs_lab") is not None:
            item.add_marker(pytest.mark.own_lab)


def _skips_fail():
    """Under CI and the test command (scripts/test.sh sets GPUFLEET_TESTS_STRICT), a test whose
    prerequisite is missing (a lab that cannot boot, a Debian package, a Python package) fails,
    saying why: a tier that cannot run is never a green run."""
    import os

    return os.environ.get("CI", "").lower() in ("1", "true") or os.environ.get("GPUFLEET_TESTS_STRICT") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skip becomes a failure where _skips_fail(), unless the test is marked ``optional_input``
    (its input lies outside the repository, e.g. ../shared/corpus)."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and _skips_fail():
        if item.get_closest_marker("optional_input") is None:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            report.outcome = "failed"
            report.longrepr = (
                "skipped under the test command (CI or GPUFLEET_TESTS_STRICT=1), which must run every tier: "
                f"{reason}. Install what is missing (bash scripts/setup.sh installs the Debian and PyPI "
                "packages) or fix what stops it."
            )


def pytest_terminal_summary(terminalreporter):
    from tests.harness.lab import LAB_TIMINGS as timings

    if timings:
        terminalreporter.section("lab: boots and ansible-playbook wall times")
        for label, seconds, rc in timings:
            terminalreporter.write_line(f"{seconds:7.1f} s  rc={rc}  {label}")
        terminalreporter.write_line(f"{sum(t for _, t, _ in timings):7.1f} s  in all")


@pytest.fixture
def run_module():
    """``run_module('pcie_acs', {...}, check_mode=True, diff=True)`` -> the module's result."""
    from tests.harness.modules import run_module as run

    return run
