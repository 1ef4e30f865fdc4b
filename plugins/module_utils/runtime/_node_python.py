# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node's Python for its own boot validation: which interpreter makes the venv, which of the
distribution's packages it needs first, or why the node cannot have one. One rule (``choose``).

Plain Python (no Ansible imports), runs on target Python 3.8+ (the probe half runs on the node).
The node's run is ansible-core 2.19 as a controller, which needs Python 3.11-3.13; the releases'
own ``python3`` are 3.9 (Debian 11, RHEL 9), 3.10 (Ubuntu 22.04), 3.11 (Debian 12), 3.12 (Ubuntu
24.04) and 3.13 (Debian 13).
"""

from __future__ import annotations

import json
import re

from ansible_collections.gpufleet.node.plugins.module_utils.common import _os_family

#: The Pythons ansible-core 2.19 runs on as a controller (the node's run), first and last.
CONTROLLER_PYTHON = ((3, 11), (3, 13))
#: What is looked for on the node, newest first; ``python3`` counts when it is new enough.
CANDIDATES = ("python3.13", "python3.12", "python3.11", "python3")
#: The variable that points the role at another interpreter.
VARIABLE = "boot_validation_venv_python"

#: The distribution's own package of a supported Python where the release's ``python3`` is older:
#: ``(os_family, distribution or None for the whole family, major version)`` ->
#: ``(interpreter it installs, packages)``. Ubuntu 22.04 has python3.11 in universe (its venv and
#: ensurepip split out as on Debian); RHEL 9 and its rebuilds have it in AppStream, venv included.
#: Debian 11 has none.
PACKAGED = {
    ("Debian", "Ubuntu", "22"): ("/usr/bin/python3.11", ("python3.11", "python3.11-venv")),
    ("RedHat", None, "9"): ("/usr/bin/python3.11", ("python3.11",)),
}

#: Run by each candidate (``<python> -c PROBE``): its version, and whether ``python -m venv`` can
#: bootstrap pip (Debian and Ubuntu ship ``ensurepip`` in pythonX.Y-venv, apart from the interpreter).
PROBE = (
    "import json, sys\n"
    "try:\n"
    "    import ensurepip, venv\n"
    "    ok = True\n"
    "except ImportError:\n"
    "    ok = False\n"
    "print(json.dumps({'version': list(sys.version_info[:3]), 'venv': ok}))\n"
)

_SYSTEM_PYTHON = re.compile(r"^/usr/bin/(python3(?:\.\d+)?)$")


class ProbeError(ValueError):
    """A candidate answered, but not with what the probe prints."""


def parse_probe(name, path, stdout):
    """``{'name', 'path', 'version': [major, minor, micro], 'venv': bool}`` from one candidate's
    answer to :data:`PROBE`; :class:`ProbeError` when the answer is not the probe's."""
    try:
        data = json.loads(stdout.strip().splitlines()[-1])
        version = [int(v) for v in data["version"]]
        venv = data["venv"]
    except (IndexError, ValueError, KeyError, TypeError) as exc:
        raise ProbeError("%s (%s) did not answer the probe: %r" % (name, path, stdout[-200:])) from exc
    if len(version) != 3 or not isinstance(venv, bool):
        raise ProbeError("%s (%s) did not answer the probe: %r" % (name, path, stdout[-200:]))
    return {"name": str(name), "path": str(path), "version": version, "venv": venv}


def supported(version):
    """Whether ``version`` ([major, minor, ...]) runs ansible-core 2.19 as a controller."""
    first, last = CONTROLLER_PYTHON
    return first <= tuple(version[:2]) <= last


def _dotted(version):
    return ".".join(str(v) for v in version)


def _needed():
    first, last = CONTROLLER_PYTHON
    return "Python %s-%s (what ansible-core 2.19 runs on)" % (_dotted(first), _dotted(last))


def _release(facts):
    return "%s %s" % (facts.get("distribution") or "an unknown system", facts.get("distribution_version") or "")


def venv_package(facts, path, found=()):
    """The package that gives the interpreter at ``path`` its venv (ensurepip): Debian and Ubuntu
    split it out of their own interpreters - ``python3-venv`` for the release's default Python
    (``/usr/bin/python3``, or the ``/usr/bin/python3.X`` that ``found`` shows it is), else
    ``python3.X-venv``; '' for any other interpreter or family."""
    match = _SYSTEM_PYTHON.match(str(path))
    if facts.get("os_family") != "Debian" or not match:
        return ""
    default = [list(f["version"][:2]) for f in found if f["path"] == "/usr/bin/python3"]
    if match.group(1) == "python3" or (default and match.group(1) == "python%d.%d" % tuple(default[0])):
        return "python3-venv"
    return "%s-venv" % match.group(1)


def packaged(facts):
    """``(interpreter, packages)`` of the release's own package of a supported Python, or None."""
    family, major = facts.get("os_family"), str(facts.get("distribution_major_version") or "")
    return PACKAGED.get((family, facts.get("distribution"), major)) or PACKAGED.get((family, None, major))


