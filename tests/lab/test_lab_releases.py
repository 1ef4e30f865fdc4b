# SPDX-License-Identifier: GPL-3.0-or-later
"""Lab nodes of other Debian releases (`lab up --os`): each boots on its release's own root
filesystem (lab/rootfs.py), shares nothing with the controller's, and still runs the stand-ins
(under the lab's own Python, bound in), and `lab status --json` names its `os` and `python`.

On a lab of its own (module scope): node1 trixie, node2 bullseye, both ``l40s-4x-switch``; the
planning of `--os` (a list cycled over the nodes, bookworm by default) is checked without a lab.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab import rootfs
from lab.fleet import plan_releases
from lab.preflight import LabError
from tests.harness.lab import Lab, own_lab

RELEASES = ("trixie", "bullseye")
PROFILE = "l40s-4x-switch"
#: What /etc/os-release and python3 of each release say (Debian 13: 3.13, Debian 11: 3.9).
EXPECTED = {"trixie": ("13", "3.13."), "bullseye": ("11", "3.9.")}


def test_plan_cycles_the_releases_over_the_nodes():
    assert plan_releases(3, ["bookworm", "trixie"]) == ["bookworm", "trixie", "bookworm"]


def test_plan_defaults_to_the_controllers_release():
    assert plan_releases(2) == ["bookworm", "bookworm"]


def test_plan_refuses_an_unknown_release():
    with pytest.raises(LabError, match=r"unknown --os buster; the lab's nodes run: bullseye, bookworm, trixie"):
        plan_releases(1, ["trixie", "buster"])


def test_node_spec_names_its_release(tmp_path):
    import ipaddress

    from lab.fleet import Fleet

    net = ipaddress.ip_network("10.213.7.0/24")
    assert Fleet(tmp_path)._node_spec(0, "node1", PROFILE, net, "bullseye")["os"] == "bullseye"
    assert Fleet(tmp_path)._node_spec(1, "node2", PROFILE, net)["os"] == "bookworm"


def test_rootfs_key_follows_the_release_the_packages_and_the_builder(monkeypatch):
    keys = {rootfs.key("trixie"), rootfs.key("bullseye")}
    monkeypatch.setattr(rootfs, "BASE_PACKAGES", (*rootfs.BASE_PACKAGES, "vim"))
    keys.add(rootfs.key("trixie"))
    monkeypatch.setattr(rootfs, "BUILDER_VERSION", rootfs.BUILDER_VERSION + 1)
    keys.add(rootfs.key("trixie"))
    assert len(keys) == 4
    assert rootfs.path("trixie").name == f"rootfs-trixie-{rootfs.key('trixie')}"


def test_rootfs_refuses_an_unknown_release_and_the_controllers_own():
    with pytest.raises(LabError, match=r"unknown Debian release 'buster'; the lab's nodes run: bullseye, bookworm"):
        rootfs.ensure("buster")
    with pytest.raises(LabError, match="bookworm nodes run on the controller's own root"):
        rootfs.ensure("bookworm")


def test_rootfs_build_names_the_missing_packages(monkeypatch, tmp_path):
    from lab import preflight

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing built there
    monkeypatch.setattr(
        preflight, "which", lambda prog: None if prog in ("debootstrap", "chroot") else f"/usr/bin/{prog}"
    )
    with pytest.raises(LabError, match=r"needs the Debian package\(s\) coreutils debootstrap: apt-get install"):
        rootfs.ensure("trixie")
    assert not list(tmp_path.rglob("rootfs-*")), "nothing may be made before the check"


def test_rootfs_archive_index_is_what_apt_reads(tmp_path):
    """Packages and Release of the nodes' local archive, for a real .deb made by dpkg-deb."""
    import hashlib
    import subprocess

    pkg = tmp_path / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN/control").write_text(
        "Package: gpufleet-probe\nVersion: 1.0-1\nArchitecture: all\nMaintainer: lab <lab@example.org>\n"
        "Description: probe\n"
    )
    archive = tmp_path / "archive"
    archive.mkdir()
    subprocess.run(["dpkg-deb", "--build", str(pkg), str(archive / "gpufleet-probe_1.0-1_all.deb")], check=True)
    rootfs._archive_index(archive)
    packages = (archive / "Packages").read_text()
    data = (archive / "gpufleet-probe_1.0-1_all.deb").read_bytes()
    fields = dict(line.split(": ", 1) for line in packages.splitlines() if ": " in line)
    assert fields["Package"] == "gpufleet-probe" and fields["Version"] == "1.0-1"
    assert fields["Filename"] == "./gpufleet-probe_1.0-1_all.deb"
    assert fields["Size"] == str(len(data)) and fields["SHA256"] == hashlib.sha256(data).hexdigest()
    release = (archive / "Release").read_text()
    digest = hashlib.sha256((archive / "Packages").read_bytes()).hexdigest()
    assert f" {digest} {len(packages.encode())} Packages" in release.splitlines()


