# SPDX-License-Identifier: GPL-3.0-or-later
"""site.yml on a fresh lab fleet: who is registered and why not, idempotence, a clean drift check."""

from __future__ import annotations

import re

import pytest

from lab import prometheus
from tests.harness.inventory import node_inventory_vars
from tests.harness.lab import FLEET_PROFILES, server_unit

pytestmark = pytest.mark.slow
# As conftest.py names them: node1, node2, ... in the order of GPUFLEET_FLEET_PROFILES.
PROFILES = FLEET_PROFILES
DEGRADED = [f"node{i + 1}" for i, p in enumerate(PROFILES) if p.strip() == "l40s-x8-degraded"]


def _degraded_gpu(fleet, node):
    """(GPU index, GPU BDF, its port) of the GPU whose link trained below its maximum width."""
    hw = fleet.hw(node)
    for gpu in hw.gpus:
        if gpu.width_current < gpu.width_max:
            return gpu.index, gpu.bdf, gpu.parent
    raise AssertionError(f"{node} has no GPU below its link width: not the x8-degraded profile?")


def test_first_run_registers_the_healthy_nodes_only(fleet, first_run):
    for node in fleet.healthy:
        assert fleet.recap_ok(first_run, node), first_run.explain()
        server = fleet.first_pool.get(node)
        assert server, f"{node} is not in HAProxy's pool after the first run: {fleet.first_pool}"
        assert server["state"] == "ready", server
        assert (server["address"], server["port"]) == (fleet.nodes[node]["address"], 8000), server
        # kept in the config file too, so that a restart of the balancer keeps the pool
        assert fleet.first_config.get(node) == f"{fleet.nodes[node]['address']}:8000", fleet.first_config
    for node in fleet.refused:
        assert first_run.recap[node]["failed"] >= 1, first_run.explain()
        # out of rotation but known to the balancer (added drained): its boot validation returns it
        assert fleet.first_pool.get(node, {}).get("state") == "drain", fleet.first_pool
        assert fleet.first_config.get(node) == f"{fleet.nodes[node]['address']}:8000", fleet.first_config
    # a node failed, so the run as a whole fails
    assert first_run.rc != 0 if fleet.refused else first_run.rc == 0, first_run.explain()


@pytest.mark.parametrize("node", DEGRADED)
def test_first_run_says_why_the_degraded_node_is_refused(fleet, first_run, node):
    index, bdf, port = _degraded_gpu(fleet, node)
    failures = "\n".join(first_run.host_failures(node))
    assert failures, first_run.explain()
    # the rescue names the node and the step; the gate names the GPU, its link and the port
    assert f"{node} is out of the pool" in failures, failures
    assert "NCCL gate failed" in failures, failures
    flat = re.sub(r"\s+", " ", failures)
    assert f"GPU{index} ({bdf}) trained to x8 of x16 below port {port}" in flat, flat


def test_second_run_changes_nothing(fleet, converged):
    run = fleet.site(label="site.yml (second run)")
    # the nodes, the lab's balancer (the pool budget's play; the budget is off in this lab) and the
    # lab's Prometheus (playbooks/monitoring.yml, which site.yml imports)
    assert set(run.recap) == set(fleet.nodes) | {"lab-balancer", prometheus.HOST}, run.explain()
    assert fleet.recap_ok(run, "lab-balancer"), run.explain()
    assert fleet.recap_ok(run, prometheus.HOST), run.explain()
    changed = {h: r["changed"] for h, r in run.recap.items() if r["changed"]}
    assert not changed, f"changed on a second run: {changed}\n{run.explain()}"
    for node in fleet.healthy:
        assert fleet.recap_ok(run, node), run.explain()
    for node in fleet.refused:
        # still out: the gate's verdict holds for this boot, nothing is measured again
        flat = re.sub(r"\s+", " ", "\n".join(run.host_failures(node)))
        assert "the NCCL gate failed earlier in this boot" in flat.lower() or "failed in this boot" in flat, flat
        fleet.assert_drained(node)
    assert fleet.ready() == set(fleet.healthy)
    secrets = fleet.secrets.values()
    for output in (fleet.first_run.output, run.output):
        assert not [s for s in secrets if s in output], "a vaulted secret in the output of site.yml"


