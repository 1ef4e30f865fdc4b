# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab's monitoring (lab/prometheus.py): the scrape configuration it generates from the lab's
inventory (what role gpufleet.node.monitoring generates: same jobs, targets, node labels), the
rules with the lab's short `for:`, node_exporter's settings in a node; and on the session's lab,
a metric written into a node's textfile directory reaching the lab's Prometheus.

The fleet end to end (every target up after site.yml, the gate alert for the degraded node, the
dashboard): tests/fleet/test_fleet_6_prometheus.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from types import SimpleNamespace

import pytest
import yaml

from lab import prometheus
from lab.fleet import Fleet
from lab.preflight import LabError
from tests import support

PROMTOOL = shutil.which("promtool")

# The lab's inventory shape (Fleet.inventory()): a degraded node that never serves, a node whose
# vLLM listens elsewhere.
INVENTORY = {
    "all": {
        "children": {
            "gpu_nodes": {
                "hosts": {
                    "node1": {"ansible_host": "10.213.7.2", "ansible_port": 22},
                    "node2": {"ansible_host": "10.213.7.6", "vllm_server_port": 8001},
                    "node3": {"ansible_host": "10.213.7.10", "monitoring_vllm_scrape": False},
                },
                "vars": {"ansible_user": "root"},
            },
            "balancer": {"hosts": {"lab-balancer": {"ansible_connection": "local"}}},
        }
    }
}


def targets(configs, job):
    (cfg,) = [c for c in configs if c["job_name"] == job]
    return {t: sc.get("labels") for sc in cfg["static_configs"] for t in sc["targets"]}


def test_scrape_configs_as_the_role_writes_them():
    configs = prometheus.scrape_configs(
        INVENTORY, ("lab-balancer", "127.0.0.1:8405"), "127.0.0.1:9999", settings=prometheus.role_settings()
    )
    role_vars = yaml.safe_load((prometheus.ROLE / "vars" / "main.yml").read_text())["__monitoring_jobs"]
    assert [c["job_name"] for c in configs] == [role_vars[k] for k in ("node", "vllm", "haproxy", "drift")]
    assert targets(configs, "gpufleet_node") == {
        "10.213.7.2:9100": {"node": "node1"},
        "10.213.7.6:9100": {"node": "node2"},
        "10.213.7.10:9100": {"node": "node3"},
    }
    assert targets(configs, "gpufleet_vllm") == {
        "10.213.7.2:8000": {"node": "node1"},
        "10.213.7.6:8001": {"node": "node2"},
    }
    assert targets(configs, "gpufleet_haproxy") == {"127.0.0.1:8405": {"balancer": "lab-balancer"}}
    drift = [c for c in configs if c["job_name"] == "gpufleet_drift"][0]
    assert drift["honor_labels"] is True and drift["static_configs"] == [{"targets": ["127.0.0.1:9999"]}]


def test_lab_rules_shorten_only_the_named_for():
    shipped = {
        r["alert"]: r for g in yaml.safe_load(prometheus.SHIPPED_RULES.read_text())["groups"] for r in g["rules"]
    }
    lab = {r["alert"]: r for g in prometheus.lab_rules()["groups"] for r in g["rules"]}
    assert set(lab) == set(shipped)
    for name, rule in lab.items():
        expected = prometheus.ALERT_FOR.get(name, shipped[name]["for"])
        assert rule["for"] == expected and rule["expr"] == shipped[name]["expr"], name
    assert lab["GpufleetNcclGateFailed"]["for"] == "5s" != shipped["GpufleetNcclGateFailed"]["for"]
    with pytest.raises(LabError, match="no alert named GpufleetNoSuch"):
        prometheus.lab_rules({"GpufleetNoSuch": "1s"})


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


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is missing (Debian package prometheus)")
def test_written_config_passes_promtool_and_a_bad_one_is_refused(tmp_path, monkeypatch):
    fleet = SimpleNamespace(progs={"promtool": PROMTOOL})
    spec = prometheus.Prometheus.describe(tmp_path)
    prom = prometheus.Prometheus(fleet, spec)
    prom.write_config(INVENTORY, {"address": "127.0.0.1", "exporter_port": 8405})
    check = subprocess.run([PROMTOOL, "check", "config", str(prom.config)], capture_output=True, text=True)
    assert check.returncode == 0 and "SUCCESS: 13 rules found" in check.stdout, check.stdout + check.stderr
    config = yaml.safe_load(prom.config.read_text())
    assert config["global"]["evaluation_interval"] == "1s" and config["rule_files"] == [str(prom.rules)]
    # promtool checks the rule files the configuration names: a broken rule stops `lab up`
    broken = prometheus.lab_rules()
    broken["groups"][0]["rules"][0]["expr"] = "sum by (node (up)"
    monkeypatch.setattr(prometheus, "lab_rules", lambda: broken)
    with pytest.raises(LabError, match="promtool refuses"):
        prom.write_config(INVENTORY, None)


_MISSING = support.lab_prerequisites()


@pytest.mark.skipif(bool(_MISSING), reason=f"lab prerequisites: {_MISSING}")
def test_a_nodes_textfile_metric_reaches_the_labs_prometheus(session_lab):
    """On the session's spare node: node_exporter (enabled, on the node's address) serves what is
    written to the textfile directory, and the lab's Prometheus (`status --json` prometheus.url)
    scrapes it with the node's label; the nodes run no Prometheus of their own."""
    st = json.loads(session_lab.cli("status", "--json").stdout)
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
            result = support.prometheus_api(url, "query", query=metric)["result"]
            if result or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert [(r["metric"]["node"], r["metric"]["job"], r["value"][1]) for r in result] == [
            (spare, "gpufleet_node", "42")
        ]
    finally:
        session_lab.ssh(spare, f"rm -f {textfile}/lab_probe.prom")
    assert Fleet(session_lab.state).prometheus().pid()
