# SPDX-License-Identifier: GPL-3.0-or-later
"""The one HAProxy runtime-API client (TCP and UNIX), its parsing, the values it refuses, the
config-file edit, and the roll-back of a half-done add."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.lb import _haproxy as H
from ansible_collections.gpufleet.node.plugins.module_utils.lb import _pool_member as hpm

# `show servers state vllm_pool` from HAProxy 2.6.12 (Debian 12), captured on this project's lab
# balancer: a server just added (forced maintenance), one in service, one draining.
SHOW = """1
# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port
3 vllm_pool 2 node1 127.0.0.1 0 1 1 1 0 1 0 0 2 0 0 0 - 8001 - 0 0 - - 0
3 vllm_pool 3 node2 10.0.0.2 2 0 1 1 0 1 0 2 6 0 0 0 - 8000 - 0 0 - - 0
3 vllm_pool 4 node3 10.0.0.3 2 8 1 1 0 1 0 2 6 0 0 0 - 8000 - 0 0 - - 0

"""


class FakeAPI(H.RuntimeAPI):
    def __init__(self, answers):
        super().__init__("/nonexistent")
        self.answers, self.sent = answers, []

    def command(self, line):
        self.sent.append(line)
        if line.startswith("show servers state"):
            return SHOW
        return self.answers.get(line, "\n")


def test_servers_parsed_by_header():
    servers = FakeAPI({}).servers("vllm_pool")
    assert {n: (s["address"], s["port"], s["state"], s["op_state"]) for n, s in servers.items()} == {
        "node1": ("127.0.0.1", 8001, "maint", "stopped"),
        "node2": ("10.0.0.2", 8000, "ready", "running"),
        "node3": ("10.0.0.3", 8000, "drain", "running"),
    }


def test_unknown_backend_is_an_error():
    class NoBackend(FakeAPI):
        def command(self, line):
            return "Can't find backend.\n\n"

    with pytest.raises(H.HAProxyError, match="no backend 'x'.*Can't find backend"):
        NoBackend({}).servers("x")


def test_plan_from_each_state():
    srv = {"address": "10.0.0.2", "port": 8000, "state": "ready"}
    assert hpm.plan(None, "present", "b", "n", "10.0.0.2", 8000, True) == [
        "add server b/n 10.0.0.2:8000 check",
        "enable health b/n",
        "set server b/n state ready",
    ]
    assert hpm.plan(srv, "present", "b", "n", "10.0.0.2", 8000, True) == []
    assert hpm.plan(srv, "present", "b", "n", "10.0.0.9", 8001, True) == ["set server b/n addr 10.0.0.9 port 8001"]
    assert hpm.plan(srv, "drained", "b", "n", "10.0.0.2", 8000, True) == ["set server b/n state drain"]
    assert hpm.plan(srv, "absent", "b", "n", None, None, True) == ["set server b/n state maint", "del server b/n"]
    assert hpm.plan(dict(srv, state="maint"), "absent", "b", "n", None, None, True) == ["del server b/n"]
    assert hpm.plan(None, "absent", "b", "n", None, None, True) == []


def test_plan_with_an_agent():
    agent = {"address": "10.0.0.2", "port": 9777, "interval": "2s"}
    srv = {"address": "10.0.0.2", "port": 8000, "state": "ready", "agent_address": "10.0.0.2", "agent_port": 9777}
    assert hpm.plan(None, "present", "b", "n", "10.0.0.2", 8000, True, agent) == [
        "add server b/n 10.0.0.2:8000 check agent-check agent-addr 10.0.0.2 agent-port 9777 agent-inter 2s",
        "enable health b/n",
        "enable agent b/n",
        "set server b/n state ready",
    ]
    assert hpm.plan(srv, "present", "b", "n", "10.0.0.2", 8000, True, agent) == []
    assert hpm.plan(srv, "present", "b", "n", "10.0.0.2", 8000, True, dict(agent, port=9778, address="10.1.0.2")) == [
        "set server b/n agent-addr 10.1.0.2",
        "set server b/n agent-port 9778",
    ]
    # no agent check yet, or one that is no longer wanted: the server is replaced
    plain = dict(srv, agent_address=None, agent_port=0)
    assert hpm.plan(plain, "present", "b", "n", "10.0.0.2", 8000, True, agent)[:3] == [
        "set server b/n state maint",
        "del server b/n",
        "add server b/n 10.0.0.2:8000 check agent-check agent-addr 10.0.0.2 agent-port 9777 agent-inter 2s",
    ]
    assert hpm.plan(srv, "present", "b", "n", "10.0.0.2", 8000, True)[:3] == [
        "set server b/n state maint",
        "del server b/n",
        "add server b/n 10.0.0.2:8000 check",
    ]
    assert H.server_line("n", "10.0.0.2", 8000, True, agent) == (
        "    server n 10.0.0.2:8000 check agent-check agent-addr 10.0.0.2 agent-port 9777 agent-inter 2s"
    )


def test_a_failed_enable_rolls_the_add_back():
    api = FakeAPI({"set server b/n state ready": "No such server.\n"})
    cmds = hpm.plan(None, "present", "b", "n", "10.0.0.2", 8000, False)
    with pytest.raises(H.HAProxyError, match="refused `set server b/n state ready`"):
        hpm.apply(api, cmds, "b", "n", 1)
    assert api.sent[-2:] == ["set server b/n state maint", "del server b/n"], (
        "the server this run added must be deleted again"
    )


CFG = """global
    stats socket /run/haproxy.sock level admin

