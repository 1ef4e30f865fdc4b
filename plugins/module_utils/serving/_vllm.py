# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""vLLM serving knowledge: the pinned release, its removed settings, hardware profiles, the
``vllm serve --config`` file. (The runtime environment GPU services read, allocator and NCCL,
lives in ``nccl/_env.py``.)

Plain Python, no Ansible. The filters in ``plugins/filter/kvplan.py`` expose it to the role
``vllm_server``: :func:`serve_config` builds the config and computes its KV-cache plan once
(``_kvplan.plan``, the planner of the module ``vllm_memory_plan``). The options ``vllm serve``
takes are data in ``_vllm_options.py``. The lab's vLLM stand-in reads the config.yaml this writes
with its own option table, and does not import this file.
"""

from __future__ import annotations

import math
import re

from ansible_collections.gpufleet.node.plugins.module_utils.serving import _kvplan, _vllm_options

VLLM_VERSION = "0.33.0"
VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"

# Settings older guides (and the seed documents) still use, that vLLM 0.33.0 no longer has, with
# what replaced them. Keys are the long flag names with underscores.
REMOVED_SETTINGS = {
    "swap_space": "removed: the V1 engine never swaps KV blocks to CPU memory, it preempts and "
    "recomputes; size the KV pool with gpu_memory_utilization or kv_cache_memory_bytes "
    "and cap max_num_seqs instead (CPU offload, if wanted, is kv_offloading_size)",
    "calculate_kv_scales": "removed (July 2026): fp8 KV-cache scales come from the checkpoint; use "
    "kv_cache_dtype fp8 with a checkpoint that carries calibrated k/v scales",
    "disable_log_requests": "replaced by enable_log_requests (request logging is off by default); "
    "drop the setting, or set enable_log_requests: true to log requests",
    "num_scheduler_steps": "removed with the V0 engine (multi-step scheduling); V1 schedules every step, "
    "drop the setting",
    "use_v2_block_manager": "removed with the V0 engine; drop the setting",
    "preemption_mode": "removed: V1 always preempts by recomputation; drop the setting",
    "max_seq_len_to_capture": "removed: CUDA-graph sizes are set with compilation_config "
    "(cudagraph_capture_sizes / max_cudagraph_capture_size)",
}

# Secret-looking setting names: the last word names a credential, or secret/password anywhere
# (not allow_credentials, a CORS switch, nor long_prefill_token_threshold).
_SECRET_KEY = re.compile(r"(?:^|_)(?:token|key|apikey|secret|password|passwd)$|secret|passw")
# vLLM's own secret options and the role variable that writes each to the 0600 secrets file.
SECRET_SETTINGS = {"api_key": "vllm_server_api_key (VLLM_API_KEY)", "hf_token": "vllm_server_hf_token (HF_TOKEN)"}
# Planner inputs that are not vLLM options, and where the role takes them.
PLANNER_SETTINGS = {
    "expected_request_len": "a planner input, not a vLLM option: set vllm_server_expected_request_len",
    "oversubscription_factor": "a planner input, not a vLLM option: set vllm_server_oversubscription_factor",
    "activation_bytes": "a planner reserve: set it in vllm_server_reserves",
    "cuda_graph_bytes": "a planner reserve: set it in vllm_server_reserves",
    "non_torch_bytes": "a planner reserve: set it in vllm_server_reserves",
}

# Per-hardware profiles. memory_mib is nvidia-smi's memory.total for the card; fp8_kv is whether
# vLLM's default attention backend there takes an fp8 KV cache (Ada and Hopper: yes).
HARDWARE_PROFILES = {
    "L40S": {
        "name": "NVIDIA L40S",
        "memory_mib": 46068,
        "arch": "ada",
        "fp8_kv": True,
        "gpu_memory_utilization": 0.90,
        "max_num_batched_tokens": 4096,
        "max_num_seqs_cap": 256,
    },
    "A100-80GB": {
        "name": "NVIDIA A100-SXM4-80GB",
        "other_names": ["NVIDIA A100 80GB PCIe"],
        "memory_mib": 81920,
        "arch": "ampere",
        "fp8_kv": False,
        "gpu_memory_utilization": 0.92,
        "max_num_batched_tokens": 8192,
        "max_num_seqs_cap": 512,
    },
    "H100-80GB": {
        "name": "NVIDIA H100 80GB HBM3",
        "memory_mib": 81559,
        "arch": "hopper",
        "fp8_kv": True,
        "gpu_memory_utilization": 0.92,
        "max_num_batched_tokens": 8192,
        "max_num_seqs_cap": 512,
    },
    "H200": {
        "name": "NVIDIA H200",
        "memory_mib": 143771,
        "arch": "hopper",
        "fp8_kv": True,
        "gpu_memory_utilization": 0.92,
        "max_num_batched_tokens": 8192,
        "max_num_seqs_cap": 1024,
    },
    "RTX-A6000": {
        "name": "NVIDIA RTX A6000",
        "memory_mib": 49140,
        "arch": "ampere",
        "fp8_kv": False,
        "gpu_memory_utilization": 0.90,
        "max_num_batched_tokens": 4096,
        "max_num_seqs_cap": 256,
    },
    "RTX-4090": {
        "name": "NVIDIA GeForce RTX 4090",
        "memory_mib": 24564,
        "arch": "ada",
        "fp8_kv": True,
        "gpu_memory_utilization": 0.90,
        "max_num_batched_tokens": 2048,
        "max_num_seqs_cap": 128,
    },
}
HARDWARE_ALIASES = {
    "A100": "A100-80GB",
    "A100 80GB": "A100-80GB",
    "H100": "H100-80GB",
    "H100 80GB": "H100-80GB",
    "H200 141GB": "H200",
    "RTX A6000": "RTX-A6000",
    "A6000": "RTX-A6000",
    "RTX 4090": "RTX-4090",
    "4090": "RTX-4090",
    "L40S 48GB": "L40S",
}

# Per-model serving profiles. max_model_len is pinned from the expected prompt p99 plus the output
# budget (a prompt p99 of 11k tokens -> 16384), not left at the model's 128k default.
MODEL_SERVING = {
    "Llama-3.3-70B-Instruct": {"max_model_len": 16384, "expected_request_len": 8192, "kv_cache_dtype": "auto"},
    "Llama-3.3-70B-Instruct-FP8": {"max_model_len": 16384, "expected_request_len": 8192, "kv_cache_dtype": "fp8"},
    "Llama-3.1-70B-Instruct": {"max_model_len": 16384, "expected_request_len": 8192, "kv_cache_dtype": "auto"},
    "Llama-3.1-8B-Instruct": {"max_model_len": 16384, "expected_request_len": 4096, "kv_cache_dtype": "auto"},
    "Qwen2.5-72B-Instruct": {"max_model_len": 16384, "expected_request_len": 8192, "kv_cache_dtype": "auto"},
    "DeepSeek-V2-Lite-Chat": {
        "max_model_len": 16384,
        "expected_request_len": 4096,
        "kv_cache_dtype": "auto",
        "trust_remote_code": True,
    },
}

# The config keys the role always writes, in this order.
CONFIG_KEYS = (
    "model",
    "served_model_name",
    "host",
    "port",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "dtype",
    "kv_cache_dtype",
    "gpu_memory_utilization",
    "max_model_len",
    "block_size",
    "max_num_batched_tokens",
    "max_num_seqs",
    "enable_prefix_caching",
    "shutdown_timeout",
)


class ServingError(ValueError):
    """A serving configuration that must be refused before anything is written."""


def norm_key(key):
    return str(key).strip().lstrip("-").replace("-", "_")


def secret_setting(key):
    """Whether a setting's name looks like a secret (its last word is token/key/..., or it names a
    secret or password anywhere): ``api_key``, ``hf_token``, but not ``max_num_batched_tokens``,
    ``long_prefill_token_threshold`` or ``ssl_keyfile`` (a path)."""
    return bool(_SECRET_KEY.search(norm_key(key).lower()))


def check_settings(settings):
    """Refuse, before anything is written, settings that cannot go into the 0644 ``config.yaml``.

    In this order: settings the pinned release removed (naming what replaced them), secret-looking
    settings (config.yaml is world-readable and shown by ``--diff``: secrets go to the 0600 secrets
    file), and keys ``vllm serve`` of the pinned release does not know (``_vllm_options``). The
    messages name the settings, never their values.
    """
    gone = removed_settings(settings)
    if gone:
        raise ServingError("vLLM %s no longer has these settings: %s" % (VLLM_VERSION, "; ".join(gone)))
    secrets = [key for key in (settings or {}) if secret_setting(key)]
    if secrets:
        hints = []
        for key in secrets:
            var = SECRET_SETTINGS.get(norm_key(key))
            hints.append(
                "%s: set %s instead" % (key, var)
                if var
                else "%s: pass it to vLLM through its environment, not config.yaml" % key
            )
        raise ServingError(
            "secret-looking settings are refused (their values are not shown): config.yaml is "
            "world-readable (0644) and printed by --diff, secrets go only to the 0600 secrets "
            "file; %s" % "; ".join(hints)
        )
    unknown = [key for key in (settings or {}) if norm_key(key) not in _vllm_options.VLLM_SERVE_OPTIONS]
    if unknown:
        hints = [
            "%s (%s)" % (key, PLANNER_SETTINGS[norm_key(key)]) if norm_key(key) in PLANNER_SETTINGS else str(key)
            for key in unknown
        ]
        raise ServingError(
            "`vllm serve` %s has no option %s; check the spelling against `vllm serve --help` "
            "of that release (settings are its long options, dashes or underscores)" % (VLLM_VERSION, ", ".join(hints))
        )


def removed_settings(config):
    """Messages for each removed setting in a config dict (keys with dashes or underscores)."""
    found = []
    for key in config or {}:
        k = norm_key(key)
        if k in REMOVED_SETTINGS:
            found.append("%s: %s" % (key, REMOVED_SETTINGS[k]))
    return found


def hardware_profile(name):
    key = HARDWARE_ALIASES.get(name, name)
    if key not in HARDWARE_PROFILES:
        # an nvidia-smi product name such as "NVIDIA L40S"
        for pname, prof in HARDWARE_PROFILES.items():
            if str(name).lower() in [n.lower() for n in [prof["name"]] + prof.get("other_names", [])]:
                return pname, dict(prof)
        raise ServingError("unknown GPU hardware profile %r; known: %s" % (name, ", ".join(sorted(HARDWARE_PROFILES))))
    return key, dict(HARDWARE_PROFILES[key])


def default_tensor_parallel(arch, gpu_count):
    """The largest power of two <= gpu_count that divides the attention heads."""
    heads = int(arch.get("num_attention_heads") or 1)
    tp = 1
    while tp * 2 <= int(gpu_count) and heads % (tp * 2) == 0:
        tp *= 2
    return tp


def serve_config(
    model,
    gpu,
    gpu_count,
    overrides=None,
    host="127.0.0.1",
    port=8000,
    served_model_name=None,
    gpu_memory_mib=None,
    oversubscription_factor=1.0,
    shutdown_timeout=30,
    reserves=None,
    expected_request_len=None,
):
    """Build the ``vllm serve --config`` dict and its KV-cache plan, computed once.

    ``overrides`` are the user's settings (keys with dashes or underscores): each must be a ``vllm
    serve`` option of the pinned release (:func:`check_settings`); an override of ``auto`` or None
    keeps the derived value. Returns ``{'config': {...}, 'plan': <_kvplan.plan() of plan_args>,
    'plan_args': {...}, 'expected_request_len': N, 'hardware': ..., 'model': ...}``. Raises
    :class:`ServingError` on refused settings and :class:`_kvplan.PlanError` on bad numbers, each
    naming the setting.
    """
    check_settings(overrides)
    overrides = {norm_key(k): v for k, v in (overrides or {}).items()}
    name, arch = _kvplan.resolve_model(model)
    hw_name, hw = hardware_profile(gpu)
    serving = dict(MODEL_SERVING.get(name, {}))
    gpu_count = _kvplan.count("gpu_count", gpu_count)
    if gpu_count is None:
        raise ServingError("gpu_count is required: the number of GPUs vLLM may use on the node")
    mem = _kvplan.count("gpu_memory_mib", gpu_memory_mib or None, hw["memory_mib"])

    def pick(key, derived):
        value = overrides.get(key)
        return derived if value in (None, "", "auto") or (key != "kv_cache_dtype" and value == "auto") else value

    def pick_count(key, derived):
        return _kvplan.count(key, pick(key, derived))

    tp = pick_count("tensor_parallel_size", default_tensor_parallel(arch, gpu_count))
    pp = pick_count("pipeline_parallel_size", 1)
    if tp * pp > gpu_count:
        raise ServingError(
            "tensor_parallel_size %d x pipeline_parallel_size %d needs %d GPUs, the node has %d"
            % (tp, pp, tp * pp, gpu_count)
        )
    kv_dtype = serving.get("kv_cache_dtype", "auto")
    if kv_dtype.startswith("fp8") and not hw["fp8_kv"]:
        kv_dtype = "auto"
    kv_dtype = pick("kv_cache_dtype", kv_dtype)
    max_model_len = pick_count(
        "max_model_len", serving.get("max_model_len") or min(int(arch.get("max_position_embeddings") or 8192), 16384)
    )
    expected = _kvplan.count(
        "expected_request_len", expected_request_len, serving.get("expected_request_len") or max(1, max_model_len // 2)
    )
    block_size = pick_count("block_size", 16)
    mnbt = pick_count("max_num_batched_tokens", hw["max_num_batched_tokens"])
    util = pick("gpu_memory_utilization", hw["gpu_memory_utilization"])
    util = _kvplan.positive_number("gpu_memory_utilization", util, upper=1)
    factor = _kvplan.positive_number("oversubscription_factor", oversubscription_factor, 1.0)
    dtype = pick("dtype", _kvplan.model_dtype(arch))
    reserves = dict(reserves or {})
    unknown = sorted(set(reserves) - {"activation_bytes", "cuda_graph_bytes", "non_torch_bytes"})
    if unknown:
        raise ServingError(
            "unknown planner reserves %s; known: activation_bytes, cuda_graph_bytes, "
            "non_torch_bytes" % ", ".join(map(str, unknown))
        )

    plan_args = dict(
        model=model if isinstance(model, dict) else name,
        gpu_memory_mib=mem,
        gpu_count=gpu_count,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        gpu_memory_utilization=util,
        kv_cache_dtype=kv_dtype,
        dtype=dtype,
        max_model_len=max_model_len,
        max_num_batched_tokens=mnbt,
        block_size=block_size,
        expected_request_len=expected,
        oversubscription_factor=factor,
        enforce_eager=bool(overrides.get("enforce_eager", False)),
    )
    if pick("kv_cache_memory_bytes", None) is not None:
        plan_args["kv_cache_memory_bytes"] = _kvplan.count("kv_cache_memory_bytes", overrides["kv_cache_memory_bytes"])
    for key in ("activation_bytes", "cuda_graph_bytes", "non_torch_bytes"):
        if reserves.get(key) is not None:
            plan_args[key] = _kvplan.reserve(key, reserves[key])

    seqs = pick("max_num_seqs", None)
    if seqs is None:
        # as many sequences of the expected length as the pool holds, within the hardware's cap
        probe = _kvplan.plan(max_num_seqs=hw["max_num_seqs_cap"], **plan_args)
        fit = int(probe["kv_capacity_blocks"] * block_size * factor // expected)
        seqs = max(1, min(hw["max_num_seqs_cap"], fit))
    plan_args["max_num_seqs"] = _kvplan.count("max_num_seqs", seqs)
    plan = _kvplan.plan(**plan_args)

    config = {
        "model": arch.get("hf_id") or name,
        "served_model_name": served_model_name or name,
        "host": host,
        "port": _kvplan.integer("port", pick("port", port), 1, "a TCP port (1-65535)"),
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "dtype": dtype,
        "kv_cache_dtype": kv_dtype,
        "gpu_memory_utilization": util,
        "max_model_len": max_model_len,
        "block_size": block_size,
        "max_num_batched_tokens": mnbt,
        "max_num_seqs": plan_args["max_num_seqs"],
        "enable_prefix_caching": bool(pick("enable_prefix_caching", True)),
        "shutdown_timeout": _kvplan.integer(
            "shutdown_timeout", pick("shutdown_timeout", shutdown_timeout), 0, "a non-negative number of seconds"
        ),
    }
    if config["port"] > 65535:
        raise ServingError("port must be a TCP port (1-65535), got %d" % config["port"])
    if serving.get("trust_remote_code"):
        config["trust_remote_code"] = True
    # the numbers checked above are already in config as numbers; other settings go in as given
    checked = (
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "gpu_memory_utilization",
        "max_model_len",
        "block_size",
        "max_num_batched_tokens",
        "max_num_seqs",
        "kv_cache_memory_bytes",
        "port",
        "shutdown_timeout",
    )
    for key, value in overrides.items():
        if value is None or key in checked or key in config and value in ("", "auto"):
            continue
        config[key] = value
    if "kv_cache_memory_bytes" in plan_args:
        config["kv_cache_memory_bytes"] = plan_args["kv_cache_memory_bytes"]
        config.pop("gpu_memory_utilization", None)
    return {
        "config": config,
        "plan": plan,
        "plan_args": plan_args,
        "expected_request_len": expected,
        "hardware": hw_name,
        "model": name,
    }


def stop_timeout(shutdown_timeout, margin=60):
    """systemd TimeoutStopSec above vLLM's drain window plus its worker shutdown window (5 s)."""
    return int(math.ceil(float(shutdown_timeout))) + 5 + int(margin)
