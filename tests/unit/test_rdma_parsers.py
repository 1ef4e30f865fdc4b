# SPDX-License-Identifier: GPL-3.0-or-later
"""fabric/_ibstat, fabric/_ibv_devinfo and the sysfs value formats, on the real outputs of
tests/data/rdma (sources in its SOURCE), to exact values."""

from __future__ import annotations

import re

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.fabric import _ibstat, _ibv_devinfo, _port, _sysfs
from tests.unit.rdma_tree import DATA, dump_counters, sample, sysfs_value


def _summary(cas):
    return {
        name: (
            ca["ca_type"],
            ca["fw_ver"],
            [(n, p["state"], p["phys_state"], p["rate_gbps"], p["link_layer"]) for n, p in ca["ports"].items()],
        )
        for name, ca in cas.items()
    }


# -- ibstat -----------------------------------------------------------------------------------
def test_ibstat_hgx_h100_connectx7_ndr_infiniband_and_bluefield3_roce_bond():
    parsed = _ibstat.parse(sample("ibstat-h100-cx7-ndr-ib.txt"))
    assert parsed["problems"] == []
    assert parsed["cas"]["mlx5_0"] == {
        "node_type": "CA",
        "ca_type": "MT4129",
        "ports_count": 1,
        "fw_ver": "28.41.1000",
        "hw_ver": "0",
        "node_guid": "0x58a2e10300a7820e",
        "system_guid": "0x58a2e10300a7820e",
        "ports": {
            1: {
                "state": "ACTIVE",
                "state_id": 4,
                "phys_state": "LinkUp",
                "phys_state_id": 5,
                "rate_gbps": 400.0,
                "speed": None,
                "base_lid": 128,
                "lmc": 0,
                "sm_lid": 1,
                "capability_mask": "0xa751e848",
                "port_guid": "0x58a2e10300a7820e",
                "link_layer": "InfiniBand",
            }
        },
    }
    ndr = ("MT4129", "28.41.1000", [(1, "ACTIVE", "LinkUp", 400.0, "InfiniBand")])
    assert _summary(parsed["cas"]) == {
        "mlx5_0": ndr,
        "mlx5_1": ndr,
        "mlx5_4": ndr,
        "mlx5_5": ndr,
        "mlx5_6": ndr,
        "mlx5_7": ndr,
        "mlx5_8": ndr,
        "mlx5_9": ndr,
        "mlx5_bond_0": ("MT41692", "32.38.3056", [(1, "ACTIVE", "LinkUp", 200.0, "Ethernet")]),
    }
    assert parsed["cas"]["mlx5_bond_0"]["ports"][1]["port_guid"] == "0x201d97fffe0056cf"
    assert parsed["cas"]["mlx5_bond_0"]["hw_ver"] == "1"


def test_ibstat_connectx7_roce_with_a_port_polling_and_one_disabled_tab_indented():
    parsed = _ibstat.parse(sample("ibstat-h100-cx7-roce-polling-disabled.txt"))
    assert parsed["problems"] == []
    up400 = ("MT4129", "28.39.1002", [(1, "ACTIVE", "LinkUp", 400.0, "Ethernet")])
    up100 = ("MT4125", "22.39.1002", [(1, "ACTIVE", "LinkUp", 100.0, "Ethernet")])
    assert _summary(parsed["cas"]) == {
        "mlx5_0": up400,
        "mlx5_1": up100,
        "mlx5_10": up400,
        "mlx5_11": ("MT4129", "28.39.1002", [(1, "DOWN", "Polling", 40.0, "Ethernet")]),
        "mlx5_2": up100,
        "mlx5_3": up400,
        "mlx5_4": up400,
        "mlx5_5": ("MT4129", "28.39.1002", [(1, "DOWN", "Disabled", 40.0, "Ethernet")]),
        "mlx5_6": up400,
        "mlx5_7": up100,
        "mlx5_8": up100,
        "mlx5_9": up400,
    }
    polling = parsed["cas"]["mlx5_11"]["ports"][1]
    assert (polling["state_id"], polling["phys_state_id"], polling["port_guid"]) == (1, 2, "0x0000000000000000")


def test_ibstat_that_panicked_after_eight_connectx6_hdr_cas_names_the_panic():
    parsed = _ibstat.parse(sample("ibstat-a100-cx6-hdr-ib-ibpanic.txt"))
    hdr = ("MT4124", "20.41.1000", [(1, "ACTIVE", "LinkUp", 200.0, "InfiniBand")])
    assert _summary(parsed["cas"]) == {"mlx5_%d" % i: hdr for i in range(8)}
    assert parsed["cas"]["mlx5_7"]["ports"][1]["base_lid"] == 13305
    assert parsed["cas"]["mlx5_0"]["system_guid"] == "0xb83fd203006e2704"
    assert parsed["problems"] == [
        "line 137 is not part of a CA block: ibpanic: [1400444] main: stat of IB device 'mlx5_8' failed: "
        "No such file or directory"
    ]


