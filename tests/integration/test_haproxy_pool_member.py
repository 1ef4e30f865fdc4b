# SPDX-License-Identifier: GPL-3.0-or-later
"""haproxy_pool_member against a real HAProxy on loopback (runtime API + config file)."""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils._haproxy import RuntimeAPI

pytestmark = pytest.mark.skipif(not shutil.which("haproxy"), reason="haproxy is not installed")

CONFIG = """\
global
    stats socket {sock} mode 600 level admin
    pidfile {pid}

defaults
    mode http
    timeout connect 2s
    timeout client 10s
    timeout server 10s

frontend vllm
    bind 127.0.0.1:{port}
    default_backend vllm_pool

backend vllm_pool
    balance leastconn
    option httpchk GET /health
    default-server inter 2s fall 2 rise 1

listen stats
    bind 127.0.0.1:{stats}
    stats enable
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Balancer:
    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.sock = str(tmp_path / "admin.sock")
        self.cfg = tmp_path / "haproxy.cfg"
        self.pidfile = tmp_path / "haproxy.pid"
        self.cfg.write_text(CONFIG.format(sock=self.sock, pid=self.pidfile, port=free_port(), stats=free_port()))

    def start(self):
        subprocess.run(["haproxy", "-D", "-f", str(self.cfg)], check=True, stdin=subprocess.DEVNULL)
        for _ in range(50):
            try:
                RuntimeAPI(self.sock).command("show version")
                return
            except Exception:
                time.sleep(0.1)
        raise RuntimeError("haproxy did not open its socket")

    def stop(self):
        try:
            pid = int(self.pidfile.read_text().split()[0])
        except (FileNotFoundError, ValueError):
            return
        try:
            import os
            os.kill(pid, signal.SIGTERM)
            for _ in range(50):
                os.kill(pid, 0)
                time.sleep(0.1)
        except ProcessLookupError:
            pass
        self.pidfile.unlink(missing_ok=True)

    def servers(self):
        return RuntimeAPI(self.sock).servers("vllm_pool")


@pytest.fixture
def balancer(tmp_path):
    lb = Balancer(tmp_path)
    lb.start()
    yield lb
    lb.stop()


def member(lb, **kw):
    return dict({"socket": lb.sock, "backend": "vllm_pool", "name": "node1", "address": "127.0.0.1",
                 "port": 18001, "config_file": str(lb.cfg)}, **kw)


def test_add_is_idempotent_persisted_and_survives_a_restart(balancer, run_module):
    check = run_module("haproxy_pool_member", member(balancer), check_mode=True, diff=True)
    assert check["changed"] and check["after"]["state"] == "ready"
    assert balancer.servers() == {} and "server node1" not in balancer.cfg.read_text()

    res = run_module("haproxy_pool_member", member(balancer))
    assert res["changed"] and res["config_changed"]
    assert res["commands"] == ["add server vllm_pool/node1 127.0.0.1:18001 check",
                               "enable health vllm_pool/node1", "set server vllm_pool/node1 state ready"]
    assert balancer.servers()["node1"]["state"] == "ready"
    text = balancer.cfg.read_text()
    assert "    server node1 127.0.0.1:18001 check\n\nlisten stats" in text

    again = run_module("haproxy_pool_member", member(balancer))
    assert not again["changed"] and again["commands"] == []

    balancer.stop()
    balancer.start()
    assert balancer.servers()["node1"]["address"] == "127.0.0.1"
    assert not run_module("haproxy_pool_member", member(balancer))["changed"]


def test_drain_then_remove(balancer, run_module):
    run_module("haproxy_pool_member", member(balancer))
    res = run_module("haproxy_pool_member", member(balancer, state="drained"))
    assert res["changed"] and balancer.servers()["node1"]["state"] == "drain"
    res = run_module("haproxy_pool_member", member(balancer, state="absent"), diff=True)
    assert res["changed"] and res["after"] is None
    assert res["commands"] == ["set server vllm_pool/node1 state maint", "del server vllm_pool/node1"]
    assert "node1" not in balancer.servers() and "server node1" not in balancer.cfg.read_text()
    assert not run_module("haproxy_pool_member", member(balancer, state="absent"))["changed"]


def test_balancer_down_changes_nothing(balancer, run_module):
    before = balancer.cfg.read_text()
    balancer.stop()
    res = run_module("haproxy_pool_member", member(balancer))
    assert res["failed"] and res["msg"].startswith("nothing changed: cannot talk to HAProxy's runtime API")
    assert balancer.cfg.read_text() == before


def test_unknown_backend_and_bad_names(balancer, run_module):
    res = run_module("haproxy_pool_member", member(balancer, backend="nope"))
    assert res["failed"] and "no backend 'nope'" in res["msg"]
    res = run_module("haproxy_pool_member", member(balancer, name="node 1; shutdown"))
    assert res["failed"] and "invalid server name" in res["msg"]
    assert balancer.servers() == {}


class Agent:
    """A node's HAProxy agent on loopback: answers every connection with `self.answer`."""

    def __init__(self):
        import threading
        self.answer = "down #no marker\n"  # the space before # is required
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(self.answer.encode())


