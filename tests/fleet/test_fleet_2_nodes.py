# SPDX-License-Identifier: GPL-3.0-or-later
"""What site.yml leaves on every node, read with testinfra over the lab's SSH."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
import yaml

import lab.hwmodel as hw
from tests.harness.inventory import node_inventory_hosts
from tests.harness.lab import FLEET_PROFILES, server_unit

pytestmark = pytest.mark.slow

# As conftest.py names them: node1, node2, ... in the order of GPUFLEET_FLEET_PROFILES.
PROFILES = FLEET_PROFILES
NODES = [
    pytest.param(f"node{i + 1}", hw.PROFILES[p].get("expect_registered", True), id=f"node{i + 1}-{p}")
    for i, p in enumerate(PROFILES)
]

ENV_FILE = "/etc/gpufleet/gpu-runtime.env"
MARKER = "/run/gpufleet/nccl-gate.json"
SETPCI = "setpci -O sysfs.path=/lab/hw/sys/bus/pci"


def _env(text):
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def _acs_writes(unit_text):
    """[(bdf, value, mask)] of the boot unit's `setpci -s BDF ECAP_ACS+0x6.w=VALUE:MASK` lines."""
    found = re.findall(
        r"^ExecStart=\S*setpci .*?-s (\S+) ECAP_ACS\+0x6\.w=([0-9a-f]+):([0-9a-f]+)\s*$", unit_text, re.M | re.I
    )
    return [(bdf, int(v, 16), int(m, 16)) for bdf, v, m in found]


@pytest.mark.parametrize("node,registered", NODES)
def test_env_file_and_the_services_that_read_it(converged, node, registered):
    host = converged.host(node)
    f = host.file(ENV_FILE)
    assert f.exists and f.user == "root" and f.group == "root" and f.mode == 0o644
    env = _env(f.content_string)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True", env
    assert env.get("NCCL_P2P_LEVEL") in ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS"), env
    # NCCL_IB_DISABLE=1 only where the node has no RDMA NIC
    assert ("NCCL_IB_DISABLE" in env) == (not converged.hw(node).nics), env
    for unit in ("vllm.service", "gpufleet-nccl-gate.service"):
        dropin = host.file(f"/etc/systemd/system/{unit}.d/10-gpu-runtime-env.conf")
        assert dropin.exists and dropin.mode == 0o644
        assert f"EnvironmentFile=-{ENV_FILE}" in dropin.content_string
    if registered:
        # the running server (vLLM, or llama.cpp's on a node of GPUs of different sizes) got
        # exactly the file's variables
        unit = server_unit(node)
        pid = converged.sh(node, f"systemctl show -p MainPID --value {unit}").strip()
        assert pid not in ("", "0"), f"{unit} is not running"
        proc_env = _env(converged.sh(node, f"tr '\\0' '\\n' < /proc/{pid}/environ"))
        for key, value in env.items():
            assert proc_env.get(key) == value, (key, value, proc_env.get(key))


@pytest.mark.parametrize("node,registered", NODES)
def test_units_enabled(converged, node, registered):
    host = converged.host(node)
    acs = host.service("gpufleet-acs.service")
    assert acs.is_enabled, "the ACS boot unit must be enabled on every node whose ACS was cleared"
    unit = host.file("/etc/systemd/system/gpufleet-acs.service")
    assert unit.user == "root" and unit.mode == 0o644
    assert "WantedBy=sysinit.target" in unit.content_string
    # boot validation on every node; it starts vLLM at boot, so vLLM itself is not enabled
    assert host.service("gpufleet-validate.service").is_enabled
    agent = host.service("gpufleet-lb-agent.socket")
    server = server_unit(node)
    vllm = host.service(server)
    # the agent comes with registration, which a node that failed its gate never reached
    assert (
        agent.is_enabled and agent.is_running
        if registered
        else not host.file("/etc/systemd/system/gpufleet-lb-agent.socket").exists
    )
    if registered:
        assert vllm.is_running and not vllm.is_enabled
        assert host.file(f"/etc/systemd/system/{server}").mode == 0o644
    else:
        # the gate stopped the node before the serving role: no server was installed
        assert not host.file("/etc/systemd/system/vllm.service").exists
        assert not vllm.is_running