backend vllm_pool
    balance leastconn
    server node2 10.0.0.2:8000 check

listen stats
    bind 127.0.0.1:8404
"""


def test_config_edit_adds_replaces_and_removes_only_its_line():
    added = H.config_with_server(CFG, "vllm_pool", "node1", H.server_line("node1", "10.0.0.1", 8000, True))
    assert "    server node2 10.0.0.2:8000 check\n    server node1 10.0.0.1:8000 check\n\nlisten stats" in added
    moved = H.config_with_server(added, "vllm_pool", "node1", H.server_line("node1", "10.0.0.9", 8000, True))
    assert "10.0.0.1" not in moved and moved.count("server node1 ") == 1
    # An existing line stays where it is: re-applying the same pool changes nothing.
    assert H.config_with_server(moved, "vllm_pool", "node2", H.server_line("node2", "10.0.0.2", 8000, True)) == moved
    moved2 = H.config_with_server(moved, "vllm_pool", "node2", H.server_line("node2", "10.0.0.7", 8000, True))
    assert moved2.index("server node2 10.0.0.7") < moved2.index("server node1 ")
    assert H.config_with_server(moved, "vllm_pool", "node1", None) == CFG
    with pytest.raises(H.HAProxyError, match="backend 'other' is not in"):
        H.config_with_server(CFG, "other", "node1", None)


# --- the one runtime-API client: TCP and UNIX, one error type -----------------------------------


def fake_haproxy(answer=b"", count=1, family=socket.AF_INET, path=None):
    """A runtime API that answers `count` commands and records them (TCP, or UNIX at `path`)."""
    server = socket.socket(family)
    server.bind(path or ("127.0.0.1", 0))
    server.listen(4)
    seen = []

    def serve():
        for _ in range(count):
            try:
                conn, _ = server.accept()
            except OSError:  # closed by the test before all answers were asked for
                return
            with conn:
                seen.append(conn.recv(4096).decode())
                conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    endpoint = f"unix://{path}" if path else "tcp://127.0.0.1:%d" % server.getsockname()[1]
    return endpoint, seen, server


def test_runtime_api_over_tcp_and_unix(tmp_path):
    endpoint, seen, server = fake_haproxy()
    with server:
        assert (
            H.RuntimeAPI(endpoint).set_state("vllm_pool", "node1", "drain") == "set server vllm_pool/node1 state drain"
        )
    assert seen == ["set server vllm_pool/node1 state drain\n"]
    endpoint, seen, server = fake_haproxy(b"No such server.\n")
    with server, pytest.raises(H.HAProxyError, match="refused `set server vllm_pool/x state ready`: No such server"):
        H.RuntimeAPI(endpoint).set_state("vllm_pool", "x", "ready")
    path = str(tmp_path / "admin.sock")
    for spelled in (f"unix://{path}", path):
        _endpoint, seen, server = fake_haproxy(b"Name: HAProxy\n", family=socket.AF_UNIX, path=path)
        with server:
            assert H.RuntimeAPI(spelled).command("show info") == "Name: HAProxy\n"
        assert seen == ["show info\n"]
        (tmp_path / "admin.sock").unlink()
    with pytest.raises(H.HAProxyError, match="cannot talk to HAProxy's runtime API at unix:///nonexistent"):
        H.RuntimeAPI("unix:///nonexistent/admin.sock").command("show info")


@pytest.mark.parametrize(
    "endpoint", ["10.0.0.1:9999", "tcp://10.0.0.1", "tcp://:80", "http://h:1", "unix://", "admin.sock"]
)
def test_runtime_api_endpoint_forms(endpoint):
    with pytest.raises(H.HAProxyError, match="tcp://HOST:PORT or unix:///PATH"):
        H.RuntimeAPI(endpoint)
    assert H.parse_endpoint("tcp://[::1]:9999") == (socket.AF_INET6, ("::1", 9999))
    assert H.parse_endpoint("tcp://lb1:9999") == (socket.AF_INET, ("lb1", 9999))


def test_unknown_server_state_is_refused_before_sending():
    api = FakeAPI({})
    with pytest.raises(H.HAProxyError, match="unknown server state 'up'"):
        api.set_state("b", "s", "up")
    assert api.sent == []


def test_runtime_api_deadline_and_size_limit(monkeypatch):
    # a server that answers a byte at a time, slower than the deadline, is cut at the deadline
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    dripped = []

    def drip():
        conn, _ = server.accept()
        with conn:
            conn.recv(4096)
            for _ in range(50):
                try:
                    conn.sendall(b"x")
                except OSError:
                    return
                dripped.append(1)
                time.sleep(0.1)

    threading.Thread(target=drip, daemon=True).start()
    with server, pytest.raises(H.HAProxyError, match="gave no complete answer to `show info` within 0.5s"):
        H.RuntimeAPI("tcp://127.0.0.1:%d" % server.getsockname()[1], timeout=0.5).command("show info")
    # It gave up while the server was still dripping (all 50 bytes take 5 s), not at the end.
    assert len(dripped) < 50
    monkeypatch.setattr(H, "MAX_ANSWER", 10)
    endpoint, _seen, server = fake_haproxy(b"y" * 100)
    with server, pytest.raises(H.HAProxyError, match="exceeds 10 bytes"):
        H.RuntimeAPI(endpoint).command("show info")


# --- values that reach the runtime API or the config file ---------------------------------------


@pytest.mark.parametrize(
    "line", ["show info;disable frontend fe", "show info\ndisable frontend fe", "show\rinfo", "show info\x00"]
)
def test_client_never_sends_a_chained_command(line):
    api = H.RuntimeAPI("/nonexistent")
    with pytest.raises(H.HAProxyError, match="must not contain"):
        api.command(line)


INJECTED_ADDRESSES = [
    "10.0.0.5;disable frontend fe",
    "10.0.0.5\ndisable frontend fe",
    "10.0.0.5 backup",
    "10.0.0.5:80",
    "10.0.0.5#",
    "",
    "node1..lab",
    "-node1",
    "10.0.0",
    "fe80::1%eth0;x",
]


@pytest.mark.parametrize("address", INJECTED_ADDRESSES)
def test_runtime_api_address_injection_refused(address):
    with pytest.raises(H.HAProxyError, match="give an IP address or a host name"):
        H.check_address("address", address)
    with pytest.raises(H.HAProxyError):
        hpm.plan(None, "present", "b", "n", address, 8000, True)
    agent = {"address": address, "port": 9777, "interval": "2s"}
    with pytest.raises(H.HAProxyError, match="agent address"):
        hpm.plan(None, "present", "b", "n", "10.0.0.5", 8000, True, agent)
    with pytest.raises(H.HAProxyError):
        H.server_line("n", "10.0.0.5", 8000, True, agent)


@pytest.mark.parametrize("address", ["10.0.0.5", "2001:db8::5", "fe80::1%eth0", "node1", "node-1.lab.example"])
def test_addresses_accepted(address):
    assert H.check_address("address", address) == address


@pytest.mark.parametrize(
    "interval", ["2s;disable frontend fe", "2s\nfrontend x", "2 s", "1.5s", "2sec", "", "-1s", "s", "2s agent-send x"]
)
def test_agent_interval_injection_refused(interval):
    with pytest.raises(H.HAProxyError, match="give an HAProxy time"):
        H.check_time("agent_interval", interval)
    with pytest.raises(H.HAProxyError, match="agent interval"):
        hpm.plan(
            None,
            "present",
            "b",
            "n",
            "10.0.0.5",
            8000,
            True,
            {"address": "10.0.0.5", "port": 9777, "interval": interval},
        )


@pytest.mark.parametrize("interval", ["2s", "500ms", "1m", "100us", "1h", "1d", "2000"])
def test_haproxy_times_accepted(interval):
    assert H.check_time("agent_interval", interval) == interval


def test_config_newline_injection_refused():
    for name in ("node1\nbackend evil", "node 1", "node1;x", ""):
        with pytest.raises(H.HAProxyError, match="invalid server name"):
            H.server_line(name, "10.0.0.1", 8000, True)
    with pytest.raises(H.HAProxyError, match="give an IP address"):
        H.server_line("node1", "10.0.0.1\nlisten evil\n    bind :80", 8000, True)
    with pytest.raises(H.HAProxyError, match="refused to write"):
        H.config_with_server(CFG, "vllm_pool", "node1", "    server node1 10.0.0.1:8000\nfrontend evil")
    for port in (0, 65536, True, "80"):
        with pytest.raises(H.HAProxyError, match="out of range"):
            H.server_line("node1", "10.0.0.1", port, True)


# --- HAProxy's own view of a server --------------------------------------------------------------

# `show stat vllm_pool 4 -1` from HAProxy 2.6.12 (Debian 12), captured on this project's machine:
# a server whose port refuses connections (health check and agent check L4CON), one up, one before
# its first checks, one without checks; cut to the fields read (the real header has ~100, in another
# order: the parser goes by the header).
STAT = """# pxname,svname,status,check_status,check_code,last_chk,last_agt,agent_status,check_desc,agent_desc,
vllm_pool,node1,DOWN (agent),L4CON,,Connection refused,Connection refused,L4CON,Layer4 connection problem,Layer4 connection problem,
vllm_pool,node2,UP,L7OK,200,OK,up,* L7OK,Layer7 check passed,Layer7 check passed,
vllm_pool,node3,DOWN,INI,,,,INI,Initializing,Initializing,
vllm_pool,node4,no check,,,,,,,,

