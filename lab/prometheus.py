# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab's monitoring: node_exporter in every node, a real Prometheus on the controller side.

In a node: Debian's ``prometheus-node-exporter`` unit (enabled at the node's first boot), its
textfile collector reading the directory the roles write their ``.prom`` files to (the dirname of
``nccl_gate_metrics_path``: roles nccl_gate, gpu_health and monitoring all default to it),
listening on the node's lab address, port 9100. site.yml's step ``monitoring`` (role monitoring's
node half) then writes node_exporter's arguments as the role does, with the lab's collectors.

On the controller, in ``<state>/prometheus/``: Debian's ``prometheus`` (own data dir, a free port
on 127.0.0.1, scrape every 2 s, rules evaluated every second) and a second node_exporter on
127.0.0.1 that serves only the textfile collector of ``<state>/drift`` (where the drift report's
``gpufleet_drift.prom`` lands when ``GPUFLEET_DRIFT_DIR`` points there).  Its files are role
``gpufleet.node.monitoring``'s own output: the lab's inventory holds a `monitoring` host
(``lab-prometheus``, on the controller) with the lab's paths, intervals and ``for:`` overrides
(``ALERT_FOR``, as ``monitoring_alert_for``); `lab up` runs playbooks/monitoring.yml on it before
Prometheus starts, and every site.yml run on the lab runs the same play, which reloads Prometheus
through its reload endpoint when the files changed.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from .preflight import LabError
from .procs import starttime as _starttime

REPO = Path(__file__).resolve().parent.parent
ROLE = REPO / "roles" / "monitoring"

# `for:` of the lab's alert rules, over the role's defaults (roles/monitoring/vars/main.yml): the
# same override as the role's `monitoring_alert_for`. Short, so that the degraded node's failed
# gate pages within seconds of site.yml (the default is 1m).
ALERT_FOR = {"GpufleetNcclGateFailed": "5s"}
SCRAPE_INTERVAL = "2s"
EVALUATION_INTERVAL = "1s"
NODE_EXPORTER_UNIT = "prometheus-node-exporter.service"
NODE_EXPORTER_ARGS_FILE = "etc/default/prometheus-node-exporter"
# In a lab node the machine's own figures (CPU, memory, disks, network) are the host's: the lab's
# node_exporter serves the roles' textfile metrics and what the rules read beside them
# (node_boot_time_seconds: the `stat` collector) only, to spare the shared host's CPU.
NODE_EXPORTER_COLLECTORS = (
    "--collector.disable-defaults",
    "--collector.textfile",
    "--collector.stat",
    "--collector.time",
    "--collector.uname",
)


def _yaml(path):
    import yaml  # the controller's environment has it (ansible-core depends on it)

    return yaml.safe_load(Path(path).read_text())


def role_settings():
    """What the lab's nodes take from role monitoring's defaults before site.yml runs it: the
    node_exporter port and the textfile directory (the nccl_gate role's metrics path's directory)."""
    defaults = _yaml(ROLE / "defaults" / "main.yml")
    gate_metrics = _yaml(REPO / "roles" / "nccl_gate" / "defaults" / "main.yml")["nccl_gate_metrics_path"]
    return {
        "node_exporter_port": int(defaults["monitoring_node_exporter_port"]),
        "textfile_dir": os.path.dirname(gate_metrics),
    }


# --- in a node ------------------------------------------------------------------------------------


def install_node_exporter(upper, address):
    """Into a node's fresh disk (its overlay upper dir): node_exporter's arguments (listen on the
    node's address, textfile collector on the roles' directory), that directory, the unit enabled."""
    settings = role_settings()
    upper = Path(upper)
    args = [
        f"--web.listen-address={address}:{settings['node_exporter_port']}",
        f"--collector.textfile.directory={settings['textfile_dir']}",
        *NODE_EXPORTER_COLLECTORS,
    ]
    args_file = upper / NODE_EXPORTER_ARGS_FILE
    args_file.parent.mkdir(parents=True, exist_ok=True)
    args_file.write_text(
        "# Written by the gpufleet lab (lab/prometheus.py): Debian's unit runs\n"
        "# /usr/bin/prometheus-node-exporter $ARGS; the textfile collector reads the roles' .prom files.\n"
        f'ARGS="{" ".join(args)}"\n'
    )
    textfile = upper / settings["textfile_dir"].lstrip("/")
    textfile.mkdir(parents=True, exist_ok=True)
    os.chmod(textfile, 0o755)
    wants = upper / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / NODE_EXPORTER_UNIT
    if not link.is_symlink():
        os.symlink(f"/lib/systemd/system/{NODE_EXPORTER_UNIT}", link)


