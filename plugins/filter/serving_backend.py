# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The serving roles' own plans of a host, and the serving backend it runs (``gpufleet_serving_backend: auto|vllm|llamacpp``)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.module_utils.serving import _backend


def vllm_plan(model, gpu, gpu_count, **kwargs):
    """Role vllm_server's plan (``tasks_from: plan``): ``{'serve': vllm_serve_config's result or None,
    'error': the planner's refusal or None}`` (see module_utils/serving/_backend.py)."""
    return _backend.vllm_plan(model, gpu, gpu_count, **kwargs)


def llamacpp_plan(gpu_memory_mib, ctx_size, parallel, cache_type="f16", flash_attn=False, ubatch_size=512, **kwargs):
    """Role llamacpp_server's layer-offload plan (``tasks_from: plan``): ``{'plan': the planner's
    result with its server_args or None, 'error': the refusal or None, 'here': bool}``; ``kwargs``:
    the model (``model_path``, or ``model`` and ``quant``), ``n_gpu_layers`` and the reserves."""
    line = {"cache_type": cache_type, "flash_attn": flash_attn, "ubatch_size": ubatch_size}
    try:
        return _backend.llamacpp_plan(gpu_memory_mib, ctx_size, parallel, **dict(kwargs, **line))
    except TypeError as exc:
        raise AnsibleFilterError("llamacpp_plan: %s" % exc) from None


def serving_backend(requested, gpu_memory_mib, model="", vllm=None, llamacpp=None, recorded=None):
    """``{'backend', 'requested', 'reason', 'plans'}`` for this host (see module_utils/serving/_backend.py).

    ``vllm``: role vllm_server's plan of this host (``vllm_plan``), ``llamacpp``: role
    llamacpp_server's (``llamacpp_plan``), judged only where ``auto`` needs them.
    ``recorded``: the verdicts of an earlier run, used instead."""
    try:
        return _backend.choose_planned(
            requested, gpu_memory_mib, model=model, vllm=vllm, llamacpp=llamacpp, recorded=recorded
        )
    except _backend.BackendError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self):
        return {"serving_backend": serving_backend, "vllm_plan": vllm_plan, "llamacpp_plan": llamacpp_plan}
