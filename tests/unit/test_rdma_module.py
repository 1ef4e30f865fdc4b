# SPDX-License-Identifier: GPL-3.0-or-later
"""Module rdma_health_info as Ansible runs it (tests/harness/modules.py:run_module) on sysfs
trees of RDMA nodes, with fake ibv_devinfo/ibstat scripts that record their argv and print the
real outputs of tests/data/rdma."""

from __future__ import annotations

import json

from tests.harness.modules import run_module
from tests.unit.rdma_tree import DATA, NDR_PORT, Node, hgx_ndr

DESIGN = {"ports": 8, "rate_gbps": 400, "link_layer": "InfiniBand"}
HDR_PORT = dict(NDR_PORT, rate="200 Gb/sec (4X HDR)\n")
CX6 = {"fw_ver": "20.37.1700\n", "hca_type": "MT4123\n", "board_id": "MT_0000000594\n"}


def args(node, **extra):
    return dict({"sysfs_path": str(node.sys), "dev_path": str(node.dev), "sample_interval": 0.1}, **extra)


def fake_tool(tmp_path, name, sample, rc=0):
    """A script that writes its argv (one per line) to ``<name>.argv`` and prints ``sample``."""
    script = tmp_path / name
    record = tmp_path / (name + ".argv")
    script.write_text(
        "#!/bin/sh\nprintf '%%s\\n' \"$0\" \"$@\" > '%s'\ncat '%s'\nexit %d\n" % (record, DATA / sample, rc)
    )
    script.chmod(0o755)
    return script, record


def hdr_node(tmp_path):
    """Two ConnectX-6 HDR ports, named as in the ibv_devinfo sample of openucx/ucx#9908."""
    node = Node(tmp_path / "node")
    node.add(
        "mlx5_0", "0000:0e:00.0", ("0000:00:01.1", "0000:03:00.0", "0000:04:04.0"), {1: dict(HDR_PORT)}, CX6, "uverbs0"
    )
    node.add(
        "mlx5_1", "0000:0e:00.1", ("0000:00:01.1", "0000:03:00.0", "0000:04:04.0"), {1: dict(HDR_PORT)}, CX6, "uverbs1"
    )
    return node


def test_a_healthy_node_passes_and_reports_its_devices(tmp_path):
    node = hgx_ndr(tmp_path / "node")
    record = tmp_path / "rdma-counters.json"
    result = run_module("rdma_health_info", args(node, expect=DESIGN, record_path=str(record)))
    assert not result.get("failed"), result.get("msg")
    assert (result["changed"], result["status"], result["passed"], result["action"]) == (False, "pass", True, "none")
    assert [(c["name"], c["status"]) for c in result["checks"]] == [
        ("port_count", "pass"),
        ("readable", "pass"),
        ("port_state", "pass"),
        ("link_layer", "pass"),
        ("rate", "pass"),
        ("link_flap", "pass"),
        ("error_counters", "pass"),
        ("verbs_device", "pass"),
    ]
    assert [d["name"] for d in result["devices"]] == ["mlx5_%d" % i for i in range(8)]
    assert result["devices"][0]["ports"][0]["rate_gbps"] == 400.0
    assert result["tools"] == [] and "warnings" not in result
    assert result["record"]["written"] is True
    assert sorted(json.loads(record.read_text())["ports"]) == ["mlx5_%d/1" % i for i in range(8)]


def test_a_failing_node_fails_the_task_with_the_full_result(tmp_path):
    node = hgx_ndr(tmp_path)
    node.write("mlx5_6", 1, "state", "1: DOWN\n")
    node.write("mlx5_6", 1, "phys_state", "2: Polling\n")
    result = run_module("rdma_health_info", args(node, expect=DESIGN))
    assert result["failed"] is True
    assert result["msg"] == (
        "RDMA fabric unhealthy (drain and inspect the hardware): port_state: mlx5_6/1: DOWN, Polling "
        "(no link partner: the cable, the transceiver or the switch port)"
    )
    assert (result["status"], result["changed"], len(result["devices"])) == ("fail", False, 8)
    assert {c["name"]: c["status"] for c in result["checks"]}["port_state"] == "fail"


def test_warnings_are_reported_as_warnings(tmp_path):
    node = hgx_ndr(tmp_path)
    node.write("mlx5_4", 1, "rate", "200 Gb/sec (2X NDR)\n")
    result = run_module("rdma_health_info", args(node))
    assert not result.get("failed") and result["status"] == "warn"
    assert [w["event"]["msg"] if isinstance(w, dict) else w for w in result["warnings"]] == [
        "rate: ports disagree: mlx5_4/1 at 200 Gb/s (2X NDR), while others run at 400 Gb/s (give "
        "expect.rate_gbps to judge against the design)"
    ]


