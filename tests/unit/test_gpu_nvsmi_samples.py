# SPDX-License-Identifier: GPL-3.0-or-later
"""Real nvidia-smi outputs (tests/data/nvidia-smi/*/, each with its SOURCE) and the exact facts
read from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.gpu import _nvsmi, _topology_facts

DATA = Path(__file__).resolve().parent.parent / "data" / "nvidia-smi"


def read(sample, name):
    return (DATA / sample / name).read_text()


def rows(gpus, nics):
    """Compact view of a parsed matrix: per GPU (label, GPU links, NIC links, cpus, numa, gpu numa)."""
    return (
        [
            (
                g["label"],
                " ".join(g["links"][k] for k in sorted(g["links"], key=lambda s: int(s[3:]))),
                " ".join(g["nic_links"].values()),
                g["cpu_affinity"],
                g["numa_affinity"],
                g["gpu_numa_id"],
            )
            for g in gpus
        ],
        [(n["label"], n["device"], " ".join(n["links"].values())) for n in nics],
    )


# sample -> (affinity columns, GPU rows, NIC rows)
TOPO = {
    "sglang-30401-8xh100-nv18-8nic": (
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        [
            (
                "GPU0",
                "X NV18 NV18 NV18 NV18 NV18 NV18 NV18",
                "PIX NODE NODE NODE SYS SYS SYS SYS",
                "0-47,96-143",
                "0",
                None,
            ),
            (
                "GPU1",
                "NV18 X NV18 NV18 NV18 NV18 NV18 NV18",
                "NODE PIX NODE NODE SYS SYS SYS SYS",
                "0-47,96-143",
                "0",
                None,
            ),
            (
                "GPU2",
                "NV18 NV18 X NV18 NV18 NV18 NV18 NV18",
                "NODE NODE PIX NODE SYS SYS SYS SYS",
                "0-47,96-143",
                "0",
                None,
            ),
            (
                "GPU3",
                "NV18 NV18 NV18 X NV18 NV18 NV18 NV18",
                "NODE NODE NODE PIX SYS SYS SYS SYS",
                "0-47,96-143",
                "0",
                None,
            ),
            (
                "GPU4",
                "NV18 NV18 NV18 NV18 X NV18 NV18 NV18",
                "SYS SYS SYS SYS PIX NODE NODE NODE",
                "48-95,144-191",
                "1",
                None,
            ),
            (
                "GPU5",
                "NV18 NV18 NV18 NV18 NV18 X NV18 NV18",
                "SYS SYS SYS SYS NODE PIX NODE NODE",
                "48-95,144-191",
                "1",
                None,
            ),
            (
                "GPU6",
                "NV18 NV18 NV18 NV18 NV18 NV18 X NV18",
                "SYS SYS SYS SYS NODE NODE PIX NODE",
                "48-95,144-191",
                "1",
                None,
            ),
            (
                "GPU7",
                "NV18 NV18 NV18 NV18 NV18 NV18 NV18 X",
                "SYS SYS SYS SYS NODE NODE NODE PIX",
                "48-95,144-191",
                "1",
                None,
            ),
        ],
        [
            ("NIC0", "mlx5_0", "PIX NODE NODE NODE SYS SYS SYS SYS"),
            ("NIC1", "mlx5_1", "NODE PIX NODE NODE SYS SYS SYS SYS"),
            ("NIC2", "mlx5_2", "NODE NODE PIX NODE SYS SYS SYS SYS"),
            ("NIC3", "mlx5_3", "NODE NODE NODE PIX SYS SYS SYS SYS"),
            ("NIC4", "mlx5_4", "SYS SYS SYS SYS PIX NODE NODE NODE"),
            ("NIC5", "mlx5_5", "SYS SYS SYS SYS NODE PIX NODE NODE"),
            ("NIC6", "mlx5_6", "SYS SYS SYS SYS NODE NODE PIX NODE"),
            ("NIC7", "mlx5_7", "SYS SYS SYS SYS NODE NODE NODE PIX"),
        ],
    ),
    "stelline-esc8000a-4xrtx6000ada": (
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        [
            ("GPU0", "X NODE SYS SYS", "NODE NODE SYS SYS", "0-31", "0", None),
            ("GPU1", "NODE X SYS SYS", "NODE NODE SYS SYS", "0-31", "0", None),
            ("GPU2", "SYS SYS X NODE", "SYS SYS NODE NODE", "32-63", "1", None),
            ("GPU3", "SYS SYS NODE X", "SYS SYS NODE NODE", "32-63", "1", None),
        ],
        [
            ("NIC0", "mlx5_0", "NODE NODE SYS SYS"),
            ("NIC1", "mlx5_1", "NODE NODE SYS SYS"),
            ("NIC2", "mlx5_2", "SYS SYS NODE NODE"),
            ("NIC3", "mlx5_3", "SYS SYS NODE NODE"),
        ],
    ),
    "nccl-tests-307-8x4090-pix": (
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        [
            ("GPU0", "X PIX PIX PIX SYS SYS SYS SYS", "PIX", "0-35,72-107", "0", None),
            ("GPU1", "PIX X PIX PIX SYS SYS SYS SYS", "PIX", "0-35,72-107", "0", None),
            ("GPU2", "PIX PIX X PIX SYS SYS SYS SYS", "PIX", "0-35,72-107", "0", None),
            ("GPU3", "PIX PIX PIX X SYS SYS SYS SYS", "PIX", "0-35,72-107", "0", None),
            ("GPU4", "SYS SYS SYS SYS X PIX PIX PIX", "SYS", "36-71,108-143", "1", None),
            ("GPU5", "SYS SYS SYS SYS PIX X PIX PIX", "SYS", "36-71,108-143", "1", None),
            ("GPU6", "SYS SYS SYS SYS PIX PIX X PIX", "SYS", "36-71,108-143", "1", None),
            ("GPU7", "SYS SYS SYS SYS PIX PIX PIX X", "SYS", "36-71,108-143", "1", None),
        ],
        [("NIC0", "mlx5_bond_0", "PIX PIX PIX PIX SYS SYS SYS SYS")],
    ),
    "lmdeploy-1944-2xa100-nv12-mlx5": (
        ["CPU Affinity", "NUMA Affinity"],
        [
            ("GPU0", "X NV12", "SYS SYS SYS SYS NODE NODE PXB PXB", "48-95,144-191", "1", None),
            ("GPU1", "NV12 X", "SYS SYS SYS SYS NODE NODE PXB PXB", "48-95,144-191", "1", None),
        ],
        [
            ("mlx5_0", "mlx5_0", "SYS SYS"),
            ("mlx5_1", "mlx5_1", "SYS SYS"),
            ("mlx5_2", "mlx5_2", "SYS SYS"),
            ("mlx5_3", "mlx5_3", "SYS SYS"),
            ("mlx5_4", "mlx5_4", "NODE NODE"),
            ("mlx5_5", "mlx5_5", "NODE NODE"),
            ("mlx5_6", "mlx5_6", "PXB PXB"),
            ("mlx5_7", "mlx5_7", "PXB PXB"),
        ],
    ),
    "club3090-46-5gpu-sys-phb-node": (
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        [
            ("GPU0", "X SYS SYS SYS SYS", "", "8-15,24-31", "1", None),
            ("GPU1", "SYS X PHB NODE NODE", "", "0-7,16-23", "0", None),
            ("GPU2", "SYS PHB X NODE NODE", "", "0-7,16-23", "0", None),
            ("GPU3", "SYS NODE NODE X PHB", "", "0-7,16-23", "0", None),
            ("GPU4", "SYS NODE NODE PHB X", "", "0-7,16-23", "0", None),
        ],
        [],
    ),
    "aikitoria-13-5gpu-node-phb": (
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        [
            ("GPU0", "X NODE NODE NODE NODE", "", "0-63", "0", None),
            ("GPU1", "NODE X NODE NODE NODE", "", "0-63", "0", None),
            ("GPU2", "NODE NODE X NODE NODE", "", "0-63", "0", None),
            ("GPU3", "NODE NODE NODE X PHB", "", "0-63", "0", None),
            ("GPU4", "NODE NODE NODE PHB X", "", "0-63", "0", None),
        ],
        [],
    ),
    "club3090-1133-2x5090-phb-gns": (
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        [("GPU0", "X PHB", "", "0-63", "0", None), ("GPU1", "PHB X", "", "0-63", "0", None)],
        [],
    ),
    "go-gpuallocator-17-8x4090-sys": (
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        [
            ("GPU0", "X SYS SYS SYS SYS SYS SYS SYS", "SYS SYS", "0-55,112-167", "0", None),
            ("GPU1", "SYS X SYS SYS SYS SYS SYS SYS", "SYS SYS", "0-55,112-167", "0", None),
            ("GPU2", "SYS SYS X SYS SYS SYS SYS SYS", "SYS SYS", "0-55,112-167", "0", None),
            ("GPU3", "SYS SYS SYS X SYS SYS SYS SYS", "SYS SYS", "0-55,112-167", "0", None),
            ("GPU4", "SYS SYS SYS SYS X SYS SYS SYS", "SYS SYS", "56-111,168-223", "1", None),
            ("GPU5", "SYS SYS SYS SYS SYS X SYS SYS", "SYS SYS", "56-111,168-223", "1", None),
            ("GPU6", "SYS SYS SYS SYS SYS SYS X SYS", "PHB PHB", "56-111,168-223", "1", None),
            ("GPU7", "SYS SYS SYS SYS SYS SYS SYS X", "SYS SYS", "56-111,168-223", "1", None),
        ],
        # Posted without the NIC Legend: the NICs keep their column labels, device unknown.
        [("NIC0", None, "SYS SYS SYS SYS SYS SYS PHB SYS"), ("NIC1", None, "SYS SYS SYS SYS SYS SYS PHB SYS")],
    ),
    "autodl-2x2080ti-pix-ns": (
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        [("GPU0", "X PIX", "", "24-47,72-95", "1", None), ("GPU1", "PIX X", "", "24-47,72-95", "1", None)],
        [],
    ),
}

# sample -> (worst link, best link, NVLink anywhere, NUMA nodes)
SUMMARY = {
    "sglang-30401-8xh100-nv18-8nic": ("NV18", "NV18", True, [0, 1]),
    "stelline-esc8000a-4xrtx6000ada": ("SYS", "NODE", False, [0, 1]),
    "nccl-tests-307-8x4090-pix": ("SYS", "PIX", False, [0, 1]),
    "lmdeploy-1944-2xa100-nv12-mlx5": ("NV12", "NV12", True, [1]),
    "club3090-46-5gpu-sys-phb-node": ("SYS", "PHB", False, [0, 1]),
    "aikitoria-13-5gpu-node-phb": ("NODE", "PHB", False, [0]),
    "club3090-1133-2x5090-phb-gns": ("PHB", "PHB", False, [0]),
    "go-gpuallocator-17-8x4090-sys": ("SYS", "SYS", False, [0, 1]),
    "autodl-2x2080ti-pix-ns": ("PIX", "PIX", False, [1]),
}

# (sample, file) -> GPU0's row, every row's diagonal is X and the matrix is symmetric.
P2P = {
    ("aikitoria-13-5gpu-node-phb", "p2p-p.txt"): (5, "X OK OK OK OK", {"OK"}),
    ("club3090-1133-2x5090-phb-gns", "p2p-rw.txt"): (2, "X GNS", {"GNS"}),
    ("autodl-2x2080ti-pix-ns", "p2p-p.txt"): (2, "X NS", {"NS"}),
    ("stas00-8xh100-p2p-ok", "p2p-r.txt"): (8, "X OK OK OK OK OK OK OK", {"OK"}),
    ("stas00-2xl4-p2p-cns", "p2p-r.txt"): (2, "X CNS", {"CNS"}),
}


def test_every_sample_records_its_source():
    samples = [d for d in DATA.iterdir() if d.is_dir()]
    assert len([d for d in samples if d.name != "failures"]) >= 8
    for sample in samples:
        source = (sample / "SOURCE").read_text()
        assert source.startswith("https://github.com/") or "https://github.com/" in source, sample


@pytest.mark.parametrize("sample", sorted(TOPO))
def test_topology_matrix_exact(sample):
    affinity, gpus, nics = TOPO[sample]
    parsed = _nvsmi.parse_topo_matrix(read(sample, "topo-m.txt"))
    assert parsed["affinity_columns"] == affinity
    assert rows(parsed["gpus"], parsed["nics"]) == (gpus, nics)
    assert [g["index"] for g in parsed["gpus"]] == list(range(len(gpus)))


@pytest.mark.parametrize("sample", sorted(TOPO))
def test_topology_summary_exact(sample):
    parsed = _nvsmi.parse_topo_matrix(read(sample, "topo-m.txt"))
    labels = [g["label"] for g in parsed["gpus"]]
    ok = {a: {b: "X" if a == b else "OK" for b in labels} for a in labels}
    record = {
        "driver_version": None,
        "links": {g["label"]: g["links"] for g in parsed["gpus"]},
        "p2p": {"read": ok, "write": ok, "nvlink": ok},
        "gpus": [
            {
                "index": g["index"],
                "numa_node": _nvsmi.numa_node_of(g["numa_affinity"]),
                "pcie": {"width_current": 16, "width_max": 16},
            }
            for g in parsed["gpus"]
        ],
    }
    summary = _topology_facts.summarize(record, labels)
    worst, best, nvlink, numa = SUMMARY[sample]
    n = len(labels)
    assert (summary["worst_link"], summary["best_link"], summary["nvlink"], summary["numa_nodes"]) == (
        worst,
        best,
        nvlink,
        numa,
    )
    assert summary["pairs"] == n * (n - 1) // 2 and summary["p2p_all_pairs"] is True


def test_tab_and_space_forms_read_alike():
    """nccl-tests-307 is tab-separated; the same matrix with spaces and ANSI reads the same."""
    text = read("nccl-tests-307-8x4090-pix", "topo-m.txt")
    lines = text.splitlines()
    spaced = ["\x1b[4m" + lines[0].expandtabs(8) + "\x1b[0m"] + [line.expandtabs(8) for line in lines[1:]]
    assert _nvsmi.parse_topo_matrix("\n".join(spaced)) == _nvsmi.parse_topo_matrix(text)


@pytest.mark.parametrize("sample,name", sorted(P2P))
def test_p2p_matrix_exact(sample, name):
    count, first_row, off_diagonal = P2P[(sample, name)]
    matrix = _nvsmi.parse_p2p_matrix(read(sample, name))
    labels = ["GPU%d" % i for i in range(count)]
    assert sorted(matrix, key=lambda s: int(s[3:])) == labels
    assert " ".join(matrix["GPU0"][label] for label in labels) == first_row
    seen = set()
    for a in labels:
        assert matrix[a][a] == "X"
        for b in labels:
            assert matrix[a][b] == matrix[b][a]
            if a != b:
                seen.add(matrix[a][b])
    assert seen == off_diagonal


def test_stelline_bus_ids_map_to_sysfs_form():
    # The same page lists the GPUs at 00000000:01:00.0 ... 00000000:E1:00.0 (nvidia-smi form).
    assert [
        _nvsmi.normalize_bus_id(b)
        for b in ("00000000:01:00.0", "00000000:41:00.0", "00000000:C1:00.0", "00000000:E1:00.0")
    ] == ["0000:01:00.0", "0000:41:00.0", "0000:c1:00.0", "0000:e1:00.0"]


@pytest.mark.parametrize(
    "name,cause,where",
    [
        ("driver-not-loaded.txt", "driver_not_loaded", "NVIDIA kernel driver is not loaded"),
        ("gpu-lost-handle.txt", "gpu_lost", "(GPU 0000:0b:00.0)"),
        ("gpu-lost-handle-nospace.txt", "gpu_lost", "(GPU 0000:07:00.0)"),
    ],
)
def test_failure_texts_name_the_cause(name, cause, where):
    text = read("failures", name)
    with pytest.raises(_nvsmi.NvidiaSmiError) as info:
        _nvsmi.check_failure(text)
    assert info.value.cause == cause
    assert where in str(info.value)
    assert text.splitlines()[0].strip() in str(info.value)


def test_no_devices_is_not_a_failure_but_is_seen():
    text = read("failures", "no-devices.txt")
    _nvsmi.check_failure(text)
    assert _nvsmi.no_devices(text)
    assert not _nvsmi.no_devices(read("nccl-tests-307-8x4090-pix", "topo-m.txt"))


class Scripted:
    """run(argv) answering from files; records the argv it was given."""

    def __init__(self, answers):
        self.answers = answers
        self.calls = []

    def __call__(self, argv):
        self.calls.append(argv[1:])
        return self.answers[
            " ".join(argv[1:3])
            if argv[1] == "topo" and argv[2] == "-m"
            else " ".join(argv[1:4])
            if argv[1] == "topo"
            else argv[1]
        ]


def query_rows(count, name, bus_ids):
    # The query CSV is written for the test (no public sample has these ten fields); its shape is
    # nvidia-smi's csv,noheader,nounits.
    return "".join(
        "%d, GPU-%08d-0000-0000-0000-000000000000, %s, %s, 32607, 1, 5, 16, 16, 580.126.20\n" % (i, i, name, bus)
        for i, bus in enumerate(bus_ids)
    )


def test_collect_from_real_outputs():
    p2p = read("club3090-1133-2x5090-phb-gns", "p2p-rw.txt")
    run = Scripted(
        {
            "--query-gpu=index,uuid,name,pci.bus_id,memory.total,pcie.link.gen.current,pcie.link.gen.max,"
            "pcie.link.width.current,pcie.link.width.max,driver_version": (
                0,
                query_rows(2, "NVIDIA GeForce RTX 5090", ["00000000:01:00.0", "00000000:21:00.0"]),
                "",
            ),
            "topo -m": (0, read("club3090-1133-2x5090-phb-gns", "topo-m.txt"), ""),
            "topo -p2p r": (0, p2p, ""),
            "topo -p2p w": (0, p2p, ""),
            "topo -p2p n": (0, read("autodl-2x2080ti-pix-ns", "p2p-p.txt"), ""),
            "nvlink": (
                0,
                "GPU 0: NVIDIA GeForce RTX 5090 (UUID: GPU-00000000-0000-0000-0000-000000000000)\n"
                "GPU 1: NVIDIA GeForce RTX 5090 (UUID: GPU-00000001-0000-0000-0000-000000000000)\n",
                "",
            ),
        }
    )
    record = _topology_facts.collect_nvidia_smi(run, "nvidia-smi")
    assert run.calls == [
        list(_nvsmi.query_argv("x")[1:]),
        ["topo", "-m"],
        ["topo", "-p2p", "r"],
        ["topo", "-p2p", "w"],
        ["topo", "-p2p", "n"],
        ["nvlink", "-s"],
    ]
    assert record["driver_version"] == "580.126.20"
    assert record["gpus"][1] == {
        "index": 1,
        "uuid": "GPU-00000001-0000-0000-0000-000000000000",
        "name": "NVIDIA GeForce RTX 5090",
        "pci_bus_id": "0000:21:00.0",
        "memory_total_mib": 32607,
        "pcie": {"gen_current": 1, "gen_max": 5, "width_current": 16, "width_max": 16},
        "numa_node": 0,
        "cpu_affinity": "0-63",
        "gpu_numa_id": None,
        "nvlinks": 0,
    }
    assert record["links"] == {"GPU0": {"GPU0": "X", "GPU1": "PHB"}, "GPU1": {"GPU0": "PHB", "GPU1": "X"}}
    assert record["p2p"]["read"]["GPU0"]["GPU1"] == "GNS" and record["p2p"]["nvlink"]["GPU1"]["GPU0"] == "NS"
    summary = _topology_facts.summarize(record, ["GPU0", "GPU1"])
    assert summary["p2p_all_pairs"] is False and summary["p2p_pairs_not_ok"] == [["GPU0", "GPU1"]]


def test_collect_rejects_disagreeing_outputs_and_failed_commands():
    base = {
        "--query-gpu=index,uuid,name,pci.bus_id,memory.total,pcie.link.gen.current,pcie.link.gen.max,"
        "pcie.link.width.current,pcie.link.width.max,driver_version": (
            0,
            query_rows(5, "NVIDIA GeForce RTX 5060 Ti", ["0%d:00.0" % i for i in range(5)]),
            "",
        ),
        "topo -m": (0, read("aikitoria-13-5gpu-node-phb", "topo-m.txt"), ""),
        "topo -p2p r": (0, read("aikitoria-13-5gpu-node-phb", "p2p-p.txt"), ""),
        "topo -p2p w": (0, read("club3090-1133-2x5090-phb-gns", "p2p-rw.txt"), ""),
    }
    with pytest.raises(
        _topology_facts.GpuTopologyError,
        match="`nvidia-smi topo -p2p w` shows GPU0 GPU1, `topo -m` GPU0 GPU1 GPU2 GPU3 GPU4",
    ) as info:
        _topology_facts.collect_nvidia_smi(Scripted(base), "nvidia-smi")
    assert info.value.cause == "nvidia_smi_output"
    failing = dict(base)
    failing["topo -p2p w"] = (3, "", "Operation not supported on this GPU\n")
    with pytest.raises(
        _topology_facts.GpuTopologyError, match="`nvidia-smi topo -p2p w` exited 3: Operation not supported"
    ):
        _topology_facts.collect_nvidia_smi(Scripted(failing), "nvidia-smi")
    lost = dict(base)
    lost["topo -m"] = (15, read("failures", "gpu-lost-handle-nospace.txt"), "")
    with pytest.raises(_topology_facts.GpuTopologyError) as info:
        _topology_facts.collect_nvidia_smi(Scripted(lost), "nvidia-smi")
    assert info.value.cause == "gpu_lost" and "0000:07:00.0" in str(info.value)
    none = dict(base)
    none[next(iter(base))] = (6, read("failures", "no-devices.txt"), "")
    assert _topology_facts.collect_nvidia_smi(Scripted(none), "nvidia-smi") == _topology_facts.empty_record()
