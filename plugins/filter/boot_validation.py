# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a node's own boot validation runs with (role gpufleet.node.boot_validation).

The contract: each role declares, in ``roles/<role>/meta/node_run.yml``, the variables the node's
own run of playbook validate.yml needs (``vars``) and the secrets that run reads from the files the
role keeps on the node (``from_node_files``). Only declared variables are written to the node's
inventory; a secret is never written, only an expression that reads it on the node at boot.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Only what a node's run loads from the collection: a change to the tests or the docs of the
# controller's checkout does not reinstall the collection on every node.
_RUNTIME_TOP = ("meta/", "plugins/", "playbooks/", "roles/")


def _is_task_result(value):
    """A registered result (e.g. pcie_p2p_acs): this run's output, not the node's settings."""
    return isinstance(value, Mapping) and ("changed" in value or "failed" in value)


def _check_declaration(role, data):
    """One role's node_run.yml: ``{"node_run": {"vars": [...], "from_node_files": {...}}}``."""
    where = "roles/%s/meta/node_run.yml" % role
    if not isinstance(data, Mapping) or set(data) != {"node_run"} or not isinstance(data["node_run"], Mapping):
        raise AnsibleFilterError("boot_validation: %s must hold one mapping, node_run" % where)
    decl = data["node_run"]
    unknown = set(decl) - {"vars", "from_node_files"}
    if unknown:
        raise AnsibleFilterError("boot_validation: %s: unknown keys %s" % (where, ", ".join(sorted(unknown))))
    names = decl.get("vars") or []
    if not isinstance(names, list) or not all(isinstance(n, str) and _NAME.match(n) for n in names):
        raise AnsibleFilterError("boot_validation: %s: vars must be a list of variable names" % where)
    secrets = decl.get("from_node_files") or {}
    if not isinstance(secrets, Mapping):
        raise AnsibleFilterError("boot_validation: %s: from_node_files must be a mapping" % where)
    for name, spec in secrets.items():
        if (
            not _NAME.match(str(name))
            or not isinstance(spec, Mapping)
            or set(spec) != {"file", "key"}
            or not all(isinstance(spec[k], str) and _NAME.match(spec[k]) for k in spec)
        ):
            raise AnsibleFilterError(
                "boot_validation: %s: from_node_files.%s needs file (the variable that holds the "
                "file's path on the node) and key (the name in that env file)" % (where, name)
            )
        if name in names:
            raise AnsibleFilterError("boot_validation: %s: %s is a secret, it cannot be in vars too" % (where, name))
    return list(names), {str(k): dict(v) for k, v in secrets.items()}


def boot_validation_contract(declarations):
    """Merge the roles' declarations, ``{role: parsed node_run.yml}``, into one contract
    ``{"vars": [names], "from_node_files": {name: {"file": var, "key": KEY}}}``.
    A name declared by two roles is refused (one home per variable)."""
    if not isinstance(declarations, Mapping):
        raise AnsibleFilterError("boot_validation_contract: expects {role: declaration}")
    owner = {}
    out_vars, out_secrets = [], {}
    for role in sorted(declarations):
        names, secrets = _check_declaration(role, declarations[role])
        for name in names + list(secrets):
            if name in owner:
                raise AnsibleFilterError(
                    "boot_validation_contract: %s is declared by both %s and %s" % (name, owner[name], role)
                )
            owner[name] = role
        out_vars += names
        out_secrets.update(secrets)
    return {"vars": sorted(out_vars), "from_node_files": dict(sorted(out_secrets.items()))}


