# -*- coding: utf-8 -*-
# Copyright: gpufleet.node developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The pool's removal budget: the one place that decides whether a node that still serves but
reports a fault (its GPU health failed, its gate failed on a re-check) leaves the pool.

The node's HAProxy agent answers ``up #hold-<word>`` for such a fault where the pool has a decider
(``--budgeted``): HAProxy keeps the server in, and the decider (gpufleet-pool-decider on the
balancer host, role pool_decider) drains it when the budget allows: at most ``fraction`` of the
backend's servers (rounded down) drained by the decider within any ``window`` seconds, and at least
``min_kept`` servers left in rotation (as NVSentinel stops cordoning past a share of the nodes in a
window). A fault on every node at once thus drains one share, then the next as the window frees:
time for the alert on the refusals to reach someone before a false alarm empties the pool, and
``min_kept`` bounds how far it can go. What the budget refuses stays pending (node and reason), is
counted and retried at every poll until the budget frees. A node
that cannot serve (its engine is wedged or down, its marker missing...) answers ``down`` and
leaves at once through HAProxy's own agent check, whatever the budget: the decider never sees it
as a candidate, and counts it out of rotation for the ``min_kept`` rule.

The decider lifts only the drains it made itself (``set server B/S state ready`` once the agent
says plain ``up``): an operator's drain or maintenance is never touched. Its state (what it
drained, when and why; the refused removals; which HAProxy process it last read) is a JSON file
written atomically (common/_atomic), so that a restart keeps it; a file that cannot be read as
that state is an error, never a silent reset (the decider would forget which servers it drained).

A restart or reload of HAProxy starts every server from its configuration file, which cannot say
``drain``: the servers the decider held are back in rotation. The decider tells that from an
operator's ``set server ... state ready`` by the process that answers (``show info``: its ``Pid``
and start time) and drains them again, as the drains they already were (no second share of the
budget, the same ``since``), while ``min_kept`` allows.

Plain Python 3.8+ standard library, no Ansible: run on the balancer by the decider's daemon from
the copy of module_utils its role installs, and by the unit tests.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.gpufleet.node.plugins.module_utils.common import _atomic

DEFAULT_FRACTION = 0.25
DEFAULT_MIN_KEPT = 1
DEFAULT_WINDOW = 600.0
DEFAULT_INTERVAL = 2.0
STATE_VERSION = 1
#: The agent's prefix of a budgeted fault: ``up #hold-gpu-health-failed``.
HOLD = "hold-"


class BudgetError(ValueError):
    """A budget, a configuration or a state file the decider cannot work with; the message says
    which, where and what to do."""


# --- the budget ------------------------------------------------------------------------------------
class Budget:
    """At most ``fraction`` of the servers (rounded down) drained by the decider within any
    ``window`` seconds (a drain counts for the window after it was made); at least ``min_kept`` in
    rotation."""

    def __init__(self, fraction=DEFAULT_FRACTION, min_kept=DEFAULT_MIN_KEPT, window=DEFAULT_WINDOW):
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
            raise BudgetError("the budget's fraction must be a number from 0 to 1, not %r" % (fraction,))
        if isinstance(min_kept, bool) or not isinstance(min_kept, int) or min_kept < 0:
            raise BudgetError(
                "the budget's min_kept must be a whole number of servers, 0 or more, not %r" % (min_kept,)
            )
        if isinstance(window, bool) or not isinstance(window, (int, float)) or window < 0:
            raise BudgetError("the budget's window must be seconds, 0 or more, not %r" % (window,))
        self.fraction = float(fraction)
        self.min_kept = min_kept
        self.window = float(window)

    def limit(self, servers):
        """How many of ``servers`` the decider may drain within one window: the fraction, rounded
        down, and never so many that fewer than ``min_kept`` would be left."""
        # a small epsilon: 0.25 * 4 must be 1, not 0.9999...
        share = int(math.floor(self.fraction * servers + 1e-9))
        return max(0, min(share, servers - self.min_kept))


