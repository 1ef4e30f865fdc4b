#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llamacpp_memory_plan
short_description: Plan llama.cpp's layer offload for a GGUF model on GPUs of any sizes
description:
  - Computes, without a GPU, how many of a model's repeating layers llama.cpp's C(llama-server) can
    hold on the GPUs (C(--n-gpu-layers)), the C(--tensor-split) across GPUs of different sizes, the
    KV cache of the GPU-resident layers and everything planned on each GPU, reserves included.
  - Layers are placed the way llama.cpp places them (the last O(n_gpu_layers) layers; one more than
    the model has offloads the output layer too; the input embeddings stay on the CPU). Weights are
    each tensor's exact bytes from the GGUF header when O(model_path) is given.
  - Reserves per GPU - the CUDA context, the compute buffer (estimated from O(ubatch_size),
    O(flash_attn), the context and the model's shape, plus the copies that llama.cpp's op offload
    makes of host-resident weights) and a free margin - are documented in the collection's
    C(plugins/module_utils/serving/_llamaplan.py) with their sources, and overridable.
  - Reports a misfit in RV(fits) and RV(reasons) and never fails on it; the caller refuses. Fails on
    inputs that describe no plan (unknown profile, unreadable GGUF file, bad numbers), naming the option.
  - Pure computation, changes nothing. O(model_path) needs the Python package C(gguf) where the
    module runs.
version_added: 0.2.0
author:
  - gpufleet.node developers (@gpufleet)
