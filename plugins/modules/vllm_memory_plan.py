#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_memory_plan
short_description: Plan vLLM's KV-cache memory for a model on a node's GPUs
description:
  - Computes, without a GPU, what vLLM 0.33.0 (V1 engine) will do with the memory of each GPU at
    start-up - weights per GPU, the reserves it measures (activation peak, CUDA graphs, non-torch
    memory), the KV pool, its capacity in whole blocks and tokens, and the maximum concurrency at
    O(max_model_len) and at the expected request length.
  - KV bytes per token and layer are C(2 x kv_heads x head_dim x dtype bytes) with the KV heads split
    across tensor-parallel ranks (replicated when there are fewer heads than ranks); MLA models
    (C(kv_lora_rank) set) cache C((kv_lora_rank + qk_rope_head_dim) x dtype bytes) on every rank.
  - Reports a misfit in RV(fits) and RV(reasons) and never fails on it; the caller is what refuses.
    It fails when the inputs describe no plan (unknown profile, missing config field, heads not
    divisible by the TP size) and on bad numbers, naming the option - every count (sizes, lengths,
    sequences, O(block_size), the model's layers and heads) must be a positive integer and every
    reserve a non-negative number of bytes; an unset option takes its default, a zero or negative
    one is refused, never replaced.
  - The P(gpufleet.node.vllm_server#role) role plans with the same computation (filter
    C(gpufleet.node.vllm_serve_config)), once, on the controller.
  - Pure computation, runs anywhere; changes nothing.
version_added: 0.1.0
author:
  - gpufleet.node developers (@gpufleet)
options:
  model:
    description:
      - A shipped model profile name (C(Llama-3.3-70B-Instruct), C(Llama-3.3-70B-Instruct-FP8),
        C(Llama-3.1-70B-Instruct), C(Llama-3.1-8B-Instruct), C(Qwen2.5-72B-Instruct),
        C(DeepSeek-V2-Lite-Chat)) or its Hugging Face id.
      - Or a dict of the model's C(config.json) fields, C(num_hidden_layers), C(num_attention_heads),
        C(num_key_value_heads), C(head_dim), C(hidden_size), plus C(num_parameters) (or
        C(weight_bytes)) and C(torch_dtype) or C(quantization); C(kv_lora_rank) and
        C(qk_rope_head_dim) for MLA models. A C(profile) key starts from a shipped profile and
        overrides some of its fields.
    type: raw
    required: true
  gpu_count:
    description:
      - GPUs on the node, reported as C(gpus) of RV(plan.per_node); the plan is refused when
        O(tensor_parallel_size) x O(pipeline_parallel_size) needs more. Default the engine's GPUs.
    type: int
  gpu_memory_mib:
    description:
      - Memory of one GPU in MiB, as nvidia-smi's C(memory.total) (for example C(46068) for an L40S,
        C(81920) for an A100 80GB). With unequal GPUs pass the smallest.
    type: int
    required: true
  tensor_parallel_size:
    description: vLLM's C(--tensor-parallel-size).
    type: int
    default: 1
  pipeline_parallel_size:
    description: vLLM's C(--pipeline-parallel-size).
    type: int
    default: 1
  gpu_memory_utilization:
    description: vLLM's C(--gpu-memory-utilization), the fraction of each GPU's memory vLLM may use.
    type: float
    default: 0.92
  kv_cache_memory_bytes:
    description: vLLM's C(--kv-cache-memory-bytes); when set it is the KV pool and O(gpu_memory_utilization)
      is ignored.
    type: int
  kv_cache_dtype:
    description: vLLM's C(--kv-cache-dtype); C(auto) is the model's dtype.
    type: str
    default: auto
    choices: [auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2, fp8_inc, fp8_ds_mla]
  dtype:
    description: vLLM's C(--dtype) for the weights and activations; C(auto) is the model's C(torch_dtype).
    type: str
    default: auto
    choices: [auto, bfloat16, float16, half, float32]
  max_model_len:
    description: vLLM's C(--max-model-len); defaults to the model's C(max_position_embeddings).
    type: int
  max_num_seqs:
    description: vLLM's C(--max-num-seqs); defaults to vLLM's own default (1024 on GPUs of 70 GiB and
      more, else 256).
    type: int
  max_num_batched_tokens:
    description: vLLM's C(--max-num-batched-tokens), used for the activation estimate; defaults to
      vLLM's own default (8192 on GPUs of 70 GiB and more, else 2048).
    type: int
  block_size:
    description: vLLM's C(--block-size), tokens per KV block.
    type: int
    default: 16
  expected_request_len:
    description:
      - Tokens (prompt and output) of a typical request, for the concurrency at the expected length
        and the oversubscription check. Without it that check is skipped.
    type: int
  oversubscription_factor:
    description:
      - How far O(max_num_seqs) x O(expected_request_len) may exceed the KV capacity before the plan
        does not fit. C(1.0) means every admitted sequence keeps its KV cache; larger values accept
        preemption under full load.
    type: float
    default: 1.0
  enforce_eager:
    description: vLLM's C(--enforce-eager); no CUDA graphs, so no CUDA-graph reserve.
    type: bool
    default: false
  activation_bytes:
    description:
      - Peak activation memory per GPU in bytes. Default is an estimate, C(max_num_batched_tokens x
        (4 x hidden + 2 x intermediate / tp) x dtype bytes + max_num_seqs x vocab x 4).
    type: int
  cuda_graph_bytes:
    description: CUDA-graph memory per GPU in bytes. Default 0.5 GiB, 0 with O(enforce_eager).
    type: int
  non_torch_bytes:
    description: Non-torch memory per GPU in bytes (CUDA context, NCCL). Default 0.5 GiB on one GPU,
      1 GiB with tensor or pipeline parallelism.
    type: int
