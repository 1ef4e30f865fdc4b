# -*- coding: utf-8 -*-
# Copyright: gpufleet.node developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""HAProxy's runtime API (the admin stats socket), and the server lines of a backend's config.

The one runtime-API client of the collection: used by the haproxy_pool_member module and by the
node's worker-recycle agent (installed with it on the node, as the agent's module_utils tree); the
lab reads the pool with its own reader (lab/haproxy.py). Plain Python 3 standard library, no Ansible.

Dynamic servers need HAProxy 2.4+ (Debian 12 ships 2.6): a server added with ``add server``
starts in maintenance, ``enable health`` and ``enable server`` put it in service; only a server
in maintenance can be deleted.

Every value that reaches a command or a config line is checked first (``check_name``,
``check_address``, ``check_time``): the runtime API splits its input on ``;`` and on newlines, so
``10.0.0.5;disable frontend fe`` would run a second command, and a newline in a config line would
start a new section. ``RuntimeAPI.command`` refuses such a line as a last guard.
"""

from __future__ import annotations

import csv
import ipaddress
import re
import socket
import time

# srv_admin_state flags (haproxy/include/haproxy/server-t.h).
ADMF_FMAINT, ADMF_IMAINT, ADMF_CMAINT, ADMF_FDRAIN, ADMF_IDRAIN, ADMF_RMAINT, ADMF_HMAINT = (
    0x01,
    0x02,
    0x04,
    0x08,
    0x10,
    0x20,
    0x40,
)
MAINT_FLAGS = ADMF_FMAINT | ADMF_IMAINT | ADMF_CMAINT | ADMF_RMAINT | ADMF_HMAINT
DRAIN_FLAGS = ADMF_FDRAIN | ADMF_IDRAIN
# srv_op_state values.
OP_STATES = {0: "stopped", 1: "starting", 2: "running", 3: "stopping"}
STATES = ("ready", "drain", "maint")  # what `set server B/S state` takes

_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")
# A host name (RFC 1123 labels); an IP address is checked by `ipaddress`.
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
_ADDRESS_CHARS = re.compile(r"^[A-Za-z0-9.:%_-]+$")  # also an IPv6 zone (fe80::1%eth0)
# HAProxy's time format (doc/configuration.txt, "2.5. Time format"): digits, optional unit.
_TIME = re.compile(r"^[0-9]{1,9}(us|ms|s|m|h|d)?$")
# Characters that end a runtime-API command or a config line.
_SEPARATORS = re.compile(r"[;\r\n\x00]")
# Answers of commands that succeed with something to say; anything else non-empty is an error.
_OK_ANSWERS = ("New server registered.", "Server deleted.")
# What `set server B/S addr A [port P]` answers when it worked (HAProxy 2.6: "IP changed from
# '10.0.0.1' to '10.0.0.2', no need to change the port by 'stats socket command'", "no need to
# change the addr, port changed from '8000' to '9000' by ..."); a refusal ("Invalid addr 'x' by
# ...") is any other answer.
_ADDR_CHANGED = re.compile(
    r"^(IP changed from '[^']*' to '[^']*'|no need to change the addr)"
    r"(, (port changed from '[^']*' to '[^']*'|no need to change the port))? by '[^']*'$"
)
MAX_ANSWER = 64 * 1024 * 1024  # bytes read from one answer at most
# `show stat` fields that say why a server is (not) up (haproxy doc/management.txt, 9.1).
VIEW_FIELDS = ("status", "check_status", "check_desc", "last_chk", "agent_status", "agent_desc", "last_agt")


class HAProxyError(Exception):
    """The runtime API could not be reached, refused a command, or a value was refused."""


def check_name(kind, value):
    if not isinstance(value, str) or not _NAME.match(value):
        raise HAProxyError(f"invalid {kind} name {value!r}: use letters, digits and . _ : -")
    return value


def check_address(kind, value):
    """An IP address or a host name, nothing else (no port, no `;`, no spaces)."""
    if isinstance(value, str) and _ADDRESS_CHARS.match(value):
        try:
            ipaddress.ip_address(value)
            return value
        except ValueError:
            labels = value.split(".")
            # an all-digit last label would be read as (part of) an IPv4 address (RFC 3696, 2)
            if len(value) <= 253 and all(_LABEL.match(label) for label in labels) and not labels[-1].isdigit():
                return value
    raise HAProxyError(f"invalid {kind} {value!r}: give an IP address or a host name (letters, digits, - and . only)")


def check_time(kind, value):
    """An HAProxy time: digits with an optional unit us, ms, s, m, h or d (e.g. 2s, 500ms)."""
    if not isinstance(value, str) or not _TIME.match(value):
        raise HAProxyError(
            f"invalid {kind} {value!r}: give an HAProxy time, digits with an optional "
            "unit us, ms, s, m, h or d (e.g. 2s, 500ms, 1m)"
        )
    return value


def check_state(state):
    if state not in STATES:
        raise HAProxyError(f"unknown server state {state!r}: one of {', '.join(STATES)}")
    return state


def parse_endpoint(endpoint):
    """(family, address) of ``tcp://HOST:PORT``, ``unix:///PATH`` or a socket path."""
    if not isinstance(endpoint, str):
        endpoint = str(endpoint)
    if endpoint.startswith("tcp://"):
        host, _sep, port = endpoint[len("tcp://") :].rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if host and port.isdigit() and 0 < int(port) < 65536:
            return socket.AF_INET6 if ":" in host else socket.AF_INET, (host, int(port))
    elif endpoint.startswith("unix://") and len(endpoint) > len("unix://"):
        return socket.AF_UNIX, endpoint[len("unix://") :]
    elif "://" not in endpoint and "/" in endpoint:
        return socket.AF_UNIX, endpoint
    raise HAProxyError(
        f"runtime API endpoint must be tcp://HOST:PORT or unix:///PATH (or a socket path), not {endpoint!r}"
    )


