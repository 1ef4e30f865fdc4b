# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""Layer-offload memory plan for llama.cpp's ``llama-server`` (pinned: the llama.cpp vendored by
llama-cpp-python 0.3.16, see scripts/build-llama-server.sh).

Plain Python, no Ansible. :func:`plan` is the one computation: the module ``llamacpp_memory_plan``
and the role ``llamacpp_server`` (through the same module) call it.

How llama.cpp places a model (``src/llama-model.cpp``, ``load_tensors``):

- ``--n-gpu-layers N`` offloads the LAST ``N`` repeating layers (``i_gpu_start = n_layer - N``);
  ``N = n_layer + 1`` offloads the output layer too (``output.weight``, ``output_norm``); larger
  values count as ``n_layer + 1``. The input layer (``token_embd``) always stays on the CPU.
- The offloaded positions ``0 .. min(N, n_layer + 1) - 1`` go to GPU ``upper_bound(splits, j / act)``
  where ``splits`` is the cumulative, normalised ``--tensor-split`` (default: each GPU's free
  memory). Rendering the split as whole layer counts per GPU (``--tensor-split 38,22``) gives
  exactly those counts; :func:`assign` reproduces the rule.
- The KV cache of a layer lives with the layer (``--no-kv-offload`` not set). Its size is
  ``n_ctx x n_head_kv x (head_dim_k + head_dim_v)`` elements per layer, where ``n_ctx`` is
  ``--ctx-size`` (the total that ``--parallel`` slots share, padded to 256) and each element costs
  the ``--cache-type-k/-v`` size (``f16`` 2 bytes; ``q8_0`` 34 bytes per 32; ``q4_0`` 18 bytes per
  32: ggml's block sizes). A quantized V cache needs flash attention (llama.cpp refuses it
  otherwise: "V cache quantization requires flash_attn").

Reserves per GPU, documented and overridable (every value in MiB):

- ``cuda_context_mib`` (default 512): the CUDA context, cuBLAS handles and workspace that a process
  holds on each GPU before any buffer; ``nvidia-smi`` shows 300-500 MiB for a process that only
  initialised CUDA on Ampere/Ada with lazy module loading (CUDA 12 default), plus llama.cpp's
  cuBLAS workspace.
- ``compute_buffer_mib`` (default: estimated, :func:`compute_buffer_bytes`): the graph buffer that
  llama.cpp reserves at load for the worst micro-batch (``llama_context: CUDA0 compute buffer
  size``). Without flash attention the attention scores ``[n_ctx, ubatch, n_head]`` in f32 dominate
  it; with flash attention only the mask ``[n_ctx, ubatch]`` remains. Activations of one layer
  (``ubatch x (4 x n_embd + 2 x n_ff)`` f32) and, on the GPU holding the output, the logits
  (``ubatch x vocab`` f32) add to it.
- ``margin_mib`` (default 1024): the free memory kept on every GPU: llama.cpp's own default target
  margin for ``--fit`` (``common/common.h``, ``fit_params_target = 1024 MiB``, llama.cpp as vendored
  by llama-cpp-python 0.3.36) for the temporaries of the CUDA memory pool, which grow at the first
  long prompt rather than at load - a failure seen in the field: all 80 layers of a 70B model
  loaded, and the first 4k-token prompt killed the server.

