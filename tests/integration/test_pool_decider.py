# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet-pool-decider (role pool_decider's daemon) against a real HAProxy on loopback, whose
four servers report through small TCP agents answering fixed lines (stand-ins for the nodes'
agents: the protocol is one line per connection): the budget is respected, refusals are counted
and exported, a restart of the decider keeps its state, only its own drains are lifted."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.lb._haproxy import RuntimeAPI, is_up
from tests.harness.modules import install_agent
from tests.integration.test_haproxy_pool_member import Balancer, free_port

pytestmark = pytest.mark.skipif(not shutil.which("haproxy"), reason="haproxy is not installed")

REPO = Path(__file__).resolve().parents[2]
DECIDER = REPO / "roles" / "pool_decider" / "files" / "gpufleet_pool_decider.py"
NODES = ("node1", "node2", "node3", "node4")
WINDOW = 12.0  # the decider's window where a test waits for it to pass
BOUND = 30.0  # seconds for anything the decider must have done (it polls every 0.3 s)


class Agent:
    """A node's HAProxy agent stand-in: answers ``line`` (settable) to every connection."""

    def __init__(self, line="up"):
        self.line = line
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.asked = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _addr = self.listener.accept()
            except OSError:
                return
            with conn:
                self.asked += 1
                try:
                    conn.sendall((self.line + "\n").encode())
                except OSError:
                    pass

    def close(self):
        self.listener.close()


class Pool(Balancer):
    """The test HAProxy with four servers, each with agent-check on its own stand-in agent."""

    def __init__(self, tmp_path, agents):
        super().__init__(tmp_path)
        lines = [
            "    server %s 127.0.0.1:%d agent-check agent-addr 127.0.0.1 agent-port %d agent-inter 500ms"
            % (name, free_port(), agents[name].port)
            for name in NODES
        ]
        text = self.cfg.read_text().replace("    default-server inter 2s fall 2 rise 1\n", "")
        self.cfg.write_text(text.replace("\nbackend vllm_pool\n", "\nbackend vllm_pool\n" + "\n".join(lines) + "\n", 1))

    def states(self):
        return {name: s["state"] for name, s in self.servers().items()}

    def view(self, name):
        return RuntimeAPI(self.sock).view("vllm_pool", name)


class Decider:
    def __init__(self, tmp_path, socket_path):
        self.script = install_agent(DECIDER, tmp_path / "lib")
        self.state = tmp_path / "state" / "pool-decider.json"
        self.port = free_port()
        self.config = tmp_path / "pool-decider.json"
        self.config.write_text(
            json.dumps(
                {
                    "backend": "vllm_pool",
                    "socket": str(socket_path),
                    "state_file": str(self.state),
                    "fraction": 0.25,
                    "min_kept": 1,
                    "window": WINDOW,
                    "interval": 0.3,
                    "agent_timeout": 1.0,
                    "metrics_address": "127.0.0.1",
                    "metrics_port": self.port,
                }
            )
        )
        self.log = tmp_path / "decider.log"
        self.proc = None

    @property
    def window(self):
        return json.loads(self.config.read_text())["window"]

    def configure(self, **changes):
        """Changes to its configuration, before start()."""
        self.config.write_text(json.dumps(dict(json.loads(self.config.read_text()), **changes)))

    def start(self):
        """Started, its metrics served and its first poll made (the budget's series exist)."""
        self.proc = subprocess.Popen(
            [sys.executable, str(self.script), "--config", str(self.config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "a"),
        )
        wait(lambda: self.metrics(quiet=True) is not None, "the decider's metrics")
        wait(lambda: self.series("gpufleet_pool_budget_servers"), "the decider's first poll")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)
        return self.proc.returncode if self.proc else None

    def metrics(self, quiet=False):
        """{(name, labels...): value} of the decider's /metrics (prometheus_client's parser)."""
        from prometheus_client.parser import text_string_to_metric_families

        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.port, timeout=2) as resp:
                text = resp.read().decode()
        except OSError:
            if quiet:
                return None
            raise
        found = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return found

    def series(self, name):
        return {dict(labels).get("server"): v for (n, labels), v in (self.metrics() or {}).items() if n == name}


