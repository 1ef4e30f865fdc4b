# SPDX-License-Identifier: GPL-3.0-or-later
"""The node's Python for its own boot validation (module_utils/runtime/_node_python.py, filter
node_python, module node_python_info's probe): the one rule, on the real ``ansible_facts`` of each
supported release (tests/data/ansible-facts/, SOURCE says where each comes from) and, where a real
node's answer was recorded, on what the probe really found there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.filter.node_python import node_python
from ansible_collections.gpufleet.node.plugins.module_utils.runtime import _node_python as np

DATA = Path(__file__).resolve().parents[1] / "data" / "ansible-facts"


def facts(release):
    """``ansible_facts`` as a role sees them (setup's ``ansible_`` prefix off)."""
    raw = json.loads((DATA / ("%s.json" % release)).read_text())["ansible_facts"]
    return {k[len("ansible_") :] if k.startswith("ansible_") else k: v for k, v in raw.items()}


def fresh(release):
    """What node_python_info finds on a fresh install of the release: the recorded answer of a real
    root filesystem where there is one, else the release's own Python as its facts name it,
    without venv (a cloud image's default), found as the probe finds it: under its versioned name
    when that is a candidate (python3.11-3.13; /usr/bin/python3 is a link to it on Debian and
    Ubuntu, as debian-13.node_python_info.json shows), and as python3."""
    recorded = DATA / ("%s.node_python_info.json" % release)
    if recorded.exists():
        return json.loads(recorded.read_text())["interpreters"]
    python = facts(release)["python"]
    version = [python["version"][k] for k in ("major", "minor", "micro")]
    versioned = "python%d.%d" % tuple(version[:2])
    found = []
    if versioned in np.CANDIDATES:
        found.append({"name": versioned, "path": "/usr/bin/" + versioned, "version": version, "venv": False})
    found.append({"name": "python3", "path": "/usr/bin/python3", "version": version, "venv": False})
    assert python["executable"] in [f["path"] for f in found], python
    return found


# release: (how, python, packages, pkg_mgr) on a fresh node; refused: the texts the message holds
TABLE = {
    "debian-11": ("refused", "", [], ""),
    "debian-12": ("found+venv", "/usr/bin/python3.11", ["python3-venv"], "apt"),
    "debian-13": ("found+venv", "/usr/bin/python3.13", ["python3-venv"], "apt"),
    "ubuntu-22.04": ("package", "/usr/bin/python3.11", ["python3.11", "python3.11-venv"], "apt"),
    "ubuntu-24.04": ("found+venv", "/usr/bin/python3.12", ["python3-venv"], "apt"),
    "rhel-9": ("package", "/usr/bin/python3.11", ["python3.11"], "dnf"),
}


def test_every_release_has_its_facts_and_its_source():
    source = (DATA / "SOURCE").read_text()
    for release in TABLE:
        assert (DATA / ("%s.json" % release)).is_file(), release
        assert "%s.json" % release in source, "SOURCE does not say where %s.json comes from" % release
    releases = {p.name[: -len(".json")] for p in DATA.glob("*.json") if not p.name.endswith(".node_python_info.json")}
    assert releases == set(TABLE), "a release without a row"


@pytest.mark.parametrize("release", sorted(TABLE))
def test_the_decision_on_a_fresh_node_of_each_release(release):
    how, python, packages, pkg_mgr = TABLE[release]
    decision = node_python(facts(release), fresh(release), host="node7")
    assert (decision["how"], decision["python"], decision["packages"], decision["pkg_mgr"]) == (
        how,
        python,
        packages,
        pkg_mgr,
    )
    assert bool(decision["refused"]) == (how == "refused")


@pytest.mark.parametrize("release", [r for r, row in sorted(TABLE.items()) if row[0] != "refused"])
def test_a_second_run_after_the_install_installs_nothing(release):
    """What the first run installed is what the second run finds: the same interpreter, ready."""
    first = node_python(facts(release), fresh(release))
    version = [int(v) for v in (first["version"] or "3.11.0").split(".")]
    name = first["python"].rsplit("/", 1)[-1]
    found = [f for f in fresh(release) if f["path"] != first["python"]]
    found.insert(0, {"name": name, "path": first["python"], "version": version, "venv": True})
    second = node_python(facts(release), found)
    assert (second["how"], second["python"], second["packages"], second["pkg_mgr"]) == (
        "found",
        first["python"],
        [],
        "",
    )


def test_debian_11_is_refused_with_what_it_has_what_is_needed_and_what_to_do():
    decision = node_python(facts("debian-11"), fresh("debian-11"), host="node7")
    msg = decision["refused"]
    for text in (
        "node7 cannot run its own boot validation",
        "python3 3.9.2 (/usr/bin/python3)",  # the node's Python, as the probe found it
        "Python 3.11-3.13 (what ansible-core 2.19 runs on)",  # what is needed
        "Debian 11.11 has no package of one",
        "Point boot_validation_venv_python at a Python 3.11-3.13",  # the variable
        "gpufleet_boot_validation=false",
    ):
        assert text in msg, (text, msg)
    assert decision["packages"] == [] and decision["python"] == ""


def test_an_operator_python_on_debian_11_is_used():
    found = fresh("debian-11") + [
        {
            "name": "/opt/python3.12/bin/python3.12",
            "path": "/opt/python3.12/bin/python3.12",
            "version": [3, 12, 8],
            "venv": True,
        }
    ]
    decision = node_python(facts("debian-11"), found, "/opt/python3.12/bin/python3.12")
    assert (decision["how"], decision["python"], decision["packages"]) == (
        "requested",
        "/opt/python3.12/bin/python3.12",
        [],
    )
    # not asked for, a newer one on the node is found too (the role probes the defaults only)
    found = fresh("debian-11") + [
        {"name": "python3.11", "path": "/usr/local/bin/python3.11", "version": [3, 11, 9], "venv": True}
    ]
    assert node_python(facts("debian-11"), found)["python"] == "/usr/local/bin/python3.11"


@pytest.mark.parametrize(
    "found, requested, text",
    [
        (
            [],
            "/opt/py/bin/python3",
            "boot_validation_venv_python=/opt/py/bin/python3 is not an executable Python on node7",
        ),
        (
            [{"name": "/usr/bin/python3", "path": "/usr/bin/python3", "version": [3, 9, 2], "venv": True}],
            "/usr/bin/python3",
            "boot_validation_venv_python=/usr/bin/python3 is Python 3.9.2; the node's run needs Python 3.11-3.13",
        ),
        (
            [{"name": "/opt/py/bin/python3", "path": "/opt/py/bin/python3", "version": [3, 14, 0], "venv": True}],
            "/opt/py/bin/python3",
            "is Python 3.14.0; the node's run needs Python 3.11-3.13",
        ),
        (
            [{"name": "/opt/py/bin/python3", "path": "/opt/py/bin/python3", "version": [3, 12, 1], "venv": False}],
            "/opt/py/bin/python3",
            "/opt/py/bin/python3 3.12.1 (/opt/py/bin/python3) has no venv module (ensurepip)",
        ),
    ],
)
def test_an_operator_python_that_cannot_serve_is_refused(found, requested, text):
    decision = node_python(facts("debian-11"), found, requested, "node7")
    assert decision["how"] == "refused" and text in decision["refused"], decision["refused"]
    assert decision["packages"] == []


def test_a_system_python_without_venv_gets_its_own_venv_package():
    """The release's default Python gets python3-venv (which follows the default), another one
    of the distribution's its python3.X-venv."""
    assert np.venv_package({"os_family": "Debian"}, "/usr/bin/python3") == "python3-venv"
    assert np.venv_package({"os_family": "Debian"}, "/usr/bin/python3.11") == "python3.11-venv"
    default = [{"name": "python3", "path": "/usr/bin/python3", "version": [3, 11, 2], "venv": False}]
    assert np.venv_package({"os_family": "Debian"}, "/usr/bin/python3.11", default) == "python3-venv"
    assert np.venv_package({"os_family": "Debian"}, "/usr/bin/python3.12", default) == "python3.12-venv"
    assert np.venv_package({"os_family": "Debian"}, "/usr/local/bin/python3.11") == ""
    assert np.venv_package({"os_family": "RedHat"}, "/usr/bin/python3.11") == ""
    decision = node_python(
        facts("debian-11"),
        [{"name": "/usr/bin/python3.11", "path": "/usr/bin/python3.11", "version": [3, 11, 2], "venv": False}],
        "/usr/bin/python3.11",
    )
    assert (decision["how"], decision["packages"], decision["pkg_mgr"]) == (
        "requested+venv",
        ["python3.11-venv"],
        "apt",
    )


def test_a_ready_interpreter_wins_over_a_newer_one_that_needs_a_package():
    found = [
        {"name": "python3.13", "path": "/usr/bin/python3.13", "version": [3, 13, 5], "venv": False},
        {"name": "python3.12", "path": "/usr/bin/python3.12", "version": [3, 12, 3], "venv": True},
        {"name": "python3", "path": "/usr/bin/python3", "version": [3, 12, 3], "venv": True},
    ]
    assert node_python(facts("debian-13"), found)["python"] == "/usr/bin/python3.12"
    found[1]["venv"] = found[2]["venv"] = False
    assert node_python(facts("debian-13"), found)["packages"] == ["python3.13-venv"]  # not the default


def test_python_3_14_does_not_count():
    found = [{"name": "python3", "path": "/usr/bin/python3", "version": [3, 14, 0], "venv": True}]
    decision = node_python(facts("debian-13"), found, host="node7")
    assert decision["how"] == "refused"
    assert (
        "python3 3.14.0 (/usr/bin/python3)" in decision["refused"]
        and "Debian 13.8 has no package" in decision["refused"]
    )


def test_packages_only_through_the_family_package_manager():
    """A node whose facts name another package manager than its family's is refused, not half-served."""
    odd = dict(facts("debian-13"), pkg_mgr="unknown")
    decision = node_python(odd, fresh("debian-13"), host="node7")
    assert decision["how"] == "refused"
    assert "node7 needs python3-venv installed, but its package manager is unknown, not apt" in decision["refused"]
    # nothing to install: no package manager needed
    ready = [dict(f, venv=True) for f in fresh("debian-13")]
    assert node_python(odd, ready)["how"] == "found"


def test_an_unknown_system_without_a_new_python_is_refused_naming_the_facts_python():
    decision = node_python(
        {"python": {"executable": "/usr/bin/python3", "version": {"major": 3, "minor": 8, "micro": 10}}}, []
    )
    assert "only python3 3.8.10 (/usr/bin/python3)" in decision["refused"]
    assert "an unknown system has no package of one" in decision["refused"]


def test_the_filter_refuses_what_is_not_facts_and_probe_results():
    with pytest.raises(AnsibleFilterError, match="expects the node's ansible_facts"):
        node_python("Debian", [])
    with pytest.raises(AnsibleFilterError, match="node_python_info's interpreters"):
        node_python({}, [{"name": "python3"}])


def test_the_probe_answers_as_parse_probe_reads_it():
    """The probe run by a real interpreter (this one, isolated as the module runs it)."""
    out = subprocess.run([sys.executable, "-I", "-c", np.PROBE], capture_output=True, text=True, check=True).stdout
    entry = np.parse_probe("python3", sys.executable, out)
    assert entry["version"] == list(sys.version_info[:3])
    assert entry["venv"] is True  # this interpreter makes the test venvs
    for bad in ("", "Python 3.11.2\n", '{"version": [3, 11], "venv": true}', '{"version": [3, 11, 2], "venv": "yes"}'):
        with pytest.raises(np.ProbeError, match="did not answer the probe"):
            np.parse_probe("python3", "/usr/bin/python3", bad)


def test_the_module_reports_each_interpreter_once_and_the_unusable_ones(tmp_path):
    """node_python_info as Ansible runs it: a name is looked up in PATH, a path taken as it is;
    the same path once; a candidate that does not run the probe (a pyenv shim of an unselected
    version) is unusable with why; one that is not there is left out. Check mode runs the same."""
    from tests.harness.modules import run_module

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3.12").symlink_to(sys.executable)
    shim = bindir / "python3.13"
    shim.write_text("#!/bin/sh\necho 'pyenv: python3.13: command not found' >&2\nexit 127\n")
    shim.chmod(0o755)
    args = {"candidates": ["python3.13", "python3.12", str(bindir / "python3.12"), "python3.11x", "/nowhere/python3"]}
    for check_mode in (False, True):
        result = run_module("node_python_info", args, check_mode=check_mode, env={"PATH": str(bindir)})
        assert result.get("failed") is not True and result["changed"] is False, result
        assert result["interpreters"] == [
            {
                "name": "python3.12",
                "path": str(bindir / "python3.12"),
                "version": list(sys.version_info[:3]),
                "venv": True,
            }
        ]
        assert result["unusable"] == [
            {"name": "python3.13", "path": str(shim), "error": "exit 127: pyenv: python3.13: command not found"}
        ]