# --- what the agent says ----------------------------------------------------------------------------
def parse_answer(line):
    """``(kind, word)`` of one line of the node's agent: ``("hold", WORD)`` for ``up #hold-WORD``,
    ``("up", None)`` for a plain ``up`` (``ready up`` too), ``("down", WORD)`` for an answer that
    takes the server out by itself (``down #WORD``, ``drain ...``, ``maint ...``, ``stopped``,
    ``fail``), ``("none", None)`` for no answer (None or empty)."""
    if not line or not line.strip():
        return "none", None
    head, _sep, description = line.strip().partition("#")
    words = head.replace(",", " ").lower().split()
    description = description.strip()
    if any(w in ("down", "drain", "maint", "stopped", "fail", "failed") for w in words):
        return "down", description or (words[0] if words else "down")
    if "up" in words:
        if description.startswith(HOLD) and len(description) > len(HOLD):
            return "hold", description[len(HOLD) :]
        return "up", None
    return "none", None


# --- the state -------------------------------------------------------------------------------------
class State:
    """What the decider did and is waiting for.

    held: {server: {"reason", "since"}}: the servers it drained itself (only those it ever lifts);
    drains: [{"server", "at"}]: its drains within the window (what the budget counts);
    pending: {server: {"reason", "since"}}: removals the budget refused, retried every poll;
    refused: {(server, reason): count}: refusals so far (a counter: a removal counts once each
    time it becomes pending);
    haproxy: {"pid", "started"} of the HAProxy process the last poll read (:func:`haproxy_process`),
    or None before the first (a state file of an earlier release has none).
    Times are epoch seconds (a restart keeps their meaning).
    """

    def __init__(self, backend, held=None, drains=None, pending=None, refused=None, haproxy=None):
        self.backend = backend
        self.held = dict(held or {})
        self.drains = list(drains or [])
        self.pending = dict(pending or {})
        self.refused = dict(refused or {})
        self.haproxy = haproxy

    def to_dict(self):
        return {
            "version": STATE_VERSION,
            "backend": self.backend,
            "held": self.held,
            "drains": self.drains,
            "pending": self.pending,
            "refused": [
                {"server": server, "reason": reason, "count": count}
                for (server, reason), count in sorted(self.refused.items())
            ],
            "haproxy": self.haproxy,
        }

    def dump(self):
        return json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data, backend, where="the state"):
        def bad(what):
            return BudgetError(
                "%s is not a pool decider state: %s; repair it or move it away to start afresh (the "
                "decider then forgets which servers it drained: lift those with `set server %s/NAME "
                "state ready`)" % (where, what, backend)
            )

        if not isinstance(data, dict):
            raise bad("not a JSON object")
        if data.get("version") != STATE_VERSION:
            raise bad("version %r, not %d" % (data.get("version"), STATE_VERSION))
        if data.get("backend") != backend:
            raise bad("it is the state of backend %r, not %r" % (data.get("backend"), backend))

        def records(key, fields):
            value = data.get(key)
            if not isinstance(value, dict):
                raise bad("%s is not an object" % key)
            for server, record in value.items():
                if not isinstance(record, dict) or not all(f in record for f in fields):
                    raise bad("%s[%r] lacks %s" % (key, server, " or ".join(fields)))
                if not isinstance(record["reason"], str) or not _is_number(record["since"]):
                    raise bad("%s[%r] needs a reason (text) and since (epoch seconds)" % (key, server))
            return value

        held = records("held", ("reason", "since"))
        pending = records("pending", ("reason", "since"))
        drains = data.get("drains")
        if not isinstance(drains, list) or not all(
            isinstance(d, dict) and isinstance(d.get("server"), str) and _is_number(d.get("at")) for d in drains
        ):
            raise bad("drains is not a list of {server, at}")
        refused = {}
        listed = data.get("refused")
        if not isinstance(listed, list):
            raise bad("refused is not a list")
        for entry in listed:
            if not (
                isinstance(entry, dict)
                and isinstance(entry.get("server"), str)
                and isinstance(entry.get("reason"), str)
                and isinstance(entry.get("count"), int)
                and not isinstance(entry.get("count"), bool)
            ):
                raise bad("refused holds an entry that is not {server, reason, count}")
            refused[(entry["server"], entry["reason"])] = entry["count"]
        haproxy = data.get("haproxy")
        if haproxy is not None and not (
            isinstance(haproxy, dict)
            and isinstance(haproxy.get("pid"), int)
            and not isinstance(haproxy.get("pid"), bool)
            and _is_number(haproxy.get("started"))
        ):
            raise bad("haproxy is not {pid, started}")
        return cls(backend, held, drains, pending, refused, haproxy)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def load(path, backend):
    """The state saved at ``path``, or an empty one where there is no file yet. A file that cannot
    be read, or is not a state of ``backend``, raises BudgetError (never a silent reset)."""
    try:
        with open(path) as handle:
            text = handle.read()
    except FileNotFoundError:
        return State(backend)
    except OSError as exc:
        raise BudgetError("cannot read the pool decider's state %s: %s" % (path, exc.strerror or exc)) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BudgetError(
            "%s is not a pool decider state: not JSON (%s); repair it or move it away to start afresh (the "
            "decider then forgets which servers it drained: lift those with `set server %s/NAME state "
            "ready`)" % (path, exc, backend)
        ) from None
    return State.from_dict(data, backend, where=path)