"""


class StatAPI(FakeAPI):
    def __init__(self, stats):
        super().__init__({})
        self.stats = list(stats)

    def command(self, line):
        self.sent.append(line)
        return self.stats.pop(0) if len(self.stats) > 1 else self.stats[0]


def test_view_parsed_by_header_and_described():
    api = StatAPI([STAT])
    down = api.view("vllm_pool", "node1")
    assert api.sent == ["show stat vllm_pool 4 -1"]
    assert down == {
        "status": "DOWN (agent)",
        "check_status": "L4CON",
        "check_desc": "Layer4 connection problem",
        "last_chk": "Connection refused",
        "agent_status": "L4CON",
        "agent_desc": "Layer4 connection problem",
        "last_agt": "Connection refused",
    }
    assert H.describe_view(down) == (
        "status DOWN (agent); health check L4CON (Layer4 connection problem, "
        "Connection refused); agent check L4CON (Layer4 connection problem, "
        "Connection refused)"
    )
    assert api.view("vllm_pool", "node2")["agent_status"] == "L7OK"  # "* ": a check is running now
    assert [H.is_up(api.view("vllm_pool", n)) for n in ("node1", "node2", "node3", "node4")] == [
        False,
        True,
        False,
        True,
    ]  # node3: its first checks have not run yet (INI)
    assert api.view("vllm_pool", "node9") is None and H.describe_view(None) == "the server is not in the backend"
    with pytest.raises(H.HAProxyError, match="answered `show stat nope`"):
        StatAPI(["Can't find backend.\n"]).view("nope", "n")


def test_wait_up_is_bounded_and_returns_what_it_saw():
    clock = {"t": 0.0}
    up_later = StatAPI([STAT.replace("node2,UP", "node2,DOWN"), STAT])
    assert up_later.wait_up(
        "vllm_pool", "node2", 10, clock=lambda: clock["t"], sleep=lambda s: clock.update(t=clock["t"] + s)
    ) == (True, up_later.view("vllm_pool", "node2"))
    clock["t"] = 0.0
    never = StatAPI([STAT])
    up, view = never.wait_up(
        "vllm_pool", "node1", 3, interval=0.5, clock=lambda: clock["t"], sleep=lambda s: clock.update(t=clock["t"] + s)
    )
    assert (up, view["check_status"], clock["t"]) == (False, "L4CON", 3.0)


@pytest.mark.parametrize(
    "answer, ok",
    [
        # HAProxy 2.6.12's answers to `set server B/S addr A [port P]` (run against the real one here)
        ("IP changed from '127.0.0.1' to '127.0.0.2', no need to change the port by 'stats socket command'\n\n", True),
        ("no need to change the addr, port changed from '18556' to '18557' by 'stats socket command'\n\n", True),
        ("IP changed from '127.0.0.2' to '127.0.0.3' by 'stats socket command'\n\n", True),
        ("no need to change the addr, no need to change the port by 'stats socket command'\n\n", True),
        ("Invalid addr 'bogus' by 'stats socket command'\n\n", False),
        ("New server registered.\n", True),
        ("No such server.\n", False),
        ("", True),
    ],
)
def test_which_answers_are_a_success(monkeypatch, answer, ok):
    api = H.RuntimeAPI("/nonexistent/admin.sock")
    monkeypatch.setattr(api, "command", lambda line: answer)
    if ok:
        assert api.run("set server vllm_pool/node1 addr 127.0.0.2 port 9000") == answer.strip()
    else:
        with pytest.raises(H.HAProxyError, match="HAProxy refused"):
            api.run("set server vllm_pool/node1 addr 127.0.0.2 port 9000")
