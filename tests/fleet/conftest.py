# SPDX-License-Identifier: GPL-3.0-or-later
"""End-to-end tests of the playbooks on the fleet nodes of the session's lab.

The lab is tests/conftest.py's `session_lab` (one per pytest run, shared with tests/lab and the
operations tests); this fleet is its first nodes (default two: a healthy ``l40s-4x-switch`` and the
``l40s-x8-degraded`` node that must never be registered; ``GPUFLEET_FLEET_PROFILES=a,b,...``
picks others), reached through an inventory of those nodes only (``<state>/hosts-fleet.yml``).
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

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab import haproxy
from tests import support

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
PROFILES = support.FLEET_PROFILES
BACKEND = "vllm_pool"
PLAYBOOK_TIMEOUT = 900

_MISSING = support.lab_prerequisites()


def pytest_collection_modifyitems(config, items):
    """Without the lab's prerequisites every fleet test is skipped, saying why."""
    if not _MISSING:
        return
    skip = pytest.mark.skip(reason=f"lab prerequisites: {_MISSING}")
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(skip)


Run = support.PlaybookRun


@dataclass
class Drift:
    run: Run
    report: dict
    table: str
    prom: str


class LabFleet:
    """The fleet's nodes of the session's lab: `lab` verbs, playbook runs, the balancer, testinfra."""

    def __init__(self, session):
        self.repo = REPO
        self.session = session
        self.state = session.state
        self.names = list(session.fleet_nodes)
        self.inventory = session.inventory(self.names, "fleet")
        self.drift_dir = self.state / "drift"
        self._dirty = set(self.names)  # not converged until site.yml has run on them
        self.first_run: Run | None = None
        self.first_pool: dict = {}
        self.first_config: dict = {}
        self._hosts = {}
        self._status = None

    # --- the lab ------------------------------------------------------------------------------
    @property
    def dirty(self):
        """Nodes not known to be as site.yml leaves them."""
        return sorted(self._dirty)

    def changed(self, *nodes):
        """A test changed these nodes (all when none are named): converge runs site.yml on them."""
        self._dirty |= set(nodes or self.names)

    def restored(self, *nodes):
        """A test put these nodes back as site.yml leaves them (and checked that it did)."""
        self._dirty -= set(nodes or self.names)

    def lab(self, *args, check=True, timeout=180):
        if args and args[0] in ("reboot", "stop", "start"):
            self._status = None
            self.changed(args[1])
        elif args and args[0] == "balancer":
            # a restarted HAProxy keeps the servers of its config file; still, nobody checked
            self._status = None
            self.changed(*self.healthy)
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "lab", *args, "--state-dir", str(self.state)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if args and args[0] in ("reboot", "start"):  # a boot waits for the node's boot validation
            support.LAB_TIMINGS.append((f"lab {' '.join(args)}", time.monotonic() - t0, proc.returncode))
        if check and proc.returncode:
            raise AssertionError(f"lab {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
        return proc

    def status(self, refresh=False):
        if refresh or self._status is None:
            self._status = json.loads(self.lab("status", "--json").stdout)
        return self._status

    @property
    def nodes(self):
        """{name: status} of the fleet's nodes (the lab's other nodes are other tests')."""
        return {n["name"]: n for n in self.status()["nodes"] if n["name"] in self.names}

    @property
    def healthy(self):
        return [n for n, spec in self.nodes.items() if spec["expect_registered"]]

    @property
    def refused(self):
        return [n for n, spec in self.nodes.items() if not spec["expect_registered"]]

    def hw(self, node):
        import lab.hwmodel as hw

        return hw.Node.load(self.state / "nodes" / node / "hw")

    def reboot(self, node):
        self.lab("reboot", node)

    # --- ansible ------------------------------------------------------------------------------
    def env(self, **extra):
        env = dict(os.environ)
        env.update(
            {
                "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                "PATH": f"{VENV_BIN}:{env.get('PATH', '')}",
                "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_FORCE_COLOR": "0",
                "ANSIBLE_STDOUT_CALLBACK": "default",
                "ANSIBLE_FORKS": str(max(len(PROFILES), 1)),
                "GPUFLEET_DRIFT_DIR": str(self.drift_dir),
                # the inventory's secrets are vaulted (group_vars/all/vault.yml next to it)
                "ANSIBLE_VAULT_PASSWORD_FILE": str(self.session.vault_password_file),
            }
        )
        env.pop("ANSIBLE_INVENTORY", None)
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def argv(self, playbook, *args, limit=None, extra_vars=None):
        return support.playbook_argv(playbook, *args, inventory=self.inventory, limit=limit, extra_vars=extra_vars)

    def playbook(self, playbook, *args, limit=None, extra_vars=None, env=None, label=None, timeout=PLAYBOOK_TIMEOUT):
        run = support.run_playbook(
            playbook,
            *args,
            inventory=self.inventory,
            limit=limit,
            extra_vars=extra_vars,
            env=self.env(**(env or {})),
            timeout=timeout,
            merge_stderr=True,
        )
        support.LAB_TIMINGS.append((label or " ".join(run.argv[3:]), run.seconds, run.rc))
        return run

    def record(self, argv, rc, output, seconds, label=None):
        """A Run of argv (run by the test itself), its wall time kept for the session's summary."""
        run = Run(argv, rc, output, "", seconds, support.parse_recap(output))
        support.LAB_TIMINGS.append((label or " ".join(map(str, argv[3:])), run.seconds, run.rc))
        return run

    def site(self, *args, **kw):
        return self.playbook("site.yml", *args, **kw)

    def drift(self, *args, drift_dir=None, label=None, **kw):
        directory = Path(drift_dir) if drift_dir else self.drift_dir
        shutil.rmtree(directory, ignore_errors=True)
        run = self.playbook(
            "drift.yml",
            "--check",
            "--diff",
            *args,
            label=label or "drift.yml --check --diff",
            env={"GPUFLEET_DRIFT_DIR": directory},
            **kw,
        )

        def read(name):
            path = directory / name
            return path.read_text() if path.exists() else ""

        report = json.loads(read("report.json") or "{}")
        return Drift(run, report, read("report.txt"), read("gpufleet_drift.prom"))

    def converge(self, why=None, nodes=None):
        """Run site.yml on the nodes (default all) not known to be converged, limited to them, or
        on all of `nodes` when `why`; the first run is always on the whole fresh fleet, and kept."""
        nodes = list(nodes or self.names)
        targets = [n for n in nodes if n in self._dirty] or (nodes if why else [])
        if self.first_run is not None and not targets:
            return self.first_run
        if self.first_run is None:
            targets, limit, extra, label = list(self.names), None, [], "site.yml (first run)"
        else:
            # A gate verdict holds for its boot: a node that a fault test failed is measured again.
            limit = None if set(targets) == set(self.names) else ",".join(targets)
            extra = ["nccl_gate_force=true"]
            label = f"site.yml{' --limit ' + limit if limit else ''} (converge{': ' + why if why else ''})"
        run = self.site(limit=limit, extra_vars=extra, label=label)
        if self.first_run is None:
            # What the first run left, for the tests that judge it whatever ran since.
            self.first_run, self.first_pool, self.first_config = run, self.pool(), self.config_servers()
        for node in self.healthy:
            if node in targets:
                assert self.recap_ok(run, node), f"site.yml did not converge {node}: {run.explain()}"
        self.restored(*targets)
        return run

    def restore(self, node, tags, label, extra_vars=None):
        """A cheaper way back than converge, where a test knows what its fault undid (the gate's
        verdict of this boot intact): site.yml --tags TAGS on node, which must pass and put the
        node back in the pool, ready and running (AssertionError otherwise: the documented
        restore is under test too; the node stays changed, so the next converge runs site.yml on
        it).  Returns the run."""
        run = self.site("--tags", tags, limit=node, extra_vars=extra_vars, label=label)
        assert run.rc == 0 and self.recap_ok(run, node), f"{label} failed:\n{run.explain()}"
        pool = self.wait_pool(lambda p: p.get(node, {}).get("op_state") == "running", timeout=60)
        assert pool.get(node, {}).get("state") == "ready" and pool[node]["op_state"] == "running", (
            f"{label} passed, but {node} is not back in the pool: {pool.get(node)}"
        )
        self.restored(node)
        return run

    @staticmethod
    def recap_ok(run, host):
        r = run.recap.get(host)
        return bool(r) and r["failed"] == 0 and r["unreachable"] == 0

    # --- the balancer -------------------------------------------------------------------------
    @property
    def balancer(self):
        return self.status()["balancer"]

    def pool(self):
        """{name: server} of the fleet's nodes in the vLLM backend, from HAProxy's runtime API, read
        by the lab's own reader (lab/haproxy.py; the spare node of the session's lab may be there
        too: the operations tests' business)."""
        servers = haproxy.pool(self.balancer["runtime_socket"], self.balancer["backend"])
        return {name: server for name, server in servers.items() if name not in self.session_only()}

    def session_only(self):
        """Names of the lab's nodes that are not this fleet's."""
        return {n["name"] for n in self.status()["nodes"]} - set(self.names)

    def config_servers(self):
        """{name: 'address:port'} of the backend's `server` lines in HAProxy's config file."""
        servers = haproxy.config_servers(Path(self.balancer["config"]).read_text(), BACKEND)
        return {name: address for name, address in servers.items() if name not in self.session_only()}

    def deregister(self, node):
        """Take node out of the pool behind the playbooks' back (test set-up only)."""
        sock = self.balancer["runtime_socket"]
        if node in haproxy.pool(sock, BACKEND):
            haproxy.remove_server(sock, BACKEND, node)
        config = Path(self.balancer["config"])
        config.write_text(haproxy.config_with_server(config.read_text(), BACKEND, node))
        self.changed(node)

    def wait_pool(self, predicate, timeout=20.0):
        """Poll the pool until predicate(pool) holds; return the last pool seen."""
        deadline = time.monotonic() + timeout
        while True:
            pool = self.pool()
            if predicate(pool) or time.monotonic() > deadline:
                return pool
            time.sleep(0.5)

    # --- testinfra ----------------------------------------------------------------------------
    def host(self, node):
        """A testinfra host for node (ansible:// backend on the lab's inventory: SSH with its key)."""
        if node not in self._hosts:
            import testinfra

            self._hosts[node] = testinfra.get_host(f"ansible://{node}", ansible_inventory=str(self.inventory))
        return self._hosts[node]

    def agent(self, node):
        """What the node's HAProxy agent answers the balancer: asked from the host, whose end of the
        node's link is the balancer's address as the node sees it (the only one it answers)."""
        import socket

        with socket.create_connection((self.nodes[node]["address"], 9777), 5) as conn:
            return conn.makefile().readline().strip()

    def unit_state(self, node, unit):
        """{ActiveState, SubState, Result} of a unit on node."""
        out = self.sh(node, f"systemctl show -p ActiveState,SubState,Result {unit}")
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def sh(self, node, command):
        """Run a command on node; fail with its output when it exits non-zero."""
        result = self.host(node).run(command)
        assert result.rc == 0, f"{node}: `{command}` exited {result.rc}: {result.stdout}{result.stderr}"
        return result.stdout


def _ensure_path():
    # testinfra's ansible backend calls ansible-inventory from PATH.
    path = os.environ.get("PATH", "")
    if str(VENV_BIN) not in path.split(os.pathsep):
        os.environ["PATH"] = f"{VENV_BIN}{os.pathsep}{path}"


@pytest.fixture(scope="session")
def fleet(session_lab):
    """The fleet's nodes of the session's lab (PROFILES)."""
    if _MISSING:
        pytest.skip(f"lab prerequisites: {_MISSING}")
    _ensure_path()
    return LabFleet(session_lab)


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
