# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The GPU services' runtime environment (NCCL and allocator variables) for the gpu_runtime_env role."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _env


def gpu_runtime_env(
    topology, nics=None, rdma="auto", nccl_debug=None, user_env=None, alloc_conf="expandable_segments:True"
):
    """Derive the GPU services' env from ``gpu_topology`` facts; returns ``{'env', 'why', 'warnings'}``."""
    try:
        return _env.runtime_env(
            topology=topology or {},
            nics=nics,
            rdma=rdma,
            nccl_debug=nccl_debug,
            user_env=user_env,
            alloc_conf=alloc_conf,
        )
    except _env.EnvError as exc:
        raise AnsibleFilterError("gpu_runtime_env: %s" % exc) from exc


class FilterModule:
    def filters(self):
        return {"gpu_runtime_env": gpu_runtime_env}
