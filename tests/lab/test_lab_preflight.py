# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab's refusals: not root, a missing package, a namespace the kernel refuses; the fleet plan."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from lab import fleet as F
from lab import preflight
from lab.preflight import LabError

REPO = Path(__file__).resolve().parents[2]


def test_not_root_is_refused_before_anything_is_made():
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or not setpriv:
        pytest.skip("needs root and setpriv to drop to an unprivileged user")
    # The unprivileged user must be able to read the lab's code and write where the state would
    # go, wherever the checkout is (a `mktemp -d` clone or one under /root is 0700): the lab
    # package is copied to a world-readable directory and run from there with the base
    # interpreter (not the venv's, which may sit in the unreadable checkout).
    base = Path(tempfile.mkdtemp(prefix="gpufleet-not-root-"))
    try:
        base.chmod(0o755)
        shutil.copytree(REPO / "lab", base / "lab", ignore=shutil.ignore_patterns("__pycache__"))
        writable = base / "writable"
        writable.mkdir()
        writable.chmod(0o777)  # without the root check, `up` could make the state here
        state = writable / "state"
        python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        proc = subprocess.run(
            [
                setpriv,
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                python,
                "-m",
                "lab",
                "up",
                "--state-dir",
                str(state),
            ],
            cwd=base,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "must run as root" in proc.stderr
        assert not state.exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_not_root_message(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(LabError, match="must run as root"):
        preflight.require_root()


def test_missing_program_names_the_debian_package(monkeypatch):
    monkeypatch.setitem(preflight.PROGRAMS, "no-such-lab-program", "no-such-package")
    monkeypatch.setitem(preflight.PROGRAMS, "another-missing-one", "no-such-package")
    with pytest.raises(LabError) as err:
        preflight.programs()
    msg = str(err.value)
    assert "no-such-lab-program, another-missing-one (no-such-package)" in msg
    assert "apt-get install no-such-package" in msg


def test_missing_systemd_names_its_package(monkeypatch):
    monkeypatch.setattr(preflight, "SYSTEMD", "/nonexistent/systemd")
    with pytest.raises(LabError, match=r"/nonexistent/systemd \(systemd\).*apt-get install .*systemd"):
        preflight.programs()


def test_a_refused_namespace_is_named(tmp_path):
    fake = tmp_path / "unshare"
    # An unshare whose kernel refuses cgroup namespaces, as util-linux reports it.
    fake.write_text(
        '#!/bin/sh\nfor a in "$@"; do [ "$a" = --cgroup ] && '
        '{ echo "unshare: unshare failed: Operation not permitted" >&2; exit 1; }; done\nexit 0\n'
    )
    fake.chmod(0o755)
    with pytest.raises(LabError, match=r"refuses to create a cgroup namespace .*Operation not permitted"):
        preflight.namespaces(str(fake))


def test_the_namespaces_this_machine_gives(tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root")
    preflight.namespaces(shutil.which("unshare"))


def test_plan_cycles_the_default_fleet():
    assert F.plan() == [
        ("node1", "l40s-4x-switch"),
        ("node2", "l40s-4x-switch"),
        ("node3", "h100-sxm-8x"),
        ("node4", "l40s-x8-degraded"),
        ("node5", "a6000-4090-hetero"),
    ]
    seven = F.plan(nodes=7)
    assert [p for _, p in seven[5:]] == ["l40s-4x-switch", "l40s-4x-switch"]
    assert F.plan(nodes=3, profiles=["h100-sxm-8x"]) == [(f"node{i}", "h100-sxm-8x") for i in (1, 2, 3)]
    with pytest.raises(LabError, match="unknown profile.*no-such"):
        F.plan(profiles=["no-such"])
    with pytest.raises(LabError, match="between 1 and 63"):
        F.plan(nodes=0)


def test_node_links_fit_the_subnet_and_never_collide(tmp_path):
    import ipaddress

    fleet = F.Fleet(tmp_path)
    net = ipaddress.ip_network("10.213.7.0/24")
    specs = [fleet._node_spec(i, f"node{i + 1}", "l40s-4x-switch", net) for i in range(63)]
    addrs = [s["address"] for s in specs] + [s["gateway"] for s in specs]
    assert len(set(addrs)) == 126 and all(ipaddress.ip_address(a) in net for a in addrs)
    assert specs[0]["address"] == "10.213.7.2" and specs[0]["gateway"] == "10.213.7.1"
    assert all(len(s["veth"]) <= 15 for s in specs), "Linux interface names are at most 15 bytes"
    assert specs[3]["expect_registered"] is True
    assert fleet._node_spec(0, "n", "l40s-x8-degraded", net)["expect_registered"] is False


def test_wipe_removes_only_what_up_made(tmp_path):
    (tmp_path / "nodes" / "node1").mkdir(parents=True)
    (tmp_path / "lab.json").write_text("{}")
    (tmp_path / "lock").write_text("")
    (tmp_path / "notes.txt").write_text("the user's")
    F.Fleet(tmp_path)._wipe()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lock", "notes.txt"]
