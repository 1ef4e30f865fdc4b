# -*- coding: utf-8 -*-
# Copyright: gpufleet.node developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""HAProxy's runtime API (the admin stats socket), and the server lines of a backend's config.

Plain Python, no Ansible. Dynamic servers need HAProxy 2.4+ (Debian 12 ships 2.6): a server
added with ``add server`` starts in maintenance, ``enable health`` and ``enable server`` put it in
service; only a server in maintenance can be deleted.
"""
from __future__ import annotations

import re
import socket

# srv_admin_state flags (haproxy/include/haproxy/server-t.h).
ADMF_FMAINT, ADMF_IMAINT, ADMF_CMAINT, ADMF_FDRAIN, ADMF_IDRAIN, ADMF_RMAINT, ADMF_HMAINT = (
    0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40)
MAINT_FLAGS = ADMF_FMAINT | ADMF_IMAINT | ADMF_CMAINT | ADMF_RMAINT | ADMF_HMAINT
DRAIN_FLAGS = ADMF_FDRAIN | ADMF_IDRAIN
# srv_op_state values.
OP_STATES = {0: "stopped", 1: "starting", 2: "running", 3: "stopping"}

_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")
# Answers of commands that succeed with something to say; anything else non-empty is an error.
_OK_ANSWERS = ("New server registered.", "Server deleted.")


class HAProxyError(Exception):
    """The runtime API could not be reached or refused a command."""


def check_name(kind, value):
    if not _NAME.match(value or ""):
        raise HAProxyError(f"invalid {kind} name {value!r}: use letters, digits and . _ : -")
    return value


class RuntimeAPI:
    """One command per connection, as HAProxy's non-interactive mode expects."""

    def __init__(self, path, timeout=5.0):
        self.path = path
        self.timeout = timeout

    def command(self, line):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                chunks.append(data)
        except (OSError, socket.timeout) as exc:
            raise HAProxyError(
                f"cannot talk to HAProxy's runtime API at {self.path}: {exc}; is HAProxy running "
                "with `stats socket <path> level admin`?") from exc
        finally:
            sock.close()
        return b"".join(chunks).decode("utf-8", "replace")

    def run(self, line):
        """A command that answers nothing (or a known success line) when it works."""
        answer = self.command(line).strip()
        if answer and answer not in _OK_ANSWERS:
            raise HAProxyError(f"HAProxy refused `{line}`: {answer}")
        return answer

    def servers(self, backend):
        """{name: server} of a backend, from `show servers state`, parsed by its header line."""
        text = self.command(f"show servers state {backend}")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        header = next((ln for ln in lines if ln.startswith("# ")), None)
        if header is None:
            raise HAProxyError(f"HAProxy has no backend {backend!r}: {text.strip() or 'no answer'}")
        fields = header[2:].split()
        servers = {}
        for ln in lines[lines.index(header) + 1:]:
            row = dict(zip(fields, ln.split()))
            if row.get("be_name") != backend:
                continue
            admin = int(row["srv_admin_state"])
            servers[row["srv_name"]] = {
                "name": row["srv_name"],
                "address": row["srv_addr"],
                "port": int(row["srv_port"]),
                "op_state": OP_STATES.get(int(row["srv_op_state"]), row["srv_op_state"]),
                "admin_state": admin,
                "state": state_name(admin),
                # the agent (agent-check) the server reports through; port 0: none
                "agent_address": None if row.get("srv_agent_addr", "-") == "-" else row["srv_agent_addr"],
                "agent_port": int(row.get("srv_agent_port", 0) or 0),
            }
        return servers


def state_name(admin):
    if admin & MAINT_FLAGS:
        return "maint"
    if admin & DRAIN_FLAGS:
        return "drain"
    return "ready"


# --- the configuration file -------------------------------------------------------------------
def server_options(check, agent=None):
    """The keywords after ``server NAME ADDR:PORT``, for the config file and ``add server``.

    agent: {"address", "port", "interval"} of the node's HAProxy agent, or None. The agent's
    address is always spelled out: HAProxy 2.6 does not default it to the server's address for a
    server added at runtime, and its agent checks then find nobody ("Connection refused").
    """
    words = ["check"] if check else []
    if agent:
        words += ["agent-check", "agent-addr", agent["address"], "agent-port", str(agent["port"]),
                  "agent-inter", str(agent.get("interval") or "2s")]
    return " ".join(words)


def server_line(name, address, port, check, agent=None):
    options = server_options(check, agent)
    return f"    server {name} {address}:{port}{' ' + options if options else ''}"


def config_with_server(text, backend, name, line):
    """`text` with backend's `server name ...` line set to `line` (None: removed).

    An existing line is replaced where it stands; a new one goes at the end of the backend
    section. Raises HAProxyError when the backend is not in the file.
    """
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if re.match(rf"^backend\s+{re.escape(backend)}\s*$", ln)), None)
    if start is None:
        raise HAProxyError(f"backend {backend!r} is not in the HAProxy configuration file")
    end = next((i for i in range(start + 1, len(lines))
                if re.match(r"^(global|defaults|frontend|backend|listen|peers|resolvers|userlist|program|cache)\b", lines[i])),
               len(lines))
    mine = re.compile(rf"^\s+server\s+{re.escape(name)}\s")
    body = lines[start + 1:end]
    at = next((i for i, ln in enumerate(body) if mine.match(ln)), None)
    body = [ln for ln in body if not mine.match(ln)]
    if line is not None:
        if at is None:
            while body and not body[-1].strip():
                body.pop()
            at = len(body)
            if end < len(lines):
                body.append("")
        body.insert(at, line)
    return "\n".join(lines[:start + 1] + body + lines[end:]) + "\n"
