# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab's monitoring: node_exporter in every node, a real Prometheus on the controller side.

In a node: Debian's ``prometheus-node-exporter`` unit (enabled at the node's first boot), its
textfile collector reading the directory the roles write their ``.prom`` files to (the dirname of
``nccl_gate_metrics_path``: roles nccl_gate, gpu_health and monitoring all default to it),
listening on the node's lab address, port 9100.

On the controller, in ``<state>/prometheus/``: Debian's ``prometheus`` (own data dir, a free port
on 127.0.0.1, scrape every 2 s, rules evaluated every second) and a second node_exporter on
127.0.0.1 that serves only the textfile collector of ``<state>/drift`` (where the drift report's
``gpufleet_drift.prom`` lands when ``GPUFLEET_DRIFT_DIR`` points there).  The scrape configuration
is generated from the lab's inventory as role ``gpufleet.node.monitoring``'s template generates it
(same job names, targets and ``node`` labels: the role's vars and defaults are read for them), and
checked with ``promtool check config``; the rules are the role's shipped rule file with the lab's
``for:`` overrides (``ALERT_FOR``), which is what the role renders with ``monitoring_alert_for``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from .preflight import LabError
from .private import write_private
from .procs import starttime as _starttime

REPO = Path(__file__).resolve().parent.parent
ROLE = REPO / "roles" / "monitoring"
SHIPPED_RULES = ROLE / "files" / "gpufleet.rules.yml"

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
    """What the monitoring role's template takes from its vars and defaults: job names, ports,
    and the textfile directory (the nccl_gate role's metrics path's directory)."""
    defaults = _yaml(ROLE / "defaults" / "main.yml")
    role_vars = _yaml(ROLE / "vars" / "main.yml")
    gate_metrics = _yaml(REPO / "roles" / "nccl_gate" / "defaults" / "main.yml")["nccl_gate_metrics_path"]
    return {
        "jobs": role_vars["__monitoring_jobs"],
        "node_exporter_port": int(defaults["monitoring_node_exporter_port"]),
        "vllm_port": int(defaults["monitoring_vllm_port"]),
        "textfile_dir": os.path.dirname(gate_metrics),
        "alert_for_defaults": role_vars["__monitoring_alert_for_defaults"],
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


# --- the configuration ------------------------------------------------------------------------


def scrape_configs(inventory, balancer_target=None, drift_target=None, settings=None, credentials_file=None):
    """Prometheus' scrape_configs for an inventory (Fleet.inventory()'s shape), as role monitoring's
    templates/etc/prometheus/prometheus.yml.j2 writes them: node_exporter of every gpu_nodes host,
    vLLM of every host whose monitoring_vllm_scrape is not false (at its vllm_server_port), the
    balancer's HAProxy exporter, and the drift report's exporter (honor_labels).

    ``credentials_file``: a file holding the servers' API key (vllm_server_api_key), sent as a bearer
    token by the serving job: llama.cpp's llama-server (role llamacpp_server) answers /metrics only
    with the key; vLLM's /metrics ignores it."""
    settings = settings or role_settings()
    jobs = settings["jobs"]
    group = inventory["all"]["children"].get("gpu_nodes", {})
    group_vars = group.get("vars", {}) or {}
    nodes, vllm = [], []
    for name, host in (group.get("hosts") or {}).items():
        hv = {**group_vars, **(host or {})}
        address = hv.get("ansible_host", name)
        nodes.append({"targets": [f"{address}:{settings['node_exporter_port']}"], "labels": {"node": name}})
        if str(hv.get("monitoring_vllm_scrape", True)).lower() not in ("false", "no", "0"):
            port = hv.get("vllm_server_port", settings["vllm_port"])
            vllm.append({"targets": [f"{address}:{port}"], "labels": {"node": name}})
    out = [
        {"job_name": jobs["node"], "static_configs": nodes},
        {"job_name": jobs["vllm"], "metrics_path": "/metrics", "static_configs": vllm},
    ]
    if credentials_file:
        out[1]["authorization"] = {"type": "Bearer", "credentials_file": str(credentials_file)}
    if balancer_target:
        name, target = balancer_target
        out.append(
            {
                "job_name": jobs["haproxy"],
                "metrics_path": "/metrics",
                "static_configs": [{"targets": [target], "labels": {"balancer": name}}],
            }
        )
    if drift_target:
        out.append({"job_name": jobs["drift"], "honor_labels": True, "static_configs": [{"targets": [drift_target]}]})
    return out


def lab_rules(alert_for=None):
    """The shipped rule file (the role's template rendered with its defaults) with `for:` set
    per alert name from alert_for, as `monitoring_alert_for` does in the role."""
    alert_for = ALERT_FOR if alert_for is None else alert_for
    doc = _yaml(SHIPPED_RULES)
    names = {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}
    unknown = sorted(set(alert_for) - set(names))
    if unknown:
        raise LabError(f"no alert named {', '.join(unknown)} in {SHIPPED_RULES}; known: {', '.join(sorted(names))}")
    for name, duration in alert_for.items():
        names[name]["for"] = duration
    return doc


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
        # the serving nodes' API key (the lab's vllm_server_api_key), 0600: llama-server's /metrics
        # needs it (role llamacpp_server requires the same key as vLLM)
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
    def write_config(self, inventory, balancer_spec):
        import yaml

        self.dir.mkdir(parents=True, exist_ok=True)
        self.rules.parent.mkdir(parents=True, exist_ok=True)
        self.drift_dir.mkdir(parents=True, exist_ok=True)
        self.rules.write_text(
            "# The lab's alert rules (lab/prometheus.py): roles/monitoring/files/gpufleet.rules.yml with\n"
            f"# `for:` overridden as monitoring_alert_for would: {json.dumps(ALERT_FOR)}\n"
            + yaml.safe_dump(lab_rules(), sort_keys=False, width=1000)
        )
        credentials = None
        secrets = getattr(self.fleet, "secrets", None)  # a Fleet has them; a bare test double may not
        api_key = secrets().get("vllm_server_api_key") if secrets else None
        if api_key:
            write_private(self.api_key_file, api_key + "\n")
            credentials = self.api_key_file
        balancer = None
        if balancer_spec and balancer_spec.get("exporter_port"):
            balancer = ("lab-balancer", f"{balancer_spec['address']}:{balancer_spec['exporter_port']}")
        config = {
            "global": {
                "scrape_interval": SCRAPE_INTERVAL,
                "scrape_timeout": SCRAPE_INTERVAL,
                "evaluation_interval": EVALUATION_INTERVAL,
            },
            "rule_files": [str(self.rules)],
            "scrape_configs": scrape_configs(
                inventory,
                balancer,
                f"{self.spec['address']}:{self.spec['drift_exporter_port']}",
                credentials_file=credentials,
            ),
        }
        self.config.write_text(
            "# Prometheus of the gpufleet lab, written by `python -m lab up` (lab/prometheus.py) from the\n"
            "# lab's inventory as role gpufleet.node.monitoring writes it; `lab down` removes it.\n"
            + yaml.safe_dump(config, sort_keys=False)
        )
        check = subprocess.run(
            [self.fleet.progs["promtool"], "check", "config", str(self.config)],
            capture_output=True,
            text=True,
            check=False,
        )
        if check.returncode:
            raise LabError(f"promtool refuses {self.config}: {(check.stdout + check.stderr).strip()}")

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
