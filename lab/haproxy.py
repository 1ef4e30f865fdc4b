# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab's own reader of HAProxy's runtime API: the pool as HAProxy holds it.

The lab judges what the playbooks left in the balancer, so it reads the pool with code of its
own, not with the collection's runtime-API client (plugins/module_utils/lb/): a bug there must
not hide in the judgement of its own work.  Plain standard library, one command per connection
to the admin socket (HAProxy's non-interactive mode), every answer parsed by its header line
(haproxy doc/management.txt):

* `show servers state BACKEND`: a format version line, then `# be_id be_name srv_id srv_name
  srv_addr srv_op_state srv_admin_state ...` and one space-separated row per server;
* `show stat BACKEND 4 -1` (servers only): CSV under `# pxname,svname,qcur,...`, with the
  checks' view of each server (`status`, `check_status`, `agent_status` ...).

`pool()` joins the two per server.  The test set-up that edits the pool behind the playbooks'
back (`add_server`, `remove_server`, and `config_with_server` for the configuration file) is
here too, so that no test needs the collection's client for it.
"""

from __future__ import annotations

import csv
import re
import socket

# srv_admin_state bits (haproxy include/haproxy/server-t.h, enum srv_admin): forced, inherited,
# configured, resolver and hostname maintenance; forced and inherited drain.
MAINT_BITS = 0x01 | 0x02 | 0x04 | 0x20 | 0x40
DRAIN_BITS = 0x08 | 0x10
# srv_op_state values (enum srv_state).
OP_STATE_NAMES = {"0": "stopped", "1": "starting", "2": "running", "3": "stopping"}
# What the runtime API answers to a command that worked and has something to say.
SUCCESS_ANSWERS = ("New server registered.", "Server deleted.")
STAT_FIELDS = ("status", "check_status", "check_desc", "agent_status", "agent_desc")


class HAProxyError(Exception):
    """The balancer's runtime API did not answer, or answered something else than asked for."""


def command(sock_path, line, timeout=5.0):
    """One runtime-API command over the UNIX socket at sock_path; HAProxy's whole answer."""
    if re.search(r"[;\r\n\x00]", line):
        raise HAProxyError(f"refused to send {line!r}: HAProxy would run what follows `;` or a newline")
    chunks = []
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(sock_path))
            conn.sendall(line.encode() + b"\n")
            while data := conn.recv(65536):
                chunks.append(data)
    except OSError as exc:  # socket.timeout included
        raise HAProxyError(f"the lab's HAProxy at {sock_path} did not answer `{line}`: {exc}") from exc
    return b"".join(chunks).decode("utf-8", "replace")


def run(sock_path, line):
    """A command that answers nothing, or one of SUCCESS_ANSWERS, when it works."""
    answer = command(sock_path, line).strip()
    if answer and answer not in SUCCESS_ANSWERS:
        raise HAProxyError(f"the lab's HAProxy refused `{line}`: {answer}")
    return answer


def _header(text, what):
    """(field names, the lines after the header) of an answer whose header starts with `# `."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    at = next((i for i, ln in enumerate(lines) if ln.startswith("# ")), None)
    if at is None:
        raise HAProxyError(f"HAProxy answered `{what}` without a `# ` header line: {text.strip()[:200]!r}")
    return lines[at][2:], lines[at + 1 :]


def parse_stat(text):
    """`show stat` (CSV) -> one dict per row, keyed by the header's field names."""
    header, rows = _header(text, "show stat")
    return list(csv.DictReader([header, *rows]))


def parse_servers_state(text):
    """`show servers state` -> one dict per server row, keyed by the header's field names."""
    header, rows = _header(text, "show servers state")
    fields = header.split()
    out = []
    for row in rows:
        values = row.split()
        if len(values) != len(fields):
            raise HAProxyError(f"`show servers state` row {row!r} has {len(values)} fields, its header {len(fields)}")
        out.append(dict(zip(fields, values, strict=True)))
    return out


