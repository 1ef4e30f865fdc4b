# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab itself: real nodes (systemd, sshd) and a real HAProxy, on the session's one lab
(tests/conftest.py's `session_lab`, shared with tests/fleet and the operations tests).

Tests that change a node do it on the lab's spare node and establish the state they need there
first (registers put back, files removed); what the fleet's nodes run is only looked at.  Bringing
a lab up and down is tested on labs of their own (`test_down_leaves_nothing...`).

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
import urllib.request
from pathlib import Path

import pytest

import lab.hwmodel as hw
from lab.fleet import Fleet
from tests.harness.lab import lab_command, lab_prerequisites
from tests.harness.ssh import ssh as ssh_node

REPO = Path(__file__).resolve().parents[2]

_MISSING = lab_prerequisites()
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"lab prerequisites: {_MISSING}")
SETPCI = "setpci -O sysfs.path=/lab/hw/sys/bus/pci"


def new_state(name):
    # "pytest-lab-*": the session's lab is .lab-state/pytest-<pid>
    state = REPO / ".lab-state" / f"pytest-lab-{name}-{os.getpid()}"
    shutil.rmtree(state, ignore_errors=True)
    return state


@pytest.fixture
def fleet(session_lab):
    """lab.fleet.Fleet of the session's lab."""
    return session_lab.fleet


@pytest.fixture
def spare(session_lab):
    """The session lab's spare node: the one these tests may change."""
    return session_lab.spare


def ssh(fleet, node, command, check=True, timeout=60):
    spec = next(n for n in fleet.data()["nodes"] if n["name"] == node)
    return ssh_node(fleet.key, spec, command, check=check, timeout=timeout)


def hw_of(fleet, node):
    return hw.Node.load(fleet.state / "nodes" / node / "hw")


def at_firmware_defaults(fleet, node):
    """Put every ACS Control register of node back to its firmware value (as a reboot would,
    without one): the tests that write registers start from there."""
    model = hw_of(fleet, node)
    data = json.loads((fleet.state / "nodes" / node / "hw" / "lab-node.json").read_text())
    writes = [
        f"{SETPCI} -s {d['bdf']} ECAP_ACS+0x6.w={d['acs_ctl']:04x}"
        for d in data["devices"]
        if d.get("acs_cap") is not None
    ]
    ssh(fleet, node, "; ".join(writes))
    return model


def test_status_json_describes_nodes_and_balancer(session_lab):
    st = json.loads(session_lab.lab("status", "--json").stdout)
    nodes = {n["name"]: n for n in st["nodes"]}
    assert list(nodes) == [f"node{i + 1}" for i in range(len(session_lab.profiles))]
    assert [nodes[n]["profile"] for n in nodes] == session_lab.profiles
    for n in nodes.values():
        assert n["expect_registered"] is hw.PROFILES[n["profile"]].get("expect_registered", True), n
        assert n["state"] in ("running", "degraded"), n
        assert n["ssh_port"] == 22 and re.fullmatch(r"10\.213\.\d+\.\d+", n["address"])
    if "l40s-x8-degraded" in session_lab.profiles:
        degraded = session_lab.profiles.index("l40s-x8-degraded")
        assert nodes[f"node{degraded + 1}"]["expect_registered"] is False, (
            "the x8-degraded node must never be registered"
        )
    assert len({n["address"] for n in nodes.values()}) == len(nodes)
    bal = st["balancer"]
    assert bal["backend"] == "vllm_pool" and bal["state"] == "running"
    sock = os.stat(bal["runtime_socket"])
    assert stat.S_ISSOCK(sock.st_mode) and stat.S_IMODE(sock.st_mode) == 0o600


def test_balancer_runtime_api_takes_and_deletes_servers(fleet, spare):
    # (that a fresh lab's pool is empty: test_down_leaves_nothing_and_up_down_up_works)
    bal = fleet.balancer()
    assert "vllm_pool" in bal.command("show backend")
    assert "probe" not in bal.command("show servers state vllm_pool")
    addr = next(n for n in fleet.data()["nodes"] if n["name"] == spare)["address"]
    assert "New server registered" in bal.command(f"add server vllm_pool/probe {addr}:8000")
    assert "probe" in bal.command("show servers state vllm_pool")
    bal.command("set server vllm_pool/probe state maint")
    assert "Server deleted" in bal.command("del server vllm_pool/probe")
    assert "probe" not in bal.command("show servers state vllm_pool")


