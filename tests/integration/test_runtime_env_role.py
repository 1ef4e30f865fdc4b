# SPDX-License-Identifier: GPL-3.0-or-later
"""The gpu_runtime_env role through ansible-playbook (-c local) on lab machines: facts from the
lab's nvidia-smi and pcie_acs_info decide the NCCL variables; the env file parses; the drop-ins
make a unit read it (systemd-analyze verify); user values win; idempotent."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.parsers import parse_env_file
from tests.harness.playbook import run_playbook

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "tests" / "integration" / "playbooks" / "runtime_env_role.yml"


def play(node, ansible_env, tmp_path, *args, **extra_vars):
    env = dict(ansible_env, GPUFLEET_LAB_ROOT=str(node.root))
    env["PATH"] = "%s:%s" % (REPO / "lab" / "bin", env["PATH"])
    extra = {
        "ansible_python_interpreter": sys.executable,
        "gpu_runtime_env_file": str(tmp_path / "etc/gpufleet/gpu-runtime.env"),
        "gpu_runtime_env_systemd_dir": str(tmp_path / "etc/systemd/system"),
        "gpu_runtime_env_systemd_reload": False,
    }
    extra.update(extra_vars)
    return run_playbook(PLAYBOOK, *args, local=True, extra_vars=extra, env=env, timeout=300)


def changed(proc):
    return proc.host("localhost")["changed"]


def env_file(tmp_path):
    return parse_env_file((tmp_path / "etc/gpufleet/gpu-runtime.env").read_text())


def test_seed000_node_with_its_connectx(lab_node, ansible_env, tmp_path):
    node = lab_node("l40s-4x-switch")
    proc = play(node, ansible_env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env = env_file(tmp_path)
    # GPU pairs are PIX (same switch) and PHB (switches under the same host bridge); a ConnectX NIC
    # is there, so InfiniBand/RoCE stays on; nothing debug-only.
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "NCCL_P2P_LEVEL": "PHB"}
    text = (tmp_path / "etc/gpufleet/gpu-runtime.env").read_text()
    assert text.startswith("#\n# Ansible managed")
    for unit in ("vllm.service", "gpufleet-nccl-gate.service"):
        dropin = tmp_path / "etc/systemd/system" / (unit + ".d") / "10-gpu-runtime-env.conf"
        assert "EnvironmentFile=-%s" % (tmp_path / "etc/gpufleet/gpu-runtime.env") in dropin.read_text()
    again = play(node, ansible_env, tmp_path)
    assert changed(again) == 0, again.stdout


def test_nvlink_node_without_nic_facts_and_user_values(lab_node, ansible_env, tmp_path):
    node = lab_node("h100-sxm-8x")
    proc = play(
        node,
        ansible_env,
        tmp_path,
        runtime_env_use_nics=False,
        gpu_runtime_env_rdma="false",
        gpu_runtime_env_nccl_debug="warn",
        gpu_runtime_env_extra={"NCCL_SOCKET_IFNAME": "eth0", "PYTORCH_CUDA_ALLOC_CONF": None},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert env_file(tmp_path) == {
        "NCCL_P2P_LEVEL": "NVL",
        "NCCL_IB_DISABLE": "1",
        "NCCL_DEBUG": "WARN",
        "NCCL_SOCKET_IFNAME": "eth0",
    }


def test_user_allocator_options_are_kept_with_a_warning(lab_node, ansible_env, tmp_path):
    node = lab_node("l40s-4x-switch")
    proc = play(
        node,
        ansible_env,
        tmp_path,
        gpu_runtime_env_extra={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:512"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert env_file(tmp_path)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True,max_split_size_mb:512"
    assert "max_split_size_mb:512 do not survive vLLM" in " ".join(proc.stdout.split())


def test_a_unit_reads_the_env_file_through_the_dropin(lab_node, ansible_env, tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    node = lab_node("l40s-4x-switch")
    assert play(node, ansible_env, tmp_path).returncode == 0
    units = tmp_path / "etc/systemd/system"
    binary = tmp_path / "serve"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    (units / "vllm.service").write_text("[Service]\nExecStart=%s\n" % binary)
    env = dict(os.environ, SYSTEMD_UNIT_PATH="%s:" % units)
    res = subprocess.run(
        ["systemd-analyze", "verify", str(units / "vllm.service")], capture_output=True, text=True, env=env
    )
    assert res.returncode == 0 and res.stdout + res.stderr == "", res.stdout + res.stderr
    dropin = (units / "vllm.service.d" / "10-gpu-runtime-env.conf").read_text()
    assert dropin.splitlines()[-2:] == [
        "[Service]",
        "EnvironmentFile=-%s" % (tmp_path / "etc/gpufleet/gpu-runtime.env"),
    ]


def test_a_value_no_env_file_can_carry_fails_the_host(lab_node, ansible_env, tmp_path):
    node = lab_node("l40s-4x-switch")
    proc = play(node, ansible_env, tmp_path, gpu_runtime_env_extra={"NCCL_SOCKET_IFNAME": 'eth0 "quoted"'})
    assert proc.returncode == 2
    assert "cannot be written to an env file" in proc.stdout
    assert not (tmp_path / "etc/gpufleet/gpu-runtime.env").exists()
