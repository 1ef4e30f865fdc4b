# SPDX-License-Identifier: GPL-3.0-or-later
"""What a node's own boot validation is given: the roles' declared contract (meta/node_run.yml),
secrets read on the node, and the digest that decides when the node's collection is reinstalled."""

from __future__ import annotations

import base64
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.filter.boot_validation import (
    boot_validation_collection_digest,
    boot_validation_contract,
    boot_validation_declarations,
    boot_validation_env_file_value,
    boot_validation_inventory,
    boot_validation_runtime,
    boot_validation_secret_names,
    boot_validation_stale,
    boot_validation_vars,
)

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"


def _contract():
    return boot_validation_contract(boot_validation_declarations(str(ROLES)))


def test_every_role_declares_its_contract_next_to_its_argument_spec():
    for role in sorted(p.name for p in ROLES.iterdir() if (p / "meta/argument_specs.yml").exists()):
        assert (ROLES / role / "meta/node_run.yml").exists(), role
        decl = yaml.safe_load((ROLES / role / "meta/node_run.yml").read_text())["node_run"]
        spec = yaml.safe_load((ROLES / role / "meta/argument_specs.yml").read_text())["argument_specs"]
        options = {name for entry in spec.values() for name in entry.get("options", {})}
        # a declared name is one of the role's own options (no typo silently drops a setting); the
        # collection-wide gpufleet_* settings are role _common's
        assert set(decl["vars"]) | set(decl.get("from_node_files", {})) <= options, role
    contract = _contract()
    assert contract["from_node_files"] == {
        "vllm_server_api_key": {"file": "vllm_server_secrets_file", "key": "VLLM_API_KEY"}
    }
    # the controller's one-run switches, the central balancer and the HF token are never exported
    for name in (
        "vllm_server_hf_token",
        "vllm_server_api_key",
        "lb_registration_api_key",
        "lb_registration_balancer",
        "lb_registration_socket",
        "lb_registration_config_file",
        "lb_registration_state",
        "nccl_gate_force",
        "gpufleet_serial",
        "gpufleet_max_fail_percentage",
        "boot_validation_extra_vars",
    ):
        assert name not in contract["vars"], name


def test_only_declared_variables_are_exported_and_secrets_are_read_on_the_node():
    host = {
        "vllm_server_model": "Llama-3.3-70B-Instruct-FP8",
        "vllm_server_api_key": "sk-secret",
        "vllm_server_hf_token": "hf_secret",
        # has the role's prefix, but no role declares it: a variable added later is not exported
        "vllm_server_some_new_setting": "x",
        "nccl_gate_min_busbw_gbps": 20,
        "nccl_gate_force": True,
        "lb_registration_balancer": "lb1",
        "ansible_host": "10.0.0.2",
        "pcie_p2p_acs": {"changed": False, "ports": []},
        "gpu_topology_expect": {"gpu_count": 4},
        "gpufleet_acceptance_duration": 3,
        "gpufleet_sysfs_path": "/sys/bus/pci",
        "nccl_gate_stop_services": ["dcgm.service"],
    }
    out = boot_validation_vars(host, _contract(), {"ansible_connection": "local", "lb_registration_balancer": ""})
    assert out == {
        "ansible_connection": "local",
        "gpu_topology_expect": {"gpu_count": 4},
        "gpufleet_sysfs_path": "/sys/bus/pci",
        "lb_registration_balancer": "",
        "nccl_gate_min_busbw_gbps": 20,
        "nccl_gate_stop_services": ["dcgm.service"],
        "vllm_server_api_key": "{{ vllm_server_secrets_file | gpufleet.node.boot_validation_env_file_value('VLLM_API_KEY') }}",
        "vllm_server_model": "Llama-3.3-70B-Instruct-FP8",
    }
    assert list(out) == sorted(out)
    assert "sk-secret" not in json.dumps(out) and "hf_secret" not in json.dumps(out)


def test_a_secret_in_the_extra_vars_is_refused():
    with pytest.raises(AnsibleFilterError, match="vllm_server_api_key is a secret"):
        boot_validation_vars({}, _contract(), {"vllm_server_api_key": "sk-x"})


