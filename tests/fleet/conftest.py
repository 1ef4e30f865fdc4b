# SPDX-License-Identifier: GPL-3.0-or-later
"""End-to-end tests of the playbooks on a lab fleet of their own.

One lab per test session (default two nodes: a healthy ``l40s-4x-switch`` and the
``l40s-x8-degraded`` node that must never be registered; ``GPUFLEET_FLEET_PROFILES=a,b,...``
picks others), in ``.lab-state/pytest-fleet-<pid>`` (never the default ``.lab-state`` nor
``inventories/lab/hosts.yml``), brought down at the end of the session.  ``ansible-playbook``
runs from the repository root with ``-i <state>/hosts.yml``; the drift report goes to
``<state>/drift`` (never the repository's ``./drift``).  Node state is read with
pytest-testinfra (``ansible://`` backend on the lab's inventory: plain SSH with its key).

The tests change the fleet (reboots, faults): every test that needs the converged fleet asks
for the ``converged`` fixture, which re-runs site.yml only when an earlier test left the fleet
changed (``fleet.dirty``).  Wall times of every playbook run are printed at the end.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
PROFILES = [p.strip() for p in os.environ.get(
    "GPUFLEET_FLEET_PROFILES", "l40s-4x-switch,l40s-x8-degraded").split(",") if p.strip()]
BACKEND = "vllm_pool"
PLAYBOOK_TIMEOUT = 900

_RECAP = re.compile(r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
                    r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)\s+"
                    r"skipped=(?P<skipped>\d+)\s+rescued=(?P<rescued>\d+)\s+ignored=(?P<ignored>\d+)",
                    re.M)
_TIMINGS: list[tuple[str, float, int]] = []


def _prerequisites():
    if os.geteuid() != 0:
        return "the lab needs root"
    try:
        from lab import preflight
        preflight.check()
    except Exception as exc:  # LabError, or a host without the lab's programs
        return str(exc)
    return None


_MISSING = _prerequisites()


def pytest_collection_modifyitems(config, items):
    """Without the lab's prerequisites every fleet test is skipped, saying why."""
    if not _MISSING:
        return
    skip = pytest.mark.skip(reason=f"lab prerequisites: {_MISSING}")
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    if not _TIMINGS:
        return
    terminalreporter.section("fleet: ansible-playbook wall times")
    for label, seconds, rc in _TIMINGS:
        terminalreporter.write_line(f"{seconds:7.1f} s  rc={rc}  {label}")
    terminalreporter.write_line(f"{sum(t for _, t, _ in _TIMINGS):7.1f} s  in all")


@dataclass
class Run:
    """One ansible-playbook run: exit status, output, PLAY RECAP per host, wall time."""
    argv: list
    rc: int
    output: str
    seconds: float
    recap: dict = field(default_factory=dict)

    @classmethod
    def make(cls, argv, rc, output, seconds):
        recap = {m["host"]: {k: int(v) for k, v in m.groupdict().items() if k != "host"}
                 for m in _RECAP.finditer(output)}
        return cls(argv, rc, output, seconds, recap)

    def explain(self):
        return f"`{' '.join(map(str, self.argv))}` exited {self.rc} in {self.seconds:.1f} s:\n{self.output[-6000:]}"

    def host_failures(self, host):
        """The messages of the tasks that failed on host (default callback, YAML results)."""
        return re.findall(rf"^fatal: \[{re.escape(host)}(?: -> [^\]]+)?\]: FAILED! =>.*?(?=^\S|\Z)",
                          self.output, re.M | re.S)


@dataclass
class Drift:
    run: Run
    report: dict
    table: str
    prom: str