def _burst(address, port, count, timeout=20.0):
    """{answer: how many} of `count` connections opened at once (from the host: the balancer's address)."""
    import socket
    import time

    socks = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((address, port))
        socks.append(s)
    deadline = time.monotonic() + timeout
    answers = {}
    for s in socks:
        s.setblocking(True)
        s.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            got = s.recv(200).decode().strip()
        except OSError as exc:  # over MaxConnections: closed at once
            got = type(exc).__name__
        answers[got] = answers.get(got, 0) + 1
        s.close()
    return answers


# asked from a second address of the node's own (on lo): the agent's socket lets the node's own
# address in (validate.yml's check), not this one
_ASK_FROM = """
import socket, sys
def ask(source):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.bind((source, 0))
        s.connect((sys.argv[1], 9777))
        return s.recv(100).decode().strip() or "closed"
    except OSError as exc:
        return type(exc).__name__
    finally:
        s.close()
print(ask(sys.argv[1]), ask("198.51.100.7"))
"""


def test_agent_tells_the_balancer_only(converged):
    """The node's HAProxy agent listens on the node's address, answers the balancer's address only,
    says one word (no boot id), and a burst of connections leaves its socket listening."""
    import shlex

    node = converged.healthy[0]
    address = converged.nodes[node]["address"]
    boot_id = converged.sh(node, "cat /proc/sys/kernel/random/boot_id").strip()
    assert (
        converged.sh(node, "systemctl show -p Listen --value gpufleet-lb-agent.socket").split()[0] == f"{address}:9777"
    )
    assert converged.agent_verdict(node) == "up"
    out = converged.sh(
        node,
        "ip addr add 198.51.100.7/32 dev lo && "
        f"{{ python3 -c {shlex.quote(_ASK_FROM)} {address}; rc=$?; ip addr del 198.51.100.7/32 dev lo; exit $rc; }}",
    )
    # the kernel drops the other address's SYN (IPAddressDeny=any): no answer, not even a refusal
    assert out.split() == ["up", "TimeoutError"], out
    # 300 at once from the balancer's address (systemd's default trigger limit, 200 in 2 s, would
    # put the socket into a failed state, and HAProxy ignores an agent it cannot reach)
    answers = _burst(address, 9777, 300)
    assert answers.get("up", 0) >= 16 and set(answers) <= {"up", "", "ConnectionResetError"}, answers
    assert not any(boot_id in a for a in answers)
    state = converged.unit_state(node, "gpufleet-lb-agent.socket")
    assert (state["ActiveState"], state["SubState"], state["Result"]) == ("active", "listening", "success"), state
    assert converged.agent_verdict(node) == "up"
    assert converged.wait_pool(lambda p: p[node]["op_state"] == "running")[node]["op_state"] == "running"


@pytest.mark.parametrize("node,registered", NODES)
def test_config_files_and_modes(converged, node, registered):
    host = converged.host(node)
    if registered and server_unit(node) == "llama-server.service":
        args = host.file("/etc/llamacpp/llama-server.env")
        assert args.user == "root" and args.mode == 0o644, oct(args.mode)
        assert re.search(r"^LLAMACPP_SERVER_ARGS=\".*--n-gpu-layers \d+ .*--tensor-split ", args.content_string, re.M)
        unit = host.file("/etc/systemd/system/llama-server.service").content_string
        assert "EnvironmentFile=/etc/llamacpp/llama-server.env" in unit and "$LLAMACPP_SERVER_ARGS" in unit
        assert not host.file("/etc/vllm/config.yaml").exists, "no vLLM config on a node llama.cpp serves"
        return
    config, secrets = host.file("/etc/vllm/config.yaml"), host.file("/etc/vllm/secrets.env")
    if not registered:
        assert not config.exists and not secrets.exists, "nothing of vLLM on a node that failed its gate"
        return
    assert config.user == "root" and config.mode == 0o644
    data = yaml.safe_load(config.content_string)
    assert "Llama-3.3-70B-Instruct-FP8" in f"{data.get('model')} {data.get('served_model_name')}", data
    assert data["port"] == 8000, data
    gpus = len([g for g in converged.hw(node).gpus if g.driver == "nvidia"])
    assert data["tensor_parallel_size"] * data.get("pipeline_parallel_size", 1) <= gpus, data
    assert secrets.user == "root" and secrets.mode == 0o600, "secrets must be 0600"
    unit = host.file("/etc/systemd/system/vllm.service").content_string
    assert "serve --config /etc/vllm/config.yaml" in unit
    assert "EnvironmentFile=/etc/vllm/secrets.env" in unit