def test_check_mode_writes_no_record(tmp_path):
    node = hgx_ndr(tmp_path / "node")
    record = tmp_path / "rdma-counters.json"
    result = run_module("rdma_health_info", args(node, expect=DESIGN, record_path=str(record)), check_mode=True)
    assert (result["status"], result["record"]["written"], record.exists()) == ("pass", False, False)


def test_ibv_devinfo_fills_a_rate_sysfs_could_not_read(tmp_path):
    node = hdr_node(tmp_path)
    node.write("mlx5_0", 1, "rate", None)
    script, argv = fake_tool(tmp_path, "ibv_devinfo", "ibv_devinfo-v-cx6-hdr-ib.txt")
    result = run_module(
        "rdma_health_info",
        args(
            node,
            expect={"ports": 2, "rate_gbps": 200, "link_layer": "InfiniBand"},
            ibv_devinfo=str(script),
            ibstat=str(tmp_path / "absent" / "ibstat"),
        ),
    )
    assert not result.get("failed"), result.get("msg")
    assert argv.read_text().splitlines() == [str(script), "-v"]
    assert result["tools"] == [
        {
            "name": "ibv_devinfo",
            "argv": [str(script), "-v"],
            "rc": 0,
            "filled": ["mlx5_0/1 rate"],
            "problems": [],
            "error": None,
        }
    ]
    port = result["devices"][0]["ports"][0]
    rate_file = node.sys / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "rate"
    assert (port["rate_gbps"], port["width"], port["speed"], port["unreadable"]) == (200.0, "4X", "HDR", [])
    assert port["filled"] == {"rate": "ibv_devinfo (sysfs %s: missing)" % rate_file}


def test_ibstat_fills_when_ibv_devinfo_is_absent(tmp_path):
    node = hgx_ndr(tmp_path / "node", count=2)
    node.write("mlx5_1", 1, "state", None)
    script, argv = fake_tool(tmp_path, "ibstat", "ibstat-h100-cx7-ndr-ib.txt")
    result = run_module(
        "rdma_health_info",
        args(node, expect={"ports": 2}, ibv_devinfo=str(tmp_path / "none" / "ibv_devinfo"), ibstat=str(script)),
    )
    assert not result.get("failed"), result.get("msg")
    assert argv.read_text().splitlines() == [str(script)]
    assert [(t["name"], t["argv"], t["filled"], t["error"]) for t in result["tools"]] == [
        ("ibv_devinfo", None, [], "%s is not an executable file" % (tmp_path / "none" / "ibv_devinfo")),
        ("ibstat", [str(script)], ["mlx5_1/1 state"], None),
    ]
    port = result["devices"][1]["ports"][0]
    assert (port["state"], port["state_id"]) == ("ACTIVE", 4)


def test_a_tool_that_exits_non_zero_fills_nothing_and_the_field_stays_unreadable(tmp_path):
    node = hdr_node(tmp_path)
    node.write("mlx5_1", 1, "link_layer", None)
    script, _argv = fake_tool(tmp_path, "ibstat", "ibstat-a100-cx6-hdr-ib-ibpanic.txt", rc=255)
    result = run_module(
        "rdma_health_info",
        args(node, expect={"ports": 2}, ibv_devinfo=str(tmp_path / "no-ibv_devinfo"), ibstat=str(script)),
    )
    assert result["failed"] is True
    readable = {c["name"]: c for c in result["checks"]}["readable"]
    link_layer = node.sys / "class" / "infiniband" / "mlx5_1" / "ports" / "1" / "link_layer"
    # The tool's message is the end of what it printed (here all on stdout, as captured).
    assert readable["reason"].startswith(
        "unreadable, so not judged healthy: %s: missing (not filled by the tools: ibv_devinfo: %s is not an "
        "executable file; ibstat: exited 255: " % (link_layer, tmp_path / "no-ibv_devinfo")
    )
    assert readable["reason"].endswith(
        "Link layer: InfiniBand\nibpanic: [1400444] main: stat of IB device 'mlx5_8' failed: No such file or directory)"
    )
    assert result["tools"][1]["rc"] == 255


def test_arguments_that_cannot_be_judged_against_fail_the_task(tmp_path):
    node = hgx_ndr(tmp_path)
    result = run_module("rdma_health_info", args(node, counter_limits={"symbol_errors": 1}))
    assert result["failed"] is True and result["msg"].startswith(
        "counter_limits: 'symbol_errors' is not a judged counter"
    )
    result = run_module("rdma_health_info", args(node, expect={"rate_gbps": 0}))
    assert result["msg"] == "expect.rate_gbps must be a rate above 0 Gb/s, not 0.0"
    result = run_module("rdma_health_info", {"sysfs_path": str(tmp_path / "nowhere")})
    assert result["msg"] == (
        "%s is not a sysfs tree (it has no class directory): point sysfs_path at the directory sysfs is mounted "
        "on, /sys on a node" % (tmp_path / "nowhere")
    )