def save(path, state):
    """Write ``state`` to ``path`` atomically (a reader sees the old state or the new one)."""
    _atomic.write(path, state.dump(), 0o600)


# --- the decision ------------------------------------------------------------------------------------
def in_rotation(server):
    """Whether HAProxy sends traffic to the server (admin state ready, operational state running),
    from one entry of the runtime API's ``show servers state`` (lb/_haproxy.RuntimeAPI.servers)."""
    return server.get("state") == "ready" and server.get("op_state") == "running"


#: Seconds two readings of one HAProxy process's start time may differ by (``Uptime_sec`` counts
#: whole seconds, and a poll takes a while).
START_TOLERANCE = 30.0


def haproxy_process(info, now):
    """``{"pid", "started"}`` of the HAProxy process that answered ``show info`` (``info``:
    lb/_haproxy.RuntimeAPI.info): its ``Pid`` and its start, ``Start_time_sec`` where HAProxy
    reports it (2.8 and later), else ``now`` less ``Uptime_sec``."""
    try:
        pid = int(info["Pid"])
        started = float(info["Start_time_sec"]) if "Start_time_sec" in info else now - float(info["Uptime_sec"])
    except (KeyError, ValueError) as exc:
        raise BudgetError("HAProxy's `show info` gives no Pid and Uptime_sec (%s): %r" % (exc, info)) from None
    return {"pid": pid, "started": round(started, 1)}


def restarted(before, process):
    """Whether ``process`` (haproxy_process) is another HAProxy than ``before`` (None: unknown, as
    on the first poll: not a restart)."""
    if before is None:
        return False
    return before["pid"] != process["pid"] or abs(before["started"] - process["started"]) > START_TOLERANCE


def spent(state, budget, now):
    """The servers that count against the budget: those the decider drained within the window
    (held still or returned since: a drain is spent when it is made)."""
    return {d["server"] for d in state.drains if now - d["at"] < budget.window}


class Plan:
    """What one poll decides: ``drain`` and ``refuse`` as [(server, reason)], ``ready`` as
    [server] (a drain of the decider's to lift), ``redrain`` as [server] (a drain of the decider's
    that a restart of HAProxy undid, made again), ``forget`` as [(server, why)] (a server the
    decider no longer holds: gone from the backend, or put in another state by an operator),
    ``unanswered`` as [server] (a pending removal whose agent did not answer this poll: it stays
    pending, as it was, and is neither a new refusal nor withdrawn)."""

    def __init__(self, servers, budget):
        self.servers = servers
        self.limit = budget.limit(servers)
        self.min_kept = budget.min_kept
        self.window = budget.window
        self.drain = []
        self.refuse = []
        self.ready = []
        self.redrain = []
        self.forget = []
        self.unanswered = []

    def __repr__(self):
        return "Plan(drain=%r, refuse=%r, ready=%r, redrain=%r, forget=%r, unanswered=%r)" % (
            self.drain,
            self.refuse,
            self.ready,
            self.redrain,
            self.forget,
            self.unanswered,
        )


