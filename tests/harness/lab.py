# SPDX-License-Identifier: GPL-3.0-or-later
"""The labs of a test run: whether one can run here, the fleet's profiles, and the one lab class.

``Lab`` is the session's lab (tests/conftest.py's ``session_lab``: the fleet of
GPUFLEET_FLEET_PROFILES plus a spare node, which tests/fleet, tests/lab and the operations tests
share) and a module's lab of its own (``own_lab(profiles, name)``): ``lab`` verbs, the nodes'
status and hardware, inventories, SSH and testinfra, playbook runs (the lab's vault password
passed to each run, never exported to the test process), the balancer's pool, and the
bookkeeping that keeps the fleet tests' playbook runs few (``converge``, ``restore``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from lab import haproxy
from tests.harness import REPO, VENV_BIN
from tests.harness.playbook import PlaybookRun, playbook_argv, run_playbook
from tests.harness.ssh import ssh

FLEET_PROFILES = [
    p.strip()
    for p in os.environ.get("GPUFLEET_FLEET_PROFILES", "l40s-4x-switch,l40s-x8-degraded,a6000-4090-hetero").split(",")
    if p.strip()
]
SPARE_PROFILE = "l40s-4x-switch"
BACKEND = "vllm_pool"
PLAYBOOK_TIMEOUT = 900

LAB_TIMINGS: list = []  # (label, seconds, rc) of lab boots and lab playbook runs, for the run's summary


def lab_prerequisites(prometheus=False):
    """Why the lab cannot run on this machine (root, its programs, the kernel's namespaces), or
    None.  prometheus: the operations tests' modules also need prometheus_client, on the
    controller and in the nodes' python3."""
    if os.geteuid() != 0:
        return "the lab needs root"
    try:
        from lab import preflight

        preflight.check()
    except Exception as exc:  # LabError, or a host without the lab's programs
        return str(exc)
    if prometheus:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            return "prometheus-client is not installed"
        if subprocess.run(
            ["/usr/bin/python3", "-c", "import prometheus_client"], capture_output=True, check=False
        ).returncode:
            return "the nodes' python3 lacks prometheus_client (Debian package python3-prometheus-client)"
    return None


def gpu_memory_sizes(profile):
    """The distinct GPU memory sizes (MiB) of a lab profile, from the hardware model."""
    import lab.hwmodel as hw

    models = []

    def walk(node):
        if node.get("kind") == "gpu":
            models.append(node["model"])
        for child in node.get("children", []) + ([node["child"]] if node.get("child") else []):
            walk(child)

    for bridge in hw.PROFILES[profile]["host_bridges"]:
        for port in bridge["root_ports"]:
            walk(port)
    return {hw.profiles.GPU_MODELS[m]["memory_total_mib"] for m in models}


#: The fleet's nodes that `gpufleet_serving_backend: auto` must serve with llama.cpp: GPUs of
#: different sizes (the lab's own reading of the rule, not the collection's code).
FLEET_LLAMACPP_NODES = [f"node{i + 1}" for i, p in enumerate(FLEET_PROFILES) if len(gpu_memory_sizes(p)) > 1]


def server_unit(node):
    """The serving unit a converged fleet node runs."""
    return "llama-server.service" if node in FLEET_LLAMACPP_NODES else "vllm.service"


def lab_command(state, *args, check=True, timeout=180):
    """`python -m lab VERB ... --state-dir STATE`; AssertionError (with its output) on failure."""
    proc = subprocess.run(
        [sys.executable, "-m", "lab", *map(str, args), "--state-dir", str(state)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode:
        raise AssertionError(f"lab {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc


@dataclass
class Drift:
    """drift.yml's run and what it wrote: the JSON report, the table, the Prometheus textfile."""

    run: PlaybookRun
    report: dict
    table: str
    prom: str


class Lab:
    """A lab of a pytest run: nodes node1..nodeN of ``fleet_profiles`` (the fleet; default
    GPUFLEET_FLEET_PROFILES: a healthy ``l40s-4x-switch``, the ``l40s-x8-degraded`` node that must
    never be registered, the heterogeneous node llama.cpp serves), and with ``spare`` one more
    node (``l40s-4x-switch``), where the tests of the lab itself and the operations tests change
    things, each establishing the state it needs there first.  State in ``state`` (never the
    default ``.lab-state`` nor ``inventories/lab/hosts.yml``); each group of tests gets an
    inventory of its own nodes (``inventory(nodes, name)``), the fleet's is ``fleet_inventory``.

    The fleet's nodes count as converged (as site.yml leaves them) only after site.yml ran on them:
    a test that changes a node says ``changed(node)`` (a reboot, a power cycle or a balancer verb
    through ``lab`` says it itself), one that puts it back ``restored(node)``, and ``converge``
    runs site.yml only on the nodes not known to be converged."""

    def __init__(self, state, fleet_profiles=None, spare=True):
        self.state = Path(state)
        self.fleet_profiles = list(fleet_profiles or FLEET_PROFILES)
        self.profiles = self.fleet_profiles + ([SPARE_PROFILE] if spare else [])
        self.fleet_nodes = [f"node{i + 1}" for i in range(len(self.fleet_profiles))]
        self.spare = f"node{len(self.profiles)}" if spare else None
        self.up_seconds = None
        self.drift_dir = self.state / "drift"
        self._dirty = set(self.fleet_nodes)  # not converged until site.yml has run on them
        self.first_run: PlaybookRun | None = None
        self.first_pool: dict = {}
        self.first_config: dict = {}
        self._fleet_inventory = None
        self._hosts = {}
        self._status = None

    # --- the lab ------------------------------------------------------------------------------
    def up(self, *options, timeout=400):
        """`lab up --profiles ...` (and options, e.g. `--os`) on a fresh state directory."""
        self.lab("down", check=False)
        shutil.rmtree(self.state, ignore_errors=True)
        argv = ("up", "--profiles", ",".join(self.profiles), *options)
        t0 = time.monotonic()
        self.lab(*argv, timeout=timeout)
        self.up_seconds = time.monotonic() - t0
        LAB_TIMINGS.append((f"lab {' '.join(argv)}", self.up_seconds, 0))

    def down(self):
        """Down on the first try (a second would hide a cgroup not yet empty), then the state
        directory goes."""
        try:
            self.lab("down", timeout=120)
        finally:
            shutil.rmtree(self.state, ignore_errors=True)

    def lab(self, *args, check=True, timeout=180):
        """`python -m lab VERB ...` on this lab (lab_command); a reboot, stop or start marks the
        node changed, a balancer verb the healthy nodes, and a boot's wall time is kept."""
        if args and args[0] in ("reboot", "stop", "start"):
            self._status = None
            self.changed(*args[1:])
        elif args and args[0] == "balancer":
            # a restarted HAProxy keeps the servers of its config file; still, nobody checked
            self._status = None
            self.changed(*self.healthy)
        t0 = time.monotonic()
        proc = lab_command(self.state, *args, check=False, timeout=timeout)
        if args and args[0] in ("reboot", "start"):  # a boot waits for the node's boot validation
            LAB_TIMINGS.append((f"lab {' '.join(map(str, args))}", time.monotonic() - t0, proc.returncode))
        if check and proc.returncode:
            raise AssertionError(
                f"lab {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )
        return proc

    def reboot(self, *nodes):
        """`lab reboot NODE...`: the nodes power-cycled together (a boot waits for each one's boot
        validation)."""
        self.lab("reboot", *nodes)

    def status(self, refresh=False):
        """`lab status --json` (kept until a verb changes it, or refresh)."""
        if refresh or self._status is None:
            self._status = json.loads(self.lab("status", "--json").stdout)
        return self._status

    @property
    def fleet(self):
        """lab.fleet.Fleet of this lab (records, balancer, machines, lock)."""
        from lab.fleet import Fleet

        return Fleet(self.state)

    @property
    def nodes(self):
        """{name: status} of the fleet's nodes (the spare node is other tests')."""
        return {n["name"]: n for n in self.status()["nodes"] if n["name"] in self.fleet_nodes}

    @property
    def healthy(self):
        return [n for n, spec in self.nodes.items() if spec["expect_registered"]]

    @property
    def refused(self):
        return [n for n, spec in self.nodes.items() if not spec["expect_registered"]]

    def spec(self, node):
        """The node's entry in the lab's records (name, address, ssh_port, profile, ...)."""
        return next(n for n in self.fleet.data()["nodes"] if n["name"] == node)

    def hw(self, node):
        import lab.hwmodel as hw

        return hw.Node.load(self.state / "nodes" / node / "hw")

    @property
    def key(self):
        return self.state / "ssh" / "id_ed25519"

    @property
    def vault_password_file(self):
        """The lab's own copy of its vault password (0600): lab/fleet.py encrypts with it."""
        return self.state / "vault-password"

    @property
    def vault_password(self):
        """The password of the vaulted values of the lab's inventory, for one playbook run."""
        return self.vault_password_file.read_text()

    @property
    def secrets(self):
        """{variable: plain text} of the secrets vaulted in the lab's inventory (api key, HF token)."""
        return self.fleet.secrets()

    def inventory(self, nodes, name):
        """An inventory of `nodes` (and the balancer) only, written as <state>/hosts-<name>.yml."""
        inv = yaml.safe_load((self.state / "hosts.yml").read_text())
        hosts = inv["all"]["children"]["gpu_nodes"]["hosts"]
        inv["all"]["children"]["gpu_nodes"]["hosts"] = {n: hosts[n] for n in nodes}
        path = self.state / f"hosts-{name}.yml"
        path.write_text(
            f"# {name}: nodes {', '.join(nodes)} of the lab at {self.state}\n"
            + yaml.safe_dump(inv, sort_keys=False, default_flow_style=False)
        )
        return path

    @property
    def fleet_inventory(self):
        """The inventory of the fleet's nodes (<state>/hosts-fleet.yml)."""
        if self._fleet_inventory is None:
            self._fleet_inventory = self.inventory(self.fleet_nodes, "fleet")
        return self._fleet_inventory

    def ssh(self, node, command, check=True, timeout=60):
        """Run a shell command on node as root over SSH; its stdout (AssertionError on failure)."""
        return ssh(self.key, self.spec(node), command, check=check, timeout=timeout)

    # --- ansible ------------------------------------------------------------------------------
    def env(self, **extra):
        """The environment of a playbook run on the lab (default callback, no colour, one fork per
        fleet node, the drift report in <state>/drift); extra entries win."""
        env = dict(os.environ)
        env.update(
            {
                "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                "PATH": f"{VENV_BIN}:{env.get('PATH', '')}",
                "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_FORCE_COLOR": "0",
                "ANSIBLE_STDOUT_CALLBACK": "default",
                "ANSIBLE_FORKS": str(max(len(self.fleet_nodes), 1)),
                "GPUFLEET_DRIFT_DIR": str(self.drift_dir),
            }
        )
        env.pop("ANSIBLE_INVENTORY", None)
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def playbook(
        self,
        playbook,
        *args,
        inventory=None,
        limit=None,
        extra_vars=None,
        env=None,
        label=None,
        timeout=PLAYBOOK_TIMEOUT,
        json_callback=False,
        watch=None,
    ):
        """Run a playbook on the lab (default: on the fleet's inventory) with the lab's vault
        password; env: extra entries of env(); stderr is interleaved into stdout, but for the
        JSON callback's document.  Its wall time is kept for the session's summary under label."""
        inventory = inventory or self.fleet_inventory
        argv = playbook_argv(playbook, *args, inventory=inventory, limit=limit, extra_vars=extra_vars)
        run = run_playbook(
            playbook,
            *args,
            inventory=inventory,
            limit=limit,
            extra_vars=extra_vars,
            env=self.env(**(env or {})),
            timeout=timeout,
            merge_stderr=not json_callback,
            json_callback=json_callback,
            vault_password=self.vault_password,
            watch=watch,
        )
        LAB_TIMINGS.append((label or " ".join(argv[3:]), run.seconds, run.rc))
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

    @staticmethod
    def recap_ok(run, host):
        r = run.recap.get(host)
        return bool(r) and r["failed"] == 0 and r["unreachable"] == 0

    # --- what the fleet tests know of the fleet's convergence ----------------------------------
    @property
    def dirty(self):
        """Nodes not known to be as site.yml leaves them."""
        return sorted(self._dirty)

    def changed(self, *nodes):
        """A test changed these nodes (all when none are named): converge runs site.yml on them."""
        self._dirty |= set(nodes or self.fleet_nodes)

    def restored(self, *nodes):
        """A test put these nodes back as site.yml leaves them (and checked that it did)."""
        self._dirty -= set(nodes or self.fleet_nodes)

    def converge(self, why=None, nodes=None):
        """Run site.yml on the nodes (default all) not known to be converged, limited to them, or
        on all of `nodes` when `why`; the first run is always on the whole fresh fleet, and kept."""
        nodes = list(nodes or self.fleet_nodes)
        targets = [n for n in nodes if n in self._dirty] or (nodes if why else [])
        if self.first_run is not None and not targets:
            return self.first_run
        if self.first_run is None:
            targets, limit, extra, label = list(self.fleet_nodes), None, [], "site.yml (first run)"
        else:
            # A gate verdict holds for its boot: a node that a fault test failed is measured again.
            limit = None if set(targets) == set(self.fleet_nodes) else ",".join(targets)
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
        seen = self.wait_pool(lambda p: p.get(node, {}).get("op_state") == "running", timeout=60)
        assert seen.get(node, {}).get("state") == "ready" and seen[node]["op_state"] == "running", (
            f"{label} passed, but {node} is not back in the pool: {seen.get(node)}"
        )
        self.restored(node)
        return run

    # --- the balancer -------------------------------------------------------------------------
    @property
    def balancer(self):
        """The balancer's entry of `lab status --json` (runtime_socket, backend, config, ...)."""
        return self.status()["balancer"]

    def pool(self):
        """{name: server} of the fleet's nodes in the vLLM backend, from HAProxy's runtime API, read
        by the lab's own reader (lab/haproxy.py, not the collection's client, which is what the
        tests check; the spare node of the session's lab may be there too: the operations tests'
        business)."""
        servers = haproxy.pool(self.balancer["runtime_socket"], self.balancer["backend"])
        return {name: server for name, server in servers.items() if name not in self.session_only()}

    def session_only(self):
        """Names of the lab's nodes that are not the fleet's."""
        return {n["name"] for n in self.status()["nodes"]} - set(self.fleet_nodes)

    def config_servers(self):
        """{name: 'address:port'} of the backend's `server` lines in HAProxy's config file."""
        servers = haproxy.config_servers(Path(self.balancer["config"]).read_text(), BACKEND)
        return {name: address for name, address in servers.items() if name not in self.session_only()}

    def ready(self, pool=None):
        """Names of the pool's servers in rotation (admin state ready); a drained one is known to
        the balancer but out of rotation."""
        return {name for name, server in (self.pool() if pool is None else pool).items() if server["state"] == "ready"}

    def assert_drained(self, node, pool=None):
        """node is out of rotation but not forgotten: drained in HAProxy's runtime, its line kept in
        the config file HAProxy restarts from (AssertionError otherwise)."""
        server = (self.pool() if pool is None else pool).get(node)
        assert server is not None and server["state"] == "drain", f"{node} is not drained in the pool: {server}"
        config = self.config_servers()
        assert config.get(node) == f"{self.nodes[node]['address']}:8000", f"{node} not in the config file: {config}"

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
            seen = self.pool()
            if predicate(seen) or time.monotonic() > deadline:
                return seen
            time.sleep(0.5)

    # --- the nodes, through testinfra and the agent -------------------------------------------
    def host(self, node):
        """A testinfra host for node (ansible:// backend on the fleet's inventory: SSH with its key)."""
        if node not in self._hosts:
            import testinfra

            self._hosts[node] = testinfra.get_host(f"ansible://{node}", ansible_inventory=str(self.fleet_inventory))
        return self._hosts[node]

    def agent(self, node):
        """What the node's HAProxy agent answers the balancer: asked from the host, whose end of the
        node's link is the balancer's address as the node sees it (the only one it answers)."""
        with socket.create_connection((self.nodes[node]["address"], 9777), 5) as conn:
            return conn.makefile().readline().strip()

    def agent_verdict(self, node):
        """The node's own verdict in its agent's answer: the answer less a leading `ready`, the
        return request a passed boot validation makes for lb_registration_ready_hold seconds
        (roles/lb_registration/tasks/ready.yml), which comes and goes with the clock."""
        return self.agent(node).removeprefix("ready ")

    def unit_state(self, node, unit):
        """{ActiveState, SubState, Result} of a unit on node."""
        out = self.sh(node, f"systemctl show -p ActiveState,SubState,Result {unit}")
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def sh(self, node, command):
        """Run a command on node (testinfra); fail with its output when it exits non-zero."""
        result = self.host(node).run(command)
        assert result.rc == 0, f"{node}: `{command}` exited {result.rc}: {result.stdout}{result.stderr}"
        return result.stdout


@contextlib.contextmanager
def own_lab(profiles, name=None, *, lab_class=None, spare=False):
    """A lab of `profiles` (node1..nodeN) for the with-block, down at its end; the test is skipped,
    saying why, where the lab cannot run.  State in .lab-state/pytest-<pid>[-<name>].  The
    session's lab (tests/conftest.py) adds the spare node (``spare=True``); a module's own lab
    (``name``) has none.  lab_class: a Lab subclass with the module's own helpers."""
    missing = lab_prerequisites()
    if missing:
        pytest.skip(f"lab prerequisites: {missing}")
    state = REPO / ".lab-state" / (f"pytest-{os.getpid()}-{name}" if name else f"pytest-{os.getpid()}")
    lab = (lab_class or Lab)(state, profiles, spare=spare)
    try:
        lab.up()
        yield lab
    finally:
        lab.down()
