# SPDX-License-Identifier: GPL-3.0-or-later
"""The node's HAProxy agent (role lb_registration): its answers (one word of HAProxy's agent protocol
and at most a short reason; the details go to the journal), the node's own drain/ready requests,
and the addresses it answers. The lab's fleet tests run it under systemd (tests/fleet)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import install_agent

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "roles" / "lb_registration" / "files" / "gpufleet_lb_agent.py"
BOOT = "2b95257e-cc50-4a2b-8260-36f6af9dc4dc"


def installed(tmp_path):
    """The agent as the role installs it: the script with the readiness rule's module_utils tree
    beside it."""
    return install_agent(AGENT, tmp_path / "lib")


def run_agent(tmp_path, *args, stdin=subprocess.DEVNULL):
    proc = subprocess.run(
        [sys.executable, str(installed(tmp_path)), *args],
        capture_output=True,
        text=True,
        check=True,
        stdin=stdin,
    )
    return proc


def answer(tmp_path, marker=None, boot_id=BOOT, raw=None, request=None, full=False):
    """The agent's one line (and, with full, what it logs to the journal)."""
    (tmp_path / "boot_id").write_text(boot_id + "\n")
    path = tmp_path / "nccl-gate.json"
    if raw is not None:
        path.write_text(raw)
    elif marker is not None:
        path.write_text(json.dumps(marker))
    args = ["--marker", str(path), "--boot-id", str(tmp_path / "boot_id")]
    if request is not None:
        (tmp_path / "request.json").write_text(request if isinstance(request, str) else json.dumps(request))
        args += ["--request", str(tmp_path / "request.json")]
    proc = run_agent(tmp_path, *args)
    assert proc.stdout.endswith("\n") and proc.stdout.count("\n") == 1, proc.stdout
    return (proc.stdout.rstrip("\n"), proc.stderr) if full else proc.stdout.rstrip("\n")


def test_up_only_with_a_passing_marker_of_this_boot(tmp_path):
    assert answer(tmp_path, {"boot_id": BOOT, "passed": True}) == "up"


@pytest.mark.parametrize(
    "marker, raw, word, why",
    [
        (None, None, "no-marker", "no NCCL gate marker at"),
        (
            {"boot_id": "0f2c-old-boot", "passed": True},
            None,
            "stale-marker",
            f"the gate marker is from another boot (0f2c-old-boot), not the current {BOOT}",
        ),
        (
            {"boot_id": BOOT, "passed": False, "reason": "bus bandwidth 11.5 GB/s on 0000:3b:00.0\nunder 22.1"},
            None,
            "gate-failed",
            "the NCCL gate failed: bus bandwidth 11.5 GB/s on 0000:3b:00.0\nunder 22.1",
        ),
        ({"boot_id": BOOT, "passed": "true"}, None, "gate-failed", "the NCCL gate failed"),  # only a JSON true
        (None, "{not json", "marker-unreadable", "unreadable NCCL gate marker"),
        (None, "[1, 2]", "marker-unreadable", "not a JSON object"),
    ],
)
def test_down_with_one_word_for_haproxy_and_the_reason_in_the_journal(tmp_path, marker, raw, word, why):
    line, journal = answer(tmp_path, marker, raw=raw, full=True)
    # HAProxy needs the space before '#': "down#why" is not understood and changes nothing
    assert line == f"down #{word}", line
    # nothing of the node's identity or its figures goes to whoever asks: boot ids, BDFs, GB/s
    for secret in (BOOT, "0f2c-old-boot", "0000:3b", "GB/s", str(tmp_path)):
        assert secret not in line
    assert why in journal and f"answered 'down #{word}'" in journal, journal


def test_unreadable_boot_id_is_down(tmp_path):
    proc = run_agent(tmp_path, "--marker", str(tmp_path / "m"), "--boot-id", str(tmp_path / "missing"))
    assert proc.stdout == "down #boot-id-unreadable\n", proc.stdout
    assert "cannot read the boot id at" in proc.stderr


def test_gpu_health_verdict_of_this_boot_keeps_the_node_out(tmp_path):
    (tmp_path / "gpu-health.json").write_text(
        json.dumps({"boot_id": BOOT, "passed": False, "source": "gpu-health-watch", "reason": "XID 79 on 0000:3b:00.0"})
    )
    line, journal = answer(tmp_path, {"boot_id": BOOT, "passed": True}, full=True)
    assert line == "down #gpu-health-failed" and "XID 79 on 0000:3b:00.0" in journal, (line, journal)