def decide(state, servers, answers, budget, now, haproxy_restarted=False):
    """The plan of one poll.

    servers: {name: server} of the backend (RuntimeAPI.servers: ``state``, ``op_state``);
    answers: {name: (kind, word)} of each server's agent (parse_answer; a server with no agent or
    no answer is ``("none", None)``); haproxy_restarted: another HAProxy process answers than at
    the last poll (:func:`restarted`). Nothing is changed here (see apply).
    """
    plan = Plan(len(servers), budget)

    def kind(name):
        return answers.get(name, ("none", None))[0]

    def serving(name):  # in rotation, and its agent does not take it out by itself
        return in_rotation(servers[name]) and kind(name) != "down"

    undone = []  # held servers that HAProxy's restart put back in rotation
    for name in sorted(state.held):
        server = servers.get(name)
        if server is None:
            plan.forget.append((name, "gone from backend %s" % state.backend))
        elif server.get("state") == "ready" and haproxy_restarted and kind(name) != "up":
            undone.append(name)
        elif server.get("state") != "drain":
            # an operator changed it (maint, ready): theirs from now on
            plan.forget.append((name, "its state is %s now, set by someone else" % server.get("state")))
        elif kind(name) == "up":
            plan.ready.append(name)
    left = sum(1 for name in servers if serving(name))
    for name in undone:
        if not serving(name) or left - 1 >= budget.min_kept:
            plan.redrain.append(name)
            left -= 1 if serving(name) else 0
        else:  # a candidate again, refused below like any other that min_kept stops
            plan.forget.append((name, "HAProxy restarted, and draining it again would leave too few in rotation"))
    counted = spent(state, budget, now)
    holding = set(state.held) - {name for name, _why in plan.forget}
    candidates = [
        (name, answers[name][1])
        for name, server in servers.items()
        if name not in holding and in_rotation(server) and kind(name) == "hold"
    ]
    # the removals refused earliest go first, then by name
    candidates.sort(key=lambda c: (state.pending[c[0]]["since"] if c[0] in state.pending else now, c[0]))
    for name, reason in candidates:
        # a server drained again within the window (its drain was lifted by someone else, or
        # HAProxy restarted from its config) is counted once
        if (name in counted or len(counted) < plan.limit) and left - 1 >= budget.min_kept:
            plan.drain.append((name, reason))
            counted.add(name)
            left -= 1
        else:
            plan.refuse.append((name, reason))
    # an agent that did not answer (timed out, restarting) has not withdrawn its hold
    plan.unanswered = sorted(n for n in state.pending if n in servers and in_rotation(servers[n]) and kind(n) == "none")
    return plan


def apply(state, plan, set_state, now, log=None):
    """Carry out ``plan`` with ``set_state(server, "drain"|"ready")`` (raises on failure: that
    server is left as it was and tried again at the next poll) and update ``state``. Returns
    whether the state changed (so that it is saved) and the list of refusals new in this poll."""
    log = log or (lambda _message: None)
    before = state.dump()
    for name, why in plan.forget:
        state.held.pop(name, None)
        log("no longer holding %s/%s: %s" % (state.backend, name, why))
    for name in plan.ready:
        try:
            set_state(name, "ready")
        except Exception as exc:  # the runtime API refused or is gone: next poll
            log("could not return %s/%s: %s" % (state.backend, name, exc))
            continue
        reason = state.held.pop(name)["reason"]
        log("returned %s/%s to rotation: its agent says up (held for %s)" % (state.backend, name, reason))
    for name in plan.redrain:
        try:
            set_state(name, "drain")
        except Exception as exc:
            log("could not drain %s/%s again after HAProxy's restart: %s" % (state.backend, name, exc))
            continue
        log(
            "drained %s/%s again: HAProxy restarted from its configuration, which cannot keep a drain "
            "(held for %s since %d)" % (state.backend, name, state.held[name]["reason"], state.held[name]["since"])
        )
    for name, reason in plan.drain:
        try:
            set_state(name, "drain")
        except Exception as exc:
            log("could not drain %s/%s (%s): %s" % (state.backend, name, reason, exc))
            continue
        state.held[name] = {"reason": reason, "since": now}
        state.drains.append({"server": name, "at": now})
        state.pending.pop(name, None)
        log(
            "drained %s/%s: %s (%d of at most %d drains within %g s)"
            % (state.backend, name, reason, len(spent(state, plan, now)), plan.limit, plan.window)
        )
    new = []
    refused_now = {name for name, _reason in plan.refuse}
    for name, reason in plan.refuse:
        known = state.pending.get(name)
        if known and known["reason"] == reason:
            continue
        state.pending[name] = {"reason": reason, "since": known["since"] if known else now}
        state.refused[(name, reason)] = state.refused.get((name, reason), 0) + 1
        new.append((name, reason))
        log(
            "refused to drain %s/%s: %s; the budget allows %d drains of its %d servers within %g s (and "
            "%d kept in rotation): retried at every poll"
            % (state.backend, name, reason, plan.limit, plan.servers, plan.window, plan.min_kept)
        )
    for name in [n for n in state.pending if n not in refused_now and n not in plan.unanswered]:
        del state.pending[name]
    # drains older than the window no longer count
    state.drains = [d for d in state.drains if now - d["at"] < plan.window]
    return state.dump() != before, new


