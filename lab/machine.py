# SPDX-License-Identifier: GPL-3.0-or-later
"""One lab node: its disk (an overlay upper layer), its simulated hardware, its boots.

A node lives in ``<state>/nodes/<name>/``:

    hw/           the simulated machine (lab.hwmodel), seen in the node at /lab/hw
    upper/ work/  the overlay's upper and work dirs: everything the node ever wrote
    root/         where the overlay is mounted, inside the node's mount namespace only
    console.log   systemd's console, and stage two's messages
    boot.json     what stage two (lab/nodeinit.py) needs; run.json: the running boot's PIDs

A boot: a fresh boot_id, the stand-ins linked into /usr/local/bin, a process joined to the
node's own cgroup runs ``unshare`` (mount, UTS, IPC, network, PID, cgroup namespaces) and
lab/nodeinit.py, the host wires a veth pair into the new network namespace and says go, and
systemd becomes PID 1.  Killing that PID 1 ends every namespace, mount and the veth with it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import lab.hwmodel as hw

from . import prometheus, rootfs
from .preflight import LabError
from .procs import starttime as _starttime

HW_IN_NODE = "/lab/hw"
LAB_PACKAGE = Path(__file__).resolve().parent
STANDINS = LAB_PACKAGE / "bin"
SSH_PORT = 22
# The stand-ins run under the lab's own interpreter, never the node's: a node of the controller's
# release has it at its own /usr/bin/python3; on a node of another release the controller's /usr
# is bound read-only here (not on any PATH), and each stand-in on the node's PATH is a wrapper that
# runs it with the controller's dynamic loader and libraries (the node's glibc may be older).
LAB_USR_IN_NODE = "/lab/controller/usr"
LAB_PYTHON = "/usr/bin/python3"

# Units of the host's Debian that cannot work, or have no business, in a lab node.
MASKED_UNITS = (
    "console-getty.service",
    "getty@tty1.service",
    "serial-getty@ttyS0.service",
    "systemd-udevd.service",
    "systemd-udevd-control.socket",
    "systemd-udevd-kernel.socket",
    "systemd-networkd-wait-online.service",
    "systemd-timesyncd.service",
    "systemd-pstore.service",
    "e2scrub_reap.service",
    "e2scrub_all.timer",
    "fstrim.timer",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "man-db.timer",
    "dpkg-db-backup.timer",
    "haproxy.service",
    "postgresql.service",
    "prometheus.service",  # the lab's Prometheus runs on the controller (lab/prometheus.py)
    # Kernel-wide filesystems a node has no business mounting (they are the host's kernel's).
    "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount",
    "sys-kernel-config.mount",
    "sys-fs-fuse-connections.mount",
)

SSHD_CONFIG = """\
# Written by the gpufleet lab (lab/machine.py): this node's own host key, root by key only.
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
MaxStartups 64:30:128
"""
SSHD_SETENV = "SetEnv {env}={hw}\n"
STANDIN_WRAPPER = """\
#!/bin/sh
# Written by the gpufleet lab (lab/machine.py): {name} runs under the lab's own Python, bound
# read-only at {usr} with its loader and libraries, not under this node's python3.
exec {loader} --library-path {libs} {python} -I {script} "$@"
"""


def ssh_keygen(progs, comment, path):
    """A new ed25519 key pair at ``path`` (no passphrase), by the real ssh-keygen."""
    argv = [progs["ssh-keygen"], "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)]
    subprocess.run(argv, check=True, capture_output=True)


def _write(path, text, mode=0o644):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)


class Machine:
    """A node of the fleet, addressed by its spec (name, profile, index, addresses)."""

    def __init__(self, fleet, spec):
        self.fleet = fleet
        self.spec = spec
        self.name = spec["name"]
        self.dir = fleet.state / "nodes" / self.name
        self.hw_dir = self.dir / "hw"
        self.upper = self.dir / "upper"
        self.console = self.dir / "console.log"
        self.run_file = self.dir / "run.json"
        self.os = spec.get("os", rootfs.HOST_RELEASE)

    @property
    def lower(self):
        """The overlay's lower layer: the controller's root, or the release's own tree."""
        return Path("/") if self.os == rootfs.HOST_RELEASE else rootfs.path(self.os) / "root"

    # --- the node's disk ------------------------------------------------------------------------
    def create(self):
        """Lay out a freshly imaged node: its hardware and the files that make it a lab node."""
        if self.dir.exists():
            shutil.rmtree(self.dir)
        for sub in ("upper", "work", "root"):
            (self.dir / sub).mkdir(parents=True)
        hw.build(self.spec["profile"], self.hw_dir)
        up = self.upper
        env = f"{hw.ROOT_ENV}={HW_IN_NODE}"
        _write(up / "etc/hostname", self.name + "\n")
        lower = self.lower
        hosts_file = lower / "etc/hosts"
        hosts = hosts_file.read_text() if hosts_file.exists() else "127.0.0.1\tlocalhost\n"
        _write(up / "etc/hosts", hosts.rstrip("\n") + f"\n127.0.1.1\t{self.name}\n")
        _write(up / "etc/machine-id", uuid.uuid4().hex + "\n", 0o444)
        environment = lower / "etc/environment"
        base = environment.read_text() if environment.exists() else ""
        _write(up / "etc/environment", (base.rstrip("\n") + "\n" if base.strip() else "") + env + "\n")
        _write(
            up / "etc/systemd/system.conf.d/gpufleet-lab.conf",
            f"# Written by the gpufleet lab: every unit sees the node's simulated hardware.\n"
            f"[Manager]\nDefaultEnvironment={env}\n",
        )
        units = up / "etc/systemd/system"
        units.mkdir(parents=True, exist_ok=True)
        for unit in MASKED_UNITS:
            os.symlink("/dev/null", units / unit)
        hw.units.install(hw.Node.load(self.hw_dir), up)  # the hardware's services (fabric manager)
        prometheus.install_node_exporter(up, self.spec["address"])  # textfile collector on the roles' dir
        sshd = SSHD_CONFIG + (SSHD_SETENV if rootfs.RELEASES[self.os]["sshd_setenv"] else "")
        _write(up / "etc/ssh/sshd_config.d/gpufleet-lab.conf", sshd.format(env=hw.ROOT_ENV, hw=HW_IN_NODE))
        key = up / "etc/ssh/ssh_host_ed25519_key"
        ssh_keygen(self.fleet.progs, f"root@{self.name}", key)
        # root's home is the node's own (opaque over the host's): a fresh image's dotfiles only.
        home = up / "root"
        home.mkdir(mode=0o700)
        os.setxattr(home, "trusted.overlay.opaque", b"y")
        for dotfile in (".bashrc", ".profile"):
            skel = lower / "etc/skel" / dotfile
            if skel.exists():
                shutil.copyfile(skel, home / dotfile)
        ssh_dir = home / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        os.chmod(ssh_dir, 0o700)
        _write(ssh_dir / "authorized_keys", self.fleet.public_key(), 0o600)

    def link_standins(self):
        """Put every stand-in of <repo>/lab/bin on the node's PATH (/usr/local/bin): a link on a
        node of the controller's release, a wrapper running the lab's Python on any other."""
        target_dir = self.upper / "usr/local/bin"
        target_dir.mkdir(parents=True, exist_ok=True)
        for entry in target_dir.iterdir():
            if entry.is_symlink() and os.readlink(entry).startswith(str(STANDINS) + "/"):
                entry.unlink()
            elif entry.is_file() and entry.read_bytes().startswith(b"#!/bin/sh\n# Written by the gpufleet lab"):
                entry.unlink()
        if not STANDINS.is_dir():
            return
        for prog in sorted(STANDINS.iterdir()):
            if prog.is_file() and os.access(prog, os.X_OK) and not prog.name.startswith("."):
                if self.os == rootfs.HOST_RELEASE:
                    os.symlink(prog, target_dir / prog.name)
                else:
                    _write(target_dir / prog.name, self._standin_wrapper(prog), 0o755)

    @staticmethod
    def _standin_wrapper(prog):
        python = Path(os.path.realpath(LAB_PYTHON))
        loader = Path(os.path.realpath("/lib64/ld-linux-x86-64.so.2"))
        for path in (python, loader):
            if not path.is_relative_to("/usr"):
                raise LabError(f"the lab's Python needs a merged /usr on the controller: {path} is outside /usr")

        def in_node(path):
            return LAB_USR_IN_NODE + str(path)[len("/usr") :]

        return STANDIN_WRAPPER.format(
            name=prog.name,
            usr=LAB_USR_IN_NODE,
            loader=in_node(loader),
            libs=in_node(loader.parent),
            python=in_node(python),
            script=prog,
        )

    # --- boots ----------------------------------------------------------------------------------
    @property
    def cgroup(self):
        return self.fleet.cgroup / self.name

    def _boot_config(self):
        cfg = {
            "node_dir": str(self.dir),
            "root": str(self.dir / "root"),
            "console": str(self.console),
            "hw_dir": str(self.hw_dir),
            "hw_in_node": HW_IN_NODE,
            "root_env": hw.ROOT_ENV,
            # the overlay's lower layer; on a node of another release, the lab's Python bound in
            "lower": str(self.lower),
            "lab_usr": None if self.os == rootfs.HOST_RELEASE else {"source": "/usr", "target": LAB_USR_IN_NODE},
            "lab_package": str(LAB_PACKAGE),
            # A real node sees neither the controller's checkout nor its venv (boot validation runs
            # the runtime site.yml installed): hidden under an empty read-only tmpfs, the lab
            # package alone bound back (the stand-ins).
            "hide_paths": sorted({str(LAB_PACKAGE.parent), sys.prefix}),
            # the vLLM stand-in's checkpoint shapes (lab/standins/vllm_server.py)
            "lab_files": [str(LAB_PACKAGE.parent / "plugins/module_utils/serving/_model_profiles.py")],
        }
        _write(self.dir / "boot.json", json.dumps(cfg, indent=1) + "\n")

    def new_boot_id(self):
        _write(self.hw_dir / "proc/sys/kernel/random/boot_id", str(uuid.uuid4()) + "\n")

    def boot_id(self):
        return (self.hw_dir / "proc/sys/kernel/random/boot_id").read_text().strip()

    def start(self):
        """Start a boot: namespaces made, network wired, stage two told to go (it then execs
        systemd); wait_ready() waits for the boot to finish."""
        if self.pid():
            raise LabError(f"node {self.name} is already running (PID {self.pid()})")
        self.link_standins()
        self._boot_config()
        self.cgroup.mkdir(parents=True, exist_ok=True)
        procs_file = str(self.cgroup / "cgroup.procs")

        def join_cgroup():  # runs in the child before exec: the cgroup namespace roots here
            with open(procs_file, "w") as f:
                f.write("0\n")

        progs = self.fleet.progs
        argv = [
            progs["unshare"],
            "--mount",
            "--uts",
            "--ipc",
            "--net",
            "--pid",
            "--cgroup",
            "--fork",
            "--kill-child",
            "--propagation",
            "private",
            sys.executable,
            "-I",
            str(LAB_PACKAGE / "nodeinit.py"),
            str(self.dir),
        ]
        with open(self.console, "ab") as log:
            log.write(f"\n=== lab: boot {self.boot_id()} at {time.strftime('%F %T')}\n".encode())
            log.flush()
            launcher = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=log,
                start_new_session=True,
                preexec_fn=join_cgroup,
                close_fds=True,
                cwd="/",
            )
        try:
            pid1 = self._child_of(launcher)
            self._wire(pid1)
            launcher.stdin.write(f"go {self.spec['address']}/{self.spec['prefix']} {self.spec['gateway']}\n".encode())
            launcher.stdin.close()
        except BaseException:
            launcher.kill()
            launcher.wait()
            self._del_veth()
            raise
        start = _starttime(pid1)
        _write(
            self.run_file,
            json.dumps(
                {
                    "pid": pid1,
                    "starttime": start[0] if start else None,
                    "launcher": launcher.pid,
                    "boot_id": self.boot_id(),
                    "started": time.time(),
                }
            )
            + "\n",
        )
        # The launcher outlives this process: do not let Popen's finaliser reap or warn about it.
        launcher.returncode = 0

    def _child_of(self, launcher, timeout=10.0):
        children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if launcher.poll() is not None:
                raise LabError(
                    f"node {self.name}: the namespaces could not be made "
                    f"(unshare exited {launcher.returncode}); see {self.console}"
                )
            try:
                pids = children.read_text().split()
            except FileNotFoundError:
                pids = []
            if pids:
                return int(pids[0])
            time.sleep(0.01)
        raise LabError(f"node {self.name}: stage two did not start within {timeout:.0f} s")

    def _wire(self, pid1):
        ip = self.fleet.progs["ip"]
        veth = self.spec["veth"]
        self._del_veth()
        steps = (
            [ip, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", str(pid1)],
            [ip, "addr", "add", f"{self.spec['gateway']}/{self.spec['prefix']}", "dev", veth],
            [ip, "link", "set", veth, "up"],
        )
        for argv in steps:
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            if proc.returncode:
                raise LabError(
                    f"node {self.name}: `{' '.join(argv)}` failed: {proc.stderr.strip()} "
                    "(the lab needs veth support in the kernel and CAP_NET_ADMIN)"
                )

    def _del_veth(self):
        veth = self.spec["veth"]
        if Path(f"/sys/class/net/{veth}").exists():
            subprocess.run([self.fleet.progs["ip"], "link", "del", veth], capture_output=True, check=False)

    def wait_ready(self, deadline):
        """Wait until the node's sshd answers and systemd has finished booting (running or
        degraded); LabError on timeout, death, or a boot that ends otherwise."""
        addr = (self.spec["address"], SSH_PORT)
        while True:
            if not self.pid():
                raise LabError(f"node {self.name} died while booting; see {self.console}")
            try:
                with socket.create_connection(addr, timeout=1.0) as sock:
                    sock.settimeout(2.0)
                    if sock.recv(64).startswith(b"SSH-"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise LabError(
                    f"node {self.name}: sshd did not answer on {addr[0]}:{addr[1]} in "
                    f"time; see {self.console} and `python -m lab status`"
                )
            time.sleep(0.1)
        # sshd answers early in the boot; wait for the rest of multi-user too.
        try:
            state = self.nsenter(
                "systemctl", "is-system-running", "--wait", timeout=max(1.0, deadline - time.monotonic())
            ).stdout.strip()
        except subprocess.TimeoutExpired:
            state = "still starting"
        if state not in ("running", "degraded"):
            raise LabError(
                f"node {self.name}: systemd is {state!r}, not running; see {self.console} and `journalctl` in the node"
            )

    def pid(self):
        """PID (in the host's namespace) of the node's running systemd, or None."""
        try:
            run = json.loads(self.run_file.read_text())
        except (FileNotFoundError, ValueError):
            return None
        now = _starttime(run["pid"])
        if now is None or now[1] or now[0] != run.get("starttime"):
            return None
        return run["pid"]

    def signal_stop(self):
        """Ask systemd to power off (it ignores SIGTERM); returns the PID asked, or None."""
        pid = self.pid()
        if pid:
            try:
                os.kill(pid, signal.SIGRTMIN + 4)
            except ProcessLookupError:
                return None
        return pid

    def finish_stop(self, pid, deadline):
        """Wait for the poweroff until deadline, then kill what is left; clean the boot up."""
        if pid:
            while self.pid() and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.pid():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                end = time.monotonic() + 10
                while self.pid() and time.monotonic() < end:
                    time.sleep(0.05)
        self._kill_cgroup()
        self._del_veth()
        try:
            launcher = json.loads(self.run_file.read_text()).get("launcher")
        except (FileNotFoundError, ValueError):
            launcher = None
        if launcher:
            end = time.monotonic() + 5
            while (st := _starttime(launcher)) and not st[1] and time.monotonic() < end:
                time.sleep(0.02)
        self.run_file.unlink(missing_ok=True)

    def stop(self, timeout=10.0):
        self.finish_stop(self.signal_stop(), time.monotonic() + timeout)

    def _kill_cgroup(self):
        """Whatever still runs in the node's cgroup (nothing, normally) is killed; then rmdir."""
        remove_cgroup(self.cgroup)

    # --- looking in ---------------------------------------------------------------------------
    def nsenter(self, *argv, **kwargs):
        """Run argv inside the running node (all its namespaces, its root); CompletedProcess."""
        pid = self.pid()
        if not pid:
            raise LabError(f"node {self.name} is not running")
        cmd = [
            self.fleet.progs["nsenter"],
            "-t",
            str(pid),
            "-m",
            "-u",
            "-i",
            "-n",
            "-p",
            "-C",
            "-r",
            "-w",
            "--",
            "/usr/bin/env",
            f"{hw.ROOT_ENV}={HW_IN_NODE}",
            *argv,
        ]
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("check", False)
        return subprocess.run(cmd, **kwargs)

    def state(self):
        """running / degraded / starting / ... as systemd says, or stopped."""
        if not self.pid():
            return "stopped"
        try:
            out = self.nsenter("systemctl", "is-system-running", timeout=10).stdout.strip()
        except (subprocess.TimeoutExpired, LabError):
            return "unknown"
        return out or "unknown"

    def hw_node(self):
        return hw.Node.load(self.hw_dir)

    def power_cycle_firmware(self):
        """What a reboot does to the hardware: registers to firmware defaults, a new boot_id."""
        self.hw_node().reset_firmware()
        self.new_boot_id()


def cgroup_pids(cgroup):
    """PIDs of every process in a cgroup tree (empty when the tree is gone)."""
    pids = []
    for procs in Path(cgroup).rglob("cgroup.procs"):
        try:
            pids += [int(p) for p in procs.read_text().split()]
        except OSError:
            pass
    return pids


def _populated(cgroup):
    """Whether anything runs in the cgroup tree, as the kernel counts it (cgroup.events)."""
    try:
        text = (Path(cgroup) / "cgroup.events").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return bool(cgroup_pids(cgroup))
    return "populated 1" in text.split("\n")


def remove_cgroup(cgroup, timeout=20.0):
    """Kill every process left in a cgroup tree, wait (bounded) until the kernel says it is
    empty, then remove the tree bottom-up; True if it is gone.

    A node's processes do not vanish the moment they are sent SIGKILL: each exits in its own
    time (a busy one may take seconds on a loaded host) and a cgroup is only removable once the
    kernel has counted the last one out (`populated 0` in cgroup.events).  `cgroup.kill`
    (Linux 5.14) kills the whole tree at once, forks included; without it every PID is sent
    SIGKILL again on each pass until the tree is empty.
    """
    cgroup = Path(cgroup)
    if not cgroup.exists():
        return True
    deadline = time.monotonic() + timeout
    kill = cgroup / "cgroup.kill"
    while _populated(cgroup):
        try:
            kill.write_text("1\n")
        except FileNotFoundError:
            if not cgroup.exists():
                return True
            for pid in cgroup_pids(cgroup):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        except OSError:
            pass
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    # rmdir is refused (EBUSY) for a moment after the last process left: retry until the deadline.
    while True:
        for sub in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            try:
                sub.rmdir()
            except OSError:
                pass
        try:
            cgroup.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
        time.sleep(0.05)