def test_rootfs_interpreter_resolves_links_inside_the_tree(monkeypatch, tmp_path):
    """The tree's own python3 and loader, with absolute links taken inside the tree, never the
    controller's."""
    import os

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    root = rootfs.path("bullseye") / "root"
    for d in ("usr/bin", "usr/lib/x86_64-linux-gnu", "usr/lib64"):
        (root / d).mkdir(parents=True)
    os.symlink("usr/lib", root / "lib")
    os.symlink("usr/lib64", root / "lib64")
    (root / "usr/bin/python3.9").write_text("")
    os.symlink("python3.9", root / "usr/bin/python3")
    (root / "usr/lib/x86_64-linux-gnu/ld-2.31.so").write_text("")
    os.symlink("/lib/x86_64-linux-gnu/ld-2.31.so", root / "usr/lib64/ld-linux-x86-64.so.2")
    argv = rootfs.interpreter("bullseye")
    assert argv[0] == str(root / "usr/lib/x86_64-linux-gnu/ld-2.31.so")
    assert argv[1] == "--library-path"
    assert argv[2].split(":") == [str(root / "lib/x86_64-linux-gnu"), str(root / "usr/lib/x86_64-linux-gnu")]
    assert argv[3] == str(root / "usr/bin/python3.9")


def _fake_tree(directory):
    (directory / "root" / "usr").mkdir(parents=True)
    (directory / "build.json").write_text("{}\n")
    (directory.parent / f"{directory.name}.lock").write_text("")
    return directory


