# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab's `engine-wedge` fault on the vLLM stand-in: /health and /metrics still answer (the
metrics frozen), completions never return; a server started after the fault serves again, and
`clear` ends it for a running one. Judged from the outside, by the HTTP answers only."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import lab.hwmodel as hw

REPO = Path(__file__).resolve().parents[2]
VLLM = REPO / "lab" / "bin" / "vllm"


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url):
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, resp.read().decode()


def _complete(port, timeout):
    body = json.dumps({"model": "small", "prompt": "ping", "max_tokens": 1}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, json.loads(resp.read())


def _generated(port):
    text = _get(f"http://127.0.0.1:{port}/metrics")[1]
    return float(re.search(r"^vllm:generation_tokens_total\{[^}]*\} (\S+)$", text, re.M).group(1)), text


@pytest.fixture
def server(lab_node, tmp_path):
    node = lab_node("l40s-4x-switch")
    cfg = tmp_path / "config.yaml"
    procs = []

    def start():
        port = _free_port()
        cfg.write_text(
            "model: meta-llama/Llama-3.1-8B-Instruct\nserved_model_name: small\nhost: 127.0.0.1\n"
            f"port: {port}\nmax_model_len: 16384\n"
        )
        env = dict(os.environ, GPUFLEET_LAB_ROOT=str(node.root), GPUFLEET_LAB_VLLM_STARTUP_S="0")
        proc = subprocess.Popen(
            [sys.executable, str(VLLM), "serve", "--config", str(cfg)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        for _ in range(200):
            try:
                _get(f"http://127.0.0.1:{port}/health")
                return proc, port
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        raise AssertionError(proc.stderr.read() if proc.poll() is not None else "the stand-in did not open its port")

    yield node, start
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)


def test_a_wedged_engine_answers_health_and_metrics_but_no_completion(server):
    node, start = server
    proc, port = start()
    assert _complete(port, 30)[0] == 200
    before, _text = _generated(port)
    assert before >= 1
    node.inject("engine-wedge")
    time.sleep(1.0)  # the stand-in reads the fault channel every half second
    assert _get(f"http://127.0.0.1:{port}/health") == (200, "")
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        _complete(port, 3)
    frozen, text = _generated(port)
    assert frozen == before and _generated(port)[1] == text  # counters and gauges frozen

    # a server (re)started after the fault serves; the running one stays wedged until `clear`
    _proc2, port2 = start()
    assert _complete(port2, 30)[0] == 200
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        _complete(port, 2)
    hw.health.clear(node.root, node.data)
    assert _complete(port, 30)[0] == 200
    assert _generated(port)[0] > before
