# SPDX-License-Identifier: GPL-3.0-or-later
"""Operations on a one-node lab: the worker recycling timer (no recycle while RSS is flat; drain,
restart, health, return when it grows), the controller-driven cycle, and the load test playbook.

The node drains itself the default way (worker_recycle_balancer_method agent): it asks its own
HAProxy agent (lb_registration's, installed by ops_recycle.yml with a passing gate marker of this
boot written by the fixture) to report `drain`, and the lab's HAProxy follows the agent; nothing on
the node talks to the balancer.

Runs on the spare node of the session's lab (tests/conftest.py's `session_lab`, shared with tests/lab
and tests/fleet), through an inventory of that node only; the module's fixture serves it first
(ops_recycle.yml), whatever ran there before, and takes it out of the pool at the end.
Needs root and the lab's packages; skipped otherwise.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from lab import haproxy
from tests.harness.lab import lab_prerequisites

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "tests" / "integration" / "playbooks"
MARKER = "/run/gpufleet/nccl-gate.json"
REQUEST = "/run/gpufleet/lb-agent-request.json"  # the node's own drain/ready request to its agent
DRAIN = 0x08  # HAProxy's SRV_ADMF_FDRAIN in srv_admin_state (what the agent's `drain` sets)

_MISSING = lab_prerequisites(prometheus=True)
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"lab prerequisites: {_MISSING}")


RECYCLE_VARS = {
    "worker_recycle_interval": "1s",
    "worker_recycle_boot_delay": "1s",
    "worker_recycle_window": 8,
    # six samples before judging: enough TTFT histograms for the p95 trend even on a loaded machine
    "worker_recycle_min_samples": 6,
    "worker_recycle_rss_slope_mib_per_min": 300,
    "worker_recycle_drain_timeout": 10,
    "worker_recycle_health_timeout": 60,
    # the agent is asked every second (ops_recycle.yml): two checks per request
    "worker_recycle_agent_settle": 2.5,
    # the lab's nodes share the host's Debian packages (python3-prometheus-client is checked above);
    # the package task costs 7 s per run for nothing here
    "worker_recycle_install_packages": False,
}


@pytest.fixture(scope="module")
def lab(session_lab):
    """The spare node served by ops_recycle.yml (vLLM stand-in, in the pool, recycle timer)."""
    node = session_lab.spare
    fleet = session_lab.fleet
    spec = session_lab.spec(node)
    inventory = session_lab.inventory([node], "ops")
    ctx = {
        "fleet": fleet,
        "session": session_lab,
        "node": node,
        "spec": spec,
        "inventory": inventory,
        "url": "http://%s:8000" % spec["address"],
        # the lab's inventory carries a vaulted vllm_server_api_key: /v1 needs it
        "api_key": session_lab.secrets["vllm_server_api_key"],
    }
    try:
        # whatever an earlier test left on the spare node: no leak drop-in, no earlier agent state;
        # a passing gate marker of this boot, so that its HAProxy agent says up (the gate itself
        # is the fleet tests' business)
        ssh(
            ctx,
            "rm -f /etc/systemd/system/vllm.service.d/50-lab-decay.conf "
            f"/run/gpufleet/worker-recycle.json /var/lib/gpufleet/worker-recycle/state.json {REQUEST}; "
            'systemctl daemon-reload; mkdir -p /run/gpufleet && printf \'{"boot_id": "%s", "passed": true}\' '
            f"$(cat /proc/sys/kernel/random/boot_id) > {MARKER}",
        )
        ctx["serve"] = playbook(ctx, PLAYBOOKS / "ops_recycle.yml", RECYCLE_VARS)
        yield ctx
    finally:
        ssh(ctx, f"systemctl disable --now --quiet gpufleet-lb-agent.socket; rm -f {MARKER} {REQUEST}", check=False)
        api = fleet.balancer()
        if pool_state(ctx) is not None:  # out of the pool: the lab's other tests judge it without
            api.command(f"set server vllm_pool/{node} state maint")
            api.command(f"del server vllm_pool/{node}")


def ssh(lab, command, check=True, timeout=60):
    return lab["session"].ssh(lab["node"], command, check=check, timeout=timeout)


def playbook(lab, path, extra=None, *args):
    """A run on the node's inventory with the lab's vault password, in the session's summary beside
    the fleet's runs."""
    return lab["session"].playbook(
        path,
        *args,
        inventory=lab["inventory"],
        extra_vars=extra,
        timeout=300,
        label=f"{Path(path).name} on {lab['node']} (ops tests, an inventory of that node)",
    )


