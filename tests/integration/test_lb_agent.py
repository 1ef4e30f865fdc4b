# SPDX-License-Identifier: GPL-3.0-or-later
"""The node's HAProxy agent (role lb_registration): its answers (one word of HAProxy's agent protocol
and at most a short reason; the details go to the journal), the node's own drain/ready requests,
and the addresses it answers. The lab's fleet tests run it under systemd (tests/fleet)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.modules import install_agent

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "roles" / "lb_registration" / "files" / "gpufleet_lb_agent.py"
BOOT = "2b95257e-cc50-4a2b-8260-36f6af9dc4dc"
#: The collection's module_utils tree as the role installs it in the agent's lib dir.
TREE = "ansible_collections/gpufleet/node/plugins/module_utils"


def installed(tmp_path):
    """The agent as the role installs it: the script with the readiness rule's module_utils tree
    beside it."""
    return install_agent(AGENT, tmp_path / "lib")


def run_agent(tmp_path, *args, stdin=subprocess.DEVNULL, check=True, script=None):
    proc = subprocess.run(
        [sys.executable, str(script or installed(tmp_path)), *args],
        capture_output=True,
        text=True,
        check=check,
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


# --- an agent that cannot judge answers down, never nothing ---------------------------------------
# HAProxy ignores an agent that closes the connection without a word: the server would stay UP
# whatever the gate says. Each class of failure answers `down #<word>`, the reason in the journal.


def from_loopback(tmp_path, args, script=None):
    """The agent run on a TCP connection from 127.0.0.1 (its standard input), as the socket runs it."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname()):
            conn, _ = server.accept()
            with conn:
                return run_agent(tmp_path, *args, stdin=conn.fileno(), check=False, script=script)


def passing(tmp_path):
    (tmp_path / "boot_id").write_text(BOOT + "\n")
    (tmp_path / "m").write_text(json.dumps({"boot_id": BOOT, "passed": True}))
    return ["--marker", str(tmp_path / "m"), "--boot-id", str(tmp_path / "boot_id")]


BAD_ENTRIES = [
    "link-local",
    "multicast",
    "10.0.0.300",
    "300.1.1.1/8",
    "10.0.0.0/33",
    "fd00::/129",
    "010.0.0.1",
    "lb1.example.com",
    "balancer",
    "",
    "fe80::1%eth0",
    "10.0.0.0/",
]


@pytest.mark.parametrize("entry", BAD_ENTRIES)
def test_an_allow_list_it_cannot_parse_answers_down(tmp_path, entry):
    """It cannot tell whether the client is the balancer: everyone the socket lets in hears down,
    and the journal names the entry."""
    proc = from_loopback(tmp_path, [*passing(tmp_path), "--allow", "127.0.0.1", entry])
    assert (proc.returncode, proc.stdout) == (1, "down #allow-list-invalid\n"), (proc.stdout, proc.stderr)
    named = "the empty entry" if entry == "" else "entry %r" % entry
    assert f"to 127.0.0.1: cannot tell whom to answer: --allow {named} " in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "entries",
    [[entry] for entry in BAD_ENTRIES] + [["127.0.0.1"], ["127.0.0.0/8"], ["any"], ["localhost", "fd00::/64"]],
)
def test_the_role_refuses_exactly_what_the_agent_cannot_parse(tmp_path, entries):
    """The role's check (the filter its preflight calls) and the agent give the same verdict on a list."""
    from ansible_collections.gpufleet.node.plugins.filter.lb_agent import lb_agent_allow_problems

    problems = lb_agent_allow_problems(entries)
    proc = from_loopback(tmp_path, [*passing(tmp_path), "--allow", "localhost", *entries])
    assert proc.stdout == ("down #allow-list-invalid\n" if problems else "up\n"), (problems, proc.stderr)
    for problem in problems:
        assert problem in proc.stderr


def test_a_command_line_it_cannot_run_with_answers_down(tmp_path):
    proc = from_loopback(tmp_path, ["--boot-id", str(tmp_path / "boot_id")])  # no --marker
    assert (proc.returncode, proc.stdout) == (1, "down #agent-error\n"), proc.stderr
    assert "bad command line" in proc.stderr and "--marker" in proc.stderr


@pytest.mark.parametrize("missing", ["nccl/_readiness.py", "lb/_allow.py"])
def test_a_missing_copy_of_the_collections_code_answers_down(tmp_path, missing):
    script = installed(tmp_path)
    (tmp_path / "lib" / TREE / missing).unlink()
    proc = from_loopback(tmp_path, [*passing(tmp_path), "--allow", "localhost"], script=script)
    assert (proc.returncode, proc.stdout) == (1, "down #agent-error\n"), proc.stderr
    assert re.search(r"to 127\.0\.0\.1: cannot judge: (ModuleNotFound|Import)Error: .*_", proc.stderr), proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr


def test_a_bug_while_judging_answers_down_with_the_traceback_in_the_journal(tmp_path):
    script = installed(tmp_path)
    (tmp_path / "lib" / TREE / "nccl" / "_readiness.py").write_text(
        "def agent_verdict(marker, boot_id, health=None):\n    raise KeyError('boot_id')\n"
    )
    proc = from_loopback(tmp_path, [*passing(tmp_path), "--allow", "localhost"], script=script)
    assert (proc.returncode, proc.stdout) == (1, "down #agent-error\n"), proc.stderr
    assert "cannot judge: KeyError: 'boot_id'" in proc.stderr and 'raise KeyError("boot_id")' not in proc.stdout
    assert "Traceback (most recent call last)" in proc.stderr and "agent_verdict" in proc.stderr


