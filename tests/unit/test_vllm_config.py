# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""vLLM serving knowledge: removed settings, config derivation, runtime environment."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.node.plugins.filter import kvplan as filters
from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _env
from ansible_collections.gpufleet.node.plugins.module_utils.serving import _kvplan, _vllm, _vllm_options

# --- removed settings --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key,replacement",
    [
        ("swap_space", "preempts and recomputes"),
        ("swap-space", "gpu_memory_utilization or kv_cache_memory_bytes"),
        ("calculate_kv_scales", "calibrated k/v scales"),
        ("disable_log_requests", "enable_log_requests"),
        ("num_scheduler_steps", "V0 engine"),
    ],
)
def test_removed_settings_name_their_replacement(key, replacement):
    msgs = _vllm.removed_settings({key: 1, "max_model_len": 8192})
    assert len(msgs) == 1
    assert msgs[0].startswith(key + ":")
    assert replacement in msgs[0]


def test_seed000_config_is_refused_for_calculate_kv_scales():
    seed000 = {
        "model": "meta-llama/Llama-3.3-70B-Instruct-FP8-Dynamic",
        "tensor_parallel_size": 4,
        "kv_cache_dtype": "fp8_e4m3",
        "calculate_kv_scales": True,
        "gpu_memory_utilization": 0.92,
    }
    with pytest.raises(_vllm.ServingError, match="calculate_kv_scales: removed"):
        _vllm.serve_config("Llama-3.3-70B-Instruct-FP8", "L40S", 4, overrides=seed000)


def test_seed001_swap_space_zero_is_refused_too():
    with pytest.raises(_vllm.ServingError, match="swap-space: removed"):
        _vllm.serve_config("Llama-3.3-70B-Instruct", "RTX-A6000", 4, overrides={"swap-space": 0})


# --- config derivation -------------------------------------------------------------------------


def test_config_for_70b_on_four_l40s():
    out = _vllm.serve_config("Llama-3.3-70B-Instruct", "L40S", 4)
    cfg = out["config"]
    assert list(cfg)[: len(_vllm.CONFIG_KEYS)] == list(_vllm.CONFIG_KEYS)
    assert cfg["model"] == "meta-llama/Llama-3.3-70B-Instruct"
    assert cfg["tensor_parallel_size"] == 4
    assert cfg["max_model_len"] == 16384
    assert cfg["kv_cache_dtype"] == "auto"
    assert cfg["enable_prefix_caching"] is True
    plan = _kvplan.plan(**out["plan_args"])
    assert plan["fits"]
    # max_num_seqs derived: as many 8k requests as the pool holds
    assert cfg["max_num_seqs"] == plan["kv_capacity_blocks"] * 16 // 8192


def test_fp8_kv_only_where_the_hardware_takes_it():
    assert _vllm.serve_config("Llama-3.3-70B-Instruct-FP8", "H100-80GB", 2)["config"]["kv_cache_dtype"] == "fp8"
    assert _vllm.serve_config("Llama-3.3-70B-Instruct-FP8", "A100-80GB", 2)["config"]["kv_cache_dtype"] == "auto"


def test_user_settings_win_and_extra_keys_pass_through():
    out = _vllm.serve_config(
        "Llama-3.1-8B-Instruct",
        "L40S",
        1,
        overrides={"max-num-seqs": 16, "max_model_len": 8192, "enable_log_requests": True, "kv_cache_dtype": "fp8"},
    )
    cfg = out["config"]
    assert cfg["max_num_seqs"] == 16 and out["plan_args"]["max_num_seqs"] == 16
    assert cfg["max_model_len"] == 8192
    assert cfg["enable_log_requests"] is True
    assert cfg["kv_cache_dtype"] == "fp8"
    assert "max-num-seqs" not in cfg


def test_tensor_parallel_defaults_to_a_power_of_two_dividing_the_heads():
    assert _vllm.serve_config("Llama-3.1-8B-Instruct", "L40S", 3)["config"]["tensor_parallel_size"] == 2
    assert _vllm.serve_config("Llama-3.1-70B-Instruct", "RTX-4090", 8)["config"]["tensor_parallel_size"] == 8
    with pytest.raises(_vllm.ServingError, match="needs 8 GPUs, the node has 4"):
        _vllm.serve_config("Llama-3.1-8B-Instruct", "L40S", 4, overrides={"tensor_parallel_size": 8})


