# SPDX-License-Identifier: GPL-3.0-or-later
"""fabric/_run and its checks on sysfs trees of RDMA nodes (tests/unit/rdma_tree.py), with the
sleep between the two reads and the clocks passed in: a counter grows "between" the reads
without a wait."""

from __future__ import annotations

import json

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.fabric import _record, _run
from tests.unit.rdma_tree import NDR_PORT, Node, hgx_ndr

NOW = 1764403200.0
NO_TOOLS = {"ibv_devinfo": (None, "ibv_devinfo is not installed"), "ibstat": (None, "ibstat is not installed")}
DESIGN = {"ports": 8, "rate_gbps": 400.0, "link_layer": "InfiniBand"}


class Clock:
    """A monotonic clock that the fake sleep advances."""

    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def run(node, between=None, expect=None, interval=2.0, binaries=None, tool=None, wall=NOW, write=True, **params):
    """One run of the fabric check on ``node``; ``between(node)`` changes the tree between the
    two reads (the sleep)."""
    clock = Clock()

    def sleep(seconds):
        clock.t += seconds
        if between:
            between(node)

    params = dict(
        sysfs_path=str(node.sys),
        dev_path=str(node.dev),
        expect=DESIGN if expect is None else expect,
        sample_interval=interval,
        **params,
    )
    return _run.run(
        params,
        binaries or NO_TOOLS,
        tool,
        write_record=write,
        sleep=sleep,
        clock=clock,
        wall=lambda: wall,
    )


def by_name(result):
    return {c["name"]: c for c in result["checks"]}


def statuses(result):
    return {c["name"]: c["status"] for c in result["checks"]}


ALL_PASS = {
    "port_count": "pass",
    "readable": "pass",
    "port_state": "pass",
    "link_layer": "pass",
    "rate": "pass",
    "link_flap": "pass",
    "error_counters": "pass",
    "verbs_device": "pass",
}


def test_a_healthy_hgx_node_of_eight_ndr_ports_passes_every_check(tmp_path):
    result = run(hgx_ndr(tmp_path))
    assert statuses(result) == ALL_PASS
    assert (result["status"], result["action"], result["passed"]) == ("pass", "none", True)
    assert result["windows"] == [{"name": "in 2.0 s", "seconds": 2.0}]
    checks = by_name(result)
    assert checks["port_count"]["reason"] == "8 ports, as expected: " + ", ".join("mlx5_%d/1" % i for i in range(8))
    assert checks["link_flap"]["reason"] == "link_downed steady in 2.0 s"
    device = result["devices"][3]
    assert {k: device[k] for k in ("name", "fw_ver", "hca_type", "board_id", "pci_address", "pcie_path")} == {
        "name": "mlx5_3",
        "fw_ver": "28.41.1000",
        "hca_type": "MT4129",
        "board_id": "MT_0000000838",
        "pci_address": "0000:48:00.0",
        "pcie_path": ["0000:00:01.3", "0000:46:00.0", "0000:47:00.0"],
    }
    assert (device["link_layer"], device["uverbs"], device["verbs_device_present"], device["judged"]) == (
        "InfiniBand",
        "uverbs3",
        True,
        True,
    )
    port = device["ports"][0]
    assert {k: port[k] for k in ("port", "state", "state_id", "phys_state", "phys_state_id")} == {
        "port": 1,
        "state": "ACTIVE",
        "state_id": 4,
        "phys_state": "LinkUp",
        "phys_state_id": 5,
    }
    assert (port["rate_gbps"], port["width"], port["speed"], port["link_layer"]) == (400.0, "4X", "NDR", "InfiniBand")
    assert (port["counters"]["link_downed"], port["counters"]["port_xmit_data"], port["unreadable"]) == (
        0,
        205143497464492,
        [],
    )


def test_a_port_polling_fails_port_state_naming_it(tmp_path):
    node = hgx_ndr(tmp_path)
    node.write("mlx5_6", 1, "state", "1: DOWN\n")
    node.write("mlx5_6", 1, "phys_state", "2: Polling\n")
    result = run(node)
    check = by_name(result)["port_state"]
    assert (check["status"], check["ports"], check["action"]) == (
        "fail",
        ["mlx5_6/1"],
        "drain and inspect the hardware",
    )
    assert check["reason"] == (
        "mlx5_6/1: DOWN, Polling (no link partner: the cable, the transceiver or the switch port)"
    )
    assert (result["status"], result["passed"]) == ("fail", False)
    # A port that is down has no rate to judge; the others still run at 400.
    assert by_name(result)["rate"]["reason"] == "every active port at 400 Gb/s (1 not active, see port_state)"
    assert by_name(result)["rate"]["status"] == "pass"