def test_a_command_while_another_runs_says_so(fleet, spare):
    with fleet.locked("up"):
        proc = lab_command(fleet.state, "reboot", spare, check=False)
    assert proc.returncode == 1
    assert "another lab command is running" in proc.stderr and "lab up, PID" in proc.stderr


def test_second_up_says_a_lab_is_running(fleet):
    proc = lab_command(fleet.state, "up", "--nodes", "1", check=False)
    assert proc.returncode == 1
    assert "already running" in proc.stderr and "lab down" in proc.stderr


def test_sshd_answers_with_the_nodes_identity_and_environment(fleet, spare):
    out = ssh(
        fleet, spare, "hostname; echo $GPUFLEET_LAB_ROOT; cat /proc/sys/kernel/random/boot_id; cat /etc/machine-id"
    ).split()
    assert out[:2] == [spare, "/lab/hw"]
    assert out[2] == hw_of(fleet, spare).root.joinpath("proc/sys/kernel/random/boot_id").read_text().strip()
    other = ssh(fleet, "node1", "hostname; cat /etc/machine-id").split()
    assert other[0] == "node1" and other[1] != out[3], "each node has its own machine-id"


def test_systemd_reaches_multi_user_and_units_see_the_hardware(fleet, spare):
    out = ssh(
        fleet,
        spare,
        "systemctl is-system-running --wait; systemctl is-active multi-user.target "
        "ssh systemd-journald dbus systemd-logind; systemctl --failed --plain "
        "--no-legend; systemd-run --wait --pipe --quiet printenv GPUFLEET_LAB_ROOT; "
        "cat /proc/1/comm",
        check=False,
    ).split("\n")
    assert out[0] in ("running", "degraded")
    assert out[1:6] == ["active"] * 5
    failed = [line for line in out[6:-3] if line.strip()]
    assert out[0] == "running" or failed, "degraded but nothing failed?"
    assert out[-3:-1] == ["/lab/hw", "systemd"], out


def test_node_root_run_and_tmp_are_private(fleet, spare):
    marker = f"lab-private-{os.getpid()}"
    mounts = ssh(
        fleet,
        spare,
        f"touch /tmp/{marker} /run/{marker} /etc/{marker}; "
        "findmnt -n -o FSTYPE /; findmnt -n -o FSTYPE /tmp; findmnt -n -o FSTYPE /run",
    )
    try:
        assert mounts.split() == ["overlay", "tmpfs", "tmpfs"]
        for path in (f"/tmp/{marker}", f"/run/{marker}", f"/etc/{marker}"):
            assert not os.path.exists(path), f"a node wrote {path} on the host"
        assert (fleet.state / "nodes" / spare / "upper/etc" / marker).exists(), "the node's disk is its overlay upper"
    finally:
        ssh(fleet, spare, f"rm -f /tmp/{marker} /run/{marker} /etc/{marker}")
    with open("/proc/self/mountinfo") as f:
        assert str(fleet.state) not in f.read(), "a node's mounts leaked into the host's namespace"


def test_node_cannot_change_the_hosts_kernel(fleet, spare):
    swappiness = Path("/proc/sys/vm/swappiness").read_text()
    out = ssh(
        fleet,
        spare,
        "sysctl -q -w vm.swappiness=7 2>&1; date -s 2001-01-01 2>&1; "
        "touch /sys/bus/pci/rescan 2>&1; sysctl -n -w net.ipv4.ip_forward=1",
        check=False,
    )
    assert "permission denied" in out and "Operation not permitted" in out and "Read-only" in out, out
    assert Path("/proc/sys/vm/swappiness").read_text() == swappiness
    assert time.gmtime().tm_year > 2001, "the host's clock was set from a node"
    assert out.strip().endswith("1"), "the node's own network sysctls stay writable"


def test_lspci_and_setpci_in_a_node_see_its_tree(fleet, session_lab, spare):
    for node in [spare] + session_lab.fleet_nodes:
        model = hw_of(fleet, node)
        listed = ssh(fleet, node, "lspci -D -O sysfs.path=$GPUFLEET_LAB_ROOT/sys/bus/pci")
        assert {line.split()[0] for line in listed.splitlines()} == set(model.devices)
    degraded = [
        n for n, p in zip(session_lab.fleet_nodes, session_lab.fleet_profiles, strict=False) if p == "l40s-x8-degraded"
    ]
    for node in degraded:
        text = ssh(fleet, node, f"lspci -vv -s {hw_of(fleet, node).gpus[2].bdf} -O sysfs.path=/lab/hw/sys/bus/pci")
        assert re.search(r"LnkSta:\s+Speed 16GT/s, Width x8", text), f"{node}'s GPU 2 trained down to x8"
    dsp = at_firmware_defaults(fleet, spare).path_bridges(0, 1)[0]
    assert ssh(fleet, spare, f"{SETPCI} -s {dsp} ECAP_ACS+0x6.w").strip() == "001d"