def test_kv_cache_memory_bytes_replaces_utilization_in_the_config():
    out = _vllm.serve_config("Llama-3.1-8B-Instruct", "L40S", 1, overrides={"kv_cache_memory_bytes": 8 << 30})
    assert "gpu_memory_utilization" not in out["config"]
    assert out["plan_args"]["kv_cache_memory_bytes"] == 8 << 30


@pytest.mark.parametrize("name", ["L40S", "NVIDIA L40S", "NVIDIA A100 80GB PCIe", "H100", "RTX 4090"])
def test_hardware_profile_names(name):
    assert _vllm.hardware_profile(name)[0] in _vllm.HARDWARE_PROFILES


def test_unknown_hardware_is_refused():
    with pytest.raises(_vllm.ServingError, match="unknown GPU hardware profile"):
        _vllm.hardware_profile("Voodoo2")


@pytest.mark.parametrize("model", sorted(_kvplan.MODEL_PROFILES))
@pytest.mark.parametrize("gpu", sorted(_vllm.HARDWARE_PROFILES))
def test_every_model_fits_every_hardware_profile_at_some_gpu_count(model, gpu):
    counts = [n for n in (1, 2, 4, 8) if _kvplan.plan(**_vllm.serve_config(model, gpu, n)["plan_args"])["fits"]]
    assert counts, "%s does not fit on up to 8 x %s" % (model, gpu)


def test_the_plan_is_computed_once_with_the_config():
    out = _vllm.serve_config("Llama-3.3-70B-Instruct", "L40S", 4)
    assert out["plan"] == _kvplan.plan(**out["plan_args"])
    assert out["plan"]["per_node"]["gpus"] == 4 and out["plan"]["max_num_seqs"] == out["config"]["max_num_seqs"]
    # gpu_count arrives: a node with more GPUs than the engine uses says so
    assert _vllm.serve_config("Llama-3.1-8B-Instruct", "L40S", 3)["plan"]["per_node"]["gpus"] == 3


# --- settings that are refused before anything is written -----------------------------------------


@pytest.mark.parametrize(
    "setting,value,option",
    [
        ("tensor_parallel_size", 0, "tensor_parallel_size"),
        ("max_model_len", 0, "max_model_len"),
        ("max-model-len", -5, "max_model_len"),
        ("max_num_seqs", 0, "max_num_seqs"),
        ("max_num_seqs", -1, "max_num_seqs"),
        ("block_size", 0, "block_size"),
        ("kv_cache_memory_bytes", 0, "kv_cache_memory_bytes"),
        ("gpu_memory_utilization", 0, "gpu_memory_utilization"),
        ("max_num_batched_tokens", "lots", "max_num_batched_tokens"),
        ("port", 0, "port"),
        ("shutdown_timeout", -1, "shutdown_timeout"),
    ],
)
def test_bad_numbers_in_settings_are_refused_naming_them(setting, value, option):
    with pytest.raises(_kvplan.PlanError, match="^%s must be" % option):
        _vllm.serve_config("Llama-3.1-8B-Instruct", "L40S", 1, overrides={setting: value})


def test_bad_planner_inputs_are_refused_naming_them():
    with pytest.raises(_kvplan.PlanError, match="^activation_bytes must be a non-negative"):
        _vllm.serve_config("Llama-3.1-8B-Instruct", "L40S", 1, reserves={"activation_bytes": -1})
    with pytest.raises(_vllm.ServingError, match="unknown planner reserves activation"):
        _vllm.serve_config("Llama-3.1-8B-Instruct", "L40S", 1, reserves={"activation": 1})
    with pytest.raises(_kvplan.PlanError, match="^expected_request_len must be a positive integer"):
        _vllm.serve_config("Llama-3.1-8B-Instruct", "L40S", 1, expected_request_len=-1)
    with pytest.raises(_kvplan.PlanError, match="^oversubscription_factor must be a number above 0"):
        _vllm.serve_config("Llama-3.1-8B-Instruct", "L40S", 1, oversubscription_factor=0)
    with pytest.raises(_kvplan.PlanError, match="^gpu_count must be a positive integer"):
        _vllm.serve_config("Llama-3.1-8B-Instruct", "L40S", 0)
    with pytest.raises(_kvplan.PlanError, match="config field 'num_attention_heads' must be a positive integer"):
        _vllm.serve_config({"profile": "Llama-3.1-8B-Instruct", "num_attention_heads": 0}, "L40S", 1)


