# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters for the serving roles: the KV-cache planner, the vLLM config, the GPU runtime env."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.module_utils import _kvplan, _vllm


def kv_plan(args):
    """``{{ {'model': 'Llama-3.1-8B-Instruct', 'gpu_memory_mib': 46068} | gpufleet.node.kv_plan }}``"""
    try:
        return _kvplan.plan(**dict(args))
    except (_kvplan.PlanError, TypeError) as exc:
        raise AnsibleFilterError('kv_plan: %s' % exc)


def vllm_serve_config(model, gpu, gpu_count, overrides=None, **kwargs):
    """Build the ``vllm serve --config`` dict and planner arguments for a model on a hardware profile.

    Returns ``{'config': {...}, 'plan_args': {...}, 'expected_request_len': N, 'hardware': ..., 'model': ...}``.
    """
    try:
        return _vllm.serve_config(model, gpu, gpu_count, overrides=overrides, **kwargs)
    except (_vllm.ServingError, _kvplan.PlanError) as exc:
        raise AnsibleFilterError('vllm_serve_config: %s' % exc)


def vllm_removed_settings(config):
    """Messages naming each setting vLLM 0.33.0 removed and what replaced it (empty list when none)."""
    return _vllm.removed_settings(config or {})


def gpu_runtime_env(topology, nics=None, rdma='auto', nccl_debug=None, user_env=None,
                    alloc_conf='expandable_segments:True'):
    """Derive the GPU services' env from ``gpu_topology`` facts; returns ``{'env', 'why', 'warnings'}``."""
    try:
        return _vllm.runtime_env(topology=topology or {}, nics=nics, rdma=rdma, nccl_debug=nccl_debug,
                                 user_env=user_env, alloc_conf=alloc_conf)
    except _vllm.ServingError as exc:
        raise AnsibleFilterError('gpu_runtime_env: %s' % exc)


def vllm_stop_timeout(shutdown_timeout, margin=60):
    """systemd TimeoutStopSec above vLLM's drain window and its worker shutdown window."""
    return _vllm.stop_timeout(shutdown_timeout, margin)


class FilterModule(object):
    def filters(self):
        return {
            'kv_plan': kv_plan,
            'vllm_serve_config': vllm_serve_config,
            'vllm_removed_settings': vllm_removed_settings,
            'gpu_runtime_env': gpu_runtime_env,
            'vllm_stop_timeout': vllm_stop_timeout,
        }