class Health:
    """What HAProxy's httpchk asks: GET /health, always 200."""

    def __init__(self):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _op_state(lb, want, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        state = lb.servers()["node1"]["op_state"]
        if state == want or time.monotonic() > deadline:
            return state
        time.sleep(0.2)


def test_the_agent_decides_whether_a_member_takes_traffic(balancer, run_module):
    agent, health = Agent(), Health()
    args = member(balancer, port=health.port, agent_port=agent.port, agent_interval="500ms")
    res = run_module("haproxy_pool_member", args)
    assert res["commands"] == [
        f"add server vllm_pool/node1 127.0.0.1:{health.port} check agent-check agent-addr 127.0.0.1 "
        f"agent-port {agent.port} agent-inter 500ms",
        "enable health vllm_pool/node1", "enable agent vllm_pool/node1", "set server vllm_pool/node1 state ready"]
    assert (f"server node1 127.0.0.1:{health.port} check agent-check agent-addr 127.0.0.1 agent-port {agent.port}"
            in balancer.cfg.read_text())
    # healthy server, but the agent says the node has no gate marker: no traffic
    assert _op_state(balancer, "stopped") == "stopped"
    agent.answer = "up\n"
    assert _op_state(balancer, "running") == "running"
    agent.answer = "down #the gate marker is from another boot\n"
    assert _op_state(balancer, "stopped") == "stopped"
    assert balancer.servers()["node1"]["state"] == "ready"  # the agent never touches the admin state
    assert not run_module("haproxy_pool_member", args)["changed"]

    # a config file line with the agent keywords is accepted by HAProxy at restart
    balancer.stop()
    balancer.start()
    assert balancer.servers()["node1"]["agent_port"] == agent.port


def test_agent_port_moves_at_runtime_and_an_agent_is_added_by_replacing(balancer, run_module):
    agent, other, health = Agent(), Agent(), Health()
    run_module("haproxy_pool_member", member(balancer, port=health.port))
    res = run_module("haproxy_pool_member", member(balancer, port=health.port, agent_port=agent.port))
    assert res["commands"][:2] == ["set server vllm_pool/node1 state maint", "del server vllm_pool/node1"]
    assert balancer.servers()["node1"]["agent_port"] == agent.port
    res = run_module("haproxy_pool_member", member(balancer, port=health.port, agent_port=other.port), diff=True)
    assert res["commands"] == [f"set server vllm_pool/node1 agent-port {other.port}"]
    assert balancer.servers()["node1"]["agent_port"] == other.port
    other.answer = "up\n"
    assert _op_state(balancer, "running") == "running"
