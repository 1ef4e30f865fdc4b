# SPDX-License-Identifier: GPL-3.0-or-later
"""HAProxy runtime-API parsing, the config-file edit, and the roll-back of a half-done add."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils import _haproxy as H

MODULE = Path(__file__).resolve().parents[2] / "plugins/modules/haproxy_pool_member.py"
_spec = importlib.util.spec_from_file_location("haproxy_pool_member", MODULE)
hpm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hpm)

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
        "add server b/n 10.0.0.2:8000 check", "enable health b/n", "set server b/n state ready"]
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
        "enable health b/n", "enable agent b/n", "set server b/n state ready"]
    assert hpm.plan(srv, "present", "b", "n", "10.0.0.2", 8000, True, agent) == []
    assert hpm.plan(srv, "present", "b", "n", "10.0.0.2", 8000, True, dict(agent, port=9778, address="10.1.0.2")) == [
        "set server b/n agent-addr 10.1.0.2", "set server b/n agent-port 9778"]
    # no agent check yet, or one that is no longer wanted: the server is replaced
    plain = dict(srv, agent_address=None, agent_port=0)
    assert hpm.plan(plain, "present", "b", "n", "10.0.0.2", 8000, True, agent)[:3] == [
        "set server b/n state maint", "del server b/n",
        "add server b/n 10.0.0.2:8000 check agent-check agent-addr 10.0.0.2 agent-port 9777 agent-inter 2s"]
    assert hpm.plan(srv, "present", "b", "n", "10.0.0.2", 8000, True)[:3] == [
        "set server b/n state maint", "del server b/n", "add server b/n 10.0.0.2:8000 check"]
    assert H.server_line("n", "10.0.0.2", 8000, True, agent) == (
        "    server n 10.0.0.2:8000 check agent-check agent-addr 10.0.0.2 agent-port 9777 agent-inter 2s")


def test_a_failed_enable_rolls_the_add_back():
    api = FakeAPI({"set server b/n state ready": "No such server.\n"})
    cmds = hpm.plan(None, "present", "b", "n", "10.0.0.2", 8000, False)
    with pytest.raises(H.HAProxyError, match="refused `set server b/n state ready`"):
        hpm.apply(api, cmds, "b", "n", 1)
    assert api.sent[-2:] == ["set server b/n state maint", "del server b/n"], \
        "the server this run added must be deleted again"


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
