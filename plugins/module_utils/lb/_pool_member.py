# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""One server of an HAProxy backend taken to the state asked (``haproxy_pool_member``): the plan of
runtime-API commands, their application with the roll-back of a half-done add, the wait for
HAProxy to report the server UP, and the config-file edit staged beside the file, checked and put
in place last.

Plain Python 3 standard library, no Ansible: the module parses its arguments and calls
``reconcile``; the runtime-API client and the config lines are ``_haproxy``'s.
"""

from __future__ import annotations

import os
import tempfile
import time

from ansible_collections.gpufleet.node.plugins.module_utils.lb import _budget
from ansible_collections.gpufleet.node.plugins.module_utils.lb._haproxy import (
    HAProxyError,
    RuntimeAPI,
    check_address,
    check_name,
    check_port,
    check_time,
    config_with_server,
    describe_view,
    server_line,
    server_spec,
)


class MemberError(Exception):
    """The task fails: the message, and the result it returns (``before``, ``after``, ...)."""

    def __init__(self, msg, **result):
        super().__init__(msg)
        self.result = result


def _removal(current, target):
    return ([] if current["state"] == "maint" else [f"set server {target} state maint"]) + [f"del server {target}"]


def plan(current, want, backend, name, address, port, check, agent=None):
    """Runtime API commands that take the server from `current` to `want`.

    agent: {"address", "port", "interval"} of the node's agent, or None for no agent check.
    """
    target = f"{backend}/{name}"
    if want == "absent":
        return [] if current is None else _removal(current, target)
    cmds = []
    if current is not None and bool(current.get("agent_port")) != bool(agent):
        # an agent check cannot be added to (or taken from) a server at runtime: replace it
        cmds, current = _removal(current, target), None
    if current is not None and (current["address"], current["port"]) != (address, port):
        cmds.append(f"set server {target} addr {address} port {port}")
    if current is not None and agent:
        if current.get("agent_address") != agent["address"]:
            cmds.append(f"set server {target} agent-addr {agent['address']}")
        if current.get("agent_port") != agent["port"]:
            cmds.append(f"set server {target} agent-port {agent['port']}")
    if current is None:
        cmds.append(f"add server {backend}/{server_spec(name, address, port, check, agent)}")
        if check:
            cmds.append(f"enable health {target}")
        if agent:
            cmds.append(f"enable agent {target}")
    wanted_state = "ready" if want == "present" else "drain"
    if current is None or current["state"] != wanted_state:
        cmds.append(f"set server {target} state {wanted_state}")
    return cmds


def apply(api, cmds, backend, name, drain_timeout):
    """Send `cmds`; roll back a server this run added if a later command fails."""
    added = False  # only a server this run added is rolled back (not one it replaced)
    for cmd in cmds:
        try:
            if cmd.startswith("del server"):
                _delete_when_idle(api, cmd, drain_timeout)
            else:
                api.run(cmd)
        except HAProxyError:
            if added:
                _roll_back(api, f"{backend}/{name}")
            raise
        added = added or cmd.startswith("add server")


def _roll_back(api, target):
    """Delete a server this run added. A failure here is not raised: the error that made the
    roll-back necessary is the one to report, and the module's `after` shows what is left."""
    for cmd in (f"set server {target} state maint", f"del server {target}"):
        try:
            api.run(cmd)
        except HAProxyError:
            continue


def _delete_when_idle(api, cmd, drain_timeout):
    target = cmd.split()[-1]
    deadline = time.monotonic() + drain_timeout
    while True:
        try:
            api.run(cmd)
            return
        except HAProxyError as exc:
            if "connections" not in str(exc) or time.monotonic() > deadline:
                raise
        api.command(f"shutdown sessions server {target}")
        time.sleep(0.5)


def stage_config(path, text, check):
    """Write `text` beside `path` and have HAProxy check it; returns (temporary path, None), or
    (None, failure) when HAProxy refuses the file (the temporary file is then removed).

    mkstemp in the same directory: the final rename is atomic, and the fresh random name (O_EXCL)
    means a symlink planted there is never followed. The old file's mode is set on the
    descriptor. ``check(path, tmp)`` runs HAProxy's own check (``haproxy -c -f``, where the
    binary is there): None when it accepts the file, else the failure (``msg``, ``rc``, ...).
    """
    mode = os.stat(path).st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".haproxy_pool_member.", suffix=".cfg")
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), mode)
            f.write(text)
        refused = check(path, tmp)
        if refused:
            os.unlink(tmp)
            return None, refused
    except BaseException:
        _discard(tmp)
        raise
    return tmp, None


def _discard(tmp):
    if tmp and os.path.exists(tmp):
        os.unlink(tmp)


def _wait_up(api, backend, name, timeout, result):
    """None once HAProxy says the server is UP; otherwise drain it and return why (the message)."""
    try:
        up, view = api.wait_up(backend, name, timeout)
    except HAProxyError as exc:
        up, view = False, None
        seen = f"its view could not be read ({exc})"
    else:
        seen = describe_view(view)
    result["balancer_view"] = view
    if up:
        return None
    target = f"{backend}/{name}"
    try:
        command = api.set_state(backend, name, "drain")
        result["commands"] = result["commands"] + [command]
        result["changed"] = True
        left = "it is drained"
    except HAProxyError as exc:
        left = f"draining it failed too ({exc})"
    return (
        f"HAProxy does not report {target} UP after {timeout:g}s: {seen}. {left}, and the configuration "
        f"file was not changed. Check that the balancer reaches the server's address and port (and "
        f"its agent), e.g. a firewall or a wrong lb_registration_address."
    )