def test_a_disabled_port_and_one_no_subnet_manager_activated_call_for_configuration(tmp_path):
    node = hgx_ndr(tmp_path)
    node.write("mlx5_1", 1, "state", "1: DOWN\n")
    node.write("mlx5_1", 1, "phys_state", "3: Disabled\n")
    node.write("mlx5_2", 1, "state", "2: INIT\n")
    check = by_name(run(node))["port_state"]
    assert (check["status"], check["ports"], check["action"]) == (
        "fail",
        ["mlx5_1/1", "mlx5_2/1"],
        "fix the node configuration",
    )
    assert check["reason"] == (
        "mlx5_1/1: DOWN, Disabled (the port is disabled: by the switch, the subnet manager or ibportstate); "
        "mlx5_2/1: INIT, LinkUp (the link is up but no subnet manager made it ACTIVE: is opensm or UFM running?)"
    )


def test_a_port_at_200_among_400_fails_against_the_design_and_warns_without_one(tmp_path):
    node = hgx_ndr(tmp_path)
    node.write("mlx5_4", 1, "rate", "200 Gb/sec (2X NDR)\n")
    check = by_name(run(node))["rate"]
    assert (check["status"], check["ports"], check["action"]) == (
        "fail",
        ["mlx5_4/1"],
        "drain and inspect the hardware",
    )
    assert check["reason"] == (
        "mlx5_4/1 at 200 Gb/s (2X NDR), 400 Gb/s expected: a link trained down - reseat or replace the cable "
        "or transceiver, check the switch port"
    )
    result = run(node, expect={})
    check = by_name(result)["rate"]
    assert (check["status"], check["ports"]) == ("warn", ["mlx5_4/1"])
    assert check["reason"] == (
        "ports disagree: mlx5_4/1 at 200 Gb/s (2X NDR), while others run at 400 Gb/s (give expect.rate_gbps to "
        "judge against the design)"
    )
    assert result["status"] == "warn" and result["passed"] is True


def test_a_rate_above_the_design_warns_that_the_expectation_may_be_wrong(tmp_path):
    check = by_name(run(hgx_ndr(tmp_path), expect=dict(DESIGN, rate_gbps=200.0)))["rate"]
    assert (check["status"], check["action"]) == ("warn", "fix the node configuration")
    assert check["reason"].endswith("faster than the 200 Gb/s expected: is expect.rate_gbps right for this design?")


def test_link_downed_growing_between_the_two_reads_is_a_flap(tmp_path):
    def flap(node):
        node.write("mlx5_2", 1, "counters/link_downed", "2\n")

    result = run(hgx_ndr(tmp_path), between=flap)
    check = by_name(result)["link_flap"]
    assert (check["status"], check["ports"], check["action"]) == (
        "fail",
        ["mlx5_2/1"],
        "drain and inspect the hardware",
    )
    assert check["reason"] == (
        "mlx5_2/1: link_downed rose by 2 in 2.0 s (0 -> 2): the link went down and retrained; reseat or replace "
        "the cable or transceiver, check the switch port"
    )
    assert result["devices"][2]["ports"][0]["counters"]["link_downed"] == 2


def test_one_read_without_a_record_cannot_measure_flaps_and_says_so(tmp_path):
    result = run(hgx_ndr(tmp_path), interval=0)
    for name in ("link_flap", "error_counters"):
        check = by_name(result)[name]
        assert (check["status"], check["reason"]) == (
            "warn",
            "not measured: one read (sample_interval 0) and no earlier counter record (record_path)",
        )
    assert result["windows"] == []


@pytest.mark.parametrize(
    ("grown", "status"),
    [(2, "pass"), (3, "fail")],
)
def test_symbol_errors_above_two_a_minute_fail(tmp_path, grown, status):
    """NVSentinel's symbol_error_fatal (120/hour); over a 2 s window the rate is taken over a
    minute, so 3 errors are 3/min, 2 are the limit."""

    def errors(node):
        node.write("mlx5_5", 1, "counters/symbol_error", "%d\n" % grown)

    check = by_name(run(hgx_ndr(tmp_path), between=errors))["error_counters"]
    assert check["status"] == status
    if status == "fail":
        assert check["ports"] == ["mlx5_5/1"]
        assert check["reason"] == (
            "mlx5_5/1: symbol_error rose by 3 in 2.0 s (3.0/min; limit 2/min); reseat or replace the cable or "
            "transceiver, check the switch port"
        )


