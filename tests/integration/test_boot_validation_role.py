# SPDX-License-Identifier: GPL-3.0-or-later
"""Role boot_validation through ansible-playbook on a test tree: what the node's own run is given
(the roles' declared variables; secrets never written nor printed, read on the node from its own
files, vaulted ones too; one-run switches and the central balancer left out), the unit,
idempotence, and the refusal when the node cannot run the operator's ansible-playbook itself. The
runtime the role installs (venv from a wheelhouse, the controller's collection) is exercised by the
lab's fleet (tests/fleet/test_fleet_3_reboot.py)."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
from pathlib import Path

import yaml

from tests.harness.inventory import Unsafe, node_inventory, node_inventory_vars
from tests.harness.playbook import run_playbook

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
    assert result["stats"]["localhost"]["changed"] == 1  # one files task: directories, inventory, ansible.cfg, unit

    vdir = root / "etc/gpufleet/validate"
    assert stat.S_IMODE(vdir.stat().st_mode) == 0o700
    inventory = vdir / "inventory.yml"
    assert stat.S_IMODE(inventory.stat().st_mode) == 0o600
    hosts, _ = node_inventory(inventory.read_text())
    assert isinstance(hosts["localhost"], Unsafe), "the host's variables are not tagged !unsafe"
    node = node_inventory_vars(inventory.read_text(), "localhost")
    assert node == {
        "ansible_connection": "local",
        "ansible_python_interpreter": node["ansible_python_interpreter"],
        "gpu_topology_expect": {"gpu_count": 4},
        "lb_registration_balancer": "",
        "nccl_gate_min_busbw_gbps": 20,
        # read at boot from the node's 0600 secrets file, never written here
        "vllm_server_api_key": "{{ vllm_server_secrets_file | gpufleet.node.boot_validation_env_file_value('VLLM_API_KEY') }}",
        "vllm_server_model": "Llama-3.3-70B-Instruct-FP8",
    }
    assert SECRET not in inventory.read_text()
    cfg = (vdir / "ansible.cfg").read_text()
    assert f"inventory = {inventory}\n" in cfg and f"collections_path = {REPO / '.collections'}\n" in cfg
    # the operator's own ansible-playbook may lack Mitogen: the stock strategy
    assert "\nstrategy = linear\n" in cfg and "strategy_plugins" not in cfg
    assert "\ncallbacks_enabled = gpufleet.node.mitogen_prefork\n" in cfg

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


def _tasks(result):
    """{task name: localhost's result} of the role's tasks, in order (skipped ones too)."""
    return {
        t["task"]["name"].split(" : ")[-1]: t["hosts"]["localhost"]
        for p in result["plays"]
        for t in p["tasks"]
        if "localhost" in t["hosts"] and t["task"]["name"] != "Gathering Facts"
    }


def test_a_current_runtime_costs_one_read_and_a_stale_one_is_drift(ansible_env, tmp_path):
    """The runtime the role installs (venv, collection): on a node whose record of it equals what
    the controller would install, one read and no install (no build, no copy); a stale record is
    drift in check mode (the copy and the record reported, nothing written). The install itself
    (pip, ansible-galaxy) is the lab's: tests/fleet/test_fleet_3_reboot.py boots on it."""
    from ansible_collections.gpufleet.node.plugins.filter.boot_validation import boot_validation_runtime
    from tests.unit.test_boot_validation import _tarball

    root = tmp_path / "root"
    opt = root / "opt/gpufleet"
    (opt / "venv").mkdir(parents=True)
    tarball = _tarball(tmp_path / "gpufleet-node-0.1.0.tar.gz", {"roles/r/tasks/main.yml": "a"})
    runtime = boot_validation_runtime(str(REPO / "roles/boot_validation/files/requirements-node.txt"), "", tarball)
    record = opt / "venv/.gpufleet-runtime.json"
    record.write_text(json.dumps(runtime, sort_keys=True) + "\n")
    installed = {
        "boot_validation_ansible_playbook": "",
        "boot_validation_collections_path": "",
        "boot_validation_runtime_dir": str(opt),
        "boot_validation_venv": str(opt / "venv"),
        "boot_validation_collection_tarball": tarball,
    }
    rc, result = play(ansible_env, root, "", **installed, **NODE_VARS)
    assert rc == 0, result
    tasks = _tasks(result)
    assert len(tasks) <= 6, list(tasks)  # the argument spec, the read, the skipped include, files, unit
    assert tasks["Read the record of the runtime the node has"].get("skipped") is not True
    assert all(not name.startswith(("Build", "Copy", "Install ansible-core")) for name in tasks), list(tasks)
    assert result["stats"]["localhost"]["changed"] == 1  # the node-local files, written the first time

    # the controller's collection changed: the node's record is stale, check mode reports it
    record.write_text(json.dumps(dict(runtime, collection="0" * 64), sort_keys=True) + "\n")
    before = record.read_text()
    rc, result = play(ansible_env, root, "", "--check", "--diff", **installed, **NODE_VARS)
    assert rc == 0, result
    changed = {name for name, host in _tasks(result).items() if host.get("changed")}
    assert {"Copy the built collection", "Record the runtime the node has"} <= changed, changed
    assert "Install ansible-core and the modules' packages into the venv" not in changed  # the venv is current
    assert record.read_text() == before and not (opt / "gpufleet-node.tar.gz").exists()


def test_refuses_a_node_without_a_python_for_its_own_run_before_changing_anything(ansible_env, tmp_path):
    """The venv to install and the node's Python too old for ansible-core 2.19 (a stand-in that
    answers the probe as Ubuntu 22.04's python3.10 does): the role fails the node with the rule's
    message (what site.yml's rescue prints as the reason it is out of the pool) before building,
    copying or writing anything."""
    from tests.unit.test_boot_validation import _tarball

    old = tmp_path / "bin" / "python3.10"
    old.parent.mkdir()
    old.write_text('#!/bin/sh\necho \'{"version": [3, 10, 12], "venv": false}\'\n')
    old.chmod(0o755)
    root = tmp_path / "root"
    opt = root / "opt/gpufleet"
    tarball = _tarball(tmp_path / "gpufleet-node-0.1.0.tar.gz", {"roles/r/tasks/main.yml": "a"})
    rc, result = play(
        ansible_env,
        root,
        "",
        boot_validation_collections_path="",
        boot_validation_runtime_dir=str(opt),
        boot_validation_venv=str(opt / "venv"),
        boot_validation_collection_tarball=tarball,
        boot_validation_venv_python=str(old),
        **NODE_VARS,
    )
    assert rc != 0
    failed = {n: h for n, h in _tasks(result).items() if h.get("failed")}
    assert list(failed) == ["Refuse a node without a Python for its own run"], failed
    msg = failed["Refuse a node without a Python for its own run"]["msg"]
    assert msg.startswith("localhost cannot run its own boot validation: ")
    assert f"boot_validation_venv_python={old} is Python 3.10.12; the node's run needs Python 3.11-3.13" in msg
    assert "gpufleet_boot_validation=false" in msg
    assert not root.exists(), "nothing may be written"


HF_TOKEN = "hf_boot-validation-9876543210"
VAULT_PASSWORD = "boot-validation-test-password"


def _vaulted(name, value):
    """`name: !vault |` and its ciphertext (ansible-vault's Python API), as inventory lines."""
    from ansible.parsing.vault import VaultLib, VaultSecret

    text = VaultLib([("default", VaultSecret(VAULT_PASSWORD.encode()))]).encrypt(value).decode()
    assert value not in text
    return [f"{name}: !vault |"] + [f"  {line}" for line in text.splitlines()]


def test_keeps_vaulted_secrets_on_the_controller_and_the_node_reads_its_own(ansible_env, tmp_path):
    """Vaulted vllm_server_api_key and vllm_server_hf_token in the inventory: never in the node's
    inventory nor in the -vvv --diff output; the node's own run (the node-local ansible.cfg and
    inventory, the collection's filter) reads the API key from the node's secrets file, and gets no
    HF token. The runtime the role installs (venv from the wheelhouse, the collection built from
    this tree) is the lab's business: tests/fleet/test_fleet_3_reboot.py boots on it; here the
    operator's own runtime skips the install."""
    root = tmp_path / "root"
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "localhost:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        "      ansible_python_interpreter: /usr/bin/python3\n"
        "      vllm_server_model: Llama-3.3-70B-Instruct-FP8\n"
        f"      vllm_server_secrets_file: {root}/etc/vllm/secrets.env\n"
        + "".join(
            f"      {line}\n"
            for name, value in (("vllm_server_api_key", SECRET), ("vllm_server_hf_token", HF_TOKEN))
            for line in _vaulted(name, value)
        )
    )
    playbook_bin = REPO / ".venv/bin/ansible-playbook"
    extra = {
        "root": str(root),
        "boot_validation_ansible_playbook": str(playbook_bin),
        "boot_validation_collections_path": str(REPO / ".collections"),
    }
    run = run_playbook(
        PLAYBOOK, "-vvv", "--diff",
        inventory=inventory, extra_vars=extra, env=ansible_env, merge_stderr=True, vault_password=VAULT_PASSWORD,
    )  # fmt: skip
    assert run.rc == 0 and run.recap["localhost"]["failed"] == 0, run.explain()
    assert "+++ after" in run.output, "no --diff of the node's inventory"
    for secret in (SECRET, HF_TOKEN):
        assert secret not in run.output, "a secret was printed"
    vdir = root / "etc/gpufleet/validate"
    node_inventory_text = (vdir / "inventory.yml").read_text()
    for leaked in (SECRET, HF_TOKEN, "$ANSIBLE_VAULT", "vllm_server_hf_token"):
        assert leaked not in node_inventory_text, leaked
    assert f"collections_path = {REPO / '.collections'}\n" in (vdir / "ansible.cfg").read_text()

    # The node's own run, as the unit starts it (no vault password there): the node-local
    # ansible.cfg and inventory, the collection's filter reading the node's secrets file.
    secrets = root / "etc/vllm/secrets.env"
    secrets.parent.mkdir(parents=True)
    secrets.write_text(f"HF_TOKEN={HF_TOKEN}\nVLLM_API_KEY={SECRET}\n")
    check = tmp_path / "check.yml"
    check.write_text(
        "- hosts: gpu_nodes\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.assert:\n        that: vllm_server_api_key == lookup('env', 'EXPECTED')\n"
        "        quiet: true\n"
        "    - ansible.builtin.assert:\n        that: vllm_server_hf_token is not defined\n        quiet: true\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ANSIBLE_CONFIG": str(vdir / "ansible.cfg")}
    node_run = subprocess.run(
        [str(playbook_bin), str(check)],
        env=dict(env, EXPECTED=SECRET),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert node_run.returncode == 0, node_run.stdout + node_run.stderr
    assert SECRET not in node_run.stdout + node_run.stderr

    # A vaulted value of a declared variable: refused by its name, the node inventory unchanged
    # (the node's run has no vault password: it would fail at every boot).
    inventory.write_text(
        inventory.read_text() + "".join(f"      {line}\n" for line in _vaulted("gpufleet_kernel_log_path", SECRET))
    )
    run = run_playbook(
        PLAYBOOK,
        inventory=inventory, extra_vars=extra, env=ansible_env, merge_stderr=True, vault_password=VAULT_PASSWORD,
    )  # fmt: skip
    assert run.rc != 0 and "gpufleet_kernel_log_path is vaulted" in run.output, run.explain()
    assert SECRET not in run.output
    assert (vdir / "inventory.yml").read_text() == node_inventory_text


def _payload(marker, n):
    """Template syntax that, rendered by Ansible, creates ``marker``-n (a command run as the
    node's root would): every field the node inventory carries gets one of these."""
    return "{{ lookup('pipe', 'touch %s-%d') }}{%% if true %%}{# x #}{%% endif %%}" % (marker, n)


def test_data_from_outside_never_runs_as_a_template_on_the_node(ansible_env, tmp_path):
    """Data never becomes code: a downloaded GGUF model whose header's general.name is template
    syntax reaches gpufleet_serving's reason through the real backend choice (vLLM does not fit one
    L40S, llama.cpp's plan of the GGUF does), and template syntax sits in every other kind of
    exported field (a nested key, a list item, a string setting, boot_validation_extra_vars; given
    to the controller as data, as command output and HTTP answers are). The node's own run, with
    the node-local ansible.cfg and inventory, renders every variable: each comes back as the
    literal text, and no payload ran, on the controller or on the node."""
    from ansible_collections.gpufleet.node.plugins.filter.boot_validation import _Data, _NodeInventoryDumper
    from ansible_collections.gpufleet.node.plugins.module_utils.serving import _model_profiles
    from lab import hwmodel as hw
    from tests.unit.test_llamaplan import write_gguf_header

    marker = tmp_path / "ran"
    name = "Llama 3.3 70B " + _payload(marker, 0)
    gguf = write_gguf_header(
        tmp_path / "model-Q4_K_M.gguf", name, _model_profiles.MODEL_PROFILES["Llama-3.3-70B-Instruct"], True
    )
    node = hw.build("l40s-4x-switch", tmp_path / "lab")
    root = tmp_path / "root"
    unsafe = {
        "gpu_topology_expect": {"gpu_count": 4, _payload(marker, 1): [_payload(marker, 2), 3]},
        "gpufleet_kernel_log_path": _payload(marker, 3),
        "boot_validation_extra_vars": {"gpufleet_note": _payload(marker, 4)},
    }
    host = {  # all of it data (!unsafe) on the controller too, as a module's output is
        "ansible_connection": "local",
        "ansible_python_interpreter": "/usr/bin/python3",
        "lab_root": str(node.root),
        "root": str(root),
        "vllm_server_model": "Llama-3.3-70B-Instruct-FP8",
        "vllm_server_gpu_count": 1,
        "llamacpp_server_model_src": str(gguf),
        "llamacpp_server_gpu_memory_mib": [46068],
    }
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.dump({"all": {"hosts": {"localhost": _Data(host, **unsafe)}}}, Dumper=_NodeInventoryDumper)
    )
    playbook_bin = REPO / ".venv/bin/ansible-playbook"
    run = run_playbook(
        REPO / "tests/integration/playbooks/boot_validation_data.yml",
        inventory=inventory,
        extra_vars={"repo": str(REPO), "boot_validation_ansible_playbook": str(playbook_bin)},
        env=ansible_env,
    )
    assert run.rc == 0, run.explain()
    assert not list(tmp_path.glob("ran-*")), "a payload ran on the controller"

    text = (root / "etc/gpufleet/validate/inventory.yml").read_text()
    hosts, group_vars = node_inventory(text)
    exported = hosts["localhost"]
    # the host's variables are data (one !unsafe mapping); the only template is the collection's
    # own read of the API key on the node, a group variable
    assert isinstance(exported, Unsafe), "the host's variables are not tagged !unsafe"
    assert group_vars == {
        "vllm_server_api_key": "{{ vllm_server_secrets_file | gpufleet.node.boot_validation_env_file_value('VLLM_API_KEY') }}"
    }
    assert "layer-offload plan fits (" + name in exported["gpufleet_serving"]["reason"], exported["gpufleet_serving"]
    assert exported["gpufleet_note"] == _payload(marker, 4)
    assert exported["gpufleet_kernel_log_path"] == _payload(marker, 3)
    assert exported["gpu_topology_expect"] == {"gpu_count": 4, _payload(marker, 1): [_payload(marker, 2), 3]}

    # The node's own run, as its unit starts it: every exported variable rendered, each the literal.
    expected = tmp_path / "expected.json"
    expected.write_text(json.dumps(exported))
    check = tmp_path / "check.yml"
    check.write_text(
        "- hosts: gpu_nodes\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.assert:\n"
        "        that: lookup('vars', item) | to_json(sort_keys=true)\n"
        "              == (lookup('file', expected) | from_json)[item] | to_json(sort_keys=true)\n"
        "        quiet: true\n"
        "      loop: %s\n" % json.dumps(sorted(exported))
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "ANSIBLE_CONFIG": str(root / "etc/gpufleet/validate/ansible.cfg"),
    }
    node_run = subprocess.run(
        [str(playbook_bin), str(check), "-e", "expected=%s" % expected],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert node_run.returncode == 0, node_run.stdout + node_run.stderr
    assert "ok=1" in node_run.stdout, node_run.stdout
    assert not list(tmp_path.glob("ran-*")), "a payload ran in the node's own run"