def wait(predicate, what, bound=BOUND):
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("waited %g s for %s" % (bound, what))


@pytest.fixture
def lab(tmp_path):
    agents = {name: Agent("up") for name in NODES}
    pool = Pool(tmp_path, agents)
    pool.start()
    decider = Decider(tmp_path, pool.sock)
    try:
        yield pool, agents, decider
    finally:
        decider.stop()
        pool.stop()
        for agent in agents.values():
            agent.close()


def drained(pool):
    return sorted(n for n, s in pool.states().items() if s == "drain")


def test_budget_refusals_restart_and_return(lab):
    pool, agents, decider = lab
    decider.configure(window=30.0)  # one the decider's restart below fits in, however loaded the machine
    decider.start()
    wait(lambda: all(a.asked for a in agents.values()), "HAProxy and the decider to ask every agent")
    assert drained(pool) == [] and decider.series("gpufleet_pool_budget_limit") == {None: 1.0}
    assert decider.series("gpufleet_pool_budget_servers") == {None: 4.0}

    # a false alarm on three of four nodes at once: one (25 % of 4) leaves, two are refused
    for name in ("node1", "node2", "node3"):
        agents[name].line = "up #hold-gpu-health-failed"
    wait(lambda: len(decider.series("gpufleet_pool_budget_pending")) == 2, "two refused removals")
    out = drained(pool)
    assert len(out) == 1 and out[0] in ("node1", "node2", "node3"), pool.states()
    first = out[0]
    pending = decider.series("gpufleet_pool_budget_pending")
    assert sorted(pending) == sorted({"node1", "node2", "node3"} - {first}) and set(pending.values()) == {1.0}
    assert decider.series("gpufleet_pool_budget_held") == {first: 1.0}
    refused = decider.series("gpufleet_pool_budget_refused_total")
    assert refused == dict.fromkeys(pending, 1.0), refused
    # HAProxy keeps the held servers in rotation: `up #hold-...` is an agent's `up`
    for name in pending:
        assert is_up(pool.view(name)), (name, pool.view(name))
    log = decider.log.read_text()
    assert "refused to drain vllm_pool/" in log and "gpu-health-failed" in log, log

    # the decider restarts: the same drains, no second drain, the counts kept
    assert decider.stop() == 0
    state = json.loads(decider.state.read_text())
    assert list(state["held"]) == [first] and sorted(state["pending"]) == sorted(pending)
    decider.start()
    wait(lambda: decider.series("gpufleet_pool_budget_servers") == {None: 4.0}, "the new decider's first poll")
    assert drained(pool) == [first]
    assert decider.series("gpufleet_pool_budget_refused_total") == refused
    assert sorted(decider.series("gpufleet_pool_budget_pending")) == sorted(pending)

    # the window frees the budget: the removal refused first goes, the first one still held
    def next_removal():  # in HAProxy and, once the poll is over, in the decider's metrics
        out = drained(pool)
        return len(out) == 2 and len(decider.series("gpufleet_pool_budget_pending")) == 1 and out

    both = wait(next_removal, "the next removal as the window frees", decider.window + BOUND)
    (second,) = set(both) - {first}
    assert second in pending and sorted(decider.series("gpufleet_pool_budget_pending")) == sorted(
        set(pending) - {second}
    )
    # the first node is cleared: the decider returns it (its own drain), the second stays held
    agents[first].line = "up"
    wait(
        lambda: drained(pool) == [second] and decider.series("gpufleet_pool_budget_held") == {second: 1.0},
        "the held server's return, in HAProxy and in the decider's metrics",
    )


