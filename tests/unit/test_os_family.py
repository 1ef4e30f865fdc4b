# SPDX-License-Identifier: GPL-3.0-or-later
"""The OS family paths (module_utils/common/_os_family.py, filter kernel_param_plan), chosen from
the real ``ansible_facts`` of each supported release (tests/data/ansible-facts/): apt and a GRUB
drop-in with update-grub on the Debian family, dnf and grubby on the RHEL family; grubby's plan on a
real ``grubby --info=ALL`` (tests/data/grubby/, SOURCE there). The RHEL branch cannot run here: this
is where it is tested."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.filter.os_family import kernel_param_plan, os_family_paths, os_packages
from ansible_collections.gpufleet.node.plugins.module_utils.common import _os_family
from tests.unit.test_node_python import TABLE, facts

GRUBBY = (Path(__file__).resolve().parents[1] / "data" / "grubby" / "rhel-9.1-info-all.txt").read_text()
PARAM = "pci=disable_acs_redir=0000:40:01.1;0000:42:00.0"
KERNELS = [
    "/boot/vmlinuz-5.14.0-162.6.1.el9_1.x86_64",
    "/boot/vmlinuz-5.14.0-70.13.1.el9_0.x86_64",
    "/boot/vmlinuz-0-rescue-4d684a4a6166439a867e701ded4f7e10",
]

DEBIAN = ("Debian", "apt", "grub_dropin", "/usr/bin/setpci")
PATHS = {
    "debian-11": DEBIAN,
    "debian-12": DEBIAN,
    "debian-13": DEBIAN,
    "ubuntu-22.04": DEBIAN,
    "ubuntu-24.04": DEBIAN,
    "rhel-9": ("RedHat", "dnf", "grubby", "/usr/sbin/setpci"),
}


def test_every_release_of_the_table_has_its_paths():
    assert set(PATHS) == set(TABLE)


@pytest.mark.parametrize("release", sorted(PATHS))
def test_the_paths_of_each_release_come_from_its_facts(release):
    family, pkg_mgr, route, setpci = PATHS[release]
    expected = {"family": family, "pkg_mgr": pkg_mgr, "kernel_param": route, "setpci": setpci}
    assert _os_family.paths(facts(release)) == expected == os_family_paths(facts(release))
    assert _os_family.package_manager(facts(release)) == pkg_mgr
    assert facts(release)["pkg_mgr"] == pkg_mgr  # what setup itself says on that release
    plan = kernel_param_plan(facts(release), PARAM, GRUBBY if route == "grubby" else "")
    assert (plan["family"], plan["route"]) == (family, route)
    if route == "grub_dropin":
        assert plan["commands"] == []  # the drop-in and update-grub are the role's own tasks


def test_another_family_is_refused_naming_the_system():
    suse = {"os_family": "Suse", "distribution": "SLES", "distribution_version": "15.6"}
    with pytest.raises(_os_family.UnsupportedFamily, match=r"SLES 15.6 \(OS family Suse\) is not a system"):
        _os_family.paths(suse)
    with pytest.raises(AnsibleFilterError, match="the Debian and RedHat families"):
        kernel_param_plan(suse, PARAM)
    with pytest.raises(AnsibleFilterError, match="os_family_paths: SLES 15.6"):
        os_family_paths(suse)
    assert _os_family.package_manager(suse) == ""


def test_grubby_entries_are_read_by_their_labels():
    entries = _os_family.grubby_entries(GRUBBY)
    assert [e["kernel"] for e in entries] == KERNELS
    assert entries[0]["args"][:2] == ["ro", "crashkernel=1G-4G:192M,4G-64G:256M,64G-:512M"]
    assert entries[0]["args"][-1] == "retbleed=stuff"
    with pytest.raises(ValueError, match="no boot entry"):
        _os_family.grubby_entries("grubby: command not found\n")


def test_every_installed_kernel_gets_the_parameter_quoted():
    plan = kernel_param_plan(facts("rhel-9"), PARAM, GRUBBY)
    assert plan["commands"] == [["grubby", "--update-kernel=ALL", '--args="%s"' % PARAM]]


def test_only_the_entries_that_lack_it_are_changed():
    """A kernel installed after the parameter was set (the first entry) gets it alone."""
    lines = _with_args(GRUBBY, '"%s"' % PARAM).splitlines()
    lines[2] = next(line for line in GRUBBY.splitlines() if line.startswith('args="'))
    commands = kernel_param_plan(facts("rhel-9"), PARAM, "\n".join(lines))["commands"]
    assert commands == [["grubby", "--update-kernel=%s" % KERNELS[0], '--args="%s"' % PARAM]]


def _with_args(text, extra):
    """The grubby listing after grubby added ``extra`` to every entry's args."""
    return "\n".join(line[:-1] + " " + extra + '"' if line.startswith('args="') else line for line in text.splitlines())