def test_bad_declarations_are_refused():
    with pytest.raises(AnsibleFilterError, match="must hold one mapping, node_run"):
        boot_validation_contract({"r": {"vars": []}})
    with pytest.raises(AnsibleFilterError, match="vars must be a list of variable names"):
        boot_validation_contract({"r": {"node_run": {"vars": ["a b"]}}})
    with pytest.raises(AnsibleFilterError, match="unknown keys prefixes"):
        boot_validation_contract({"r": {"node_run": {"prefixes": ["r_"]}}})
    with pytest.raises(AnsibleFilterError, match="needs file"):
        boot_validation_contract({"r": {"node_run": {"from_node_files": {"r_key": {"file": "r_file"}}}}})
    with pytest.raises(AnsibleFilterError, match="cannot be in vars too"):
        boot_validation_contract(
            {"r": {"node_run": {"vars": ["k"], "from_node_files": {"k": {"file": "f", "key": "K"}}}}}
        )
    with pytest.raises(AnsibleFilterError, match="declared by both a and b"):
        boot_validation_contract({"a": {"node_run": {"vars": ["x"]}}, "b": {"node_run": {"vars": ["x"]}}})
    with pytest.raises(AnsibleFilterError, match="must come from boot_validation_contract"):
        boot_validation_vars({}, ["vllm_server_"])


def test_env_file_value(tmp_path):
    env = tmp_path / "secrets.env"
    assert boot_validation_env_file_value(env, "VLLM_API_KEY") == ""  # no file: no key
    env.write_text("# Ansible managed\nHF_TOKEN=hf_x\nVLLM_API_KEY=sk-a=b:c%d\n")
    assert boot_validation_env_file_value(env, "VLLM_API_KEY") == "sk-a=b:c%d"
    assert boot_validation_env_file_value(env, "HF_TOKEN") == "hf_x"
    assert boot_validation_env_file_value(env, "OTHER") == ""


