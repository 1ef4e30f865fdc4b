# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab itself: a real two-node fleet (systemd, sshd, HAProxy), brought up once for the module.

Needs root and the lab's Debian packages (scripts/setup.sh installs them); skipped otherwise.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lab.hwmodel as hw
from lab import preflight
from lab.fleet import Fleet

REPO = Path(__file__).resolve().parents[2]
PROFILES = ["l40s-4x-switch", "l40s-x8-degraded"]


def _prerequisites():
    if os.geteuid() != 0:
        return "the lab needs root"
    try:
        preflight.check()
    except preflight.LabError as exc:
        return str(exc)
    return None


_MISSING = _prerequisites()
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"lab prerequisites: {_MISSING}")


def lab(state, *args, check=True, timeout=120):
    proc = subprocess.run([sys.executable, "-m", "lab", *args, "--state-dir", str(state)],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode:
        raise AssertionError(f"lab {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc


def new_state(name):
    # "pytest-lab-*": tests/fleet and tests/integration use pytest-fleet-* and pytest-ops-*
    state = REPO / ".lab-state" / f"pytest-lab-{name}-{os.getpid()}"
    shutil.rmtree(state, ignore_errors=True)
    return state


@pytest.fixture(scope="module")
def fleet():
    state = new_state("fleet")
    t0 = time.monotonic()
    try:
        lab(state, "up", "--profiles", ",".join(PROFILES))
        print(f"\nlab up of {len(PROFILES)} nodes: {time.monotonic() - t0:.1f} s")
        yield Fleet(state)
    finally:
        lab(state, "down", check=False)
        shutil.rmtree(state, ignore_errors=True)


def ssh(fleet, node, command, check=True, timeout=60):
    spec = next(n for n in fleet.data()["nodes"] if n["name"] == node)
    argv = ["ssh", "-i", str(fleet.key), "-o", "StrictHostKeyChecking=no", "-o",
            "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes",
            "-p", str(spec["ssh_port"]), f"root@{spec['address']}", command]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode:
        raise AssertionError(f"ssh {node} {command!r} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def hw_of(fleet, node):
    return hw.Node.load(fleet.state / "nodes" / node / "hw")


def test_status_json_describes_nodes_and_balancer(fleet):
    st = json.loads(lab(fleet.state, "status", "--json").stdout)
    nodes = {n["name"]: n for n in st["nodes"]}
    assert list(nodes) == ["node1", "node2"]
    assert [nodes[n]["profile"] for n in nodes] == PROFILES
    assert nodes["node1"]["expect_registered"] is True
    assert nodes["node2"]["expect_registered"] is False, "the x8-degraded node must never be registered"
    for n in nodes.values():
        assert n["state"] in ("running", "degraded"), n
        assert n["ssh_port"] == 22 and re.fullmatch(r"10\.213\.\d+\.\d+", n["address"])
    assert len({n["address"] for n in nodes.values()}) == 2
    bal = st["balancer"]
    assert bal["backend"] == "vllm_pool" and bal["state"] == "running"
    sock = os.stat(bal["runtime_socket"])
    assert stat.S_ISSOCK(sock.st_mode) and stat.S_IMODE(sock.st_mode) == 0o600


def test_balancer_runtime_api_has_an_empty_pool_that_takes_servers(fleet):
    bal = fleet.balancer()
    assert "vllm_pool" in bal.command("show backend")
    assert len(bal.command("show servers state vllm_pool").strip().splitlines()) == 2  # version, header
    addr = fleet.data()["nodes"][0]["address"]
    assert "New server registered" in bal.command(f"add server vllm_pool/probe {addr}:8000")
    assert "probe" in bal.command("show servers state vllm_pool")
    bal.command("set server vllm_pool/probe state maint")
    assert "Server deleted" in bal.command("del server vllm_pool/probe")


def test_a_command_while_another_runs_says_so(fleet):
    with fleet.locked("up"):
        proc = lab(fleet.state, "reboot", "node1", check=False)
    assert proc.returncode == 1
    assert "another lab command is running" in proc.stderr and "lab up, PID" in proc.stderr


def test_second_up_says_a_lab_is_running(fleet):
    proc = lab(fleet.state, "up", "--nodes", "1", check=False)
    assert proc.returncode == 1
    assert "already running" in proc.stderr and "lab down" in proc.stderr


def test_sshd_answers_with_the_nodes_identity_and_environment(fleet):
    out = ssh(fleet, "node1", "hostname; echo $GPUFLEET_LAB_ROOT; cat /proc/sys/kernel/random/boot_id; "
                              "cat /etc/machine-id").split()
    assert out[:2] == ["node1", "/lab/hw"]
    assert out[2] == hw_of(fleet, "node1").root.joinpath("proc/sys/kernel/random/boot_id").read_text().strip()
    other = ssh(fleet, "node2", "hostname; cat /etc/machine-id").split()
    assert other[0] == "node2" and other[1] != out[3], "each node has its own machine-id"


def test_systemd_reaches_multi_user_and_units_see_the_hardware(fleet):
    out = ssh(fleet, "node1", "systemctl is-system-running --wait; systemctl is-active multi-user.target "
                              "ssh systemd-journald dbus systemd-logind; systemctl --failed --plain "
                              "--no-legend; systemd-run --wait --pipe --quiet printenv GPUFLEET_LAB_ROOT; "
                              "cat /proc/1/comm", check=False).split("\n")
    assert out[0] in ("running", "degraded")
    assert out[1:6] == ["active"] * 5
    failed = [line for line in out[6:-3] if line.strip()]
    assert out[0] == "running" or failed, "degraded but nothing failed?"
    assert out[-3:-1] == ["/lab/hw", "systemd"], out


def test_node_root_run_and_tmp_are_private(fleet):
    marker = f"lab-private-{os.getpid()}"
    mounts = ssh(fleet, "node1", f"touch /tmp/{marker} /run/{marker} /etc/{marker}; "
                                 "findmnt -n -o FSTYPE /; findmnt -n -o FSTYPE /tmp; findmnt -n -o FSTYPE /run")
    assert mounts.split() == ["overlay", "tmpfs", "tmpfs"]
    for path in (f"/tmp/{marker}", f"/run/{marker}", f"/etc/{marker}"):
        assert not os.path.exists(path), f"a node wrote {path} on the host"
    assert (fleet.state / "nodes/node1/upper/etc" / marker).exists(), "the node's disk is its overlay upper"
    with open("/proc/self/mountinfo") as f:
        assert str(fleet.state) not in f.read(), "a node's mounts leaked into the host's namespace"


def test_node_cannot_change_the_hosts_kernel(fleet):
    swappiness = Path("/proc/sys/vm/swappiness").read_text()
    out = ssh(fleet, "node1", "sysctl -q -w vm.swappiness=7 2>&1; date -s 2001-01-01 2>&1; "
                              "touch /sys/bus/pci/rescan 2>&1; sysctl -n -w net.ipv4.ip_forward=1", check=False)
    assert "permission denied" in out and "Operation not permitted" in out and "Read-only" in out, out
    assert Path("/proc/sys/vm/swappiness").read_text() == swappiness
    assert time.gmtime().tm_year > 2001, "the host's clock was set from a node"
    assert out.strip().endswith("1"), "the node's own network sysctls stay writable"


def test_lspci_and_setpci_in_a_node_see_its_tree(fleet):
    for node in ("node1", "node2"):
        model = hw_of(fleet, node)
        listed = ssh(fleet, node, "lspci -D -O sysfs.path=$GPUFLEET_LAB_ROOT/sys/bus/pci")
        assert {line.split()[0] for line in listed.splitlines()} == set(model.devices)
    node2 = hw_of(fleet, "node2")
    text = ssh(fleet, "node2", f"lspci -vv -s {node2.gpus[2].bdf} -O sysfs.path=/lab/hw/sys/bus/pci")
    assert re.search(r"LnkSta:\s+Speed 16GT/s, Width x8", text), "node2's GPU 2 trained down to x8"
    dsp = hw_of(fleet, "node1").path_bridges(0, 1)[0]
    assert ssh(fleet, "node1", f"setpci -O sysfs.path=/lab/hw/sys/bus/pci -s {dsp} ECAP_ACS+0x6.w").strip() == "001d"


def p2p_read(fleet, node):
    """GPU0 -> GPU1 read status as the node's nvidia-smi stand-in prints it (None without one)."""
    if not (REPO / "lab" / "bin" / "nvidia-smi").exists():
        return None
    out = ssh(fleet, node, "nvidia-smi topo -p2p r")
    row = next(line.split() for line in out.splitlines() if line.split()[:2] == ["GPU0", "X"])
    return row[2]


def clear_acs(fleet, node, i, j):
    bridges = hw_of(fleet, node).path_bridges(i, j)
    ssh(fleet, node, "; ".join(f"setpci -O sysfs.path=/lab/hw/sys/bus/pci -s {b} ECAP_ACS+0x6.w=0000:002c"
                               for b in bridges))


def test_standins_follow_a_register_change_made_in_the_node(fleet):
    model = hw_of(fleet, "node1")
    assert model.redirected(0, 1)
    assert p2p_read(fleet, "node1") in ("CNS", None)
    clear_acs(fleet, "node1", 0, 1)
    assert not model.redirected(0, 1), "the host-side model reads the registers the node wrote"
    assert p2p_read(fleet, "node1") in ("OK", None)
    assert model.redirected(2, 3), "only the bridges written change"


UNIT = """[Unit]
Description=lab test: an enabled unit runs at boot
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'echo "$GPUFLEET_LAB_ROOT $(cat /proc/sys/kernel/random/boot_id)" > /run/lab-test-ran'
[Install]
WantedBy=multi-user.target
"""


def test_reboot_restores_firmware_defaults_and_empties_run(fleet):
    clear_acs(fleet, "node1", 0, 1)
    model = hw_of(fleet, "node1")
    assert not model.redirected(0, 1)
    ssh(fleet, "node1", f"echo here > /run/lab-marker; echo kept > /root/lab-disk; "
                        f"echo {base64.b64encode(UNIT.encode()).decode()} | base64 -d "
                        "> /etc/systemd/system/lab-test.service; "
                        "systemctl enable --quiet lab-test.service")
    before = ssh(fleet, "node1", "cat /proc/sys/kernel/random/boot_id").strip()
    t0 = time.monotonic()
    lab(fleet.state, "reboot", "node1")
    print(f"\nlab reboot: {time.monotonic() - t0:.1f} s")
    assert model.redirected(0, 1), "firmware puts ACS redirect back on"
    dsp = model.path_bridges(0, 1)[0]
    out = ssh(fleet, "node1", f"setpci -O sysfs.path=/lab/hw/sys/bus/pci -s {dsp} ECAP_ACS+0x6.w; "
                              "cat /proc/sys/kernel/random/boot_id; ls /run/lab-marker 2>&1; cat /root/lab-disk; "
                              "systemctl is-system-running --wait; cat /run/lab-test-ran; "
                              "journalctl --list-boots --no-pager | tail -n +2 | wc -l", check=False).splitlines()
    assert out[0] == "001d"
    assert out[1] != before and out[1] == model.root.joinpath("proc/sys/kernel/random/boot_id").read_text().strip()
    assert "No such file" in out[2], "/run is empty after a reboot"
    assert out[3] == "kept", "the node's disk survives a reboot"
    assert out[4] in ("running", "degraded")
    assert out[5] == f"/lab/hw {out[1]}", "the enabled unit ran in the new boot, with the lab's environment"
    assert out[6] == "2"
    if p2p_read(fleet, "node1") is not None:
        assert p2p_read(fleet, "node1") == "CNS"


def test_ansible_reaches_every_host_of_the_generated_inventory(fleet, tmp_path, ansible_env):
    inventory = tmp_path / "hosts.yml"
    lab(fleet.state, "inventory", "--output", str(inventory))
    text = inventory.read_text()
    for key in ("gpu_nodes:", "balancer:", "ansible_connection: local", "gpufleet_sysfs_path: /lab/hw/sys/bus/pci",
                "lab_expect_registered: false", "lab_haproxy_backend: vllm_pool"):
        assert key in text
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible"), "-i", str(inventory), "all", "-m", "ping"],
                          cwd=REPO, env=ansible_env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for host in ("node1", "node2", "lab-balancer"):
        assert re.search(rf"^{host} \| SUCCESS", proc.stdout, re.M), proc.stdout


def _net_namespaces():
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            found.add(os.readlink(f"/proc/{pid}/ns/net"))
        except OSError:
            pass
    return found


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _host_config():
    """The host files a careless lab would touch."""
    snap = {}
    for d in ("/etc", "/etc/ssh", "/etc/ssh/sshd_config.d", "/etc/systemd/system", "/etc/haproxy"):
        snap[d] = sorted(os.listdir(d)) if os.path.isdir(d) else None
    for f in ("/etc/environment", "/etc/hosts", "/etc/hostname", "/etc/machine-id",
              "/etc/haproxy/haproxy.cfg", "/root/.ssh/authorized_keys"):
        snap[f] = Path(f).read_bytes() if os.path.exists(f) else None
    return snap


def test_down_leaves_nothing_and_up_down_up_works(tmp_path):
    state = new_state("cycle")
    host_before = _host_config()
    try:
        for cycle in range(2):
            lab(state, "up", "--nodes", "1", "--profiles", "epyc-rootport-acs")
            fleet = Fleet(state)
            m = fleet.machines()[0]
            pid1, veth, cgroup = m.pid(), m.spec["veth"], fleet.cgroup
            netns = os.readlink(f"/proc/{pid1}/ns/net")
            pids = [int(p) for procs in cgroup.rglob("cgroup.procs") for p in procs.read_text().split()]
            hap = fleet.balancer().pid()
            assert pid1 and hap and len(pids) > 3 and Path(f"/sys/class/net/{veth}").exists()
            if cycle == 1:  # the lab's records lost: down still finds everything (cgroups, veth names)
                (state / "lab.json").unlink()
            lab(state, "down")
            assert not [p for p in pids + [hap] if _alive(p)], "processes left after down"
            assert not Path(f"/sys/class/net/{veth}").exists(), "veth left after down"
            assert not cgroup.exists(), "cgroup left after down"
            assert netns not in _net_namespaces(), "the node's network namespace outlived it"
            with open("/proc/self/mountinfo") as f:
                assert str(state) not in f.read()
            assert sorted(p.name for p in state.iterdir()) == ["lock"], f"cycle {cycle}: files left in the state dir"
        proc = lab(state, "down")
        assert "nothing was running" in proc.stdout
        assert _host_config() == host_before, "the lab changed the host's configuration"
    finally:
        lab(state, "down", check=False)
        shutil.rmtree(state, ignore_errors=True)