class LabFleet:
    """The session's lab: `lab` verbs, playbook runs, the balancer, testinfra hosts."""

    def __init__(self, state: Path):
        self.repo = REPO
        self.state = state
        self.inventory = state / "hosts.yml"
        self.drift_dir = state / "drift"
        self.dirty = True  # not converged until site.yml has run
        self.first_run: Run | None = None
        self.first_pool: dict = {}
        self.first_config: dict = {}
        self._hosts = {}
        self._status = None

    # --- the lab ------------------------------------------------------------------------------
    def lab(self, *args, check=True, timeout=180):
        if args and args[0] in ("reboot", "stop", "start", "balancer"):
            self._status = None
            self.dirty = True
        proc = subprocess.run([sys.executable, "-m", "lab", *args, "--state-dir", str(self.state)],
                              cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode:
            raise AssertionError(f"lab {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
        return proc

    def status(self, refresh=False):
        if refresh or self._status is None:
            self._status = json.loads(self.lab("status", "--json").stdout)
        return self._status

    @property
    def nodes(self):
        return {n["name"]: n for n in self.status()["nodes"]}

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
        env.update({
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "PATH": f"{VENV_BIN}:{env.get('PATH', '')}",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_STDOUT_CALLBACK": "default",
            "ANSIBLE_FORKS": str(max(len(PROFILES), 1)),
            "GPUFLEET_DRIFT_DIR": str(self.drift_dir),
        })
        env.pop("ANSIBLE_INVENTORY", None)
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def argv(self, playbook, *args, limit=None, extra_vars=None):
        argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(self.inventory), f"playbooks/{playbook}"]
        if limit:
            argv += ["--limit", limit]
        for value in extra_vars or ():
            argv += ["-e", value if isinstance(value, str) else json.dumps(value)]
        return argv + list(args)

    def playbook(self, playbook, *args, limit=None, extra_vars=None, env=None, label=None,
                 timeout=PLAYBOOK_TIMEOUT):
        argv = self.argv(playbook, *args, limit=limit, extra_vars=extra_vars)
        t0 = time.monotonic()
        proc = subprocess.run(argv, cwd=REPO, env=self.env(**(env or {})), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout, check=False)
        return self.record(argv, proc.returncode, proc.stdout, time.monotonic() - t0, label)

    def record(self, argv, rc, output, seconds, label=None):
        """A Run of argv, its wall time kept for the session's summary."""
        run = Run.make(argv, rc, output, seconds)
        _TIMINGS.append((label or " ".join(argv[3:]), run.seconds, run.rc))
        return run

    def site(self, *args, **kw):
        return self.playbook("site.yml", *args, **kw)

    def drift(self, *args, drift_dir=None, label=None, **kw):
        directory = Path(drift_dir) if drift_dir else self.drift_dir
        shutil.rmtree(directory, ignore_errors=True)
        run = self.playbook("drift.yml", "--check", "--diff", *args, label=label or "drift.yml --check --diff",
                            env={"GPUFLEET_DRIFT_DIR": directory}, **kw)

        def read(name):
            path = directory / name
            return path.read_text() if path.exists() else ""

        report = json.loads(read("report.json") or "{}")
        return Drift(run, report, read("report.txt"), read("gpufleet_drift.prom"))

    def converge(self, why=None):
        """Run site.yml when the fleet is not known to be converged; the first run is kept."""
        if not self.dirty and not why:
            return self.first_run
        # A gate verdict holds for its boot: a node that a fault test failed is measured again.
        extra = [] if self.first_run is None else ["nccl_gate_force=true"]
        label = f"site.yml (converge{': ' + why if why else ''})" if self.first_run else "site.yml (first run)"
        run = self.site(extra_vars=extra, label=label)
        if self.first_run is None:
            # What the first run left, for the tests that judge it whatever ran since.
            self.first_run, self.first_pool, self.first_config = run, self.pool(), self.config_servers()
        for node in self.healthy:
            assert self.recap_ok(run, node), f"site.yml did not converge {node}: {run.explain()}"
        self.dirty = False
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
        """{name: server} of the vLLM backend, from HAProxy's runtime API."""
        from ansible_collections.gpufleet.node.plugins.module_utils._haproxy import RuntimeAPI
        return RuntimeAPI(self.balancer["runtime_socket"]).servers(self.balancer["backend"])

    def config_servers(self):
        """{name: 'address:port'} of the backend's `server` lines in HAProxy's config file."""
        text = Path(self.balancer["config"]).read_text()
        section = re.search(rf"^backend\s+{BACKEND}\s*$(.*?)(?=^\S|\Z)", text, re.M | re.S)
        assert section, f"no backend {BACKEND} in {self.balancer['config']}"
        return {m[1]: m[2] for m in re.finditer(r"^\s+server\s+(\S+)\s+(\S+)", section[1], re.M)}

    def deregister(self, node):
        """Take node out of the pool behind the playbooks' back (test set-up only)."""
        from ansible_collections.gpufleet.node.plugins.module_utils._haproxy import (
            RuntimeAPI, config_with_server)
        api = RuntimeAPI(self.balancer["runtime_socket"])
        if node in api.servers(BACKEND):
            api.run(f"set server {BACKEND}/{node} state maint")
            api.run(f"del server {BACKEND}/{node}")
        config = Path(self.balancer["config"])
        config.write_text(config_with_server(config.read_text(), BACKEND, node, None))
        self.dirty = True

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
        """What the node's HAProxy agent answers the balancer (asked from the node itself)."""
        return self.sh(node, "python3 -c 'import socket; print(socket.create_connection((\"127.0.0.1\", 9777), 5)"
                             ".makefile().readline().strip())'").strip()

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
def fleet():
    """The session's lab (PROFILES), up for the whole session, down at its end."""
    if _MISSING:
        pytest.skip(f"lab prerequisites: {_MISSING}")
    _ensure_path()
    state = REPO / ".lab-state" / f"pytest-fleet-{os.getpid()}"
    f = LabFleet(state)
    f.lab("down", check=False)
    shutil.rmtree(state, ignore_errors=True)
    t0 = time.monotonic()
    try:
        f.lab("up", "--profiles", ",".join(PROFILES))
        _TIMINGS.append((f"lab up --profiles {','.join(PROFILES)}", time.monotonic() - t0, 0))
        yield f
    finally:
        f.lab("down", check=False)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def first_run(fleet):
    """site.yml's first run on the fresh fleet (whatever ran since)."""
    if fleet.first_run is None:
        fleet.converge()
    return fleet.first_run


@pytest.fixture
def converged(fleet):
    """The fleet as site.yml leaves it (re-converged only when an earlier test changed it)."""
    fleet.converge()
    return fleet
