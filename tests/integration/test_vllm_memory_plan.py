# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The module gpufleet.node.vllm_memory_plan (run as Ansible runs it, JSON on stdin), and the
planner's arithmetic against vLLM's own start-up logs (tests/data/vllm/, sources inside)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.serving import _kvplan
from tests.harness import modules

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "vllm"
GiB = 1024**3


def run_module(args, check_mode=False):
    return modules.run_module("vllm_memory_plan", args, check_mode=check_mode)


@pytest.mark.parametrize("check_mode", [False, True])
def test_contract_fields(check_mode):
    res = run_module(
        {
            "model": "Llama-3.3-70B-Instruct",
            "gpu_memory_mib": 49140,
            "tensor_parallel_size": 4,
            "gpu_memory_utilization": 0.88,
            "kv_cache_dtype": "auto",
            "max_model_len": 32768,
            "max_num_seqs": 32,
        },
        check_mode,
    )
    assert res["changed"] is False and not res.get("failed")
    assert res["kv_bytes_per_token"] == 327680
    assert res["kv_bytes_per_token_per_gpu"] == 81920
    assert res["fits"] is True and res["reasons"] == []
    assert 3 <= res["max_concurrency"] < 4
    assert res["kv_capacity_tokens"] == res["plan"]["kv_capacity_tokens"] > 3 * 32768
    assert res["vllm_error"] is None


def test_misfit_is_reported_not_failed():
    res = run_module(
        {
            "model": "Llama-3.1-70B-Instruct",
            "gpu_memory_mib": 81920,
            "tensor_parallel_size": 2,
            "gpu_memory_utilization": 0.8,
            "max_model_len": 8192,
        }
    )
    assert not res.get("failed") and res["fits"] is False
    assert res["reasons"][0].startswith("weights alone exceed the budget: 65.71 GiB of weights per GPU")
    assert res["vllm_error"].startswith("No available memory for the cache blocks.")


def test_config_json_dict_and_mla():
    res = run_module(
        {
            "model": {
                "num_hidden_layers": 27,
                "num_attention_heads": 16,
                "num_key_value_heads": 16,
                "hidden_size": 2048,
                "kv_lora_rank": 512,
                "qk_rope_head_dim": 64,
                "num_parameters": 15706484224,
                "torch_dtype": "bfloat16",
            },
            "gpu_memory_mib": 46068,
            "max_model_len": 32768,
        }
    )
    assert res["kv_bytes_per_token"] == 31104 and res["plan"]["attention"] == "mla"


def test_inputs_that_describe_no_plan_fail_with_what_to_do():
    res = run_module({"model": "gpt-17", "gpu_memory_mib": 46068})
    assert res["failed"] and "unknown model profile 'gpt-17'" in res["msg"]
    res = run_module({"model": "Llama-3.1-8B-Instruct", "gpu_memory_mib": 46068, "kv_cache_dtype": "fp4"})
    assert res["failed"] and "value of kv_cache_dtype must be one of" in res["msg"]


def _profiling(path):
    text = path.read_text()
    nums = {}
    for key, pattern in (
        ("total", r"total_gpu_memory\s*\(?([\d.]+)GiB"),
        ("util", r"gpu_memory_utilization\s*\(?([\d.]+)"),
        ("weights", r"model weights take\s+([\d.]+)GiB"),
        ("non_torch", r"non_torch_memory(?: takes)?\s+([\d.]+)GiB"),
        ("activation", r"activation peak memory(?: takes)?\s+([\d.]+)GiB"),
        ("kv", r"(?:available_kv_cache_memory|reserved for KV Cache is)\s+([\d.]+)GiB"),
    ):
        nums[key] = float(re.search(pattern, text).group(1))
    return nums


@pytest.mark.parametrize("sample", ["memory_profiling_llama3_8b_h100.log", "memory_profiling_rtx4090_tp.log"])
def test_pool_formula_matches_vllms_own_logs(sample):
    """requested - weights - non-torch - activation = the KV pool vLLM logged, to 0.01 GiB."""
    n = _profiling(DATA / sample)
    plan = _kvplan.plan(
        {
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "weight_bytes": int(n["weights"] * GiB),
        },
        gpu_memory_mib=int(round(n["total"] * 1024)),
        gpu_memory_utilization=n["util"],
        max_model_len=1024,
        activation_bytes=int(n["activation"] * GiB),
        non_torch_bytes=int(n["non_torch"] * GiB),
        cuda_graph_bytes=0,
    )
    assert abs(plan["per_gpu"]["kv_pool_bytes"] / GiB - n["kv"]) < 0.015


def test_llama3_8b_weights_match_the_log():
    n = _profiling(DATA / "memory_profiling_llama3_8b_h100.log")
    assert round(_kvplan.weight_bytes(_kvplan.MODEL_PROFILES["Llama-3.1-8B-Instruct"]) / GiB, 2) == n["weights"]


def test_default_reserves_are_stated():
    plan = _kvplan.plan("Llama-3.1-8B-Instruct", 81559, max_model_len=8192)
    # one GPU: non-torch 0.5 GiB, CUDA graphs 0.5 GiB, activation ~1.2 GiB at 8192 batched tokens
    assert plan["per_gpu"]["non_torch_bytes"] == GiB // 2
    assert plan["per_gpu"]["cuda_graph_bytes"] == GiB // 2
    assert 1.0 < plan["per_gpu"]["activation_bytes"] / GiB < 1.4


@pytest.mark.parametrize(
    "args,option",
    [
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"max_model_len": -5}, "max_model_len"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_seqs": -1}, "max_num_seqs"),
        ({"block_size": 0}, "block_size"),
        ({"activation_bytes": -1}, "activation_bytes"),
        ({"gpu_count": 0}, "gpu_count"),
        ({"model": {"profile": "Llama-3.1-8B-Instruct", "num_attention_heads": 0}}, "num_attention_heads"),
    ],
)
def test_bad_numbers_fail_naming_the_option(args, option):
    """Refused, not replaced by a default: no plan, no `fits`."""
    res = run_module(dict({"model": "Llama-3.1-8B-Instruct", "gpu_memory_mib": 46068, "max_model_len": 8192}, **args))
    assert res.get("failed") and option in res["msg"], res
    assert "fits" not in res


def test_gpu_count_arrives_in_the_plan():
    res = run_module(
        {
            "model": "Llama-3.1-8B-Instruct",
            "gpu_memory_mib": 46068,
            "max_model_len": 8192,
            "tensor_parallel_size": 2,
            "gpu_count": 4,
        }
    )
    assert (res["plan"]["per_node"]["gpus"], res["plan"]["per_node"]["engine_gpus"]) == (4, 2)
