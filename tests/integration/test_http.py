# SPDX-License-Identifier: GPL-3.0-or-later
"""module_utils/common/_http.py, the one bounded HTTP client, against real local servers that misbehave
(one that drips its answer, one whose answer is too large), and the modules that read HTTP
through it (vllm_metrics_info, vllm_load_test, node_readiness_info): http/https only, one
overall deadline, a size limit (a deadline on every wait, a limit on every read)."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.common import _http

BOOT = "2b95257e-cc50-4a2b-8260-36f6af9dc4dc"


class BadServer:
    """A TCP server answering every request the same way.

    ``drip``: a 200 answer whose bytes come one every ``interval`` seconds (from the status line
    on with ``in_headers``), each read on its own well inside any per-read timeout;
    ``length``: a ``Content-Length`` of ``size`` then that many bytes; ``chunked``: ``size``
    bytes in 64 KiB chunks; ``close``: ``size`` bytes without a length, then the connection closes.
    """

    def __init__(self, mode, size=0, interval=0.2, in_headers=False):
        self.mode, self.size, self.interval, self.in_headers = mode, size, interval, in_headers
        self.sent = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped.is_set():
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn):
        try:
            conn.settimeout(2)
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            if self.mode == "drip":
                head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n"
                if not self.in_headers:
                    conn.sendall(head)
                    head = b""
                for byte in head + b"#" * 100000:
                    if self.stopped.wait(self.interval):
                        return
                    conn.sendall(bytes([byte]))
                    self.sent += 1
                return
            headers = {
                "length": "Content-Length: %d\r\n" % self.size,
                "chunked": "Transfer-Encoding: chunked\r\n",
                "close": "Connection: close\r\n",
            }[self.mode]
            conn.sendall(("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n%s\r\n" % headers).encode())
            block = b"# HELP filler\n" * 4681  # about 64 KiB of valid exposition comments
            while self.sent < self.size and not self.stopped.is_set():
                piece = block[: self.size - self.sent]
                conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if self.mode == "chunked" else piece)
                self.sent += len(piece)
            if self.mode == "chunked":
                conn.sendall(b"0\r\n\r\n")
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.stopped.set()
        self.sock.close()


@pytest.fixture
def bad_server():
    made = []

    def make(*args, **kw):
        made.append(BadServer(*args, **kw))
        return made[-1]

    yield make
    for server in made:
        server.close()


# --- the helper ------------------------------------------------------------------------------


@pytest.mark.parametrize("in_headers", [False, True], ids=["body", "headers"])
def test_dripping_server_hits_overall_deadline(bad_server, in_headers):
    """A byte every 0.2 s keeps every single read well inside a 1 s timeout: only an overall
    deadline ends it."""
    server = bad_server("drip", interval=0.2, in_headers=in_headers)
    with pytest.raises(_http.HttpError, match=r"no complete answer within 1 s \(the overall deadline"):
        _http.get(server.url + "/metrics", timeout=1.0)
    # Cut while the answer was still dripping (its 100,000 bytes take hours), after some of it.
    assert 2 <= server.sent <= 8


def test_dripping_server_hits_overall_deadline_while_streaming(bad_server):
    server = bad_server("drip", interval=0.1)
    lines = 0
    with pytest.raises(_http.HttpError, match="overall deadline"):
        with _http.request("POST", server.url + "/v1/completions", body=b"{}", timeout=0.8) as answer:
            for _line in answer.lines():
                lines += 1
    # Cut while the body was still dripping (100,000 bytes at one per 0.1 s), not at its end.
    assert 1 <= server.sent < 100


@pytest.mark.parametrize("mode", ["length", "chunked", "close"])
def test_oversized_body_refused(bad_server, mode):
    server = bad_server(mode, size=300 * 1024 * 1024)
    with pytest.raises(_http.HttpError, match=r"limit of 1048576 bytes \(max_bytes\)"):
        _http.get(server.url + "/metrics", timeout=20, max_bytes=1024 * 1024)
    time.sleep(0.2)
    assert server.sent < 20 * 1024 * 1024, "the client stopped reading at the limit"
    if mode == "length":
        assert server.sent < 8 * 1024 * 1024, "a Content-Length above the limit is refused unread"


def test_a_body_at_the_limit_is_read(bad_server):
    server = bad_server("chunked", size=200000)
    status, body = _http.get(server.url + "/metrics", timeout=5, max_bytes=200000)
    assert status == 200 and len(body) == 200000


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "FILE:///etc/hostname",
        "ftp://127.0.0.1/metrics",
        "gopher://127.0.0.1:70/",
        "data:text/plain,hello",
        "127.0.0.1:8000/metrics",
        "/metrics",
        "http:///metrics",
        "http://[::1/metrics",
    ],
)
def test_non_http_scheme_refused(url, monkeypatch):
    def no_connection(*args, **kwargs):
        raise AssertionError("a connection was attempted for %s" % url)

    monkeypatch.setattr(_http.http.client.HTTPConnection, "connect", no_connection)
    with pytest.raises(_http.HttpError) as refused:
        _http.get(url, timeout=1)
    assert url in str(refused.value) and "http" in refused.value.what


@pytest.mark.parametrize(
    "timeout,max_bytes", [(0, 10), (-1, 10), (float("nan"), 10), (float("inf"), 10), (1, 0), (1, -5)]
)
def test_limits_that_bound_nothing_are_refused(timeout, max_bytes):
    with pytest.raises(ValueError, match="timeout|max_bytes"):
        _http.get("http://127.0.0.1:9/", timeout=timeout, max_bytes=max_bytes)


# --- the modules, through the helper ---------------------------------------------------------


def _readiness_args(tmp_path, **kw):
    (tmp_path / "boot_id").write_text(BOOT + "\n")
    (tmp_path / "gate.json").write_text(json.dumps({"boot_id": BOOT, "passed": True}))
    return dict({"marker_path": str(tmp_path / "gate.json"), "boot_id_path": str(tmp_path / "boot_id")}, **kw)


def _problem(name, res):
    """What the module said about the URL: its msg, its reasons, or its load errors."""
    if name == "node_readiness_info":
        assert res.get("ready") is False, res
        return " ".join(res["reasons"])
    if name == "vllm_load_test" and not res.get("msg", "").startswith("url must be") and "summary" in res:
        return " ".join(res["summary"]["error_examples"])
    assert res.get("failed"), res
    return res["msg"]


def _module_args(name, tmp_path, url, **kw):
    if name == "vllm_metrics_info":
        return dict({"url": url, "samples": 1}, **kw)
    if name == "vllm_load_test":
        return dict(
            {
                "url": url,
                "allowed_hosts": ["127.0.0.1"],
                "model": "m",
                "concurrency": 1,
                "duration": 0.1,
                "max_tokens": 1,
                "prompt_lengths": [1],
                "sample_interval": 5,
            },
            **kw,
        )
    return _readiness_args(tmp_path, health_url=url + "/health", **kw)


MODULES = ["vllm_metrics_info", "vllm_load_test", "node_readiness_info"]


@pytest.mark.parametrize("name", MODULES)
def test_dripping_server_hits_overall_deadline_in_every_module(run_module, bad_server, tmp_path, name):
    server = bad_server("drip", interval=0.2)
    res = run_module(name, _module_args(name, tmp_path, server.url, timeout=1.0))
    assert "no complete answer within 1 s (the overall deadline" in _problem(name, res), res
    assert server.sent < 100, "the module stopped reading at its deadline, long before the answer's end"


@pytest.mark.parametrize("name", MODULES)
def test_oversized_body_refused_in_every_module(run_module, bad_server, tmp_path, name):
    server = bad_server("close", size=300 * 1024 * 1024)
    res = run_module(name, _module_args(name, tmp_path, server.url, timeout=20, max_bytes=65536))
    assert "the answer grew past the limit of 65536 bytes (max_bytes)" in _problem(name, res), res
    assert server.sent < 64 * 1024 * 1024


@pytest.mark.parametrize("name", MODULES)
@pytest.mark.parametrize("scheme", ["file://", "ftp://127.0.0.1"])
def test_non_http_scheme_refused_in_every_module(run_module, tmp_path, name, scheme):
    secret = tmp_path / "secret"
    secret.write_text("FIRST-LINE-OF-A-PRIVATE-FILE\n")
    url = scheme + str(secret)
    res = run_module(name, _module_args(name, tmp_path, url, timeout=2))
    assert res.get("failed"), res
    assert "FIRST-LINE-OF-A-PRIVATE-FILE" not in json.dumps(res)
    assert "http" in res["msg"] and str(secret) in res["msg"], res["msg"]