class RuntimeAPI:
    """One command per connection, as HAProxy's non-interactive mode expects.

    endpoint: ``tcp://HOST:PORT`` (a ``stats socket ipv4@ADDR:PORT`` listener), ``unix:///PATH`` or
    the path of the UNIX socket. timeout: seconds for the whole exchange of one command.
    """

    def __init__(self, endpoint, timeout=5.0):
        self.endpoint = str(endpoint)
        self.family, self.address = parse_endpoint(self.endpoint)
        self.timeout = float(timeout)

    def command(self, line):
        """Send one command; return HAProxy's whole answer (text)."""
        if _SEPARATORS.search(line):
            raise HAProxyError(
                f"refused to send {line!r}: a runtime-API command must not contain "
                "`;`, a newline or NUL (HAProxy would run what follows as another command)"
            )
        deadline = time.monotonic() + self.timeout
        chunks, size = [], 0
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.address)
            sock.sendall(line.encode() + b"\n")
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout()
                sock.settimeout(left)
                data = sock.recv(65536)
                if not data:
                    break
                size += len(data)
                if size > MAX_ANSWER:
                    raise HAProxyError(f"HAProxy's answer to `{line}` at {self.endpoint} exceeds {MAX_ANSWER} bytes")
                chunks.append(data)
        except socket.timeout as exc:  # connecting, or an answer that does not end in time
            raise HAProxyError(
                f"HAProxy's runtime API at {self.endpoint} gave no complete answer to `{line}` within {self.timeout:g}s"
            ) from exc
        except OSError as exc:
            raise HAProxyError(
                f"cannot talk to HAProxy's runtime API at {self.endpoint}: {exc}; is HAProxy running "
                "with `stats socket <path or ipv4@addr:port> level admin`?"
            ) from exc
        finally:
            sock.close()
        return b"".join(chunks).decode("utf-8", "replace")

    def run(self, line):
        """A command that answers nothing (or a known success line) when it works."""
        answer = self.command(line).strip()
        if answer and answer not in _OK_ANSWERS and not _ADDR_CHANGED.match(answer):
            raise HAProxyError(f"HAProxy refused `{line}`: {answer}")
        return answer

    def set_state(self, backend, server, state):
        """`set server BACKEND/SERVER state ready|drain|maint`; returns the command sent."""
        line = f"set server {check_name('backend', backend)}/{check_name('server', server)} state {check_state(state)}"
        self.run(line)
        return line

    def info(self):
        """`show info`: {label: value} of the process that answers (``Pid``, ``Uptime_sec``...),
        parsed by label."""
        info = {}
        for line in self.command("show info").splitlines():
            label, sep, value = line.partition(":")
            if sep and label.strip():
                info[label.strip()] = value.strip()
        if "Pid" not in info:
            raise HAProxyError(f"HAProxy's `show info` at {self.endpoint} names no Pid")
        return info

    def servers(self, backend):
        """{name: server} of a backend, from `show servers state`, parsed by its header line."""
        text = self.command(f"show servers state {check_name('backend', backend)}")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        header = next((ln for ln in lines if ln.startswith("# ")), None)
        if header is None:
            raise HAProxyError(f"HAProxy has no backend {backend!r}: {text.strip() or 'no answer'}")
        fields = header[2:].split()
        servers = {}
        for ln in lines[lines.index(header) + 1 :]:
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

    def view(self, backend, name):
        """What HAProxy's checks say of one server, from `show stat` (CSV, by its header):
        {status, check_status, check_desc, last_chk, agent_status, agent_desc, last_agt}, or None
        when the backend has no such server."""
        text = self.command(f"show stat {check_name('backend', backend)} 4 -1")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if not lines or not lines[0].startswith("# "):
            raise HAProxyError(f"HAProxy answered `show stat {backend}` with {text.strip()[:200] or 'nothing'!r}")
        for row in csv.DictReader([lines[0][2:]] + lines[1:]):
            if row.get("pxname") == backend and row.get("svname") == check_name("server", name):
                # "* L7OK": a check of that result is running again now; the result is what counts
                return {k: re.sub(r"^\* ", "", row.get(k) or "") for k in VIEW_FIELDS}
        return None

    def wait_up(self, backend, name, timeout, interval=0.5, clock=time.monotonic, sleep=time.sleep):
        """Wait up to `timeout` seconds until HAProxy reports the server UP through its own checks
        (health check and agent check, each having run at least once). Returns (up, view)."""
        deadline = clock() + timeout
        while True:
            seen = self.view(backend, name)
            if is_up(seen):
                return True, seen
            if clock() >= deadline:
                return False, seen
            sleep(interval)