def test_any_excessive_buffer_overrun_fails_and_port_rcv_errors_only_warn(tmp_path):
    def errors(node):
        node.write("mlx5_0", 1, "counters/excessive_buffer_overrun_errors", "1\n")
        node.write("mlx5_1", 1, "counters/port_rcv_errors", "601\n")

    check = by_name(run(hgx_ndr(tmp_path), between=errors))["error_counters"]
    assert (check["status"], check["ports"]) == ("fail", ["mlx5_0/1", "mlx5_1/1"])
    assert check["reason"].startswith(
        "mlx5_0/1: excessive_buffer_overrun_errors rose by 1 in 2.0 s (1.0/min; limit any increase); "
        "mlx5_1/1: port_rcv_errors rose by 601 in 2.0 s (601.0/min; limit 600/min)"
    )


def test_counter_limits_replace_the_defaults_and_refuse_unknown_counters(tmp_path):
    def errors(node):
        node.write("mlx5_5", 1, "counters/symbol_error", "3\n")

    check = by_name(run(hgx_ndr(tmp_path), between=errors, counter_limits={"symbol_error": 5}))["error_counters"]
    assert check["status"] == "pass"
    with pytest.raises(_run.FabricError, match="'link_down' is not a judged counter"):
        run(hgx_ndr(tmp_path / "other"), counter_limits={"link_down": 1})


def test_a_counter_that_reads_n_a_is_unreadable_and_fails_naming_the_file(tmp_path):
    node = hgx_ndr(tmp_path)
    node.write("mlx5_7", 1, "counters/link_downed", "N/A (no PMA)\n")
    result = run(node)
    check = by_name(result)["readable"]
    path = node.sys / "class" / "infiniband" / "mlx5_7" / "ports" / "1" / "counters" / "link_downed"
    assert (check["status"], check["ports"], check["action"]) == (
        "fail",
        ["mlx5_7/1"],
        "drain and inspect the hardware",
    )
    # A counter is read from sysfs only: no tool is run for it.
    assert check["reason"] == "unreadable, so not judged healthy: %s: reads 'N/A (no PMA)', not an integer" % path
    assert result["tools"] == []
    assert result["status"] == "fail"
    assert "link_downed" not in result["devices"][7]["ports"][0]["counters"]


def test_a_missing_counters_directory_and_a_missing_link_downed_are_unreadable(tmp_path):
    node = hgx_ndr(tmp_path)
    node.write("mlx5_0", 1, "counters/link_downed", None)
    check = by_name(run(node))["readable"]
    assert check["reason"] == "unreadable, so not judged healthy: mlx5_0/1: no counters/link_downed"


def test_a_missing_verbs_node_fails_verbs_device(tmp_path):
    node = hgx_ndr(tmp_path)
    (node.dev / "infiniband" / "uverbs5").unlink()
    result = run(node)
    check = by_name(result)["verbs_device"]
    assert (check["status"], check["ports"], check["action"]) == ("fail", ["mlx5_5/1"], "fix the node configuration")
    assert check["reason"] == (
        "%s (mlx5_5) is missing: RDMA verbs are unusable - load ib_uverbs, check the udev rules, or give a "
        "container /dev/infiniband" % (node.dev / "infiniband" / "uverbs5")
    )
    assert result["devices"][5]["verbs_device_present"] is False


def test_no_uverbs_class_means_ib_uverbs_is_not_loaded(tmp_path):
    node = Node(tmp_path)
    node.add("mlx5_0", "0000:0e:00.0", bridges=("0000:00:01.1", "0000:03:00.0", "0000:04:04.0"))
    check = by_name(run(node, expect={}))["verbs_device"]
    assert check["reason"].startswith(
        "mlx5_0 has no uverbs device (%s is missing (is the ib_uverbs module loaded?))"
        % (node.sys / "class" / "infiniband_verbs")
    )
    device = run(node, expect={})["devices"][0]
    assert (device["pci_address"], device["pcie_path"]) == (
        "0000:0e:00.0",
        ["0000:00:01.1", "0000:03:00.0", "0000:04:04.0"],
    )


