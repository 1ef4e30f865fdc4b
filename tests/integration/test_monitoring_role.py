# SPDX-License-Identifier: GPL-3.0-or-later
"""The monitoring role on localhost, as the monitoring host of an inventory shaped like the lab's
(a few gpu_nodes, a balancer), writing into a temporary directory: the scrape configuration passes
`promtool check config`, names every node exporter and every serving node's vLLM with its node
label; the rendered rules are the shipped file byte for byte; a short `for:` through a variable;
idempotence; the preflight's refusal."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.harness.playbook import run_playbook

REPO = Path(__file__).resolve().parents[2]
SHIPPED_RULES = REPO / "roles" / "monitoring" / "files" / "gpufleet.rules.yml"
PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool is missing (Debian package prometheus)")

INVENTORY = {
    "all": {
        "children": {
            "gpu_nodes": {
                "hosts": {
                    "node-1": {"ansible_host": "10.77.0.11"},
                    "node-2": {"ansible_host": "10.77.0.12", "vllm_server_port": 8001},
                    "node-3": {"ansible_host": "10.77.0.13"},
                    # e.g. the lab's degraded node: measured, never served
                    "node-4": {"ansible_host": "10.77.0.14", "monitoring_vllm_scrape": False},
                }
            },
            "balancer": {"hosts": {"lb": {"ansible_host": "10.77.0.2"}}},
            "monitoring": {"hosts": {"prom": {"ansible_connection": "local"}}},
        }
    }
}

PLAYBOOK = """\
- name: The monitoring host
  hosts: monitoring
  gather_facts: false
  roles:
    - role: gpufleet.node.monitoring