def p2p_read(fleet, node):
    """GPU0 -> GPU1 read status as the node's nvidia-smi stand-in prints it (None without one)."""
    if not (REPO / "lab" / "bin" / "nvidia-smi").exists():
        return None
    out = ssh(fleet, node, "nvidia-smi topo -p2p r")
    row = next(line.split() for line in out.splitlines() if line.split()[:2] == ["GPU0", "X"])
    return row[2]


def clear_acs(fleet, node, i, j):
    bridges = hw_of(fleet, node).path_bridges(i, j)
    ssh(
        fleet,
        node,
        "; ".join(f"setpci -O sysfs.path=/lab/hw/sys/bus/pci -s {b} ECAP_ACS+0x6.w=0000:002c" for b in bridges),
    )


def test_standins_follow_a_register_change_made_in_the_node(fleet, spare):
    model = at_firmware_defaults(fleet, spare)
    try:
        assert model.redirected(0, 1)
        assert p2p_read(fleet, spare) in ("CNS", None)
        clear_acs(fleet, spare, 0, 1)
        assert not model.redirected(0, 1), "the host-side model reads the registers the node wrote"
        assert p2p_read(fleet, spare) in ("OK", None)
        assert model.redirected(2, 3), "only the bridges written change"
    finally:
        at_firmware_defaults(fleet, spare)


UNIT = """[Unit]
Description=lab test: an enabled unit runs at boot
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'echo "$GPUFLEET_LAB_ROOT $(cat /proc/sys/kernel/random/boot_id)" > /run/lab-test-ran'
[Install]
WantedBy=multi-user.target
"""


def test_reboot_restores_firmware_defaults_and_empties_run(fleet, spare):
    clear_acs(fleet, spare, 0, 1)
    model = hw_of(fleet, spare)
    assert not model.redirected(0, 1)
    ssh(
        fleet,
        spare,
        f"echo here > /run/lab-marker; echo kept > /root/lab-disk; "
        f"echo {base64.b64encode(UNIT.encode()).decode()} | base64 -d "
        "> /etc/systemd/system/lab-test.service; "
        "systemctl enable --quiet lab-test.service",
    )
    try:
        before = ssh(fleet, spare, "cat /proc/sys/kernel/random/boot_id").strip()
        t0 = time.monotonic()
        lab_command(fleet.state, "reboot", spare)
        print(f"\nlab reboot: {time.monotonic() - t0:.1f} s")
        assert model.redirected(0, 1), "firmware puts ACS redirect back on"
        dsp = model.path_bridges(0, 1)[0]
        out = ssh(
            fleet,
            spare,
            f"{SETPCI} -s {dsp} ECAP_ACS+0x6.w; "
            "cat /proc/sys/kernel/random/boot_id; ls /run/lab-marker 2>&1; cat /root/lab-disk; "
            "systemctl is-system-running --wait; cat /run/lab-test-ran; "
            "journalctl --list-boots --no-pager | tail -n +2 | wc -l",
            check=False,
        ).splitlines()
        assert out[0] == "001d"
        assert out[1] != before and out[1] == model.root.joinpath("proc/sys/kernel/random/boot_id").read_text().strip()
        assert "No such file" in out[2], "/run is empty after a reboot"
        assert out[3] == "kept", "the node's disk survives a reboot"
        assert out[4] in ("running", "degraded")
        assert out[5] == f"/lab/hw {out[1]}", "the enabled unit ran in the new boot, with the lab's environment"
        assert int(out[6]) >= 2, "the journal keeps the boots before this one"
        if p2p_read(fleet, spare) is not None:
            assert p2p_read(fleet, spare) == "CNS"
    finally:
        ssh(
            fleet,
            spare,
            "systemctl disable --quiet lab-test.service; rm -f /etc/systemd/system/lab-test.service "
            "/root/lab-disk /run/lab-marker /run/lab-test-ran; systemctl daemon-reload",
            check=False,
        )


