# SPDX-License-Identifier: GPL-3.0-or-later
"""What the lab needs from the machine it runs on, checked before anything is changed."""

from __future__ import annotations

import os
import shutil
import subprocess

# program -> Debian package that ships it
PROGRAMS = {
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "mount": "mount",
    "ip": "iproute2",
    "sshd": "openssh-server",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "haproxy": "haproxy",
    "lspci": "pciutils",
    "setpci": "pciutils",
    "prometheus": "prometheus",
    "promtool": "prometheus",
    "prometheus-node-exporter": "prometheus-node-exporter",
}
# What building a node's root filesystem of another Debian release needs (lab/rootfs.py).
BUILDER_PROGRAMS = {
    "debootstrap": "debootstrap",
    "unshare": "util-linux",
    "chroot": "coreutils",
    "dpkg-deb": "dpkg",
}
SYSTEMD = "/lib/systemd/systemd"
SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")

NAMESPACES = (
    ("--mount", "mount"),
    ("--uts", "UTS"),
    ("--ipc", "IPC"),
    ("--net", "network"),
    ("--pid", "PID"),
    ("--cgroup", "cgroup"),
)


class LabError(Exception):
    """A failure the user can act on; the message says what, where and what to do."""


def which(program):
    path = os.environ.get("PATH", "") + ":" + ":".join(SBIN)
    return shutil.which(program, path=path)


def builder_programs():
    """Absolute path of every program lab/rootfs.py runs, or LabError naming the missing packages."""
    found = {prog: which(prog) for prog in BUILDER_PROGRAMS}
    missing = sorted({BUILDER_PROGRAMS[prog] for prog, path in found.items() if not path})
    if missing:
        raise LabError(
            "building a root filesystem of another Debian release needs the Debian package(s) "
            f"{' '.join(missing)}: apt-get install {' '.join(missing)} (scripts/setup.sh installs them)"
        )
    return found


def programs():
    """Absolute path of every program the lab runs, or LabError naming the missing packages."""
    found, missing = {}, {}
    for prog, pkg in PROGRAMS.items():
        path = which(prog)
        if path:
            found[prog] = path
        else:
            missing.setdefault(pkg, []).append(prog)
    if not os.access(SYSTEMD, os.X_OK):
        missing.setdefault("systemd", []).append(SYSTEMD)
    if missing:
        pkgs = " ".join(sorted(missing))
        what = ", ".join(f"{', '.join(progs)} ({pkg})" for pkg, progs in sorted(missing.items()))
        raise LabError(f"the lab needs programs this machine lacks: {what}; install them with: apt-get install {pkgs}")
    return found


def require_root():
    if os.geteuid() != 0:
        raise LabError(
            "the lab must run as root: it creates namespaces, mounts and network "
            "interfaces (try: sudo -E python -m lab ...)"
        )


def cgroup2_mount():
    """Where the cgroup v2 hierarchy is mounted on the host (systemd in a node needs one)."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            if fields[sep + 1] == "cgroup2":
                return fields[4]
    raise LabError(
        "no cgroup v2 hierarchy is mounted on this host (systemd in a lab node needs "
        "one): mount it with `mount -t cgroup2 none /sys/fs/cgroup/unified` or boot "
        "with systemd.unified_cgroup_hierarchy=1"
    )


def namespaces(unshare):
    """LabError naming the namespace kind the kernel refuses, if any."""
    argv = [unshare] + [flag for flag, _ in NAMESPACES] + ["--fork", "true"]
    if subprocess.run(argv, capture_output=True, check=False).returncode == 0:
        return
    for flag, kind in NAMESPACES:
        extra = ["--fork"] if flag == "--pid" else []
        proc = subprocess.run([unshare, flag, *extra, "true"], capture_output=True, text=True, check=False)
        if proc.returncode:
            raise LabError(
                f"the kernel refuses to create a {kind} namespace "
                f"(`unshare {flag}`: {proc.stderr.strip()}); the lab needs mount, UTS, "
                "IPC, network, PID and cgroup namespaces: run it on a host or VM, or a "
                "container started with --privileged"
            )
    raise LabError(f"`{' '.join(argv)}` fails although each namespace alone works")


def check():
    """All prerequisites; returns the programs' paths."""
    require_root()
    progs = programs()
    cgroup2_mount()
    namespaces(progs["unshare"])
    return progs
