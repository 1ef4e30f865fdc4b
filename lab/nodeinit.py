# SPDX-License-Identifier: GPL-3.0-or-later
"""Stage two of a node's boot: runs as PID 1 of the node's fresh namespaces, then becomes systemd.

`lab.machine` starts this file under ``unshare --mount --uts --ipc --net --pid --cgroup --fork``
with the node's directory as its only argument.  Still seeing the host's files (through a private
copy of the mount table), it assembles the node's root:

    <node>/root          overlay: lower / (or a tree of another Debian release, lab/rootfs.py),
                         upper <node>/upper, work <node>/work
      /proc /sys         fresh procfs (this PID namespace), read-only sysfs (this net namespace)
      /sys/fs/cgroup     cgroup2, rooted at the node's own cgroup (cgroup namespace)
      /dev               tmpfs with a few device nodes bound from the host, own devpts, shm
      /dev/console       <node>/console.log (systemd's console output)
      /run /tmp          fresh tmpfs: empty at every boot
      /lab/hw            <node>/hw, the simulated machine (read-write: roles run setpci on it)
      /proc/cmdline, /proc/sys/kernel/random/boot_id   the simulated machine's, bound read-only
      /proc/sys (but /proc/sys/net), /proc/sysrq-trigger, ...   read-only: they are the host's kernel
      <repo>/lab         the repository's lab package, read-only (stand-ins on the node's PATH)
      /lab/controller/usr  on a node of another release: the controller's /usr, read-only (the
                         stand-ins run under the lab's Python, not the node's)
      <checkout> <venv>  hidden under an empty read-only tmpfs (but <repo>/lab): a real node has
                         neither; boot validation runs the runtime site.yml installed on the node

waits for one line on stdin from the host (its network is wired then: ``go ADDR/PREFIX GW``),
configures ``lo`` and ``eth0``, checks that the root it is about to enter is a private one,
drops the capabilities that act on the host's kernel (loading modules, setting the clock),
chroots and execs systemd.  Nothing here may touch the host: every mount happens in the node's
own mount namespace, and systemd is never started unless its root, /run and /tmp are the
node's own (a systemd whose /tmp is the host's would empty it).

Standard library only: it runs before anything else exists.
"""

import ctypes
import json
import os
import subprocess
import sys

SYSTEMD = "/lib/systemd/systemd"
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
PROC_READONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
# Capabilities no process of a node keeps: they act on the host's kernel, not the node.
PR_CAPBSET_DROP = 24
DROPPED_CAPS = {"CAP_SYS_MODULE": 16, "CAP_SYS_TIME": 25}


def log(msg):
    sys.stderr.write(f"lab-nodeinit: {msg}\n")
    sys.stderr.flush()


def run(*argv):
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"lab-nodeinit: {' '.join(argv)} failed ({proc.returncode}): {proc.stdout.strip()}")


def mount(fstype, source, target, options=None):
    argv = ["mount", "-t", fstype]
    if options:
        argv += ["-o", options]
    run(*argv, source, target)


def bind(source, target, readonly=False):
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        open(target, "a").close()
    run("mount", "--bind", source, target)
    if readonly:
        run("mount", "-o", "remount,bind,ro", target)


def mountpoints():
    with open("/proc/self/mountinfo") as f:
        return {line.split()[4] for line in f}


