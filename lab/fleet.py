# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab fleet: nodes, the balancer, the state directory that holds all of them.

Everything the lab makes lives in its state directory (default ``<repo>/.lab-state``, or
``$GPUFLEET_LAB_STATE``), except what the kernel keeps for a running lab: the nodes' processes,
namespaces and mounts (gone when a node's PID 1 dies), one veth per node on the host
(``glab-<tag>-<n>``, gone with the node's network namespace), one cgroup per node under
``<cgroup2>/gpufleet-lab-<tag>/``, the HAProxy daemon, and ``inventories/lab/hosts.yml``.
``down`` removes all of those.

    <state>/lab.json        the fleet: nodes (name, profile, addresses), balancer, network
    <state>/lock            flock'd by every command that changes the fleet
    <state>/ssh/id_ed25519  the key Ansible logs in with (root on every node)
    <state>/haproxy.*       the balancer's config, PID file and admin socket
    <state>/vault-password  the vault password of the inventory's secrets (secrets.json: in plain text)
    <state>/nodes/<name>/   one node (see lab.machine)
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import lab.hwmodel as hw

from . import llamacpp, preflight, prometheus, rootfs, wheelhouse
from .balancer import DECIDER_PORT, Balancer
from .machine import HW_IN_NODE, SSH_PORT, Machine, cgroup_pids, remove_cgroup, ssh_keygen
from .preflight import LabError
from .private import write_private
from .prometheus import Prometheus

REPO = Path(__file__).resolve().parent.parent
DEFAULT_STATE = REPO / ".lab-state"
STATE_ENV = "GPUFLEET_LAB_STATE"
DEFAULT_INVENTORY = REPO / "inventories" / "lab" / "hosts.yml"
DEFAULT_PROFILES = ("l40s-4x-switch", "l40s-4x-switch", "h100-sxm-8x", "l40s-x8-degraded", "a6000-4090-hetero")
NETWORK = ipaddress.ip_network("10.213.0.0/16")  # one /24 per lab, one /30 per node
# A boot ends when systemd has started everything, boot validation (the NCCL gate) included.
BOOT_TIMEOUT = 300.0
# What `up` makes in the state directory; `down` removes exactly these (and keeps `lock`).
MADE = ("lab.json", "lab.tmp", "ssh", "nodes", "haproxy.cfg", "haproxy.pid", "haproxy.sock", "hosts.yml")
MADE += ("prometheus", "drift")  # the lab's Prometheus and the drift report it scrapes (lab/prometheus.py)
# The lab's secrets (vllm_server_api_key, vllm_server_hf_token): random per lab, in plain text only in
# <state>/secrets.json (0600, for the lab's own clients and tests), in the inventory as !vault values
# (group_vars/all/vault.yml next to it: the nodes and the monitoring host read the API key),
# encrypted with <state>/vault-password (0600): a run
# of ansible-playbook on the lab needs ANSIBLE_VAULT_PASSWORD_FILE=<state>/vault-password.
VAULT_PASSWORD = "vault-password"
SECRETS = "secrets.json"
VAULT_VARS = Path("group_vars") / "all" / "vault.yml"
MADE += (VAULT_PASSWORD, SECRETS, "group_vars")
#: The model every serving node of the lab serves, under one name: one HAProxy pool, one model
#: (the heterogeneous node serves the lab's tiny GGUF model under it, as a real one would serve a
#: GGUF quantization of the same model).
LAB_MODEL = "Llama-3.3-70B-Instruct-FP8"
MADE += ("models",)  # the tiny GGUF model the heterogeneous node serves (lab/llamacpp.py)
MADE += ("pool-decider",)  # the pool's decider where site.yml installed it (lab/balancer.py)


def _describe_pids(pids, limit=8):
    """'PID (comm), ...' for an error message."""
    named = []
    for pid in pids[:limit]:
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            comm = "gone"
        named.append(f"{pid} ({comm})")
    return ", ".join(named) + (f" and {len(pids) - limit} more" if len(pids) > limit else "")


def state_dir(path=None):
    return Path(path or os.environ.get(STATE_ENV) or DEFAULT_STATE).resolve()


def plan(nodes=None, profiles=None):
    """[(name, profile)] for `--nodes N` and `--profiles a,b,...` (each cycles the profile list)."""
    profiles = list(profiles) if profiles else list(DEFAULT_PROFILES)
    unknown = [p for p in profiles if p not in hw.PROFILES]
    if unknown:
        raise LabError(f"unknown profile(s) {', '.join(unknown)}; known: {', '.join(sorted(hw.PROFILES))}")
    count = len(profiles) if nodes is None else nodes
    if not 1 <= count <= 63:
        raise LabError(f"--nodes must be between 1 and 63, not {count}")
    return [(f"node{i + 1}", profiles[i % len(profiles)]) for i in range(count)]


def plan_releases(count, releases=None):
    """The Debian release of each of ``count`` nodes for `--os r1,r2,...` (cycled; default the
    controller's own, bookworm, whose nodes run on the controller's root)."""
    releases = list(releases) if releases else [rootfs.HOST_RELEASE]
    unknown = [r for r in releases if r not in rootfs.RELEASES]
    if unknown:
        raise LabError(f"unknown --os {', '.join(unknown)}; the lab's nodes run: {', '.join(rootfs.RELEASES)}")
    return [releases[i % len(releases)] for i in range(count)]


def node_wheelhouse():
    """The wheelhouse of the nodes' boot validation runtime that scripts/setup.sh downloads once
    (lab/wheelhouse.py: the wheels for every Python a node's runtime may run on)."""
    return wheelhouse.path()


class Fleet:
    def __init__(self, state=None):
        self.state = state_dir(state)
        self.tag = hashlib.sha256(str(self.state).encode()).hexdigest()[:6]
        self.file = self.state / "lab.json"
        self._progs = None

    # --- plumbing -------------------------------------------------------------------------------
    @property
    def progs(self):
        if self._progs is None:
            self._progs = preflight.programs()
        return self._progs

    @property
    def cgroup(self):
        """The lab's cgroup: one child per node (the cgroup namespace's root) and `balancer`."""
        return Path(preflight.cgroup2_mount()) / f"gpufleet-lab-{self.tag}"

    @property
    def key(self):
        return self.state / "ssh" / "id_ed25519"

    def public_key(self):
        return Path(str(self.key) + ".pub").read_text()

    def data(self):
        try:
            return json.loads(self.file.read_text())
        except FileNotFoundError:
            return None

    def _save(self, data):
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(self.file)

    def machines(self, data=None):
        data = data or self.data() or {"nodes": []}
        return [Machine(self, spec) for spec in data["nodes"]]

    def machine(self, name):
        for m in self.machines():
            if m.name == name:
                return m
        names = ", ".join(m.name for m in self.machines()) or "none: the lab is down"
        raise LabError(f"no node {name!r} in the lab at {self.state} (nodes: {names})")

    def balancer(self, data=None):
        data = data or self.data()
        return Balancer(self, data["balancer"]) if data and data.get("balancer") else None

    def prometheus(self, data=None):
        data = data or self.data()
        return Prometheus(self, data["prometheus"]) if data and data.get("prometheus") else None

    @contextmanager
    def locked(self, verb):
        self.state.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.state / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
                raise LabError(
                    f"another lab command is running on {self.state} ({holder or 'busy'}); "
                    f"wait for it to finish, then run `lab {verb}` again"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"lab {verb}, PID {os.getpid()}\n".encode(), 0)
            yield
        finally:
            os.close(fd)

    def running(self):
        """Names of the nodes still running, plus 'balancer' if HAProxy is."""
        data = self.data()
        if not data:
            try:
                cgroup = self.cgroup
            except LabError:
                return []
            left = any(p.read_text().strip() for p in cgroup.rglob("cgroup.procs")) if cgroup.exists() else False
            return [f"processes in {cgroup}, records lost"] if left else []
        alive = [m.name for m in self.machines(data) if m.pid()]
        bal = self.balancer(data)
        if bal and bal.pid():
            alive.append("balancer")
        prom = self.prometheus(data)
        if prom and prom.pids():
            alive.append("prometheus")
        return alive

    def _subnet(self):
        used = subprocess.run(
            [self.progs["ip"], "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True
        ).stdout
        taken = set()
        for line in used.splitlines():
            addr = ipaddress.ip_interface(line.split()[3])
            taken.add(addr.network)
        # Start where this state directory's tag points, so labs brought up at the same moment
        # from different state directories (parallel test runs) do not pick the same /24.
        nets = list(NETWORK.subnets(new_prefix=24))
        start = int(self.tag, 16) % len(nets)
        for net in nets[start:] + nets[:start]:
            if not any(net.overlaps(t) for t in taken):
                return net
        raise LabError(f"no free /24 left in {NETWORK} on this host for the lab's node links")

    def _node_spec(self, index, name, profile, subnet, release=rootfs.HOST_RELEASE):
        link = list(subnet.subnets(new_prefix=30))[index]
        gateway, address = list(link.hosts())
        return {
            "name": name,
            "profile": profile,
            "os": release,
            "index": index,
            "address": str(address),
            "gateway": str(gateway),
            "prefix": 30,
            "ssh_port": SSH_PORT,
            "veth": f"glab-{self.tag[:4]}-{index + 1}",
            "expect_registered": bool(hw.PROFILES[profile].get("expect_registered", True)),
        }

    # --- verbs ----------------------------------------------------------------------------------
    def up(self, nodes=None, profiles=None, inventory=None, timeout=BOOT_TIMEOUT, log=print, releases=None):
        preflight.require_root()
        wanted = plan(nodes, profiles)
        oses = plan_releases(len(wanted), releases)
        self._progs = preflight.check()
        # Trees of other releases: built once (minutes), then cached; before anything is changed.
        for release in sorted(set(oses) - {rootfs.HOST_RELEASE}):
            rootfs.ensure(release, log=log)
        with self.locked("up"):
            alive = self.running()
            if alive:
                raise LabError(
                    f"a lab is already running from {self.state} ({', '.join(alive)}); "
                    "use it, or run `python -m lab down` first"
                )
            if self.data():
                self._teardown(quiet=True)
            t0 = time.monotonic()
            self._wipe()
            (self.state / "ssh").mkdir(parents=True, mode=0o700)
            ssh_keygen(self.progs, f"gpufleet-lab@{self.tag}", self.key)
            subnet = self._subnet()
            data = {
                "tag": self.tag,
                "state": str(self.state),
                "subnet": str(subnet),
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "ssh_key": str(self.key),
                "hw_in_node": HW_IN_NODE,
                "nodes": [self._node_spec(i, n, p, subnet, oses[i]) for i, (n, p) in enumerate(wanted)],
                "balancer": Balancer.describe(self.state),
                "prometheus": Prometheus.describe(self.state),
            }
            self._save(data)
            try:
                bal = self.balancer(data)
                bal.write_config()
                bal.start()
                prom = self.prometheus(data)
                # role monitoring writes the lab Prometheus' files (its Prometheus half, on the controller)
                prom.write_config(self.write_inventory(self.state / "hosts.yml"), self.vault_password_file)
                prom.start()
                machines = self.machines(data)
                for m in machines:
                    m.create()
                for m in machines:
                    m.start()
                deadline = time.monotonic() + timeout
                for m in machines:
                    m.wait_ready(deadline)
                prom.wait_ready(deadline)
            except BaseException:
                self._teardown(quiet=True, keep_files=True)
                raise
            elapsed = time.monotonic() - t0
            written = self.write_inventory(inventory, repo=self.state == DEFAULT_STATE)
        log(f"lab up: {len(wanted)} node(s) and HAProxy in {elapsed:.1f} s; inventory {written}; Prometheus {prom.url}")
        return elapsed

    def down(self, log=print):
        preflight.require_root()
        with self.locked("down"):
            had = self.data() is not None or self.cgroup.exists()
            self._teardown()
            self._wipe()
        log("lab down: stopped and removed" if had else f"lab down: nothing was running from {self.state}")

    def _teardown(self, quiet=False, keep_files=False):
        """Stop every node and the balancer; remove veths and cgroups.  Files stay unless asked."""
        data = self.data()
        machines = self.machines(data) if data else []
        pids = [(m, m.signal_stop()) for m in machines]
        deadline = time.monotonic() + 10
        for m, pid in pids:
            m.finish_stop(pid, deadline)
        bal = self.balancer(data)
        if bal:
            bal.stop()
        prom = self.prometheus(data)
        if prom:
            prom.stop()
        # Strays of an earlier lab of this state dir whose lab.json was lost.
        ip = self.progs["ip"]
        for link in Path("/sys/class/net").glob(f"glab-{self.tag[:4]}-*"):
            subprocess.run([ip, "link", "del", link.name], capture_output=True, check=False)
        try:
            cgroup = self.cgroup
        except LabError:
            cgroup = None
        # Anything left in the lab's cgroups (a node or HAProxy whose records were lost) dies here.
        if cgroup and not remove_cgroup(cgroup) and not quiet:
            left = cgroup_pids(cgroup)
            raise LabError(
                f"could not remove the lab's cgroup {cgroup}: "
                + (
                    f"processes remain in it after SIGKILL ({_describe_pids(left)}); "
                    if left
                    else "the kernel still counts it busy; "
                )
                + "run `python -m lab down` again, or look at them with "
                f"`systemd-cgls {cgroup}`"
            )
        if not keep_files:
            self._remove_inventory(DEFAULT_INVENTORY)
            self._remove_inventory(self.state / "hosts.yml")

    def _wipe(self):
        """Remove what `up` made in the state directory (only that: it may be shared)."""
        for name in MADE:
            entry = self.state / name
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            elif entry.exists() or entry.is_symlink():
                entry.unlink()

    def _remove_inventory(self, path):
        """Remove a generated inventory and its vaulted group variables if they are this lab's
        (they name this state directory)."""
        for generated in (path, path.parent / VAULT_VARS):
            try:
                if str(self.state) in generated.read_text():
                    generated.unlink()
            except FileNotFoundError:
                pass
        for directory in ((path.parent / VAULT_VARS).parent, path.parent / VAULT_VARS.parts[0]):
            try:
                directory.rmdir()
            except OSError:  # not empty (the operator's own group variables), or gone
                pass

    def reboot(self, *names, timeout=BOOT_TIMEOUT, log=print):
        """Power-cycle the nodes together: all stopped, all powered on, then each waited for."""
        preflight.require_root()
        with self.locked("reboot"):
            machines = [self.machine(name) for name in names]
            t0 = time.monotonic()
            old = {m.name: m.boot_id() for m in machines}
            for m in machines:
                m.stop()
            for m in machines:
                m.power_cycle_firmware()
                m.start()
            deadline = time.monotonic() + timeout
            for m in machines:
                m.wait_ready(deadline)
                log(
                    f"lab reboot: {m.name} is back in {time.monotonic() - t0:.1f} s "
                    f"(boot_id {old[m.name]} -> {m.boot_id()})"
                )

    def stop_node(self, name, log=print):
        """Power a node off (unreachable until `start`): for tests of a node lost mid-play."""
        preflight.require_root()
        with self.locked("stop"):
            m = self.machine(name)
            m.stop()
            log(f"lab stop: {name} is powered off")

    def start_node(self, name, timeout=BOOT_TIMEOUT, log=print):
        preflight.require_root()
        with self.locked("start"):
            m = self.machine(name)
            if m.pid():
                m.wait_ready(time.monotonic() + timeout)
            else:
                self._power_on(m, timeout)
            log(f"lab start: {name} is up")

    @staticmethod
    def _power_on(m, timeout):
        """Boot a powered-off node from its firmware, and wait until it is ready."""
        m.power_cycle_firmware()
        m.start()
        m.wait_ready(time.monotonic() + timeout)

    def balancer_ctl(self, action, log=print):
        preflight.require_root()
        with self.locked("balancer"):
            bal = self.balancer()
            if not bal:
                raise LabError(f"no lab at {self.state}: run `python -m lab up` first")
            if action == "restart-decider":  # role pool_decider's restart command (its files changed)
                bal.restart_decider()
                log(f"lab balancer: pool decider {bal.decider_state()}")
                return
            if action in ("stop", "restart"):
                bal.stop()
            if action in ("start", "restart"):
                bal.start()
            log(f"lab balancer: {bal.state()}")

    def status(self):
        data = self.data()
        if not data:
            return {"state_dir": str(self.state), "up": False, "nodes": [], "balancer": None, "prometheus": None}
        nodes = []
        for m in self.machines(data):
            spec = m.spec
            state = m.state()
            nodes.append(
                {
                    "name": spec["name"],
                    "address": spec["address"],
                    "ssh_port": spec["ssh_port"],
                    "profile": spec["profile"],
                    "os": m.os,
                    "python": rootfs.python_version(m.os),
                    "state": state,
                    "expect_registered": spec["expect_registered"],
                    "boot_id": m.boot_id() if m.hw_dir.exists() else None,
                    "pid": m.pid(),
                    "hw_root": str(m.hw_dir),
                    "hw_root_in_node": HW_IN_NODE,
                    "console_log": str(m.console),
                }
            )
        bal = self.balancer(data)
        b = bal.spec
        return {
            "state_dir": str(self.state),
            "up": any(n["pid"] for n in nodes),
            "ssh_key": data["ssh_key"],
            "subnet": data["subnet"],
            "nodes": nodes,
            "balancer": {
                "runtime_socket": b["socket"],
                "backend": b["backend"],
                "config": b["config"],
                "pidfile": b["pidfile"],
                "frontend": f"{b['address']}:{b['frontend_port']}",
                "stats": f"http://{b['address']}:{b['stats_port']}/",
                "state": bal.state(),
                "pid": bal.pid(),
                "pool_decider": bal.decider_state(),
            },
            "prometheus": self.prometheus(data).status() if data.get("prometheus") else None,
        }

    # --- inventory ------------------------------------------------------------------------------
    def inventory(self):
        data = self.data()
        if not data:
            raise LabError(f"no lab at {self.state}: run `python -m lab up` first")
        b = data["balancer"]
        hosts = {}
        for spec in data["nodes"]:
            hosts[spec["name"]] = {
                "ansible_host": spec["address"],
                "ansible_port": spec["ssh_port"],
                "lab_profile": spec["profile"],
                "lab_os": spec.get("os", rootfs.HOST_RELEASE),
                "lab_expect_registered": spec["expect_registered"],
                "lab_hw_root": str(self.state / "nodes" / spec["name"] / "hw"),
                # The balancer (the host's HAProxy) reaches each node from the host's end of its
                # link: the only client the node's HAProxy agent answers.
                "lb_registration_agent_allow": [spec["gateway"]],
            }
            if not spec["expect_registered"]:  # never serves: role monitoring scrapes no vLLM there
                hosts[spec["name"]]["monitoring_vllm_scrape"] = False
        return {
            "all": {
                "children": {
                    "gpu_nodes": {
                        "hosts": hosts,
                        "vars": {
                            "ansible_user": "root",
                            "ansible_ssh_private_key_file": data["ssh_key"],
                            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no "
                            "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
                            # the same for Mitogen, which reads the variable, not the SSH options
                            "ansible_host_key_checking": False,
                            "ansible_python_interpreter": "/usr/bin/python3",
                            "gpufleet_lab": True,
                            "gpufleet_lab_root": HW_IN_NODE,
                            "gpufleet_sysfs_path": f"{HW_IN_NODE}/sys/bus/pci",
                            "gpufleet_proc_root": f"{HW_IN_NODE}/proc",
                            # GPU health: this boot's kernel log and the kernel's module list, simulated
                            # by the hardware model (lab/hwmodel/health.py).
                            "gpufleet_kernel_log_path": f"{HW_IN_NODE}/kmsg.log",
                            "gpufleet_sys_module_path": f"{HW_IN_NODE}/sys/module",
                            # vLLM: the lab's stand-in, run natively (no Docker engine in the lab).
                            "vllm_server_runtime": "native",
                            "vllm_server_vllm_bin": "/usr/local/bin/vllm",
                            "vllm_server_model": LAB_MODEL,
                            "vllm_server_health_delay": 1,
                            # Boot validation: the node sees neither this checkout nor the controller's
                            # venv; site.yml installs its runtime from the wheelhouse scripts/setup.sh made.
                            "boot_validation_wheelhouse": str(node_wheelhouse()),
                            # The registration role talks to the lab's HAProxy (on the controller).
                            "lb_registration_balancer": "lab-balancer",
                            "lb_registration_socket": b["socket"],
                            "lb_registration_backend": b["backend"],
                            "lb_registration_config_file": b["config"],
                            # llama.cpp (nodes that auto picks it for): the real llama-server, tiny model
                            **llamacpp.inventory_vars(self.state, LAB_MODEL),
                            # role monitoring's node half (site.yml's step monitoring): the lab's collectors
                            **prometheus.node_vars(),
                            # role worker_recycle (site.yml's step worker_recycle) on the vLLM nodes
                            "gpufleet_worker_recycle": True,
                        },
                    },
                    "balancer": {
                        "hosts": {
                            "lab-balancer": {
                                "ansible_connection": "local",
                                "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                                "lab_haproxy_socket": b["socket"],
                                "lab_haproxy_backend": b["backend"],
                                "lab_haproxy_config": b["config"],
                                "lab_haproxy_pidfile": b["pidfile"],
                                "lab_haproxy_frontend": f"{b['address']}:{b['frontend_port']}",
                                # where role monitoring's Prometheus scrapes HAProxy's exporter
                                "ansible_host": b["address"],
                                **self._decider_vars(b),
                            }
                        },
                    },
                    # role monitoring's Prometheus half: the lab's Prometheus, and every lab node it watches
                    **(
                        prometheus.inventory_groups(self.prometheus(data), b, hosts, self.progs["promtool"])
                        if data.get("prometheus")
                        else {}
                    ),
                }
            }
        }

    def _decider_vars(self, b):
        """The lab-balancer's variables of role pool_decider: the host runs no systemd, so the
        decider is a plain daemon next to HAProxy (lab/balancer.py), under the state directory,
        (re)started by `lab balancer restart-decider` when the role changed its files. The
        session's lab runs without a budget (two serving nodes: a budget of none would hold every
        fault); a test turns it on with `-e gpufleet_pool_budget=true`."""
        paths = Balancer(self, b).decider_paths()
        launcher = (
            f"import sys; sys.path.insert(0, {str(REPO)!r}); from lab.cli import main; sys.exit(main(sys.argv[1:]))"
        )
        return {
            "gpufleet_pool_budget": False,
            "gpufleet_pool_decider_port": b.get("decider_port", DECIDER_PORT),
            # the lab's HAProxy (the nodes' lb_registration_socket and _backend)
            "pool_decider_socket": b["socket"],
            "pool_decider_backend": b["backend"],
            "pool_decider_service": "none",
            "pool_decider_install_packages": False,
            "pool_decider_python": "{{ ansible_playbook_python }}",
            "pool_decider_lib_dir": str(paths["lib"]),
            "pool_decider_config_file": str(paths["config"]),
            "pool_decider_state_file": str(paths["state"]),
            "pool_decider_metrics_address": b["address"],
            "pool_decider_restart_command": [
                "{{ ansible_playbook_python }}",
                "-c",
                launcher,
                "balancer",
                "restart-decider",
                "--state-dir",
                str(self.state),
            ],
        }

    @property
    def vault_password_file(self):
        return self.state / VAULT_PASSWORD

    def secrets(self):
        """{variable: plain text} of the lab's secrets; made (random) on first use, with the vault
        password that encrypts them in the inventory, both 0600 in the state directory."""
        import secrets as random

        path = self.state / SECRETS
        if not path.exists():
            self.state.mkdir(parents=True, exist_ok=True)
            if not self.vault_password_file.exists():
                write_private(self.vault_password_file, random.token_urlsafe(32) + "\n")
            values = {
                "vllm_server_api_key": f"lab-api-key-{random.token_hex(16)}",
                "vllm_server_hf_token": f"hf_lab{random.token_hex(16)}",
            }
            write_private(path, json.dumps(values, indent=2) + "\n")
        return json.loads(path.read_text())

    def vault_vars(self):
        """The text of group_vars/all/vault.yml: the lab's secrets as !vault values, encrypted
        with ansible-vault's Python API (the controller's environment has ansible-core)."""
        from ansible.parsing.vault import VaultLib, VaultSecret

        values = self.secrets()
        vault = VaultLib([("default", VaultSecret(self.vault_password_file.read_bytes().strip()))])
        lines = [
            f"# Generated by `python -m lab inventory` for the lab at {self.state}.",
            f"# Vaulted with {self.vault_password_file} (ANSIBLE_VAULT_PASSWORD_FILE).",
            "---",
        ]
        for name, value in values.items():
            lines.append(f"{name}: !vault |")
            lines += [f"  {line}" for line in vault.encrypt(value).decode().splitlines()]
        return "\n".join(lines) + "\n"

    def write_inventory(self, path=None, repo=True):
        """Write the inventory to path, else <state>/hosts.yml and (repo) inventories/lab/hosts.yml."""
        import yaml  # the controller's environment has it (ansible-core depends on it)

        inv = self.inventory()
        header = (
            f"# Generated by `python -m lab inventory` for the lab at {self.state}.\n"
            "# Do not edit: `lab up` rewrites it, `lab down` removes it.\n"
        )
        text = header + yaml.safe_dump(inv, sort_keys=False, default_flow_style=False)
        vault_vars = self.vault_vars()
        targets = [Path(path)] if path else [self.state / "hosts.yml"]
        if not path and repo:
            targets.append(DEFAULT_INVENTORY)
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            # the secrets: group variables of the inventory (any inventory file of that directory)
            (target.parent / VAULT_VARS).parent.mkdir(parents=True, exist_ok=True)
            write_private(target.parent / VAULT_VARS, vault_vars)
        return targets[-1]