def test_rootfs_prune_removes_the_releases_other_versions_only(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    current = _fake_tree(rootfs.path("trixie"))
    old = _fake_tree(current.parent / "rootfs-trixie-000000000000")
    building = current.parent / "rootfs-trixie-111111111111.tmp.abcdef"
    (building / "root").mkdir(parents=True)
    other_release = _fake_tree(current.parent / "rootfs-bullseye-000000000000")
    said = []
    assert rootfs.prune("trixie", log=said.append) == [old]
    assert not old.exists() and not (old.parent / f"{old.name}.lock").exists()
    assert current.is_dir() and building.is_dir() and other_release.is_dir()
    assert said == [f"rootfs: removed {old} (an older version of the trixie tree)"]


def test_rootfs_prune_keeps_a_tree_in_use_or_being_built(monkeypatch, tmp_path):
    import fcntl

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    mounted = _fake_tree(rootfs.cache_dir() / "rootfs-bullseye-000000000000")
    locked = _fake_tree(rootfs.cache_dir() / "rootfs-bullseye-111111111111")
    monkeypatch.setattr(rootfs, "_in_use", lambda directory: directory == mounted)
    said = []
    with open(locked.parent / f"{locked.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert rootfs.prune("bullseye", log=said.append) == []
    assert mounted.is_dir() and locked.is_dir()
    assert said == [
        f"rootfs: kept {mounted}: a running lab node has it mounted (`python -m lab down` first)",
        f"rootfs: kept {locked}: it is being built",
    ]


def test_rootfs_in_use_reads_the_mount_tables(tmp_path):
    """A directory some process has a mount of (here: /proc, in this process's table) is in use;
    an unmounted one is not."""
    assert rootfs._in_use(Path("/proc"))
    assert not rootfs._in_use(tmp_path)


def test_rootfs_ensure_prunes_after_a_build(monkeypatch, tmp_path):
    from lab import preflight

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    old = _fake_tree(rootfs.cache_dir() / "rootfs-trixie-000000000000")
    monkeypatch.setattr(preflight, "builder_programs", lambda: {})

    def build(release, progs, tmp, log):
        (tmp / "root").mkdir()
        record = {"release": release, "python": "3.13.5", "systemd": "257", "build_seconds": 1.0}
        (tmp / "build.json").write_text(json.dumps(record))
        return record

    monkeypatch.setattr(rootfs, "_build", build)
    said = []
    assert rootfs.ensure("trixie", log=said.append)["python"] == "3.13.5"
    assert rootfs.built("trixie") and not old.exists()
    assert f"rootfs: removed {old} (an older version of the trixie tree)" in said


class ReleasesLab(Lab):
    def up(self):
        # a root filesystem not cached yet is built first (about 2 minutes; setup.sh starts them)
        super().up("--os", ",".join(RELEASES), timeout=900)


@pytest.fixture(scope="module")
def releases_lab():
    with own_lab([PROFILE] * len(RELEASES), "releases", lab_class=ReleasesLab) as lab:
        yield lab


def _in_node(lab, node, *argv):
    proc = lab.fleet.machine(node).nsenter(*argv, timeout=60)
    assert proc.returncode == 0, f"{node}: {argv} exited {proc.returncode}: {proc.stdout}{proc.stderr}"
    return proc.stdout


@pytest.mark.needs_lab
def test_status_names_each_nodes_release_and_python(releases_lab):
    status = json.loads(releases_lab.lab("status", "--json").stdout)
    nodes = {n["name"]: n for n in status["nodes"]}
    for i, release in enumerate(RELEASES):
        node = nodes[f"node{i + 1}"]
        assert node["os"] == release
        assert node["python"] == rootfs.built(release)["python"]
        assert node["python"].startswith(EXPECTED[release][1])
        assert node["state"] == "running", node
    text = releases_lab.lab("status").stdout
    assert f"trixie (Python {nodes['node1']['python']})" in text


@pytest.mark.needs_lab
@pytest.mark.parametrize("index", range(len(RELEASES)), ids=RELEASES)
def test_node_runs_its_release_and_shares_nothing_with_the_controller(releases_lab, index):
    node, release = f"node{index + 1}", RELEASES[index]
    os_release = _in_node(releases_lab, node, "cat", "/etc/os-release")
    assert f'VERSION_ID="{EXPECTED[release][0]}"' in os_release.splitlines()
    assert f"VERSION_CODENAME={release}" in os_release.splitlines()
    assert _in_node(
        releases_lab, node, "python3", "-c", "import platform; print(platform.python_version())"
    ).startswith(EXPECTED[release][1])
    # Programs of the controller's root (its HAProxy, Prometheus) and what the roles install
    # (pciutils, the node exporter) are not there before a role installs them.
    absent = _in_node(
        releases_lab,
        node,
        "sh",
        "-c",
        "for p in haproxy prometheus lspci setpci prometheus-node-exporter debootstrap; do "
        "command -v $p >/dev/null || echo $p; done",
    )
    assert absent.split() == ["haproxy", "prometheus", "lspci", "setpci", "prometheus-node-exporter", "debootstrap"]
    assert _in_node(releases_lab, node, "systemctl", "is-system-running").strip() == "running"
    # The node's only apt source is its local archive of the release's packages the roles install.
    plan_ = _in_node(releases_lab, node, "apt-get", "-s", "-q", "install", *rootfs.ROLE_PACKAGES)
    assert "Inst pciutils" in plan_ and "gpufleet-lab" in plan_


@pytest.mark.needs_lab
@pytest.mark.parametrize("index", range(len(RELEASES)), ids=RELEASES)
def test_standins_run_under_the_labs_python(releases_lab, index):
    node = f"node{index + 1}"
    listing = _in_node(releases_lab, node, "nvidia-smi", "-L")
    assert listing.count("NVIDIA L40S") == 4, listing
    wrapper = _in_node(releases_lab, node, "cat", "/usr/local/bin/nvidia-smi")
    assert "/lab/controller/usr/bin/python3" in wrapper and "--library-path" in wrapper
    # the controller's /usr is read-only in the node
    proc = releases_lab.fleet.machine(node).nsenter("touch", "/lab/controller/usr/gpufleet-write-test", timeout=30)
    assert proc.returncode != 0 and "Read-only file system" in proc.stderr
