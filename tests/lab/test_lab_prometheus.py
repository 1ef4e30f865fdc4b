# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab's monitoring (lab/prometheus.py): its Prometheus files are role gpufleet.node.monitoring's
own output (playbooks/monitoring.yml on the inventory's lab-prometheus host: every lab node, the
lab's short `for:`, promtool), node_exporter's settings in a node; and on the session's lab, a
metric written into a node's textfile directory reaching the lab's Prometheus.

The fleet end to end (every target up after site.yml, the gate alert for the degraded node, the
dashboard): tests/fleet/test_fleet_6_prometheus.py.
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import time
from types import SimpleNamespace

import pytest
import yaml

from lab import prometheus
from lab.fleet import Fleet
from lab.preflight import LabError
from tests.harness.lab import lab_prerequisites
from tests.harness.playbook import parse_recap
from tests.harness.prometheus import prometheus_api

PROMTOOL = shutil.which("promtool")
SHIPPED_RULES = prometheus.ROLE / "files" / "gpufleet.rules.yml"

# The lab's inventory shape (Fleet.inventory()): a degraded node that never serves, a node whose
# vLLM listens elsewhere; this inventory's gpu_nodes name only part of the lab (node3 is the spare).
NODES = {
    "node1": {"ansible_host": "10.213.7.2", "ansible_port": 22},
    "node2": {"ansible_host": "10.213.7.6", "vllm_server_port": 8001},
    "node3": {"ansible_host": "10.213.7.10", "monitoring_vllm_scrape": False},
}


def lab_inventory(tmp_path, prom, key=None):
    inventory = {
        "all": {
            "children": {
                "gpu_nodes": {"hosts": {n: NODES[n] for n in ("node1", "node2")}, "vars": {"ansible_user": "root"}},
                "balancer": {"hosts": {"lab-balancer": {"ansible_connection": "local", "ansible_host": "127.0.0.1"}}},
                **prometheus.inventory_groups(prom, {"address": "127.0.0.1", "exporter_port": 8405}, NODES, PROMTOOL),
            },
            "vars": {"vllm_server_api_key": key} if key else {},
        }
    }
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inventory))
    return path


def targets(configs, job):
    (cfg,) = [c for c in configs if c["job_name"] == job]
    return {t: sc.get("labels") for sc in cfg["static_configs"] for t in sc["targets"]}


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is missing (Debian package prometheus)")
def test_the_labs_prometheus_files_are_the_roles_output(tmp_path):
    """Role monitoring writes them: every lab node (group lab_nodes, not only this inventory's
    gpu_nodes) with its node label, the serving nodes' /metrics with the key file, HAProxy's and the
    drift report's exporters, the lab's intervals; the rules are the shipped ones with the lab's
    `for:` only; the serving key 0600; a second run changes nothing."""
    prom = prometheus.Prometheus(
        SimpleNamespace(progs={"promtool": PROMTOOL}), prometheus.Prometheus.describe(tmp_path)
    )
    inventory = lab_inventory(tmp_path, prom, key="lab-api-key-0123456789")
    run = prom.write_config(inventory)
    assert "lab-api-key-0123456789" not in run.stdout + run.stderr
    check = subprocess.run([PROMTOOL, "check", "config", str(prom.config)], capture_output=True, text=True)
    assert check.returncode == 0 and "SUCCESS: 19 rules found" in check.stdout, check.stdout + check.stderr
    config = yaml.safe_load(prom.config.read_text())
    assert config["global"] == {"scrape_interval": "2s", "evaluation_interval": "1s"}
    assert config["rule_files"] == [str(prom.rules)]
    jobs = config["scrape_configs"]
    assert targets(jobs, "gpufleet_node") == {
        "10.213.7.2:9100": {"node": "node1"},
        "10.213.7.6:9100": {"node": "node2"},
        "10.213.7.10:9100": {"node": "node3"},
    }
    assert targets(jobs, "gpufleet_vllm") == {
        "10.213.7.2:8000": {"node": "node1"},
        "10.213.7.6:8001": {"node": "node2"},
    }
    (vllm,) = [j for j in jobs if j["job_name"] == "gpufleet_vllm"]
    assert vllm["authorization"] == {"type": "Bearer", "credentials_file": str(prom.api_key_file)}
    assert prom.api_key_file.read_text() == "lab-api-key-0123456789"
    assert stat.S_IMODE(prom.api_key_file.stat().st_mode) == 0o600
    assert targets(jobs, "gpufleet_haproxy") == {"127.0.0.1:8405": {"balancer": "lab-balancer"}}
    drift = [c for c in jobs if c["job_name"] == "gpufleet_drift"][0]
    drift_target = f"127.0.0.1:{prom.spec['drift_exporter_port']}"
    assert drift["honor_labels"] is True and drift["static_configs"] == [{"targets": [drift_target]}]

    shipped = {r["alert"]: r for g in yaml.safe_load(SHIPPED_RULES.read_text())["groups"] for r in g["rules"]}
    lab = {r["alert"]: r for g in yaml.safe_load(prom.rules.read_text())["groups"] for r in g["rules"]}
    assert set(lab) == set(shipped)
    for name, rule in lab.items():
        assert rule["for"] == prometheus.ALERT_FOR.get(name, shipped[name]["for"]), name
        assert rule["expr"] == shipped[name]["expr"], name
    assert lab["GpufleetNcclGateFailed"]["for"] == "5s" != shipped["GpufleetNcclGateFailed"]["for"]

    again = prom.write_config(inventory)
    assert parse_recap(again.stdout)[prometheus.HOST]["changed"] == 0, again.stdout


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is missing (Debian package prometheus)")
def test_a_setting_the_role_refuses_stops_lab_up(tmp_path, monkeypatch):
    prom = prometheus.Prometheus(
        SimpleNamespace(progs={"promtool": PROMTOOL}), prometheus.Prometheus.describe(tmp_path)
    )
    monkeypatch.setattr(prometheus, "ALERT_FOR", {"GpufleetNoSuch": "1s"})
    with pytest.raises(LabError, match="role monitoring could not write the lab's Prometheus configuration") as failed:
        prom.write_config(lab_inventory(tmp_path, prom))
    assert "monitoring_alert_for names among" in str(failed.value)
    assert not prom.config.exists()


