# SPDX-License-Identifier: GPL-3.0-or-later
"""node_readiness_info: the gate marker of this boot, the server's /health and /v1/models, and
the reasons a node may not take traffic. The server is the real llama-server (lab/llamacpp.py:
the cached CPU build, the tiny model) wherever it can show the case; a hand-made one (FakeHTTP)
only for what it cannot: a 503 from /health, a /v1/models behind the key, redirects."""

from __future__ import annotations

import json

import pytest

from lab import llamacpp
from tests.harness.http import FakeHTTP

BOOT = "2b95257e-cc50-4a2b-8260-36f6af9dc4dc"
KEY = "sk-readiness-0123456789"


class Server(FakeHTTP):
    """/health answering `health`, /v1/models listing `models` (behind KEY when `key`)."""

    def __init__(self, health=200, models=("Llama-3.3-70B-Instruct-FP8",), key=False):
        self.health, self.models, self.key = health, list(models), key
        super().__init__({"/health": lambda _h: (self.health, ""), "/v1/models": self._models})

    def _models(self, handler):
        if self.key and handler.headers.get("Authorization") != f"Bearer {KEY}":
            return 401, '{"error": "Unauthorized"}'
        return 200, json.dumps({"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]})


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


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    """The real llama-server (the cached CPU build) serving the tiny model, as role llamacpp_server
    runs it: behind an API key, with /health and /v1/models public (llama-server's own list)."""
    with llamacpp.tiny_server(tmp_path_factory.mktemp("llama"), api_key=KEY) as real:
        yield real


def test_a_passing_marker_of_this_boot_and_a_serving_server_is_ready(tmp_path, run_module, llama_server):
    res = run_module(
        "node_readiness_info",
        args(
            tmp_path,
            {"boot_id": BOOT, "passed": True, "judged_busbw_gbps": 23.4},
            health_url=llama_server.url + "/health",
            models_url=llama_server.url + "/v1/models",
            model=llama_server.alias,
        ),
        check_mode=True,
    )
    assert res["ready"] and res["reasons"] == [] and not res["changed"], res
    assert res["boot_id"] == BOOT and res["marker"]["judged_busbw_gbps"] == 23.4 and res["marker_current"]
    assert res["health_status"] == 200 and res["models"] == [llama_server.alias]


def test_a_serving_server_without_the_model(tmp_path, run_module, llama_server):
    res = run_module(
        "node_readiness_info",
        args(
            tmp_path,
            {"boot_id": BOOT, "passed": True},
            health_url=llama_server.url + "/health",
            models_url=llama_server.url + "/v1/models",
            model="Llama-3.3-70B-Instruct-FP8",
        ),
    )
    assert not res["ready"] and res["health_status"] == 200, res
    assert res["reasons"] == [
        f"the server does not list model Llama-3.3-70B-Instruct-FP8 on /v1/models (it lists: {llama_server.alias})"
    ], res


@pytest.mark.parametrize(
    "marker, reason",
    [
        (None, "no NCCL gate marker at {path}: the gate has not run since boot"),
        ({"boot_id": "old", "passed": True}, f"the gate marker is from another boot (old), not the current {BOOT}"),
        (
            {"boot_id": BOOT, "passed": False, "reason": "bus bandwidth 11.5 GB/s"},
            "the NCCL gate failed: bus bandwidth 11.5 GB/s",
        ),
        ({"boot_id": BOOT, "passed": "yes"}, "the NCCL gate failed: no reason recorded"),
        ("{broken", "unreadable NCCL gate marker at {path}"),
    ],
)
def test_the_marker_alone(tmp_path, run_module, marker, reason):
    a = args(tmp_path, marker)
    res = run_module("node_readiness_info", a)
    assert not res["ready"] and not res["marker_current"] and res["health_status"] is None, res
    assert len(res["reasons"]) == 1 and res["reasons"][0].startswith(reason.format(path=a["marker_path"])), res


def test_an_unhealthy_server_without_the_model(tmp_path, run_module, server):
    """Hand-made: a /health of 503 (a real llama-server answers it only while its model loads)."""
    srv = server(health=503, models=["other-model"])
    res = run_module(
        "node_readiness_info",
        args(
            tmp_path,
            {"boot_id": BOOT, "passed": True},
            health_url=srv.url + "/health",
            models_url=srv.url + "/v1/models",
            model="Llama-3.3-70B-Instruct-FP8",
        ),
    )
    assert res["reasons"] == [
        f"the server is not healthy: {srv.url}/health answered 503",
        "the server does not list model Llama-3.3-70B-Instruct-FP8 on /v1/models (it lists: other-model)",
    ], res


def test_a_server_that_does_not_answer(tmp_path, run_module):
    """A real llama-server, stopped."""
    with llamacpp.tiny_server(tmp_path) as real:
        url = real.url
    res = run_module(
        "node_readiness_info",
        args(
            tmp_path,
            {"boot_id": BOOT, "passed": True},
            health_url=url + "/health",
            models_url=url + "/v1/models",
            model="m",
            timeout=2,
        ),
    )
    assert res["health_status"] == -1 and len(res["reasons"]) == 2, res
    assert (
        res["reasons"][0].startswith(f"the server is not healthy: {url}/health answered ")
        and "refused" in res["reasons"][0]
    )
    assert "(it lists: nothing: " in res["reasons"][1]


def test_the_api_key_is_sent_and_never_returned(tmp_path, run_module, server):
    """Hand-made: vLLM asks the key on /v1/models; llama-server leaves it public."""
    srv = server(key=True)
    a = args(
        tmp_path,
        {"boot_id": BOOT, "passed": True},
        models_url=srv.url + "/v1/models",
        model="Llama-3.3-70B-Instruct-FP8",
    )
    assert "401" in run_module("node_readiness_info", a)["reasons"][0]
    res = run_module("node_readiness_info", dict(a, api_key=KEY))
    assert res["ready"], res
    assert KEY not in json.dumps(res)


def test_missing_boot_id_and_model_are_clear_errors(tmp_path, run_module):
    res = run_module(
        "node_readiness_info", {"marker_path": str(tmp_path / "m"), "boot_id_path": str(tmp_path / "none")}
    )
    assert res["failed"] and res["msg"].startswith(f"cannot read the boot id at {tmp_path / 'none'}")
    res = run_module("node_readiness_info", args(tmp_path, None, models_url="http://127.0.0.1:1/v1/models"))
    assert res["failed"] and "model" in res["msg"]


@pytest.mark.parametrize("content, why", [(b"", "empty"), (b"\n", "empty"), (b"\xff\xfe\x00", "not a boot id")])
def test_a_boot_id_that_is_empty_or_not_text_is_unreadable(tmp_path, run_module, content, why):
    """An empty boot id would match a marker written without one."""
    a = args(tmp_path, {"boot_id": "", "passed": True})
    (tmp_path / "boot_id").write_bytes(content)
    res = run_module("node_readiness_info", a)
    assert res["failed"] and res["msg"].startswith(f"cannot read the boot id at {tmp_path / 'boot_id'}: {why}"), res


@pytest.mark.parametrize("option,value", [("timeout", "nan"), ("timeout", 0), ("timeout", "inf"), ("max_bytes", 0)])
def test_limits_that_bound_nothing_are_refused(tmp_path, run_module, option, value):
    res = run_module(
        "node_readiness_info",
        args(tmp_path, {"boot_id": BOOT, "passed": True}, health_url="http://127.0.0.1:9/health", **{option: value}),
    )
    assert res["failed"] and option in res["msg"], res


def test_a_redirect_is_followed_only_to_http(tmp_path, run_module):
    """/health answering a redirect to file:// is refused, never read."""

    def redirect(target):
        def answer(handler):
            handler.send_response(302)
            handler.send_header("Location", target)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return 302, b""  # not sent: the handler already answered

        return answer

    with FakeHTTP({"/start": redirect("/health"), "/health": redirect("file:///etc/hostname")}) as srv:
        res = run_module(
            "node_readiness_info", args(tmp_path, {"boot_id": BOOT, "passed": True}, health_url=srv.url + "/start")
        )
        assert srv.requests == ["/start", "/health"]
    assert res["ready"] is False and res["health_status"] == -1, res
    assert "only http:// and https:// URLs are fetched" in res["reasons"][0]


# -- the GPU health verdict (role gpu_health and its watcher), beside the marker ---------------------
FAILED_XID = {
    "name": "xid",
    "status": "fail",
    "gpus": ["0000:3b:00.0"],
    "action": "reboot",
    "reason": "XID 79 on 0000:3b:00.0 (GPU has fallen off the bus, fail)",
}


def health(tmp_path, verdict, name="gpu-health.json"):
    (tmp_path / name).write_text(verdict if isinstance(verdict, str) else json.dumps(verdict))


def test_a_failed_gpu_health_verdict_of_this_boot_keeps_a_node_out(tmp_path, run_module):
    a = args(tmp_path, {"boot_id": BOOT, "passed": True})
    verdict = {"boot_id": BOOT, "passed": False, "source": "gpu-health-watch", "checks": [FAILED_XID]}
    health(tmp_path, verdict)
    res = run_module("node_readiness_info", a)
    assert res["ready"] is False and res["marker_current"] is True and res["gpu_health"] == verdict
    assert res["reasons"] == [
        "GPU health failed (gpu-health-watch): xid: XID 79 on 0000:3b:00.0 (GPU has "
        "fallen off the bus, fail) (action: reboot)"
    ]
    # The node's HAProxy agent: the same rule, the same words.
    from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _readiness

    assert _readiness.agent_answer(a["marker_path"], a["boot_id_path"]) == "down #" + res["reasons"][0]


@pytest.mark.parametrize(
    "verdict, ready",
    [
        ({"boot_id": BOOT, "passed": True, "checks": []}, True),
        ({"boot_id": "an-earlier-boot", "passed": False, "checks": [FAILED_XID]}, True),
        ({"boot_id": BOOT, "passed": "true", "checks": []}, False),  # a JSON true only
        ({"boot_id": BOOT, "checks": [], "reason": "gpu_facts: no driver"}, False),
        ("{not json", False),
        ("[]", False),
        # malformed verdicts of this boot keep the node out, described, never a TypeError
        ({"boot_id": BOOT, "passed": False, "checks": 5}, False),
        ({"boot_id": BOOT, "passed": False, "checks": "xid", "reason": ["XID 79"]}, False),
        ({"boot_id": BOOT, "passed": False, "reason": {"xid": 79}}, False),
    ],
)
def test_the_gpu_health_verdict_alone(tmp_path, run_module, verdict, ready):
    a = args(tmp_path, {"boot_id": BOOT, "passed": True})
    health(tmp_path, verdict)
    res = run_module("node_readiness_info", a)
    assert res["ready"] is ready, res
    if not ready:
        assert res["reasons"][0].startswith(("GPU health failed", "unreadable GPU health verdict at "))


def test_the_gpu_health_verdict_path_can_be_given(tmp_path, run_module):
    health(
        tmp_path,
        {"boot_id": BOOT, "passed": False, "source": "gpu_health", "checks": [FAILED_XID]},
        name="elsewhere.json",
    )
    a = args(tmp_path, {"boot_id": BOOT, "passed": True})
    assert run_module("node_readiness_info", a)["ready"] is True
    res = run_module("node_readiness_info", dict(a, health_path=str(tmp_path / "elsewhere.json")))
    assert res["ready"] is False and "(action: reboot)" in res["reasons"][0]