"""


@pytest.fixture
def setup(tmp_path):
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(INVENTORY))
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    out = tmp_path / "etc" / "prometheus"
    extra = {
        "ansible_python_interpreter": sys.executable,
        "monitoring_prometheus_manage": False,
        "monitoring_prometheus_reload": False,
        "monitoring_promtool": PROMTOOL,
        "monitoring_prometheus_config_file": str(out / "prometheus.yml"),
        "monitoring_prometheus_rules_dir": str(out / "rules.d"),
        "monitoring_drift_exporters": ["127.0.0.1:9100"],
        "monitoring_serving_api_key_file": str(out / "gpufleet-serving.key"),
        "monitoring_prometheus_user": getpass.getuser(),
    }
    return tmp_path, out, extra


def play(ansible_env, tmp_path, *extra):
    return run_playbook(
        tmp_path / "play.yml", inventory=tmp_path / "hosts.yml", extra_vars=list(extra), env=ansible_env, timeout=300
    )


def test_scrape_config_for_the_lab_inventory(ansible_env, setup):
    tmp_path, out, extra = setup
    proc = play(ansible_env, tmp_path, extra)
    assert proc.returncode == 0, proc.explain()
    assert proc.host("prom")["changed"] == 3  # rules directory, rules, configuration
    config = out / "prometheus.yml"
    check = subprocess.run([PROMTOOL, "check", "config", str(config)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 19 rules found" in check.stdout

    doc = yaml.safe_load(config.read_text())
    assert doc["rule_files"] == [str(out / "rules.d" / "gpufleet.rules.yml")]
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}

    def targets(job):
        return {t: c["labels"] for c in jobs[job]["static_configs"] for t in c["targets"]}

    assert targets("gpufleet_node") == {f"10.77.0.1{i}:9100": {"node": f"node-{i}"} for i in range(1, 5)}
    assert targets("gpufleet_vllm") == {
        "10.77.0.11:8000": {"node": "node-1"},
        "10.77.0.12:8001": {"node": "node-2"},
        "10.77.0.13:8000": {"node": "node-3"},
    }
    assert targets("gpufleet_haproxy") == {"10.77.0.2:8405": {"balancer": "lb"}}
    # the pool's decider (role pool_decider) on the balancer: gpufleet_pool_budget is on by default
    assert targets("gpufleet_pool_decider") == {"10.77.0.2:9778": {"balancer": "lb"}}
    assert jobs["gpufleet_drift"]["honor_labels"] is True

    again = play(ansible_env, tmp_path, extra)
    assert again.returncode == 0 and again.host("prom")["changed"] == 0, again.explain()


def test_the_pool_decider_is_scraped_where_the_balancer_runs_one(ansible_env, setup):
    """A balancer with gpufleet_pool_budget false runs no decider: not scraped (its `up == 0` would
    page); another balancer's own gpufleet_pool_decider_port is where its decider listens."""
    tmp_path, out, extra = setup
    inventory = yaml.safe_load((tmp_path / "hosts.yml").read_text())
    inventory["all"]["children"]["balancer"]["hosts"] = {
        "lb": {"ansible_host": "10.77.0.2", "gpufleet_pool_budget": False},
        "lb2": {"ansible_host": "10.77.0.3", "gpufleet_pool_decider_port": 19778},
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    proc = play(ansible_env, tmp_path, extra)
    assert proc.returncode == 0, proc.explain()
    jobs = {j["job_name"]: j for j in yaml.safe_load((out / "prometheus.yml").read_text())["scrape_configs"]}
    assert [c["targets"] for c in jobs["gpufleet_pool_decider"]["static_configs"]] == [["10.77.0.3:19778"]]
    inventory["all"]["children"]["balancer"]["hosts"]["lb2"]["gpufleet_pool_budget"] = False
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    proc = play(ansible_env, tmp_path, extra)
    assert proc.returncode == 0, proc.explain()
    jobs = {j["job_name"] for j in yaml.safe_load((out / "prometheus.yml").read_text())["scrape_configs"]}
    assert "gpufleet_pool_decider" not in jobs and "gpufleet_haproxy" in jobs


def test_a_llamacpp_node_is_scraped_at_its_own_servers_port(ansible_env, setup):
    """The serving job scrapes each node at the port of the server it serves with: llama.cpp's
    (llamacpp_server_port) on a node that serves with llama.cpp, whether its inventory names the
    backend or site.yml chose it in this run (gpufleet_serving), never vLLM's; a node that sets no
    port for its server, at its gpufleet_serving_port, else the collection's."""
    tmp_path, out, extra = setup
    inventory = yaml.safe_load((tmp_path / "hosts.yml").read_text())
    nodes = inventory["all"]["children"]["gpu_nodes"]["hosts"]
    # named in the inventory; its vLLM port (a leftover) is not the one llama-server listens on
    nodes["node-1"].update(gpufleet_serving_backend="llamacpp", llamacpp_server_port=8081, vllm_server_port=8005)
    # chosen by site.yml in this run (auto): the choice, not the inventory's auto, decides
    nodes["node-2"].update(gpufleet_serving={"backend": "llamacpp", "reason": "GPUs differ in size"})
    # llama.cpp without a port of its own: the collection's port, not vLLM's
    nodes["node-3"].update(gpufleet_serving_backend="llamacpp", vllm_server_port=8006)
    # a vLLM node whose inventory moves the fleet's port
    nodes["node-4"].update(monitoring_vllm_scrape=True, gpufleet_serving_port=9000)
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    proc = play(ansible_env, tmp_path, extra)
    assert proc.returncode == 0, proc.explain()
    jobs = {j["job_name"]: j for j in yaml.safe_load((out / "prometheus.yml").read_text())["scrape_configs"]}
    assert {t: c["labels"] for c in jobs["gpufleet_vllm"]["static_configs"] for t in c["targets"]} == {
        "10.77.0.11:8081": {"node": "node-1"},
        "10.77.0.12:8000": {"node": "node-2"},  # its vllm_server_port 8001 is not llama.cpp's
        "10.77.0.13:8000": {"node": "node-3"},
        "10.77.0.14:9000": {"node": "node-4"},
    }


# The serving roles' own step that publishes a node's endpoint (tasks/endpoint.yml), run for the
# nodes before the monitoring host renders its configuration, as site.yml runs them.
PUBLISHING_PLAYBOOK = """\
- name: The llama.cpp node publishes its endpoint
  hosts: node-1
  gather_facts: false
  tasks:
    - name: Publish the endpoint
      ansible.builtin.include_role:
        name: gpufleet.node.llamacpp_server
        tasks_from: endpoint
      vars:
        llamacpp_server_port: 8082
- name: The vLLM node publishes its endpoint
  hosts: node-3
  gather_facts: false
  tasks:
    - name: Publish the endpoint
      ansible.builtin.include_role:
        name: gpufleet.node.vllm_server
        tasks_from: endpoint
      vars:
        vllm_server_model: example/model
        vllm_server_port: 8003
"""


def test_a_node_is_scraped_at_the_port_its_server_published(ansible_env, setup):
    """The serving endpoint a node's backend role published in this run names the port scraped,
    over the ports the inventory sets: a llama.cpp node whose port came from the play (not the
    inventory) is scraped there, not at its inventory's vLLM port nor the collection's."""
    tmp_path, out, extra = setup
    inventory = yaml.safe_load((tmp_path / "hosts.yml").read_text())
    nodes = inventory["all"]["children"]["gpu_nodes"]["hosts"]
    nodes["node-1"].update(gpufleet_serving_backend="llamacpp", vllm_server_port=8005)
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(PUBLISHING_PLAYBOOK + PLAYBOOK)
    proc = play(ansible_env, tmp_path, extra)
    assert proc.returncode == 0, proc.explain()
    jobs = {j["job_name"]: j for j in yaml.safe_load((out / "prometheus.yml").read_text())["scrape_configs"]}
    assert {t: c["labels"] for c in jobs["gpufleet_vllm"]["static_configs"] for t in c["targets"]} == {
        "10.77.0.11:8082": {"node": "node-1"},
        "10.77.0.12:8001": {"node": "node-2"},  # published nothing: its inventory's port
        "10.77.0.13:8003": {"node": "node-3"},
    }


def test_rendered_rules_are_the_shipped_file(ansible_env, setup):
    """The shipped rule file is the template rendered with the role's defaults; regenerate it with
    this playbook and monitoring_prometheus_rules_dir=roles/monitoring/files when the template or
    a judging default changes."""
    tmp_path, out, extra = setup
    proc = play(ansible_env, tmp_path, extra)
    assert proc.returncode == 0, proc.explain()
    assert (out / "rules.d" / "gpufleet.rules.yml").read_text() == SHIPPED_RULES.read_text()


def test_short_for_and_moved_thresholds(ansible_env, setup):
    tmp_path, out, extra = setup
    proc = play(
        ansible_env,
        tmp_path,
        extra,
        {
            "monitoring_alert_for": {"GpufleetNcclGateFailed": "10s"},
            "monitoring_vllm_max_kv_cache_usage": 0.8,
            "monitoring_serving_probe_slow_fraction": 0.5,
            "monitoring_haproxy_exporter_port": 0,
        },
    )
    assert proc.returncode == 0, proc.explain()
    rules = {
        r["alert"]: r
        for g in yaml.safe_load((out / "rules.d" / "gpufleet.rules.yml").read_text())["groups"]
        for r in g["rules"]
    }
    assert rules["GpufleetNcclGateFailed"]["for"] == "10s"
    assert rules["GpufleetNcclGateNotFromThisBoot"]["for"] == "15m"
    assert rules["GpufleetVllmKvCacheHigh"]["expr"].endswith(">= 0.8")
    assert "/ gpufleet_serving_probe_deadline_seconds >= 0.5\n" in rules["GpufleetServingProbeSlow"]["expr"]
    jobs = [j["job_name"] for j in yaml.safe_load((out / "prometheus.yml").read_text())["scrape_configs"]]
    assert "gpufleet_haproxy" not in jobs


def test_refuses_unknown_alert_and_bad_threshold(ansible_env, setup):
    tmp_path, out, extra = setup
    for bad in (
        {"monitoring_alert_for": {"GpufleetNoSuchAlert": "1m"}},
        {"monitoring_vllm_max_kv_cache_usage": 1.5},
        {"monitoring_serving_probe_slow_fraction": 0},
    ):
        proc = play(ansible_env, tmp_path, extra, bad)
        assert proc.returncode != 0
        assert "gpufleet.node.monitoring: a setting is out of range" in proc.stdout, proc.explain()
        assert not out.exists()


def test_serving_api_key_sent_from_a_0600_file(ansible_env, setup):
    """llama-server answers /metrics with 401 without the key: the serving job sends it as a bearer
    credentials file that promtool checks, written 0600 and never shown in the output."""
    tmp_path, out, extra = setup
    key = "fleet-key-" + "x" * 24
    proc = play(ansible_env, tmp_path, extra, {"vllm_server_api_key": key})
    assert proc.returncode == 0, proc.explain()
    assert key not in proc.stdout
    key_file = out / "gpufleet-serving.key"
    assert key_file.read_text() == key
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    jobs = {j["job_name"]: j for j in yaml.safe_load((out / "prometheus.yml").read_text())["scrape_configs"]}
    assert jobs["gpufleet_vllm"]["authorization"] == {"type": "Bearer", "credentials_file": str(key_file)}
    assert "authorization" not in jobs["gpufleet_node"]
    check = subprocess.run(
        [PROMTOOL, "check", "config", str(out / "prometheus.yml")], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr

    # without a key, the file goes and the job sends nothing
    again = play(ansible_env, tmp_path, extra)
    assert again.returncode == 0, again.explain()
    assert not key_file.exists()
    jobs = {j["job_name"]: j for j in yaml.safe_load((out / "prometheus.yml").read_text())["scrape_configs"]}
    assert "authorization" not in jobs["gpufleet_vllm"]


def test_refuses_a_node_with_another_key(ansible_env, setup):
    tmp_path, out, extra = setup
    inventory = yaml.safe_load((tmp_path / "hosts.yml").read_text())
    nodes = inventory["all"]["children"]["gpu_nodes"]["hosts"]
    nodes["node-3"]["llamacpp_server_api_key"] = "another-key"
    nodes["node-4"]["llamacpp_server_api_key"] = "not-scraped-so-not-checked"
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    proc = play(ansible_env, tmp_path, extra, {"vllm_server_api_key": "fleet-key"})
    assert proc.returncode != 0
    assert "these nodes' key differs: node-3." in proc.stdout, proc.explain()
    assert "another-key" not in proc.stdout
    assert not out.exists()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prometheus_config(url):
    with urllib.request.urlopen(url + "/api/v1/status/config", timeout=10) as resp:
        return yaml.safe_load(json.load(resp)["data"]["yaml"])


def test_a_prometheus_systemd_does_not_run_is_reloaded_through_its_endpoint(ansible_env, setup):
    """monitoring_prometheus_reload_url: a real Prometheus (--web.enable-lifecycle) started on a
    configuration of its own loads the role's after the run, the role's POST being the only reload;
    the second run changes nothing and so reloads nothing."""
    tmp_path, out, extra = setup
    out.mkdir(parents=True)
    (out / "prometheus.yml").write_text("global: {scrape_interval: 1m}\n")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "prometheus.log", "w")
    server = subprocess.Popen(
        [
            shutil.which("prometheus") or "/usr/bin/prometheus",
            f"--config.file={out / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _prometheus_config(url)
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()
                time.sleep(0.2)
        assert not _prometheus_config(url).get("scrape_configs")
        reload = {"monitoring_prometheus_reload": True, "monitoring_prometheus_reload_url": url + "/-/reload"}
        proc = play(ansible_env, tmp_path, extra, reload)
        assert proc.returncode == 0, proc.explain()
        assert proc.host("prom")["changed"] == 4, proc.explain()  # rules directory, rules, configuration, reload
        loaded = _prometheus_config(url)
        assert [j["job_name"] for j in loaded["scrape_configs"]] == [
            "gpufleet_node",
            "gpufleet_vllm",
            "gpufleet_haproxy",
            "gpufleet_pool_decider",
            "gpufleet_drift",
        ]
        with urllib.request.urlopen(url + "/api/v1/rules", timeout=10) as resp:
            rules = [r["name"] for g in json.load(resp)["data"]["groups"] for r in g["rules"]]
        assert len(rules) == 19 and "GpufleetNcclGateFailed" in rules
        again = play(ansible_env, tmp_path, extra, reload)
        assert again.returncode == 0 and again.host("prom")["changed"] == 0, again.explain()
        # an endpoint that does not answer fails the run, naming it
        gone = play(
            ansible_env,
            tmp_path,
            extra,
            reload,
            {"monitoring_prometheus_reload_url": "http://127.0.0.1:9/-/reload", "monitoring_scrape_interval": "20s"},
        )
        assert gone.returncode != 0 and "127.0.0.1:9/-/reload" in gone.stdout, gone.explain()
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
