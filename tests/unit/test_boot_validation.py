# SPDX-License-Identifier: GPL-3.0-or-later
"""The variables a node's own boot validation is given (filter boot_validation_vars)."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.filter.boot_validation import boot_validation_vars


def test_node_vars_by_prefix_without_results_private_names_or_exclusions():
    host = {
        "vllm_server_model": "Llama-3.3-70B-Instruct-FP8",
        "nccl_gate_min_busbw_gbps": 20,
        "nccl_gate_force": True,
        "lb_registration_balancer": "lb1",
        "ansible_host": "10.0.0.2",
        "pcie_p2p_acs": {"changed": False, "ports": []},
        "pcie_p2p_audit": {"failed": False},
        "__nccl_gate_boot_id": "x",
        "gpu_topology_expect": {"gpu_count": 4},
        "other": 1,
        "gpufleet_acceptance_load_test": True,
        "gpufleet_acceptance_duration": 3,
        "gpufleet_sysfs_path": "/sys/bus/pci",
    }
    out = boot_validation_vars(
        host,
        ["vllm_server_", "nccl_gate_", "lb_registration_", "pcie_p2p_", "gpu_topology_", "gpufleet_"],
        ["nccl_gate_force", "lb_registration_balancer", "gpufleet_acceptance_.*"],
        {"ansible_connection": "local", "lb_registration_balancer": ""},
    )
    assert out == {
        "ansible_connection": "local",
        "gpu_topology_expect": {"gpu_count": 4},
        "gpufleet_sysfs_path": "/sys/bus/pci",
        "lb_registration_balancer": "",
        "nccl_gate_min_busbw_gbps": 20,
        "vllm_server_model": "Llama-3.3-70B-Instruct-FP8",
    }
    assert list(out) == sorted(out)


def test_bad_prefixes_are_refused():
    with pytest.raises(AnsibleFilterError, match="prefixes must be a list"):
        boot_validation_vars({}, "vllm_server_")
    with pytest.raises(AnsibleFilterError, match="prefixes must be a list"):
        boot_validation_vars({}, [""])


def test_a_bad_exclude_pattern_is_refused():
    with pytest.raises(AnsibleFilterError, match="exclude pattern is not a regular expression"):
        boot_validation_vars({"vllm_server_model": "m"}, ["vllm_server_"], ["vllm_server_("])
