# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a node's own boot validation runs with (role gpufleet.node.boot_validation).

The contract: each role declares, in ``roles/<role>/meta/node_run.yml``, the variables the node's
own run of playbook validate.yml needs (``vars``) and the secrets that run reads from the files the
role keeps on the node (``from_node_files``). Only declared variables are written to the node's
inventory; a secret is never written, only an expression that reads it on the node at boot.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import os
import re
import tarfile
from collections.abc import Mapping

import yaml  # ansible-core depends on it
from ansible.errors import AnsibleError, AnsibleFilterError
from ansible.parsing.vault import VaultHelper

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Only what a node's run loads from the collection: a change to the tests or the docs of the
# controller's checkout does not reinstall the collection on every node.
_RUNTIME_TOP = ("meta/", "plugins/", "playbooks/", "roles/")
# A secret this long is looked for inside exported strings; a shorter one only as a whole value (a
# two-letter key would otherwise match half the inventory).
_SECRET_SUBSTRING_MIN = 6


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


def boot_validation_secret_names(roles_dir):
    """The options the roles' argument specs mark ``no_log`` (every secret a role takes), sorted:
    their values are looked for in what the node's inventory would carry."""
    names = set()
    for role in sorted(os.listdir(str(roles_dir))):
        path = os.path.join(str(roles_dir), role, "meta", "argument_specs.yml")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                specs = (yaml.safe_load(f) or {}).get("argument_specs") or {}
            for entry in specs.values():
                names.update(n for n, o in (entry.get("options") or {}).items() if (o or {}).get("no_log"))
    return sorted(names)


class _Data(dict):
    """A mapping the node's Ansible must take as data: written with YAML's ``!unsafe`` tag, under
    which ansible-core takes every string as data, never a template, at any depth (keys too), and
    keeps each scalar's type (``!unsafe`` on a scalar would re-resolve it: ``'0'`` became 0)."""


class _NodeInventoryDumper(yaml.SafeDumper):
    """PyYAML's safe dumper, writing a :class:`_Data` mapping as ``!unsafe``."""


_NodeInventoryDumper.add_representer(_Data, lambda dumper, data: dumper.represent_mapping("!unsafe", dict(data)))


def _as_data(where, value, secrets):
    """``value`` as plain YAML data (str, int, float, bool, None, lists and dicts of them).

    A vaulted value, or one that holds a secret's plain text (a value built from a secret), is
    refused by name: the node has no vault password, and whoever reads --diff reads the node
    inventory."""
    if VaultHelper.get_ciphertext(value, with_tags=False) is not None:
        raise AnsibleFilterError(
            "boot_validation: %s is vaulted: the node's own run has no vault password. Keep secrets out of "
            "the variables roles/*/meta/node_run.yml declares (a role reads its own from the node's 0600 "
            "files), or give the node's run a plain value in boot_validation_extra_vars" % where
        )
    if isinstance(value, str):
        if any(secret == value or (len(secret) >= _SECRET_SUBSTRING_MIN and secret in value) for secret in secrets):
            raise AnsibleFilterError(
                "boot_validation: %s holds the value of a secret (a variable an argument spec marks no_log): "
                "the node inventory carries no secret. Build it on the node from the role's 0600 files "
                "instead, or leave it out of the node's run" % where
            )
        return str(value)
    if value is None:
        return None
    for kind in (bool, int, float):  # Ansible's own subclasses (tagged values) as the plain types
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, Mapping):
        return {
            _as_data("%s (a key)" % where, key, secrets): _as_data("%s.%s" % (where, key), item, secrets)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_as_data("%s[%d]" % (where, i), item, secrets) for i, item in enumerate(value)]
    raise AnsibleFilterError(
        "boot_validation: %s is a %s, which the node inventory cannot carry (strings, numbers, booleans, "
        "null, lists and mappings)" % (where, type(value).__name__)
    )