def test_ibstat_cut_short_inside_a_ca_is_a_problem():
    text = sample("ibstat-h100-cx7-ndr-ib.txt")
    cut = text[: text.index("        Port 1:", text.index("CA 'mlx5_9'"))]
    parsed = _ibstat.parse(cut)
    assert parsed["cas"]["mlx5_9"]["ports"] == {}
    assert parsed["problems"] == ["CA 'mlx5_9' has 0 port blocks but says Number of ports: 1 (output cut short?)"]


def test_ibstat_state_words_of_its_own_are_normalised_and_unknown_ones_are_problems():
    text = sample("ibstat-h100-cx7-ndr-ib.txt").replace("State: Active", "State: Initializing", 1)
    text = text.replace("Physical state: LinkUp", "Physical state: Wobbly", 1)
    parsed = _ibstat.parse(text)
    port = parsed["cas"]["mlx5_0"]["ports"][1]
    assert (port["state"], port["state_id"], port["phys_state"], port["phys_state_id"]) == ("INIT", 2, None, None)
    assert parsed["problems"] == ["CA 'mlx5_0' port 1: Physical state 'Wobbly' is not one ibstat prints"]


# -- ibv_devinfo ------------------------------------------------------------------------------
def test_ibv_devinfo_v_connectx6_hdr_infiniband_one_active_one_disabled():
    parsed = _ibv_devinfo.parse(sample("ibv_devinfo-v-cx6-hdr-ib.txt"))
    assert parsed["problems"] == []
    assert parsed["devices"]["mlx5_0"] == {
        "transport": "InfiniBand (0)",
        "fw_ver": "20.37.1700",
        "node_guid": "88e9:a4ff:ff25:a462",
        "sys_image_guid": "88e9:a4ff:ff25:a462",
        "vendor_id": "0x02c9",
        "vendor_part_id": "4123",
        "hw_ver": "0x0",
        "board_id": "MT_0000000594",
        "phys_port_cnt": 1,
        "ports": {
            1: {
                "state": "ACTIVE",
                "state_id": 4,
                "phys_state": "LinkUp",
                "phys_state_id": 5,
                "width": "4X",
                "speed": "HDR",
                "lane_gbps": 50.0,
                "rate_gbps": 200.0,
                "link_layer": "InfiniBand",
                "active_mtu": "4096",
            }
        },
    }
    # rdma-core prints "invalid speed (0)" for a port that is down: no rate.
    assert parsed["devices"]["mlx5_1"]["ports"][1] == {
        "state": "DOWN",
        "state_id": 1,
        "phys_state": "Disabled",
        "phys_state_id": 3,
        "width": "4X",
        "speed": None,
        "lane_gbps": None,
        "rate_gbps": None,
        "link_layer": "InfiniBand",
        "active_mtu": "4096",
    }
    assert parsed["devices"]["mlx5_1"]["node_guid"] == "88e9:a4ff:ff25:a463"


def test_ibv_devinfo_v_connectx6dx_roce_bond_two_lanes_of_50():
    parsed = _ibv_devinfo.parse(sample("ibv_devinfo-v-cx6dx-roce-bond.txt"))
    assert parsed["problems"] == []
    device = parsed["devices"]["mlx5_bond_0"]
    assert (device["fw_ver"], device["vendor_part_id"], device["board_id"], device["phys_port_cnt"]) == (
        "22.36.1010",
        "4125",
        "MT_0000000359",
        1,
    )
    assert device["ports"][1] == {
        "state": "ACTIVE",
        "state_id": 4,
        "phys_state": "LinkUp",
        "phys_state_id": 5,
        "width": "2X",
        "speed": "HDR",
        "lane_gbps": 50.0,
        "rate_gbps": 100.0,
        "link_layer": "Ethernet",
        "active_mtu": "4096",
    }


def test_ibv_devinfo_without_v_connectx7_roce_has_states_but_no_rate():
    parsed = _ibv_devinfo.parse(sample("ibv_devinfo-cx7-roce.txt"))
    assert parsed["problems"] == []
    assert list(parsed["devices"]) == ["mlx5_%d" % i for i in range(12)]
    states = {n: d["ports"][1]["state"] for n, d in parsed["devices"].items()}
    assert [n for n, s in states.items() if s != "ACTIVE"] == ["mlx5_9", "mlx5_11"]
    assert {d["board_id"] for d in parsed["devices"].values()} == {"MT_0000000838", "MT_0000000834"}
    port = parsed["devices"]["mlx5_8"]["ports"][1]
    assert (port["link_layer"], port["active_mtu"], port["rate_gbps"], port["phys_state"]) == (
        "Ethernet",
        "1024",
        None,
        None,
    )


def test_ibv_devinfo_cut_short_and_stray_lines_are_problems():
    text = sample("ibv_devinfo-v-cx6-hdr-ib.txt")
    cut = text[: text.index("\t\tport:\t1", text.index("hca_id:\tmlx5_1"))]
    parsed = _ibv_devinfo.parse("No IB devices found\n" + cut)
    assert parsed["problems"] == [
        "line 1 is not part of an hca_id block: No IB devices found",
        "mlx5_1 has 0 port blocks but says phys_port_cnt: 1 (output cut short?)",
    ]
    assert parsed["devices"]["mlx5_0"]["ports"][1]["rate_gbps"] == 200.0


