# SPDX-License-Identifier: GPL-3.0-or-later
"""``nvidia-smi --query-gpu`` CSV (plugins/module_utils/gpu/_nvsmi.parse_query_csv) on real
outputs of several GPUs and drivers, with and without a header and units, with ``[N/A]``,
``[Not Supported]``, unbracketed ``N/A``, empty values and deprecated fields
(tests/data/nvidia-smi/query-gpu, sources in SOURCE there)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.gpu import _nvsmi

DATA = Path(__file__).resolve().parent.parent / "data" / "nvidia-smi" / "query-gpu"


def sample(name):
    return (DATA / name).read_text()


def reordered(text):
    """The same CSV with its columns in reverse order, header and rows alike."""
    rows = list(csv.reader(io.StringIO(text), skipinitialspace=True))
    return "".join(", ".join(reversed(row)) + "\n" for row in rows)


def test_h100_with_header_and_units_gives_the_topology_fields_by_name():
    (row,) = _nvsmi.parse_query_csv(sample("h100-80gb-hbm3-590.48.01-header-units.csv"), _nvsmi.QUERY_FIELDS)
    assert {field: row[field] for field in _nvsmi.QUERY_FIELDS} == {
        "index": "0",
        "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "name": "NVIDIA H100 80GB HBM3",
        "pci.bus_id": "00000000:00:09.0",
        "memory.total": "81559",
        "pcie.link.gen.current": "5",
        "pcie.link.gen.max": "5",
        "pcie.link.width.current": "16",
        "pcie.link.width.max": "16",
        "driver_version": "590.48.01",
    }
    assert len(row) == 76 and _nvsmi.normalize_bus_id(row["pci.bus_id"]) == "0000:00:09.0"


def test_h100_each_column_loses_the_unit_its_header_names():
    (row,) = _nvsmi.parse_query_csv(sample("h100-80gb-hbm3-590.48.01-header-units.csv"))
    assert row["memory.reserved"] == "479" and row["utilization.gpu"] == "0"
    assert row["clocks_event_reasons_counters.sw_power_cap"] == "0"  # "0 us" under "[us]"
    assert row["timestamp"] == "2026/07/14 08:12:38.696" and row["compute_cap"] == "9.0"
    assert row["clocks_event_reasons.gpu_idle"] == "Active" and row["pstate"] == "P0"


def test_h100_placeholders_are_not_values():
    (row,) = _nvsmi.parse_query_csv(sample("h100-80gb-hbm3-590.48.01-header-units.csv"))
    assert row["display_mode"] is None  # [Requested functionality has been deprecated]
    assert row["fan.speed"] is None and row["pcie.link.gen.hostmax"] is None  # [N/A]
    assert row["inforom.pwr"] is None and row["driver_model.current"] is None


def test_the_columns_are_found_by_header_in_any_order():
    text = sample("h100-80gb-hbm3-590.48.01-header-units.csv")
    assert _nvsmi.parse_query_csv(reordered(text), _nvsmi.QUERY_FIELDS) == _nvsmi.parse_query_csv(
        text, _nvsmi.QUERY_FIELDS
    )


def test_l40s_na_without_brackets_empty_values_and_units():
    (row,) = _nvsmi.parse_query_csv(sample("l40s-595.80-header-units-tail.csv"))
    assert len(row) == 58
    assert row["temperature.gpu"] == "63" and row["temperature.memory"] is None  # N/A
    assert row["power.management"] is None  # [Requested functionality has been deprecated]
    assert row["power.draw"] == "144.97" and row["power.min_limit"] == "100.00"
    assert row["clocks.max.memory"] == "9001" and row["protected_memory.total"] == "0"
    assert row["edpp_multiplier"] is None and row["module.power.limit"] is None  # [N/A]
    assert row["fabric.state"] is None and row["platform.chassis_serial_number"] is None  # empty
    assert row["platform.peer_type"] == "Direct Connected" and row["platform.module_id"] == "1"
    assert row["hostname"] is None


RTX2080_FIELDS = (
    "power.limit",
    "power.min_limit",
    "power.max_limit",
    "memory.total",
    "vbios_version",
    "driver_version",
    "name",
    "gpu_uuid",
    "power.draw",
    "temperature.gpu",
    "temperature.memory",
    "clocks.current.graphics",
    "clocks.sm",
    "clocks.mem",
    "utilization.gpu",
    "utilization.memory",
    "fan.speed",
    "pcie.link.width.current",
    "pstate",
)


def test_rtx2080_without_header_maps_by_the_order_asked():
    (row,) = _nvsmi.parse_query_csv(sample("rtx2080-440.64-noheader-nounits.csv"), RTX2080_FIELDS)
    assert row["name"] == "GeForce RTX 2080" and row["driver_version"] == "440.64"
    assert row["gpu_uuid"] == "GPU-22b2c6ac-2d49-4863-197c-9c469071178a"
    assert row["memory.total"] == "7979" and row["vbios_version"] == "90.04.23.00.5F"
    assert row["temperature.memory"] is None  # N/A
    assert row["clocks.sm"] == "1965" and row["clocks.mem"] == "7199"
    assert row["pcie.link.width.current"] == "8" and row["pstate"] == "P2"


MEMORY_FIELDS = (
    "memory.total",
    "memory.free",
    "memory.used",
    "temperature.gpu",
    "fan.speed",
    "utilization.gpu",
    "utilization.memory",
)


@pytest.mark.parametrize(
    "name", ["2004mib-gpu-newer-driver-noheader-nounits.csv", "2004mib-gpu-older-driver-noheader-nounits.csv"]
)
def test_fan_speed_not_reported_either_way_drivers_spell_it(name):
    assert _nvsmi.parse_query_csv(sample(name), MEMORY_FIELDS) == [
        {
            "memory.total": "2004",
            "memory.free": "2004",
            "memory.used": "0",
            "temperature.gpu": "44",
            "fan.speed": None,
            "utilization.gpu": "0",
            "utilization.memory": "0",
        }
    ]


def test_h100_nvl_without_header():
    rows = _nvsmi.parse_query_csv(sample("h100-nvl-noheader.csv"), ("name", "pci.device_id"))
    assert rows == [{"name": "NVIDIA H100 NVL", "pci.device_id": "0x232110DE"}]


def test_a_real_row_read_with_the_wrong_field_list_is_an_error():
    with pytest.raises(_nvsmi.NvidiaSmiParseError, match="19 values for 10 fields"):
        _nvsmi.parse_query_csv(sample("rtx2080-440.64-noheader-nounits.csv"), _nvsmi.QUERY_FIELDS)


@pytest.mark.parametrize("placeholder", ["[Unknown Error]", "[GPU is lost]", "[Insufficient Permissions]"])
def test_a_value_the_driver_could_not_read_is_refused_naming_the_field(placeholder):
    """Unreadable is not healthy: the real H100 output with one value the driver could not read
    (as ``-q`` prints them on a failing GPU) is an error naming the GPU's row and the field, never
    a GPU whose memory is "not reported"."""
    header, row = sample("h100-80gb-hbm3-590.48.01-header-units.csv").splitlines()[:2]
    names = [cell.strip().split(" [")[0] for cell in header.split(",")]
    cells = row.split(",")
    cells[names.index("memory.total")] = " " + placeholder
    with pytest.raises(_nvsmi.NvidiaSmiParseError, match=r"GPU row 0 .*memory\.total reads '\["):
        _nvsmi.parse_query_csv(header + "\n" + ",".join(cells) + "\n")
