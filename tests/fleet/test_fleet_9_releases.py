# SPDX-License-Identifier: GPL-3.0-or-later
"""A fleet of three Debian releases: node1 bookworm (Python 3.11, the controller's root), node2
trixie (3.13) and node3 bullseye (3.9), each of the last two on its release's own root filesystem
(lab/rootfs.py), which has nothing the roles install.

The fleet runs the example inventory (inventories/example/group_vars as written): the lab
substitutes only its nodes and balancer for the example's placeholders and, as host variables of
each node, what it simulates (``SUBSTITUTED``), so that the first run walks the README's real-fleet
section on nodes that share nothing with the controller.

One site.yml run leaves bookworm and trixie measured (the NCCL gate passed in this boot) and in the
pool; bullseye's Python cannot run the node's own boot validation (ansible-core 2.19 needs 3.11 or
later, Debian 11 has no package of one), so that node is refused before its runtime is installed,
with a message naming its Python, what is needed and what to do, and stays out of rotation
(drained, known to the balancer) with nothing of the runtime on it. A second run changes nothing; drift.yml (on trixie and bullseye:
bookworm's drift is the other fleet tests') finds no drift and bullseye out of service. Rebooted
together, bookworm and trixie come back into rotation by their own boot validation. Bullseye with
``gpufleet_boot_validation=false`` is measured and put in the pool, and the same run again
changes nothing.

On a lab of its own (module scope; state in .lab-state/pytest-<pid>-releases): three
``l40s-4x-switch`` nodes, so that the release is the only difference. Three playbook runs on the
fleet, a drift check on two nodes, two single-node runs and one reboot of two nodes.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from lab import rootfs
from tests.fleet.conftest import _ensure_path
from tests.harness import REPO, VENV_BIN
from tests.harness.lab import Lab, own_lab

pytestmark = [pytest.mark.slow, pytest.mark.needs_lab]

PROFILE = "l40s-4x-switch"
RELEASES = ("bookworm", "trixie", "bullseye")
MEASURED, REFUSED = ("node1", "node2"), "node3"
GATE_MARKER = "/run/gpufleet/nccl-gate.json"
#: What boot validation's runtime puts on a node (role boot_validation's defaults): none of it may
#: be on the refused node.
RUNTIME_PATHS = ("/opt/gpufleet", "/etc/gpufleet/validate", "/etc/systemd/system/gpufleet-validate.service")
EXAMPLE = REPO / "inventories" / "example"
#: The example's variables the lab substitutes (its balancer's socket, backend and config file for
#: the example's placeholders; its vLLM stand-in and that stand-in's model, for Docker, which the
#: lab has no engine for): host variables of each node, which win over the copied group_vars.
SUBSTITUTED = (
    "lb_registration_socket",
    "lb_registration_backend",
    "lb_registration_config_file",
    "vllm_server_runtime",
    "vllm_server_model",
)


class ReleasesLab(Lab):
    def up(self):
        # a root filesystem not cached yet is built first (scripts/setup.sh starts the builds)
        super().up("--os", ",".join(RELEASES), timeout=900)

    @property
    def fleet_inventory(self):
        """<state>/example-inventory/: the example's group_vars as written, the lab's vaulted
        secrets beside them, and the lab's hosts, each with the lab's values of SUBSTITUTED."""
        if self._fleet_inventory is None:
            directory = self.state / "example-inventory"
            shutil.copytree(EXAMPLE / "group_vars", directory / "group_vars")
            shutil.copytree(self.state / "group_vars" / "all", directory / "group_vars" / "all", dirs_exist_ok=True)
            inv = yaml.safe_load((self.state / "hosts.yml").read_text())
            nodes = inv["all"]["children"]["gpu_nodes"]
            for host in nodes["hosts"].values():
                host.update({name: nodes["vars"][name] for name in SUBSTITUTED})
            path = directory / "hosts.yml"
            path.write_text(
                f"# The lab at {self.state}, running inventories/example/group_vars\n"
                + yaml.safe_dump(inv, sort_keys=False, default_flow_style=False)
            )
            self._fleet_inventory = path
        return self._fleet_inventory

    def host_vars(self, node):
        """The variables node has in the fleet's inventory (ansible-inventory, the vault opened)."""
        proc = subprocess.run(
            [
                str(VENV_BIN / "ansible-inventory"),
                "-i",
                str(self.fleet_inventory),
                "--vault-password-file",
                str(self.vault_password_file),
                "--host",
                node,
            ],
            cwd=REPO,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, f"ansible-inventory --host {node}: {proc.stdout}{proc.stderr}"
        return json.loads(proc.stdout)


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
    # the node exporter, absent from the fresh root filesystems, was installed where missing (the
    # roles ask dpkg first and run apt only then)
    for node in MEASURED:
        proc = in_node(
            fleet, node, "dpkg-query", "--show", "--showformat=${db:Status-Status}", "prometheus-node-exporter"
        )
        assert proc.stdout == "installed", f"{node}: {proc.stdout}{proc.stderr}"
    pool = fleet.wait_pool(lambda p: fleet.ready(p) == set(MEASURED), timeout=60)
    assert fleet.ready(pool) == set(MEASURED), pool
    fleet.assert_drained(REFUSED, pool)
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
    assert fleet.ready() == set(MEASURED)


def test_the_fleet_runs_the_example_inventory(fleet):
    example = yaml.safe_load((EXAMPLE / "group_vars" / "gpu_nodes.yml").read_text())
    lab_vars = yaml.safe_load((fleet.state / "hosts.yml").read_text())["all"]["children"]["gpu_nodes"]["vars"]
    assert set(SUBSTITUTED) <= set(example), f"the example no longer sets {set(SUBSTITUTED) - set(example)}"
    for node in (*MEASURED, REFUSED):
        have = fleet.host_vars(node)
        for name, value in example.items():
            want = lab_vars[name] if name in SUBSTITUTED else value
            assert have.get(name) == want, f"{node}: {name} is {have.get(name)!r}, not {want!r}"


def test_drift_is_clean(fleet):
    nodes = (MEASURED[1], REFUSED)  # trixie and bullseye: the other fleet tests check bookworm's
    drift = fleet.drift(limit=",".join(nodes), label="drift.yml --check --diff --limit node2,node3 (trixie, bullseye)")
    assert drift.run.rc == 0, drift.run.explain()
    report = drift.report
    assert sorted(report["nodes"]) == sorted(nodes), report
    assert report["drifted"] == [], report
    assert report["out_of_service"] == [REFUSED], report
    assert report["nodes"][MEASURED[1]] == [], report["nodes"][MEASURED[1]]
    assert re.search(rf"^{MEASURED[1]}\s+clean\s", drift.table, re.M), drift.table
    assert {item["kind"] for item in report["nodes"][REFUSED]} == {"out_of_service"}, report["nodes"][REFUSED]
    assert fleet.ready() == set(MEASURED)


def test_a_reboot_puts_bookworm_and_trixie_back_in_rotation(fleet):
    """No playbook: each node's boot validation (trixie's in its Python 3.13 venv) measures it
    again in the new boot and puts it back in the pool."""
    machines = {node: fleet.fleet.machine(node) for node in MEASURED}
    before = {node: m.boot_id() for node, m in machines.items()}
    fleet.reboot(*MEASURED)
    for node, m in machines.items():
        boot = m.boot_id()
        assert boot != before[node], f"{node} did not boot again"
        unit = in_node(fleet, node, "systemctl", "show", "-p", "ActiveState,Result", "gpufleet-validate.service")
        journal = in_node(fleet, node, "journalctl", "-b", "-u", "gpufleet-validate.service", "--no-pager")
        state = dict(line.split("=", 1) for line in unit.stdout.splitlines() if "=" in line)
        assert state == {"ActiveState": "active", "Result": "success"}, (state, journal.stdout[-3000:])
        proc = in_node(fleet, node, "cat", GATE_MARKER)
        assert proc.returncode == 0, f"{node}: no gate verdict after the reboot: {journal.stdout[-3000:]}"
        marker = json.loads(proc.stdout)
        assert marker["passed"] is True and marker["boot_id"] == boot, marker
    # the agent lets HAProxy take each node back once its check sees the new verdict
    pool = fleet.wait_pool(
        lambda p: all(p.get(node, {}).get("op_state") == "running" for node in MEASURED), timeout=120
    )
    for node in MEASURED:
        assert pool.get(node, {}).get("state") == "ready" and pool[node]["op_state"] == "running", pool
    fleet.restored(*MEASURED)


def bullseye_without_boot_validation(fleet, label):
    return fleet.site(limit=REFUSED, extra_vars=["gpufleet_boot_validation=false"], label=label)


def test_bullseye_serves_without_boot_validation(fleet):
    run = bullseye_without_boot_validation(fleet, "site.yml --limit node3 -e gpufleet_boot_validation=false")
    assert run.rc == 0 and fleet.recap_ok(run, REFUSED), run.explain()
    proc = in_node(fleet, REFUSED, "cat", GATE_MARKER)
    assert proc.returncode == 0, f"{REFUSED}: no gate verdict: {proc.stderr}\n{run.explain()}"
    marker = json.loads(proc.stdout)
    assert marker["passed"] is True and marker["boot_id"] == fleet.fleet.machine(REFUSED).boot_id(), marker
    pool = fleet.wait_pool(lambda p: p.get(REFUSED, {}).get("op_state") == "running", timeout=60)
    assert pool.get(REFUSED, {}).get("state") == "ready" and pool[REFUSED]["op_state"] == "running", pool
    # still nothing of boot validation's runtime
    present = in_node(
        fleet, REFUSED, "sh", "-c", 'for p in "$@"; do [ -e "$p" ] && echo "$p"; done; true', "-", *RUNTIME_PATHS
    )
    assert present.returncode == 0 and present.stdout.split() == [], present.stdout

    again = bullseye_without_boot_validation(fleet, "site.yml --limit node3 -e gpufleet_boot_validation=false (again)")
    assert again.rc == 0 and fleet.recap_ok(again, REFUSED), again.explain()
    assert again.recap[REFUSED]["changed"] == 0, f"changed on the same run again:\n{again.explain()}"
    assert fleet.ready() == {*MEASURED, REFUSED}