# --- the configuration: role monitoring's own ------------------------------------------------------

# The inventory's host that stands for the lab's Prometheus (group `monitoring`: role monitoring's
# Prometheus half, run on the controller), and the group of every lab node it watches.
HOST = "lab-prometheus"
NODES_GROUP = "lab_nodes"
PLAYBOOK = REPO / "playbooks" / "monitoring.yml"
RENDER_TIMEOUT = 300


def node_vars():
    """Group variables of the lab's GPU nodes for role monitoring's node half (site.yml's step
    `monitoring`): the lab's collectors only, on the directory the lab set up."""
    return {"monitoring_node_exporter_extra_args": list(NODE_EXPORTER_COLLECTORS)}


def inventory_groups(prom, balancer_spec, nodes, promtool):
    """The lab inventory's groups for role monitoring's Prometheus half: `monitoring` (host
    lab-prometheus, on the controller: the role writes the lab's Prometheus files in
    ``<state>/prometheus/`` and reloads it through its reload endpoint; the lab's short intervals and
    ``for:``, its balancer's and drift report's exporters) and `lab_nodes`, every node of the lab with
    its address (``nodes``: {name: host variables}), which that Prometheus scrapes whatever part of
    the lab an inventory names in `gpu_nodes`."""
    exporter_port = (balancer_spec or {}).get("exporter_port") or 0
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": "{{ ansible_playbook_python }}",
        "monitoring_gpu_nodes_group": NODES_GROUP,
        "monitoring_prometheus_manage": False,
        "monitoring_promtool": str(promtool),
        "monitoring_prometheus_config_file": str(prom.config),
        "monitoring_prometheus_rules_dir": str(prom.rules.parent),
        "monitoring_serving_api_key_file": str(prom.api_key_file),
        "monitoring_prometheus_user": pwd.getpwuid(os.geteuid()).pw_name,
        "monitoring_prometheus_reload_url": f"{prom.url}/-/reload",
        "monitoring_scrape_interval": SCRAPE_INTERVAL,
        "monitoring_evaluation_interval": EVALUATION_INTERVAL,
        "monitoring_alert_for": dict(ALERT_FOR),
        "monitoring_haproxy_exporter_port": int(exporter_port),
        "monitoring_drift_exporters": [f"{prom.spec['address']}:{prom.spec['drift_exporter_port']}"],
    }
    watched = {
        name: {k: hv[k] for k in ("ansible_host", "monitoring_vllm_scrape") if k in hv} for name, hv in nodes.items()
    }
    return {"monitoring": {"hosts": {HOST: host}}, NODES_GROUP: {"hosts": watched}}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """The lab's Prometheus and the drift report's node_exporter, both plain daemons in the lab's
    cgroup ``prometheus`` (so `down` finds them even when their records are lost)."""

    PROCESSES = ("prometheus", "drift-exporter")

    def __init__(self, fleet, spec):
        self.fleet = fleet
        self.spec = spec
        self.dir = Path(spec["dir"])
        self.config = self.dir / "prometheus.yml"
        self.rules = self.dir / "rules" / "gpufleet.rules.yml"
        self.data = self.dir / "data"
        self.log = self.dir / "prometheus.log"
        self.run_file = self.dir / "run.json"
        # the serving nodes' API key (the lab's vllm_server_api_key), written 0600 by the role:
        # llama-server's /metrics needs it
        self.api_key_file = self.dir / "server-api-key"
        self.drift_dir = Path(spec["drift_dir"])

    @staticmethod
    def describe(state):
        return {
            "dir": str(state / "prometheus"),
            "drift_dir": str(state / "drift"),
            "address": "127.0.0.1",
            "port": free_port(),
            "drift_exporter_port": free_port(),
        }

    @property
    def url(self):
        return f"http://{self.spec['address']}:{self.spec['port']}"

    @property
    def cgroup(self):
        return self.fleet.cgroup / "prometheus"

    # --- files ----------------------------------------------------------------------------------
    def write_config(self, inventory, vault_password_file=None, reload=False):
        """Role monitoring's Prometheus half against the lab: playbooks/monitoring.yml on the
        inventory's lab-prometheus host writes the rules and the scrape configuration (each checked
        with promtool by the role) and the serving key, 0600; ``reload``: and reloads the running
        Prometheus when they changed. LabError, with the run's output, when the role fails."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.drift_dir.mkdir(parents=True, exist_ok=True)
        argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory), str(PLAYBOOK)]
        if not reload:
            argv += ["-e", "monitoring_prometheus_reload=false"]
        env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
        if vault_password_file:
            env["ANSIBLE_VAULT_PASSWORD_FILE"] = str(vault_password_file)
        try:
            run = subprocess.run(
                argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=RENDER_TIMEOUT, check=False
            )
        except subprocess.TimeoutExpired:
            raise LabError(
                f"role monitoring did not write {self.config} within {RENDER_TIMEOUT} s: `{' '.join(argv)}`"
            ) from None
        if run.returncode or not self.config.exists():
            raise LabError(
                f"role monitoring could not write the lab's Prometheus configuration {self.config} "
                f"(`{' '.join(argv)}` exited {run.returncode}):\n{(run.stdout + run.stderr)[-4000:]}"
            )
        return run

    # --- processes ------------------------------------------------------------------------------
    def _argv(self, which):
        progs = self.fleet.progs
        if which == "prometheus":
            return [
                progs["prometheus"],
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.data}",
                "--storage.tsdb.retention.time=1d",
                f"--web.listen-address={self.spec['address']}:{self.spec['port']}",
                f"--web.external-url={self.url}/",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ]
        return [
            progs["prometheus-node-exporter"],
            f"--web.listen-address={self.spec['address']}:{self.spec['drift_exporter_port']}",
            "--collector.disable-defaults",
            "--collector.textfile",
            f"--collector.textfile.directory={self.drift_dir}",
        ]

    def _runs(self):
        try:
            return json.loads(self.run_file.read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def pids(self):
        """{process: PID} of the daemons still running."""
        alive = {}
        for which, run in self._runs().items():
            now = _starttime(run["pid"])
            if now and not now[1] and now[0] == run["starttime"]:
                alive[which] = run["pid"]
        return alive

    def pid(self):
        return self.pids().get("prometheus")

    def start(self):
        if self.pids():
            raise LabError(f"the lab's Prometheus is already running ({self.pids()})")
        self.cgroup.mkdir(parents=True, exist_ok=True)
        procs_file = str(self.cgroup / "cgroup.procs")

        def join_cgroup():
            with open(procs_file, "w") as f:
                f.write("0\n")

        runs = {}
        with open(self.log, "ab") as log:
            for which in self.PROCESSES:
                proc = subprocess.Popen(
                    self._argv(which),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.dir,
                    start_new_session=True,
                    preexec_fn=join_cgroup,
                )
                st = _starttime(proc.pid)
                runs[which] = {"pid": proc.pid, "starttime": st[0] if st else None}
        self.run_file.write_text(json.dumps(runs, indent=1) + "\n")

    def wait_ready(self, deadline):
        """Until Prometheus answers /-/ready and the drift exporter /metrics."""
        for which, url in (("prometheus", f"{self.url}/-/ready"), ("drift-exporter", self.drift_url)):
            while True:
                try:
                    with urllib.request.urlopen(url, timeout=2) as resp:
                        if resp.status == 200:
                            break
                except (OSError, urllib.error.URLError):
                    pass
                if which not in self.pids() or time.monotonic() > deadline:
                    tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
                    raise LabError(
                        f"the lab's {which} did not answer {url} "
                        f"({'exited' if which not in self.pids() else 'timed out'}); its log {self.log}:\n{tail}"
                    )
                time.sleep(0.1)

    @property
    def drift_url(self):
        return f"http://{self.spec['address']}:{self.spec['drift_exporter_port']}/metrics"

    def stop(self, timeout=10.0):
        pids = self.pids()
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in self.pids().values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.run_file.unlink(missing_ok=True)

    def state(self):
        return "running" if self.pid() else "stopped"

    # --- asking it ----------------------------------------------------------------------------
    def api(self, path, **params):
        """GET /api/v1/<path>; its `data` (LabError when Prometheus does not answer or refuses)."""
        url = f"{self.url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:
            raise LabError(f"Prometheus refused {url}: {exc.read().decode(errors='replace')}") from None
        except (OSError, ValueError) as exc:
            raise LabError(f"the lab's Prometheus at {self.url} does not answer ({exc})") from None
        if body.get("status") != "success":
            raise LabError(f"Prometheus answered {url} with {body}")
        return body["data"]

    def alerts(self, state=None):
        """The alerts Prometheus holds ([{labels, annotations, state, activeAt, value}]), those in
        `state` (pending, firing) only when given."""
        return [a for a in self.api("alerts")["alerts"] if state is None or a["state"] == state]

    def status(self):
        return {
            "url": self.url,
            "state": self.state(),
            "pid": self.pid(),
            "config": str(self.config),
            "rules": str(self.rules),
            "data_dir": str(self.data),
            "log": str(self.log),
            "alert_for": dict(ALERT_FOR),
            "drift_dir": str(self.drift_dir),
            "drift_exporter": self.drift_url,
        }
