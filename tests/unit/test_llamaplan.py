# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""llama.cpp layer-offload planner: the 48 GB card of the mixed A6000/4090 field report, GGUF headers of
real models, splits.

GGUF headers are written here with the ``gguf`` package for real public model shapes (each
model's config.json on the Hugging Face hub, quantized with llama.cpp's Q4_K_M mix of
src/llama-quant.cpp); the data section is a sparse hole, so a 42 GB model costs nothing on disk.
Published file sizes to check against (bartowski's GGUF repositories on the hub):
Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf 4.92 GB, Llama-3.3-70B-Instruct-Q4_K_M.gguf 42.52 GB.
GPU sizes are nvidia-smi's memory.total: RTX A6000 49140 MiB, RTX 4090 24564 MiB.
"""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.serving import _llamaplan as lp
from ansible_collections.gpufleet.node.plugins.module_utils.serving import _model_profiles

gguf = pytest.importorskip("gguf")

MiB = 1024**2
GiB = 1024**3
RTX_A6000 = 49140
RTX_4090 = 24564


def _q4_k_m_tensors(cfg, is_70b):
    """(name, numpy-order shape, ggml type) per tensor, llama.cpp's Q4_K_M mix for llama models."""
    n, d, ff, vocab = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    Q = gguf.GGMLQuantizationType

    def more(i):
        return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2

    out = [
        ("token_embd.weight", (vocab, d), Q.Q4_K),
        ("output_norm.weight", (d,), Q.F32),
        ("output.weight", (vocab, d), Q.Q6_K),
    ]
    for i in range(n):
        v_type = Q.Q6_K if more(i) else (Q.Q5_K if is_70b else Q.Q4_K)
        out += [
            ("blk.%d.attn_norm.weight" % i, (d,), Q.F32),
            ("blk.%d.ffn_norm.weight" % i, (d,), Q.F32),
            ("blk.%d.attn_q.weight" % i, (q, d), Q.Q4_K),
            ("blk.%d.attn_k.weight" % i, (kv, d), Q.Q4_K),
            ("blk.%d.attn_v.weight" % i, (kv, d), v_type),
            ("blk.%d.attn_output.weight" % i, (d, q), Q.Q4_K),
            ("blk.%d.ffn_gate.weight" % i, (ff, d), Q.Q4_K),
            ("blk.%d.ffn_up.weight" % i, (ff, d), Q.Q4_K),
            ("blk.%d.ffn_down.weight" % i, (d, ff), Q.Q6_K if more(i) else Q.Q4_K),
        ]
    return out


def write_gguf_header(path, name, cfg, is_70b=False):
    """A GGUF file with the model's real metadata and tensor infos; the data is a sparse hole."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    total = 0
    for tname, shape, qtype in _q4_k_m_tensors(cfg, is_70b):
        per_block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        n_el = 1
        for dim in shape:
            n_el *= dim
        nbytes = n_el // per_block * block_bytes
        writer.add_tensor_info(
            tname,
            shape,
            gguf.GGMLQuantizationType.F32 if qtype == gguf.GGMLQuantizationType.F32 else qtype,
            nbytes,
            raw_dtype=qtype,
        )
        total += writer.ggml_pad(nbytes, writer.data_alignment)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    with open(path, "r+b") as handle:
        handle.seek(0, os.SEEK_END)
        start = writer.ggml_pad(handle.tell(), writer.data_alignment)
        handle.truncate(start + total)
    return path


@pytest.fixture(scope="module")
def llama70b_gguf(tmp_path_factory):
    cfg = _model_profiles.MODEL_PROFILES["Llama-3.3-70B-Instruct"]
    return write_gguf_header(
        tmp_path_factory.mktemp("gguf") / "Llama-3.3-70B-Instruct-Q4_K_M.gguf", "Llama 3.3 70B Instruct", cfg, True
    )


@pytest.fixture(scope="module")
def llama8b_gguf(tmp_path_factory):
    cfg = _model_profiles.MODEL_PROFILES["Llama-3.1-8B-Instruct"]
    return write_gguf_header(
        tmp_path_factory.mktemp("gguf") / "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", "Llama 3.1 8B Instruct", cfg
    )


# --- the GGUF header ---------------------------------------------------------------------------


@pytest.mark.parametrize("fixture,published", [("llama70b_gguf", 42.52e9), ("llama8b_gguf", 4.92e9)])
def test_gguf_header_gives_exact_tensor_bytes_near_the_published_file(request, fixture, published):
    path = request.getfixturevalue(fixture)
    result = lp.plan([RTX_A6000], model_path=str(path))
    shape = result["shape"]
    assert shape["source"] == "gguf"
    total = result["per_gpu"][0]["weight_bytes"] + result["host_bytes"]
    # the tensors alone, without the metadata and tokenizer a real file carries: within 1%
    assert abs(total - published) / published < 0.01, total


def test_gguf_header_shape_of_llama70b(llama70b_gguf):
    result = lp.plan([RTX_A6000], model_path=str(llama70b_gguf), ctx_size=4096, parallel=4)
    shape = result["shape"]
    assert (shape["n_layers"], shape["n_embd"], shape["n_head"], shape["n_head_kv"]) == (80, 8192, 64, 8)
    assert (shape["head_dim_k"], shape["n_ff"], shape["vocab_size"], shape["n_ctx_train"]) == (
        128,
        28672,
        128256,
        131072,
    )
    # 16384 cells x 8 KV heads x (128 + 128) x 2 bytes per layer
    assert result["kv_bytes_per_layer"] == 16384 * 8 * 256 * 2 == 64 * MiB


def test_profile_plan_equals_the_gguf_header_plan(llama70b_gguf):
    from_file = lp.plan([RTX_A6000], model_path=str(llama70b_gguf), ctx_size=4096, parallel=4)
    from_profile = lp.plan([RTX_A6000], model="Llama-3.3-70B-Instruct", quant="Q4_K_M", ctx_size=4096, parallel=4)
    assert from_file["n_gpu_layers"] == from_profile["n_gpu_layers"]
    assert from_file["per_gpu_bytes"] == from_profile["per_gpu_bytes"]


# --- the mixed A6000/4090 field report: 70B at 4 bits on one 48 GB card, 4 slots of 4k tokens -----


def test_seed001_all_80_layers_refused_with_the_numbers(llama70b_gguf):
    result = lp.plan([RTX_A6000], model_path=str(llama70b_gguf), ctx_size=4096, parallel=4, n_gpu_layers=80)
    assert result["fits"] is False
    (reason,) = result["reasons"]
    assert reason.startswith("n_gpu_layers 80 does not fit GPU0 (49140 MiB): 80 layer(s) need ")
    assert "KV cache (f16, 16384 tokens = 4 slots x 4096)" in reason
    assert "at most 79 layers fit" in reason


def test_seed001_auto_caps_below_80_and_cpu_keeps_the_rest(llama70b_gguf):
    result = lp.plan([RTX_A6000], model_path=str(llama70b_gguf), ctx_size=4096, parallel=4)
    assert result["fits"] is True
    assert result["n_gpu_layers"] == result["max_gpu_layers"] < 80
    assert result["per_gpu_bytes"][0] <= RTX_A6000 * MiB
    assert result["kv_bytes_total"] == result["n_gpu_layers"] * 64 * MiB
    # the held layers (seed: 60) fit with room to spare
    held = lp.plan([RTX_A6000], model_path=str(llama70b_gguf), ctx_size=4096, parallel=4, n_gpu_layers=60)
    assert held["fits"] and held["per_gpu_bytes"][0] < result["per_gpu_bytes"][0] - 8 * GiB


def test_flash_attention_and_q8_cache_fit_all_layers_and_the_output():
    result = lp.plan(
        [RTX_A6000], model="Llama-3.3-70B-Instruct", ctx_size=4096, parallel=4, cache_type="q8_0", flash_attn=True
    )
    assert result["fits"] and result["n_gpu_layers"] == 81 and result["offloads_output"]
    # q8_0: 34 bytes per 32 elements
    assert result["kv_bytes_per_layer"] == 16384 * 2 * (1024 // 32) * 34


def test_quantized_cache_without_flash_attention_is_refused():
    result = lp.plan([RTX_A6000], model="Llama-3.1-8B-Instruct", cache_type="q4_0")
    assert result["fits"] is False
    assert "V cache quantization requires flash_attn" in result["reasons"][0]


# --- heterogeneous GPUs ------------------------------------------------------------------------


def test_a6000_and_4090_split_all_layers_by_room():
    result = lp.plan([RTX_A6000, RTX_4090], model="Llama-3.3-70B-Instruct", ctx_size=4096, parallel=4)
    assert result["fits"] and result["n_gpu_layers"] == 81
    big, small = result["layers_per_gpu"]
    assert big + small == 81 and big > 2 * small - 10
    assert result["tensor_split"] == [round(big / 81, 4), round(small / 81, 4)]
    for used, cap in zip(result["per_gpu_bytes"], [RTX_A6000, RTX_4090], strict=False):
        assert used <= cap * MiB
    args = lp.server_args(result, 4096, 4)
    assert args[args.index("--tensor-split") + 1] == "%d,%d" % (big, small)
    assert args[args.index("--ctx-size") + 1] == "16384"


def test_assign_is_llamacpp_upper_bound_rule():
    # llama.cpp: layer j of n goes to upper_bound(cumsplit, j / n); whole counts give exact counts
    assert lp.assign(81, [55, 26]) == [55, 26]
    assert lp.assign(10, [1, 1, 1]) == [4, 3, 3]


def test_given_tensor_split_that_overloads_the_small_gpu_is_refused():
    result = lp.plan(
        [RTX_A6000, RTX_4090],
        model="Llama-3.3-70B-Instruct",
        ctx_size=4096,
        parallel=4,
        n_gpu_layers=81,
        tensor_split=[1, 1],
    )
    assert result["fits"] is False
    assert any("GPU1 (24564 MiB)" in r for r in result["reasons"])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"gpu_memory_mib": []}, "gpu_memory_mib"),
        ({"gpu_memory_mib": [1000], "model": "nope"}, "unknown profile"),
        ({"gpu_memory_mib": [1000], "model": "Llama-3.1-8B-Instruct", "ctx_size": 0}, "ctx_size"),
        ({"gpu_memory_mib": [1000], "model": "Llama-3.1-8B-Instruct", "cache_type": "q5_1"}, "cache_type"),
        ({"gpu_memory_mib": [1000], "model_path": "/nonexistent.gguf"}, "model_path"),
        ({"gpu_memory_mib": [1000]}, "model"),
    ],
)
def test_bad_inputs_name_the_option(kwargs, match):
    with pytest.raises(lp.PlanError, match=match):
        lp.plan(**kwargs)


# --- llama-server's /metrics in vllm_metrics_info's figures ---------------------------------------


def test_llamacpp_metric_names_are_read_as_the_running_and_waiting_figures():
    from ansible_collections.gpufleet.node.plugins.module_utils.serving import _vllm_metrics

    # llama-server --metrics (tools/server/server.cpp of the pinned llama.cpp: HELP, TYPE, sample)
    text = (
        "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
        "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 12\n"
        "# HELP llamacpp:requests_processing Number of requests processing.\n"
        "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n"
        "# HELP llamacpp:requests_deferred Number of requests deferred.\n"
        "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 3\n"
    )
    values = _vllm_metrics.gauge_values(_vllm_metrics.parse(text))
    assert values["num_requests_running"] == 2 and values["num_requests_waiting"] == 3
    assert values["kv_cache_usage_perc"] is None  # llama.cpp has no such series: not judged, not zero
