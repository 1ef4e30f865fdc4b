# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The serving backend a host runs (``gpufleet_serving_backend: auto|vllm|llamacpp``)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.module_utils import _backend


def serving_backend(requested, gpu_memory_mib, model="", vllm_fits=None, llamacpp_fits=None):
    """``{'backend', 'requested', 'reason'}`` for this host (see module_utils/_backend.py)."""
    try:
        return _backend.choose(requested, gpu_memory_mib, model=model, vllm_fits=vllm_fits, llamacpp_fits=llamacpp_fits)
    except _backend.BackendError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self):
        return {"serving_backend": serving_backend}