def test_an_operators_drain_stays_and_a_down_agent_is_not_the_deciders(lab):
    pool, agents, decider = lab
    decider.start()
    RuntimeAPI(pool.sock).set_state("vllm_pool", "node4", "drain")  # the operator's
    agents["node3"].line = "down #engine-wedged"  # cannot serve: HAProxy takes it out by itself
    wait(lambda: pool.servers()["node3"]["op_state"] != "running", "HAProxy's agent check to take node3 down")
    wait(lambda: all(a.asked > 2 for a in agents.values()), "a few polls")
    assert pool.states() == {"node1": "ready", "node2": "ready", "node3": "ready", "node4": "drain"}
    assert decider.series("gpufleet_pool_budget_held") == {}

    # with node3 down and node4 drained, two are left: a hold on both drains one (min one kept)
    agents["node1"].line = agents["node2"].line = "up #hold-gate-failed"
    wait(lambda: len(decider.series("gpufleet_pool_budget_pending")) == 1, "one refused removal")
    assert pool.states()["node4"] == "drain" and len(drained(pool)) == 2  # node4's and the decider's
    # the operator's drain is never lifted, even when its agent says up
    asked = agents["node4"].asked
    wait(lambda: agents["node4"].asked > asked + 3, "more polls")
    assert pool.states()["node4"] == "drain"


def test_a_restart_of_haproxy_keeps_the_deciders_drains(lab):
    """HAProxy restarts from its configuration, which cannot say drain, after the window of the
    first drain passed and while a second drain spends the budget: the decider drains both again
    (no refusal, no second share), and the first stays drained once the window passes again."""
    pool, agents, decider = lab
    decider.start()
    agents["node1"].line = "up #hold-gpu-health-failed"
    wait(lambda: drained(pool) == ["node1"], "the first drain")
    time.sleep(WINDOW + 1)  # the first drain no longer counts
    agents["node2"].line = "up #hold-gate-failed"
    wait(lambda: drained(pool) == ["node1", "node2"], "the second drain, the window having passed")

    before = RuntimeAPI(pool.sock).info()["Pid"]
    pool.stop()
    pool.start()
    assert RuntimeAPI(pool.sock).info()["Pid"] != before
    wait(lambda: drained(pool) == ["node1", "node2"], "the decider to drain both again")
    assert decider.series("gpufleet_pool_budget_pending") == {}
    assert decider.series("gpufleet_pool_budget_held") == {"node1": 1.0, "node2": 1.0}
    assert "HAProxy restarted" in decider.log.read_text() and "drained vllm_pool/node1 again" in decider.log.read_text()
    pid = int(pool.pidfile.read_text().split()[0])
    wait(
        lambda: json.loads(decider.state.read_text())["haproxy"]["pid"] == pid, "the state file to name the new HAProxy"
    )


def test_a_budgeted_drain_leaves_a_held_server_to_the_decider(lab, run_module):
    """haproxy_pool_member budgeted=true (what site.yml's removal of a failed node sends where the
    pool has a decider): a server whose agent holds it (`up #hold-WORD`) stays in rotation for the
    decider; one whose agent says down or plain up is drained, as without the budget."""
    pool, agents, _decider = lab
    agents["node1"].line = "up #hold-gpu-health-failed"
    agents["node2"].line = "down #engine-wedged"
    servers = pool.servers()

    def drain(name, check_mode=False, **kw):
        params = dict(
            socket=pool.sock,
            backend="vllm_pool",
            name=name,
            address="127.0.0.1",
            port=servers[name]["port"],
            check=False,
            agent_port=agents[name].port,
            agent_address="127.0.0.1",
            agent_interval="500ms",
            state="drained",
            config_file=str(pool.cfg),
            budgeted=True,
        )
        return run_module("haproxy_pool_member", dict(params, **kw), check_mode=check_mode, diff=True)

    wait(lambda: pool.servers()["node1"]["op_state"] == "running" and agents["node1"].asked, "node1's agent check")
    held = drain("node1")
    assert held["held_for_decider"] == "gpu-health-failed" and not held["changed"] and not held["commands"], held
    assert pool.states()["node1"] == "ready"
    assert drain("node1", check_mode=True)["held_for_decider"] == "gpu-health-failed"
    # not held: drained
    for name in ("node2", "node3"):
        res = drain(name)
        assert res["changed"] and res["held_for_decider"] is None and pool.states()[name] == "drain", res
    # without budgeted, a held server is drained too
    res = drain("node1", budgeted=False)
    assert res["changed"] and pool.states()["node1"] == "drain"


