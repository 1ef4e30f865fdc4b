# SPDX-License-Identifier: GPL-3.0-or-later
"""A fleet of three Debian releases: node1 bookworm (Python 3.11, the controller's root), node2
trixie (3.13) and node3 bullseye (3.9), each of the last two on its release's own root filesystem
(lab/rootfs.py), which has nothing the roles install.

One site.yml run leaves bookworm and trixie measured (the NCCL gate passed in this boot) and in the
pool; bullseye's Python cannot run the node's own boot validation (ansible-core 2.19 needs 3.11 or
later, Debian 11 has no package of one), so that node is refused before its runtime is installed,
with a message naming its Python, what is needed and what to do, and stays out of the pool with
nothing of the runtime on it. A second run changes nothing; drift.yml finds no drift and bullseye
out of service.

On a lab of its own (module scope; state in .lab-state/pytest-<pid>-releases): three
``l40s-4x-switch`` nodes, so that the release is the only difference. Three playbook runs.
"""

from __future__ import annotations

import json
import re

import pytest

from lab import rootfs
from tests.fleet.conftest import _ensure_path
from tests.harness.lab import Lab, own_lab

pytestmark = [pytest.mark.slow, pytest.mark.needs_lab]

PROFILE = "l40s-4x-switch"
RELEASES = ("bookworm", "trixie", "bullseye")
MEASURED, REFUSED = ("node1", "node2"), "node3"
GATE_MARKER = "/run/gpufleet/nccl-gate.json"
#: What boot validation's runtime puts on a node (role boot_validation's defaults): none of it may
#: be on the refused node.
RUNTIME_PATHS = ("/opt/gpufleet", "/etc/gpufleet/validate", "/etc/systemd/system/gpufleet-validate.service")


class ReleasesLab(Lab):
    def up(self):
        # a root filesystem not cached yet is built first (scripts/setup.sh starts the builds)
        super().up("--os", ",".join(RELEASES), timeout=900)


@pytest.fixture(scope="module")
def fleet():
    """The module's fleet after site.yml's first run (``fleet.first_run``)."""
    with own_lab([PROFILE] * len(RELEASES), "releases", lab_class=ReleasesLab) as lab:
        _ensure_path()
        lab.first_run = lab.site(label="site.yml (bookworm, trixie, bullseye: first run)")
        yield lab


def in_node(fleet, node, *argv):
    return fleet.fleet.machine(node).nsenter(*argv, timeout=60)


def flat(texts):
    return re.sub(r"\s+", " ", "\n".join(texts))


def assert_refused_for_its_python(run, fleet):
    python = rootfs.built("bullseye")["python"]
    failures = flat(run.host_failures(REFUSED))
    assert run.recap[REFUSED]["failed"] >= 1, run.explain()
    for needed in (
        f"{REFUSED} cannot run its own boot validation",
        f"it has python3 {python} (/usr/bin/python3)",
        "Python 3.11",
        "boot_validation_venv_python",
        "gpufleet_boot_validation=false",
    ):
        assert needed in failures, f"{needed!r} not in the refusal: {failures}"


def test_first_run_measures_bookworm_and_trixie_and_refuses_bullseye(fleet):
    run = fleet.first_run
    status = {n["name"]: n for n in fleet.status()["nodes"]}
    assert [status[f"node{i + 1}"]["os"] for i in range(3)] == list(RELEASES)
    for node in MEASURED:
        assert fleet.recap_ok(run, node), run.explain()
        proc = in_node(fleet, node, "cat", GATE_MARKER)
        assert proc.returncode == 0, f"{node}: no gate verdict: {proc.stderr}"
        marker = json.loads(proc.stdout)
        assert marker["passed"] is True and marker["boot_id"] == fleet.fleet.machine(node).boot_id(), marker
    assert_refused_for_its_python(run, fleet)
    pool = fleet.wait_pool(lambda p: set(p) == set(MEASURED), timeout=60)
    assert set(pool) == set(MEASURED), pool
    for node in MEASURED:
        assert pool[node]["state"] == "ready" and pool[node]["op_state"] == "running", pool[node]


def test_nothing_of_the_runtime_is_on_the_refused_node(fleet):
    assert fleet.first_run.recap[REFUSED]["failed"] >= 1
    present = in_node(
        fleet, REFUSED, "sh", "-c", 'for p in "$@"; do [ -e "$p" ] && echo "$p"; done; true', "-", *RUNTIME_PATHS
    )
    assert present.returncode == 0 and present.stdout.split() == [], present.stdout
    # nor the venv package the runtime would have needed
    venv = in_node(fleet, REFUSED, "dpkg-query", "-W", "-f=${Status}", "python3-venv")
    assert "install ok installed" not in venv.stdout, venv.stdout
    assert in_node(fleet, REFUSED, "test", "-e", GATE_MARKER).returncode != 0, "the refused node was measured"


def test_second_run_changes_nothing(fleet):
    run = fleet.site(label="site.yml (bookworm, trixie, bullseye: second run)")
    changed = {h: r["changed"] for h, r in run.recap.items() if r["changed"]}
    assert not changed, f"changed on a second run: {changed}\n{run.explain()}"
    for node in MEASURED:
        assert fleet.recap_ok(run, node), run.explain()
    assert_refused_for_its_python(run, fleet)
    assert set(fleet.pool()) == set(MEASURED)


def test_drift_is_clean(fleet):
    drift = fleet.drift(label="drift.yml --check --diff (bookworm, trixie, bullseye)")
    assert drift.run.rc == 0, drift.run.explain()
    report = drift.report
    assert report["drifted"] == [], report
    assert report["out_of_service"] == [REFUSED], report
    for node in MEASURED:
        assert report["nodes"][node] == [], report["nodes"][node]
        assert re.search(rf"^{node}\s+clean\s", drift.table, re.M), drift.table
    assert {item["kind"] for item in report["nodes"][REFUSED]} == {"out_of_service"}, report["nodes"][REFUSED]
    assert set(fleet.pool()) == set(MEASURED)