@pytest.mark.parametrize(
    ("text", "code", "expected"),
    [
        ("50.0 Gbps", 64, (50.0, "HDR")),
        ("25.0 Gbps", 32, (25.0, "EDR")),
        # rdma-core releases before NDR print "invalid speed" for code 128; the code decides.
        ("invalid speed", 128, (100.0, "NDR")),
        ("invalid speed", 0, (None, None)),
    ],
)
def test_lane_speed_from_ibv_devinfo_text_and_code(text, code, expected):
    assert _port.lane_speed(text, code) == expected


# -- sysfs formats (gpud's capture of an H100 node) -------------------------------------------
def test_sysfs_state_phys_state_and_rate_of_an_h100_node():
    assert _port.parse_numbered(sysfs_value("mlx5_0/ports/1/state")) == (4, "ACTIVE")
    assert _port.parse_numbered(sysfs_value("mlx5_6/ports/1/phys_state")) == (5, "LinkUp")
    assert _port.parse_sysfs_rate(sysfs_value("mlx5_0/ports/1/rate")) == (400.0, "4X", "NDR")
    assert _port.parse_sysfs_rate(sysfs_value("mlx5_bond_0/ports/1/rate")) == (200.0, "2X", "NDR")
    # Kernels before 5.x printed no speed name for SDR (sysfs.c: "%d%s Gb/sec (%dX%s)").
    assert _port.parse_sysfs_rate("2.5 Gb/sec (1X)\n") == (2.5, "1X", None)
    with pytest.raises(ValueError, match="not '<number>: <name>'"):
        _port.parse_numbered("ACTIVE")
    with pytest.raises(ValueError, match="not '<rate> Gb/sec"):
        _port.parse_sysfs_rate("400")


def _counters_dir(tmp_path, values):
    directory = tmp_path / "counters"
    directory.mkdir()
    for name, text in values.items():
        (directory / name).write_text(text + "\n")
    return directory


def test_counters_of_a_connectx7_port_read_to_exact_values(tmp_path):
    directory = _counters_dir(tmp_path, dump_counters())
    values, unreadable = _sysfs.read_counters(str(directory), "counters")
    assert unreadable == []
    assert values == {
        "VL15_dropped": 0,
        "excessive_buffer_overrun_errors": 15,
        "link_downed": 255,
        "link_error_recovery": 0,
        "local_link_integrity_errors": 0,
        "multicast_rcv_packets": 0,
        "multicast_xmit_packets": 0,
        "port_rcv_constraint_errors": 0,
        "port_rcv_data": 205128687774249,
        "port_rcv_errors": 0,
        "port_rcv_packets": 240037171331,
        "port_rcv_remote_physical_errors": 0,
        "port_rcv_switch_relay_errors": 2,
        "port_xmit_constraint_errors": 0,
        "port_xmit_data": 205143497464492,
        "port_xmit_discards": 65535,
        "port_xmit_packets": 242071897216,
        "port_xmit_wait": 4294967295,
        "symbol_error": 0,
        "unicast_rcv_packets": 240037171331,
        "unicast_xmit_packets": 242071897216,
    }


def _grep_lines(name):
    """``{counter: text}`` of a ``grep . <dir>/*`` capture (``<path>/<counter>:<value>`` lines)."""
    return dict(re.findall(r"^.*/([^/]+?):(.*)$", sample(name), re.M))


def test_counters_of_a_driver_without_pma_are_all_unreadable(tmp_path):
    values = _grep_lines("counters-i40iw-no-pma.txt")
    assert set(values.values()) == {"N/A (no PMA)"}
    directory = _counters_dir(tmp_path, values)
    read, unreadable = _sysfs.read_counters(str(directory), "counters")
    assert read == {}
    assert unreadable == [
        {"field": "counters/" + name, "file": str(directory / name), "error": "reads 'N/A (no PMA)', not an integer"}
        for name in sorted(values)
    ]


def test_hw_counters_skip_lifespan_which_is_a_setting(tmp_path):
    values = _grep_lines("hw_counters-roce-mlx5_0.txt")
    assert values["lifespan"] == "12"
    directory = _counters_dir(tmp_path, values)
    read, unreadable = _sysfs.read_counters(str(directory), "hw_counters", _sysfs.HW_COUNTER_SETTINGS)
    assert (read, unreadable) == (
        {
            "duplicate_request": 0,
            "implied_nak_seq_err": 0,
            "local_ack_timeout_err": 2705,
            "np_cnp_sent": 1333,
            "np_ecn_marked_roce_packets": 0,
        },
        [],
    )


def test_every_sample_named_in_source_exists():
    source = (DATA / "SOURCE").read_text()
    files = sorted(p.name for p in DATA.iterdir() if p.name != "SOURCE")
    assert files and all(name in source for name in files), files
