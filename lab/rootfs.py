# SPDX-License-Identifier: GPL-3.0-or-later
"""Root filesystems of other Debian releases for lab nodes, built once by debootstrap and cached.

A lab node of the controller's own release (bookworm) boots on an overlay whose lower layer is the
controller's ``/``, as it always has.  A node of another release boots on an overlay whose lower
layer is one of these trees instead, and shares nothing with the controller's root filesystem:
what a bare-metal Debian machine has before Ansible first reaches it (systemd, dbus, sshd,
python3, iproute2: ``BASE_PACKAGES``), and nothing the roles install themselves.

Nodes have no route to Debian's archive, so each tree carries a local archive of the packages the
roles install (``ROLE_PACKAGES``, with their dependencies, at the release's own versions), in
``ARCHIVE_IN_NODE``, as the node's only apt source: ``apt-get update`` and ``apt install`` there
work as against a mirror, and a package is on the node only once a role installed it.

    <cache>/gpufleet/rootfs-<release>-<key>/root/        the tree (an overlay's lower layer)
    <cache>/gpufleet/rootfs-<release>-<key>/build.json   release, Python, packages, build seconds

``key`` is a hash of the release, both package lists and ``BUILDER_VERSION``: a change of any of
them builds a new tree, and the release's trees of other keys are then removed (``prune``: never
one a running node has mounted, nor one being built).  A build runs in ``rootfs-<release>-<key>.tmp.XXXXXX`` (debootstrap
inside a private mount namespace, so that nothing it mounts can outlive it) and is renamed into
place when complete; a second caller waits on the build's lock and then uses its result.

``python -m lab.rootfs bullseye trixie`` builds (or finds) them and prints where, and how long.
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import preflight
from .preflight import LabError

#: Bump when the way a tree is made changes: every cached tree is then rebuilt.
BUILDER_VERSION = 3
MIRROR = "http://deb.debian.org/debian"
#: The controller's own release: its nodes' lower layer is the controller's root.
HOST_RELEASE = "bookworm"
#: Releases a node can run, with what the lab needs to know of each (sshd's SetEnv arrived in
#: OpenSSH 8.7: bullseye's 8.4 refuses the keyword, and pam_env's /etc/environment serves there).
RELEASES = {
    "bullseye": {"version": "11", "sshd_setenv": False},
    "bookworm": {"version": "12", "sshd_setenv": True},
    "trixie": {"version": "13", "sshd_setenv": True},
}
#: A bare-metal node before Ansible: an init, its bus and login manager, sshd, the Python Ansible
#: needs with its apt binding (Debian's standard install has python3-apt through reportbug, Ubuntu's
#: server and cloud images through their seeds; Ansible's apt module needs it), the network tools.
#: minbase adds the essential set (coreutils, util-linux, apt, ...).
BASE_PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "libpam-systemd",
    "openssh-server",
    "python3",
    "python3-apt",
    "iproute2",
    "procps",
    "kmod",
    "ca-certificates",
)
#: What the roles install on a node (monitoring: the node exporter; worker_recycle: the metrics
#: parser; boot_validation: venv support; pcie_p2p: pciutils' setpci), offered in the node's
#: local archive, never installed by the build.
ROLE_PACKAGES = (
    "pciutils",
    "prometheus-node-exporter",
    "python3-prometheus-client",
    "python3-venv",
)
ARCHIVE_IN_NODE = "/var/lib/gpufleet-lab/archive"
SOURCES_LIST = f"""\
# Written by the gpufleet lab (lab/rootfs.py): lab nodes have no route to Debian's archive; this
# local archive holds the release's packages the roles install (and their dependencies).
deb [trusted=yes] file:{ARCHIVE_IN_NODE} ./
"""


def cache_dir():
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpufleet"


def key(release):
    text = json.dumps([release, BASE_PACKAGES, ROLE_PACKAGES, BUILDER_VERSION])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def path(release):
    """Where the tree of ``release`` is (or will be) cached: the directory holding root/."""
    return cache_dir() / f"rootfs-{release}-{key(release)}"


def check_release(release):
    if release not in RELEASES:
        raise LabError(f"unknown Debian release {release!r}; the lab's nodes run: {', '.join(RELEASES)}")
    return release


def built(release):
    """build.json of the cached tree of ``release``, or None when it is not built."""
    try:
        return json.loads((path(release) / "build.json").read_text())
    except (FileNotFoundError, ValueError):
        return None


def python_version(release):
    """The version of python3 on a node of ``release`` (None for a tree not built yet)."""
    if release == HOST_RELEASE:
        return _host_python()
    record = built(release)
    return record["python"] if record else None


@functools.cache
def _host_python():
    """The controller's /usr/bin/python3 version: a bookworm node's, whose root is the controller's."""
    proc = subprocess.run(
        ["/usr/bin/python3", "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() or None


def _run(argv, what, **kwargs):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    if proc.returncode:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise LabError(f"{what}: `{' '.join(argv)}` exited {proc.returncode}:\n{tail}")
    return proc.stdout


def _in_chroot(progs, root, *argv):
    """argv in the tree, in a private mount namespace (nothing mounted there outlives it)."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive"}
    return _run(
        [progs["unshare"], "--mount", "--propagation", "private", progs["chroot"], str(root), *argv],
        f"building the root filesystem in {root}",
        env=env,
    )


def _archive_index(archive):
    """Packages and Release of a flat archive (what dpkg-scanpackages would write), by dpkg-deb."""
    paragraphs = []
    for deb in sorted(archive.glob("*.deb")):
        control = subprocess.run(
            ["dpkg-deb", "--field", str(deb)], capture_output=True, text=True, check=True
        ).stdout.rstrip("\n")
        data = deb.read_bytes()
        paragraphs.append(
            f"{control}\nFilename: ./{deb.name}\nSize: {len(data)}\n"
            f"MD5sum: {hashlib.md5(data).hexdigest()}\nSHA256: {hashlib.sha256(data).hexdigest()}\n"
        )
    packages = "\n".join(paragraphs).encode()
    (archive / "Packages").write_bytes(packages)
    (archive / "Release").write_text(
        f"Origin: gpufleet-lab\nLabel: gpufleet-lab\n"
        f"Date: {time.strftime('%a, %d %b %Y %H:%M:%S UTC', time.gmtime())}\n"
        f"SHA256:\n {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages\n"
    )


def _mounts_under(directory):
    prefix = str(directory).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if (line.split()[4] + "/").startswith(prefix)]


def _remove(directory):
    """Remove a failed build; never through a mount point (there should be none: namespaces)."""
    if _mounts_under(directory):
        raise LabError(f"a failed root filesystem build left mounts under {directory}: unmount them, then remove it")
    shutil.rmtree(directory, ignore_errors=True)


def _in_use(directory):
    """Whether any process's mount table has a mount of, or over, something under directory (an
    overlay whose lower layer it is: a running lab node)."""
    prefix = str(directory).rstrip("/") + "/"
    for mountinfo in Path("/proc").glob("[0-9]*/mountinfo"):
        try:
            text = mountinfo.read_text()
        except OSError:  # the process ended meanwhile
            continue
        if prefix in text or f" {directory} " in text:
            return True
    return False


def prune(release, log=print):
    """Remove the cached trees of ``release`` other than the current key's (older package lists
    or builders), with their lock files; a tree still in use or still being built (its lock held)
    is kept, saying why.  Returns the removed directories."""
    check_release(release)
    current = path(release)
    removed = []
    for old in sorted(current.parent.glob(f"rootfs-{release}-*")):
        name = old.name
        if old == current or not old.is_dir() or ".tmp." in name:
            continue
        lock_path = old.parent / f"{name}.lock"
        with open(lock_path, "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log(f"rootfs: kept {old}: it is being built")
                continue
            if _in_use(old):
                log(f"rootfs: kept {old}: a running lab node has it mounted (`python -m lab down` first)")
                continue
            _remove(old)
            lock_path.unlink(missing_ok=True)
        removed.append(old)
        log(f"rootfs: removed {old} (an older version of the {release} tree)")
    return removed


def _build(release, progs, tmp, log):
    root = tmp / "root"
    t0 = time.monotonic()
    log(f"rootfs: building {release} with debootstrap from {MIRROR} (once; cached in {path(release)})")
    _run(
        [
            progs["unshare"],
            "--mount",
            "--propagation",
            "private",
            progs["debootstrap"],
            "--variant=minbase",
            f"--include={','.join(BASE_PACKAGES)}",
            "--components=main",
            release,
            str(root),
            MIRROR,
        ],
        f"debootstrap of {release}",
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
    )
    resolv = root / "etc/resolv.conf"
    kept = resolv.read_bytes() if resolv.is_file() and not resolv.is_symlink() else None
    resolv.unlink(missing_ok=True)
    shutil.copyfile("/etc/resolv.conf", resolv)
    _in_chroot(progs, root, "apt-get", "-q", "update")
    _in_chroot(progs, root, "apt-get", "clean")  # debootstrap's own .debs: installed already
    _in_chroot(
        progs,
        root,
        "apt-get",
        "-q",
        "-y",
        "--download-only",
        "--no-install-recommends",
        "install",
        *ROLE_PACKAGES,
    )
    archive = root / ARCHIVE_IN_NODE.lstrip("/")
    archive.mkdir(parents=True)
    debs = sorted((root / "var/cache/apt/archives").glob("*.deb"))
    if not debs:
        raise LabError(f"building {release}: apt downloaded none of {', '.join(ROLE_PACKAGES)}")
    for deb in debs:
        deb.rename(archive / deb.name)
    _archive_index(archive)
    (root / "etc/apt/sources.list").write_text(SOURCES_LIST)
    for stale in (root / "var/lib/apt/lists").glob("*"):
        if stale.is_file():
            stale.unlink()
    _in_chroot(progs, root, "apt-get", "-q", "update")
    _in_chroot(progs, root, "apt-get", "clean")
    resolv.unlink()
    if kept is not None:
        resolv.write_bytes(kept)
    python = _in_chroot(
        progs, root, "/usr/bin/python3", "-c", "import platform; print(platform.python_version())"
    ).strip()
    systemd = _in_chroot(progs, root, "dpkg-query", "-W", "-f=${Version}", "systemd").strip()
    seconds = round(time.monotonic() - t0, 1)
    record = {
        "release": release,
        "version": RELEASES[release]["version"],
        "key": key(release),
        "python": python,
        "systemd": systemd,
        "base_packages": list(BASE_PACKAGES),
        "archive_packages": sorted(d.name for d in debs),
        "mirror": MIRROR,
        "builder_version": BUILDER_VERSION,
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": seconds,
    }
    (tmp / "build.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def ensure(release, progs=None, log=print):
    """build.json of the tree of ``release``, built first if it is not cached (LabError if the
    build fails; the half-built tree is removed)."""
    check_release(release)
    if release == HOST_RELEASE:
        raise LabError(f"{release} nodes run on the controller's own root; there is no tree to build")
    record = built(release)
    if record:
        return record
    progs = {**(progs or {}), **preflight.builder_programs()}
    final = path(release)
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per tree; a second caller gets its result
        record = built(release)
        if record:
            return record
        tmp = Path(tempfile.mkdtemp(prefix=f"{final.name}.tmp.", dir=final.parent))
        try:
            record = _build(release, progs, tmp, log)
            if final.exists():  # a tree without build.json: an interrupted rename's leftovers
                _remove(final)
            tmp.rename(final)
        except BaseException:
            _remove(tmp)
            raise
    prune(release, log=log)
    log(
        f"rootfs: {release} built in {record['build_seconds']:.0f} s (Python {record['python']}, "
        f"systemd {record['systemd']}): {final}"
    )
    return record


def _inside(root, path):
    """``path`` as the tree at ``root`` sees it: every symbolic link along it (absolute ones
    too) resolved within the tree, never into the controller's root."""
    parts, resolved, hops = [p for p in Path(path).parts if p != "/"], [], 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            resolved = resolved[:-1]
            continue
        candidate = root.joinpath(*resolved, part)
        if candidate.is_symlink():
            hops += 1
            if hops > 40:
                raise LabError(f"too many symbolic links resolving {path} in {root}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                resolved = []
            parts = [p for p in Path(target).parts if p != "/"] + parts
            continue
        resolved.append(part)
    return root.joinpath(*resolved)


def interpreter(release):
    """argv that runs the tree's own python3 from the controller, with the tree's own libraries
    (its dynamic loader and library directories): no chroot, so it reads the checkout."""
    root = path(release) / "root"
    python = _inside(root, "/usr/bin/python3")
    loader = _inside(root, "/lib64/ld-linux-x86-64.so.2")
    libs = [str(root / d) for d in ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu")]
    return [str(loader), "--library-path", ":".join(libs), str(python)]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m lab.rootfs", description=__doc__.split("\n\n")[0])
    p.add_argument("releases", nargs="+", help=f"of {', '.join(r for r in RELEASES if r != HOST_RELEASE)}")
    p.add_argument("--json", action="store_true", help="print the build records")
    args = p.parse_args(argv)
    records = []
    try:
        for release in args.releases:
            t0 = time.monotonic()
            record = ensure(release, log=lambda msg: print(msg, file=sys.stderr, flush=True))
            records.append(
                {**record, "path": str(path(release) / "root"), "seconds_now": round(time.monotonic() - t0, 1)}
            )
    except LabError as exc:
        print(f"lab rootfs: {exc}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(records, sys.stdout, indent=1)
        print()
    else:
        for r in records:
            print(f"{r['release']}: {r['path']} (Python {r['python']}, built in {r['build_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
