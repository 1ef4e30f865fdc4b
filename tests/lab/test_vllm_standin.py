# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab's vLLM stand-in: vLLM's command line, its start-up refusals, its HTTP endpoints."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.serving import _kvplan, _vllm
from lab.standins import vllm_server as standin

REPO = Path(__file__).resolve().parents[2]
VLLM = REPO / "lab" / "bin" / "vllm"


def write(tmp_path, text, name="config.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_cli_wins_over_the_config_file(tmp_path):
    cfg = write(tmp_path, "model: meta-llama/Llama-3.1-8B-Instruct\nmax-model-len: 8192\nport: 9000\n")
    opts, code = standin.parse(
        [
            "--config",
            cfg,
            "--port",
            "9100",
            "--enable-prefix-caching",
            "--no-enable-prefix-caching",
            "--served-model-name",
            "small",
        ]
    )
    assert code is None
    assert opts["port"] == 9100 and opts["max_model_len"] == 8192
    assert opts["enable_prefix_caching"] is False
    assert opts["served_model_name"] == "small"


@pytest.mark.parametrize("flag", ["--swap-space", "--calculate-kv-scales"])
def test_removed_flags_fail_like_vllms_parser(tmp_path, capsys, flag):
    cfg = write(tmp_path, "model: meta-llama/Llama-3.1-8B-Instruct\n")
    assert standin.main(["serve", "--config", cfg, flag, "4"]) == 2
    assert "error: unrecognized arguments: " + flag in capsys.readouterr().err
    cfg2 = write(tmp_path, "model: x\n%s: 4\n" % flag[2:].replace("-", "_"), "removed.yaml")
    assert standin.main(["serve", "--config", cfg2]) == 2


def test_max_model_len_that_does_not_fit_gives_vllms_own_error(lab_node):
    node = lab_node("l40s-4x-switch")
    opts, _ = standin.parse(
        ["meta-llama/Llama-3.3-70B-Instruct", "--tensor-parallel-size", "4", "--max-model-len", "131072"]
    )
    error, facts = standin.engine_check(opts, standin.visible_gpus(node))
    assert error.startswith(
        "ValueError: To serve at least one request with the model's max seq len (131072), "
        "(10.0 GiB KV cache is needed, which is larger than the available KV cache memory ("
    )
    assert "Based on the available memory, the estimated maximum model length is" in error
    assert 0 < facts["pool"] < 10 * 1024**3


def test_no_kv_pool_and_oom_and_world_size(lab_node):
    gpus = standin.visible_gpus(lab_node("l40s-4x-switch"))
    opts, _ = standin.parse(["meta-llama/Llama-3.1-8B-Instruct", "--gpu-memory-utilization", "0.3"])
    assert standin.engine_check(opts, gpus)[0].startswith("ValueError: No available memory for the cache blocks.")
    opts, _ = standin.parse(["meta-llama/Llama-3.3-70B-Instruct", "--tensor-parallel-size", "1"])
    assert standin.engine_check(opts, gpus)[0].startswith("torch.OutOfMemoryError: CUDA out of memory.")
    opts, _ = standin.parse(["meta-llama/Llama-3.1-8B-Instruct", "--tensor-parallel-size", "8"])
    assert "World size (8) is larger than the number of available GPUs (4)" in standin.engine_check(opts, gpus)[0]


def test_a_gpu_handed_to_vfio_is_not_there(lab_node):
    gpus = standin.visible_gpus(lab_node("vfio-passthrough"))
    assert len(gpus) == 3
    opts, _ = standin.parse(["meta-llama/Llama-3.1-8B-Instruct", "--tensor-parallel-size", "4"])
    assert "available GPUs (3)" in standin.engine_check(opts, gpus)[0]


@pytest.mark.parametrize("model", sorted(_kvplan.MODEL_PROFILES))
def test_what_the_planner_accepts_the_lab_starts(lab_node, model):
    """The planner's reserves are larger than what the lab 'measures': an accepted config starts."""
    gpus = standin.visible_gpus(lab_node("l40s-4x-switch"))
    out = next(
        o for o in (_vllm.serve_config(model, "L40S", n) for n in (1, 2, 4)) if _kvplan.plan(**o["plan_args"])["fits"]
    )
    opts, code = standin.parse([])
    opts.update(out["config"])
    error, facts = standin.engine_check(opts, gpus)
    assert error is None, error
    plan = _kvplan.plan(**out["plan_args"])
    assert facts["pool"] >= plan["kv_pool_bytes"]


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_serves_health_models_and_v1_metrics(lab_node, tmp_path):
    node = lab_node("l40s-4x-switch")
    port = _free_port()
    cfg = write(
        tmp_path,
        "model: meta-llama/Llama-3.1-8B-Instruct\nserved_model_name: small\nhost: 127.0.0.1\n"
        "port: %d\nmax_model_len: 16384\n" % port,
    )
    env = dict(os.environ, GPUFLEET_LAB_ROOT=str(node.root), GPUFLEET_LAB_VLLM_STARTUP_S="0", VLLM_API_KEY="sekrit")
    proc = subprocess.Popen(
        [sys.executable, str(VLLM), "serve", "--config", cfg],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(100):
            try:
                status, body = _get("http://127.0.0.1:%d/health" % port)
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        assert (status, body) == (200, b"")
        assert _get("http://127.0.0.1:%d/v1/models" % port)[0] == 401
        status, body = _get("http://127.0.0.1:%d/v1/models" % port, {"Authorization": "Bearer sekrit"})
        data = json.loads(body)["data"][0]
        assert (status, data["id"], data["root"], data["max_model_len"]) == (
            200,
            "small",
            "meta-llama/Llama-3.1-8B-Instruct",
            16384,
        )
        status, body = _get("http://127.0.0.1:%d/metrics" % port)
        text = body.decode()
        for name in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:num_preemptions_total",
            "vllm:time_to_first_token_seconds_bucket",
        ):
            assert name + "{" in text
        assert "vllm:gpu_cache_usage_perc" not in text
        assert 'model_name="small"' in text
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert "GPU KV cache size:" in err and "Maximum concurrency for 16,384 tokens per request" in err


def test_refusal_exits_1_without_opening_the_port(lab_node, tmp_path):
    node = lab_node("l40s-4x-switch")
    port = _free_port()
    cfg = write(
        tmp_path,
        "model: meta-llama/Llama-3.3-70B-Instruct\ntensor_parallel_size: 4\nmax_model_len: 131072\nport: %d\n" % port,
    )
    res = subprocess.run(
        [sys.executable, str(VLLM), "serve", "--config", cfg],
        capture_output=True,
        text=True,
        env=dict(os.environ, GPUFLEET_LAB_ROOT=str(node.root)),
        timeout=30,
    )
    assert res.returncode == 1
    assert "To serve at least one request with the model's max seq len (131072)" in res.stderr
    assert "Engine core initialization failed" in res.stderr


def test_the_checkpoint_table_comes_from_the_model_profiles():
    """One source for the checkpoints' shapes (plugins/module_utils/serving/_model_profiles.py), read by
    the stand-in by path: every profile is a checkpoint the lab has, with the profile's shape."""
    assert set(standin.CHECKPOINTS) == {p["hf_id"] for p in _kvplan.MODEL_PROFILES.values()}
    for profile in _kvplan.MODEL_PROFILES.values():
        layers, kv_heads, head_dim, loaded, mla, hidden, vocab = standin.CHECKPOINTS[profile["hf_id"]]
        assert (layers, hidden, vocab) == (profile["num_hidden_layers"], profile["hidden_size"], profile["vocab_size"])
        assert mla == (profile["kv_lora_rank"] + profile["qk_rope_head_dim"] if "kv_lora_rank" in profile else 0)
        assert kv_heads == profile["num_key_value_heads"] and head_dim == profile["head_dim"]
    # the weights' bytes are the lab's own arithmetic: 16-bit checkpoints 2 bytes a parameter, the FP8
    # one 1 byte except its embeddings and lm_head (the published checkpoint is ~72.7 GB)
    assert standin.CHECKPOINTS["meta-llama/Llama-3.1-8B-Instruct"][3] == 8030261248 * 2
    assert 72.6e9 < standin.CHECKPOINTS["RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic"][3] < 72.7e9


def test_the_stand_in_imports_no_collection_code():
    """The lab checks the planner: it loads the profile data file by path, never the collection."""
    import ast

    tree = ast.parse((REPO / "lab" / "standins" / "vllm_server.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not [m for m in imported if m.startswith(("ansible_collections", "plugins"))], imported