Inputs are refused, never replaced: :class:`PlanError` names the option.
"""

from __future__ import annotations

import math

from ansible_collections.gpufleet.node.plugins.module_utils.serving import _model_profiles

MiB = 1024**2
GiB = 1024**3

CACHE_TYPES = ("f16", "q8_0", "q4_0")
#: ggml block sizes: (elements per block, bytes per block)
GGML_BLOCKS = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "Q2_K": (256, 84),
    "Q3_K": (256, 110),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}
_CACHE_BLOCKS = {"f16": GGML_BLOCKS["F16"], "q8_0": GGML_BLOCKS["Q8_0"], "q4_0": GGML_BLOCKS["Q4_0"]}

#: Quantizations a profile can be planned at without the file. K-quant mixes follow llama.cpp's
#: ``src/llama-quant.cpp`` (``llama_tensor_get_type``) for llama-like models: ``Q4_K_M`` puts
#: ``attn_v`` and ``ffn_down`` at Q6_K on the ``use_more_bits`` layers (the first and last eighth and
#: every third between), ``attn_v`` at Q5_K on other layers of 70B models, the rest at Q4_K; the
#: output at Q6_K. With the GGUF file (``model_path``) the plan reads each tensor's bytes instead.
QUANTS = ("F16", "Q8_0", "Q4_0", "Q4_K_M")

RESERVE_DEFAULTS_MIB = {"cuda_context_mib": 512, "margin_mib": 1024}

#: llama.cpp's own limits (``src/llama-hparams.h`` ``LLAMA_MAX_LAYERS``, ``include/llama.h``
#: ``LLAMA_MAX_DEVICES``): a shape or GPU list beyond them is refused, which also bounds the planner's
#: loops (at most ``MAX_LAYERS + 1`` positions over ``MAX_GPUS`` GPUs).
MAX_LAYERS = 512
MAX_GPUS = 16

#: A shape's counts (positive integers) and sizes (non-negative integers).
_SHAPE_COUNTS = ("n_layers", "n_embd", "n_head", "n_head_kv", "head_dim_k", "head_dim_v", "n_ff")
_SHAPE_SIZES = ("vocab_size", "input_bytes", "output_bytes")

#: Profiles: the checkpoints of :mod:`_model_profiles` plus the GGUF quantization they are planned at.
MODEL_PROFILES = _model_profiles.MODEL_PROFILES


class PlanError(ValueError):
    """The inputs describe no plan; the message names the option."""


def _ggml_bytes(n_elements, type_name):
    per_block, block_bytes = GGML_BLOCKS[type_name]
    return -(-n_elements // per_block) * block_bytes


def _use_more_bits(i_layer, n_layers):
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def _int(where, value, minimum, maximum=None):
    """``value`` as an int in ``[minimum, maximum]``: an int (not a bool) or a string of digits."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PlanError("%s: must be an integer >= %d, got %r" % (where, minimum, value))
    if maximum is not None and value > maximum:
        raise PlanError("%s: %d exceeds %d, llama.cpp's limit" % (where, value, maximum))
    return value


def check_shape(shape, where="model"):
    """A shape (see :func:`_gguf.read_shape`) validated: counts positive integers (``n_layers`` at
    most :data:`MAX_LAYERS`), sizes and every entry of ``layer_bytes`` (one per layer) non-negative
    integers. Returns a copy; :class:`PlanError` names the field."""
    if not isinstance(shape, dict):
        raise PlanError("%s: a shape is a dict, not %s" % (where, type(shape).__name__))
    out = dict(shape)
    name = out.get("name") or where
    for key in _SHAPE_COUNTS:
        out[key] = _int("%s (%s).%s" % (where, name, key), out.get(key), 1, MAX_LAYERS if key == "n_layers" else None)
    for key in _SHAPE_SIZES:
        out[key] = _int("%s (%s).%s" % (where, name, key), out.get(key, 0), 0)
    out["n_ctx_train"] = _int("%s (%s).n_ctx_train" % (where, name), out.get("n_ctx_train") or 0, 0)
    layers = out.get("layer_bytes")
    if not isinstance(layers, (list, tuple)) or len(layers) != out["n_layers"]:
        raise PlanError(
            "%s (%s).layer_bytes: one size per layer (%d), got %r"
            % (where, name, out["n_layers"], layers if not isinstance(layers, (list, tuple)) else len(layers))
        )
    out["layer_bytes"] = [_int("%s (%s).layer_bytes[%d]" % (where, name, i), b, 0) for i, b in enumerate(layers)]
    return out


