# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab's stand-ins (lab/standins/nvml/pynvml.py, the nvidia-smi stand-in) give a healthy node's health
facts whole: every fact read, every NVLink read, on both backends of health/_collect."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.health import _checks, _collect
from lab.standins import nvidia_smi as smi
from tests.harness import REPO

OPTIONS = {"fabric_manager_state": "active"}


def load_stub():
    name = "gpufleet_lab_pynvml"
    spec = importlib.util.spec_from_file_location(name, REPO / "lab" / "standins" / "nvml" / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def in_process(argv):
    assert argv[0] == "nvidia-smi"
    return smi.run(argv[1:])


@pytest.mark.parametrize("profile", ["h100-sxm-8x", "l40s-4x-switch"])
def test_healthy_lab_node_is_read_whole_by_both_backends(lab_node, monkeypatch, profile):
    node = lab_node(profile)
    monkeypatch.setenv("GPUFLEET_LAB_ROOT", str(node.root))
    records = {
        "nvml": _collect.collect_nvml(load_stub()),
        "nvidia_smi": _collect.collect_nvidia_smi(in_process, "nvidia-smi"),
    }
    for backend, record in records.items():
        assert len(record["gpus"]) == len(node.gpus), backend
        assert all(g["unreadable"] == [] and g["unsupported"] == [] for g in record["gpus"]), backend
        checks = {c["name"]: c for c in _checks.run_checks(record, [], [], {"gpus": {}, "bridges": {}}, OPTIONS)}
        assert checks["readable"]["status"] == "pass", (backend, checks["readable"])
        assert checks["nvlink"]["status"] == "pass", (backend, checks["nvlink"])
        assert all(g["nvlinks"] for g in record["gpus"]) is profile.startswith("h100"), backend
