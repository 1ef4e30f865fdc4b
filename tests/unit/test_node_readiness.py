# SPDX-License-Identifier: GPL-3.0-or-later
"""node_readiness_info: the gate marker of this boot, the server's /health and /v1/models, and
the reasons a node may not take traffic."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

BOOT = "2b95257e-cc50-4a2b-8260-36f6af9dc4dc"
KEY = "sk-readiness-0123456789"


class Server:
    """/health answering `health`, /v1/models listing `models` (behind KEY when `key`)."""

    def __init__(self, health=200, models=("Llama-3.3-70B-Instruct-FP8",), key=False):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/health":
                    code, body = outer.health, b""
                elif self.path == "/v1/models":
                    if outer.key and self.headers.get("Authorization") != f"Bearer {KEY}":
                        code, body = 401, b'{"error": "Unauthorized"}'
                    else:
                        code = 200
                        body = json.dumps({"object": "list", "data": [{"id": m, "object": "model"} for m in outer.models]}).encode()
                else:
                    code, body = 404, b""
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.health, self.models, self.key = health, list(models), key
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    made = []

    def make(**kw):
        made.append(Server(**kw))
        return made[-1]
    yield make
    for s in made:
        s.close()


def args(tmp_path, marker=None, **kw):
    (tmp_path / "boot_id").write_text(BOOT + "\n")
    path = tmp_path / "nccl-gate.json"
    if marker is not None:
        path.write_text(marker if isinstance(marker, str) else json.dumps(marker))
    return dict({"marker_path": str(path), "boot_id_path": str(tmp_path / "boot_id")}, **kw)


def test_a_passing_marker_of_this_boot_and_a_serving_server_is_ready(tmp_path, run_module, server):
    srv = server()
    res = run_module("node_readiness_info", args(
        tmp_path, {"boot_id": BOOT, "passed": True, "judged_busbw_gbps": 23.4},
        health_url=srv.url + "/health", models_url=srv.url + "/v1/models", model="Llama-3.3-70B-Instruct-FP8"),
        check_mode=True)
    assert res["ready"] and res["reasons"] == [] and not res["changed"], res
    assert res["boot_id"] == BOOT and res["marker"]["judged_busbw_gbps"] == 23.4 and res["marker_current"]
    assert res["health_status"] == 200 and res["models"] == ["Llama-3.3-70B-Instruct-FP8"]


@pytest.mark.parametrize("marker, reason", [
    (None, "no NCCL gate marker at {path}: the gate has not run since boot"),
    ({"boot_id": "old", "passed": True}, f"the gate marker is from another boot (old), not the current {BOOT}"),
    ({"boot_id": BOOT, "passed": False, "reason": "bus bandwidth 11.5 GB/s"}, "the NCCL gate failed: bus bandwidth 11.5 GB/s"),
    ({"boot_id": BOOT, "passed": "yes"}, "the NCCL gate failed: no reason recorded"),
    ("{broken", "unreadable NCCL gate marker at {path}"),
])
def test_the_marker_alone(tmp_path, run_module, marker, reason):
    a = args(tmp_path, marker)
    res = run_module("node_readiness_info", a)
    assert not res["ready"] and not res["marker_current"] and res["health_status"] is None, res
    assert len(res["reasons"]) == 1 and res["reasons"][0].startswith(reason.format(path=a["marker_path"])), res


def test_an_unhealthy_server_without_the_model(tmp_path, run_module, server):
    srv = server(health=503, models=["other-model"])
    res = run_module("node_readiness_info", args(
        tmp_path, {"boot_id": BOOT, "passed": True}, health_url=srv.url + "/health",
        models_url=srv.url + "/v1/models", model="Llama-3.3-70B-Instruct-FP8"))
    assert res["reasons"] == [
        f"the server is not healthy: {srv.url}/health answered 503",
        "the server does not list model Llama-3.3-70B-Instruct-FP8 on /v1/models (it lists: other-model)"], res


def test_a_server_that_does_not_answer(tmp_path, run_module, server):
    srv = server()
    url = srv.url
    srv.close()
    res = run_module("node_readiness_info", args(
        tmp_path, {"boot_id": BOOT, "passed": True}, health_url=url + "/health", models_url=url + "/v1/models",
        model="m", timeout=2))
    assert res["health_status"] == -1 and len(res["reasons"]) == 2, res
    assert res["reasons"][0].startswith(f"the server is not healthy: {url}/health answered ") and "refused" in res["reasons"][0]
    assert "(it lists: nothing: " in res["reasons"][1]


def test_the_api_key_is_sent_and_never_returned(tmp_path, run_module, server):
    srv = server(key=True)
    a = args(tmp_path, {"boot_id": BOOT, "passed": True}, models_url=srv.url + "/v1/models",
             model="Llama-3.3-70B-Instruct-FP8")
    assert "401" in run_module("node_readiness_info", a)["reasons"][0]
    res = run_module("node_readiness_info", dict(a, api_key=KEY))
    assert res["ready"], res
    assert KEY not in json.dumps(res)


def test_missing_boot_id_and_model_are_clear_errors(tmp_path, run_module):
    res = run_module("node_readiness_info", {"marker_path": str(tmp_path / "m"), "boot_id_path": str(tmp_path / "none")})
    assert res["failed"] and res["msg"].startswith(f"cannot read the boot id at {tmp_path / 'none'}")
    res = run_module("node_readiness_info", args(tmp_path, None, models_url="http://127.0.0.1:1/v1/models"))
    assert res["failed"] and "model" in res["msg"]
