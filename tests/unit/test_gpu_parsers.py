# SPDX-License-Identifier: GPL-3.0-or-later
"""nvidia-smi format edge cases: CSV forms, CPU lists, N/A, ANSI, malformed output."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.gpu import _nvsmi

FIELDS = _nvsmi.QUERY_FIELDS


def test_query_argv_is_exact():
    assert _nvsmi.query_argv("/usr/bin/nvidia-smi") == [
        "/usr/bin/nvidia-smi",
        "--query-gpu=index,uuid,name,pci.bus_id,memory.total,pcie.link.gen.current,pcie.link.gen.max,"
        "pcie.link.width.current,pcie.link.width.max,driver_version",
        "--format=csv,noheader,nounits",
    ]


def test_csv_noheader_nounits_maps_by_requested_order():
    text = (
        "0, GPU-1f1ad3c1-6a4e-11ee-8c99-0242ac120002, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 81559, "
        "5, 5, 16, 16, 570.133.20\n"
        "1, GPU-2, NVIDIA H100 80GB HBM3, 00000000:2A:00.0, 81559, 1, 5, 16, 16, 570.133.20\n"
    )
    rows = _nvsmi.parse_query_csv(text, FIELDS)
    assert rows[1] == {
        "index": "1",
        "uuid": "GPU-2",
        "name": "NVIDIA H100 80GB HBM3",
        "pci.bus_id": "00000000:2A:00.0",
        "memory.total": "81559",
        "pcie.link.gen.current": "1",
        "pcie.link.gen.max": "5",
        "pcie.link.width.current": "16",
        "pcie.link.width.max": "16",
        "driver_version": "570.133.20",
    }


def test_csv_with_header_and_units_maps_by_name():
    # --format=csv (header, units): columns in another order than asked are still found.
    text = (
        "name, index, memory.total [MiB], pcie.link.width.current, pcie.link.gen.max\n"
        "NVIDIA L40S, 0, 46068 MiB, 8, [N/A]\n"
    )
    rows = _nvsmi.parse_query_csv(text)
    assert rows == [
        {
            "name": "NVIDIA L40S",
            "index": "0",
            "memory.total": "46068",
            "pcie.link.width.current": "8",
            "pcie.link.gen.max": None,
        }
    ]


def test_csv_row_with_wrong_field_count_is_an_error():
    with pytest.raises(_nvsmi.NvidiaSmiParseError, match="3 values for 10 fields"):
        _nvsmi.parse_query_csv("0, GPU-1, NVIDIA L40S\n", FIELDS)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("0-31,64-95", "0-31,64-95"),
        ("0,1,2,3,8", "0-3,8"),
        ("0-3, 4-7", "0-7"),
        ("5", "5"),
        ("N/A", None),
        ("", None),
    ],
)
def test_cpu_lists_normalise(text, expected):
    assert _nvsmi.normalize_cpu_list(text) == expected


def test_cpu_list_garbage_is_an_error():
    with pytest.raises(_nvsmi.NvidiaSmiParseError):
        _nvsmi.parse_cpu_list("0-3,x")
    with pytest.raises(_nvsmi.NvidiaSmiParseError):
        _nvsmi.parse_cpu_list("9-3")


@pytest.mark.parametrize(
    "text,expected",
    [
        ("00000000:07:00.0", "0000:07:00.0"),
        ("00000001:C1:00.0", "0001:c1:00.0"),
        ("0000:0B:00.0", "0000:0b:00.0"),
        ("07:00.0", "0000:07:00.0"),
        ("garbage", None),
    ],
)
def test_bus_ids_take_sysfs_form(text, expected):
    assert _nvsmi.normalize_bus_id(text) == expected


SINGLE = "\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\nGPU0\t X \t0-63\t0\t\tN/A\n\nLegend:\n"


def test_single_gpu_matrix_with_ansi():
    parsed = _nvsmi.parse_topo_matrix(SINGLE)
    assert parsed["gpus"] == [
        {
            "label": "GPU0",
            "index": 0,
            "links": {"GPU0": "X"},
            "nic_links": {},
            "cpu_affinity": "0-63",
            "numa_affinity": "0",
            "gpu_numa_id": None,
        }
    ]


def test_header_after_a_prompt_on_the_same_line():
    # As pasted in aikitoria/open-gpu-kernel-modules#12: the prompt and the header on one line.
    text = (
        "nvidia-smi topo -m                   GPU0    GPU1    CPU Affinity    NUMA Affinity   GPU NUMA ID\n"
        "GPU0     X      PHB     0-23    0               N/A\n"
        "GPU1    PHB      X      0-23    0               N/A\n"
    )
    parsed = _nvsmi.parse_topo_matrix(text)
    assert [g["links"]["GPU1"] for g in parsed["gpus"]] == ["PHB", "X"]
    assert parsed["gpus"][1]["cpu_affinity"] == "0-23"


def test_na_affinity_and_numa_lists():
    text = (
        "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tSOC\tN/A\tN/A\t\tN/A\n"
        "GPU1\tSOC\t X \t0,2,4,6\t0-1\t\t2\n"
    )
    parsed = _nvsmi.parse_topo_matrix(text)
    gpu0, gpu1 = parsed["gpus"]
    assert gpu0["links"]["GPU1"] == "SYS", "pre-2017 SOC is today's SYS"
    assert (gpu0["cpu_affinity"], gpu0["numa_affinity"], gpu0["gpu_numa_id"]) == (None, None, None)
    assert (gpu1["cpu_affinity"], gpu1["numa_affinity"], gpu1["gpu_numa_id"]) == ("0,2,4,6", "0-1", 2)
    assert _nvsmi.numa_node_of("0-1") is None and _nvsmi.numa_node_of("1") == 1


def test_old_format_without_numa_columns():
    # Drivers before ~384 had only CPU Affinity, and NICs as mlx4_0 style columns.
    text = (
        "        GPU0    GPU1    mlx4_0  CPU Affinity\n"
        "GPU0     X      PIX     PHB     0-9,20-29\n"
        "GPU1    PIX      X      PHB     0-9,20-29\n"
        "mlx4_0  PHB     PHB      X      \n"
    )
    parsed = _nvsmi.parse_topo_matrix(text)
    assert parsed["affinity_columns"] == ["CPU Affinity"]
    assert parsed["gpus"][0]["numa_affinity"] is None and parsed["gpus"][0]["cpu_affinity"] == "0-9,20-29"
    assert parsed["nics"] == [{"label": "mlx4_0", "device": "mlx4_0", "links": {"GPU0": "PHB", "GPU1": "PHB"}}]


@pytest.mark.parametrize(
    "text,message",
    [
        ("no matrix here\n", "no topology header"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPIX\t0-3\n", "no GPU1 row"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tFAST\t0-3\nGPU1\tFAST\t X \t0-3\n", "not a link class"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPIX\t0-3\nGPU1\tPXB\t X \t0-3\n", "not symmetric"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \nGPU1\tPIX\t X \t0-3\n", "1 link cells for 2 columns"),
        ("\tGPU0\tCPU Affinity\nGPU7\t X \t0-3\n", "not one of the header columns"),
    ],
)
def test_malformed_topology_is_an_error(text, message):
    with pytest.raises(_nvsmi.NvidiaSmiParseError, match=message):
        _nvsmi.parse_topo_matrix(text)


def test_p2p_with_ansi_header_and_trailing_tabs():
    text = "\t\x1b[4mGPU0\tGPU1\x1b[0m\n GPU0\tX\tDR\t\n GPU1\tTNS\tX\t\n\nLegend:\n\n  X    = Self\n"
    assert _nvsmi.parse_p2p_matrix(text) == {"GPU0": {"GPU0": "X", "GPU1": "DR"}, "GPU1": {"GPU0": "TNS", "GPU1": "X"}}


@pytest.mark.parametrize(
    "text,message",
    [
        ("Legend:\n", "no GPU header"),
        (" \tGPU0\tGPU1\t\n GPU0\tX\tOK\t\n", "no row for GPU1"),
        (" \tGPU0\tGPU1\t\n GPU0\tX\t\n GPU1\tOK\tX\t\n", "1 cells for 2 columns"),
    ],
)
def test_malformed_p2p_is_an_error(text, message):
    with pytest.raises(_nvsmi.NvidiaSmiParseError, match=message):
        _nvsmi.parse_p2p_matrix(text)


def test_nvlink_status_counts_active_links():
    text = (
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5a10e6e5-95f7-2785-ed63-6f6147f304f7)\n"
        "\t Link 0: 26.562 GB/s\n\t Link 1: <inactive>\n\t Link 2: 26.562 GB/s\n"
        "GPU 1: NVIDIA L40S (UUID: GPU-x)\n"
    )
    assert _nvsmi.parse_nvlink_status(text) == {0: 2, 1: 0}


def test_library_mismatch_and_missing_library_are_failures():
    with pytest.raises(_nvsmi.NvidiaSmiError) as info:
        _nvsmi.check_failure("Failed to initialize NVML: Driver/library version mismatch\n")
    assert info.value.cause == "driver_library_mismatch" and "reboot" in str(info.value)
    with pytest.raises(_nvsmi.NvidiaSmiError) as info:
        _nvsmi.check_failure("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system.\n")
    assert info.value.cause == "nvml_library_missing"