@pytest.mark.parametrize(
    ("expect", "status", "reason"),
    [
        ({}, "pass", "no RDMA device"),
        ({"ports": 0}, "pass", "no RDMA device"),
        (
            {"ports": 8},
            "fail",
            "no RDMA port, 8 expected: is the adapter in the PCI tree (lspci) and its driver loaded (mlx5_core, mlx5_ib)?",
        ),
    ],
)
def test_a_node_without_rdma_devices_passes_only_when_none_is_expected(tmp_path, expect, status, reason):
    result = run(Node(tmp_path), expect=expect)
    assert result["devices"] == []
    assert [(c["name"], c["status"], c["reason"]) for c in result["checks"]] == [("port_count", status, reason)]


def test_a_missing_port_and_an_unmatched_device_name_fail_port_count(tmp_path):
    node = hgx_ndr(tmp_path, count=7)
    check = by_name(run(node, devices=["mlx5_[0-9]", "mlx5_bond_0"]))["port_count"]
    assert (check["status"], check["action"]) == ("fail", "drain and inspect the hardware")
    assert check["reason"] == (
        "7 ports, 8 expected (%s); devices: 'mlx5_bond_0' matches no RDMA device"
        % ", ".join("mlx5_%d/1" % i for i in range(7))
    )


def test_devices_select_the_fabric_and_the_rest_is_reported_unjudged(tmp_path):
    node = hgx_ndr(tmp_path)
    bond = dict(NDR_PORT, rate="200 Gb/sec (2X NDR)\n", link_layer="Ethernet\n")
    node.add("mlx5_bond_0", "0000:c5:00.0", bridges=("0000:c0:01.1",), ports={1: bond}, uverbs="uverbs8")
    result = run(node, devices=["mlx5_[0-9]"])
    assert statuses(result) == ALL_PASS
    assert [(d["name"], d["judged"]) for d in result["devices"]][-2:] == [("mlx5_7", True), ("mlx5_bond_0", False)]
    check = by_name(run(node))["link_layer"]
    assert check["reason"].startswith("mlx5_bond_0/1 runs Ethernet, the design expects InfiniBand")


def test_a_flap_since_the_record_of_the_previous_run_fails_and_the_record_is_rewritten(tmp_path):
    node = hgx_ndr(tmp_path / "node")
    path = tmp_path / "state" / "rdma-counters.json"
    first = run(node, interval=0, record_path=str(path), wall=NOW - 3600)
    assert first["record"] == {"path": str(path), "previous_timestamp": None, "written": True, "error": None}
    saved = json.loads(path.read_text())
    assert (saved["version"], saved["timestamp"], saved["ports"]["mlx5_1/1"]["counters"]["link_downed"]) == (
        1,
        NOW - 3600,
        0,
    )
    node.write("mlx5_1", 1, "counters/link_downed", "1\n")
    second = run(node, record_path=str(path))
    check = by_name(second)["link_flap"]
    assert (check["status"], check["ports"]) == ("fail", ["mlx5_1/1"])
    assert check["reason"].startswith(
        "mlx5_1/1: link_downed rose by 1 since the record of 3600 s ago (0 -> 1): the link went down and retrained"
    )
    assert [w["name"] for w in second["windows"]] == ["in 2.0 s", "since the record of 3600 s ago"]
    assert second["record"]["previous_timestamp"] == NOW - 3600
    assert json.loads(path.read_text())["ports"]["mlx5_1/1"]["counters"]["link_downed"] == 1


def test_a_counter_that_went_down_was_cleared_and_counts_what_grew_since(tmp_path):
    node = hgx_ndr(tmp_path / "node")
    path = tmp_path / "rdma-counters.json"
    record = _record.build(run(node, interval=0)["devices"], NOW - 600)
    record["ports"]["mlx5_3/1"]["counters"]["link_downed"] = 9
    _record.write(str(path), record)
    node.write("mlx5_3", 1, "counters/link_downed", "1\n")
    check = by_name(run(node, interval=0, record_path=str(path)))["link_flap"]
    assert check["reason"].startswith(
        "mlx5_3/1: link_downed rose by 1 since the record of 600 s ago (9 -> 1, counters cleared in between)"
    )


def test_check_mode_reads_and_judges_but_writes_no_record(tmp_path):
    node = hgx_ndr(tmp_path / "node")
    path = tmp_path / "rdma-counters.json"
    result = run(node, record_path=str(path), write=False)
    assert statuses(result) == ALL_PASS
    assert not path.exists()
    assert result["record"]["written"] is False