def test_node_exporter_reads_the_roles_textfile_directory(tmp_path):
    prometheus.install_node_exporter(tmp_path, "10.213.7.2")
    settings = prometheus.role_settings()
    # nccl_gate, gpu_health and the monitoring role write to / read from one directory, the
    # collection's (roles/_common)
    home = yaml.safe_load((prometheus.REPO / "roles/_common/defaults/main.yml").read_text())
    health = yaml.safe_load((prometheus.REPO / "roles/gpu_health/defaults/main.yml").read_text())
    assert settings["textfile_dir"] == home["gpufleet_textfile_dir"] == "/var/lib/node_exporter/textfile_collector"
    assert health["gpu_health_metrics_path"].startswith("{{ gpufleet_textfile_dir }}/")
    args = (tmp_path / "etc/default/prometheus-node-exporter").read_text()
    assert (
        'ARGS="--web.listen-address=10.213.7.2:9100 '
        "--collector.textfile.directory=/var/lib/node_exporter/textfile_collector "
        '--collector.disable-defaults --collector.textfile --collector.stat --collector.time --collector.uname"' in args
    )
    assert (tmp_path / "var/lib/node_exporter/textfile_collector").is_dir()
    link = tmp_path / "etc/systemd/system/multi-user.target.wants/prometheus-node-exporter.service"
    assert link.is_symlink()


_MISSING = lab_prerequisites()


@pytest.mark.skipif(bool(_MISSING), reason=f"lab prerequisites: {_MISSING}")
def test_a_nodes_textfile_metric_reaches_the_labs_prometheus(session_lab):
    """On the session's spare node: node_exporter (enabled, on the node's address) serves what is
    written to the textfile directory, and the lab's Prometheus (`status --json` prometheus.url)
    scrapes it with the node's label; the nodes run no Prometheus of their own."""
    st = json.loads(session_lab.lab("status", "--json").stdout)
    url = st["prometheus"]["url"]
    assert st["prometheus"]["state"] == "running" and url.startswith("http://127.0.0.1:")
    spare = session_lab.spare
    address = session_lab.spec(spare)["address"]
    textfile = prometheus.role_settings()["textfile_dir"]
    metric = f"gpufleet_lab_probe_{int(time.time())}"
    out = session_lab.ssh(
        spare,
        f"echo '{metric} 42' > {textfile}/lab_probe.prom; systemctl is-active prometheus-node-exporter; "
        "systemctl is-enabled prometheus.service; "
        f"python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://{address}:9100/metrics\").read().decode())' "
        f"| grep '^{metric}'",
        check=False,
    )
    try:
        assert out.split("\n")[:3] == ["active", "masked", f"{metric} 42"], out
        deadline = time.monotonic() + 20
        while True:
            result = prometheus_api(url, "query", query=metric)["result"]
            if result or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert [(r["metric"]["node"], r["metric"]["job"], r["value"][1]) for r in result] == [
            (spare, "gpufleet_node", "42")
        ]
    finally:
        session_lab.ssh(spare, f"rm -f {textfile}/lab_probe.prom")
    assert Fleet(session_lab.state).prometheus().pid()
