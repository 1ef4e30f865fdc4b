# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab's own pool reader (lab/haproxy.py), on the answers of a real HAProxy.

Each test starts HAProxy (Debian's, the lab's balancer) with the lab's own configuration in a
directory of its own, changes the pool through the runtime API and reads it back.  Needs the
`haproxy` program (scripts/setup.sh installs it); skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from lab import balancer, haproxy

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None, reason="no haproxy program (Debian package haproxy)")
BACKEND = balancer.BACKEND


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lb(tmp_path):
    """The lab's HAProxy configuration, one server in the file with a health check on a port that
    nobody listens on and an agent check; HAProxy running with it. Yields the socket path."""
    sock, pidfile, config = tmp_path / "haproxy.sock", tmp_path / "haproxy.pid", tmp_path / "haproxy.cfg"
    text = balancer.CONFIG.format(
        socket=sock,
        pidfile=pidfile,
        port=balancer.free_port(),
        stats_port=balancer.free_port(),
        exporter_port=balancer.free_port(),
        backend=BACKEND,
    )
    text += f"    server filed 127.0.0.1:{_closed_port()} check inter 200ms agent-check agent-addr 127.0.0.2 "
    text += "agent-port 9777 agent-inter 2s\n"
    config.write_text(text)
    subprocess.run(["haproxy", "-D", "-f", str(config)], check=True, stdin=subprocess.DEVNULL, cwd="/")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                haproxy.command(sock, "show info")
                break
            except haproxy.HAProxyError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield sock
    finally:
        if pidfile.exists():
            os.kill(int(pidfile.read_text().split()[0]), signal.SIGTERM)