def is_up(view):
    """Whether a `view()` says the balancer sends traffic to the server: status UP (or `no check`
    for a server without checks), and no check still in its first run (INI)."""
    if not view:
        return False
    if "INI" in (view["check_status"], view["agent_status"]):
        return False
    return view["status"] in ("UP", "no check")


def describe_view(view):
    """The balancer's view in words, for an error message."""
    if view is None:
        return "the server is not in the backend"
    words = [f"status {view['status'] or '?'}"]
    for kind, status, desc, last in (
        ("health check", "check_status", "check_desc", "last_chk"),
        ("agent check", "agent_status", "agent_desc", "last_agt"),
    ):
        if view[status]:
            detail = ", ".join(x for x in (view[desc], view[last]) if x)
            words.append(f"{kind} {view[status]}" + (f" ({detail})" if detail else ""))
    return "; ".join(words)


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
        words += [
            "agent-check",
            "agent-addr",
            check_address("agent address", agent["address"]),
            "agent-port",
            str(check_port("agent port", agent["port"])),
            "agent-inter",
            check_time("agent interval", agent.get("interval", "2s")),
        ]
    return " ".join(words)


def check_port(kind, value):
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise HAProxyError(f"{kind} {value!r} is out of range 1-65535")
    return value


def server_spec(name, address, port, check, agent=None):
    """``NAME ADDR:PORT [options]``, every value checked: what `add server BACKEND/` and a
    config file's `server` keyword take."""
    options = server_options(check, agent)
    spec = f"{check_name('server', name)} {check_address('address', address)}:{check_port('port', port)}"
    return f"{spec}{' ' + options if options else ''}"


def server_line(name, address, port, check, agent=None):
    return f"    server {server_spec(name, address, port, check, agent)}"


def config_with_server(text, backend, name, line):
    """`text` with backend's `server name ...` line set to `line` (None: removed).

    An existing line is replaced where it stands; a new one goes at the end of the backend
    section. Raises HAProxyError when the backend is not in the file.
    """
    if line is not None and _SEPARATORS.search(line):
        raise HAProxyError(
            f"refused to write {line!r} into the configuration: a newline or `;` would start another line or command"
        )
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if re.match(rf"^backend\s+{re.escape(backend)}\s*$", ln)), None)
    if start is None:
        raise HAProxyError(f"backend {backend!r} is not in the HAProxy configuration file")
    end = next(
        (
            i
            for i in range(start + 1, len(lines))
            if re.match(
                r"^(global|defaults|frontend|backend|listen|peers|resolvers|userlist|program|cache)\b", lines[i]
            )
        ),
        len(lines),
    )
    mine = re.compile(rf"^\s+server\s+{re.escape(name)}\s")
    body = lines[start + 1 : end]
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
    return "\n".join(lines[: start + 1] + body + lines[end:]) + "\n"
