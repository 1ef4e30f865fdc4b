# SPDX-License-Identifier: GPL-3.0-or-later
"""The worker_recycle role through ansible-playbook -c local into temporary directories: the files,
the agent's configuration, units that systemd-analyze accepts, idempotence, check mode and the
refusals of its preflight. Idempotence is asserted here rather than on the lab node (a second run
over SSH costs 20 s for the same tasks). (tests/integration/test_ops_lab.py runs it on a lab node.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.playbook import one_role_playbook, run_playbook, task_results

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "tests" / "integration" / "playbooks" / "ops_role_local.yml"
#: The collection's code the agent imports, as a module_utils tree in its lib dir.
TREE = "usr/local/lib/gpufleet/ansible_collections/gpufleet/node/plugins/module_utils"
LIBS = [
    "usr/local/lib/gpufleet/ansible_collections/__init__.py",
    "usr/local/lib/gpufleet/ansible_collections/gpufleet/__init__.py",
    "usr/local/lib/gpufleet/ansible_collections/gpufleet/node/__init__.py",
    "usr/local/lib/gpufleet/ansible_collections/gpufleet/node/plugins/__init__.py",
    f"{TREE}/__init__.py",
    f"{TREE}/common/__init__.py",
    f"{TREE}/common/_atomic.py",
    f"{TREE}/common/_http.py",
    f"{TREE}/common/_textfile.py",
    f"{TREE}/lb/__init__.py",
    f"{TREE}/lb/_budget.py",
    f"{TREE}/lb/_haproxy.py",
    f"{TREE}/serving/__init__.py",
    f"{TREE}/serving/_recycle.py",
    f"{TREE}/serving/_vllm_metrics.py",
]


def variables(tmp_path, **kw):
    root = tmp_path / "host"
    extra = {
        "ansible_python_interpreter": sys.executable,
        "worker_recycle_systemd_dir": str(root / "etc/systemd/system"),
        "worker_recycle_lib_dir": str(root / "usr/local/lib/gpufleet"),
        "worker_recycle_config_file": str(root / "etc/gpufleet/worker-recycle.json"),
        "worker_recycle_state_file": str(root / "var/lib/gpufleet/worker-recycle/state.json"),
        "worker_recycle_textfile": str(root / "var/lib/node_exporter/textfile_collector/w.prom"),
        "worker_recycle_status_file": str(root / "run/gpufleet/worker-recycle.json"),
        "worker_recycle_python": sys.executable,
        "worker_recycle_manage_service": False,
        "worker_recycle_install_packages": False,
        "lb_registration_backend": "vllm_pool",
    }
    extra.update(kw)
    return extra


def play(ansible_env, extra, *args):
    return run_playbook(PLAYBOOK, *args, local=True, inventory="node7,", extra_vars=extra, env=ansible_env, timeout=300)


def recap(proc):
    return proc.host("node7")


def test_role_installs_agent_units_and_no_swap_drop_in(ansible_env, tmp_path):
    extra = variables(tmp_path)
    check = play(ansible_env, extra, "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert recap(check)["changed"] >= 5 and not (tmp_path / "host").exists()  # check mode writes nothing
    proc = play(ansible_env, extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    host = tmp_path / "host"
    files = sorted(str(p.relative_to(host)) for p in host.rglob("*") if p.is_file())
    assert files == [
        "etc/gpufleet/worker-recycle.json",
        "etc/systemd/system/gpufleet-worker-recycle.service",
        "etc/systemd/system/gpufleet-worker-recycle.timer",
        "etc/systemd/system/vllm.service.d/10-gpufleet-no-swap.conf",
        *LIBS,
        "usr/local/lib/gpufleet/gpufleet_worker_recycle.py",
    ]
    config = json.loads((host / "etc/gpufleet/worker-recycle.json").read_text())
    # by default the node drains through its own HAProxy agent: no balancer endpoint at all
    assert config["balancer"] == {
        "method": "agent",
        "endpoint": "",
        "backend": "vllm_pool",
        "server": "node7",
        "drain_command": [],
        "return_command": [],
        "request_file": "/run/gpufleet/lb-agent-request.json",
        "settle": 5.0,
        "ready_hold": 20.0,
        "decider": None,  # no balancer host, so no pool decider to wait for
    }
    assert config["unit"] == "vllm.service" and config["metrics_url"] == "http://127.0.0.1:8000/metrics"
    assert config["judge"]["rss_slope_mib_per_min"] == 50.0 and config["action"] == "recycle"
    assert "MemorySwapMax=0" in (host / "etc/systemd/system/vllm.service.d/10-gpufleet-no-swap.conf").read_text()
    timer = (host / "etc/systemd/system/gpufleet-worker-recycle.timer").read_text()
    assert "OnUnitActiveSec=5min" in timer and "WantedBy=timers.target" in timer
    if shutil.which("systemd-analyze"):
        units = tmp_path / "units"
        units.mkdir()
        (units / "vllm.service").write_text("[Service]\nExecStart=/bin/true\n")
        env = dict(os.environ, SYSTEMD_UNIT_PATH="%s:%s:" % (units, host / "etc/systemd/system"), SYSTEMD_LOG_COLOR="0")
        for unit in ("gpufleet-worker-recycle.service", "gpufleet-worker-recycle.timer"):
            res = subprocess.run(
                ["systemd-analyze", "verify", str(host / "etc/systemd/system" / unit)],
                capture_output=True,
                text=True,
                env=env,
            )
            assert res.returncode == 0 and res.stdout + res.stderr == "", res.stdout + res.stderr
    # the installed agent runs from its lib dir (no systemd here: it says so and exits 1, not 2)
    res = subprocess.run(
        [
            sys.executable,
            str(host / "usr/local/lib/gpufleet/gpufleet_worker_recycle.py"),
            "--config",
            str(host / "etc/gpufleet/worker-recycle.json"),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, PATH="/nonexistent"),
    )
    assert "systemctl" in res.stderr and res.returncode == 1, res.stdout + res.stderr
    again = play(ansible_env, extra)
    assert recap(again)["changed"] == 0, again.stdout


DECIDER = {"url": "http://node7:9778/metrics", "backend": "vllm_pool", "server": "node7", "wait": 60.0}


@pytest.mark.parametrize(
    "budget, node, decider",
    [
        (True, {}, DECIDER),
        (False, {}, None),
        # the node's agent answers a recycle with a plain drain, which the decider never holds
        (True, {"lb_registration_budgeted": False}, None),
        (True, {"lb_registration_budgeted_words": ["gpu-health-failed", "gate-failed"]}, None),
    ],
    ids=["budget", "no-budget", "agent-not-budgeted", "recycle-not-budgeted"],
)
def test_where_the_balancer_runs_the_pools_decider_a_recycle_waits_for_it(ansible_env, tmp_path, budget, node, decider):
    """The balancer host's gpufleet_pool_budget decides, as it does for the node's agent: the recycle
    waits for the decider's drain at the balancer's decider port, or drains through the agent alone,
    as it does where the node's agent does not hold a recycle for the decider."""
    extra = variables(tmp_path, gpufleet_lb_host="node7", gpufleet_pool_budget=budget, **node)
    proc = play(ansible_env, extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    config = json.loads((tmp_path / "host/etc/gpufleet/worker-recycle.json").read_text())
    assert config["balancer"]["method"] == "agent" and config["balancer"]["decider"] == decider


@pytest.mark.parametrize(
    "override,message",
    [
        (
            {"worker_recycle_balancer_method": "runtime_api", "worker_recycle_balancer_endpoint": "10.0.0.2:9999"},
            "runtime_api needs worker_recycle_balancer_endpoint tcp://HOST:PORT",
        ),
        ({"worker_recycle_balancer_method": "command"}, "command needs worker_recycle_drain_command"),
        ({"worker_recycle_agent_request_file": "run/req.json"}, "agent needs worker_recycle_agent_request_file"),
        ({"worker_recycle_min_samples": 8, "worker_recycle_window": 4}, "min_samples (8) <= window (4)"),
    ],
)
def test_preflight_refuses_bad_settings(ansible_env, tmp_path, override, message):
    proc = play(ansible_env, variables(tmp_path, **override))
    assert proc.returncode == 2 and message in proc.stdout, proc.stdout
    assert not (tmp_path / "host").exists()


# --- tasks_from cycle: the drain wait (tasks/drain_wait.yml), against a fake server's /metrics ------

VLLM_METRICS = (
    'vllm:num_requests_running{{engine="0"}} {running}\n'
    'vllm:num_requests_waiting{{engine="0"}} 0.0\n'
    'vllm:kv_cache_usage_perc{{engine="0"}} 0.1\n'
)
DRAIN_STEP = "Stop before the restart when the drain is not confirmed"


def test_cycle_drain_wait_never_reads_a_failed_scrape_as_no_request_running(ansible_env, tmp_path):
    """One run, one host per class of /metrics answer: only a count of zero lets the restart go on;
    a scrape that fails waits on (every attempt of the drain timeout is made) and the host stops
    before the restart, saying why."""
    from tests.harness.http import FakeHTTP

    routes = {
        "/idle/metrics": VLLM_METRICS.format(running="0.0"),
        "/busy/metrics": VLLM_METRICS.format(running="3.0"),
        "/error/metrics": (503, VLLM_METRICS.format(running="0.0")),
        "/nogauge/metrics": "process_resident_memory_bytes 1.0e9\n",
        "/garbage/metrics": "<html>502 Bad Gateway</html>{",
    }
    with FakeHTTP(routes) as srv:
        hosts = {name.split("/")[1]: {"worker_recycle_metrics_url": srv.url + name} for name in routes}
        hosts["refused"] = {"worker_recycle_metrics_url": "http://127.0.0.1:9/metrics"}
        for host in hosts.values():
            host.update(ansible_connection="local", ansible_python_interpreter=sys.executable)
        playbook, inventory = one_role_playbook(tmp_path, hosts, "worker_recycle", "drain_wait")
        run = run_playbook(
            playbook,
            "--forks",
            "10",
            inventory=inventory,
            extra_vars={"worker_recycle_drain_timeout": 2},  # two attempts, 2 s apart
            env=ansible_env,
            json_callback=True,
            timeout=300,
        )
        asked = {name.split("/")[1]: srv.requests.count(name) for name in routes}
    results = task_results(run, DRAIN_STEP)
    assert set(results) == set(hosts), run.explain()
    assert not results["idle"].get("failed") and asked["idle"] == 1, (results["idle"], asked)
    why = {
        "busy": "3.0 request(s) still running",
        "error": "HTTP 503",
        "nogauge": "the server does not export vllm:kv_cache_usage_perc, vllm:num_requests_running,",
        "garbage": "not Prometheus text exposition",
        "refused": "cannot scrape http://127.0.0.1:9/metrics",
    }
    for name, reason in why.items():
        res = results[name]
        assert res.get("failed"), (name, res)
        assert res["msg"].startswith("vllm.service is not restarted: the drain was not confirmed within 2 s ("), res
        assert reason in res["msg"] and "2 scrape(s)" in res["msg"] and "the node stays drained" in res["msg"], res[
            "msg"
        ]
        assert name == "refused" or asked[name] == 2, (name, asked)  # it waited the whole drain timeout