options:
  model_path:
    description: A GGUF model file; its header gives the shape and every tensor's bytes.
    type: path
  model:
    description:
      - A profile name (the checkpoints of the collection's model profiles, for example
        C(Llama-3.3-70B-Instruct)), planned at O(quant); or a dict of the model's C(config.json)
        fields (C(num_hidden_layers), C(num_attention_heads), C(num_key_value_heads), C(head_dim),
        C(hidden_size), C(intermediate_size), C(vocab_size)), optionally with C(profile) to start
        from a profile and C(quant).
    type: raw
  quant:
    description: The GGUF quantization a profile or a dict of fields is planned at.
    type: str
    choices: [F16, Q8_0, Q4_0, Q4_K_M]
  gpu_memory_mib:
    description: Memory of each GPU in MiB (nvidia-smi's C(memory.total)), one entry per GPU; sizes may differ.
    type: list
    elements: int
    required: true
  ctx_size:
    description: Tokens per slot. C(llama-server)'s C(--ctx-size) is the total its slots share, O(ctx_size) x O(parallel).
    type: int
    default: 4096
  parallel:
    description: Slots (C(--parallel)), each a concurrent request of up to O(ctx_size) tokens.
    type: int
    default: 1
  cache_type:
    description: KV cache type (C(--cache-type-k) and C(--cache-type-v)); quantized types need O(flash_attn).
    type: str
    default: f16
    choices: [f16, q8_0, q4_0]
  flash_attn:
    description: Flash attention (C(--flash-attn)); without it the attention scores dominate the compute buffer.
    type: bool
    default: false
  ubatch_size:
    description: Physical batch (C(--ubatch-size)), the tokens one compute pass holds.
    type: int
    default: 512
  n_gpu_layers:
    description:
      - Layers requested on the GPUs, counted as C(--n-gpu-layers) counts them (the number of repeating
        layers plus one offloads the output too). C(-1) or omitted - as many as fit.
    type: int
    default: -1
  tensor_split:
    description: Proportions per GPU as C(--tensor-split) takes them. Default - the plan's own split by each GPU's room.
    type: list
    elements: float
  cuda_context_mib:
    description: CUDA context and cuBLAS workspace per GPU, in MiB.
    type: int
    default: 512
  margin_mib:
    description: Memory kept free on each GPU, in MiB (llama.cpp's own C(--fit-target) default).
    type: int
    default: 1024
  compute_buffer_mib:
    description: Replaces the estimated compute buffer per GPU (for example the C(compute buffer size) a real start logged).
    type: int
attributes:
  check_mode:
    description: Runs in check mode; it changes nothing in any mode.
    support: full
  diff_mode:
    description: Nothing to diff.
    support: none
"""

EXAMPLES = r"""
- name: Plan Llama-3.3-70B Q4_K_M on one 48 GB card with 4 slots of 4k tokens
  gpufleet.node.llamacpp_memory_plan:
    model: Llama-3.3-70B-Instruct
    quant: Q4_K_M
    gpu_memory_mib: [49140]
    ctx_size: 4096
    parallel: 4
  register: plan

- name: Plan a GGUF file on an A6000 and a 4090
  gpufleet.node.llamacpp_memory_plan:
    model_path: /var/lib/llamacpp/models/model.gguf
    gpu_memory_mib: [49140, 24564]
    ctx_size: 8192
    parallel: 2
    cache_type: q8_0
    flash_attn: true
"""

RETURN = r"""
n_gpu_layers:
  description: The layers planned on the GPUs (the request, or as many as fit), as C(--n-gpu-layers).
  returned: always
  type: int
  sample: 79
max_gpu_layers:
  description: The most that fit with these settings.
  returned: always
  type: int
  sample: 79
n_layers:
  description: The model's repeating layers.
  returned: always
  type: int
  sample: 80
tensor_split:
  description: One fraction per GPU of the offloaded layers.
  returned: always
  type: list
  elements: float
  sample: [0.679, 0.321]
layers_per_gpu:
  description: Offloaded positions per GPU (the output layer counts as one); the role renders C(--tensor-split) from these.
  returned: always
  type: list
  elements: int
  sample: [55, 26]
kv_bytes_total:
  description: The KV cache of the GPU-resident layers, in bytes.
  returned: always
  type: int
  sample: 5368709120
per_gpu_bytes:
  description: Everything planned on each GPU (weights, KV cache, compute buffer, reserves), in bytes.
  returned: always
  type: list
  elements: int
  sample: [35745566720, 19766345728]
fits:
  description: Whether the plan fits every GPU and the settings are valid for llama.cpp.
  returned: always
  type: bool
  sample: true
reasons:
  description: Why it does not fit, with the numbers; empty when it fits.
  returned: always
  type: list
  elements: str
  sample: ["n_gpu_layers 80 does not fit GPU0 (49140 MiB): ... = 49141 MiB > 49140 MiB; at most 79 layers fit this plan"]
message:
  description: The verdict and the plan in one sentence.
  returned: always
  type: str
  sample: "fits: Llama-3.3-70B-Instruct with 79 of 80 layers on 1 GPU(s) (split 79), ..."
server_args:
  description: The llama-server arguments the plan decides (C(--n-gpu-layers), C(--ctx-size) = O(ctx_size) x O(parallel),
    C(--parallel), cache types, C(--ubatch-size), C(--split-mode layer --tensor-split) with the layer counts on several GPUs,
    C(--flash-attn)); the role adds the model, host, port and C(--metrics).
  returned: always
  type: list
  elements: str
  sample: ["--n-gpu-layers", "79", "--ctx-size", "16384", "--parallel", "4"]
plan:
  description: The whole plan, with C(per_gpu) (per GPU C(layers), C(output), C(weight_bytes), C(kv_bytes),
    C(compute_bytes), C(reserve_bytes), C(total_bytes)), C(host_bytes), C(kv_cells) and the model's C(shape).
  returned: always
  type: dict
  sample: {"n_gpu_layers": 79, "kv_cells": 16384}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.node.plugins.module_utils.serving._llamaplan import (
    CACHE_TYPES,
    QUANTS,
    PlanError,
    plan,
    server_args,
)

#: The plan's keys returned at the top level of the result.
RETURNED_KEYS = (
    "n_gpu_layers",
    "max_gpu_layers",
    "n_layers",
    "tensor_split",
    "layers_per_gpu",
    "kv_bytes_total",
    "per_gpu_bytes",
    "fits",
    "reasons",
    "message",
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            model_path=dict(type="path"),
            model=dict(type="raw"),
            quant=dict(type="str", choices=list(QUANTS)),
            gpu_memory_mib=dict(type="list", elements="int", required=True),
            ctx_size=dict(type="int", default=4096),
            parallel=dict(type="int", default=1),
            cache_type=dict(type="str", default="f16", choices=list(CACHE_TYPES)),
            flash_attn=dict(type="bool", default=False),
            ubatch_size=dict(type="int", default=512),
            n_gpu_layers=dict(type="int", default=-1),
            tensor_split=dict(type="list", elements="float"),
            cuda_context_mib=dict(type="int", default=512),
            margin_mib=dict(type="int", default=1024),
            compute_buffer_mib=dict(type="int"),
        ),
        mutually_exclusive=[("model_path", "model")],
        required_one_of=[("model_path", "model")],
        supports_check_mode=True,
    )
    try:
        result = plan(**module.params)
    except PlanError as exc:
        module.fail_json(msg="llamacpp_memory_plan: %s" % exc)
    module.exit_json(
        changed=False,
        **{key: result[key] for key in RETURNED_KEYS},
        server_args=server_args(
            result,
            module.params["ctx_size"],
            module.params["parallel"],
            module.params["cache_type"],
            module.params["flash_attn"],
            module.params["ubatch_size"],
        ),
        plan=result,
    )


if __name__ == "__main__":
    main()