def wait_pool(sock, predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        pool = haproxy.pool(sock, BACKEND)
        if predicate(pool) or time.monotonic() > deadline:
            return pool
        time.sleep(0.1)


def test_pool_of_a_real_haproxy(lb):
    """A server of the file: address, agent and, once its health check failed, stopped; a server
    added at runtime: ready and running, then drained, then in maintenance, then gone."""
    pool = wait_pool(lb, lambda p: p["filed"]["op_state"] == "stopped" and p["filed"]["status"] == "DOWN")
    filed = pool["filed"]
    assert (filed["address"], filed["state"], filed["op_state"]) == ("127.0.0.1", "ready", "stopped"), filed
    assert (filed["agent_address"], filed["agent_port"]) == ("127.0.0.2", 9777), filed
    assert filed["status"] == "DOWN" and filed["check_status"].lstrip("* ").startswith("L4CON"), filed

    haproxy.add_server(lb, BACKEND, "node1", "127.0.0.1", 8000)
    node1 = haproxy.pool(lb, BACKEND)["node1"]
    assert node1 == {
        "name": "node1",
        "address": "127.0.0.1",
        "port": 8000,
        "state": "ready",
        "op_state": "running",
        "admin_state": 0,
        "agent_address": None,
        "agent_port": 0,
        "status": "no check",
        "check_status": "",
        "check_desc": "",
        "agent_status": "",
        "agent_desc": "",
    }
    haproxy.run(lb, f"set server {BACKEND}/node1 state drain")
    assert haproxy.pool(lb, BACKEND)["node1"]["state"] == "drain"
    haproxy.run(lb, f"set server {BACKEND}/node1 state maint")
    node1 = haproxy.pool(lb, BACKEND)["node1"]
    assert (node1["state"], node1["status"]) == ("maint", "MAINT"), node1
    haproxy.remove_server(lb, BACKEND, "node1")
    assert set(haproxy.pool(lb, BACKEND)) == {"filed"}


def test_show_stat_is_read_by_its_header(lb):
    """HAProxy's own `show stat` CSV, its columns put in another order: the same rows."""
    text = haproxy.command(lb, f"show stat {BACKEND} 4 -1")
    assert text.startswith("# pxname,svname,"), text[:200]
    rows = haproxy.parse_stat(text)
    assert [(r["pxname"], r["svname"]) for r in rows] == [(BACKEND, "filed")]
    lines = [ln for ln in text.splitlines() if ln.strip()]
    fields = lines[0][2:].split(",")
    order = list(reversed(range(len(fields))))
    shuffled = ["# " + ",".join(fields[i] for i in order)]
    shuffled += [",".join(ln.split(",")[i] for i in order) for ln in lines[1:]]
    assert haproxy.parse_stat("\n".join(shuffled)) == rows


def test_show_servers_state_is_read_by_its_header(lb):
    text = haproxy.command(lb, f"show servers state {BACKEND}")
    rows = haproxy.parse_servers_state(text)
    assert [(r["be_name"], r["srv_name"]) for r in rows] == [(BACKEND, "filed")]
    lines = [ln for ln in text.splitlines() if ln.strip()]
    at = next(i for i, ln in enumerate(lines) if ln.startswith("# "))
    cut = lines[: at + 1] + [" ".join(lines[at + 1].split()[:-1])]
    with pytest.raises(haproxy.HAProxyError, match="fields, its header"):
        haproxy.parse_servers_state("\n".join(cut))


def test_what_is_not_a_pool_fails(lb, tmp_path):
    with pytest.raises(haproxy.HAProxyError, match="no backend 'nosuch'"):
        haproxy.pool(lb, "nosuch")
    with pytest.raises(haproxy.HAProxyError, match="without a `# ` header line"):
        haproxy.parse_stat("Unknown command.\n")
    with pytest.raises(haproxy.HAProxyError, match="did not answer"):
        haproxy.pool(tmp_path / "nobody.sock", BACKEND)
    with pytest.raises(haproxy.HAProxyError, match="refused"):
        haproxy.run(lb, f"add server {BACKEND}/filed 127.0.0.1:1")
    with pytest.raises(haproxy.HAProxyError, match="would run what follows"):
        haproxy.command(lb, "show info; shutdown frontend vllm")


def test_config_server_lines(tmp_path):
    """Servers written into the lab's configuration are the ones read back, and HAProxy takes it."""
    text = balancer.CONFIG.format(
        socket=tmp_path / "s", pidfile=tmp_path / "p", port=1, stats_port=2, exporter_port=3, backend=BACKEND
    )
    text = haproxy.config_with_server(text, BACKEND, "node1", "10.0.0.2", 8000)
    text = haproxy.config_with_server(text, BACKEND, "node2", "10.0.0.6", 8000)
    text = haproxy.config_with_server(text, BACKEND, "node1", "10.0.0.10", 8001)
    assert haproxy.config_servers(text, BACKEND) == {"node2": "10.0.0.6:8000", "node1": "10.0.0.10:8001"}
    assert haproxy.config_servers(haproxy.config_with_server(text, BACKEND, "node2"), BACKEND) == {
        "node1": "10.0.0.10:8001"
    }
    config = tmp_path / "haproxy.cfg"
    config.write_text(text)
    check = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    with pytest.raises(haproxy.HAProxyError, match="no backend other"):
        haproxy.config_servers(text, "other")


def test_a_preferred_port_another_live_lab_reserved_is_not_taken(tmp_path, monkeypatch):
    """Two labs brought up at once (two pytest runs side by side): the first takes the preferred
    port, the second, while the first lab's state is there, gets another free one; once the first is
    down (its `ssh` directory gone) the port is the next lab's."""
    monkeypatch.setattr(balancer, "RESERVED_PORTS", tmp_path / "ports")
    preferred = balancer.free_port()
    first, second = tmp_path / "first", tmp_path / "second"
    for state in (first, second):
        (state / "ssh").mkdir(parents=True)
    assert balancer.reserve_port(preferred, first) == preferred
    assert balancer.reserve_port(preferred, first) == preferred, "a lab's own reservation is its own"
    other = balancer.reserve_port(preferred, second)
    assert other != preferred and 0 < other < 65536
    (first / "ssh").rmdir()
    assert balancer.reserve_port(preferred, second) == preferred
    assert (tmp_path / "ports" / str(preferred)).read_text() == f"{second}\n"