def boot_validation_inventory(host_vars, host, contract, overrides=None, secret_names=()):
    """The node-local inventory's YAML text: ``host`` alone, with :func:`boot_validation_vars`.

    Data, never templates: ansible-core renders the strings of an inventory file as templates, and
    what site.yml exports comes partly from outside (a GGUF header's model name in the serving
    plan's reasons, command output, HTTP answers). So the host's variables are one ``!unsafe``
    mapping (:class:`_Data`), and the only templates in the file are the expressions this
    collection writes itself to read a secret on the node (``from_node_files``), as the group's
    variables. ``secret_names`` (boot_validation_secret_names): the variables whose values, where
    this host sets them, must not be in any exported value."""
    node_vars = boot_validation_vars(host_vars, contract, overrides)
    bad = sorted(str(name) for name in node_vars if not _NAME.match(str(name)))
    if bad:
        raise AnsibleFilterError(
            "boot_validation_extra_vars: %s is not a variable name (letters, digits and _)" % ", ".join(map(repr, bad))
        )
    expressions = contract.get("from_node_files") or {}
    secrets = set()
    for name in sorted(set(secret_names) | set(expressions)):
        try:
            value = host_vars[name] if name in host_vars else None
        except AnsibleError:
            continue  # a secret that cannot be rendered here cannot be in a value that can
        if isinstance(value, str) and value:
            secrets.add(str(value))
    data = _Data(
        (str(name), _as_data(name, value, secrets)) for name, value in node_vars.items() if name not in expressions
    )
    group = {"hosts": {str(host): data}}
    if expressions:
        group["vars"] = {str(name): str(node_vars[name]) for name in expressions}
    return yaml.dump(
        {"all": {"children": {"gpu_nodes": group}}},
        Dumper=_NodeInventoryDumper,
        default_flow_style=False,
        sort_keys=True,
        allow_unicode=True,
        width=float("inf"),
    )


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


def _collection_digest(namespace, name, version, files):
    """THE digest of a collection as a node's run uses it: its name and version, and the sha256 of
    each runtime file (meta/, plugins/, playbooks/, roles/; ``files`` is ``[(path, sha256)]``), so
    that it changes with their content whether or not the version was bumped, and not with the
    tarball's timestamps, the checkout's caches, its tests or its docs. Both readers below feed it."""
    digest = hashlib.sha256()
    digest.update(("%s.%s %s\n" % (namespace, name, version)).encode())
    for path, chksum in sorted(files):
        if path.startswith(_RUNTIME_TOP) and "/__pycache__/" not in "/" + path:
            digest.update(("%s %s\n" % (path, chksum)).encode())
    return digest.hexdigest()


def _tarball_digest(tarball):
    """The digest of a built collection (``ansible-galaxy collection build``): its MANIFEST.json
    and the checksums its FILES.json lists."""
    try:
        with tarfile.open(str(tarball), "r:gz") as tar:
            files = json.load(tar.extractfile("FILES.json"))
            manifest = json.load(tar.extractfile("MANIFEST.json"))
    except (OSError, KeyError, ValueError, tarfile.TarError) as exc:
        raise AnsibleFilterError(
            "boot_validation_collection_digest: %s is not a built collection: %s" % (tarball, exc)
        ) from exc
    info = manifest.get("collection_info", {})
    entries = [(e["name"], e.get("chksum_sha256")) for e in files.get("files", []) if e.get("ftype") == "file"]
    return _collection_digest(info.get("namespace"), info.get("name"), info.get("version"), entries)


# What `ansible-galaxy collection build` leaves out whatever galaxy.yml says
# (ansible.galaxy.collection._build_files_manifest_walk): patterns matched against the path relative
# to the collection's root, and directory names skipped anywhere.
_GALAXY_IGNORE = (
    "MANIFEST.json",
    "FILES.json",
    "galaxy.yml",
    "galaxy.yaml",
    ".git",
    "*.pyc",
    "*.retry",
    "tests/output",
)
_GALAXY_IGNORE_DIRS = frozenset(("CVS", ".bzr", ".hg", ".git", ".svn", "__pycache__", ".tox"))


def _sha256_file(path):
    if not os.path.exists(path) or os.path.isdir(path):
        return None  # a dangling link: galaxy lists it without a checksum
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def _tree_digest(src):
    """The digest of the collection ``ansible-galaxy collection build`` would make of the source
    tree ``src`` (with its galaxy.yml), without building it: the runtime files it would ship, with
    galaxy.yml's build_ignore and galaxy's own exclusions honoured (symlinked directories are not
    followed, as galaxy does not list their files)."""
    src = str(src)
    try:
        with open(os.path.join(src, "galaxy.yml"), encoding="utf-8") as f:
            meta = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise AnsibleFilterError(
            "boot_validation_collection_digest: %s is not a collection source tree (no readable galaxy.yml: %s); "
            "set boot_validation_collection_src to one, or boot_validation_collection_tarball to a built collection"
            % (src, exc)
        ) from exc
    if not isinstance(meta, Mapping) or not all(meta.get(k) for k in ("namespace", "name", "version")):
        raise AnsibleFilterError(
            "boot_validation_collection_digest: %s/galaxy.yml has no namespace, name and version" % src
        )
    if meta.get("manifest") is not None:
        raise AnsibleFilterError(
            "boot_validation_collection_digest: %s/galaxy.yml uses manifest, which the digest does not follow: "
            "build the collection and set boot_validation_collection_tarball" % src
        )
    ignore = _GALAXY_IGNORE + ("%s-%s-*.tar.gz" % (meta["namespace"], meta["name"]),)
    ignore += tuple(str(p) for p in meta.get("build_ignore") or ())

    def ignored(rel):
        return any(fnmatch.fnmatch(rel, pattern) for pattern in ignore)

    files = []

    def walk(rel_dir):
        for item in os.listdir(os.path.join(src, rel_dir)):
            rel = os.path.join(rel_dir, item)
            path = os.path.join(src, rel)
            if os.path.isdir(path):
                if item in _GALAXY_IGNORE_DIRS or ignored(rel) or os.path.islink(path):
                    continue
                walk(rel)
            elif not ignored(rel):
                files.append((rel, _sha256_file(path)))

    for top in _RUNTIME_TOP:
        top = top.rstrip("/")
        path = os.path.join(src, top)
        if os.path.isdir(path) and not (top in _GALAXY_IGNORE_DIRS or ignored(top) or os.path.islink(path)):
            walk(top)
    return _collection_digest(meta["namespace"], meta["name"], meta["version"], files)