def _tarball(path, files, version="0.1.0"):
    entries = [{"name": n, "ftype": "file", "chksum_sha256": c} for n, c in files.items()]
    entries.append({"name": "plugins/__pycache__", "ftype": "dir", "chksum_sha256": None})
    members = {
        "MANIFEST.json": {"collection_info": {"namespace": "gpufleet", "name": "node", "version": version}},
        "FILES.json": {"files": entries},
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            raw = json.dumps(data).encode()
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return str(path)


def test_the_collection_digest_follows_the_runtime_files_not_the_version_alone(tmp_path):
    base = {"roles/r/tasks/main.yml": "a", "plugins/modules/m.py": "b", "tests/t.py": "c", ".ruff_cache/x": "d"}
    one = boot_validation_collection_digest(_tarball(tmp_path / "1.tar.gz", base))
    assert one == boot_validation_collection_digest(_tarball(tmp_path / "2.tar.gz", base))
    # the code changed, the version did not: a new digest
    changed = dict(base, **{"plugins/modules/m.py": "b2"})
    assert boot_validation_collection_digest(_tarball(tmp_path / "3.tar.gz", changed)) != one
    # caches and tests of the controller's checkout do not reinstall every node
    noise = dict(base, **{"tests/t.py": "c2", ".ruff_cache/x": "d2"})
    assert boot_validation_collection_digest(_tarball(tmp_path / "4.tar.gz", noise)) == one
    assert boot_validation_collection_digest(_tarball(tmp_path / "5.tar.gz", base, version="0.2.0")) != one
    with pytest.raises(AnsibleFilterError, match="is not a built collection"):
        boot_validation_collection_digest(str(tmp_path / "missing.tar.gz"))


GALAXY_YML = """namespace: gpufleet
name: node
version: 0.1.0
readme: README.md
authors: [t]
build_ignore:
  - .venv
  - '*.swp'
  - roles/r/files/local-*
"""


def _tree(root):
    """A collection source tree with what galaxy leaves out: build_ignore, caches, a symlinked directory."""
    files = {
        "galaxy.yml": GALAXY_YML,
        "README.md": "readme",
        "meta/runtime.yml": "requires_ansible: '>=2.16'",
        "plugins/modules/m.py": "print(1)",
        "plugins/modules/__pycache__/m.cpython-311.pyc": "x",
        "plugins/modules/m.pyc": "x",
        "playbooks/validate.yml": "- hosts: all",
        "roles/r/tasks/main.yml": "---",
        "roles/r/tasks/.main.yml.swp": "swap",
        "roles/r/files/local-notes.txt": "ignored",
        "roles/r/files/shipped.txt": "shipped",
        "tests/unit/test_x.py": "test",
        ".venv/lib/x.py": "venv",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    os.symlink("r", root / "roles/alias")  # galaxy lists it, not its files
    return root


def _galaxy_build(src, out):
    from ansible.galaxy.collection import build_collection

    out.mkdir(exist_ok=True)
    return build_collection(str(src), str(out), True)


def test_the_digest_of_a_source_tree_is_the_digest_of_what_galaxy_builds_from_it(tmp_path):
    src = _tree(tmp_path / "src")
    one = boot_validation_collection_digest(str(src))
    assert one == boot_validation_collection_digest(_galaxy_build(src, tmp_path / "b1"))
    # tests, docs, caches and what build_ignore names: neither shipped nor digested
    for name in ("tests/unit/test_x.py", "README.md", "roles/r/tasks/.main.yml.swp", "roles/r/files/local-notes.txt",
                 "plugins/modules/__pycache__/m.cpython-311.pyc", ".venv/lib/x.py"):  # fmt: skip
        (src / name).write_text("changed")
    assert boot_validation_collection_digest(str(src)) == one
    # a runtime file's content, a new runtime file: a new digest, the same as galaxy's build
    (src / "roles/r/files/shipped.txt").write_text("shipped v2")
    two = boot_validation_collection_digest(str(src))
    (src / "plugins/modules/n.py").write_text("print(2)")
    three = boot_validation_collection_digest(str(src))
    assert len({one, two, three}) == 3
    assert three == boot_validation_collection_digest(_galaxy_build(src, tmp_path / "b2"))
    (src / "galaxy.yml").write_text(GALAXY_YML + "manifest: {}\n")
    with pytest.raises(AnsibleFilterError, match="uses manifest"):
        boot_validation_collection_digest(str(src))
    with pytest.raises(AnsibleFilterError, match="not a collection source tree"):
        boot_validation_collection_digest(str(tmp_path))


def test_the_runtime_digests_and_which_parts_of_a_node_are_stale(tmp_path):
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("ansible-core==2.19.14\n")
    wheels = tmp_path / "wheelhouse"
    wheels.mkdir()
    (wheels / "ansible_core-2.19.14-py3-none-any.whl").write_bytes(b"w" * 10)
    src = _tree(tmp_path / "src")
    full = boot_validation_runtime(str(reqs), str(wheels), str(src))
    assert sorted(full) == ["collection", "venv"]
    assert full["collection"] == boot_validation_collection_digest(str(src))
    # only the parts the role installs (the operator's own venv or collection: not digested)
    assert boot_validation_runtime("", "", str(src)) == {"collection": full["collection"]}
    assert boot_validation_runtime(str(reqs), str(wheels), "") == {"venv": full["venv"]}
    assert boot_validation_runtime("", "", "") == {}
    # the venv follows the requirements, the wheelhouse's listing, and where pip installs from
    assert boot_validation_runtime(str(reqs), str(wheels) + "/")["venv"] == full["venv"]
    assert boot_validation_runtime(str(reqs), "")["venv"] != full["venv"]
    (wheels / "jinja2-3.1.6-py3-none-any.whl").write_bytes(b"j")
    assert boot_validation_runtime(str(reqs), str(wheels))["venv"] != full["venv"]
    with pytest.raises(AnsibleFilterError, match="is not a directory on the controller. Build it with `pip download"):
        boot_validation_runtime(str(reqs), str(tmp_path / "nowhere"))
    with pytest.raises(AnsibleFilterError, match="cannot read boot_validation_requirements"):
        boot_validation_runtime(str(tmp_path / "missing.txt"))

    def record(data):
        return base64.b64encode(data if isinstance(data, bytes) else json.dumps(data).encode()).decode()

    assert boot_validation_stale(record(full), full) == []
    assert boot_validation_stale(record(dict(full, collection="0" * 64)), full) == ["collection"]
    assert boot_validation_stale(record({"collection": full["collection"]}), full) == ["venv"]
    for unreadable in ("", None, "not base64!", record(b"\xff"), record(b"[1]"), record(b"{")):
        assert boot_validation_stale(unreadable, full) == ["collection", "venv"], unreadable
    assert boot_validation_stale("", {}) == []  # the operator's runtime: nothing to compare


def test_the_node_requirements_pin_the_controllers_ansible_core():
    def pins(path):
        out = {}
        for line in path.read_text().splitlines():
            line = line.split("#")[0].strip()
            if "==" in line:
                name, version = line.split("==")
                out[name.lower()] = version
        return out

    node = pins(ROLES / "boot_validation/files/requirements-node.txt")
    controller = pins(REPO / "requirements.txt")
    for name in ("ansible-core", "nvidia-ml-py", "jinja2", "pyyaml"):
        assert node[name] == controller[name], name


# --- data never becomes code: the node inventory (boot_validation_inventory) ---------------------


def _node_inventory(host_vars, overrides=None):
    from tests.harness.inventory import node_inventory

    text = boot_validation_inventory(
        host_vars, "node1", _contract(), overrides, boot_validation_secret_names(str(ROLES))
    )
    return node_inventory(text)


TEMPLATES = ("{{ lookup('pipe', 'id') }}", "{% for x in range(9) %}{% endfor %}", "{# c #}", "{{", "}}{%")


@pytest.mark.parametrize("payload", TEMPLATES)
def test_every_exported_string_is_data_in_every_kind_of_field(payload):
    """Template syntax in a string setting, a nested key, a list item, an extra variable and
    strings that YAML would otherwise read as other types: the host's variables are one !unsafe
    mapping, every value comes back as the same text and type, the only template is the collection's."""
    from tests.harness.inventory import Unsafe

    host = {
        "gpufleet_kernel_log_path": payload,
        "gpu_topology_expect": {payload: [payload, 3, "0", "", "true", "null", None, 1.5]},
        "gpufleet_serving": {"backend": "llamacpp", "reason": "the model %s fits" % payload},
        "vllm_server_api_key": "sk-secret-value",
    }
    hosts, group_vars = _node_inventory(host, {"gpufleet_note": payload})
    exported = hosts["node1"]
    assert isinstance(exported, Unsafe)
    assert exported["gpufleet_kernel_log_path"] == payload and exported["gpufleet_note"] == payload
    assert exported["gpu_topology_expect"] == host["gpu_topology_expect"]
    assert exported["gpufleet_serving"] == host["gpufleet_serving"]
    assert group_vars == {
        "vllm_server_api_key": "{{ vllm_server_secrets_file | gpufleet.node.boot_validation_env_file_value('VLLM_API_KEY') }}"
    }


def test_the_secret_names_are_the_argument_specs_no_log_options():
    assert {"vllm_server_api_key", "vllm_server_hf_token", "llamacpp_server_api_key"} <= set(
        boot_validation_secret_names(str(ROLES))
    )


def test_a_vaulted_value_is_refused_for_export_by_its_name():
    from ansible.parsing.vault import EncryptedString, VaultLib, VaultSecret

    ciphertext = VaultLib([("default", VaultSecret(b"pw"))]).encrypt("/var/log/kern.log").decode()
    with pytest.raises(AnsibleFilterError, match="gpufleet_kernel_log_path is vaulted"):
        _node_inventory({"gpufleet_kernel_log_path": EncryptedString(ciphertext=ciphertext)})
    with pytest.raises(AnsibleFilterError, match=r"gpu_topology_expect\.a\[0\] is vaulted"):
        _node_inventory({"gpu_topology_expect": {"a": [EncryptedString(ciphertext=ciphertext)]}})


def test_a_value_built_from_a_secret_is_refused_and_the_secret_is_not_in_the_message():
    secret = "hf_0123456789abcdef"
    for host, where in (
        ({"vllm_server_hf_token": secret, "gpufleet_lab_root": "/x/%s/y" % secret}, "gpufleet_lab_root"),
        ({"vllm_server_api_key": secret, "gpu_topology_expect": {"k": [secret]}}, r"gpu_topology_expect\.k\[0\]"),
        ({"vllm_server_api_key": "ab", "gpufleet_lab_root": "ab"}, "gpufleet_lab_root"),  # short: the whole value
    ):
        with pytest.raises(AnsibleFilterError, match=where + " holds the value of a secret") as refused:
            _node_inventory(host)
        assert secret not in str(refused.value) and "'ab'" not in str(refused.value)
    # a short secret is not looked for inside other values (it would match half the inventory)
    assert _node_inventory({"vllm_server_api_key": "ab", "gpufleet_lab_root": "/lab"})[0]["node1"]["gpufleet_lab_root"]


def test_what_the_node_inventory_cannot_carry_is_refused_by_name():
    with pytest.raises(AnsibleFilterError, match="'bad name' is not a variable name"):
        _node_inventory({}, {"bad name": 1})
    with pytest.raises(AnsibleFilterError, match="gpu_topology_expect.s is a set"):
        _node_inventory({"gpu_topology_expect": {"s": {1, 2}}})


def test_the_example_inventory_lets_the_role_install_the_nodes_runtime():
    """Copied as the README says, the example inventory must not switch the role to an operator's
    own runtime (which installs nothing and fails on a fresh node)."""
    example = yaml.safe_load((REPO / "inventories/example/group_vars/gpu_nodes.yml").read_text())
    assert not example.get("boot_validation_ansible_playbook") and not example.get("boot_validation_collections_path")
    assert example.get("gpufleet_boot_validation", True) is True