def _servers_or_none(api, backend, name):
    try:
        return api.servers(backend).get(name)
    except HAProxyError:
        return None


def _predicted(before, p, agent):
    if p["state"] == "absent":
        return None
    state = "ready" if p["state"] == "present" else "drain"
    op_state = before["op_state"] if before else "stopped"
    return dict(
        name=p["name"],
        address=p["address"],
        port=p["port"],
        state=state,
        op_state=op_state,
        admin_state=0 if state == "ready" else 8,
        agent_address=agent["address"] if agent else None,
        agent_port=agent["port"] if agent else 0,
    )


def _show(server):
    if server is None:
        return "(absent)\n"
    agent = f" agent={server['agent_address']}:{server['agent_port']}" if server.get("agent_port") else ""
    return f"{server['address']}:{server['port']} state={server['state']}{agent}\n"


def _held_for_decider(p, before, agent):
    """The word of a budgeted fault (``gpu-health-failed``...) where the pool's decider, not this
    run, is to drain the server: ``budgeted`` asked, a drain asked, the server in rotation, and its
    agent answering ``up #hold-WORD`` (lb/_budget.parse_answer) now. None otherwise: the drain is
    made."""
    if not (p.get("budgeted") and p["state"] == "drained" and agent and before is not None):
        return None
    if not _budget.in_rotation(before):
        return None
    kind, word = _budget.parse_answer(_budget.ask_agent(agent["address"], agent["port"], timeout=p["timeout"]))
    return word if kind == "hold" else None


def reconcile(p, check_mode, want_diff, check):
    """Take the server to ``p["state"]`` (the module's options ``p``); returns the result, or raises
    MemberError with the message and the result of a failed task. Nothing changes in check mode.
    ``check(path, tmp)``: HAProxy's check of a new config file (see ``stage_config``)."""
    nothing = dict(before=None, after=None, commands=[], config_changed=False)
    # Every value that reaches the runtime API or the config file is checked before either is used.
    try:
        backend, name = check_name("backend", p["backend"]), check_name("server", p["name"])
        for key in ("port", "agent_port"):
            if p[key] is not None:
                check_port(key, p[key])
        if p["address"] is not None:
            check_address("address", p["address"])
        if p["agent_address"] is not None:
            check_address("agent_address", p["agent_address"])
        check_time("agent_interval", p["agent_interval"])
        api = RuntimeAPI(os.path.abspath(p["socket"]), timeout=p["timeout"])
    except HAProxyError as exc:
        raise MemberError(f"nothing changed: {exc}", **nothing) from None
    agent = None
    if p["agent_port"] and p["state"] != "absent":
        agent = dict(address=p["agent_address"] or p["address"], port=p["agent_port"], interval=p["agent_interval"])

    try:
        before = api.servers(backend).get(name)
    except HAProxyError as exc:
        raise MemberError(f"nothing changed: {exc}", **nothing) from None

    held = _held_for_decider(p, before, agent)
    if held:
        return dict(
            changed=False, before=before, after=before, commands=[], config_changed=False, held_for_decider=held
        )
    port = p["port"]
    if p.get("keep_port") and p["state"] == "drained" and before is not None:
        port = before["port"]  # the port the server has: the run does not know the real one
    cmds = plan(before, p["state"], backend, name, p["address"], port, p["check"], agent)

    config_before = config_after = None
    if p["config_file"]:
        try:
            with open(p["config_file"]) as f:
                config_before = f.read()
            line = None if p["state"] == "absent" else server_line(name, p["address"], port, p["check"], agent)
            config_after = config_with_server(config_before, backend, name, line)
        except (OSError, HAProxyError) as exc:
            raise MemberError(
                f"nothing changed: cannot use HAProxy config {p['config_file']}: {exc}",
                before=before,
                after=before,
                commands=[],
                config_changed=False,
            ) from None
    config_changed = config_before != config_after

    # The new file is checked by HAProxy before anything changes, and put in place last.
    staged = None
    if config_changed and not check_mode:
        staged, refused = stage_config(p["config_file"], config_after, check)
        if refused:
            refused = dict(refused)
            raise MemberError(
                refused.pop("msg"), before=before, after=before, commands=[], config_changed=False, **refused
            )

    after = before
    if cmds and not check_mode:
        try:
            apply(api, cmds, backend, name, p["drain_timeout"])
        except HAProxyError as exc:
            _discard(staged)
            now = _servers_or_none(api, backend, name)
            raise MemberError(
                f"{exc}; the configuration file was not changed",
                before=before,
                after=now,
                commands=cmds,
                config_changed=False,
            ) from None
        after = _servers_or_none(api, backend, name)
    elif cmds:
        after = _predicted(before, dict(p, port=port), agent)

    result = dict(
        changed=bool(cmds) or config_changed,
        before=before,
        after=after,
        commands=cmds,
        config_changed=config_changed,
        held_for_decider=None,
    )
    if p["state"] == "present" and p["up_timeout"] > 0 and not check_mode:
        failure = _wait_up(api, backend, name, p["up_timeout"], result)
        if failure:
            _discard(staged)
            result.update(config_changed=False, after=_servers_or_none(api, backend, name))
            raise MemberError(failure, **result)

    if staged:
        os.replace(staged, p["config_file"])

    if want_diff:
        result["diff"] = [
            dict(
                before=_show(before),
                after=_show(after),
                before_header=f"{backend}/{name} (runtime)",
                after_header=f"{backend}/{name} (runtime)",
            )
        ]
        if config_changed:
            result["diff"].append(
                dict(
                    before=config_before,
                    after=config_after,
                    before_header=p["config_file"],
                    after_header=p["config_file"],
                )
            )
    return result