def test_a_second_run_changes_nothing():
    done = _with_args(GRUBBY, '"%s"' % PARAM)
    assert kernel_param_plan(facts("rhel-9"), PARAM, done)["commands"] == []
    # grubby may have stored it without the quotes
    assert kernel_param_plan(facts("rhel-9"), PARAM, _with_args(GRUBBY, PARAM))["commands"] == []


def test_another_bridge_set_replaces_the_old_one_and_other_pci_options_stay():
    """grubby replaces an argument by its name: the entry's pci= options become one word, the
    other options kept, the old ACS list replaced."""
    old = _with_args(GRUBBY, 'pci=noaer "pci=disable_acs_redir=0000:40:01.1"')
    commands = kernel_param_plan(facts("rhel-9"), PARAM, old)["commands"]
    assert commands == [
        [
            "grubby",
            "--update-kernel=ALL",
            '--remove-args=pci=noaer "pci=disable_acs_redir=0000:40:01.1"',
            '--args="pci=noaer,%s"' % PARAM[len("pci=") :],
        ]
    ]
    done = _with_args(GRUBBY, '"pci=noaer,%s"' % PARAM[len("pci=") :])
    assert kernel_param_plan(facts("rhel-9"), PARAM, done)["commands"] == []


def test_only_an_acs_kernel_parameter_is_planned():
    with pytest.raises(AnsibleFilterError, match="is not a pci=disable_acs_redir= kernel parameter"):
        kernel_param_plan(facts("rhel-9"), "iommu=pt", GRUBBY)
    with pytest.raises(AnsibleFilterError, match="expects the node's ansible_facts"):
        kernel_param_plan("RedHat", PARAM)


# --- the packages the roles install (filter os_packages; roles monitoring, worker_recycle) -------
DEBIAN_PACKAGES = {
    "node_exporter": ["prometheus-node-exporter"],
    "prometheus_client": ["python3-prometheus-client"],
    "prometheus": ["prometheus"],
    "pciutils": ["pciutils"],
}
RHEL_PACKAGES = {"node_exporter": None, "prometheus_client": None, "prometheus": None, "pciutils": ["pciutils"]}
RELEASE_PACKAGES = {release: DEBIAN_PACKAGES for release in PATHS if release != "rhel-9"} | {"rhel-9": RHEL_PACKAGES}


@pytest.mark.parametrize("release", sorted(RELEASE_PACKAGES))
@pytest.mark.parametrize("what", sorted(DEBIAN_PACKAGES))
def test_the_packages_of_each_release_come_from_its_facts(release, what):
    expected = RELEASE_PACKAGES[release][what]
    plan = os_packages(facts(release), what, None, "the_var", ", or the_switch=false")
    assert plan["family"] == PATHS[release][0]
    assert plan["pkg_mgr"] == PATHS[release][1] == facts(release)["pkg_mgr"]
    if expected is None:
        assert plan["packages"] == []
        assert plan["refused"].startswith(
            "RedHat 9.8 (OS family RedHat) has no package for %s in its base repositories" % what
        )
        assert plan["refused"].endswith(
            ": set the_var to the package(s) that provide it from a repository the node has, or the_switch=false"
        )
    else:
        query = _os_family.QUERIES[PATHS[release][1]] + expected
        assert plan == {
            "family": PATHS[release][0],
            "pkg_mgr": PATHS[release][1],
            "packages": expected,
            "refused": "",
            "query": query,
        }


