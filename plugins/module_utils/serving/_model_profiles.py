# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The shapes of the checkpoints the collection knows: one home, read by the planner and the lab.

Pure data, no imports and no code. Values are each model's ``config.json`` on the Hugging Face
hub; ``num_parameters`` is the parameter count of the checkpoint's safetensors index.

Two readers, on purpose:

- the KV-cache planner (``_kvplan.MODEL_PROFILES``, hence the module ``vllm_memory_plan``, the
  filters ``kv_plan`` / ``vllm_serve_config`` and the role ``vllm_server``) plans with them;
- the lab's vLLM stand-in (``lab/standins/vllm_server.py``) loads THIS FILE by its path, without
  importing the collection, to know which checkpoints the lab "has" and their shape (layers, heads,
  dims, parameters, dtype). The shape of a checkpoint is the fact the stand-in simulates, like the
  hardware model's GPUs; how much memory vLLM reserves, and whether a config fits, the stand-in
  computes its own way, so that it stays an independent check of the planner rather than a copy.

Keep this file literal data (dicts of str/int/bool): the lab executes it by path.
"""

_LLAMA_70B = {
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "num_parameters": 70553706496,
    "torch_dtype": "bfloat16",
}

MODEL_PROFILES = {
    "Llama-3.3-70B-Instruct": dict(_LLAMA_70B, hf_id="meta-llama/Llama-3.3-70B-Instruct"),
    "Llama-3.3-70B-Instruct-FP8": dict(
        _LLAMA_70B, hf_id="RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", quantization="fp8"
    ),
    "Llama-3.1-70B-Instruct": dict(_LLAMA_70B, hf_id="meta-llama/Llama-3.1-70B-Instruct"),
    "Llama-3.1-8B-Instruct": {
        "hf_id": "meta-llama/Llama-3.1-8B-Instruct",
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "num_parameters": 8030261248,
        "torch_dtype": "bfloat16",
    },
    "Qwen2.5-72B-Instruct": {
        "hf_id": "Qwen/Qwen2.5-72B-Instruct",
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_size": 8192,
        "intermediate_size": 29568,
        "vocab_size": 152064,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "num_parameters": 72706203648,
        "torch_dtype": "bfloat16",
    },
    # MLA: the KV cache holds one compressed latent (kv_lora_rank) plus the decoupled RoPE key.
    "DeepSeek-V2-Lite-Chat": {
        "hf_id": "deepseek-ai/DeepSeek-V2-Lite-Chat",
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "head_dim": 192,
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "vocab_size": 102400,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "max_position_embeddings": 163840,
        "tie_word_embeddings": False,
        "num_parameters": 15706484224,
        "torch_dtype": "bfloat16",
    },
}