def _found_text(found, facts):
    """What the node has, for a refusal: each interpreter found, or the facts' own Python."""
    if found:
        return ", ".join("%s %s (%s)" % (f["name"], _dotted(f["version"]), f["path"]) for f in found)
    python = facts.get("python") or {}
    version = python.get("version") or {}
    if version:
        return "only python3 %s.%s.%s (%s)" % (
            version.get("major"),
            version.get("minor"),
            version.get("micro"),
            python.get("executable") or "?",
        )
    return "no Python 3 interpreter"


def _refusal(host, what, facts):
    return (
        "%s cannot run its own boot validation: %s Point %s at a Python %s-%s you installed on %s "
        "(with its venv module), or set gpufleet_boot_validation=false (its server then starts at boot, "
        "and the node's agent keeps it out of the pool until site.yml has measured it)."
        % (
            host,
            what,
            VARIABLE,
            _dotted(CONTROLLER_PYTHON[0]),
            _dotted(CONTROLLER_PYTHON[1]),
            host,
        )
    )


def _decision(facts, python, version, packages, how):
    return {
        "python": python,
        "version": version,
        "packages": list(packages),
        "pkg_mgr": _os_family.package_manager(facts) if packages else "",
        "how": how,
        "refused": "",
    }


def _refused(host, what, facts):
    return {
        "python": "",
        "version": "",
        "packages": [],
        "pkg_mgr": "",
        "how": "refused",
        "refused": _refusal(host, what, facts),
    }


def _use(facts, host, entry, how, found):
    """An interpreter that is new enough: as it is, or with its venv package, or refused."""
    version = _dotted(entry["version"])
    if entry["venv"]:
        return _decision(facts, entry["path"], version, (), how)
    package = venv_package(facts, entry["path"], found)
    if not package:
        return _refused(
            host,
            "%s %s (%s) has no venv module (ensurepip), and %s has no package of it that this role knows."
            % (entry["name"], version, entry["path"], _release(facts).strip()),
            facts,
        )
    return _decision(facts, entry["path"], version, (package,), how + "+venv")


def choose(facts, found, requested="", host="the node"):
    """THE rule: the interpreter that makes the node's venv, and what to install first.

    ``facts``: the node's ``ansible_facts`` (``os_family``, ``distribution``,
    ``distribution_version``, ``distribution_major_version``, ``pkg_mgr``, ``python``). ``found``:
    what the probe found on the node, ``[{'name', 'path', 'version', 'venv'}]`` (:func:`parse_probe`),
    in :data:`CANDIDATES` order. ``requested``: the operator's interpreter (a path or a name), ''
    to choose. Returns ``{'python', 'version', 'packages', 'pkg_mgr', 'how', 'refused'}``:

    1. ``requested``: that interpreter, when the probe found it new enough; with its venv package
       where it lacks venv (Debian family, /usr/bin only: ``python3-venv`` for the release's
       default Python, else ``python3.X-venv``); else refused.
    2. Else an interpreter found that is new enough, one whose venv works first, then the newest
       (``how`` ``found``; ``found+venv`` when its venv package is installed first).
    3. Else the release's own package of one (:data:`PACKAGED`; ``how`` ``package``).
    4. Else refused: ``refused`` says what the node has, what is needed and the variable to set,
       and nothing is installed.
    Where packages are needed, ``pkg_mgr`` is the family's (apt, dnf); a node whose facts name
    another package manager is refused rather than half-served."""
    facts = facts or {}
    if requested:
        matches = [f for f in found if requested in (f["path"], f["name"])]
        if not matches:
            return _refused(host, "%s=%s is not an executable Python on %s." % (VARIABLE, requested, host), facts)
        entry = matches[0]
        if not supported(entry["version"]):
            return _refused(
                host,
                "%s=%s is Python %s; the node's run needs %s."
                % (VARIABLE, requested, _dotted(entry["version"]), _needed()),
                facts,
            )
        decision = _use(facts, host, entry, "requested", found)
    else:
        usable = [f for f in found if supported(f["version"])]
        # stable: a ready one before one that needs its venv package, then the newest
        usable.sort(key=lambda f: (not f["venv"], [-v for v in f["version"][:2]]))
        if usable:
            decision = _use(facts, host, usable[0], "found", found)
        else:
            package = packaged(facts)
            if package is None:
                return _refused(
                    host,
                    "it has %s, the node's run needs %s, and %s has no package of one that this role knows."
                    % (_found_text(found, facts), _needed(), _release(facts).strip()),
                    facts,
                )
            python, packages = package
            decision = _decision(facts, python, "", packages, "package")
    if decision["packages"] and decision["pkg_mgr"] != facts.get("pkg_mgr"):
        return _refused(
            host,
            "%s needs %s installed, but its package manager is %s, not %s."
            % (
                host,
                ", ".join(decision["packages"]),
                facts.get("pkg_mgr") or "unknown",
                decision["pkg_mgr"] or "apt or dnf",
            ),
            facts,
        )
    return decision