def test_rhel_is_told_where_the_packages_are():
    assert "(EPEL 9 has it as node-exporter)" in os_packages(facts("rhel-9"), "node_exporter")["refused"]
    assert (
        "(EPEL 9 has it as python3-prometheus_client)" in os_packages(facts("rhel-9"), "prometheus_client")["refused"]
    )


@pytest.mark.parametrize("override", ["node-exporter", ["node-exporter"]])
def test_the_operators_package_is_installed_instead(override):
    plan = os_packages(facts("rhel-9"), "node_exporter", override, "monitoring_node_exporter_package")
    assert plan == {
        "family": "RedHat",
        "pkg_mgr": "dnf",
        "packages": ["node-exporter"],
        "refused": "",
        "query": ["rpm", "--query", "--queryformat=installed\\n", "node-exporter"],
    }
    debian = os_packages(facts("debian-12"), "prometheus_client", ["python3-prometheus-client", "python3-yaml"])
    assert debian["packages"] == ["python3-prometheus-client", "python3-yaml"]
    # empty (the roles' defaults): the family's
    assert os_packages(facts("debian-12"), "node_exporter", "")["packages"] == ["prometheus-node-exporter"]
    assert os_packages(facts("debian-12"), "node_exporter", [])["packages"] == ["prometheus-node-exporter"]


def test_another_family_gets_no_packages_and_is_refused_even_with_an_override():
    suse = {"os_family": "Suse", "distribution": "SLES", "distribution_version": "15.6"}
    plan = os_packages(suse, "node_exporter", "golang-github-prometheus-node_exporter")
    assert plan["pkg_mgr"] == "" and plan["packages"] == []
    assert plan["refused"] == (
        "SLES 15.6 (OS family Suse) is not a system the collection installs node_exporter on: "
        "it supports the Debian and RedHat families"
    )


def test_os_packages_refuses_what_it_has_no_table_for():
    with pytest.raises(
        AnsibleFilterError, match="'grafana' is none of node_exporter, pciutils, prometheus, prometheus_client"
    ):
        os_packages(facts("debian-12"), "grafana")
    with pytest.raises(AnsibleFilterError, match="monitoring_node_exporter_package must be a package name or a list"):
        os_packages(facts("debian-12"), "node_exporter", {"name": "x"}, "monitoring_node_exporter_package")
    with pytest.raises(AnsibleFilterError, match="expects the node's ansible_facts"):
        os_packages("Debian", "node_exporter")


# --- check mode's diff of the grubby route -------------------------------------------------------
def test_the_diff_shows_each_entry_before_and_after_the_commands():
    plan = kernel_param_plan(facts("rhel-9"), PARAM, GRUBBY)
    before, after = plan["diff"]["before"].splitlines(), plan["diff"]["after"].splitlines()
    assert [line for line in before if line.startswith("kernel=")] == ['kernel="%s"' % k for k in KERNELS]
    assert [line for line in after if line.startswith("kernel=")] == ['kernel="%s"' % k for k in KERNELS]
    for old, new in zip(before[1::2], after[1::2], strict=True):
        assert new == old[:-1] + ' "%s""' % PARAM  # grubby's --args adds it at the end
    # what the diff's after shows is what the commands leave: nothing to do from there
    done = _with_args(GRUBBY, '"%s"' % PARAM)
    assert kernel_param_plan(facts("rhel-9"), PARAM, done)["commands"] == []
    assert _os_family.grubby_diff(done, PARAM)["after"].splitlines()[1::2] == after[1::2]


