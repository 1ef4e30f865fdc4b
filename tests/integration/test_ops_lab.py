# SPDX-License-Identifier: GPL-3.0-or-later
"""Operations on a one-node lab: the worker recycling timer (no recycle while RSS is flat; drain,
restart, health, return when it grows), the controller-driven cycle, and the load test playbook.

The node drains itself through HAProxy's runtime API over TCP (worker_recycle_balancer_method
runtime_api, as a `stats socket ipv4@LB:PORT level admin` listener serves it). The lab's HAProxy
has only its admin UNIX socket on the host, so this test relays a TCP port on the node's gateway
address to that socket, byte for byte, and records the commands that pass.

Runs on the spare node of the session's lab (tests/conftest.py's `session_lab`, shared with tests/lab
and tests/fleet), through an inventory of that node only; the module's fixture serves it first
(ops_recycle.yml), whatever ran there before, and takes it out of the pool at the end.
Needs root and the lab's packages; skipped otherwise.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests import support

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "tests" / "integration" / "playbooks"

_MISSING = support.lab_prerequisites(prometheus=True)
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"lab prerequisites: {_MISSING}")


class Relay:
    """TCP on the node's gateway -> the lab HAProxy's admin UNIX socket; records each command."""

    def __init__(self, host, target):
        self.target = target
        self.commands = []
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind((host, 0))
        self.server.listen(8)
        self.endpoint = "tcp://%s:%d" % (host, self.server.getsockname()[1])
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _addr = self.server.accept()
            except OSError:
                return
            with conn:
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                self.commands.append(data.decode().strip())
                with socket.socket(socket.AF_UNIX) as up:
                    up.connect(self.target)
                    up.sendall(data)
                    while True:
                        chunk = up.recv(65536)
                        if not chunk:
                            break
                        conn.sendall(chunk)

    def close(self):
        self.server.close()


RECYCLE_VARS = {
    "worker_recycle_interval": "1s",
    "worker_recycle_boot_delay": "1s",
    "worker_recycle_window": 8,
    # six samples before judging: enough TTFT histograms for the p95 trend even on a loaded machine
    "worker_recycle_min_samples": 6,
    "worker_recycle_rss_slope_mib_per_min": 300,
    "worker_recycle_drain_timeout": 10,
    "worker_recycle_health_timeout": 60,
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
    relay = Relay(spec["gateway"], str(fleet.balancer().socket))
    ctx = {
        "fleet": fleet,
        "session": session_lab,
        "node": node,
        "spec": spec,
        "relay": relay,
        "inventory": inventory,
        "url": "http://%s:8000" % spec["address"],
    }
    try:
        # whatever an earlier test left on the spare node: no leak drop-in, no earlier agent state
        ssh(
            ctx,
            "rm -f /etc/systemd/system/vllm.service.d/50-lab-decay.conf "
            "/run/gpufleet/worker-recycle.json /var/lib/gpufleet/worker-recycle/state.json; "
            "systemctl daemon-reload",
        )
        extra = dict(RECYCLE_VARS, worker_recycle_balancer_endpoint=relay.endpoint)
        ctx["serve"] = playbook(ctx, None, PLAYBOOKS / "ops_recycle.yml", extra)
        yield ctx
    finally:
        relay.close()
        api = fleet.balancer()
        if pool_state(ctx) is not None:  # out of the pool: the lab's other tests judge it without
            api.command(f"set server vllm_pool/{node} state maint")
            api.command(f"del server vllm_pool/{node}")


def ssh(lab, command, check=True, timeout=60):
    return lab["session"].ssh(lab["node"], command, check=check, timeout=timeout)


def playbook(lab, ansible_env, path, extra=None, *args):
    return support.run_playbook(path, *args, inventory=lab["inventory"], extra_vars=extra, env=ansible_env, timeout=300)


def recap(proc):
    return proc.host()


def main_pid(lab):
    return int(ssh(lab, "systemctl show -p MainPID --value vllm.service").strip())


def pool_state(lab):
    """The node's (srv_admin_state, srv_op_state) in the lab's pool, or None."""
    text = lab["fleet"].balancer().command("show servers state vllm_pool")
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 7 and fields[3] == lab["node"]:
            return int(fields[6]), int(fields[5])
    return None


def agent_status(lab):
    out = ssh(lab, "cat /run/gpufleet/worker-recycle.json 2>/dev/null || true")
    return json.loads(out) if out.strip() else {}


class Traffic:
    """A client sending small streaming completions to the node, so TTFT is measured between samples."""

    def __init__(self, url):
        self.url = url
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        body = json.dumps({"prompt": list(range(1000, 1256)), "max_tokens": 2, "stream": True}).encode()
        while not self.stop.is_set():
            try:
                req = urllib.request.Request(self.url + "/v1/completions", body, {"Content-Type": "application/json"})
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
        "method": "runtime_api",
        "endpoint": lab["relay"].endpoint,
        "backend": "vllm_pool",
        "server": lab["node"],
        "drain_command": [],
        "return_command": [],
    }
    assert pool_state(lab)[0] == 0  # in the pool, admin state ready
    # idempotence and check mode: tests/integration/test_ops_role.py


def test_no_recycle_while_rss_is_flat(lab):
    pid = main_pid(lab)
    with Traffic(lab["url"]) as traffic:
        start = time.time()
        # a window of samples taken while the traffic flows (the timer fires every 1-2 s)
        status = wait_for(
            lambda: (lambda s: s if s.get("samples", 0) >= 5 and s["time"] > start + 8 else None)(agent_status(lab)), 40
        )
    assert status, agent_status(lab)
    assert status["classification"] == "steady" and status["recycle"] is False, status
    assert abs(status["rss_slope_mib_per_min"]) < 300 and status["recycles"] == 0
    assert traffic.sent > 10 and status["ttft_p95_seconds"] is not None
    assert main_pid(lab) == pid and lab["relay"].commands == []
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
    try:
        with Traffic(lab["url"]):
            status = wait_for(lambda: (lambda s: s if s.get("recycles", 0) >= 1 else None)(agent_status(lab)), 60)
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
    assert lab["relay"].commands == [
        f"set server vllm_pool/{lab['node']} state drain",
        f"set server vllm_pool/{lab['node']} state ready",
    ]
    order = [
        journal.index(s)
        for s in ("worker-recycle: fragmentation", "state drain", "recycle: restarting", "state ready", "recycle: done")
    ]
    assert order == sorted(order), journal
    assert main_pid(lab) not in (0, leaking)
    assert pool_state(lab)[0] == 0  # back in the pool and ready
    metrics = ssh(lab, "cat /var/lib/node_exporter/textfile_collector/gpufleet_worker_recycle.prom")
    assert "gpufleet_worker_recycles_total 1.0" in metrics
    assert 'gpufleet_worker_last_recycle_kind{kind="fragmentation"} 1.0' in metrics


def test_controller_driven_cycle(lab, ansible_env):
    pid = main_pid(lab)
    proc = playbook(lab, ansible_env, PLAYBOOKS / "ops_cycle.yml", RECYCLE_VARS)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    assert main_pid(lab) not in (0, pid)
    assert pool_state(lab)[0] == 0
    assert recap(proc)["changed"] >= 3  # drained, restarted, returned
    assert "Drain the node in the balancer" in proc.stdout and "Return the node to the pool" in proc.stdout


def test_load_test_playbook_against_the_node(lab, ansible_env, tmp_path):
    proc = playbook(
        lab,
        ansible_env,
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
        ansible_env,
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


def test_load_test_refuses_a_host_outside_the_inventory(lab, ansible_env):
    proc = playbook(
        lab,
        ansible_env,
        REPO / "playbooks" / "load_test.yml",
        {"load_test_url": "http://10.99.99.99:8000", "load_test_duration": 1},
    )
    assert proc.returncode == 2
    assert "refusing to send load to 10.99.99.99: it is not a host of the inventory" in proc.stdout
