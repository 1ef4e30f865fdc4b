# SPDX-License-Identifier: GPL-3.0-or-later
"""A node taken out is not forgotten: role lb_registration's register and deregister steps drain a
node that may not take traffic (added drained where it was never in the pool), its line kept in
HAProxy's config file; only lb_registration_state=absent removes it; and the node's own return
request (tasks_from: ready, written by its boot validation) is what lifts the drain, through the
agent's `ready`. Against a real HAProxy on loopback, with a stand-in agent answering fixed lines
(the real agent's `ready` answer is its own tests' business)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.lb._haproxy import RuntimeAPI
from tests.harness.http import FakeHTTP
from tests.harness.playbook import one_role_playbook, run_playbook
from tests.integration.test_haproxy_pool_member import Agent, free_port

pytestmark = pytest.mark.skipif(not shutil.which("haproxy"), reason="haproxy is not installed")

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "roles/lb_registration/files/gpufleet_lb_agent.py"
NODE = "node7"


def _role(tmp_path, env, tasks_from, extra, *args):
    playbook, inventory = one_role_playbook(
        tmp_path, {NODE: {"ansible_python_interpreter": os.sys.executable}}, "lb_registration", tasks_from
    )
    return run_playbook(playbook, *args, inventory=str(inventory), local=True, extra_vars=extra, env=env, timeout=120)


def _extra(balancer, port, agent_port, **kw):
    return dict(
        {
            "ansible_python_interpreter": os.sys.executable,
            # the node's own request to its agent (this host's, for the test)
            "lb_registration_agent_request_path": str(balancer.dir / "lb-agent-request.json"),
            "lb_registration_balancer": "localhost",
            "lb_registration_socket": balancer.sock,
            "lb_registration_config_file": str(balancer.cfg),
            "lb_registration_address": "127.0.0.1",
            "lb_registration_port": port,
            "lb_registration_agent_port": agent_port,
            "lb_registration_agent_interval": "500ms",
            "lb_registration_retries": 1,
            "lb_registration_delay": 1,
        },
        **kw,
    )


def _config_line(balancer):
    found = re.search(rf"^\s+server {NODE} .*$", balancer.cfg.read_text(), re.M)
    return found[0].strip() if found else None


def _wait_server(balancer, predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        server = balancer.servers().get(NODE)
        if (server is not None and predicate(server)) or time.monotonic() > deadline:
            return server
        time.sleep(0.2)


def test_a_refused_node_stays_known_drained_and_its_agent_returns_it(balancer, ansible_env, tmp_path):
    agent, health = Agent(), FakeHTTP({"/health": ""})
    agent.answer = "down #gate-failed\n"
    extra = _extra(balancer, health.port, agent.port, __lb_registration_reasons=["the gate failed"])
    # a `ready` the node asked for before this run (a boot validation's hold): withdrawn, else the
    # agent's next `ready` would lift the drain
    request = Path(extra["lb_registration_agent_request_path"])
    request.write_text('{"state": "ready", "reason": "validated", "until": %d}\n' % (time.time() + 30))
    try:
        run = _role(tmp_path, ansible_env, "register", extra)
        assert run.returncode == 2 and run.host(NODE)["failed"] == 1, run.explain()
        assert not request.exists(), "the node's own ready request survived the drain"
        assert f"{NODE} is drained in the pool: the gate failed" in run.stdout, run.explain()
        server = balancer.servers()[NODE]
        assert server["state"] == "drain" and (server["address"], server["port"]) == ("127.0.0.1", health.port)
        assert server["agent_port"] == agent.port, server
        # kept in the file HAProxy restarts from, with its agent check
        assert _config_line(balancer) == (
            f"server {NODE} 127.0.0.1:{health.port} check agent-check agent-addr 127.0.0.1 "
            f"agent-port {agent.port} agent-inter 500ms"
        )
        text = balancer.cfg.read_text()

        # refused again: nothing changes
        again = _role(tmp_path, ansible_env, "register", extra)
        assert again.host(NODE)["failed"] == 1 and again.host(NODE)["changed"] == 0, again.explain()
        assert balancer.cfg.read_text() == text and balancer.servers()[NODE]["state"] == "drain"

        # the agent's plain `up` (the gate passed, nothing asked) leaves the drain alone ...
        agent.answer = "up\n"
        running = _wait_server(balancer, lambda s: s["op_state"] == "running")
        assert running["op_state"] == "running" and running["state"] == "drain", running
        # ... the node's own `ready` (its boot validation passed) lifts it: back in rotation
        agent.answer = "ready up\n"
        back = _wait_server(balancer, lambda s: s["state"] == "ready")
        assert back["state"] == "ready" and back["op_state"] == "running", back

        # retired by the operator: removed from the runtime and the file
        retired = _role(tmp_path, ansible_env, "register", dict(extra, lb_registration_state="absent"))
        assert retired.host(NODE)["failed"] == 1 and retired.host(NODE)["changed"] == 1, retired.explain()
        assert f"{NODE} is removed from the pool" in retired.stdout, retired.explain()
        assert NODE not in balancer.servers() and _config_line(balancer) is None
    finally:
        health.close()


def test_a_failed_node_is_drained_added_drained_and_removed_only_when_retired(balancer, ansible_env, tmp_path):
    agent = Agent()
    port = free_port()
    extra = _extra(balancer, port, agent.port)
    # never in the pool (its first site.yml failed): added drained, so that it is known
    check = _role(tmp_path, ansible_env, "deregister", extra, "--check", "--diff")
    assert check.returncode == 0 and check.host(NODE)["changed"] == 1, check.explain()
    assert balancer.servers() == {} and _config_line(balancer) is None, "check mode changed the balancer"
    assert f"+server {NODE} 127.0.0.1:{port} check agent-check" in check.stdout.replace("+    ", "+"), check.stdout

    request = Path(extra["lb_registration_agent_request_path"])
    request.write_text('{"state": "drain", "reason": "recycle"}\n')
    run = _role(tmp_path, ansible_env, "deregister", extra)
    assert run.returncode == 0 and run.host(NODE)["changed"] == 2, run.explain()  # the request, the drain
    assert balancer.servers()[NODE]["state"] == "drain" and not request.exists()
    assert _config_line(balancer).startswith(f"server {NODE} 127.0.0.1:{port} check agent-check")
    again = _role(tmp_path, ansible_env, "deregister", extra)
    assert again.returncode == 0 and again.host(NODE)["changed"] == 0, again.explain()

    # a registered node that fails a step later is drained, not deleted
    RuntimeAPI(balancer.sock).run(f"set server vllm_pool/{NODE} state ready")
    assert balancer.servers()[NODE]["state"] == "ready"
    drained = _role(tmp_path, ansible_env, "deregister", extra)
    assert drained.returncode == 0 and drained.host(NODE)["changed"] == 1, drained.explain()
    assert balancer.servers()[NODE]["state"] == "drain" and _config_line(balancer) is not None

    # the operator retires it: removed from the runtime and the file
    retired = _role(tmp_path, ansible_env, "deregister", dict(extra, lb_registration_state="absent"))
    assert retired.returncode == 0 and retired.host(NODE)["changed"] == 1, retired.explain()
    assert NODE not in balancer.servers() and _config_line(balancer) is None


def _read_request():
    spec = importlib.util.spec_from_file_location("gpufleet_lb_agent", AGENT)
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    return agent.read_request


def test_the_node_asks_its_own_agent_for_ready_for_the_hold(ansible_env, tmp_path):
    request = tmp_path / "run" / "lb-agent-request.json"
    request.parent.mkdir()
    extra = {"lb_registration_agent_request_path": str(request), "lb_registration_ready_hold": 30}
    check = _role(tmp_path, ansible_env, "ready", extra, "--check", "--diff")
    assert check.returncode == 0 and check.host(NODE)["changed"] == 1, check.explain()
    assert not request.exists(), "check mode wrote the request"
    assert '"state": "ready"' in check.stdout, check.stdout

    before = time.time()
    run = _role(tmp_path, ansible_env, "ready", extra)
    assert run.returncode == 0 and run.host(NODE)["changed"] == 1, run.explain()
    data = json.loads(request.read_text())
    assert data["state"] == "ready" and data["reason"] == "validated", data
    assert before + 29 <= data["until"] <= time.time() + 31, (before, data)
    assert oct(request.stat().st_mode & 0o777) == "0o644"
    # what the node's agent makes of it: `ready` while the hold lasts, nothing after
    read_request = _read_request()
    assert read_request(str(request)) == ("ready", "validated")
    assert read_request(str(request), now=data["until"] + 1) == (None, None)


@pytest.mark.parametrize("hold", [0, -5, "soon"])
def test_a_hold_that_is_not_a_positive_number_is_refused(ansible_env, tmp_path, hold):
    request = tmp_path / "lb-agent-request.json"
    run = _role(
        tmp_path,
        ansible_env,
        "ready",
        {"lb_registration_agent_request_path": str(request), "lb_registration_ready_hold": hold},
    )
    assert run.returncode == 2 and run.host(NODE)["failed"] == 1, run.explain()
    assert "lb_registration_ready_hold must be a number of seconds above 0" in run.stdout, run.stdout
    assert not request.exists()