@pytest.mark.parametrize("setting", ["max_num_seq", "tensor-paralel-size", "expected_request_len", "gpu_count"])
def test_settings_vllm_does_not_know_are_refused(setting):
    with pytest.raises(_vllm.ServingError, match="`vllm serve` 0.33.0 has no option %s" % setting):
        _vllm.serve_config("Llama-3.1-8B-Instruct", "L40S", 1, overrides={setting: 1})


def test_planner_inputs_in_settings_say_where_they_go():
    with pytest.raises(_vllm.ServingError, match="set vllm_server_expected_request_len"):
        _vllm.serve_config("Llama-3.1-8B-Instruct", "L40S", 1, overrides={"expected_request_len": 4096})


def test_known_options_pass_through():
    out = _vllm.serve_config(
        "Llama-3.1-8B-Instruct",
        "L40S",
        1,
        overrides={"api-server-count": 2, "enforce_eager": True, "max_model_len": 8192, "port": "9000"},
    )
    assert out["config"]["port"] == 9000
    assert (out["config"]["api-server-count".replace("-", "_")], out["config"]["enforce_eager"]) == (2, True)
    assert out["plan"]["per_gpu"]["cuda_graph_bytes"] == 0


@pytest.mark.parametrize(
    "setting",
    ["api_key", "api-key", "hf_token", "HF_TOKEN", "db_password", "client_secret", "secret_sauce", "auth_token"],
)
def test_secret_looking_settings_are_refused_without_their_values(setting):
    value = "sk-must-never-be-printed-0123"
    with pytest.raises(_vllm.ServingError) as err:
        _vllm.serve_config("Llama-3.1-8B-Instruct", "L40S", 1, overrides={setting: value})
    assert "secret-looking settings are refused" in str(err.value) and setting in str(err.value)
    assert value not in str(err.value)


def test_secret_settings_name_the_variable_to_use():
    with pytest.raises(_vllm.ServingError, match="api_key: set vllm_server_api_key"):
        _vllm.serve_config("Llama-3.1-8B-Instruct", "L40S", 1, overrides={"api_key": "x"})
    with pytest.raises(_vllm.ServingError, match="hf_token: set vllm_server_hf_token"):
        _vllm.serve_config("Llama-3.1-8B-Instruct", "L40S", 1, overrides={"hf_token": "x"})


@pytest.mark.parametrize(
    "setting",
    [
        "max_num_batched_tokens",
        "long_prefill_token_threshold",
        "ssl_keyfile",
        "return_tokens_as_token_ids",
        "tokenizer",
        "max_num_queued_tokens",
        "allow_credentials",
    ],
)
def test_options_that_only_mention_tokens_or_keys_are_not_secrets(setting):
    assert not _vllm.secret_setting(setting)
    assert setting in _vllm_options.VLLM_SERVE_OPTIONS


def test_the_secret_rule_covers_every_secret_option_vllm_has():
    """Of the options vLLM 0.33.0 knows, exactly its two credentials look like secrets."""
    assert {k for k in _vllm_options.VLLM_SERVE_OPTIONS if _vllm.secret_setting(k)} == set(_vllm.SECRET_SETTINGS)


def test_option_list_holds_what_the_role_writes_and_none_of_the_removed():
    assert set(_vllm.CONFIG_KEYS) | {"trust_remote_code", "kv_cache_memory_bytes"} <= _vllm_options.VLLM_SERVE_OPTIONS
    assert not set(_vllm.REMOVED_SETTINGS) & _vllm_options.VLLM_SERVE_OPTIONS


# --- runtime environment (its home is nccl/_env; these pin the derivation the role writes) ----------

SEED000_LINKS = {  # 4x L40S, two GPUs per PCIe switch, the switches on different sockets
    "GPU0": {"GPU0": "X", "GPU1": "PIX", "GPU2": "SYS", "GPU3": "SYS"},
    "GPU1": {"GPU0": "PIX", "GPU1": "X", "GPU2": "SYS", "GPU3": "SYS"},
    "GPU2": {"GPU0": "SYS", "GPU1": "SYS", "GPU2": "X", "GPU3": "PIX"},
    "GPU3": {"GPU0": "SYS", "GPU1": "SYS", "GPU2": "PIX", "GPU3": "X"},
}