# --- asking the nodes' agents ----------------------------------------------------------------------------
MAX_ANSWER = 512  # bytes of an agent's answer read at most (one short line)


def ask_agent(address, port, timeout=2.0):
    """One line of the agent at ``address:port`` (its protocol: connect, read one line), or None
    when it does not answer within ``timeout`` seconds (refused, silent, unreachable)."""
    deadline = time.monotonic() + timeout
    data = b""
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            while b"\n" not in data and len(data) < MAX_ANSWER:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                sock.settimeout(left)
                chunk = sock.recv(MAX_ANSWER)
                if not chunk:
                    break
                data += chunk
    except OSError:  # socket.timeout is one
        return None
    line = data.decode("ascii", "replace").splitlines()
    return line[0] if line else None


def ask_all(servers, timeout=2.0, ask=ask_agent, workers=16):
    """{name: line or None} of every server's agent (its agent address, else the server's; a
    server without an agent port has none), asked concurrently."""
    targets = {
        name: (s.get("agent_address") or s["address"], s["agent_port"])
        for name, s in servers.items()
        if s.get("agent_port")
    }
    answers = dict.fromkeys(servers)
    if targets:
        with ThreadPoolExecutor(max_workers=min(workers, len(targets))) as pool:
            futures = {name: pool.submit(ask, addr, port, timeout) for name, (addr, port) in targets.items()}
            for name, future in futures.items():
                answers[name] = future.result()
    return answers


# --- one poll ------------------------------------------------------------------------------------------
class Decider:
    """The decider's loop body: read the backend (``api``: lb/_haproxy.RuntimeAPI), ask the agents
    (``ask``: servers -> {name: line}), decide, apply, save. ``snapshot`` is what the metrics say."""

    def __init__(self, config, api, ask=None, clock=time.time, log=None):
        self.backend = config["backend"]
        self.budget = config["budget"]
        self.state_file = config["state_file"]
        self.api = api
        timeout = config.get("agent_timeout", 2.0)
        self.ask = ask or (lambda servers: ask_all(servers, timeout))
        self.clock = clock
        self.log = log or (lambda _message: None)
        self.state = load(self.state_file, self.backend)
        self.unsaved = False
        self.snapshot = self._snapshot(None)

    def poll(self):
        """One poll; returns its plan. HAProxy's errors (lb/_haproxy.HAProxyError) propagate: the
        caller logs them and polls again."""
        now = self.clock()
        process, servers = self._read(now)
        answers = {name: parse_answer(line) for name, line in self.ask(servers).items()}
        again = restarted(self.state.haproxy, process)
        plan = decide(self.state, servers, answers, self.budget, now, again)
        changed, _new = apply(
            self.state, plan, lambda name, to: self.api.set_state(self.backend, name, to), now, self.log
        )
        if again:
            self.log("HAProxy restarted (pid %d, was %d)" % (process["pid"], self.state.haproxy["pid"]))
        if again or self.state.haproxy is None:
            self.state.haproxy = process
            changed = True
        self.snapshot = self._snapshot(len(servers))
        # a save that failed (OSError: the disk, the directory) is tried again at every poll
        self.unsaved = self.unsaved or changed
        if self.unsaved:
            save(self.state_file, self.state)
            self.unsaved = False
        return plan

    def _read(self, now, tries=3):
        """HAProxy's process and the backend's servers as that one process has them: a restart
        between the two reads (the servers of the new process, all of them ready, taken for the
        old one's) is read again."""
        for _try in range(tries):
            process = haproxy_process(self.api.info(), now)
            servers = self.api.servers(self.backend)
            if haproxy_process(self.api.info(), now)["pid"] == process["pid"]:
                return process, servers
        raise BudgetError("HAProxy's process changed at each of %d reads of backend %s" % (tries, self.backend))

    def _snapshot(self, servers):
        return {
            "backend": self.backend,
            "servers": servers,
            "limit": None if servers is None else self.budget.limit(servers),
            "held": {n: r["reason"] for n, r in self.state.held.items()},
            "pending": {n: r["reason"] for n, r in self.state.pending.items()},
            "refused": dict(self.state.refused),
        }


