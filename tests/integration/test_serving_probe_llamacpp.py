# SPDX-License-Identifier: GPL-3.0-or-later
"""The node's serving prober (role lb_registration, gpufleet_serving_probe.py) against the real
llama-server (lab/llamacpp.py: the cached CPU build, the tiny model, behind an API key), installed
as the role installs it, and the node's HAProxy agent reading the record it writes: a serving
engine keeps the node up; a stopped one (SIGSTOP, as a wedged process) takes it out; continued,
it returns. The lab's fleet test does the same under systemd and HAProxy
(tests/fleet/test_fleet_10_probe.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lab import llamacpp
from tests.harness.modules import install_agent

REPO = Path(__file__).resolve().parents[2]
FILES = REPO / "roles" / "lb_registration" / "files"
BOOT = "2b95257e-cc50-4a2b-8260-36f6af9dc4dc"
KEY = "sk-probe-0123456789"


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    with llamacpp.tiny_server(tmp_path_factory.mktemp("llama"), api_key=KEY) as real:
        yield real


@pytest.fixture
def node(tmp_path):
    """The prober and the agent installed side by side, with a passing gate of this boot."""
    lib = tmp_path / "lib"
    prober = install_agent(FILES / "gpufleet_serving_probe.py", lib)
    agent = install_agent(FILES / "gpufleet_lb_agent.py", lib)
    (tmp_path / "boot_id").write_text(BOOT + "\n")
    (tmp_path / "nccl-gate.json").write_text(json.dumps({"boot_id": BOOT, "passed": True}))
    key = tmp_path / "key"
    key.write_text(KEY + "\n")
    key.chmod(0o600)
    return prober, agent, tmp_path


def probe(node, server, timeout=3.0):
    prober, _agent, root = node
    proc = subprocess.run(
        [
            sys.executable,
            str(prober),
            "--url",
            server.url,
            "--model",
            server.alias,
            "--record",
            str(root / "serving-probe.json"),
            "--api-key-file",
            str(root / "key"),
            "--boot-id",
            str(root / "boot_id"),
            "--interval",
            "1",
            "--timeout",
            str(timeout),
            "--backend",
            "llamacpp",
            "--textfile",
            str(root / "probe.prom"),
            "--once",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert KEY not in proc.stdout + proc.stderr
    return proc, json.loads((root / "serving-probe.json").read_text())


def agent_says(node):
    _prober, agent, root = node
    proc = subprocess.run(
        [
            sys.executable,
            str(agent),
            "--marker",
            str(root / "nccl-gate.json"),
            "--boot-id",
            str(root / "boot_id"),
            "--probe",
            str(root / "serving-probe.json"),
            "--probe-interval",
            "1",
            "--probe-timeout",
            "3",
        ],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=30,
        check=True,
    )
    return proc.stdout.strip()


def test_a_serving_llama_server_keeps_the_node_up(node, llama_server):
    proc, record = probe(node, llama_server)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert record["verdict"] == "serving" and record["boot_id"] == BOOT and record["backend"] == "llamacpp", record
    assert agent_says(node) == "up"
    prom = (node[2] / "probe.prom").read_text()
    assert "gpufleet_serving_probe_up 1\n" in prom and 'gpufleet_serving_probe_verdict{verdict="serving"} 1' in prom


def test_a_wrong_key_is_down(node, llama_server):
    (node[2] / "key").write_text("not-" + KEY)
    proc, record = probe(node, llama_server)
    assert proc.returncode == 1 and record["verdict"] == "down", record
    assert "answered HTTP 401" in record["reason"], record
    assert agent_says(node) == "down #engine-down"


def test_a_stopped_llama_server_leaves_and_returns(node, llama_server):
    """SIGSTOP: the port still accepts connections (the kernel's backlog) and nothing answers, not
    even /metrics: no answer within the deadline and nothing to show progress is not serving."""
    pid = llama_server.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        proc, record = probe(node, llama_server, timeout=2.0)
        assert proc.returncode == 1 and record["verdict"] == "down", record
        assert record["reason"].startswith("no answer within the deadline, and the engine's /metrics cannot be read"), (
            record
        )
        assert record["elapsed_s"] >= 2.0 * 0.98
        assert agent_says(node) == "down #engine-down"
    finally:
        os.kill(pid, signal.SIGCONT)
    proc, record = probe(node, llama_server, timeout=30.0)
    assert record["verdict"] == "serving", record
    assert agent_says(node) == "up"