extends_documentation_fragment:
  - gpufleet.node.attributes.read_only
notes:
  - The reserves are estimates of what vLLM measures on the GPU at start-up; figures from vLLM's
    own logs are 0.15-3.6 GiB of non-torch memory and 0.4-1.3 GiB of activations for 8B-70B models.
    Pass measured values for a tighter plan.
seealso:
  - name: vLLM conserving memory
    description: What the KV-cache settings mean.
    link: https://docs.vllm.ai/en/latest/configuration/conserving_memory/
"""

EXAMPLES = r"""
- name: Plan Llama 3.3 70B on four L40S
  gpufleet.node.vllm_memory_plan:
    model: Llama-3.3-70B-Instruct
    gpu_memory_mib: 46068
    tensor_parallel_size: 4
    gpu_memory_utilization: 0.88
    kv_cache_dtype: fp8
    max_model_len: 16384
    max_num_seqs: 32
    expected_request_len: 8192
  register: kv_plan

- name: Refuse a plan that does not fit
  ansible.builtin.fail:
    msg: "{{ kv_plan.message }}"
  when: not kv_plan.fits

- name: Plan a model from its config.json
  gpufleet.node.vllm_memory_plan:
    model: "{{ (lookup('ansible.builtin.file', '/models/my-model/config.json') | from_json)
               | combine({'num_parameters': 8030261248}) }}"
    gpu_memory_mib: "{{ ansible_facts.gpu_topology.gpus | map(attribute='memory_total_mib') | min }}"
    max_model_len: 8192
"""

RETURN = r"""
kv_bytes_per_token:
  description: KV-cache bytes per token of the whole model (all layers, all KV heads, no replication).
  returned: always
  type: int
  sample: 327680