# --- what the decider says of a server (read by the nodes) -------------------------------------------------
#: The decider's series of one server: 1 while it holds the server drained / while a removal waits.
HELD_SERIES = "gpufleet_pool_budget_held"
PENDING_SERIES = "gpufleet_pool_budget_pending"


def standing(text, backend, server):
    """What the decider's metrics (the text of its ``/metrics``) say of one server of ``backend``:
    ``("held", reason)`` (it drained the server), ``("pending", reason)`` (the budget refused the
    removal for now) or ``(None, None)`` (neither: not judged yet). Parsed by prometheus_client's
    parser, by name and labels; text that is not an exposition raises ValueError."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if (
                    sample.name in (HELD_SERIES, PENDING_SERIES)
                    and labels.get("backend") == backend
                    and labels.get("server") == server
                    and sample.value == 1
                ):
                    found[sample.name] = labels.get("reason", "")
    except (TypeError, IndexError) as exc:
        raise ValueError("not Prometheus text exposition: %s" % exc) from None
    if HELD_SERIES in found:
        return "held", found[HELD_SERIES]
    if PENDING_SERIES in found:
        return "pending", found[PENDING_SERIES]
    return None, None


# --- the configuration --------------------------------------------------------------------------------
CONFIG_KEYS = {
    "_comment": str,
    "backend": str,
    "socket": str,
    "state_file": str,
    "fraction": (int, float),
    "min_kept": int,
    "window": (int, float),
    "interval": (int, float),
    "metrics_address": str,
    "metrics_port": int,
    "agent_timeout": (int, float),
}


def load_config(path):
    """The decider's configuration (JSON written by role pool_decider), checked."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        raise BudgetError("cannot read the pool decider's configuration %s: %s" % (path, exc)) from None
    if not isinstance(data, dict):
        raise BudgetError("the pool decider's configuration %s is not a JSON object" % path)
    missing = sorted(k for k in ("backend", "socket", "state_file") if not data.get(k))
    if missing:
        raise BudgetError("the pool decider's configuration %s lacks %s" % (path, ", ".join(missing)))
    unknown = sorted(set(data) - set(CONFIG_KEYS))
    if unknown:
        raise BudgetError("the pool decider's configuration %s has unknown keys %s" % (path, ", ".join(unknown)))
    for key, kind in CONFIG_KEYS.items():
        if key in data and (isinstance(data[key], bool) or not isinstance(data[key], kind)):
            raise BudgetError(
                "the pool decider's configuration %s: %s is %r, of the wrong type" % (path, key, data[key])
            )
    config = {
        "fraction": DEFAULT_FRACTION,
        "min_kept": DEFAULT_MIN_KEPT,
        "window": DEFAULT_WINDOW,
        "interval": DEFAULT_INTERVAL,
        "metrics_address": "",
        "metrics_port": 0,
        "agent_timeout": 2.0,
    }
    config.update(data)
    if config["interval"] <= 0 or config["agent_timeout"] <= 0:
        raise BudgetError("the pool decider's configuration %s: interval and agent_timeout must be above 0" % path)
    if not 0 <= config["metrics_port"] < 65536:
        raise BudgetError("the pool decider's configuration %s: metrics_port must be 0 (none) to 65535" % path)
    config["budget"] = Budget(config["fraction"], config["min_kept"], config["window"])
    config["state_file"] = os.path.abspath(config["state_file"])
    return config
