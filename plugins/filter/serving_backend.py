# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The serving backend a host runs (``gpufleet_serving_backend: auto|vllm|llamacpp``)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.module_utils.serving import _backend


def serving_backend(requested, gpu_memory_mib, model="", vllm=None, llamacpp=None, recorded=None):
    """``{'backend', 'requested', 'reason', 'plans'}`` for this host (see module_utils/serving/_backend.py).

    ``vllm``: the vLLM plan's inputs (``model``, ``gpu``, ``gpu_count``, ``overrides``,
    ``expected_request_len``, ``gpu_memory_mib``, ``oversubscription_factor``, ``reserves``);
    ``llamacpp``: ``llamacpp_memory_plan``'s (``model_path`` or ``model``, ``quant``,
    ``gpu_memory_mib``, ``ctx_size``, ``parallel``, ...); both planned here, on the controller, and
    only where ``auto`` needs them. ``recorded``: the verdicts of an earlier run, used instead."""
    try:
        return _backend.choose_planned(
            requested, gpu_memory_mib, model=model, vllm=vllm, llamacpp=llamacpp, recorded=recorded
        )
    except _backend.BackendError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self):
        return {"serving_backend": serving_backend}
