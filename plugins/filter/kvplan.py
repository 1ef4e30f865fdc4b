# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters for the serving roles: the KV-cache planner, the vLLM config and its plan (the GPU runtime env: ncclenv.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.module_utils.serving import _kvplan, _vllm


def kv_plan(args):
    """``{{ {'model': 'Llama-3.1-8B-Instruct', 'gpu_memory_mib': 46068} | gpufleet.node.kv_plan }}``"""
    try:
        return _kvplan.plan(**dict(args))
    except (_kvplan.PlanError, TypeError) as exc:
        raise AnsibleFilterError("kv_plan: %s" % exc) from None


def vllm_serve_config(model, gpu, gpu_count, overrides=None, **kwargs):
    """The ``vllm serve --config`` dict of a model on a hardware profile, and its KV-cache plan.

    The plan is computed once, here, by the same ``_kvplan.plan()`` the module ``vllm_memory_plan``
    runs. Returns ``{'config': {...}, 'plan': {...}, 'plan_args': {...}, 'expected_request_len': N,
    'hardware': ..., 'model': ...}``; refused settings and bad numbers raise, naming the setting.
    """
    try:
        return _vllm.serve_config(model, gpu, gpu_count, overrides=overrides, **kwargs)
    except (_vllm.ServingError, _kvplan.PlanError) as exc:
        raise AnsibleFilterError("vllm_serve_config: %s" % exc) from None


def vllm_removed_settings(config):
    """Messages naming each setting vLLM 0.33.0 removed and what replaced it (empty list when none)."""
    return _vllm.removed_settings(config or {})


def vllm_stop_timeout(shutdown_timeout, margin=60):
    """systemd TimeoutStopSec above vLLM's drain window and its worker shutdown window."""
    return _vllm.stop_timeout(shutdown_timeout, margin)


class FilterModule:
    def filters(self):
        return {
            "kv_plan": kv_plan,
            "vllm_serve_config": vllm_serve_config,
            "vllm_removed_settings": vllm_removed_settings,
            "vllm_stop_timeout": vllm_stop_timeout,
        }
