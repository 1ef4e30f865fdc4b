# SPDX-License-Identifier: GPL-3.0-or-later
"""Role boot_validation through ansible-playbook on a test tree: what the node's own run is given
(by prefix, secrets 0600 and never printed, one-run switches and the central balancer left out),
the unit, idempotence, and the refusal when the node cannot run ansible-playbook itself."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import yaml

from tests.support import run_playbook

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "tests/integration/playbooks/boot_validation_role.yml"
SECRET = "sk-boot-validation-0123456789"


def play(ansible_env, root, playbook_bin, *extra, **extra_vars):
    extra_vars = {
        "root": str(root),
        "boot_validation_ansible_playbook": str(playbook_bin),
        "boot_validation_collections_path": str(REPO / ".collections"),
        **extra_vars,
    }
    run = run_playbook(PLAYBOOK, *extra, extra_vars=extra_vars, env=ansible_env, json_callback=True)
    assert SECRET not in run.output, "a secret was printed"
    return run.returncode, run.json


def fake_ansible_playbook(tmp_path):
    path = tmp_path / "venv" / "bin" / "ansible-playbook"
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


NODE_VARS = {
    "vllm_server_model": "Llama-3.3-70B-Instruct-FP8",
    "vllm_server_api_key": SECRET,
    "nccl_gate_min_busbw_gbps": 20,
    "gpu_topology_expect": {"gpu_count": 4},
    "nccl_gate_force": True,
    "lb_registration_balancer": "lb1",
    "lb_registration_socket": "/run/haproxy/admin.sock",
    "unrelated": "x",
    "gpufleet_acceptance_duration": 3,
}


def test_installs_a_node_local_run_idempotently(ansible_env, tmp_path):
    root = tmp_path / "root"
    bin_ = fake_ansible_playbook(tmp_path)
    rc, result = play(ansible_env, root, bin_, **NODE_VARS)
    assert rc == 0, result
    assert result["stats"]["localhost"]["changed"] == 3  # directories, inventory + ansible.cfg, unit

    vdir = root / "etc/gpufleet/validate"
    assert stat.S_IMODE(vdir.stat().st_mode) == 0o700
    inventory = vdir / "inventory.yml"
    assert stat.S_IMODE(inventory.stat().st_mode) == 0o600
    node = yaml.safe_load(inventory.read_text())["all"]["children"]["gpu_nodes"]["hosts"]["localhost"]
    assert node == {
        "ansible_connection": "local",
        "ansible_python_interpreter": node["ansible_python_interpreter"],
        "gpu_topology_expect": {"gpu_count": 4},
        "lb_registration_balancer": "",
        "nccl_gate_min_busbw_gbps": 20,
        "vllm_server_api_key": SECRET,
        "vllm_server_model": "Llama-3.3-70B-Instruct-FP8",
    }
    cfg = (vdir / "ansible.cfg").read_text()
    assert f"inventory = {inventory}\n" in cfg and f"collections_path = {REPO / '.collections'}\n" in cfg

    unit = (root / "etc/systemd/system/gpufleet-validate.service").read_text()
    for line in (
        "Type=oneshot",
        "RemainAfterExit=yes",
        f"ExecStart={bin_} gpufleet.node.validate",
        f"Environment=ANSIBLE_CONFIG={vdir}/ansible.cfg",
        "After=network-online.target gpufleet-acs.service",
        "TimeoutStartSec=3600",
        "WantedBy=multi-user.target",
    ):
        assert line + "\n" in unit, line
    if shutil.which("systemd-analyze"):
        verify = subprocess.run(
            ["systemd-analyze", "verify", str(root / "etc/systemd/system/gpufleet-validate.service")],
            capture_output=True,
            text=True,
        )
        assert "gpufleet-validate.service" not in verify.stderr, verify.stderr

    rc, result = play(ansible_env, root, bin_, **NODE_VARS)
    assert rc == 0 and result["stats"]["localhost"]["changed"] == 0

    # a changed setting is drift: check mode reports it and writes nothing
    before = inventory.read_text()
    rc, result = play(ansible_env, root, bin_, "--check", **dict(NODE_VARS, vllm_server_model="Llama-3.1-8B-Instruct"))
    assert rc == 0 and result["stats"]["localhost"]["changed"] == 1
    assert inventory.read_text() == before


def test_refuses_before_writing_when_the_node_cannot_run_ansible(ansible_env, tmp_path):
    root = tmp_path / "root"
    missing = tmp_path / "nowhere" / "ansible-playbook"
    rc, result = play(ansible_env, root, missing, **NODE_VARS)
    assert rc != 0
    msgs = [h["msg"] for p in result["plays"] for t in p["tasks"] for h in t["hosts"].values() if h.get("failed")]
    assert len(msgs) == 1 and f"{missing} does not exist on localhost" in msgs[0], msgs
    assert "gpufleet_boot_validation=false" in msgs[0]
    assert not root.exists(), "nothing may be written"


def test_off_installs_nothing_and_removes_an_earlier_install(ansible_env, tmp_path):
    root = tmp_path / "root"
    rc, result = play(ansible_env, root, tmp_path / "nowhere", gpufleet_boot_validation=False)
    assert rc == 0 and result["stats"]["localhost"]["changed"] == 0 and not root.exists()

    bin_ = fake_ansible_playbook(tmp_path)
    assert play(ansible_env, root, bin_, **NODE_VARS)[0] == 0
    rc, result = play(ansible_env, root, bin_, gpufleet_boot_validation=False)
    assert rc == 0 and result["stats"]["localhost"]["changed"] == 1
    assert not (root / "etc/systemd/system/gpufleet-validate.service").exists()
    assert not (root / "etc/gpufleet/validate").exists()
    rc, result = play(ansible_env, root, bin_, gpufleet_boot_validation=False)
    assert rc == 0 and result["stats"]["localhost"]["changed"] == 0