@pytest.mark.parametrize(
    "links,level",
    [
        (SEED000_LINKS, "PIX"),
        ({"GPU0": {"GPU1": "PXB"}, "GPU1": {"GPU0": "PXB"}, "GPU2": {"GPU0": "PIX"}}, "PXB"),
        ({"GPU0": {"GPU1": "PHB"}, "GPU1": {"GPU0": "PHB"}}, "PHB"),
        ({"GPU0": {"GPU1": "NV18", "GPU2": "NV18"}, "GPU1": {"GPU2": "NV18"}}, "NVL"),
        ({"GPU0": {"GPU1": "SYS"}, "GPU1": {"GPU0": "SYS"}}, None),
        ({"GPU0": {"GPU0": "X"}}, None),
        ({}, None),
    ],
)
def test_p2p_level_from_links(links, level):
    assert _env.p2p_level(links) == level


def test_runtime_env_for_seed000_without_rdma():
    out = _env.runtime_env(
        {"gpus": [{}] * 4, "links": SEED000_LINKS},
        nics=[{"bdf": "0000:41:00.0", "class": "0x020000", "vendor": "0x14e4"}],
    )
    assert out["env"] == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "NCCL_P2P_LEVEL": "PIX",
        "NCCL_IB_DISABLE": "1",
    }
    assert not out["warnings"]


@pytest.mark.parametrize(
    "nic",
    [
        {"class": "0x020700", "vendor": "0x15b3"},  # InfiniBand controller
        {"class": "0x020000", "vendor": "0x15b3"},  # ConnectX in Ethernet mode (RoCE)
        {"rdma": True},
    ],
)
def test_rdma_nic_keeps_infiniband(nic):
    out = _env.runtime_env({"gpus": [{}] * 2, "links": SEED000_LINKS}, nics=[nic])
    assert "NCCL_IB_DISABLE" not in out["env"]


def test_unknown_nics_derive_nothing_and_debug_only_when_asked():
    out = _env.runtime_env({"gpus": [{}] * 2, "links": SEED000_LINKS})
    assert "NCCL_IB_DISABLE" not in out["env"]
    assert "NCCL_DEBUG" not in out["env"]
    assert _env.runtime_env({}, nccl_debug="info")["env"]["NCCL_DEBUG"] == "INFO"
    assert _env.runtime_env({}, rdma=False)["env"]["NCCL_IB_DISABLE"] == "1"


def test_user_values_win_and_none_removes():
    out = _env.runtime_env(
        {"gpus": [{}] * 4, "links": SEED000_LINKS},
        rdma=False,
        user_env={
            "NCCL_P2P_LEVEL": "SYS",
            "NCCL_IB_DISABLE": None,
            "OMP_NUM_THREADS": 8,
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:512",
        },
    )
    assert out["env"]["NCCL_P2P_LEVEL"] == "SYS"
    assert "NCCL_IB_DISABLE" not in out["env"]
    assert out["env"]["OMP_NUM_THREADS"] == "8"
    assert out["why"]["NCCL_P2P_LEVEL"] == "set by the user"
    assert "max_split_size_mb:512" in out["warnings"][0]


@pytest.mark.parametrize("bad", [{"BAD NAME": "1"}, {"X": 'a"b'}, {"X": "two\nlines"}])
def test_values_an_env_file_cannot_carry_are_refused(bad):
    with pytest.raises(_env.EnvError):
        _env.runtime_env({}, user_env=bad)


def test_stop_timeout_is_above_vllms_shutdown():
    assert _vllm.stop_timeout(30) == 95
    assert _vllm.stop_timeout(0) > 5


# --- filters -----------------------------------------------------------------------------------


def test_filters_are_registered_and_raise_filter_errors():
    from ansible.errors import AnsibleFilterError

    table = filters.FilterModule().filters()
    assert {"kv_plan", "vllm_serve_config", "vllm_removed_settings", "vllm_stop_timeout"} <= set(table)
    assert (
        table["kv_plan"]({"model": "Llama-3.3-70B-Instruct", "gpu_memory_mib": 46068})["kv_bytes_per_token"] == 327680
    )
    with pytest.raises(AnsibleFilterError, match="calculate_kv_scales"):
        table["vllm_serve_config"]("Llama-3.1-8B-Instruct", "L40S", 1, overrides={"calculate_kv_scales": True})
    with pytest.raises(AnsibleFilterError, match="unknown model profile"):
        table["kv_plan"]({"model": "nope", "gpu_memory_mib": 1})