def boot_validation_vars(host_vars, contract, overrides=None):
    """The variables the node-local run is given: the declared ones this host has.

    ``host_vars`` is ``hostvars[inventory_hostname]`` (inventory, group and extra variables: role
    defaults are not there, so the node's run computes those from its own facts at boot). Only names
    in ``contract.vars`` are taken, never a registered task result. Each secret of
    ``contract.from_node_files`` becomes an expression that reads it, on the node, from the env file
    its role keeps there, so its value never leaves the controller (a vaulted value works). The
    result is sorted by name so that the file it is written to only changes when a setting does.
    ``overrides`` are applied last.
    """
    if not isinstance(contract, Mapping) or not isinstance(contract.get("vars"), list):
        raise AnsibleFilterError("boot_validation_vars: contract must come from boot_validation_contract")
    secrets = contract.get("from_node_files") or {}
    out = {}
    for name in contract["vars"]:
        if name in secrets or name not in host_vars:
            continue
        value = host_vars[name]
        if _is_task_result(value):
            continue
        out[name] = value
    for name, spec in secrets.items():
        out[name] = "{{ %s | gpufleet.node.boot_validation_env_file_value('%s') }}" % (spec["file"], spec["key"])
    leaked = sorted(set(overrides or {}) & set(secrets))
    if leaked:
        raise AnsibleFilterError(
            "boot_validation_vars: %s is a secret, the node reads it from its own files: "
            "remove it from boot_validation_extra_vars" % ", ".join(leaked)
        )
    out.update(overrides or {})
    return dict(sorted(out.items()))


def boot_validation_env_file_value(path, key):
    """``KEY``'s value in an env file on this machine (the node, in the node's own run); '' when
    the file or the key is missing. The roles write such files with plain ``KEY=value`` lines
    (filter env_value: no quotes, no backslashes)."""
    try:
        with open(str(path), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise AnsibleFilterError("boot_validation_env_file_value: cannot read %s: %s" % (path, exc.strerror)) from exc
    value = ""
    for line in lines:
        name, sep, rest = line.strip().partition("=")
        if sep and name.strip() == key:
            value = rest  # the last one wins, as in systemd's EnvironmentFile=
    return value


def boot_validation_collection_digest(tarball):
    """A digest of what a node's run uses in a built collection (``ansible-galaxy collection
    build``): its name and version, and the checksums its FILES.json lists for the runtime files (
    meta/, plugins/, playbooks/, roles/), so that it changes with their content whether or not the
    version was bumped, and not with the tarball's timestamps or the checkout's caches."""
    try:
        with tarfile.open(str(tarball), "r:gz") as tar:
            files = json.load(tar.extractfile("FILES.json"))
            manifest = json.load(tar.extractfile("MANIFEST.json"))
    except (OSError, KeyError, ValueError, tarfile.TarError) as exc:
        raise AnsibleFilterError(
            "boot_validation_collection_digest: %s is not a built collection: %s" % (tarball, exc)
        ) from exc
    digest = hashlib.sha256()
    info = manifest.get("collection_info", {})
    digest.update(("%s.%s %s\n" % (info.get("namespace"), info.get("name"), info.get("version"))).encode())
    for entry in sorted(files.get("files", []), key=lambda e: e["name"]):
        name = entry["name"]
        if entry.get("ftype") == "file" and name.startswith(_RUNTIME_TOP) and "/__pycache__/" not in "/" + name:
            digest.update(("%s %s\n" % (name, entry.get("chksum_sha256"))).encode())
    return digest.hexdigest()


def boot_validation_declarations(roles_dir):
    """``{role: parsed meta/node_run.yml}`` for every role under ``roles_dir`` (on the controller)."""
    import yaml  # ansible-core depends on it

    out = {}
    if not os.path.isdir(str(roles_dir)):
        raise AnsibleFilterError("boot_validation_declarations: no roles directory at %s" % roles_dir)
    for role in sorted(os.listdir(str(roles_dir))):
        path = os.path.join(str(roles_dir), role, "meta", "node_run.yml")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                out[role] = yaml.safe_load(f)
    return out


class FilterModule:
    def filters(self):
        return {
            "boot_validation_vars": boot_validation_vars,
            "boot_validation_contract": boot_validation_contract,
            "boot_validation_declarations": boot_validation_declarations,
            "boot_validation_env_file_value": boot_validation_env_file_value,
            "boot_validation_collection_digest": boot_validation_collection_digest,
        }