def recap(proc):
    return proc.host()


def main_pid(lab):
    return int(ssh(lab, "systemctl show -p MainPID --value vllm.service").strip())


def pool_state(lab):
    """The node's (srv_admin_state flags, operational state) in the lab's pool, or None."""
    server = haproxy.pool(lab["session"].balancer["runtime_socket"], "vllm_pool").get(lab["node"])
    return None if server is None else (server["admin_state"], server["op_state"])


def agent_status(lab):
    out = ssh(lab, "cat /run/gpufleet/worker-recycle.json 2>/dev/null || true")
    return json.loads(out) if out.strip() else {}


class Traffic:
    """A client sending small streaming completions to the node, so TTFT is measured between samples."""

    def __init__(self, url, api_key):
        self.url = url
        self.headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        body = json.dumps({"prompt": list(range(1000, 1256)), "max_tokens": 2, "stream": True}).encode()
        while not self.stop.is_set():
            try:
                req = urllib.request.Request(self.url + "/v1/completions", body, self.headers)
                with urllib.request.urlopen(req, timeout=10) as resp:
                    resp.read()
                self.sent += 1
            except OSError:
                pass
            self.stop.wait(0.15)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(15)


def healthy(url):
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def wait_for(predicate, timeout, step=0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


def test_serving_node_with_recycle_timer(lab):
    proc = lab["serve"]
    assert proc.returncode == 0, proc.explain(4000)
    print(f"\nops_recycle.yml: {proc.seconds:.1f} s")
    assert ssh(lab, "systemctl is-active gpufleet-worker-recycle.timer").strip() == "active"
    assert ssh(lab, "systemctl show -p MemorySwapMax --value vllm.service").strip() == "0"
    config = json.loads(ssh(lab, "cat /etc/gpufleet/worker-recycle.json"))
    assert config["balancer"] == {
        "method": "agent",
        "endpoint": "",
        "backend": "vllm_pool",
        "server": lab["node"],
        "drain_command": [],
        "return_command": [],
        "request_file": REQUEST,
        "settle": 2.5,
        "ready_hold": 20.0,
        "decider": None,  # the session lab's balancer runs no pool decider (gpufleet_pool_budget off)
    }
    assert pool_state(lab) == (0, "running")  # in the pool, admin state ready, UP through health and agent
    # idempotence and check mode: tests/integration/test_ops_role.py


def test_no_recycle_while_rss_is_flat(lab):
    pid = main_pid(lab)
    with Traffic(lab["url"], lab["api_key"]) as traffic:
        start = time.time()
        # a window of samples taken while the traffic flows (the timer fires every 1-2 s)
        status = wait_for(
            lambda: (lambda s: s if s.get("samples", 0) >= 5 and s["time"] > start + 8 else None)(agent_status(lab)), 40
        )
    assert status, agent_status(lab)
    assert status["classification"] == "steady" and status["recycle"] is False, status
    assert abs(status["rss_slope_mib_per_min"]) < 300 and status["recycles"] == 0
    assert traffic.sent > 10 and status["ttft_p95_seconds"] is not None
    assert main_pid(lab) == pid
    assert ssh(lab, f"test -e {REQUEST} || echo none").strip() == "none"  # never asked to drain
    assert pool_state(lab) == (0, "running")
    metrics = ssh(lab, "cat /var/lib/node_exporter/textfile_collector/gpufleet_worker_recycle.prom")
    assert 'gpufleet_worker_decay{kind="steady"} 1.0' in metrics
    assert "gpufleet_worker_recycles_total 0.0" in metrics


def test_steady_rss_growth_with_rising_ttft_is_recycled(lab):
    # the stand-in leaks 40 MiB/s (2400 MiB/min, the threshold is 300) and its prefill slows with it
    ssh(
        lab,
        "mkdir -p /etc/systemd/system/vllm.service.d && printf '[Service]\\n"
        "Environment=GPUFLEET_LAB_VLLM_RSS_GROWTH_MIB_S=40\\n' "
        "> /etc/systemd/system/vllm.service.d/50-lab-decay.conf && systemctl daemon-reload "
        "&& systemctl restart vllm.service",
    )
    assert wait_for(lambda: healthy(lab["url"]), 30)
    leaking = main_pid(lab)
    admin_states = set()  # what the balancer made of the agent's answers during the recycle

    def recycled():
        state = pool_state(lab)
        admin_states.add(state and state[0])
        status = agent_status(lab)
        return status if status.get("recycles", 0) >= 1 else None

    try:
        with Traffic(lab["url"], lab["api_key"]):
            status = wait_for(recycled, 150, step=0.3)  # a bound for a loaded machine, not a target
    finally:  # no second recycle while the rest of the module runs
        ssh(
            lab,
            "rm -f /etc/systemd/system/vllm.service.d/50-lab-decay.conf && systemctl daemon-reload "
            "&& systemctl stop gpufleet-worker-recycle.timer",
        )
    assert status, ssh(lab, "journalctl -u gpufleet-worker-recycle.service --no-pager | tail -30")
    assert status["recycles"] == 1 and status["last_recycle_kind"] == "fragmentation", status
    journal = ssh(lab, "journalctl -u gpufleet-worker-recycle.service --no-pager -o cat")
    verdict = re.search(
        r"^worker-recycle: fragmentation .*recycle=True rss_mib=\S+ rss_slope_mib_per_min=(\S+) "
        r"samples=\d+ ttft_p95_rise=(\S+)",
        journal,
        re.M,
    )
    assert verdict, journal
    assert float(verdict.group(1)) > 300 and float(verdict.group(2)) > 0.25
    # drained by the balancer on the node's word alone, then back
    assert any(a is not None and a & DRAIN for a in admin_states), admin_states
    order = [
        journal.index(s)
        for s in (
            "worker-recycle: fragmentation",
            "agent to report drain",
            "recycle: restarting",
            "agent to report ready",
            "recycle: done",
        )
    ]
    assert order == sorted(order), journal
    assert main_pid(lab) not in (0, leaking)
    # back in the pool and ready, at HAProxy's next health and agent checks
    assert wait_for(lambda: pool_state(lab) == (0, "running"), 30), pool_state(lab)
    assert json.loads(ssh(lab, f"cat {REQUEST}"))["state"] == "ready"
    metrics = ssh(lab, "cat /var/lib/node_exporter/textfile_collector/gpufleet_worker_recycle.prom")
    assert "gpufleet_worker_recycles_total 1.0" in metrics
    assert 'gpufleet_worker_last_recycle_kind{kind="fragmentation"} 1.0' in metrics


def test_controller_driven_cycle(lab):
    pid = main_pid(lab)
    proc = playbook(lab, PLAYBOOKS / "ops_cycle.yml", RECYCLE_VARS)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    assert main_pid(lab) not in (0, pid)
    assert pool_state(lab)[0] == 0
    assert recap(proc)["changed"] >= 3  # drained, restarted, returned
    assert "Drain the node in the balancer" in proc.stdout and "Return the node to the pool" in proc.stdout


def test_load_test_playbook_against_the_node(lab, tmp_path):
    proc = playbook(
        lab,
        REPO / "playbooks" / "load_test.yml",
        {
            "load_test_concurrency": 4,
            "load_test_duration": 2,
            "load_test_max_tokens": 8,
            "load_test_prompt_lengths": [128, 512, 2048],
            "load_test_max_ttft_p95_seconds": 5,
            "load_test_output_dir": str(tmp_path),
        },
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    assert "TTFT p50 / p95 / p99 (ms)" in proc.stdout and "load test of http://" in proc.stdout
    result = json.loads((tmp_path / f"{lab['node']}.json").read_text())
    assert result["passed"] and result["summary"]["errors"] == 0 and result["summary"]["completed"] >= 4
    assert result["server"]["samples"] >= 2
    # through the balancer's frontend too
    proc = playbook(
        lab,
        REPO / "playbooks" / "load_test.yml",
        {
            "load_test_via_balancer": True,
            "load_test_duration": 1,
            "load_test_concurrency": 2,
            "load_test_max_tokens": 4,
            "load_test_prompt_lengths": [128],
        },
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr


def test_load_test_refuses_a_host_outside_the_inventory(lab):
    proc = playbook(
        lab,
        REPO / "playbooks" / "load_test.yml",
        {"load_test_url": "http://10.99.99.99:8000", "load_test_duration": 1},
    )
    assert proc.returncode == 2
    assert "refusing to send load to 10.99.99.99: it is not a host of the inventory" in proc.stdout
