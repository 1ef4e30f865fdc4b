# SPDX-License-Identifier: GPL-3.0-or-later
"""The pool's removal budget (module_utils lb/_budget): the decision of each poll, the window, the
servers kept, the state across a restart, and what the decider never touches (an operator's drain)."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.lb import _budget as B

HOLD = ("hold", "gpu-health-failed")
UP = ("up", None)


def server(name, state="ready", op_state="running", agent_port=9777):
    return {
        "name": name,
        "address": "10.0.0.%s" % name[-1],
        "port": 8000,
        "state": state,
        "op_state": op_state,
        "agent_address": None,
        "agent_port": agent_port,
    }


def pool(*names, **states):
    return {n: server(n, states.get(n, "ready")) for n in names}


class Recorder:
    """set_state for apply(): records the commands; fails for the servers in ``refuse``."""

    def __init__(self, refuse=()):
        self.sent, self.refuse = [], set(refuse)

    def __call__(self, name, state):
        if name in self.refuse:
            raise RuntimeError("HAProxy refused it")
        self.sent.append((name, state))


def poll(state, servers, answers, budget, now, set_state=None):
    plan = B.decide(state, servers, answers, budget, now)
    changed, new = B.apply(state, plan, set_state or Recorder(), now)
    return plan, changed, new


@pytest.mark.parametrize(
    "fraction, min_kept, servers, limit",
    [
        (0.25, 1, 4, 1),
        (0.25, 1, 3, 0),
        (0.25, 1, 8, 2),
        (0.5, 1, 2, 1),
        (1.0, 1, 4, 3),
        (1.0, 0, 4, 4),
        (0.25, 1, 0, 0),
    ],
)
def test_limit_rounds_down_and_keeps_servers(fraction, min_kept, servers, limit):
    assert B.Budget(fraction, min_kept, 600).limit(servers) == limit


@pytest.mark.parametrize(
    "kwargs", [{"fraction": 1.5}, {"fraction": "0.25"}, {"min_kept": -1}, {"min_kept": True}, {"window": -1}]
)
def test_a_bad_budget_is_refused(kwargs):
    with pytest.raises(B.BudgetError, match="budget's"):
        B.Budget(**kwargs)


@pytest.mark.parametrize(
    "line, parsed",
    [
        ("up", ("up", None)),
        ("up\n", ("up", None)),
        ("ready up", ("up", None)),
        ("up #hold-gpu-health-failed", ("hold", "gpu-health-failed")),
        ("up #hold-gate-failed", ("hold", "gate-failed")),
        ("down #engine-wedged", ("down", "engine-wedged")),
        ("drain up #recycle", ("down", "recycle")),
        ("maint up #recycle", ("down", "recycle")),
        ("down", ("down", "down")),
        ("up #hold-", ("up", None)),
        ("", ("none", None)),
        (None, ("none", None)),
        ("garbage", ("none", None)),
    ],
)
def test_agent_answers(line, parsed):
    assert B.parse_answer(line) == parsed


def test_four_servers_three_holds_one_drained_two_pending():
    budget = B.Budget(0.25, 1, 600)
    state = B.State("vllm_pool")
    servers = pool("node1", "node2", "node3", "node4")
    answers = {"node1": HOLD, "node2": HOLD, "node3": HOLD, "node4": UP}
    rec = Recorder()
    plan, changed, new = poll(state, servers, answers, budget, 1000.0, rec)
    assert rec.sent == [("node1", "drain")]
    assert plan.drain == [("node1", "gpu-health-failed")] and plan.limit == 1
    assert set(state.held) == {"node1"} and state.held["node1"] == {"reason": "gpu-health-failed", "since": 1000.0}
    assert sorted(state.pending) == ["node2", "node3"] and changed
    assert sorted(new) == [("node2", "gpu-health-failed"), ("node3", "gpu-health-failed")]
    assert state.refused == {("node2", "gpu-health-failed"): 1, ("node3", "gpu-health-failed"): 1}

    # the next poll: node1 is drained now (HAProxy says so); nothing new, the refusals are not recounted
    servers["node1"]["state"] = "drain"
    rec = Recorder()
    plan, changed, new = poll(state, servers, answers, budget, 1002.0, rec)
    assert rec.sent == [] and new == [] and not changed
    assert state.refused == {("node2", "gpu-health-failed"): 1, ("node3", "gpu-health-failed"): 1}
    assert plan.refuse == [("node2", "gpu-health-failed"), ("node3", "gpu-health-failed")]


def test_a_pending_removal_whose_agent_does_not_answer_stays_pending_and_is_not_recounted():
    """An agent that times out once (a loaded node, its socket-activated agent slow to start) has
    not withdrawn its hold: the removal stays pending with its first refusal's time, and its next
    answer is not a new refusal. An answer of plain up withdraws it."""
    budget = B.Budget(0.25, 1, 600)
    state = B.State("vllm_pool")
    servers = pool("node1", "node2", "node3", "node4")
    answers = {"node1": HOLD, "node2": HOLD, "node3": UP, "node4": UP}
    poll(state, servers, answers, budget, 1000.0, Recorder())
    servers["node1"]["state"] = "drain"
    assert state.pending == {"node2": {"reason": "gpu-health-failed", "since": 1000.0}}

    silent = dict(answers, node2=("none", None))
    plan, changed, new = poll(state, servers, silent, budget, 1002.0, Recorder())
    assert plan.unanswered == ["node2"] and plan.refuse == [] and new == [] and not changed
    assert state.pending == {"node2": {"reason": "gpu-health-failed", "since": 1000.0}}
    _plan, _changed, new = poll(state, servers, answers, budget, 1004.0, Recorder())
    assert new == [] and state.refused == {("node2", "gpu-health-failed"): 1}

    _plan, changed, _new = poll(state, servers, dict(answers, node2=UP), budget, 1006.0, Recorder())
    assert changed and state.pending == {}


def test_the_window_passes_then_the_next_pending_is_drained():
    budget = B.Budget(0.25, 1, 30)
    state = B.State("vllm_pool")
    servers = pool("node1", "node2", "node3", "node4")
    answers = {"node1": HOLD, "node2": HOLD, "node3": HOLD, "node4": UP}
    poll(state, servers, answers, budget, 1000.0)
    servers["node1"]["state"] = "drain"
    # node1 comes back (its agent says up): the decider returns it, but its drain still counts
    answers["node1"] = UP
    rec = Recorder()
    poll(state, servers, answers, budget, 1010.0, rec)
    assert rec.sent == [("node1", "ready")] and not state.held
    servers["node1"]["state"] = "ready"
    rec = Recorder()
    poll(state, servers, answers, budget, 1029.0, rec)
    assert rec.sent == [] and sorted(state.pending) == ["node2", "node3"]
    # the window is over: the removal refused first (node2, then by name) goes
    rec = Recorder()
    poll(state, servers, answers, budget, 1030.5, rec)
    assert rec.sent == [("node2", "drain")] and sorted(state.pending) == ["node3"]
    assert [d["server"] for d in state.drains] == ["node2"]  # node1's drain left the window


def test_a_held_server_no_longer_counts_past_the_window():
    """The budget is a number of drains per window: one still held after it does not block the
    next (min_kept bounds how far it goes)."""
    budget = B.Budget(0.25, 1, 30)
    state = B.State("vllm_pool")
    servers = pool("node1", "node2", "node3", "node4")
    answers = {"node1": HOLD, "node2": HOLD, "node3": HOLD, "node4": UP}
    poll(state, servers, answers, budget, 1000.0)
    servers["node1"]["state"] = "drain"
    rec = Recorder()
    poll(state, servers, answers, budget, 1029.9, rec)
    assert rec.sent == [] and sorted(state.pending) == ["node2", "node3"]
    rec = Recorder()
    poll(state, servers, answers, budget, 1030.0, rec)
    assert rec.sent == [("node2", "drain")] and list(state.held) == ["node1", "node2"]
    servers["node2"]["state"] = "drain"
    rec = Recorder()
    poll(state, servers, answers, budget, 1060.0, rec)
    assert rec.sent == [("node3", "drain")] and not state.pending
    servers["node3"]["state"] = "drain"
    # node4 is the last in rotation: never drained, whatever the window
    answers["node4"] = HOLD
    rec = Recorder()
    plan, _c, new = poll(state, servers, answers, budget, 5000.0, rec)
    assert (
        rec.sent == [] and new == [("node4", "gpu-health-failed")] and plan.refuse == [("node4", "gpu-health-failed")]
    )


def test_at_least_one_kept_counting_servers_down_for_other_reasons():
    budget = B.Budget(1.0, 1, 600)
    state = B.State("vllm_pool")
    servers = pool("node1", "node2", "node3", "node4")
    # node3 cannot serve (its agent says down), node4 is in maintenance by an operator
    servers["node4"]["state"] = "maint"
    answers = {"node1": HOLD, "node2": HOLD, "node3": ("down", "engine-wedged"), "node4": UP}
    rec = Recorder()
    plan, _changed, _new = poll(state, servers, answers, budget, 1000.0, rec)
    assert rec.sent == [("node1", "drain")] and plan.refuse == [("node2", "gpu-health-failed")]
    assert list(state.pending) == ["node2"]


def test_a_budget_of_nothing_refuses_all():
    state = B.State("vllm_pool")
    servers = pool("node1", "node2")
    rec = Recorder()
    plan, _c, new = poll(state, servers, {"node1": HOLD, "node2": UP}, B.Budget(0.25, 1, 600), 1.0, rec)
    assert rec.sent == [] and plan.limit == 0 and new == [("node1", "gpu-health-failed")]


def test_an_operators_drain_is_never_lifted():
    budget = B.Budget(0.5, 1, 600)
    state = B.State("vllm_pool")
    servers = pool("node1", "node2", "node3", "node4", node2="drain", node3="maint")
    answers = {"node1": UP, "node2": UP, "node3": UP, "node4": UP}
    rec = Recorder()
    poll(state, servers, answers, budget, 1.0, rec)
    assert rec.sent == [] and not state.held
    # an operator's drain of a holding node: not a candidate, not pending, not counted
    answers["node2"] = HOLD
    poll(state, servers, answers, budget, 2.0, rec)
    assert rec.sent == [] and not state.pending and not state.held


def test_a_drain_the_operator_changed_is_theirs():
    budget = B.Budget(0.5, 1, 600)
    state = B.State("vllm_pool")
    servers = pool("node1", "node2", "node3", "node4")
    answers = {"node1": HOLD, "node2": UP, "node3": UP, "node4": UP}
    poll(state, servers, answers, budget, 1.0)
    servers["node1"]["state"] = "maint"  # the operator put it in maintenance
    answers["node1"] = UP
    rec = Recorder()
    plan, _c, _n = poll(state, servers, answers, budget, 2.0, rec)
    assert rec.sent == [] and not state.held and plan.forget[0][0] == "node1"


def test_a_held_server_returns_when_its_agent_says_up_and_not_before():
    budget = B.Budget(0.5, 1, 600)
    state = B.State("vllm_pool")
    servers = pool("node1", "node2", "node3", "node4")
    answers = {"node1": HOLD, "node2": UP, "node3": UP, "node4": UP}
    poll(state, servers, answers, budget, 1.0)
    servers["node1"]["state"] = "drain"
    for still in (HOLD, ("down", "engine-down"), ("none", None)):
        answers["node1"] = still
        rec = Recorder()
        poll(state, servers, answers, budget, 2.0, rec)
        assert rec.sent == [] and "node1" in state.held, still
    answers["node1"] = UP
    rec = Recorder()
    poll(state, servers, answers, budget, 3.0, rec)
    assert rec.sent == [("node1", "ready")] and not state.held


def test_a_failed_command_is_retried_and_not_recorded():
    budget = B.Budget(0.5, 1, 600)
    state = B.State("vllm_pool")
    servers = pool("node1", "node2", "node3", "node4")
    answers = {"node1": HOLD, "node2": UP, "node3": UP, "node4": UP}
    poll(state, servers, answers, budget, 1.0, Recorder(refuse={"node1"}))
    assert not state.held and not state.drains
    rec = Recorder()
    poll(state, servers, answers, budget, 3.0, rec)
    assert rec.sent == [("node1", "drain")]


def test_a_pending_removal_that_clears_is_forgotten():
    budget = B.Budget(0.25, 1, 600)
    state = B.State("vllm_pool")
    servers = pool("node1", "node2", "node3", "node4")
    answers = {"node1": HOLD, "node2": HOLD, "node3": UP, "node4": UP}
    poll(state, servers, answers, budget, 1.0)
    assert list(state.pending) == ["node2"]
    answers["node2"] = UP
    poll(state, servers, answers, budget, 2.0)
    assert not state.pending and state.refused == {("node2", "gpu-health-failed"): 1}


def test_state_round_trip(tmp_path):
    budget = B.Budget(0.25, 1, 600)
    state = B.State("vllm_pool")
    servers = pool("node1", "node2", "node3", "node4")
    poll(state, servers, {"node1": HOLD, "node2": HOLD, "node3": HOLD, "node4": UP}, budget, 1000.0)
    path = tmp_path / "sub" / "pool-decider.json"
    B.save(str(path), state)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    again = B.load(str(path), "vllm_pool")
    assert again.to_dict() == state.to_dict()
    assert again.held == state.held and again.pending == state.pending and again.refused == state.refused
    # after the restart the decision continues where it was: nothing drained twice, nothing recounted
    servers["node1"]["state"] = "drain"
    rec = Recorder()
    plan, _changed, new = poll(
        again, servers, {"node1": HOLD, "node2": HOLD, "node3": HOLD, "node4": UP}, budget, 1002.0, rec
    )
    assert rec.sent == [] and new == [] and len(plan.refuse) == 2


def test_no_state_file_is_an_empty_state(tmp_path):
    state = B.load(str(tmp_path / "none.json"), "vllm_pool")
    assert state.held == {} and state.pending == {} and state.refused == {}


@pytest.mark.parametrize(
    "text, why",
    [
        ("{not json", "not JSON"),
        ("[]", "not a JSON object"),
        ('{"version": 2, "backend": "vllm_pool"}', "version 2"),
        ('{"version": 1, "backend": "other"}', "backend 'other'"),
        (
            '{"version": 1, "backend": "vllm_pool", "held": [], "pending": {}, "drains": [], "refused": []}',
            "held is not",
        ),
        (
            '{"version": 1, "backend": "vllm_pool", "held": {"node1": {"reason": "x"}}, "pending": {}, "drains": [], "refused": []}',
            "held\\['node1'\\] lacks",
        ),
        (
            '{"version": 1, "backend": "vllm_pool", "held": {}, "pending": {}, "drains": [{"server": "n"}], "refused": []}',
            "drains is not",
        ),
        (
            '{"version": 1, "backend": "vllm_pool", "held": {}, "pending": {}, "drains": [], "refused": [{"server": "n"}]}',
            "refused holds",
        ),
    ],
)
def test_a_malformed_state_is_an_error_not_a_reset(tmp_path, text, why):
    path = tmp_path / "pool-decider.json"
    path.write_text(text)
    with pytest.raises(B.BudgetError, match=why) as err:
        B.load(str(path), "vllm_pool")
    assert str(path) in str(err.value) and "move it away" in str(err.value)
    assert path.read_text() == text  # left as it was


def _agent(line, close_silently=False):
    """A one-line TCP agent on 127.0.0.1 (the node agent's protocol): returns its port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        with listener:
            conn, _addr = listener.accept()
            with conn:
                if not close_silently:
                    conn.sendall(line.encode())

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


def test_ask_agent_reads_one_line():
    assert B.ask_agent("127.0.0.1", _agent("up #hold-gate-failed\n")) == "up #hold-gate-failed"
    assert B.ask_agent("127.0.0.1", _agent("", close_silently=True)) is None


def test_ask_agent_without_an_agent_is_none():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
        assert B.ask_agent("127.0.0.1", port, timeout=1.0) is None


def test_ask_all_skips_servers_without_an_agent():
    servers = {"node1": server("node1"), "node2": server("node2", agent_port=0)}
    servers["node1"]["agent_address"] = "127.0.0.1"
    servers["node1"]["agent_port"] = _agent("up\n")
    assert B.ask_all(servers, 2.0) == {"node1": "up", "node2": None}


def _config(tmp_path, **over):
    data = {"backend": "vllm_pool", "socket": "/run/haproxy/admin.sock", "state_file": str(tmp_path / "s.json")}
    data.update(over)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_config_defaults(tmp_path):
    config = B.load_config(_config(tmp_path))
    assert config["budget"].fraction == 0.25 and config["budget"].min_kept == 1 and config["budget"].window == 600
    assert config["interval"] == 2.0 and config["metrics_port"] == 0


@pytest.mark.parametrize(
    "over, why",
    [
        ({"backend": ""}, "lacks backend"),
        ({"fraction": 2}, "fraction"),
        ({"window": "600"}, "window is '600'"),
        ({"interval": 0}, "interval"),
        ({"metrics_port": 70000}, "metrics_port"),
        ({"budget": 1}, "unknown keys budget"),
    ],
)
def test_a_bad_config_is_refused(tmp_path, over, why):
    with pytest.raises(B.BudgetError, match=why):
        B.load_config(_config(tmp_path, **over))


class FakeAPI:
    """The runtime API of one HAProxy process (``pid``; ``restart()`` starts another, whose servers
    come from the configuration: every drain undone)."""

    def __init__(self, servers, clock=None):
        self._servers, self.sent = servers, []
        self.clock, self.pid, self.started = clock, 4242, 900

    def info(self):
        """As HAProxy 2.8 and later say it (Start_time_sec), or as 2.6 does (Uptime_sec only) where
        the test gives the clock."""
        info = {"Name": "HAProxy", "Pid": str(self.pid)}
        if self.clock is None:
            return dict(info, Uptime_sec="100", Start_time_sec=str(self.started))
        return dict(info, Uptime_sec=str(int(self.clock() - self.started)))

    def restart(self):
        self.pid, self.started = self.pid + 1, self.clock()
        for s in self._servers.values():
            s["state"] = "ready"

    def servers(self, backend):
        assert backend == "vllm_pool"
        return {n: dict(s) for n, s in self._servers.items()}

    def set_state(self, backend, name, state):
        self.sent.append((name, state))
        self._servers[name]["state"] = state


def test_the_decider_saves_its_state_and_a_new_one_continues(tmp_path):
    config = B.load_config(_config(tmp_path, window=30))
    api = FakeAPI(pool("node1", "node2", "node3", "node4"))
    lines = {"node1": "up #hold-xid", "node2": "up #hold-xid", "node3": "up #hold-xid", "node4": "up"}
    clock = iter([1000.0, 1002.0, 1040.0]).__next__
    decider = B.Decider(config, api, ask=lambda servers: {n: lines[n] for n in servers}, clock=clock)
    decider.poll()
    assert api.sent == [("node1", "drain")]
    snap = decider.snapshot
    assert snap["servers"] == 4 and snap["limit"] == 1 and snap["held"] == {"node1": "xid"}
    assert snap["pending"] == {"node2": "xid", "node3": "xid"} and snap["refused"][("node2", "xid")] == 1
    # a restarted decider: the same state, nothing drained again
    again = B.Decider(config, api, ask=lambda servers: {n: lines[n] for n in servers}, clock=clock)
    assert again.state.held == decider.state.held
    again.poll()
    assert api.sent == [("node1", "drain")]
    again.poll()  # the window (30 s) is over: the removal refused first goes, node1 still held
    assert api.sent == [("node1", "drain"), ("node2", "drain")]
    assert again.snapshot["held"] == {"node1": "xid", "node2": "xid"} and again.snapshot["pending"] == {"node3": "xid"}


def test_a_state_that_cannot_be_saved_is_saved_at_the_next_poll(tmp_path):
    blocker = tmp_path / "state"
    config = B.load_config(_config(tmp_path, state_file=str(blocker / "pool-decider.json")))
    api = FakeAPI(pool("node1", "node2", "node3", "node4"))
    lines = {"node1": "up #hold-xid", "node2": "up", "node3": "up", "node4": "up"}
    decider = B.Decider(config, api, ask=lambda servers: {n: lines[n] for n in servers}, clock=lambda: 1000.0)
    blocker.write_text("a file where the state's directory should be")
    with pytest.raises(OSError):
        decider.poll()
    assert api.sent == [("node1", "drain")] and decider.unsaved
    blocker.unlink()
    decider.poll()  # nothing changes in this poll: the state is saved all the same
    assert not decider.unsaved and list(B.load(config["state_file"], "vllm_pool").held) == ["node1"]


def test_a_server_drained_again_within_the_window_counts_once():
    """HAProxy restarted from its config (the server ready again) while the node still holds: the
    decider forgets its old drain and drains it again, without spending a second share."""
    budget = B.Budget(0.25, 1, 600)
    state = B.State("vllm_pool")
    servers = pool("node1", "node2", "node3", "node4")
    answers = {"node1": HOLD, "node2": HOLD, "node3": UP, "node4": UP}
    poll(state, servers, answers, budget, 1000.0)
    servers["node1"]["state"] = "ready"  # the restart
    rec = Recorder()
    plan, _c, _n = poll(state, servers, answers, budget, 1010.0, rec)
    assert plan.forget and rec.sent == [("node1", "drain")] and list(state.pending) == ["node2"]


def test_a_restart_of_haproxy_drains_the_held_servers_again_without_a_second_share(tmp_path):
    """HAProxy restarted from its configuration (which cannot say drain) after the window of the
    first drain passed, while a second drain spends the budget: both are drained again, neither
    counted anew, and the state file names the new process."""
    config = B.load_config(_config(tmp_path, window=30))
    now = [1000.0]
    api = FakeAPI(pool("node1", "node2", "node3", "node4"), clock=lambda: now[0])
    lines = {"node1": "up #hold-xid", "node2": "up", "node3": "up", "node4": "up"}
    decider = B.Decider(config, api, ask=lambda servers: {n: lines[n] for n in servers}, clock=lambda: now[0])
    decider.poll()
    lines["node2"] = "up #hold-gate-failed"
    now[0] = 1040.0  # the first drain's window is over: the second may go
    decider.poll()
    assert api.sent == [("node1", "drain"), ("node2", "drain")]
    assert B.load(config["state_file"], "vllm_pool").haproxy == {"pid": 4242, "started": 900.0}

    now[0] = 1050.0
    api.restart()
    plan = decider.poll()
    assert sorted(plan.redrain) == ["node1", "node2"] and not plan.drain and not plan.refuse, plan
    assert sorted(api.sent[2:]) == [("node1", "drain"), ("node2", "drain")]
    saved = B.load(config["state_file"], "vllm_pool")
    assert saved.haproxy == {"pid": 4243, "started": 1050.0}
    assert saved.held == {
        "node1": {"reason": "xid", "since": 1000.0},
        "node2": {"reason": "gate-failed", "since": 1040.0},
    }
    assert [d["server"] for d in saved.drains] == ["node2"]  # node1's drain is past its window still
    # the next poll of the same process: nothing more
    assert not decider.poll().redrain and len(api.sent) == 4


class RestartingAPI(FakeAPI):
    """HAProxy restarts while the decider reads its servers, ``restarts`` times in a row."""

    def __init__(self, servers, clock, restarts):
        super().__init__(servers, clock)
        self.restarts = restarts

    def servers(self, backend):
        found = super().servers(backend)
        if self.restarts:
            self.restarts -= 1
            self.restart()
            found = super().servers(backend)  # the new process's: every drain undone
        return found


def test_a_restart_between_the_reads_of_a_poll_is_read_again(tmp_path):
    """The servers of a process that started after ``show info`` answered are not taken for the old
    one's (they would read as held servers set ready by an operator, and be forgotten): the poll
    reads again, sees the restart and drains them again."""
    config = B.load_config(_config(tmp_path, window=30))
    now = [1000.0]
    api = RestartingAPI(pool("node1", "node2", "node3", "node4"), lambda: now[0], restarts=0)
    lines = {"node1": "up #hold-xid", "node2": "up", "node3": "up", "node4": "up"}
    decider = B.Decider(config, api, ask=lambda servers: {n: lines[n] for n in servers}, clock=lambda: now[0])
    decider.poll()
    now[0], api.restarts = 1010.0, 1
    plan = decider.poll()
    assert plan.redrain == ["node1"] and not plan.forget and decider.state.held["node1"]["since"] == 1000.0, plan

    api.restarts = 3  # a balancer restarting at every read: an error, the state untouched
    with pytest.raises(B.BudgetError, match="HAProxy's process changed at each of 3 reads of backend vllm_pool"):
        decider.poll()
    assert list(decider.state.held) == ["node1"]


def test_a_held_server_set_ready_without_a_restart_is_the_operators():
    state = B.State("vllm_pool", haproxy={"pid": 1, "started": 900.0})
    budget = B.Budget(0.25, 1, 600)
    servers = pool("node1", "node2", "node3", "node4")
    answers = {"node1": HOLD, "node2": UP, "node3": UP, "node4": UP}
    poll(state, servers, answers, budget, 1000.0)
    servers["node1"]["state"] = "ready"  # an operator's `set server vllm_pool/node1 state ready`
    plan = B.decide(state, servers, answers, budget, 1010.0, haproxy_restarted=False)
    assert plan.forget and not plan.redrain
    # a restart while the node recovered (its agent says up): nothing to drain again
    servers["node1"]["state"] = "ready"
    recovered = dict(answers, node1=UP)
    plan = B.decide(
        B.State("vllm_pool", held={"node1": {"reason": "xid", "since": 1000.0}}),
        servers,
        recovered,
        budget,
        1010.0,
        haproxy_restarted=True,
    )
    assert not plan.redrain and plan.forget


def test_after_a_restart_min_kept_still_holds():
    """Two servers, both held by an earlier decision that min_kept allowed while others served; after
    a restart with one server left serving, only what keeps one in rotation is drained again."""
    budget = B.Budget(1.0, 1, 600)
    held = {"node1": {"reason": "xid", "since": 1000.0}, "node2": {"reason": "xid", "since": 1000.0}}
    state = B.State("vllm_pool", held=held, haproxy={"pid": 1, "started": 900.0})
    servers = pool("node1", "node2")
    answers = {"node1": HOLD, "node2": HOLD}
    plan = B.decide(state, servers, answers, budget, 1010.0, haproxy_restarted=True)
    assert plan.redrain == ["node1"] and plan.refuse == [("node2", HOLD[1])], plan


@pytest.mark.parametrize(
    "info, process",
    [
        ({"Pid": "7", "Uptime_sec": "40"}, {"pid": 7, "started": 960.0}),
        ({"Pid": "7", "Uptime_sec": "40", "Start_time_sec": "955"}, {"pid": 7, "started": 955.0}),
    ],
)
def test_which_haproxy_answers(info, process):
    assert B.haproxy_process(info, 1000.0) == process
    assert not B.restarted(None, process) and not B.restarted(dict(process), process)
    assert B.restarted(dict(process, pid=8), process)
    assert B.restarted(dict(process, started=process["started"] - 100), process)


def test_show_info_without_a_pid_is_an_error():
    with pytest.raises(B.BudgetError, match="no Pid and Uptime_sec"):
        B.haproxy_process({"Name": "HAProxy"}, 1000.0)