@pytest.mark.parametrize("node,registered", NODES)
def test_marker_is_for_the_current_boot(converged, node, registered):
    host = converged.host(node)
    marker = host.file(MARKER)
    assert marker.exists, f"no gate marker on {node}"
    data = json.loads(marker.content_string)
    boot_id = host.file("/proc/sys/kernel/random/boot_id").content_string.strip()
    assert data["boot_id"] == boot_id
    assert boot_id == converged.nodes[node]["boot_id"], "the node's boot id is the lab's"
    assert data["passed"] is registered, data
    if registered:
        assert data["kind"] == "ok" and data["judged_busbw_gbps"] >= data["threshold_gbps"], data
    else:
        assert data["kind"] == "low_bandwidth" and "x8 of x16" in data["reason"], data
    result = json.loads(host.file(data["result_path"]).content_string)
    assert result["boot_id"] == boot_id and result["passed"] is registered
    prom = host.file("/var/lib/node_exporter/textfile_collector/gpufleet_nccl.prom").content_string
    assert re.search(rf'^gpufleet_nccl_gate_passed\{{kind="{data["kind"]}"\}} {int(registered)}$', prom, re.M), prom


@pytest.mark.parametrize("node,registered", NODES)
def test_registration_state(converged, node, registered):
    address = converged.nodes[node]["address"]
    if registered:
        assert converged.agent_verdict(node) == "up"
        # HAProxy's health check reaches /health and the agent says up: the server goes up
        pool = converged.wait_pool(lambda p: p.get(node, {}).get("op_state") == "running")
        assert pool.get(node, {}).get("state") == "ready", pool
        assert pool[node]["op_state"] == "running", pool
        assert (pool[node]["address"], pool[node]["port"]) == (address, 8000)
        assert (pool[node]["agent_address"], pool[node]["agent_port"]) == (address, 9777), pool
        assert converged.config_servers().get(node) == f"{address}:8000"
        line = re.search(rf"^\s+server {node} .*$", Path(converged.balancer["config"]).read_text(), re.M)[0]
        assert f"check agent-check agent-addr {address} agent-port 9777" in line, line
    else:
        # out of rotation, known to the balancer: drained, its line kept in the config file
        converged.assert_drained(node)


@pytest.mark.parametrize("node,registered", NODES)
def test_acs_redirect_cleared_on_the_gpu_paths(converged, node, registered):
    unit = converged.host(node).file("/etc/systemd/system/gpufleet-acs.service").content_string
    writes = _acs_writes(unit)
    assert writes, f"no setpci write in the boot unit:\n{unit}"
    for bdf, value, mask in writes:
        now = int(converged.sh(node, f"{SETPCI} -s {bdf} ECAP_ACS+6.w").strip(), 16)
        assert now & mask == value & mask, f"{node} {bdf}: ACSCtl {now:#06x}, wanted {value:#06x} under {mask:#06x}"
    model = converged.hw(node)
    gpus = [g.index for g in model.gpus]
    assert not [(i, j) for i, j in itertools.combinations(gpus, 2) if model.redirected(i, j)]


@pytest.mark.parametrize("node,registered", NODES)
def test_boot_validation_is_installed(converged, node, registered):
    host = converged.host(node)
    directory = host.file("/etc/gpufleet/validate")
    assert directory.is_directory and directory.user == "root" and directory.mode == 0o700
    inventory = host.file("/etc/gpufleet/validate/inventory.yml")
    assert inventory.user == "root" and inventory.mode == 0o600
    hosts = node_inventory_hosts(inventory.content_string)
    assert list(hosts) == [node]
    local = hosts[node]
    assert local["ansible_connection"] == "local" and local["lb_registration_balancer"] == ""
    assert local["vllm_server_model"] == "Llama-3.3-70B-Instruct-FP8"
    assert local["gpufleet_sysfs_path"] == "/lab/hw/sys/bus/pci"
    assert "lb_registration_socket" not in local and "nccl_gate_force" not in local
    unit = host.file("/etc/systemd/system/gpufleet-validate.service").content_string
    assert re.search(r"^ExecStart=/\S+/ansible-playbook gpufleet\.node\.validate$", unit, re.M), unit
    assert re.search(r"^After=.*gpufleet-acs\.service", unit, re.M), unit
    # the playbook's collection is there for the node's run
    cfg = host.file("/etc/gpufleet/validate/ansible.cfg").content_string
    collections = re.search(r"^collections_path = (\S+)$", cfg, re.M)[1]
    assert host.file(f"{collections}/ansible_collections/gpufleet/node/playbooks/validate.yml").exists