def assemble(cfg):
    node, root = cfg["node_dir"], cfg["root"]
    # Nothing mounted below may propagate back to the host, whatever unshare defaulted to.
    run("mount", "--make-rprivate", "/")
    lower = cfg.get("lower", "/")
    mount("overlay", "overlay", root, f"lowerdir={lower},upperdir={node}/upper,workdir={node}/work")
    mount("proc", "proc", f"{root}/proc", "nosuid,nodev,noexec")
    mount("sysfs", "sysfs", f"{root}/sys", "ro,nosuid,nodev,noexec")
    mount("cgroup2", "cgroup2", f"{root}/sys/fs/cgroup", "nosuid,nodev,noexec")
    dev = f"{root}/dev"
    mount("tmpfs", "tmpfs", dev, "mode=755,size=16m,nosuid")
    for name in DEVICES:
        bind(f"/dev/{name}", f"{dev}/{name}")
    bind(cfg["console"], f"{dev}/console")
    os.makedirs(f"{dev}/pts")
    mount("devpts", "devpts", f"{dev}/pts", "newinstance,ptmxmode=0666,mode=0620,gid=5")
    os.symlink("pts/ptmx", f"{dev}/ptmx")
    os.makedirs(f"{dev}/shm")
    mount("tmpfs", "tmpfs", f"{dev}/shm", "mode=1777,size=256m,nosuid,nodev")
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{dev}/{name}")
    mount("tmpfs", "tmpfs", f"{root}/run", "mode=755,size=256m,nosuid,nodev")
    mount("tmpfs", "tmpfs", f"{root}/tmp", "mode=1777,size=1g,nosuid,nodev")
    hw = root + cfg["hw_in_node"]
    bind(cfg["hw_dir"], hw)
    bind(f"{cfg['hw_dir']}/proc/cmdline", f"{root}/proc/cmdline", readonly=True)
    # The kernel's knobs are the host's: read-only, except the node's own network namespace's.
    bind(f"{root}/proc/sys", f"{root}/proc/sys")
    bind(f"{root}/proc/sys/net", f"{root}/proc/sys/net")  # stays read-write
    for path in PROC_READONLY:
        target = f"{root}/proc/{path}"
        if os.path.exists(target):
            if path != "sys":
                bind(target, target)
            run("mount", "-o", "remount,bind,ro", target)
    bind(f"{cfg['hw_dir']}/proc/sys/kernel/random/boot_id", f"{root}/proc/sys/kernel/random/boot_id", readonly=True)
    for path in cfg.get("host_paths", ()):  # shortest first: a parent before what is under it
        # hidden: missing, or only the empty mount point an earlier boot left in the upper dir
        if os.path.isdir(path) and os.listdir(path) and not (os.path.isdir(root + path) and os.listdir(root + path)):
            os.makedirs(root + path, exist_ok=True)
            bind(path, root + path, readonly=True)
    hidden = []
    for path in cfg.get("hide_paths", ()):  # the controller's checkout and venv: not on a real node
        if any(path.startswith(h + "/") for h in hidden):
            continue  # under one hidden already
        if cfg["lab_package"].startswith(path + "/"):  # hidden even where the root has no such path
            os.makedirs(root + path, exist_ok=True)  # (a checkout under /tmp: the node's /tmp is its own)
        if os.path.isdir(root + path) and not os.path.ismount(root + path):
            hidden.append(path)
            mount("tmpfs", "tmpfs", root + path, "mode=755,size=64k,nosuid,nodev")
            if cfg["lab_package"].startswith(path + "/"):  # its mount point, bound below
                os.makedirs(root + cfg["lab_package"])
            for item in cfg.get("lab_files", ()):  # what the stand-ins read of the checkout
                if item.startswith(path + "/"):
                    os.makedirs(os.path.dirname(root + item), exist_ok=True)
                    open(root + item, "a").close()
            run("mount", "-o", "remount,ro", root + path)
    bind(cfg["lab_package"], root + cfg["lab_package"], readonly=True)
    if cfg.get("lab_usr"):
        bind(cfg["lab_usr"]["source"], root + cfg["lab_usr"]["target"], readonly=True)
    for item in cfg.get("lab_files", ()):
        bind(item, root + item, readonly=True)


def check_private(cfg):
    """Refuse to start systemd anywhere but on the node's own root, /run and /tmp."""
    root = cfg["root"]
    mounted = mountpoints()
    missing = [p for p in (root, f"{root}/run", f"{root}/tmp", f"{root}/proc", f"{root}/dev") if p not in mounted]
    if os.path.realpath(root) == "/" or missing:
        raise SystemExit(f"lab-nodeinit: refusing to start systemd: not private: {missing or [root]}")
    if os.getpid() != 1:
        raise SystemExit("lab-nodeinit: refusing to start systemd outside a new PID namespace")


def wire_network(line):
    # "go 10.213.0.2/30 10.213.0.1"
    parts = line.split()
    if len(parts) != 3 or parts[0] != "go":
        raise SystemExit(f"lab-nodeinit: host aborted the boot ({line.strip() or 'no go'})")
    _, address, gateway = parts
    run("ip", "link", "set", "lo", "up")
    run("ip", "addr", "add", address, "dev", "eth0")
    run("ip", "link", "set", "eth0", "up")
    run("ip", "route", "add", "default", "via", gateway)


def main(node_dir):
    with open(os.path.join(node_dir, "boot.json")) as f:
        cfg = json.load(f)
    assemble(cfg)
    check_private(cfg)
    wire_network(sys.stdin.readline())
    fd = os.open("/dev/null", os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    libc = ctypes.CDLL(None, use_errno=True)
    for name, cap in DROPPED_CAPS.items():
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise SystemExit(f"lab-nodeinit: cannot drop {name}: {os.strerror(ctypes.get_errno())}")
    os.chroot(cfg["root"])
    os.chdir("/")
    env = {
        "container": "gpufleet-lab",
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        cfg["root_env"]: cfg["hw_in_node"],
    }
    os.execve(SYSTEMD, [SYSTEMD, "--show-status=false"], env)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: nodeinit.py NODE_DIR (started by `python -m lab up`, not by hand)")
    main(sys.argv[1])
