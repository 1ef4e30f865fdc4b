# SPDX-License-Identifier: GPL-3.0-or-later
"""A heterogeneous node (profile ``a6000-4090-hetero``: an RTX A6000 and an RTX 4090, the mixed A6000/4090 field report)
served by the REAL llama.cpp ``llama-server`` behind the lab's HAProxy, after site.yml.

``gpufleet_serving_backend`` is left at ``auto``: the GPUs differ in size, so the node must be
served by llama.cpp with the plan's layers and split, its choice recorded in the gate's marker;
the other nodes of the fleet keep vLLM. Runs on the session fleet's heterogeneous nodes
(``GPUFLEET_FLEET_PROFILES`` including ``a6000-4090-hetero``); skipped, saying so, without one.
One converged fleet, read many ways; one short run of its own: the acceptance load test against
llama-server (its port and its key).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import pytest

from lab.fleet import LAB_MODEL
from tests.harness.lab import FLEET_LLAMACPP_NODES, FLEET_PROFILES

pytestmark = pytest.mark.slow

PROFILES = FLEET_PROFILES


HETERO = FLEET_LLAMACPP_NODES
UNIFORM = [f"node{i + 1}" for i in range(len(PROFILES)) if f"node{i + 1}" not in HETERO]


@pytest.fixture(params=HETERO or [None], ids=lambda n: n or "none")
def hetero(request):
    if request.param is None:
        pytest.skip(
            "the fleet has no node with GPUs of different sizes (GPUFLEET_FLEET_PROFILES: add a6000-4090-hetero)"
        )
    return request.param


def test_heterogeneous_node_serves_with_llamacpp_behind_haproxy(converged, hetero):
    node = hetero
    # the choice and its reason, in the gate's marker of this boot
    marker = json.loads(converged.sh(node, "cat /run/gpufleet/nccl-gate.json"))
    assert marker["passed"] is True
    assert marker["serving_backend"] == "llamacpp"
    assert "differ in size (49140, 24564 MiB)" in marker["serving_backend_reason"]

    # the plan's command line: the 4 layers and the output of the tiny model on the GPUs, split by room
    env = converged.sh(node, "cat /etc/llamacpp/llama-server.env")
    (args,) = re.findall(r'^LLAMACPP_SERVER_ARGS="([^"]*)"$', env, re.M)
    args = args.split()
    assert args[args.index("--n-gpu-layers") + 1] == "5"
    assert args[args.index("--split-mode") + 1] == "layer"
    assert args[args.index("--tensor-split") + 1] == "4,1"  # the A6000 the layers, the 4090 the output
    assert args[args.index("--ctx-size") + 1] == "1024" and "--metrics" in args
    assert "fits: gpufleet-tiny-llama with 4 of 4 layers on 2 GPU(s) + output (split 4,1)" in env

    # the real llama-server under systemd, reading the runtime env file like vLLM's unit
    state = converged.unit_state(node, "llama-server.service")
    assert (state["ActiveState"], state["SubState"]) == ("active", "running"), state
    unit = converged.sh(node, "systemctl cat llama-server.service")
    assert "EnvironmentFile=-/etc/gpufleet/gpu-runtime.env" in unit
    assert converged.sh(
        node, "readlink -f /proc/$(systemctl show -p MainPID --value llama-server.service)/exe"
    ).strip() == ("/usr/local/bin/llama-server")
    assert converged.unit_state(node, "vllm.service").get("ActiveState") in ("inactive", None, "")
    # the API key: the node's vLLM key (vaulted vllm_server_api_key), in a 0600 root-owned env file the
    # unit reads, never on the command line nor in the unit
    key = converged.secrets["vllm_server_api_key"]
    assert converged.sh(node, "stat -c '%a %U' /etc/llamacpp/secrets.env").split() == ["600", "root"]
    assert "EnvironmentFile=/etc/llamacpp/secrets.env" in unit and key not in unit and key not in env
    assert key not in converged.sh(node, "cat /proc/$(systemctl show -p MainPID --value llama-server.service)/cmdline")
    assert "version:" in converged.sh(node, "/usr/local/bin/llama-server --version 2>&1")

    # /health, the OpenAI API and /metrics on the node; /health and /v1/models public (the balancer's
    # check and the node's readiness check), completions and /metrics only with the key
    assert '"ok"' in converged.sh(node, "curl -sf http://127.0.0.1:8000/health")
    codes = converged.sh(
        node,
        "for a in 'Authorization: Bearer wrong' 'X-None: 1'; do"
        " curl -s -o /dev/null -w '%{http_code} ' -H \"$a\" http://127.0.0.1:8000/metrics;"
        " curl -s -o /dev/null -w '%{http_code} ' -H \"$a\" -H 'Content-Type: application/json'"
        ' -d \'{"prompt": "hello", "max_tokens": 1}\' http://127.0.0.1:8000/v1/completions; done',
    )
    assert codes.split() == ["401"] * 4, codes
    models = json.loads(converged.sh(node, "curl -sf http://127.0.0.1:8000/v1/models"))
    # the pool's model name: every server of the backend answers for the same model
    assert [m["id"] for m in models["data"]] == [LAB_MODEL]

    # registered: HAProxy has it running and ready, and streamed completions through HAProxy's frontend reach it
    # (round robin over the pool: of 2 x (servers running) requests, those that reach this node stream)
    pool = converged.wait_pool(lambda p: p.get(node, {}).get("op_state") == "running")
    assert (pool[node]["op_state"], pool[node]["state"]) == ("running", "ready"), pool
    frontend = converged.status()["balancer"]["frontend"]
    body = json.dumps({"model": LAB_MODEL, "prompt": "hello the world", "max_tokens": 4, "stream": True})
    running = sum(1 for s in pool.values() if s.get("op_state") == "running")
    # every server of the pool (vLLM and llama.cpp) asks for the same key: without it, 401 (as many
    # requests as servers, so that the keyed ones below still reach each server in turn)
    for _ in range(running):
        bare = urllib.request.Request(
            f"http://{frontend}/v1/completions", data=body.encode(), headers={"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(bare, timeout=60).close()
        assert refused.value.code == 401
    streamed = 0
    for _ in range(2 * running):
        req = urllib.request.Request(
            f"http://{frontend}/v1/completions",
            data=body.encode(),
            headers={"Content-Type": "application/json", "Authorization": "Bearer " + key},
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            events = [ln[6:] for ln in resp.read().decode().splitlines() if ln.startswith("data: ")]
        if events and events[-1] == "[DONE]" and json.loads(events[0]).get("model") == LAB_MODEL:
            streamed += 1
    assert streamed >= 1
    metrics = converged.sh(node, f"curl -sf -H 'Authorization: Bearer {key}' http://127.0.0.1:8000/metrics")
    assert re.search(r"^llamacpp:prompt_tokens_total [1-9]", metrics, re.M), metrics


def test_acceptance_load_test_reaches_llamacpp_with_its_key(converged, hetero):
    """The acceptance load test streams from the node's llama-server (its port, its key: a missing
    key would be 401s, an error rate above the limit of 0)."""
    run = converged.site(
        "--tags",
        "acceptance",
        limit=hetero,
        extra_vars=[
            "gpufleet_acceptance_load_test=true",
            "gpufleet_acceptance_duration=2",
            "gpufleet_acceptance_concurrency=2",
            "gpufleet_acceptance_max_ttft_p95_seconds=60",
        ],
        label=f"site.yml --limit {hetero} --tags acceptance (llama.cpp)",
    )
    assert run.rc == 0 and run.recap[hetero]["failed"] == 0, run.explain()
    step = re.search(r"^TASK \[Acceptance load test\].*?\n(?=\S)(.*?)(?=^TASK |^PLAY RECAP)", run.output, re.M | re.S)
    assert step and re.search(rf"^ok: \[{hetero}(?: -> [^\]]+)?\]", step[1], re.M), run.explain()


@pytest.mark.parametrize("node", UNIFORM or [None], ids=lambda n: n or "none")
def test_identical_gpus_keep_vllm(converged, node):
    if node is None:
        pytest.skip("the fleet has no node with identical GPUs")
    marker = converged.sh(node, "cat /run/gpufleet/nccl-gate.json 2>/dev/null || true")
    if marker.strip():
        assert json.loads(marker)["serving_backend"] == "vllm"
    assert converged.unit_state(node, "llama-server.service").get("ActiveState") in ("inactive", None, "")
