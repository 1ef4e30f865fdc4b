# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab's load balancer: a real HAProxy on the host's loopback, run as a plain daemon.

Its configuration, PID file and admin runtime socket live in the state directory.  The vLLM
pool is the backend ``vllm_pool``, empty at start: the registration role adds servers with the
runtime API (``add server vllm_pool/NODE ADDR:PORT check`` then ``enable server``, ``enable
health``) and may also write them into the configuration file so a restart keeps the pool.
Frontend ``prometheus`` is HAProxy's built-in exporter (``/metrics`` on 127.0.0.1:8405, or a free
port when another lab holds it), scraped by the lab's Prometheus (lab/prometheus.py).

The lab speaks the runtime API with its own client and pool reader (lab/haproxy.py), never with
the collection's: the pool it reads is what the lab judges the collection's work by.

Next to HAProxy runs the pool's decider (role pool_decider's gpufleet-pool-decider) as a plain
daemon, where site.yml installed it: the lab's balancer host has no systemd, so the inventory's
lab-balancer gives the role ``pool_decider_service: none``, the paths under
``<state>/pool-decider/`` and a restart command (``lab balancer restart-decider``), which the role
runs when the decider's files changed. It starts and stops with HAProxy; its log is
``<state>/pool-decider/decider.log``. The session's lab runs without it (``gpufleet_pool_budget:
false`` on lab-balancer: two serving nodes, a budget of none); a test turns it on with extra vars.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from . import haproxy
from .preflight import LabError

BACKEND = "vllm_pool"

CONFIG = """\
# HAProxy for the gpufleet lab, written by `python -m lab up` (lab/balancer.py).
# The registration role manages the servers of backend {backend}: at runtime through the
# admin socket, and (optionally) below the marker line so that a restart keeps the pool.
global
    stats socket {socket} mode 600 level admin
    stats timeout 30s
    pidfile {pidfile}

defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 600s
    timeout check 2s

frontend vllm
    bind 127.0.0.1:{port}
    default_backend {backend}

listen stats
    bind 127.0.0.1:{stats_port}
    stats enable
    stats uri /
    stats refresh 5s

# HAProxy's built-in Prometheus exporter (HAProxy >= 2.4), scraped by the lab's Prometheus: the
# pool membership (haproxy_server_status) that role monitoring's GpufleetNodeOutOfPool reads.
frontend prometheus
    bind 127.0.0.1:{exporter_port}
    http-request use-service prometheus-exporter if {{ path /metrics }}
    no log

backend {backend}
    balance leastconn
    option httpchk GET /health
    http-check expect status 200
    default-server inter 2s fall 2 rise 1
    # servers (managed by gpufleet.node.lb_registration) below this line
"""


# Where role monitoring expects HAProxy's exporter (monitoring_haproxy_exporter_port).
EXPORTER_PORT = 8405
# The pool decider's metrics (gpufleet_pool_decider_port): this port where free, else any
# (reserve_port).
DECIDER_PORT = 9778
DECIDER_DIR = "pool-decider"


