# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""KV-cache memory plan for vLLM (V1 engine, pinned release 0.33.0).

Plain Python, no Ansible. :func:`plan` is the one computation: the module ``vllm_memory_plan`` (the
planner users call) and the filters ``kv_plan`` and ``vllm_serve_config`` call it, and the role
``vllm_server`` plans through ``vllm_serve_config`` once, on the controller, so the role and the
module cannot disagree. The lab's vLLM stand-in does NOT call it: it reads only the checkpoint
shapes (:mod:`_model_profiles`) and sizes memory its own way, an independent check of this file.

Inputs are refused, never replaced: every count (parallel sizes, lengths, sequences, block size,
the model's layers and heads) must be a positive integer and every reserve a non-negative number
of bytes; ``None`` (unset) takes the documented default. :class:`PlanError` names the option.

How vLLM 0.33.0 sizes its KV cache (``vllm/v1/worker/gpu_worker.py``,
``vllm/v1/core/kv_cache_planning.py``), per GPU worker:

    requested = total_memory x gpu_memory_utilization
    kv_pool   = requested - weights - activation peak - non-torch memory - CUDA-graph estimate
    blocks    = kv_pool // (block_size x KV bytes per token on this worker)

``--kv-cache-memory-bytes`` replaces the computed pool. A pool <= 0 stops start-up with "No
available memory for the cache blocks"; a pool smaller than one ``max_model_len`` request stops it
with "To serve at least one request with the model's max seq len ...". Both texts are reproduced by
:func:`vllm_startup_error`.

KV bytes per token and layer: ``2 x kv_heads x head_dim x dtype_bytes`` (K and V) for MHA/GQA,
with the KV heads split across tensor-parallel ranks (``max(1, kv_heads // tp)``: a rank holds a
replicated head when there are fewer heads than ranks). MLA models (DeepSeek-V2/V3) cache one
compressed latent per layer, ``(kv_lora_rank + qk_rope_head_dim) x dtype_bytes``, replicated on
every tensor-parallel rank. Pipeline parallelism splits the layers across stages.

The reserves vLLM measures at start-up (activation peak, non-torch memory, CUDA graphs) cannot be
known without a GPU; they are estimated here with documented, overridable defaults (see
:data:`RESERVE_DEFAULTS`).
"""

from __future__ import annotations

import math

from ansible_collections.gpufleet.node.plugins.module_utils.serving import _model_profiles

GiB = 1024**3
MiB = 1024**2

# Reserves per GPU, all overridable. Sources: vLLM's own start-up logs ("Memory profiling results",
# vllm-project/vllm PR 10511 and issue 11550): non-torch memory 0.15-0.2 GiB on one GPU, 1.8-3.6
# GiB with tensor parallelism (NCCL and custom all-reduce buffers); activation peak 0.4-1.3 GiB for
# 8B-70B models at 2048-8192 batched tokens; CUDA-graph capture 0.3-1 GiB (estimated and
# subtracted by default since v0.21.0).
RESERVE_DEFAULTS = {
    # bytes of non-torch memory (CUDA context, NCCL, custom all-reduce) on a single-GPU engine
    "non_torch_bytes_single": int(0.5 * GiB),
    # ... and when tensor or pipeline parallelism puts NCCL communicators on the GPU
    "non_torch_bytes_parallel": int(1.0 * GiB),
    # CUDA-graph capture (0 with enforce_eager)
    "cuda_graph_bytes": int(0.5 * GiB),
    # activation peak = batched_tokens x (4 x hidden + 2 x intermediate / tp) x act_bytes
    #                   + max_num_seqs x vocab x 4 (fp32 logits of the sampler dry run)
}

# torch dtype / kv_cache_dtype name -> bytes per element
DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "fp32": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "half": 2,
    "fp16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_ds_mla": 1,
    "int8": 1,
}

# weight quantization -> (bytes per quantized parameter, layers left unquantized)
QUANT_BYTES = {
    "fp8": 1.0,
    "compressed-tensors": 1.0,
    "fbgemm_fp8": 1.0,
    "modelopt": 1.0,
    "int8": 1.0,
    "w8a8": 1.0,
    "awq": 0.5,
    "gptq": 0.5,
    "awq_marlin": 0.5,
    "gptq_marlin": 0.5,
    "int4": 0.5,
    "bitsandbytes": 0.5,
}

# The checkpoints' shapes (config.json fields, parameter counts) live in their own data module, read
# by the lab's stand-in too.
MODEL_PROFILES = _model_profiles.MODEL_PROFILES

KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")


class PlanError(ValueError):
    """The inputs cannot describe a plan (unknown model, missing field, impossible parallelism)."""


def integer(name, value, minimum, what):
    """``value`` as an int >= ``minimum``, or :class:`PlanError` naming ``name`` and what to do.

    Accepts ints, integral floats and strings of digits (values templated by Ansible); refuses
    booleans, fractions, NaN and text, so that nothing is silently rounded or replaced.
    """
    number = None
    if not isinstance(value, bool):
        if isinstance(value, int):
            number = value
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        elif isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            number = int(value.strip())
    if number is None or number < minimum:
        raise PlanError("%s must be %s, got %r; set it to one, or leave it unset for the default" % (name, what, value))
    return number


def count(name, value, default=None):
    """A positive integer option (a count or a length); ``None`` gives ``default``."""
    if value is None:
        return default
    return integer(name, value, 1, "a positive integer")


def reserve(name, value, default=None):
    """A non-negative number of bytes; ``None`` gives ``default``."""
    if value is None:
        return default
    return integer(name, value, 0, "a non-negative integer number of bytes")


def positive_number(name, value, default=None, upper=None):
    """A finite float > 0 (and <= ``upper`` when given); ``None`` gives ``default``."""
    if value is None:
        return default
    number = None
    if not isinstance(value, bool):
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = None
    if number is None or not math.isfinite(number) or number <= 0 or (upper is not None and number > upper):
        raise PlanError(
            "%s must be a number above 0%s, got %r"
            % (name, " and at most %s" % upper if upper is not None else "", value)
        )
    return number


def fmt_gib(num_bytes):
    """Bytes as GiB with two decimals, the unit vLLM logs in."""
    return "%.2f GiB" % (num_bytes / GiB)


def fmt_int(value):
    return f"{int(value):,}"


def resolve_model(model):
    """Return (name, architecture dict) for a profile name or a dict of config.json fields."""
    if isinstance(model, str):
        if model in MODEL_PROFILES:
            return model, dict(MODEL_PROFILES[model])
        lowered = {k.lower(): k for k in MODEL_PROFILES}
        short = model.rsplit("/", 1)[-1].lower()
        for key in (model.lower(), short):
            if key in lowered:
                return lowered[key], dict(MODEL_PROFILES[lowered[key]])
        for name, prof in MODEL_PROFILES.items():
            if prof.get("hf_id", "").lower() == model.lower():
                return name, dict(prof)
        raise PlanError(
            "unknown model profile %r; shipped profiles: %s; or pass the fields of the "
            "model's config.json as a dict" % (model, ", ".join(sorted(MODEL_PROFILES)))
        )
    if not isinstance(model, dict):
        raise PlanError("model must be a profile name or a dict of config.json fields, got %r" % type(model).__name__)
    arch = dict(model)
    if "profile" in arch:  # a shipped profile with a few fields overridden, or a model's own name
        profile = arch.pop("profile")
        try:
            name, base = resolve_model(profile)
        except PlanError:
            name, base = str(profile), {"hf_id": str(profile)}
        base.update(arch)
        return arch.get("name", name), base
    # config.json nests text fields under text_config for some multimodal models
    if "text_config" in arch and isinstance(arch["text_config"], dict):
        merged = dict(arch["text_config"])
        merged.update({k: v for k, v in arch.items() if k != "text_config"})
        arch = merged
    name = arch.get("name") or arch.get("_name_or_path") or arch.get("hf_id") or "custom model"
    return name, arch


def _need(arch, key, name):
    """A required count of the model's config (layers, heads, ranks, parameters): a positive integer."""
    value = arch.get(key)
    if value in (None, ""):
        raise PlanError("model %s: config field %r is missing" % (name, key))
    try:
        return integer(key, value, 1, "a positive integer")
    except PlanError:
        raise PlanError(
            "model %s: config field %r must be a positive integer, got %r; correct the "
            "model's config.json fields (or the profile override)" % (name, key, value)
        ) from None


# Fields of config.json that are counts when present; each must then be a positive integer.
_ARCH_COUNTS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "num_parameters",
    "weight_bytes",
    "kv_lora_rank",
    "qk_rope_head_dim",
)


def check_arch(arch, name="model"):
    """Refuse a model whose count fields (when present) are not positive integers."""
    for key in _ARCH_COUNTS:
        if arch.get(key) not in (None, ""):
            _need(arch, key, name)


def is_mla(arch):
    return bool(arch.get("kv_lora_rank"))


def dtype_bytes(name, what="dtype"):
    key = str(name).lower().replace("torch.", "")
    if key not in DTYPE_BYTES:
        raise PlanError("unknown %s %r (known: %s)" % (what, name, ", ".join(sorted(DTYPE_BYTES))))
    return DTYPE_BYTES[key]


def model_dtype(arch, dtype=None):
    """The dtype the weights (and an 'auto' KV cache) run in."""
    if dtype and dtype != "auto":
        return str(dtype)
    found = arch.get("torch_dtype") or arch.get("dtype") or "bfloat16"
    if str(found).lower().replace("torch.", "") in ("float32", "float"):
        return "bfloat16"  # vLLM serves fp32 checkpoints in bf16/fp16 by default
    return str(found)


def _quant_method(arch):
    quant = arch.get("quantization")
    if quant is None and isinstance(arch.get("quantization_config"), dict):
        quant = arch["quantization_config"].get("quant_method")
    return str(quant).lower() if quant else None


def weight_bytes(arch, name="model", dtype=None):
    """Bytes of all weights. Quantized checkpoints keep embeddings and lm_head in 16 bits."""
    if arch.get("weight_bytes"):
        return int(arch["weight_bytes"])
    params = _need(arch, "num_parameters", name)
    wbytes = dtype_bytes(model_dtype(arch, dtype))
    quant = _quant_method(arch)
    if not quant:
        return params * wbytes
    if quant not in QUANT_BYTES:
        raise PlanError("model %s: unknown quantization %r; pass weight_bytes instead" % (name, quant))
    vocab = int(arch.get("vocab_size") or 0)
    hidden = int(arch.get("hidden_size") or 0)
    unquantized = vocab * hidden * (1 if arch.get("tie_word_embeddings") else 2)
    unquantized = min(unquantized, params)
    return int((params - unquantized) * QUANT_BYTES[quant] + unquantized * 2)


def kv_dtype_bytes(arch, kv_cache_dtype="auto", dtype=None):
    if kv_cache_dtype in (None, "", "auto"):
        return dtype_bytes(model_dtype(arch, dtype))
    return dtype_bytes(kv_cache_dtype, "kv_cache_dtype")


def kv_bytes_per_token_layer(arch, kv_bytes, tp=1, name="model"):
    """(bytes per token per layer on one tensor-parallel rank, kv heads per rank or None for MLA)."""
    if is_mla(arch):
        latent = _need(arch, "kv_lora_rank", name) + _need(arch, "qk_rope_head_dim", name)
        return latent * kv_bytes, None
    heads = _need(arch, "num_attention_heads", name)
    kv_heads = int(arch.get("num_key_value_heads") or heads)
    head_dim = arch.get("head_dim") or (_need(arch, "hidden_size", name) // heads)
    per_rank = max(1, kv_heads // tp)
    return 2 * per_rank * int(head_dim) * kv_bytes, per_rank


def kv_bytes_per_token(arch, kv_cache_dtype="auto", dtype=None, name="model"):
    """KV bytes per token of the whole model (all layers, all heads, no replication)."""
    per_layer = kv_bytes_per_token_layer(arch, kv_dtype_bytes(arch, kv_cache_dtype, dtype), 1, name)[0]
    return per_layer * _need(arch, "num_hidden_layers", name)


def activation_estimate(arch, tp, max_num_batched_tokens, max_num_seqs, act_bytes=2):
    """Estimated peak activation of vLLM's profiling run on one GPU (bytes)."""
    hidden = int(arch.get("hidden_size") or 4096)
    inter = int(arch.get("intermediate_size") or hidden * 7 // 2)
    vocab = int(arch.get("vocab_size") or 128256)
    per_token = 4 * hidden + 2 * inter // max(1, tp)
    return int(max_num_batched_tokens * per_token * act_bytes + max_num_seqs * vocab * 4)


def default_max_num_batched_tokens(gpu_memory_mib):
    """vLLM V1 default for `vllm serve`: 8192 on GPUs with >= 70 GiB, else 2048."""
    return 8192 if gpu_memory_mib * MiB >= 70 * GiB else 2048


def default_max_num_seqs(gpu_memory_mib):
    """vLLM V1 default for `vllm serve`: 1024 on GPUs with >= 70 GiB, else 256."""
    return 1024 if gpu_memory_mib * MiB >= 70 * GiB else 256


def plan(
    model,
    gpu_memory_mib,
    tensor_parallel_size=1,
    pipeline_parallel_size=1,
    gpu_memory_utilization=0.92,
    kv_cache_memory_bytes=None,
    kv_cache_dtype="auto",
    dtype=None,
    max_model_len=None,
    max_num_seqs=None,
    max_num_batched_tokens=None,
    block_size=16,
    expected_request_len=None,
    oversubscription_factor=1.0,
    enforce_eager=False,
    activation_bytes=None,
    cuda_graph_bytes=None,
    non_torch_bytes=None,
    gpu_count=None,
):
    """Compute the KV-cache plan. Never raises on a misfit: ``fits`` and ``reasons`` say it.

    Raises :class:`PlanError` only for inputs that describe no plan at all.
    """
    name, arch = resolve_model(model)
    tp = count("tensor_parallel_size", tensor_parallel_size, 1)
    pp = count("pipeline_parallel_size", pipeline_parallel_size, 1)
    gpu_count = count("gpu_count", gpu_count)
    if gpu_count is not None and tp * pp > gpu_count:
        raise PlanError(
            "tensor_parallel_size %d x pipeline_parallel_size %d needs %d GPUs, gpu_count is %d"
            % (tp, pp, tp * pp, gpu_count)
        )
    if gpu_memory_mib is None:
        raise PlanError("gpu_memory_mib must be a positive number of MiB, got None")
    gpu_memory_mib = count("gpu_memory_mib", gpu_memory_mib)
    util = positive_number("gpu_memory_utilization", gpu_memory_utilization, 0.92, upper=1)
    kv_cache_memory_bytes = count("kv_cache_memory_bytes", kv_cache_memory_bytes)
    block_size = count("block_size", block_size, 16)
    max_model_len = count("max_model_len", max_model_len)
    max_num_seqs = count("max_num_seqs", max_num_seqs)
    max_num_batched_tokens = count("max_num_batched_tokens", max_num_batched_tokens)
    expected_request_len = count("expected_request_len", expected_request_len)
    oversubscription_factor = positive_number("oversubscription_factor", oversubscription_factor, 1.0)
    activation_bytes = reserve("activation_bytes", activation_bytes)
    cuda_graph_bytes = reserve("cuda_graph_bytes", cuda_graph_bytes)
    non_torch_bytes = reserve("non_torch_bytes", non_torch_bytes)
    check_arch(arch, name)
    layers = _need(arch, "num_hidden_layers", name)
    if pp > layers:
        raise PlanError("pipeline_parallel_size %d exceeds the %d layers of %s" % (pp, layers, name))
    heads = _need(arch, "num_attention_heads", name)
    if heads % tp:
        raise PlanError(
            "%s has %d attention heads, not divisible by tensor_parallel_size %d "
            "(vLLM refuses this)" % (name, heads, tp)
        )
    if max_model_len is None:
        max_model_len = int(arch.get("max_position_embeddings") or 8192)
    if max_num_seqs is None:
        max_num_seqs = default_max_num_seqs(gpu_memory_mib)
    if max_num_batched_tokens is None:
        max_num_batched_tokens = default_max_num_batched_tokens(gpu_memory_mib)
    gpus = tp * pp

    run_dtype = model_dtype(arch, dtype)
    kv_b = kv_dtype_bytes(arch, kv_cache_dtype, dtype)
    per_layer_rank, kv_heads_per_gpu = kv_bytes_per_token_layer(arch, kv_b, tp, name)
    per_layer_full = kv_bytes_per_token_layer(arch, kv_b, 1, name)[0]
    layers_per_gpu = int(math.ceil(layers / float(pp)))
    kv_tok_model = per_layer_full * layers
    kv_tok_gpu = per_layer_rank * layers_per_gpu
    block_bytes = kv_tok_gpu * block_size

    total = gpu_memory_mib * MiB
    requested = int(total * util)
    w_total = weight_bytes(arch, name, dtype)
    w_gpu = int(math.ceil(w_total / float(gpus)))
    if activation_bytes is None:
        activation_bytes = activation_estimate(arch, tp, max_num_batched_tokens, max_num_seqs, dtype_bytes(run_dtype))
    if cuda_graph_bytes is None:
        cuda_graph_bytes = 0 if enforce_eager else RESERVE_DEFAULTS["cuda_graph_bytes"]
    if non_torch_bytes is None:
        non_torch_bytes = RESERVE_DEFAULTS["non_torch_bytes_parallel" if gpus > 1 else "non_torch_bytes_single"]
    reserves = int(activation_bytes) + int(cuda_graph_bytes) + int(non_torch_bytes)

    if kv_cache_memory_bytes:
        pool = int(kv_cache_memory_bytes)
        budget_label = "kv_cache_memory_bytes %s" % fmt_gib(pool)
        used = w_gpu + reserves + pool
    else:
        pool = requested - w_gpu - reserves
        budget_label = "utilization %.2f = %s of %s" % (util, fmt_gib(requested), fmt_gib(total))
        used = requested

    blocks = max(0, pool // block_bytes) if pool > 0 else 0
    blocks_per_req = int(math.ceil(max_model_len / float(block_size)))
    needed_one = blocks_per_req * block_bytes
    max_conc = blocks / float(blocks_per_req) if blocks_per_req else 0.0
    capacity = int(max_conc * max_model_len)  # what vLLM logs as "GPU KV cache size: N tokens"
    exp_len = int(expected_request_len) if expected_request_len else None
    max_conc_exp = None
    if exp_len:
        max_conc_exp = blocks / float(int(math.ceil(exp_len / float(block_size))))
    est_max_len = int(blocks) * block_size  # vLLM's estimate_max_model_len: whole blocks that fit

    reasons = []
    if w_gpu > (total if kv_cache_memory_bytes else requested):
        reasons.append(
            "weights alone exceed the budget: %s of weights per GPU (%s in all over %d GPUs) "
            "> %s"
            % (
                fmt_gib(w_gpu),
                fmt_gib(w_total),
                gpus,
                budget_label if not kv_cache_memory_bytes else "the GPU memory %s" % fmt_gib(total),
            )
        )
    if kv_cache_memory_bytes and used > total:
        reasons.append(
            "weights %s + reserves %s + kv_cache_memory_bytes %s = %s per GPU exceed the GPU "
            "memory %s" % (fmt_gib(w_gpu), fmt_gib(reserves), fmt_gib(pool), fmt_gib(used), fmt_gib(total))
        )
    if pool <= 0:
        reasons.append(
            "no memory left for the KV cache: %s - weights %s - reserves %s = %s per GPU"
            % (fmt_gib(requested), fmt_gib(w_gpu), fmt_gib(reserves), fmt_gib(pool))
        )
    elif needed_one > pool:
        reasons.append(
            "one max_model_len request does not fit: %s tokens need %s of KV cache per GPU, "
            "the pool is %s (estimated maximum model length %s)"
            % (fmt_int(max_model_len), fmt_gib(needed_one), fmt_gib(pool), fmt_int(est_max_len))
        )
    factor = float(oversubscription_factor if oversubscription_factor is not None else 1.0)
    if exp_len and blocks > 0:
        demand = max_num_seqs * exp_len
        if demand > capacity_at(blocks, block_size) * factor:
            reasons.append(
                "max_num_seqs %d x expected request length %s = %s tokens exceeds the KV "
                "capacity of %s tokens by more than the factor %.2f (%.2fx); lower "
                "max_num_seqs to %d or add memory"
                % (
                    max_num_seqs,
                    fmt_int(exp_len),
                    fmt_int(demand),
                    fmt_int(capacity_at(blocks, block_size)),
                    factor,
                    demand / float(capacity_at(blocks, block_size)),
                    max(1, int(capacity_at(blocks, block_size) * factor // exp_len)),
                )
            )
    fits = not reasons

    summary = (
        "%s (%s weights%s, KV %s) on %d x %s GPU, TP %d x PP %d, %s: weights %s/GPU, reserves %s "
        "(activation %s, CUDA graphs %s, non-torch %s), KV pool %s/GPU at %s B/token/GPU "
        "(%s B/token for the whole model) = %s blocks of %d = %s tokens; max concurrency %.2fx at "
        "%s tokens"
        % (
            name,
            run_dtype,
            ", " + _quant_method(arch) if _quant_method(arch) else "",
            kv_cache_dtype or "auto",
            gpus,
            fmt_gib(total),
            tp,
            pp,
            budget_label,
            fmt_gib(w_gpu),
            fmt_gib(reserves),
            fmt_gib(activation_bytes),
            fmt_gib(cuda_graph_bytes),
            fmt_gib(non_torch_bytes),
            fmt_gib(max(pool, 0)),
            fmt_int(kv_tok_gpu),
            fmt_int(kv_tok_model),
            fmt_int(blocks),
            block_size,
            fmt_int(capacity),
            max_conc,
            fmt_int(max_model_len),
        )
    )
    if max_conc_exp is not None:
        summary += ", %.2fx at the expected %s" % (max_conc_exp, fmt_int(exp_len))
    message = ("fits: " if fits else "does not fit: " + "; ".join(reasons) + ". Plan: ") + summary

    per_gpu = {
        "total_bytes": total,
        "requested_bytes": requested,
        "weight_bytes": w_gpu,
        "activation_bytes": int(activation_bytes),
        "cuda_graph_bytes": int(cuda_graph_bytes),
        "non_torch_bytes": int(non_torch_bytes),
        "kv_pool_bytes": max(0, int(pool)),
        "kv_bytes_per_token": kv_tok_gpu,
        "kv_heads": kv_heads_per_gpu,
        "layers": layers_per_gpu,
    }
    per_node = {
        "gpus": gpu_count or gpus,
        "engine_gpus": gpus,
        "total_bytes": total * gpus,
        "weight_bytes": w_total,
        "kv_pool_bytes": max(0, int(pool)) * gpus,
        "kv_capacity_tokens": capacity,
    }
    if is_mla(arch):
        attention = "mla"
    else:
        attention = "gqa" if int(arch.get("num_key_value_heads") or heads) < heads else "mha"
    return {
        "model": name,
        "attention": attention,
        "dtype": run_dtype,
        "kv_cache_dtype": kv_cache_dtype or "auto",
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "gpu_memory_utilization": util,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "block_size": block_size,
        "expected_request_len": exp_len,
        "oversubscription_factor": factor,
        "kv_bytes_per_token": kv_tok_model,
        "kv_bytes_per_token_per_gpu": kv_tok_gpu,
        "kv_bytes_per_request": needed_one,
        "kv_pool_bytes": max(0, int(pool)),
        "kv_capacity_blocks": int(blocks),
        "kv_capacity_tokens": capacity,
        "max_concurrency": round(max_conc, 2),
        "max_concurrency_expected": round(max_conc_exp, 2) if max_conc_exp is not None else None,
        "estimated_max_model_len": est_max_len,
        "per_gpu": per_gpu,
        "per_node": per_node,
        "fits": fits,
        "reasons": reasons,
        "message": message,
        "vllm_error": vllm_startup_error(pool, needed_one, max_model_len, est_max_len),
    }


def capacity_at(blocks, block_size):
    return int(blocks) * int(block_size)


def vllm_startup_error(pool, needed, max_model_len, estimated_max_len):
    """The ValueError text vLLM 0.33.0 raises at start-up for this pool, or None when it starts.

    Copied from ``_check_enough_kv_cache_memory`` in ``vllm/v1/core/kv_cache_planning.py``
    (0.33.0 wording; releases before it wrote "the models's max seq len").
    """
    if pool <= 0:
        return (
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
            "initializing the engine (this flag also controls CPU memory reservation on the CPU backend, "
            "despite its name). See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ "
            "for more details."
        )
    if needed > pool:
        estimated = ""
        if estimated_max_len > 0:
            estimated = "Based on the available memory, the estimated maximum model length is %d. " % estimated_max_len
        return (
            "To serve at least one request with the model's max seq len (%d), (%s GiB KV cache is "
            "needed, which is larger than the available KV cache memory (%s GiB). %sTry increasing "
            "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing "
            "`max_model_len` when initializing the engine. See "
            "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
            % (max_model_len, _vllm_gib(needed), _vllm_gib(pool), estimated)
        )
    return None


def _vllm_gib(num_bytes):
    """vLLM's format_gib: ``str(round(b / GiB, 2))``."""
    return "%s" % round(num_bytes / float(GiB), 2)