def boot_validation_collection_digest(path):
    """The collection digest (see _collection_digest) of a built collection tarball, or of a source
    tree as ``ansible-galaxy collection build`` would ship it: the same value for a tree and its
    build, so the controller compares without building."""
    return _tree_digest(path) if os.path.isdir(str(path)) else _tarball_digest(path)


def _wheelhouse_listing(wheelhouse, requirements):
    """The wheelhouse's files (relative path and size: a wheel's name carries its version)."""
    if not os.path.isdir(wheelhouse):
        raise AnsibleFilterError(
            "boot_validation_wheelhouse %s is not a directory on the controller. Build it with "
            "`pip download --only-binary=:all: -d %s -r %s` (scripts/setup.sh does it for the lab), or set "
            "boot_validation_wheelhouse to '' to install from the nodes' package index."
            % (wheelhouse, wheelhouse, requirements)
        )
    out = []
    for root, dirs, names in os.walk(wheelhouse):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            out.append("%s %d\n" % (os.path.relpath(path, wheelhouse), os.path.getsize(path)))
    return "".join(out)


def boot_validation_runtime(requirements, wheelhouse="", collection=""):
    """``{part: digest}`` of the runtime role boot_validation installs on a node, computed on the
    controller without building anything; the node records exactly this after installing, and the
    role installs a part only where the node's record differs.

    ``venv``: the requirements file's content and the wheelhouse's listing (``wheelhouse`` '':
    the nodes' package index); only when ``requirements`` is given (the role installs the venv).
    ``collection``: boot_validation_collection_digest of ``collection`` (a source tree or a built
    tarball); only when given (the role installs the collection)."""
    out = {}
    if requirements:
        requirements = str(requirements)
        try:
            with open(requirements, "rb") as f:
                reqs = hashlib.sha256(f.read()).hexdigest()
        except OSError as exc:
            raise AnsibleFilterError(
                "boot_validation_runtime: cannot read boot_validation_requirements %s: %s"
                % (requirements, exc.strerror)
            ) from exc
        wheels = _wheelhouse_listing(str(wheelhouse).rstrip("/") or "/", requirements) if wheelhouse else ""
        out["venv"] = hashlib.sha256(
            ("requirements %s\nwheelhouse %s\n%s" % (reqs, bool(wheelhouse), wheels)).encode()
        ).hexdigest()
    if collection:
        out["collection"] = boot_validation_collection_digest(collection)
    return out


def boot_validation_stale(record, runtime):
    """The parts of ``runtime`` (boot_validation_runtime) that the node's record differs from:
    ``record`` is the base64 content of the node's record (slurp), '' or anything unreadable when
    there is none. Sorted, e.g. ``["collection", "venv"]``."""
    try:
        node = json.loads(base64.b64decode(str(record or ""), validate=True).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        node = {}
    if not isinstance(node, Mapping):
        node = {}
    return sorted(part for part, digest in runtime.items() if node.get(part) != digest)


def boot_validation_declarations(roles_dir):
    """``{role: parsed meta/node_run.yml}`` for every role under ``roles_dir`` (on the controller)."""
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
            "boot_validation_inventory": boot_validation_inventory,
            "boot_validation_secret_names": boot_validation_secret_names,
            "boot_validation_contract": boot_validation_contract,
            "boot_validation_declarations": boot_validation_declarations,
            "boot_validation_env_file_value": boot_validation_env_file_value,
            "boot_validation_collection_digest": boot_validation_collection_digest,
            "boot_validation_runtime": boot_validation_runtime,
            "boot_validation_stale": boot_validation_stale,
        }