def test_the_diff_changes_only_the_entries_the_commands_change():
    lines = _with_args(GRUBBY, '"%s"' % PARAM).splitlines()
    lines[2] = next(line for line in GRUBBY.splitlines() if line.startswith('args="'))
    diff = kernel_param_plan(facts("rhel-9"), PARAM, "\n".join(lines))["diff"]
    before, after = diff["before"].splitlines(), diff["after"].splitlines()
    assert [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b] == [1]  # the first entry's args
    # an old bridge list and another pci= option become the one word the command writes
    old = _with_args(GRUBBY, 'pci=noaer "pci=disable_acs_redir=0000:40:01.1"')
    after = _os_family.grubby_diff(old, PARAM)["after"].splitlines()[1]
    assert after.endswith('retbleed=stuff "pci=noaer,%s""' % PARAM[len("pci=") :])
    assert 'pci=disable_acs_redir=0000:40:01.1"' not in after


def test_the_debian_route_and_an_unread_listing_have_no_diff():
    assert kernel_param_plan(facts("debian-12"), PARAM)["diff"] == {}
    assert kernel_param_plan(facts("rhel-9"), PARAM, "")["diff"] == {}


# --- only where missing (filter os_packages_missing) ----------------------------------------------


@pytest.mark.parametrize(
    ("release", "argv0"), [("debian-12", "dpkg-query"), ("ubuntu-22.04", "dpkg-query"), ("rhel-9", "rpm")]
)
def test_the_plan_carries_the_query_of_its_package_manager(release, argv0):
    plan = os_packages(facts(release), "pciutils")
    assert plan["query"][0] == argv0 and plan["query"][-1] == "pciutils"


def test_a_refused_plan_has_no_query():
    assert os_packages(facts("rhel-9"), "node_exporter")["query"] == []


@pytest.mark.parametrize(
    ("rc", "stdout", "missing"),
    [
        (0, "installed\ninstalled\n", False),
        (0, "installed\nconfig-files\n", True),  # removed, its configuration kept
        (1, "installed\n", True),  # dpkg-query: one name unknown (its error goes to stderr)
        (1, "installed\npackage b is not installed\n", True),  # rpm
        (0, "installed\n", True),  # a line short
        (None, "", True),  # the query could not run
        (127, "", True),
    ],
)
def test_only_a_query_that_finds_every_package_installed_skips_the_package_manager(rc, stdout, missing):
    from ansible_collections.gpufleet.node.plugins.filter.os_family import os_packages_missing

    plan = os_packages(facts("debian-12"), "pciutils", ["a", "b"])
    assert os_packages_missing({"rc": rc, "stdout": stdout}, plan) is missing


def test_a_skipped_query_is_refused_and_no_packages_need_none():
    from ansible.errors import AnsibleFilterError

    from ansible_collections.gpufleet.node.plugins.filter.os_family import os_packages_missing

    plan = os_packages(facts("debian-12"), "pciutils")
    with pytest.raises(AnsibleFilterError, match="skipped"):
        os_packages_missing({"skipped": True}, plan)
    assert os_packages_missing({"skipped": True}, os_packages(facts("rhel-9"), "node_exporter")) is False


def test_the_query_reads_this_machines_package_database():
    """The Debian query against the real dpkg of this machine: an installed package and an unknown one."""
    import shutil
    import subprocess

    from ansible_collections.gpufleet.node.plugins.filter.os_family import os_packages_missing

    if not shutil.which("dpkg-query"):
        pytest.skip("no dpkg-query on this machine")
    for names, missing in ((["python3"], False), (["python3", "gpufleet-no-such-package"], True)):
        plan = os_packages(facts("debian-12"), "pciutils", names)
        done = subprocess.run(plan["query"], capture_output=True, text=True, check=False)
        assert os_packages_missing({"rc": done.returncode, "stdout": done.stdout}, plan) is missing, done