def admin_state_name(bits):
    """ready, drain or maint, from srv_admin_state (maintenance wins over drain)."""
    if bits & MAINT_BITS:
        return "maint"
    if bits & DRAIN_BITS:
        return "drain"
    return "ready"


def pool(sock_path, backend):
    """{server name: {name, address, port, state, op_state, admin_state, agent_address,
    agent_port, status, check_status, check_desc, agent_status, agent_desc}} of backend.

    state: ready, drain or maint (the admin state); op_state: stopped, starting, running or
    stopping (what the checks made of it); status and the check fields as `show stat` prints
    them (empty when the server came or went between the two commands)."""
    answer = command(sock_path, f"show servers state {backend}")
    if "# be_id" not in answer:
        raise HAProxyError(f"the lab's HAProxy has no backend {backend!r}: {answer.strip() or 'no answer'}")
    views = {
        row["svname"]: row
        for row in parse_stat(command(sock_path, f"show stat {backend} 4 -1"))
        if row.get("pxname") == backend
    }
    servers = {}
    for row in parse_servers_state(answer):
        if row.get("be_name") != backend:
            continue
        name, admin = row["srv_name"], int(row["srv_admin_state"])
        view = views.get(name, {})
        servers[name] = {
            "name": name,
            "address": row["srv_addr"],
            "port": int(row["srv_port"]),
            "state": admin_state_name(admin),
            "op_state": OP_STATE_NAMES.get(row["srv_op_state"], row["srv_op_state"]),
            "admin_state": admin,
            # the server's agent check; `-` and port 0 when it has none
            "agent_address": None if row.get("srv_agent_addr", "-") == "-" else row["srv_agent_addr"],
            "agent_port": int(row.get("srv_agent_port") or 0),
            **{field: view.get(field) or "" for field in STAT_FIELDS},
        }
    return servers


def add_server(sock_path, backend, name, address, port):
    """A server in backend, in service, without checks (test set-up: as if registered)."""
    run(sock_path, f"add server {backend}/{name} {address}:{port}")
    run(sock_path, f"enable server {backend}/{name}")


def remove_server(sock_path, backend, name):
    """The server out of backend (a server must be in maintenance before it can be deleted)."""
    run(sock_path, f"set server {backend}/{name} state maint")
    run(sock_path, f"del server {backend}/{name}")


_SECTION = re.compile(r"^(global|defaults|frontend|backend|listen|peers|resolvers|userlist|program|cache)\b")


def config_servers(text, backend):
    """{name: 'address:port'} of the `server` lines of backend's section in a configuration."""
    return {name: address for name, address, _line in _server_lines(text, backend)[2]}


def config_with_server(text, backend, name, address=None, port=None):
    """The configuration with backend's `server NAME ...` line set to `server NAME ADDRESS:PORT`
    at the end of the section, or removed when address is None."""
    lines, end, servers = _server_lines(text, backend)
    lines = [ln for i, ln in enumerate(lines) if i not in {at for n, _a, at in servers if n == name}]
    end -= sum(1 for n, _a, _at in servers if n == name)
    if address is not None:
        while end > 0 and not lines[end - 1].strip():
            end -= 1
        lines.insert(end, f"    server {name} {address}:{port}")
    return "\n".join(lines) + "\n"


def _server_lines(text, backend):
    """(lines, index after backend's section, [(name, address, line index)] of its servers)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.split() == ["backend", backend]), None)
    if start is None:
        raise HAProxyError(f"no backend {backend} in the lab's HAProxy configuration")
    end = next((i for i in range(start + 1, len(lines)) if _SECTION.match(lines[i])), len(lines))
    servers = []
    for i in range(start + 1, end):
        words = lines[i].split()
        if len(words) >= 3 and words[0] == "server":
            servers.append((words[1], words[2], i))
    return lines, end, servers