def test_site_runs_the_node_exporter_and_worker_recycling_steps(fleet, converged):
    """Role monitoring's node half on every node (before the checks that can stop one, so that a
    refused node exports why): node_exporter's arguments as the role writes them, running; role
    worker_recycle (on in the lab's inventory) on every node that serves with vLLM, none on a node
    that never served."""
    for node in fleet.fleet_nodes:
        host = fleet.host(node)
        args = host.file("/etc/default/prometheus-node-exporter").content_string
        assert "The textfile collector reads the .prom files the gpufleet.node roles write." in args, args
        assert (
            'ARGS="--web.listen-address=:9100 --collector.textfile.directory=/var/lib/node_exporter/textfile_collector '
            + " ".join(prometheus.NODE_EXPORTER_COLLECTORS)
            + '"'
        ) in args, args
        assert host.service("prometheus-node-exporter.service").is_running, node
        timer = host.service("gpufleet-worker-recycle.timer")
        no_swap = host.file("/etc/systemd/system/vllm.service.d/10-gpufleet-no-swap.conf")
        if node in fleet.healthy and server_unit(node) == "vllm.service":
            assert timer.is_enabled and timer.is_running, node
            assert "MemorySwapMax=0" in no_swap.content_string, node
        else:
            assert not host.file("/etc/systemd/system/gpufleet-worker-recycle.timer").exists, node
            assert not no_swap.exists, node


def test_vaulted_secrets_reach_vllm_and_stay_out_of_the_boot_validation_inventory(fleet, converged):
    """The lab's inventory carries vllm_server_api_key and vllm_server_hf_token as !vault values:
    vLLM gets them (its 0600 secrets file; /v1 asks for the key), the node's boot validation
    inventory and the node's journal never see them, neither in plain text nor vaulted."""
    import urllib.error
    import urllib.request

    key, token = fleet.secrets["vllm_server_api_key"], fleet.secrets["vllm_server_hf_token"]
    vault = (fleet.state / "group_vars" / "all" / "vault.yml").read_text()
    assert "vllm_server_api_key: !vault |" in vault and key not in vault and token not in vault
    for node in [n for n in fleet.healthy if server_unit(n) == "vllm.service"]:
        host = fleet.host(node)
        env = host.file("/etc/vllm/secrets.env")
        assert env.mode == 0o600, oct(env.mode)
        assert {f"VLLM_API_KEY={key}", f"HF_TOKEN={token}"} <= set(env.content_string.split()), node
        models = f"http://{fleet.nodes[node]['address']}:8000/v1/models"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(models, timeout=10)
        assert refused.value.code == 401
        with urllib.request.urlopen(
            urllib.request.Request(models, headers={"Authorization": f"Bearer {key}"}), timeout=10
        ) as resp:
            assert resp.status == 200
        inventory = host.file("/etc/gpufleet/validate/inventory.yml").content_string
        for leaked in (key, token, "$ANSIBLE_VAULT", "vllm_server_hf_token"):
            assert leaked not in inventory, f"{node}: {leaked[:14]}... in the boot validation inventory"
        # the key is read at boot from vLLM's secrets file on the node
        node_vars = node_inventory_vars(inventory, node)
        assert node_vars["vllm_server_api_key"] == (
            "{{ vllm_server_secrets_file | gpufleet.node.boot_validation_env_file_value('VLLM_API_KEY') }}"
        ), node_vars["vllm_server_api_key"]
        journal = fleet.sh(node, "journalctl --no-pager -o cat")
        assert key not in journal and token not in journal, f"{node}: a vaulted secret in the journal"


def test_drift_is_clean_after_site(fleet, converged):
    drift = fleet.drift()
    assert drift.run.rc == 0, drift.run.explain()
    report = drift.report
    assert report["drifted"] == [], report
    assert sorted(report["out_of_service"]) == sorted(fleet.refused), report
    for node in fleet.healthy:
        assert report["nodes"][node] == [], report["nodes"][node]
        assert re.search(rf"^{node}\s+clean\s", drift.table, re.M), drift.table
        assert f'gpufleet_drift_detected{{node="{node}"}} 0' in drift.prom
        assert f'gpufleet_node_out_of_service{{node="{node}"}} 0' in drift.prom
    for node in fleet.refused:
        kinds = {item["kind"] for item in report["nodes"][node]}
        assert kinds == {"out_of_service"}, report["nodes"][node]
        assert f'gpufleet_drift_detected{{node="{node}"}} 0' in drift.prom
        assert f'gpufleet_node_out_of_service{{node="{node}"}} 1' in drift.prom
    # the check looked only: nobody was drained or returned
    assert fleet.ready() == set(fleet.healthy) and set(fleet.pool()) == set(fleet.nodes)


def test_drift_of_one_node_with_limit_writes_a_report(fleet, converged):
    node = fleet.healthy[0]
    drift = fleet.drift(
        "--tags",
        "drift_report",
        limit=node,
        drift_dir=fleet.state / "drift-limit",
        label=f"drift.yml --check --diff --limit {node} --tags drift_report",
    )
    assert drift.run.rc == 0, drift.run.explain()
    assert drift.report, f"no report written:\n{drift.run.output[-3000:]}"
    assert list(drift.report["nodes"]) == [node], drift.report