def free_port(preferred=0):
    """A free TCP port on 127.0.0.1: `preferred` when it is free, else any."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
        except OSError:
            s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: The preferred ports the labs of this host took, one file per port naming the lab's state
#: directory: HAProxy binds the exporter's a few seconds after `lab up` chose it, the decider its own
#: only when site.yml installs it, minutes later, so a port that is free now may still be another
#: lab's (two labs brought up at once: two pytest runs, `-m own_lab` beside the session's lab).
RESERVED_PORTS = Path("/run/gpufleet-lab/ports")


def reserve_port(preferred, state):
    """`preferred` for the lab at `state` where it is free and no other lab of this host holds it
    (its state directory still has the `ssh` directory `lab up` makes and `down` removes), else any
    free port."""
    RESERVED_PORTS.mkdir(parents=True, exist_ok=True)
    with open(RESERVED_PORTS / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        entry = RESERVED_PORTS / str(preferred)
        try:
            holder = Path(entry.read_text().strip())
        except FileNotFoundError:
            holder = None
        if holder is not None and holder != Path(state) and (holder / "ssh").is_dir():
            return free_port()
        port = free_port(preferred)
        if port == preferred:
            entry.write_text(f"{state}\n")
        return port


class Balancer:
    def __init__(self, fleet, spec):
        self.fleet = fleet
        self.spec = spec
        self.config = Path(spec["config"])
        self.socket = Path(spec["socket"])
        self.pidfile = Path(spec["pidfile"])

    @staticmethod
    def describe(state):
        return {
            "config": str(state / "haproxy.cfg"),
            "socket": str(state / "haproxy.sock"),
            "pidfile": str(state / "haproxy.pid"),
            "backend": BACKEND,
            "frontend_port": free_port(),
            "stats_port": free_port(),
            "exporter_port": reserve_port(EXPORTER_PORT, state),
            "decider_port": reserve_port(DECIDER_PORT, state),
            "decider_dir": str(state / DECIDER_DIR),
            "address": "127.0.0.1",
        }

    # --- the pool's decider, where site.yml installed it ------------------------------------------
    def decider_paths(self):
        """Where the lab's inventory tells role pool_decider to put the decider (lib, config, state),
        and the lab's own files of the daemon (PID file, log)."""
        base = Path(self.spec.get("decider_dir") or self.config.parent / DECIDER_DIR)
        return {
            "dir": base,
            "lib": base / "lib",
            "bin": base / "lib" / "gpufleet_pool_decider.py",
            "config": base / "config.json",
            "state": base / "state.json",
            "pidfile": base / "decider.pid",
            "log": base / "decider.log",
        }

    def decider_pid(self):
        paths = self.decider_paths()
        try:
            pid = int(paths["pidfile"].read_text().split()[0])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except (FileNotFoundError, ValueError, IndexError, ProcessLookupError):
            return None
        return pid if str(paths["bin"]).encode() in cmdline and not zombie else None

    def start_decider(self, timeout=20.0):
        """Start the decider if site.yml installed it (its config is there); returns whether it
        runs. Waits until it serves its metrics (it has read its config and its state)."""
        paths = self.decider_paths()
        if not paths["config"].exists() or not paths["bin"].exists():
            return False
        if self.decider_pid():
            raise LabError(f"the lab's pool decider is already running (PID {self.decider_pid()})")
        procs_file = str(self.fleet.cgroup / "balancer" / "cgroup.procs")
        (self.fleet.cgroup / "balancer").mkdir(parents=True, exist_ok=True)

        def join_cgroup():  # so that `down` finds it even if the PID file is lost
            with open(procs_file, "w") as f:
                f.write("0\n")

        with open(paths["log"], "a") as log:
            proc = subprocess.Popen(
                [sys.executable, str(paths["bin"]), "--config", str(paths["config"])],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd="/",
                start_new_session=True,
                preexec_fn=join_cgroup,
            )
        paths["pidfile"].write_text(f"{proc.pid}\n")
        port = self.spec.get("decider_port", DECIDER_PORT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = paths["log"].read_text()[-2000:]
                raise LabError(f"the lab's pool decider exited ({proc.returncode}); {paths['log']}:\n{tail}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return True
            except OSError:
                time.sleep(0.1)
        raise LabError(f"the lab's pool decider started but serves no metrics on 127.0.0.1:{port}; see {paths['log']}")

    def stop_decider(self, timeout=10.0):
        pid = self.decider_pid()
        if pid:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.decider_pid() and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.decider_pid():
                os.kill(pid, signal.SIGKILL)
        self.decider_paths()["pidfile"].unlink(missing_ok=True)

    def restart_decider(self):
        self.stop_decider()
        if not self.start_decider():
            raise LabError(
                f"no pool decider installed under {self.decider_paths()['dir']}: run site.yml with "
                "gpufleet_pool_budget=true first"
            )

    def decider_state(self):
        return "running" if self.decider_pid() else "stopped"

    def write_config(self):
        self.config.write_text(
            CONFIG.format(
                socket=self.socket,
                pidfile=self.pidfile,
                port=self.spec["frontend_port"],
                stats_port=self.spec["stats_port"],
                exporter_port=self.spec["exporter_port"],
                backend=BACKEND,
            )
        )

    def pid(self):
        try:
            pid = int(self.pidfile.read_text().split()[0])
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except (FileNotFoundError, ValueError, IndexError, ProcessLookupError):
            return None
        return pid if comm == "haproxy" and not zombie else None

    def start(self, timeout=10.0):
        if self.pid():
            raise LabError(f"the lab's HAProxy is already running (PID {self.pid()})")
        haproxy = self.fleet.progs["haproxy"]
        check = subprocess.run(
            [haproxy, "-c", "-q", "-f", str(self.config)], capture_output=True, text=True, check=False
        )
        if check.returncode:
            raise LabError(f"HAProxy refuses {self.config}: {(check.stderr or check.stdout).strip()}")
        self.socket.unlink(missing_ok=True)
        cgroup = self.fleet.cgroup / "balancer"
        cgroup.mkdir(parents=True, exist_ok=True)
        procs_file = str(cgroup / "cgroup.procs")

        def join_cgroup():  # so that `down` finds it even if the PID file is lost
            with open(procs_file, "w") as f:
                f.write("0\n")

        proc = subprocess.run(
            [haproxy, "-D", "-f", str(self.config)],
            capture_output=True,
            text=True,
            check=False,
            stdin=subprocess.DEVNULL,
            cwd="/",
            preexec_fn=join_cgroup,
        )
        if proc.returncode:
            raise LabError(f"HAProxy did not start ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pid() and self.socket.exists():
                try:
                    self.command("show info")
                except haproxy.HAProxyError:
                    pass
                else:
                    self.start_decider()
                    return
            time.sleep(0.05)
        raise LabError(f"HAProxy started but its runtime socket {self.socket} does not answer")

    def stop(self, timeout=10.0):
        self.stop_decider(timeout)
        pid = self.pid()
        if pid:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.pid() and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.pid():
                os.kill(pid, signal.SIGKILL)
        self.socket.unlink(missing_ok=True)
        self.pidfile.unlink(missing_ok=True)

    def command(self, line):
        """One runtime API command over the admin socket; returns HAProxy's answer (raises
        haproxy.HAProxyError when the socket does not answer)."""
        return haproxy.command(self.socket, line)

    def state(self):
        return "running" if self.pid() else "stopped"