def load_recycler(monkeypatch, config):
    """worker_recycle's node agent (gpufleet_worker_recycle.py, loaded as its unit tests load it)
    with this config, systemctl faked (the node's HAProxy agent socket active)."""
    from ansible_collections.gpufleet.node.plugins.module_utils.common import _atomic, _http
    from ansible_collections.gpufleet.node.plugins.module_utils.lb import _budget
    from tests.unit.test_vllm_metrics_recycle import load_agent

    module = load_agent()
    monkeypatch.setattr(module, "systemctl", lambda *a, check=True: "active\n")
    return module, module.Agent(config, None, None, None, _http, _atomic, budget=_budget)


def test_a_recycle_waits_for_the_deciders_drain_or_defers(lab, tmp_path, monkeypatch):
    """worker_recycle's drain where the pool has a decider: the node's agent holds it
    (`up #hold-recycle`, what the real agent answers for its recycle request: test_lb_agent_budget),
    and the recycle goes on once the decider's metrics say it drained the node; with the budget
    spent it is deferred, its request withdrawn; metrics that cannot be read are no drain."""
    pool, agents, decider = lab
    decider.configure(window=300.0)  # node2's refusal below holds however long the steps take
    decider.start()
    request = tmp_path / "request.json"

    def recycle(server, wait, url=None):
        config = {
            "balancer": {
                "method": "agent",
                "request_file": str(request),
                "settle": 0,
                "decider": {
                    "url": url or "http://127.0.0.1:%d/metrics" % decider.port,
                    "backend": "vllm_pool",
                    "server": server,
                    "wait": wait,
                },
            }
        }
        module, agent = load_recycler(monkeypatch, config)
        return module, agent

    module, node1 = recycle("node1", BOUND)
    agents["node1"].line = "up #hold-recycle"
    node1.balancer("drain")
    assert drained(pool) == ["node1"] and json.loads(request.read_text())["state"] == "drain"
    assert decider.series("gpufleet_pool_budget_held") == {"node1": 1.0}

    # one drain of four within the window: node2's recycle is refused for now, and deferred
    module, node2 = recycle("node2", 5)
    agents["node2"].line = "up #hold-recycle"
    with pytest.raises(module.Deferred, match=r"the pool's budget refused the drain for now \(recycle\) within 5s"):
        node2.balancer("drain")
    assert not request.exists() and drained(pool) == ["node1"]

    module, node3 = recycle("node3", 1, url="http://127.0.0.1:%d/metrics" % free_port())
    with pytest.raises(module.Deferred, match="cannot read http://127.0.0.1"):
        node3.balancer("drain")
    assert not request.exists()


def test_a_malformed_state_stops_the_decider(lab, tmp_path):
    _pool, _agents, decider = lab
    decider.state.parent.mkdir(parents=True, exist_ok=True)
    decider.state.write_text("{not json")
    proc = subprocess.run(
        [sys.executable, str(decider.script), "--config", str(decider.config), "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and "not a pool decider state" in proc.stderr, proc.stderr
    assert decider.state.read_text() == "{not json"


def test_an_unreachable_balancer_is_a_failed_poll(tmp_path):
    decider = Decider(tmp_path, tmp_path / "no.sock")
    proc = subprocess.run(
        [sys.executable, str(decider.script), "--config", str(decider.config), "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1 and "cannot read backend vllm_pool" in proc.stderr, proc.stderr
    assert not os.path.exists(decider.state)