@pytest.mark.parametrize(
    "marker, ask, expected",
    [
        # the node's own request: HAProxy's administrative words, with a short reason
        ({"boot_id": BOOT, "passed": True}, {"state": "drain", "reason": "recycle"}, "drain up #recycle"),
        ({"boot_id": BOOT, "passed": True}, {"state": "maint", "reason": "Disk swap!"}, "maint up #disk-swap"),
        ({"boot_id": BOOT, "passed": True}, {"state": "drain"}, "drain up #requested"),
        # a drained node whose gate fails is down as well
        (None, {"state": "drain", "reason": "recycle"}, "drain down #no-marker"),
        # `ready` only until its time is over: then the admin state is left to the operators again
        ({"boot_id": BOOT, "passed": True}, {"state": "ready", "until": 4102444800}, "ready up"),
        ({"boot_id": BOOT, "passed": True}, {"state": "ready", "until": 1}, "up"),
        ({"boot_id": BOOT, "passed": True}, {"state": "ready"}, "up"),
        # nothing else is passed on
        ({"boot_id": BOOT, "passed": True}, {"state": "stopped"}, "up"),
        ({"boot_id": BOOT, "passed": True}, "{not json", "up"),
        ({"boot_id": BOOT, "passed": True}, "[]", "up"),
    ],
)
def test_the_nodes_own_request(tmp_path, marker, ask, expected):
    assert answer(tmp_path, marker, request=ask) == expected


def test_a_client_outside_the_allowed_addresses_gets_no_answer(tmp_path):
    (tmp_path / "boot_id").write_text(BOOT + "\n")
    (tmp_path / "m").write_text(json.dumps({"boot_id": BOOT, "passed": True}))
    base = ["--marker", str(tmp_path / "m"), "--boot-id", str(tmp_path / "boot_id"), "--allow"]
    with socket.create_server(("127.0.0.1", 0)) as server:
        for allow, expected in (
            (["10.0.0.2", "192.168.0.0/16"], ""),
            (["10.0.0.2", "localhost"], "up\n"),
            (["127.0.0.0/8"], "up\n"),
            (["any"], "up\n"),
        ):
            with socket.create_connection(server.getsockname()) as client:
                conn, _ = server.accept()
                with conn:
                    proc = run_agent(tmp_path, *base, *allow, stdin=conn.fileno())
                assert proc.stdout == expected, (allow, proc.stdout, proc.stderr)
                client.settimeout(5)
                assert client.recv(100) == b""  # the agent wrote to stdout, not the socket here
            if not expected:
                assert "no answer to 127.0.0.1: not one of the balancer's addresses" in proc.stderr


# --- worker_recycle's default drain: the node asks its own agent ---------------------------------


def recycle_agent(tmp_path, monkeypatch, socket_state="active"):
    """worker_recycle's node agent (balancer method `agent`) with systemctl and sleep faked."""
    import importlib.machinery
    import importlib.util

    from ansible_collections.gpufleet.node.plugins.module_utils.common import _atomic

    path = REPO / "roles" / "worker_recycle" / "files" / "gpufleet_worker_recycle.py"
    loader = importlib.machinery.SourceFileLoader("gpufleet_worker_recycle", str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    calls = []
    monkeypatch.setattr(module, "systemctl", lambda *a, check=True: calls.append(a) or socket_state + "\n")
    monkeypatch.setattr(module.time, "sleep", lambda s: calls.append(("sleep", s)))
    config = {"balancer": {"method": "agent", "request_file": str(tmp_path / "request.json"), "settle": 3}}
    return module.Agent(config, None, None, None, None, _atomic), calls


def test_recycle_drains_through_the_agent_and_returns(tmp_path, monkeypatch):
    recycle, calls = recycle_agent(tmp_path, monkeypatch)
    (tmp_path / "boot_id").write_text(BOOT + "\n")
    (tmp_path / "m").write_text(json.dumps({"boot_id": BOOT, "passed": True}))
    agent = ["--marker", str(tmp_path / "m"), "--boot-id", str(tmp_path / "boot_id")]
    agent += ["--request", str(tmp_path / "request.json")]
    assert run_agent(tmp_path, *agent).stdout == "up\n"
    recycle.balancer("drain")
    assert calls == [("is-active", "gpufleet-lb-agent.socket"), ("sleep", 3.0)]  # one agent check at least
    assert (tmp_path / "request.json").stat().st_mode & 0o777 == 0o644  # the agent runs as nobody
    assert run_agent(tmp_path, *agent).stdout == "drain up #recycle\n"
    recycle.balancer("ready")
    assert run_agent(tmp_path, *agent).stdout == "ready up\n"
    request = json.loads((tmp_path / "request.json").read_text())
    assert request["state"] == "ready" and 19 < request["until"] - request["time"] <= 20


def test_recycle_refuses_to_restart_without_an_agent_to_drain_it(tmp_path, monkeypatch):
    recycle, _calls = recycle_agent(tmp_path, monkeypatch, socket_state="inactive")
    with pytest.raises(RuntimeError, match="gpufleet-lb-agent.socket is not active"):
        recycle.balancer("drain")
    assert not (tmp_path / "request.json").exists()