def test_ansible_reaches_every_host_of_the_generated_inventory(fleet, tmp_path, ansible_env):
    inventory = tmp_path / "hosts.yml"
    lab_command(fleet.state, "inventory", "--output", str(inventory))
    text = inventory.read_text()
    for key in (
        "gpu_nodes:",
        "balancer:",
        "ansible_connection: local",
        "gpufleet_sysfs_path: /lab/hw/sys/bus/pci",
        "lab_expect_registered: false",
        "lab_haproxy_backend: vllm_pool",
    ):
        assert key in text
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "-i", str(inventory), "all", "-m", "ping"],
        cwd=REPO,
        env=ansible_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for host in [n["name"] for n in fleet.data()["nodes"]] + ["lab-balancer"]:
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
    for f in (
        "/etc/environment",
        "/etc/hosts",
        "/etc/hostname",
        "/etc/machine-id",
        "/etc/haproxy/haproxy.cfg",
        "/root/.ssh/authorized_keys",
    ):
        snap[f] = Path(f).read_bytes() if os.path.exists(f) else None
    return snap


def _serve(state, node):
    """Make node a serving one, as site.yml leaves it but in seconds: the vLLM stand-in as a
    unit, with traffic, and a unit that keeps forking (what races a kill-by-PID loop)."""
    fleet = Fleet(state)
    spec = next(n for n in fleet.data()["nodes"] if n["name"] == node)
    from lab.standins.vllm_server import CHECKPOINTS

    model = (
        "meta-llama/Llama-3.1-8B-Instruct" if "meta-llama/Llama-3.1-8B-Instruct" in CHECKPOINTS else min(CHECKPOINTS)
    )
    ssh(
        fleet,
        node,
        "systemd-run --quiet --unit=lab-vllm --setenv=GPUFLEET_LAB_VLLM_STARTUP_S=0 "
        f"/usr/local/bin/vllm serve {model} --tensor-parallel-size 4 "
        "--host 0.0.0.0 --port 8000; "
        "systemd-run --quiet --unit=lab-forks /bin/sh -c "
        "'trap \"\" TERM; while :; do sleep 0.2 & wait; done'",
    )
    url = f"http://{spec['address']}:8000"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        assert time.monotonic() < deadline, ssh(
            fleet, node, "journalctl -u lab-vllm --no-pager | tail -20", check=False
        )
        time.sleep(0.2)
    body = json.dumps({"prompt": list(range(1000, 1064)), "max_tokens": 4}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200


@pytest.mark.needs_lab  # labs of its own
def test_down_leaves_nothing_and_up_down_up_works(tmp_path):
    """Up, serve, down, three times: every down succeeds on the first try and leaves nothing (the
    node's processes, veth, cgroup, namespaces, mounts, files), even with its records lost."""
    state = new_state("cycle")
    host_before = _host_config()
    try:
        for cycle in range(3):
            lab_command(state, "up", "--nodes", "1", "--profiles", "l40s-4x-switch", timeout=300)
            fleet = Fleet(state)
            if cycle == 0:
                assert len(fleet.balancer().command("show servers state vllm_pool").strip().splitlines()) == 2, (
                    "a new lab's pool is empty (a version line and the header)"
                )
            m = fleet.machines()[0]
            _serve(state, m.name)
            pid1, veth, cgroup = m.pid(), m.spec["veth"], fleet.cgroup
            netns = os.readlink(f"/proc/{pid1}/ns/net")
            pids = [int(p) for procs in cgroup.rglob("cgroup.procs") for p in procs.read_text().split()]
            hap = fleet.balancer().pid()
            assert pid1 and hap and len(pids) > 5 and Path(f"/sys/class/net/{veth}").exists()
            if cycle == 1:  # the lab's records lost: down still finds everything (cgroups, veth names)
                (state / "lab.json").unlink()
            t0 = time.monotonic()
            lab_command(state, "down")  # once: a second try must never be needed
            print(f"\ncycle {cycle}: lab down of a serving node in {time.monotonic() - t0:.1f} s")
            assert not [p for p in pids + [hap] if _alive(p)], "processes left after down"
            assert not Path(f"/sys/class/net/{veth}").exists(), "veth left after down"
            assert not cgroup.exists(), "cgroup left after down"
            assert netns not in _net_namespaces(), "the node's network namespace outlived it"
            with open("/proc/self/mountinfo") as f:
                assert str(state) not in f.read()
            assert sorted(p.name for p in state.iterdir()) == ["lock"], f"cycle {cycle}: files left in the state dir"
        proc = lab_command(state, "down")
        assert "nothing was running" in proc.stdout
        assert _host_config() == host_before, "the lab changed the host's configuration"
    finally:
        lab_command(state, "down", check=False)
        shutil.rmtree(state, ignore_errors=True)
