# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The collection's code a node-side agent imports, as entries of ``gpufleet.node.files``: the one
way the roles install it (gpu_health's watcher, lb_registration's HAProxy agent, worker_recycle's
agent).

An agent imports the collection's module_utils as a module does, by their full name
(``from ansible_collections.gpufleet.node.plugins.module_utils.health import _checks``), from a
copy of that tree in its lib dir. Which files the copy holds is read from the imports themselves:
the ``import`` and ``from`` statements of the agent, then of every module_utils file they reach
(``ast``, the whole file, function bodies included), so the list cannot fall behind the code.
Every package on the way gets its ``__init__.py`` (empty), from ``ansible_collections`` down, so
the agent imports these copies and no other tree of the same name:

    files: "{{ (role_path ~ '/files/agent.py') | gpufleet.node.agent_files(lib_dir) }}"
"""

from __future__ import annotations

import ast
import os

from ansible.errors import AnsibleFilterError

PACKAGE = "ansible_collections.gpufleet.node.plugins.module_utils"
#: The collection's root: plugins/filter/agent_files.py is three levels below it.
COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Where ``ansible_collections.gpufleet.node`` starts in a dotted name.
_PREFIX = "ansible_collections.gpufleet.node"


def _source(dotted):
    """``(path, is_package)`` of a module of the collection (``_PREFIX.plugins...``), or None."""
    base = os.path.join(COLLECTION, *dotted[len(_PREFIX) + 1 :].split("."))
    if os.path.isfile(base + ".py"):
        return base + ".py", False
    if os.path.isdir(base):
        return os.path.join(base, "__init__.py"), True
    return None


def _names(path):
    """The names a module binds at its top level (definitions, assignments, imports)."""
    if not os.path.isfile(path):
        return set()
    with open(path, "rb") as handle:
        tree = ast.parse(handle.read(), filename=path)
    names = set()
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        # the top level of a module includes what its if/try/with blocks bind
        for field in ("body", "orelse", "finalbody", "handlers"):
            pending.extend(getattr(node, field, None) or [])
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _imports(path, dotted, is_package):
    """The collection modules ``path`` (module ``dotted``) imports, as dotted names."""
    with open(path, "rb") as handle:
        tree = ast.parse(handle.read(), filename=path)
    package = dotted if is_package else dotted.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.append(base)
            # `from package import name`: name may be a module of that package
            found.extend(base + "." + alias.name for alias in node.names if alias.name != "*")
    return [name for name in found if name == PACKAGE or name.startswith(PACKAGE + ".")]


def agent_files(agent, lib_dir):
    """``[{file|content, dest}]``: every module_utils file ``agent`` (the path of an agent's
    script) imports, directly or through another, and the ``__init__.py`` of every package above
    them, under ``lib_dir/ansible_collections/...``; sorted by destination."""
    lib_dir = str(lib_dir).rstrip("/")
    if not os.path.isabs(lib_dir):
        raise AnsibleFilterError("agent_files: the lib dir must be an absolute path, got %r" % lib_dir)
    try:
        pending = [(name, str(agent)) for name in _imports(str(agent), "", False)]
    except (OSError, SyntaxError) as exc:
        raise AnsibleFilterError("agent_files: cannot read the imports of %s: %s" % (agent, exc)) from None
    modules = {}
    while pending:
        dotted, importer = pending.pop()
        if dotted in modules:
            continue
        found = _source(dotted)
        if found is None:
            parent, _dot, name = dotted.rpartition(".")
            owner = _source(parent)
            if owner is not None and name in _names(owner[0]):
                continue  # a name defined in a module (`from ..._proc import run`), not a module
            raise AnsibleFilterError(
                "agent_files: %s imports %s, which is not in the collection at %s" % (importer, dotted, COLLECTION)
            )
        path, is_package = found
        modules[dotted] = path
        if not os.path.isfile(path):
            raise AnsibleFilterError("agent_files: the package %s has no %s" % (dotted, path))
        pending.extend((name, path) for name in _imports(path, dotted, is_package))
    entries = {}
    for path in modules.values():
        rel = os.path.relpath(path, COLLECTION).split(os.sep)
        dest = "/".join([lib_dir] + _PREFIX.split(".") + rel)
        entries[dest] = {"file": path, "dest": dest}
        # the packages above it, from ansible_collections down
        parts = _PREFIX.split(".") + rel[:-1]
        for depth in range(1, len(parts) + 1):
            dest = "/".join([lib_dir] + parts[:depth] + ["__init__.py"])
            if dest not in entries:
                source = os.path.join(COLLECTION, *parts[3:depth], "__init__.py")
                entries[dest] = {"file": source} if depth > 3 and os.path.isfile(source) else {"content": ""}
                entries[dest]["dest"] = dest
    return sorted(entries.values(), key=lambda entry: entry["dest"])


class FilterModule:
    def filters(self):
        return {"agent_files": agent_files}