kv_bytes_per_token_per_gpu:
  description: KV-cache bytes per token on one GPU (its KV heads and its pipeline stage's layers).
  returned: always
  type: int
  sample: 81920
kv_capacity_tokens:
  description: Tokens the KV pool holds, as vLLM logs it (C(GPU KV cache size) - whole blocks).
  returned: always
  type: int
  sample: 100656
kv_capacity_blocks:
  description: Whole KV blocks in the pool of one GPU.
  returned: always
  type: int
  sample: 6291
max_concurrency:
  description: Requests of O(max_model_len) tokens the pool holds at once (vLLM's C(Maximum concurrency)).
  returned: always
  type: float
  sample: 3.07
max_concurrency_expected:
  description: Requests of O(expected_request_len) tokens the pool holds at once; null without it.
  returned: always
  type: float
  sample: 12.29
fits:
  description: Whether vLLM starts with this configuration and holds its own concurrency.
  returned: always
  type: bool
  sample: true
reasons:
  description: Why it does not fit, each with its numbers; empty when it fits.
  returned: always
  type: list
  elements: str
  sample: ["one max_model_len request does not fit: 131,072 tokens need 20.00 GiB of KV cache per GPU, the pool is 3.36 GiB"]
message:
  description: The verdict and the whole plan in one sentence with the numbers.
  returned: always
  type: str
  sample: "fits: Llama-3.3-70B-Instruct (bfloat16 weights, KV auto) on 4 x 47.99 GiB GPU, TP 4 x PP 1, ..."
vllm_error:
  description: The start-up error text vLLM itself would raise for this pool, or null when it starts.
  returned: always
  type: str
  sample: "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` ..."
plan:
  description: The whole plan, including the keys above.
  returned: always
  type: dict
  contains:
    model:
      description: The profile name or the model's name.
      type: str
      sample: Llama-3.3-70B-Instruct
    attention:
      description: C(mha), C(gqa) or C(mla).
      type: str
      sample: gqa
    kv_pool_bytes:
      description: KV pool of one GPU in bytes.
      type: int
      sample: 8246001254
    estimated_max_model_len:
      description: The longest request one GPU's pool holds (vLLM's estimate in its error).
      type: int
      sample: 100656
    per_gpu:
      description: Per GPU, in bytes - C(total_bytes), C(requested_bytes), C(weight_bytes),
        C(activation_bytes), C(cuda_graph_bytes), C(non_torch_bytes), C(kv_pool_bytes); and
        C(kv_bytes_per_token), C(kv_heads) (null for MLA), C(layers).
      type: dict
      sample: {"weight_bytes": 35276853248, "kv_pool_bytes": 8246001254, "kv_heads": 2, "layers": 80}
    per_node:
      description: For the engine's GPUs together - C(gpus) (O(gpu_count) when given), C(engine_gpus), C(total_bytes),
        C(weight_bytes), C(kv_pool_bytes), C(kv_capacity_tokens).
      type: dict
      sample: {"engine_gpus": 4, "weight_bytes": 141107412992}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.node.plugins.module_utils.serving._kvplan import KV_CACHE_DTYPES, PlanError, plan

#: The plan's keys returned at the top level of the result.
RETURNED_KEYS = (
    "kv_bytes_per_token",
    "kv_bytes_per_token_per_gpu",
    "kv_capacity_tokens",
    "kv_capacity_blocks",
    "max_concurrency",
    "max_concurrency_expected",
    "fits",
    "reasons",
    "message",
    "vllm_error",
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            model=dict(type="raw", required=True),
            gpu_count=dict(type="int"),
            gpu_memory_mib=dict(type="int", required=True),
            tensor_parallel_size=dict(type="int", default=1),
            pipeline_parallel_size=dict(type="int", default=1),
            gpu_memory_utilization=dict(type="float", default=0.92),
            kv_cache_memory_bytes=dict(type="int"),
            kv_cache_dtype=dict(type="str", default="auto", choices=list(KV_CACHE_DTYPES)),
            dtype=dict(type="str", default="auto", choices=["auto", "bfloat16", "float16", "half", "float32"]),
            max_model_len=dict(type="int"),
            max_num_seqs=dict(type="int"),
            max_num_batched_tokens=dict(type="int", no_log=False),
            block_size=dict(type="int", default=16),
            expected_request_len=dict(type="int"),
            oversubscription_factor=dict(type="float", default=1.0),
            enforce_eager=dict(type="bool", default=False),
            activation_bytes=dict(type="int"),
            cuda_graph_bytes=dict(type="int"),
            non_torch_bytes=dict(type="int"),
        ),
        supports_check_mode=True,
    )
    params = dict(module.params)
    try:
        result = plan(**params)
    except PlanError as exc:
        module.fail_json(msg="vllm_memory_plan: %s" % exc)
    module.exit_json(changed=False, plan=result, **{key: result[key] for key in RETURNED_KEYS})


if __name__ == "__main__":
    main()