def test_a_corrupt_record_fails_record_and_is_replaced(tmp_path):
    node = hgx_ndr(tmp_path / "node")
    path = tmp_path / "rdma-counters.json"
    path.write_text("{not json")
    result = run(node, record_path=str(path))
    check = by_name(result)["record"]
    assert (check["status"], check["action"]) == ("fail", "fix the node configuration")
    assert check["reason"].startswith("the counter record %s is not JSON (" % path)
    assert check["reason"].endswith(
        "the counters' growth since the last run was not judged; this run writes a new record"
    )
    assert _record.load(str(path))["version"] == 1


def test_a_saturated_link_downed_warns_that_flaps_can_no_longer_be_seen(tmp_path):
    node = hgx_ndr(tmp_path)
    node.write("mlx5_1", 1, "counters/link_downed", "255\n")
    node.write("mlx5_1", 1, "counters/port_xmit_discards", "65535\n")
    result = run(node)
    assert by_name(result)["link_flap"]["reason"] == (
        "mlx5_1/1: link_downed is at its maximum 255 and can no longer show a flap: clear the counters "
        "(perfquery -C mlx5_1 -P 1 -R)"
    )
    assert by_name(result)["error_counters"]["reason"] == (
        "mlx5_1/1: port_xmit_discards is at its maximum 65535 and can no longer rise: clear the counters "
        "(perfquery -C mlx5_1 -P 1 -R)"
    )
    assert (result["status"], result["passed"]) == ("warn", True)


def test_a_tree_that_is_not_sysfs_refuses_to_judge(tmp_path):
    with pytest.raises(_run.FabricError, match="is not a sysfs tree"):
        _run.run({"sysfs_path": str(tmp_path / "nothing")}, NO_TOOLS, None, sleep=lambda s: None)


def test_roce_hw_counters_are_judged_too(tmp_path):
    """local_ack_timeout_err from a real RoCE port (2705, hw_counters-roce-mlx5_0.txt) growing
    past NVSentinel's 1/s warns; any rnr_nak_retry_err fails."""
    node = Node(tmp_path)
    roce = dict(NDR_PORT, link_layer="Ethernet\n")
    node.add(
        "mlx5_0",
        "0000:0e:00.0",
        ports={1: roce},
        uverbs="uverbs0",
        hw_counters={"lifespan": 12, "local_ack_timeout_err": 2705, "rnr_nak_retry_err": 0},
    )

    def grow(node, timeouts=2705 + 61, rnr=0):
        node.write("mlx5_0", 1, "hw_counters/local_ack_timeout_err", "%d\n" % timeouts)
        node.write("mlx5_0", 1, "hw_counters/rnr_nak_retry_err", "%d\n" % rnr)

    check = by_name(run(node, between=grow, expect={}))["error_counters"]
    assert (check["status"], check["reason"]) == (
        "warn",
        "mlx5_0/1: local_ack_timeout_err rose by 61 in 2.0 s (61.0/min; limit 60/min)",
    )
    node.write("mlx5_0", 1, "hw_counters/local_ack_timeout_err", "2705\n")
    check = by_name(run(node, between=lambda n: grow(n, 2705, 1), expect={}))["error_counters"]
    assert check["status"] == "fail" and check["reason"].startswith(
        "mlx5_0/1: rnr_nak_retry_err rose by 1 in 2.0 s (1.0/min; limit any increase)"
    )
    assert run(node, expect={})["devices"][0]["ports"][0]["hw_counters"] == {
        "local_ack_timeout_err": 2705,
        "rnr_nak_retry_err": 1,
    }


def test_a_tool_that_times_out_fills_nothing(tmp_path):
    node = hgx_ndr(tmp_path, count=1)
    node.write("mlx5_0", 1, "phys_state", None)
    calls = []

    def hung(argv):
        calls.append(argv)
        return None, "", ""

    result = run(
        node,
        expect={},
        binaries={"ibv_devinfo": ("/usr/bin/ibv_devinfo", None), "ibstat": ("/usr/sbin/ibstat", None)},
        tool=hung,
    )
    assert calls == [["/usr/bin/ibv_devinfo", "-v"], ["/usr/sbin/ibstat"]]
    assert [(t["name"], t["rc"], t["error"]) for t in result["tools"]] == [
        ("ibv_devinfo", None, "timed out"),
        ("ibstat", None, "timed out"),
    ]
    assert by_name(result)["readable"]["status"] == "fail"
    assert by_name(result)["port_state"]["reason"] == "mlx5_0/1: state not read"