def shape_from_config(config, quant, name="model"):
    """A GGUF-like shape (see :func:`_gguf.read_shape`) from Hugging Face ``config.json`` fields at a
    quantization of :data:`QUANTS`, for users without the file at hand."""
    if quant not in QUANTS:
        raise PlanError("quant: %r is not one of %s" % (quant, ", ".join(QUANTS)))
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"):
        if key not in config:
            raise PlanError("%s: the model's fields lack %r" % (name, key))

    def field(key, default=None, maximum=None):
        return _int("%s.%s" % (name, key), config.get(key, default), 1, maximum)

    n_layers = field("num_hidden_layers", maximum=MAX_LAYERS)
    n_embd = field("hidden_size")
    n_head = field("num_attention_heads")
    n_head_kv = field("num_key_value_heads", n_head)
    if config.get("head_dim"):
        head_dim = field("head_dim")
    else:
        head_dim = _int("%s.hidden_size / num_attention_heads" % name, n_embd // n_head, 1)
    n_ff = field("intermediate_size")
    vocab = field("vocab_size")
    if config.get("kv_lora_rank"):
        raise PlanError("%s: MLA models are not planned from fields; pass the GGUF file (model_path)" % name)
    is_70b = n_layers == 80 and n_embd == 8192

    def t(kind, i_layer):
        if quant in ("F16", "Q8_0", "Q4_0"):
            return quant
        if kind == "attn_v":
            return "Q6_K" if _use_more_bits(i_layer, n_layers) else ("Q5_K" if is_70b else "Q4_K")
        if kind == "ffn_down":
            return "Q6_K" if _use_more_bits(i_layer, n_layers) else "Q4_K"
        return "Q4_K"

    q_out = n_head * head_dim
    kv_out = n_head_kv * head_dim
    layer_bytes = []
    for i in range(n_layers):
        total = 2 * n_embd * 4  # attn_norm, ffn_norm (F32)
        total += _ggml_bytes(n_embd * q_out, t("attn_q", i))
        total += _ggml_bytes(n_embd * kv_out, t("attn_k", i))
        total += _ggml_bytes(n_embd * kv_out, t("attn_v", i))
        total += _ggml_bytes(q_out * n_embd, t("attn_output", i))
        total += 2 * _ggml_bytes(n_embd * n_ff, t("ffn_gate", i))
        total += _ggml_bytes(n_ff * n_embd, t("ffn_down", i))
        layer_bytes.append(total)
    out_type = quant if quant in ("F16", "Q8_0") else ("Q8_0" if quant == "Q4_0" else "Q6_K")
    embd_type = "Q4_K" if quant == "Q4_K_M" else quant
    tied = bool(config.get("tie_word_embeddings"))
    return {
        "name": name,
        "architecture": "llama",
        "source": "profile",
        "quant": quant,
        "n_layers": n_layers,
        "n_embd": n_embd,
        "n_head": n_head,
        "n_head_kv": n_head_kv,
        "head_dim_k": head_dim,
        "head_dim_v": head_dim,
        "n_ff": n_ff,
        "vocab_size": vocab,
        "n_ctx_train": _int("%s.max_position_embeddings" % name, config.get("max_position_embeddings") or 0, 0),
        "layer_bytes": layer_bytes,
        "input_bytes": _ggml_bytes(vocab * n_embd, embd_type),
        "output_bytes": n_embd * 4 + (0 if tied else _ggml_bytes(vocab * n_embd, out_type)),
        "tied_output": tied,
    }


def resolve_model(model=None, model_path=None, quant=None):
    """The shape to plan with: the GGUF file's header, a profile name, or a dict of fields."""
    if model_path:
        from ansible_collections.gpufleet.node.plugins.module_utils.serving import _gguf

        try:
            return _gguf.read_shape(model_path)
        except _gguf.GGUFError as exc:
            raise PlanError("model_path: %s" % exc) from exc
    if model is None:
        raise PlanError("model: give model_path (a GGUF file) or model (a profile name or the model's fields)")
    if isinstance(model, str):
        if model not in MODEL_PROFILES:
            raise PlanError("model: unknown profile %r; known: %s" % (model, ", ".join(sorted(MODEL_PROFILES))))
        return shape_from_config(MODEL_PROFILES[model], quant or "Q4_K_M", name=model)
    if isinstance(model, dict):
        if "layer_bytes" in model:  # an already-resolved shape (for instance from a previous plan)
            return check_shape(model)
        fields = dict(MODEL_PROFILES[model["profile"]]) if model.get("profile") else {}
        if model.get("profile") and model["profile"] not in MODEL_PROFILES:
            raise PlanError("model.profile: unknown profile %r" % model["profile"])
        fields.update({k: v for k, v in model.items() if k not in ("profile", "quant", "name")})
        return shape_from_config(
            fields, quant or model.get("quant") or "Q4_K_M", name=model.get("name") or model.get("profile") or "model"
        )
    raise PlanError("model: a profile name or a dict, not %s" % type(model).__name__)


def _count(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PlanError("%s: must be an integer >= %d, got %r" % (name, minimum, value))
    return value


def _split(tensor_split, n_gpus):
    """``--tensor-split`` as floats: one finite, non-negative proportion per GPU, not all zero."""
    wanted = "tensor_split: one finite, non-negative proportion per GPU (%d), not all zero" % n_gpus
    if not isinstance(tensor_split, (list, tuple)) or len(tensor_split) != n_gpus:
        raise PlanError("%s; got %r" % (wanted, tensor_split))
    out = []
    for i, x in enumerate(tensor_split):
        try:
            value = float(x) if not isinstance(x, bool) else None
        except (TypeError, ValueError):
            value = None
        if value is None or not math.isfinite(value) or value < 0:
            raise PlanError("%s; tensor_split[%d] is %r" % (wanted, i, x))
        out.append(value)
    if not sum(out) or not math.isfinite(sum(out)):
        raise PlanError("%s; got %r" % (wanted, tensor_split))
    return out


def kv_bytes_per_layer(shape, n_ctx, cache_type):
    per_block, block_bytes = _CACHE_BLOCKS[cache_type]
    row_k = shape["n_head_kv"] * shape["head_dim_k"]
    row_v = shape["n_head_kv"] * shape["head_dim_v"]
    return n_ctx * (-(-row_k // per_block) + -(-row_v // per_block)) * block_bytes


def compute_buffer_bytes(shape, n_ctx, ubatch, flash_attn, with_output):
    """Estimate of llama.cpp's compute buffer on one GPU (see the module doc)."""
    act = ubatch * (4 * shape["n_embd"] + 2 * shape["n_ff"]) * 4
    mask = n_ctx * ubatch * 4
    scores = 0 if flash_attn else n_ctx * ubatch * shape["n_head"] * 4
    logits = ubatch * shape["vocab_size"] * 4 if with_output else 0
    return act + mask + scores + logits


def assign(n_positions, split):
    """llama.cpp's rule: offloaded position ``j`` goes to GPU ``upper_bound(cumsplit, j / n)``.
    Returns the number of positions per GPU."""
    total = float(sum(split))
    cum, acc = [], 0.0
    for part in split:
        acc += part
        cum.append(acc / total)
    counts = [0] * len(split)
    for j in range(n_positions):
        x = j / n_positions
        gpu = next((i for i, c in enumerate(cum) if c > x), len(split) - 1)
        counts[gpu] += 1
    return counts


def _gpu_loads(shape, n_gpu_layers, counts, n_ctx, opts):
    """Bytes planned on each GPU for this offload and these per-GPU position counts."""
    n_layers = shape["n_layers"]
    start = n_layers - min(n_gpu_layers, n_layers)
    kv_layer = kv_bytes_per_layer(shape, n_ctx, opts["cache_type"])
    out_bytes = shape["output_bytes"] + (shape["input_bytes"] if shape.get("tied_output") else 0)
    # llama.cpp's op offload (on by default, ``--no-op-offload``; ggml-cuda offload_op for batches of
    # 32+ tokens): during prompt processing the scheduler runs the matmuls of host-resident weights
    # on the first GPU, copying the weight into its compute buffer: the largest host-resident layer,
    # or the output layer (and its logits) when it stays on the host.
    host_layers = [shape["layer_bytes"][il] for il in range(start)]
    host_op_bytes = 0
    if n_gpu_layers <= n_layers:
        host_op_bytes = max(host_layers + [out_bytes]) + opts["ubatch_size"] * shape["vocab_size"] * 4
    elif host_layers:
        host_op_bytes = max(host_layers)
    first_gpu = next((i for i, c in enumerate(counts) if c), None)
    loads = []
    pos = 0
    for gpu, count in enumerate(counts):
        weights = kv = 0
        holds_output = False
        for j in range(pos, pos + count):
            il = start + j
            if il < n_layers:
                weights += shape["layer_bytes"][il]
                kv += kv_layer
            else:
                weights += out_bytes
                holds_output = True
        pos += count
        if count:
            compute = (
                opts["compute_buffer_mib"] * MiB
                if opts["compute_buffer_mib"] is not None
                else compute_buffer_bytes(shape, n_ctx, opts["ubatch_size"], opts["flash_attn"], holds_output)
            )
        else:
            compute = 0
        if count and gpu == first_gpu and host_op_bytes and opts["compute_buffer_mib"] is None:
            # op offload: the first GPU runs large-batch ops of host-resident weights on a copy
            compute += host_op_bytes
        reserve = opts["cuda_context_mib"] * MiB + opts["margin_mib"] * MiB
        loads.append(
            {
                "gpu": gpu,
                "layers": count - (1 if holds_output else 0),
                "output": holds_output,
                "weight_bytes": weights,
                "kv_bytes": kv,
                "compute_bytes": compute,
                "reserve_bytes": reserve,
                "total_bytes": weights + kv + compute + reserve,
            }
        )
    return loads


def _balanced_counts(shape, n_gpu_layers, gpu_bytes, n_ctx, opts):
    """Per-GPU position counts for this offload that fit, or None. Proportional to each GPU's room
    first (even headroom), greedy (fill in order) when rounding breaks the proportional split."""
    n_pos = min(n_gpu_layers, shape["n_layers"] + 1)
    if n_pos == 0:
        return [0] * len(gpu_bytes)
    fixed = (opts["cuda_context_mib"] + opts["margin_mib"]) * MiB
    room = [max(0, b - fixed) for b in gpu_bytes]
    if sum(room) == 0:
        return None
    counts = assign(n_pos, room)

    def fits(c):
        loads = _gpu_loads(shape, n_gpu_layers, c, n_ctx, opts)
        return all(load["total_bytes"] <= cap for load, cap in zip(loads, gpu_bytes))

    if fits(counts):
        return counts
    counts = [0] * len(gpu_bytes)
    left = n_pos
    for gpu in range(len(gpu_bytes)):
        while left:
            counts[gpu] += 1
            if _gpu_loads(shape, n_gpu_layers, counts, n_ctx, opts)[gpu]["total_bytes"] > gpu_bytes[gpu]:
                counts[gpu] -= 1
                break
            left -= 1
    return None if left else counts


def plan(
    gpu_memory_mib,
    model=None,
    model_path=None,
    quant=None,
    ctx_size=4096,
    parallel=1,
    cache_type="f16",
    flash_attn=False,
    ubatch_size=512,
    n_gpu_layers=-1,
    tensor_split=None,
    cuda_context_mib=None,
    compute_buffer_mib=None,
    margin_mib=None,
):
    """The layer-offload plan (see the module doc). Returns a dict; ``fits`` and ``reasons`` judge."""
    if not isinstance(gpu_memory_mib, (list, tuple)) or not gpu_memory_mib:
        raise PlanError("gpu_memory_mib: a list with one entry (MiB) per GPU")
    if len(gpu_memory_mib) > MAX_GPUS:
        raise PlanError("gpu_memory_mib: %d GPUs; llama.cpp splits over at most %d" % (len(gpu_memory_mib), MAX_GPUS))
    gpus = [_count("gpu_memory_mib[%d]" % i, v) for i, v in enumerate(gpu_memory_mib)]
    _count("ctx_size", ctx_size)
    _count("parallel", parallel)
    _count("ubatch_size", ubatch_size)
    if cache_type not in CACHE_TYPES:
        raise PlanError("cache_type: %r is not one of %s" % (cache_type, ", ".join(CACHE_TYPES)))
    if n_gpu_layers is None:
        n_gpu_layers = -1
    _count("n_gpu_layers", n_gpu_layers, minimum=-1)
    opts = {
        "cache_type": cache_type,
        "flash_attn": bool(flash_attn),
        "ubatch_size": ubatch_size,
        "compute_buffer_mib": compute_buffer_mib,
        "cuda_context_mib": RESERVE_DEFAULTS_MIB["cuda_context_mib"] if cuda_context_mib is None else cuda_context_mib,
        "margin_mib": RESERVE_DEFAULTS_MIB["margin_mib"] if margin_mib is None else margin_mib,
    }
    for key in ("cuda_context_mib", "margin_mib", "compute_buffer_mib"):
        if opts[key] is not None:
            _count(key, opts[key], minimum=0)
    if tensor_split is not None:
        tensor_split = _split(tensor_split, len(gpus))
    shape = check_shape(resolve_model(model, model_path, quant), "model_path" if model_path else "model")
    n_layers = shape["n_layers"]
    n_ctx_total = ctx_size * parallel
    n_ctx = -(-n_ctx_total // 256) * 256  # llama.cpp pads the KV cache size to 256 cells
    gpu_bytes = [m * MiB for m in gpus]
    reasons = []
    if cache_type != "f16" and not flash_attn:
        reasons.append(
            "cache_type %s quantizes the V cache, which llama.cpp refuses without flash attention "
            '("V cache quantization requires flash_attn"): set flash_attn or cache_type f16' % cache_type
        )
    if shape.get("n_ctx_train") and ctx_size > shape["n_ctx_train"]:
        reasons.append(
            "ctx_size %d per slot exceeds the model's training context %d" % (ctx_size, shape["n_ctx_train"])
        )

    def counts_for(ngl):
        if tensor_split is not None:
            counts = assign(min(ngl, n_layers + 1), [float(x) for x in tensor_split]) if ngl else [0] * len(gpus)
            loads = _gpu_loads(shape, ngl, counts, n_ctx, opts)
            ok = all(load["total_bytes"] <= cap for load, cap in zip(loads, gpu_bytes))
            return counts if ok else None
        return _balanced_counts(shape, ngl, gpu_bytes, n_ctx, opts)

    # The most positions that fit (0 .. n_layers + 1), by bisection: loads grow with the offload.
    lo, hi = 0, n_layers + 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if counts_for(mid) is not None:
            lo = mid
        else:
            hi = mid - 1
    max_fit = lo
    requested = None if n_gpu_layers == -1 else min(n_gpu_layers, n_layers + 1)
    chosen = max_fit if requested is None else requested
    counts = counts_for(chosen)
    fits_layers = counts is not None
    if counts is None:  # what was asked, on the split llama.cpp would use, to show the numbers
        counts = (
            (
                assign(min(chosen, n_layers + 1), [float(x) for x in tensor_split])
                if tensor_split is not None
                else assign(
                    min(chosen, n_layers + 1),
                    [max(1, b - (opts["cuda_context_mib"] + opts["margin_mib"]) * MiB) for b in gpu_bytes],
                )
            )
            if chosen
            else [0] * len(gpus)
        )
    loads = _gpu_loads(shape, chosen, counts, n_ctx, opts)
    if not fits_layers:
        for load, cap, mib in zip(loads, gpu_bytes, gpus):
            if load["total_bytes"] > cap:
                reasons.append(
                    "n_gpu_layers %d does not fit GPU%d (%d MiB): %d layer(s)%s need %s weights + %s KV cache "
                    "(%s, %d tokens = %d slots x %d) + %s compute buffer + %s reserves (CUDA context, margin) "
                    "= %s > %s; at most %d layers fit this plan"
                    % (
                        chosen,
                        load["gpu"],
                        mib,
                        load["layers"],
                        " and the output" if load["output"] else "",
                        fmt_gib(load["weight_bytes"]),
                        fmt_gib(load["kv_bytes"]),
                        cache_type,
                        n_ctx,
                        parallel,
                        ctx_size,
                        fmt_gib(load["compute_bytes"]),
                        fmt_gib(load["reserve_bytes"]),
                        fmt_mib(load["total_bytes"]),
                        fmt_mib(cap),
                        max_fit,
                    )
                )
    n_pos = sum(counts)
    split = [round(c / n_pos, 4) if n_pos else 0.0 for c in counts]
    kv_total = sum(load["kv_bytes"] for load in loads)
    gpu_layer_bytes = sum(load["weight_bytes"] for load in loads)
    all_weight = sum(shape["layer_bytes"]) + shape["input_bytes"] + shape["output_bytes"]
    fits = fits_layers and not reasons
    result = {
        "model": shape["name"],
        "source": shape.get("source"),
        "n_layers": n_layers,
        "n_gpu_layers": chosen,
        "max_gpu_layers": max_fit,
        "offloads_output": chosen > n_layers,
        "tensor_split": split,
        "layers_per_gpu": counts,
        "ctx_size_total": n_ctx_total,
        "kv_cells": n_ctx,
        "kv_bytes_per_layer": kv_bytes_per_layer(shape, n_ctx, cache_type),
        "kv_bytes_total": kv_total,
        "per_gpu_bytes": [load["total_bytes"] for load in loads],
        "per_gpu": loads,
        "host_bytes": all_weight
        - gpu_layer_bytes
        + (shape["input_bytes"] if shape.get("tied_output") and chosen > n_layers else 0),
        "fits": fits,
        "reasons": reasons,
    }
    result["message"] = "%s: %s with %d of %d layers on %d GPU(s) %s (split %s), KV %s %s, per GPU %s of %s" % (
        "fits" if fits else "does not fit",
        shape["name"],
        min(chosen, n_layers),
        n_layers,
        len(gpus),
        "+ output" if chosen > n_layers else "",
        ",".join(str(c) for c in counts),
        cache_type,
        fmt_gib(kv_total),
        "/".join(fmt_gib(b) for b in result["per_gpu_bytes"]),
        "/".join(fmt_gib(b) for b in gpu_bytes),
    )
    result["shape"] = {k: v for k, v in shape.items() if k not in ("layer_bytes", "tensor_types")}
    return result


def server_args(result, ctx_size, parallel, cache_type="f16", flash_attn=False, ubatch_size=512):
    """The llama-server arguments the plan decides (the role adds model, host, port, --metrics)."""
    args = [
        "--n-gpu-layers",
        str(result["n_gpu_layers"]),
        "--ctx-size",
        str(ctx_size * parallel),
        "--parallel",
        str(parallel),
        "--cache-type-k",
        cache_type,
        "--cache-type-v",
        cache_type,
        "--ubatch-size",
        str(ubatch_size),
    ]
    if len(result["layers_per_gpu"]) > 1:
        args += ["--split-mode", "layer", "--tensor-split", ",".join(str(c) for c in result["layers_per_gpu"])]
    if flash_attn:
        args.append("--flash-attn")
    return args


def fmt_mib(num_bytes):
    return "%d MiB" % -(-num_bytes // MiB)


def fmt_gib(num_bytes):
    return "%.2f GiB" % (num_bytes / GiB)
