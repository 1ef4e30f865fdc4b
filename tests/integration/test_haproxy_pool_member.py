# SPDX-License-Identifier: GPL-3.0-or-later
"""haproxy_pool_member against a real HAProxy on loopback (runtime API + config file)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.lb._haproxy import RuntimeAPI
from tests.harness.http import FakeHTTP
from tests.harness.playbook import run_playbook

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
            os.kill(pid, signal.SIGTERM)
            for _ in range(50):
                os.kill(pid, 0)
                time.sleep(0.1)
        except ProcessLookupError:
            pass
        self.pidfile.unlink(missing_ok=True)

    def servers(self):
        return RuntimeAPI(self.sock).servers("vllm_pool")


def member(lb, **kw):
    return dict(
        {
            "socket": lb.sock,
            "backend": "vllm_pool",
            "name": "node1",
            "address": "127.0.0.1",
            "port": 18001,
            "config_file": str(lb.cfg),
        },
        **kw,
    )


def test_add_is_idempotent_persisted_and_survives_a_restart(balancer, run_module):
    check = run_module("haproxy_pool_member", member(balancer), check_mode=True, diff=True)
    assert check["changed"] and check["after"]["state"] == "ready"
    assert balancer.servers() == {} and "server node1" not in balancer.cfg.read_text()

    res = run_module("haproxy_pool_member", member(balancer))
    assert res["changed"] and res["config_changed"]
    assert res["commands"] == [
        "add server vllm_pool/node1 127.0.0.1:18001 check",
        "enable health vllm_pool/node1",
        "set server vllm_pool/node1 state ready",
    ]
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


def test_a_drain_before_the_port_is_known_keeps_the_servers_port(balancer, run_module):
    """keep_port: a run that failed before its serving role published the server's port drains the
    server on the port it has (in the runtime and the config file); a server not yet in the
    backend is added drained on the port given."""
    run_module("haproxy_pool_member", member(balancer, port=18009))
    res = run_module("haproxy_pool_member", member(balancer, state="drained", port=8000, keep_port=True), diff=True)
    assert res["changed"] and res["commands"] == ["set server vllm_pool/node1 state drain"], res
    assert balancer.servers()["node1"]["port"] == 18009 and res["after"]["port"] == 18009
    assert "server node1 127.0.0.1:18009 " in balancer.cfg.read_text()
    assert not run_module("haproxy_pool_member", member(balancer, state="drained", port=8000, keep_port=True))[
        "changed"
    ]
    # without keep_port the port given is the port
    res = run_module("haproxy_pool_member", member(balancer, state="drained", port=8000))
    assert res.get("changed") and balancer.servers()["node1"]["port"] == 8000, {
        k: v for k, v in res.items() if k not in ("before", "after")
    }
    res = run_module("haproxy_pool_member", member(balancer, name="node2", state="drained", port=8000, keep_port=True))
    assert res["changed"] and balancer.servers()["node2"] == dict(balancer.servers()["node2"], port=8000, state="drain")


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


def _op_state(lb, want, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        state = lb.servers()["node1"]["op_state"]
        if state == want or time.monotonic() > deadline:
            return state
        time.sleep(0.2)


def test_the_agent_decides_whether_a_member_takes_traffic(balancer, run_module):
    agent, health = Agent(), FakeHTTP({"/health": ""})
    args = member(balancer, port=health.port, agent_port=agent.port, agent_interval="500ms")
    res = run_module("haproxy_pool_member", args)
    assert res["commands"] == [
        f"add server vllm_pool/node1 127.0.0.1:{health.port} check agent-check agent-addr 127.0.0.1 "
        f"agent-port {agent.port} agent-inter 500ms",
        "enable health vllm_pool/node1",
        "enable agent vllm_pool/node1",
        "set server vllm_pool/node1 state ready",
    ]
    assert (
        f"server node1 127.0.0.1:{health.port} check agent-check agent-addr 127.0.0.1 agent-port {agent.port}"
        in balancer.cfg.read_text()
    )
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
    agent, other, health = Agent(), Agent(), FakeHTTP({"/health": ""})
    run_module("haproxy_pool_member", member(balancer, port=health.port))
    res = run_module("haproxy_pool_member", member(balancer, port=health.port, agent_port=agent.port))
    assert res["commands"][:2] == ["set server vllm_pool/node1 state maint", "del server vllm_pool/node1"]
    assert balancer.servers()["node1"]["agent_port"] == agent.port
    res = run_module("haproxy_pool_member", member(balancer, port=health.port, agent_port=other.port), diff=True)
    assert res["commands"] == [f"set server vllm_pool/node1 agent-port {other.port}"]
    assert balancer.servers()["node1"]["agent_port"] == other.port
    other.answer = "up\n"
    assert _op_state(balancer, "running") == "running"


# --- values that would become commands or config lines are refused first --------------------------


def _untouched(lb, text_before):
    """Nothing reached HAProxy or the file: no server, the frontend still open, the file as it was,
    no temporary file left beside it."""
    assert lb.servers() == {}
    frontend = RuntimeAPI(lb.sock).command("show stat vllm -1 -1").splitlines()[1].split(",")
    assert frontend[:2] == ["vllm", "FRONTEND"] and frontend[17] == "OPEN"
    assert lb.cfg.read_text() == text_before
    assert sorted(p.name for p in lb.dir.iterdir()) == ["admin.sock", "haproxy.cfg", "haproxy.pid"]


@pytest.mark.parametrize(
    "key,value",
    [
        ("address", "127.0.0.1;disable frontend vllm"),
        ("address", "127.0.0.1\ndisable frontend vllm"),
        ("agent_address", "127.0.0.1;disable frontend vllm"),
        ("address", "127.0.0.1:80 backup"),
    ],
)
def test_runtime_api_address_injection_refused(balancer, run_module, key, value):
    before = balancer.cfg.read_text()
    res = run_module("haproxy_pool_member", member(balancer, agent_port=9777, **{key: value}))
    assert res["failed"] and res["msg"].startswith(f"nothing changed: invalid {key} ") and res["commands"] == []
    assert "give an IP address or a host name" in res["msg"]
    _untouched(balancer, before)


@pytest.mark.parametrize("value", ["2s;disable frontend vllm", "2s\nfrontend evil", "2s agent-send x", "fast"])
def test_agent_interval_injection_refused(balancer, run_module, value):
    before = balancer.cfg.read_text()
    res = run_module("haproxy_pool_member", member(balancer, agent_port=9777, agent_interval=value))
    assert res["failed"] and res["msg"].startswith("nothing changed: invalid agent_interval ")
    assert "HAProxy time" in res["msg"]
    _untouched(balancer, before)


@pytest.mark.parametrize(
    "key,value,why",
    [
        ("name", "node1\nlisten evil", "invalid server name"),
        ("backend", "vllm_pool\nlisten evil", "invalid backend name"),
        ("address", "127.0.0.1\nlisten evil\n    bind 127.0.0.1:1", "invalid address"),
    ],
)
def test_config_newline_injection_refused(balancer, run_module, key, value, why):
    before = balancer.cfg.read_text()
    res = run_module("haproxy_pool_member", member(balancer, **{key: value}))
    assert res["failed"] and why in res["msg"] and res["config_changed"] is False
    _untouched(balancer, before)


def test_invalid_config_is_not_installed(balancer, run_module):
    """A configuration file HAProxy would refuse at its next start (here: an unknown keyword that
    someone left in it) is not replaced, and the running pool is not touched either."""
    broken = balancer.cfg.read_text().replace("    stats enable\n", "    stats enable\n    bogus-keyword on\n")
    balancer.cfg.write_text(broken)
    balancer.cfg.chmod(0o640)
    res = run_module("haproxy_pool_member", member(balancer))
    assert res["failed"] and res["msg"].startswith("nothing changed: HAProxy refuses the configuration")
    assert "bogus-keyword" in res["msg"] and res["rc"] != 0 and res["commands"] == []
    _untouched(balancer, broken)
    # a good file is checked the same way and installed, keeping its mode
    balancer.cfg.write_text(broken.replace("    bogus-keyword on\n", ""))
    assert run_module("haproxy_pool_member", member(balancer))["config_changed"]
    assert "server node1 127.0.0.1:18001 check" in balancer.cfg.read_text()
    assert oct(balancer.cfg.stat().st_mode & 0o777) == "0o640"


# --- registration is HAProxy's own view -----------------------------------------------------------


def test_unreachable_server_is_not_registered(balancer, run_module):
    """Healthy from itself, unreachable from the balancer: HAProxy never reports it UP, so the
    module drains it, leaves the config file alone and fails with what HAProxy saw."""
    before = balancer.cfg.read_text()
    agent = Agent()
    agent.answer = "up\n"
    closed = free_port()  # nobody listens there: the health check is refused
    res = run_module(
        "haproxy_pool_member",
        member(balancer, port=closed, agent_port=agent.port, agent_interval="500ms", up_timeout=4),
    )
    assert res["failed"] and res["msg"].startswith("HAProxy does not report vllm_pool/node1 UP after 4s")
    assert "health check L4CON (Layer4 connection problem, Connection refused)" in res["msg"], res["msg"]
    assert "it is drained" in res["msg"] and res["balancer_view"]["status"].startswith("DOWN")
    assert res["balancer_view"]["agent_status"] == "L7OK"
    assert res["commands"][-1] == "set server vllm_pool/node1 state drain"
    assert balancer.servers()["node1"]["state"] == "drain" and res["after"]["state"] == "drain"
    assert balancer.cfg.read_text() == before and not res["config_changed"]


def test_a_reachable_server_is_registered_once_haproxy_says_up(balancer, run_module):
    agent, health = Agent(), FakeHTTP({"/health": ""})
    agent.answer = "up\n"
    res = run_module(
        "haproxy_pool_member",
        member(balancer, port=health.port, agent_port=agent.port, agent_interval="500ms", up_timeout=30),
    )
    assert not res.get("failed"), res
    assert res["balancer_view"]["status"] == "UP" and res["balancer_view"]["check_status"] == "L7OK"
    assert res["config_changed"] and f"server node1 127.0.0.1:{health.port}" in balancer.cfg.read_text()
    # the agent says the node may not take traffic: not registered either, whatever /health says
    agent.answer = "down #no marker of this boot\n"
    assert _op_state(balancer, "stopped", timeout=30) == "stopped"
    res = run_module(
        "haproxy_pool_member",
        member(balancer, port=health.port, agent_port=agent.port, agent_interval="500ms", up_timeout=2),
    )
    assert res["failed"] and "agent check" in res["msg"] and "no marker of this boot" in res["msg"], res["msg"]
    health.close()


def test_role_does_not_declare_an_unreachable_node_registered(balancer, ansible_env, tmp_path):
    """lb_registration's register step, on localhost as the balancer: the wait is bounded by
    lb_registration_up_timeout and not multiplied by the retries meant for an unreachable balancer."""
    playbook = tmp_path / "register.yml"
    playbook.write_text(
        "- hosts: node7\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.include_role:\n        name: gpufleet.node.lb_registration\n"
        "        tasks_from: register\n"
    )
    extra = {
        "ansible_python_interpreter": os.sys.executable,
        "lb_registration_balancer": "localhost",
        "lb_registration_socket": balancer.sock,
        "lb_registration_config_file": str(balancer.cfg),
        "lb_registration_address": "127.0.0.1",
        "lb_registration_port": free_port(),
        "lb_registration_agent_port": 0,
        "lb_registration_up_timeout": 3,
        "lb_registration_retries": 3,
        "lb_registration_delay": 1,
        "__lb_registration_reasons": [],
    }
    before = balancer.cfg.read_text()
    run = run_playbook(playbook, inventory="node7,", local=True, extra_vars=extra, env=ansible_env, timeout=120)
    assert run.returncode == 2 and run.host("node7")["failed"] == 1, run.explain()
    assert "HAProxy does not report vllm_pool/node7 UP after 3s" in run.stdout and "L4CON" in run.stdout
    assert "RETRYING" not in run.stdout, run.explain()
    assert balancer.servers()["node7"]["state"] == "drain" and balancer.cfg.read_text() == before