@pytest.mark.parametrize(
    "verdict, word",
    [
        ({"boot_id": BOOT, "passed": False, "checks": 5}, "gpu-health-failed"),
        ({"boot_id": BOOT, "passed": False, "checks": "xid", "reason": ["XID 79"]}, "gpu-health-failed"),
        ({"boot_id": BOOT, "passed": False, "checks": {"name": "xid"}, "reason": {"xid": 79}}, "gpu-health-failed"),
        (
            {"boot_id": BOOT, "passed": False, "checks": [5, None, {"name": ["x"], "reason": {"a": 1}}]},
            "gpu-health-failed",
        ),
        ({"boot_id": BOOT, "passed": "false", "source": ["watch"]}, "gpu-health-failed"),
        ("[]", "health-unreadable"),
        ("null", "health-unreadable"),
        ("{not json", "health-unreadable"),
        (b"\xff\xfe{}", "health-unreadable"),
    ],
)
def test_a_malformed_health_verdict_of_this_boot_is_down(tmp_path, verdict, word):
    path = tmp_path / "gpu-health.json"
    if isinstance(verdict, bytes):
        path.write_bytes(verdict)
    else:
        path.write_text(verdict if isinstance(verdict, str) else json.dumps(verdict))
    line, journal = answer(tmp_path, {"boot_id": BOOT, "passed": True}, full=True)
    assert line == f"down #{word}" and "Traceback" not in journal, (line, journal)


@pytest.mark.parametrize(
    "marker",
    [
        {"boot_id": BOOT, "passed": False, "reason": ["bus bandwidth", 11.5]},
        {"boot_id": BOOT, "passed": False, "reason": {"busbw": 11.5}},
        {"boot_id": [BOOT], "passed": True},
        {"boot_id": BOOT, "passed": 1},
    ],
)
def test_a_malformed_marker_is_down(tmp_path, marker):
    line, journal = answer(tmp_path, marker, full=True)
    assert line in ("down #gate-failed", "down #stale-marker") and "Traceback" not in journal, (line, journal)


@pytest.mark.parametrize("content", [b"", b"\n", b"\xff\xfe\x00boot"])
def test_an_unreadable_boot_id_is_down(tmp_path, content):
    """An empty boot id would match a marker written without one."""
    (tmp_path / "boot_id").write_bytes(content)
    (tmp_path / "m").write_text(json.dumps({"boot_id": "", "passed": True}))
    proc = run_agent(tmp_path, "--marker", str(tmp_path / "m"), "--boot-id", str(tmp_path / "boot_id"))
    assert proc.stdout == "down #boot-id-unreadable\n", (proc.stdout, proc.stderr)
    assert "cannot read the boot id at" in proc.stderr and "Traceback" not in proc.stderr


def test_a_boot_id_path_that_is_a_directory_is_down(tmp_path):
    proc = run_agent(tmp_path, "--marker", str(tmp_path / "m"), "--boot-id", str(tmp_path))
    assert proc.stdout == "down #boot-id-unreadable\n" and "Traceback" not in proc.stderr, proc.stderr


# --- the role's preflight: the agent's own parser, before anything is installed -------------------

PREFLIGHT = "Check the agent's allow list with the agent's own parser"


def test_the_roles_preflight_refuses_an_entry_the_agent_cannot_parse_naming_it(ansible_env, tmp_path):
    """One run, one host per entry (each its own allow list): the bad ones fail at the preflight,
    naming their entry, with nothing written; the good ones pass it. The node's own agent address
    joins the list the agent gets, and is judged with it."""
    from tests.harness.playbook import one_role_playbook, run_playbook, task_results

    hosts = {f"bad{i}": {"lb_registration_agent_allow": ["10.0.0.2", entry]} for i, entry in enumerate(BAD_ENTRIES)}
    hosts["badaddress"] = {"lb_registration_agent_allow": ["10.0.0.2"], "lb_registration_agent_address": "10.0.0.300"}
    good = {
        "goodv4": ["10.0.0.2", "10.0.0.0/24"],
        "goodv6": ["fd00::2", "fd00::/64"],
        "goodany": ["any"],
        "goodlocal": ["localhost"],
    }
    hosts.update({name: {"lb_registration_agent_allow": allow} for name, allow in good.items()})
    for name, host in hosts.items():
        root = tmp_path / name
        host.update(
            ansible_connection="local",
            ansible_python_interpreter=sys.executable,
            lb_registration_agent_port=9777,
            lb_registration_agent_bin=str(root / "lib" / "gpufleet_lb_agent.py"),
            lb_registration_systemd_dir=str(root / "systemd"),
        )
        host.setdefault("lb_registration_agent_address", "127.0.0.1")
    playbook, inventory = one_role_playbook(tmp_path, hosts, "lb_registration", "agent")
    run = run_playbook(
        playbook, "--check", "--forks", "20", inventory=inventory, env=ansible_env, json_callback=True, timeout=300
    )
    results = task_results(run, PREFLIGHT)
    assert set(results) == set(hosts), run.explain()
    for i, entry in enumerate(BAD_ENTRIES):
        res = results[f"bad{i}"]
        named = "the empty entry" if entry == "" else "entry %r" % entry
        assert res.get("failed") and named in res["msg"], (entry, res.get("msg"))
        assert not (tmp_path / f"bad{i}").exists()
    assert results["badaddress"].get("failed") and "entry '10.0.0.300'" in results["badaddress"]["msg"]
    for name in good:
        assert not results[name].get("failed"), (name, results[name].get("msg"))


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
