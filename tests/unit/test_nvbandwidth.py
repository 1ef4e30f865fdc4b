# SPDX-License-Identifier: GPL-3.0-or-later
"""nvbandwidth's output read (plugins/module_utils/diag/_nvbandwidth.py) and judged cell by cell
(plugins/module_utils/diag/_copy_judge.py, _copy_physics.py) on the real outputs of tests/data/nvbandwidth, and the
module gpufleet.node.nvbandwidth as Ansible runs it, with a fake binary that records its argv and
prints those outputs.

Cases derived from a real sample (a row cut short, a figure replaced by ``nan``, a GPU's cells
scaled as a link trained to x8 would scale them) say so where they are built; the outputs
themselves are never edited on disk."""

from __future__ import annotations

import copy
import json
import re
import time

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.diag import _copy_judge as judge_mod
from ansible_collections.gpufleet.node.plugins.module_utils.diag import _nvbandwidth as nvb
from ansible_collections.gpufleet.node.plugins.module_utils.gpu import _nvsmi
from tests.harness import REPO
from tests.harness.modules import run_module

DATA = REPO / "tests" / "data" / "nvbandwidth"
H2D, D2H, READ, WRITE = nvb.HOST_TO_DEVICE, nvb.DEVICE_TO_HOST, nvb.PEER_READ, nvb.PEER_WRITE


def sample(name):
    return (DATA / name).read_text()


def text(name):
    return nvb.parse_text(sample(name))


def row(record, key, label):
    return [record["matrices"][key]["rows"][label][c] for c in record["matrices"][key]["columns"]]


# -- topology facts of the samples' machines --------------------------------------------------
# The 8x H100 80GB HBM3 machine of the v0.10.0 outputs: its PCI bus ids are those its own
# p2pBandwidthLatencyTest printed in the same report (19, 3b, 4c, 5d, 9b, bb, cb, db); the links
# are the NV18 all-to-all of a real HGX H100 `nvidia-smi topo -m` (tests/data/nvidia-smi); the
# PCIe link of an H100 80GB HBM3 (Gen5 x16) is read from a real --query-gpu answer.
H100_BUSES = ["0000:%s:00.0" % b for b in ("19", "3b", "4c", "5d", "9b", "bb", "cb", "db")]


def _h100_pcie():
    rows = _nvsmi.parse_query_csv(
        (REPO / "tests/data/nvidia-smi/query-gpu/h100-80gb-hbm3-590.48.01-header-units.csv").read_text()
    )
    gen, width = int(rows[0]["pcie.link.gen.max"]), int(rows[0]["pcie.link.width.max"])
    return {"gen_current": gen, "gen_max": gen, "width_current": width, "width_max": width}


def h100_facts():
    topo = _nvsmi.parse_topo_matrix(
        (REPO / "tests/data/nvidia-smi/sglang-30401-8xh100-nv18-8nic/topo-m.txt").read_text()
    )
    gpus = [
        {
            "index": g["index"],
            "name": "NVIDIA H100 80GB HBM3",
            "pci_bus_id": H100_BUSES[g["index"]],
            "pcie": _h100_pcie(),
            "nvlinks": 18,
        }
        for g in topo["gpus"]
    ]
    links = {g["label"]: dict(g["links"]) for g in topo["gpus"]}
    return {"gpus": gpus, "links": links, "p2p": {}, "pci_tree": {"redirecting": {}}}


def a6000_facts():
    """6x RTX A6000 (PCIe Gen4 x16) as the NVIDIA/nvbandwidth issue 50 output's figures group them:
    GPUs 0-2 and 3-5 copy at 26.3 GB/s within their group and about 22 across. The issue does not
    publish the topology: the PXB groups and SYS between them are this test's assumption."""
    gen4 = {"gen_current": 4, "gen_max": 4, "width_current": 16, "width_max": 16}
    gpus = [
        {"index": i, "name": "NVIDIA RTX A6000", "pci_bus_id": "0000:%02x:00.0" % (0x41 + i), "pcie": dict(gen4)}
        for i in range(6)
    ]
    links = {
        "GPU%d" % i: {"GPU%d" % j: "X" if i == j else ("PXB" if i // 3 == j // 3 else "SYS") for j in range(6)}
        for i in range(6)
    }
    return {"gpus": gpus, "links": links, "p2p": {}, "pci_tree": {"redirecting": {}}}


def h100_run():
    """The three default testcases of the v0.10.0 H100 machine (three runs of the same node)."""
    records = [text("h100-8x-v0.10.0-%s-ce.txt" % part) for part in ("h2d", "d2h", "d2d-read")]
    merged = nvb.empty_record("text")
    merged["version"] = records[0]["version"]
    for record in records:
        merged["testcases"].update(record["testcases"])
        merged["matrices"].update(record["matrices"])
    return merged


def scale(record, key, pick, factor):
    """A copy of ``record`` with the cells ``pick(row, column)`` of matrix ``key`` x ``factor``."""
    record = copy.deepcopy(record)
    for r, cells in record["matrices"][key]["rows"].items():
        for c, value in cells.items():
            if value is not None and pick(r, c):
                cells[c] = round(value * factor, 2)
    return record


# == the output, read =========================================================================
def test_h100_v0_4_peer_read_is_read_exactly():
    r = text("h100-8x-v0.4-d2d-read-ce.txt")
    assert r["problems"] == []
    assert (
        r["version"],
        r["git_version"],
        r["cuda_runtime_version"],
        r["cuda_driver_version"],
        r["driver_version"],
    ) == (
        "v0.4",
        "v0.4.2-12-g8857188",
        "12020",
        "12080",
        "570.133.20",
    )
    assert r["devices"] == [{"index": i, "name": "NVIDIA H100 80GB HBM3", "bus_id": None} for i in range(8)]
    assert r["testcases"] == {READ: {"status": "passed", "matrices": [READ], "errors": []}}
    m = r["matrices"][READ]
    assert m["title"] == "memcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)"
    assert m["columns"] == [str(i) for i in range(8)]
    assert row(r, READ, "0") == [None, 370.90, 370.90, 370.90, 370.38, 370.64, 370.26, 371.67]
    assert row(r, READ, "7") == [370.51, 371.67, 371.67, 370.38, 370.90, 370.90, 370.90, None]
    assert [m["rows"][str(i)][str(i)] for i in range(8)] == [None] * 8
    assert (m["sum"], m["cv"]) == (20785.58, None)


def test_h100_v0_10_runs_are_read_exactly():
    h2d, d2h = text("h100-8x-v0.10.0-h2d-ce.txt"), text("h100-8x-v0.10.0-d2h-ce.txt")
    read, write = text("h100-8x-v0.10.0-d2d-read-ce.txt"), text("h100-8x-v0.10.0-d2d-write-ce.txt")
    for r in (h2d, d2h, read, write):
        assert r["problems"] == [] and r["devices"] == []
        assert (r["version"], r["cuda_runtime_version"], r["cuda_driver_version"], r["driver_version"]) == (
            "v0.10.0",
            "13.2 (13020)",
            "13.2 (13020)",
            "595.71.05",
        )
        assert r["other_lines"] == [
            "NOTE: The reported results may not reflect the full capabilities of the platform.",
            "Performance can vary with software drivers, hardware clocks, and system topology.",
        ]
    assert row(h2d, H2D, "0") == [55.37, 55.36, 55.37, 55.36, 55.36, 55.36, 55.36, 55.33]
    assert (h2d["matrices"][H2D]["sum"], h2d["matrices"][H2D]["cv"]) == (442.87, 0.0)
    assert h2d["matrices"][H2D]["title"] == "memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)"
    assert row(d2h, D2H, "0") == [55.20, 55.20, 55.18, 55.18, 55.25, 55.25, 55.26, 55.20]
    assert d2h["matrices"][D2H]["sum"] == 441.72
    assert row(read, READ, "3") == [395.08, 395.08, 395.23, None, 395.23, 395.18, 395.19, 395.19]
    assert read["matrices"][READ]["sum"] == 22126.64
    assert row(write, WRITE, "2") == [397.48, 397.48, None, 397.44, 397.48, 397.46, 397.52, 397.52]
    assert write["matrices"][WRITE]["sum"] == 22258.35


H800_SUMS = {
    "host_to_device_memcpy_ce": 442.52,
    "device_to_host_memcpy_ce": 441.05,
    "host_to_device_bidirectional_memcpy_ce": 422.30,
    "device_to_host_bidirectional_memcpy_ce": 291.85,
    "device_to_device_memcpy_read_ce": 9643.22,
    "device_to_device_memcpy_write_ce": 9861.63,
    "device_to_device_bidirectional_memcpy_read_ce": 9554.42,
    "device_to_device_bidirectional_memcpy_write_ce": 9764.26,
    "all_to_host_memcpy_ce": 358.66,
    "all_to_host_bidirectional_memcpy_ce": 193.04,
    "host_to_all_memcpy_ce": 441.30,
    "host_to_all_bidirectional_memcpy_ce": 262.47,
    "all_to_one_write_ce": 1421.43,
    "all_to_one_read_ce": 1136.93,
    "one_to_all_write_ce": 1407.95,
    "one_to_all_read_ce": 1421.47,
    "host_to_device_memcpy_sm": 315.45,
    "device_to_host_memcpy_sm": 422.39,
    "device_to_device_memcpy_read_sm": 9385.10,
    "device_to_device_memcpy_write_sm": 9271.04,
    "device_to_device_bidirectional_memcpy_read_sm": 16898.01,
    "device_to_device_bidirectional_memcpy_write_sm": 18341.61,
    "all_to_host_memcpy_sm": 348.69,
    "all_to_host_bidirectional_memcpy_sm": 253.18,
    "host_to_all_memcpy_sm": 297.82,
    "host_to_all_bidirectional_memcpy_sm": 186.16,
    "all_to_one_write_sm": 1342.33,
    "all_to_one_read_sm": 1341.22,
    "one_to_all_write_sm": 1207.66,
    "one_to_all_read_sm": 1222.39,
}


def test_h800_v0_2_full_run_every_testcase_and_sum():
    r = text("h800-8x-v0.2-all.txt")
    assert r["problems"] == []
    assert (r["version"], r["git_version"], r["cuda_runtime_version"], r["cuda_driver_version"]) == (
        "v0.2",
        "42e94d2",
        "11080",
        "12000",
    )
    assert [d["name"] for d in r["devices"]] == ["NVIDIA H800"] * 8
    assert list(r["testcases"]) == list(H800_SUMS)
    assert {k: m["sum"] for k, m in r["matrices"].items()} == H800_SUMS
    assert {e["status"] for e in r["testcases"].values()} == {"passed"}
    assert r["matrices"]["all_to_one_write_ce"]["title"] == "memcpy CE All Gpus -> GPU(column) total bandwidth (GB/s)"
    assert row(r, "device_to_host_bidirectional_memcpy_ce", "0")[:2] == [34.47, 50.50]
    assert row(r, READ, "6")[5] == 172.54


def test_b300_v0_10_bidirectional_testcases_have_three_matrices():
    r = text("b300-7x-v0.10.0-ce.txt")
    assert r["problems"] == []
    bidir = "device_to_device_bidirectional_memcpy_read_ce"
    assert r["testcases"][bidir]["matrices"] == [bidir + "_read1", bidir + "_read2", bidir + "_total"]
    assert r["matrices"][bidir + "_read2"]["title"] == "memcpy CE GPU(row) <-> GPU(column) Read2 bandwidth (GB/s)"
    assert r["matrices"][bidir + "_read2"]["testcase"] == bidir
    assert (r["matrices"][bidir + "_read1"]["cv"], r["matrices"][bidir + "_total"]["cv"]) == (None, 0.0)
    assert r["matrices"][bidir + "_total"]["sum"] == 63869.90
    assert r["matrices"]["device_to_host_bidirectional_memcpy_ce"]["cv"] == 0.01
    assert row(r, READ, "6") == [766.07, 764.98, 765.11, 765.80, 764.16, 766.21, None]
    assert row(r, D2H, "0") == [57.29, 57.30, 57.29, 57.05, 57.00, 56.99, 56.92]


def test_small_samples_are_read_exactly():
    a100 = text("a100-1x-v0.8-h2d-sm.txt")
    assert a100["problems"] == []
    assert a100["devices"] == [{"index": 0, "name": "NVIDIA A100-SXM4-40GB", "bus_id": "00000000:99:00"}]
    assert a100["matrices"]["host_to_device_memcpy_sm"]["rows"] == {"0": {"0": 25.13}}
    rtx = text("rtx4090-8x-v0.2-h2d-d2h-ce.txt")
    assert rtx["problems"] == []
    assert row(rtx, H2D, "0") == [25.50, 24.26, 23.90, 26.30, 26.28, 26.38, 26.09, 26.31]
    assert rtx["matrices"][D2H]["sum"] == 214.28


def test_a6000_matrix_without_its_running_line_is_named_by_its_sum():
    # The author cut the device list and the "Running" line into "...".
    r = text("a6000-6x-v0.8-d2d-read-ce.txt")
    assert r["problems"] == [] and r["other_lines"] == ["..."]
    assert r["testcases"] == {READ: {"status": "passed", "matrices": [READ], "errors": []}}
    assert row(r, READ, "3") == [21.82, 21.82, 22.26, None, 26.34, 26.35]
    assert r["matrices"][READ]["sum"] == 715.53


def test_a_testcase_that_died_before_its_matrix_keeps_its_errors():
    r = text("a100-8x-v0.7-d2d-read-assert.txt")
    assert r["testcases"][READ]["status"] == "incomplete"
    assert r["testcases"][READ]["errors"] == [
        "Invalid value when checking the pattern at 0x70a640000000",
        "Current offset : 11136",
        "ASSERT in expression h_errorFlag == 0 in void memcmpPatternHelper(CUstream, CUdeviceptr, long long unsigned"
        " int, unsigned int, CompareKernelFunc, std::shared_ptr<NodeHelper>)() :"
        " /mnt/project/cuda_related/nvbandwidth/memcpy.cpp:165",
    ]
    assert [d["bus_id"] for d in r["devices"]][:2] == ["00000000:34:00", "00000000:35:00"]
    l40s = text("l40s-8x-v0.4-abort.txt")
    assert l40s["testcases"]["one_to_all_read_sm"]["status"] == "incomplete"
    assert l40s["testcases"]["one_to_all_read_sm"]["errors"][-1] == "Aborted (core dumped)"


def test_waived_testcases_named_and_unnamed():
    r = text("2080ti-2x-v0.2-waiving.txt")
    assert r["testcases"] == {WRITE: {"status": "waived", "matrices": [], "errors": []}}
    fixture = text("gh200-superbench-fixture.txt")
    assert fixture["waived_unnamed"] == 17


def test_superbench_fixture_matrices_that_do_not_fit_the_device_list():
    # superbenchmark's test fixture: a one-GPU GH200 output whose first two matrices that project
    # widened for its own parser tests.
    r = text("gh200-superbench-fixture.txt")
    assert r["problems"] == [
        "host_to_device_memcpy_ce: the matrix has 3 columns but nvbandwidth listed 1 device(s)",
        "device_to_host_memcpy_ce: the matrix has 2 columns but nvbandwidth listed 1 device(s)",
    ]
    assert r["devices"] == [{"index": 0, "name": "NVIDIA GH200 480GB", "bus_id": "00000009:01:00"}]
    assert r["matrices"]["host_device_latency_sm"]["title"] == "memory latency SM CPU(row) <-> GPU(column) (ns)"


def test_json_output_is_read_exactly():
    r = nvb.parse_json(sample("json-v0.5-1gpu-dcgm.json"))
    assert r["problems"] == [] and r["other_lines"] == []
    assert (r["format"], r["version"], r["git_version"], r["cuda_runtime_version"], r["driver_version"]) == (
        "json",
        "v0.5",
        None,
        "12070",
        "565.02",
    )
    assert len(r["testcases"]) == 32
    assert r["testcases"][READ] == {"status": "waived", "matrices": [], "errors": []}
    assert r["matrices"][H2D] == {
        "testcase": H2D,
        "title": "memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)",
        "columns": ["0"],
        "rows": {"0": {"0": 12.3964}},
        "sum": 12.396361291250001,
        "cv": None,
    }
    assert r["matrices"][D2H]["rows"] == {"0": {"0": 13.2001}}


def test_json_with_lines_around_the_object():
    # DCGM's own variant of the same output, with warning lines before and after it.
    r = nvb.parse_json(sample("json-v0.5-1gpu-dcgm-noise.txt"))
    assert r["problems"] == []
    assert r["other_lines"][0] == "WARNING: Failed to acquire log file lock. File is in use by a different instance"
    assert len(r["other_lines"]) == 6
    assert r["matrices"][H2D]["rows"] == {"0": {"0": 12.3964}}


def test_help_says_what_the_build_supports():
    v02 = nvb.parse_help(sample("help-v0.2.txt"))
    assert (
        v02["nvbandwidth"],
        v02["version"],
        v02["json"],
        v02["testcase"],
        v02["buffer_size"],
        v02["test_samples"],
    ) == (
        True,
        "v0.2",
        False,
        True,
        True,
        False,
    )
    v08 = nvb.parse_help(sample("help-v0.8-readme.txt"))
    assert (v08["json"], v08["testcase"], v08["test_samples"]) == (True, True, True)
    assert nvb.parse_help(sample("h100-8x-v0.4-d2d-read-ce.txt"))["nvbandwidth"] is False


def test_argv():
    assert nvb.build_argv("/opt/nvbandwidth/nvbandwidth", [H2D, READ], True, 1024, 5) == [
        "/opt/nvbandwidth/nvbandwidth",
        "-j",
        "-t",
        H2D,
        "-t",
        READ,
        "--bufferSize",
        "1024",
        "--testSamples",
        "5",
    ]
    assert nvb.build_argv("nvbandwidth", [D2H], False) == ["nvbandwidth", "-t", D2H]


# -- the output, refused (each derived from a real sample) ------------------------------------
def test_a_matrix_cut_short_has_no_sum():
    lines = sample("h100-8x-v0.4-d2d-read-ce.txt").splitlines()
    cut = "\n".join(lines[: lines.index(next(x for x in lines if x.startswith("4 ")))])  # ends after row 3
    r = nvb.parse_text(cut)
    assert r["problems"] == [
        "device_to_device_memcpy_read_ce ('memcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)'): the matrix ends"
        " without its SUM line (the output was cut short, or nvbandwidth died while printing it)"
    ]
    assert r["matrices"] == {}


def test_a_row_with_a_missing_cell():
    out = sample("h100-8x-v0.4-d2d-read-ce.txt").replace(
        "\n3    370.90    372.05    372.05       N/A    371.79    371.02    370.77    370.90\n",
        "\n3    370.90    372.05    372.05       N/A    371.79    371.02    370.77\n",
    )
    r = nvb.parse_text(out)
    assert r["problems"] == [
        "device_to_device_memcpy_read_ce ('memcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)'): row 3 has 7 cells"
        " where the header has 8 columns (truncated or mangled output)"
    ]


def test_non_finite_and_negative_figures():
    out = (
        sample("h100-8x-v0.10.0-h2d-ce.txt")
        .replace(" 55.33\n", "   nan\n")
        .replace("55.37     55.36     55.37", "55.37     -55.36     55.37")
    )
    r = nvb.parse_text(out)
    assert r["problems"] == [
        "host_to_device_memcpy_ce ('memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)'): row 0, column 1: '-55.36' is negative",
        "host_to_device_memcpy_ce ('memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)'): row 0, column 7: 'nan' is not a finite figure",
    ]
    out = sample("h100-8x-v0.10.0-h2d-ce.txt").replace(
        "SUM host_to_device_memcpy_ce 442.87", "SUM host_to_device_memcpy_ce inf"
    )
    assert nvb.parse_text(out)["problems"] == ["host_to_device_memcpy_ce: SUM 'inf' is not a finite figure"]


def test_a_sum_that_does_not_add_up():
    out = sample("h100-8x-v0.10.0-h2d-ce.txt").replace(
        "SUM host_to_device_memcpy_ce 442.87", "SUM host_to_device_memcpy_ce 452.87"
    )
    assert nvb.parse_text(out)["problems"] == [
        "host_to_device_memcpy_ce: SUM 452.87 does not match its cells (they add up to 442.87): the output is mangled"
    ]


def test_json_refused():
    whole = sample("json-v0.5-1gpu-dcgm.json")
    assert nvb.parse_json(whole[: len(whole) // 2])["problems"] == [
        "the output holds no JSON object (no line with only '{' ... '}'), though -j was given"
    ]
    broken = whole.replace('"name" : "host_to_device_memcpy_ce",\n', "", 1)
    assert nvb.parse_json(broken)["problems"] == [
        "a JSON testcase without a name: " + repr(_first_testcase_without_name(broken))
    ]
    nan = whole.replace('"12.3964"', '"nan"', 1)
    assert nvb.parse_json(nan)["problems"] == [
        "host_to_device_memcpy_ce ('memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)'): row 0, column 0: 'nan' is not a finite figure"
    ]
    assert nvb.parse_json(sample("h100-8x-v0.4-d2d-read-ce.txt"))["problems"][0].startswith(
        "the output holds no JSON object"
    )


def _first_testcase_without_name(text):
    return next(t for t in json.loads(text)["nvbandwidth"]["testcases"] if "name" not in t)


# == the judgement ============================================================================
def test_a_healthy_h100_passes_every_cell():
    result = judge_mod.judge(h100_run(), list(nvb.DEFAULT_TESTCASES), h100_facts())
    assert result["passed"] is True and result["status"] == "pass"
    assert result["slow_cells"] == []
    assert [c["name"] for c in result["checks"]] == ["nvbandwidth_output", H2D, D2H, READ]
    assert len(result["cells"]) == 8 + 8 + 56
    first = result["cells"][0]
    assert {k: first[k] for k in ("cell", "src", "dst", "gbps", "bar", "rule", "expected_gbps", "basis", "status")} == {
        "cell": "host_to_device_memcpy_ce:CPU->GPU0",
        "src": "CPU",
        "dst": "GPU0",
        "gbps": 55.37,
        "bar": 46.6,
        "rule": "physics",
        "expected_gbps": 54.82,
        "basis": "PCIe Gen5 x16 63.02 GB/s x 0.87 (copy engine)",
        "status": "pass",
    }
    d2h = next(c for c in result["cells"] if c["testcase"] == D2H)
    assert (d2h["src"], d2h["dst"], d2h["bar"]) == ("GPU0", "CPU", 46.6)
    peer = next(c for c in result["cells"] if c["cell"] == "device_to_device_memcpy_read_ce:GPU3->GPU2")
    assert (peer["gbps"], peer["bar"], peer["expected_gbps"], peer["basis"]) == (
        395.23,
        313.65,
        369.0,
        "NV18: 18 links x 25 GB/s x 0.82 (copy engine)",
    )
    assert result["checks"][1]["reason"] == (
        "8 cells at or above their bars (closest: CPU->GPU7 55.33 GB/s, bar 46.60 GB/s by physics)"
    )


def test_a_gpu_trained_to_x8_fails_its_host_cells_and_names_the_cause():
    facts = h100_facts()
    facts["gpus"][3]["pcie"]["width_current"] = 8
    run = scale(h100_run(), H2D, lambda r, c: c == "3", 0.5)
    run = scale(run, D2H, lambda r, c: c == "3", 0.5)  # what x8 does to a link: half its lanes
    result = judge_mod.judge(run, list(nvb.DEFAULT_TESTCASES), facts)
    assert result["passed"] is False and result["status"] == "fail"
    assert [(c["cell"], c["gbps"], c["bar"], c["status"]) for c in result["slow_cells"]] == [
        ("host_to_device_memcpy_ce:CPU->GPU3", 27.68, 46.6, "slow"),
        ("device_to_host_memcpy_ce:GPU3->CPU", 27.59, 46.6, "slow"),
    ]
    cause = (
        "GPU3's PCIe link trained to x8 of x16 (reseat the card, check the slot, the riser and the BIOS lane settings)"
    )
    assert result["slow_cells"][0]["causes"] == [cause]
    check = result["checks"][1]
    assert (check["name"], check["status"], check["gpus"], check["action"]) == (
        H2D,
        "fail",
        [3],
        "drain and inspect the hardware",
    )
    assert check["reason"] == (
        "host_to_device_memcpy_ce CPU->GPU3 27.68 GB/s under its bar 46.60 GB/s (physics: PCIe Gen5 x16 63.02 GB/s x"
        " 0.87 (copy engine) x threshold_fraction): " + cause
    )
    assert result["checks"][3]["status"] == "pass"  # the peer copies go over NVLink


def test_the_same_cells_without_the_trained_down_link_name_the_host_side():
    run = scale(h100_run(), H2D, lambda r, c: c == "5", 0.5)
    result = judge_mod.judge(run, [H2D], h100_facts())
    assert [c["cell"] for c in result["slow_cells"]] == ["host_to_device_memcpy_ce:CPU->GPU5"]
    assert result["slow_cells"][0]["causes"][0].startswith("the topology facts show no fault on GPU5's link (x16 Gen5)")


def test_the_peers_rule_fails_what_physics_passes():
    # The v0.4 machine copies GPU to GPU at 370-373 GB/s; the v0.10.0 machine of the same design at 395.
    old = text("h100-8x-v0.4-d2d-read-ce.txt")
    medians = {c["cell"]: c["gbps"] for c in judge_mod.judge(h100_run(), [READ], h100_facts())["cells"]}
    assert judge_mod.judge(old, [READ], h100_facts())["passed"] is True
    result = judge_mod.judge(old, [READ], h100_facts(), peer_medians=medians)
    assert result["passed"] is False and len(result["slow_cells"]) == 56
    first = result["slow_cells"][0]
    assert (first["cell"], first["gbps"], first["bar"], first["rule"], first["physics_bar"], first["peer_median"]) == (
        "device_to_device_memcpy_read_ce:GPU0->GPU1",
        370.90,
        379.28,
        "peers",
        313.65,
        395.08,
    )
    assert "(peers: peers' median 395.08 GB/s x baseline_fraction)" in result["checks"][1]["reason"]
    healthy = judge_mod.judge(old, [READ], h100_facts(), peer_medians=dict.fromkeys(medians, 371.0))
    assert healthy["passed"] is True and {c["rule"] for c in healthy["cells"]} == {"peers"}


def test_the_bar_keeps_the_design_nvlink_count_when_a_link_is_down():
    facts = h100_facts()
    for other in range(8):
        if other != 2:
            facts["links"]["GPU2"]["GPU%d" % other] = facts["links"]["GPU%d" % other]["GPU2"] = "NV17"
    run = scale(text("h100-8x-v0.4-d2d-read-ce.txt"), READ, lambda r, c: "2" in (r, c), 0.8)
    result = judge_mod.judge(run, [READ], facts)
    slow = result["slow_cells"]
    assert len(slow) == 14 and {c["bar"] for c in slow} == {313.65}
    assert slow[0]["basis"] == "NV18: 18 links x 25 GB/s x 0.82 (copy engine); the facts show NV17"
    assert slow[0]["causes"] == [
        "GPU0 and GPU2 have NV17 where the design has NV18: an NVLink is down (nvidia-smi nvlink -s)"
    ]


def test_acs_redirect_on_a_pairs_path_names_that_pairs_cells():
    acs = {  # pcie_acs_info's gpu_pairs: the bridges GPU0<->GPU1 cross, both redirecting
        "gpu_pairs": [
            {
                "gpus": ["0000:41:00.0", "0000:42:00.0"],
                "bridges": ["0000:40:01.0", "0000:40:02.0"],
                "redirecting": ["0000:40:01.0", "0000:40:02.0"],
                "blocked": True,
            },
        ]
    }
    a6000 = text("a6000-6x-v0.8-d2d-read-ce.txt")
    healthy = judge_mod.judge(a6000, [READ], a6000_facts(), acs=acs)
    assert healthy["passed"] is True
    assert {(c["rule"], c["bar"]) for c in healthy["cells"]} == {("physics", 21.43), ("physics", 13.39)}
    # ACS redirect roughly halves a PCIe peer copy (NVIDIA/nccl issue 700).
    run = scale(a6000, READ, lambda r, c: {r, c} == {"0", "1"}, 0.5)
    result = judge_mod.judge(run, [READ], a6000_facts(), acs=acs)
    assert [(c["cell"], c["gbps"], c["bar"]) for c in result["slow_cells"]] == [
        ("device_to_device_memcpy_read_ce:GPU0->GPU1", 13.17, 21.43),
        ("device_to_device_memcpy_read_ce:GPU1->GPU0", 13.17, 21.43),
    ]
    assert result["slow_cells"][0]["causes"] == [
        "a bridge on the path still redirects peer traffic (ACS): 0000:40:01.0, 0000:40:02.0 (clear"
        " ReqRedir/CmpltRedir/EgressCtrl there: gpufleet.node.pcie_acs)"
    ]
    check = result["checks"][1]
    assert (check["gpus"], check["action"]) == ([0, 1], "fix the node configuration")
    # The facts' own PCI tree says the same.
    facts = a6000_facts()
    facts["pci_tree"]["redirecting"] = {"GPU0": {"GPU1": ["0000:40:01.0"]}, "GPU1": {"GPU0": ["0000:40:01.0"]}}
    again = judge_mod.judge(run, [READ], facts)
    assert again["slow_cells"][0]["causes"][0].startswith(
        "a bridge on the path still redirects peer traffic (ACS): 0000:40:01.0 "
    )


def test_a_pair_across_sys_is_named_as_such():
    run = scale(text("a6000-6x-v0.8-d2d-read-ce.txt"), READ, lambda r, c: (r, c) == ("0", "5"), 0.5)
    slow = judge_mod.judge(run, [READ], a6000_facts())["slow_cells"]
    assert [c["cell"] for c in slow] == ["device_to_device_memcpy_read_ce:GPU0->GPU5"]
    assert slow[0]["causes"][0] == (
        "GPU0 and GPU5 have no NVLink: their copies cross SYS (the SMP interconnect between NUMA nodes (QPI/UPI/Infinity Fabric))"
    )


def test_no_peer_access_is_a_failed_cell():
    out = sample("h100-8x-v0.4-d2d-read-ce.txt").replace("0       N/A    370.90", "0       N/A       N/A", 1)
    out = out.replace("SUM device_to_device_memcpy_read_ce 20785.58", "SUM device_to_device_memcpy_read_ce 20414.68")
    result = judge_mod.judge(nvb.parse_text(out), [READ], h100_facts())
    assert [(c["cell"], c["status"], c["gbps"]) for c in result["slow_cells"]] == [
        ("device_to_device_memcpy_read_ce:GPU0->GPU1", "no_peer_access", None)
    ]
    assert result["checks"][1]["reason"].startswith(
        "device_to_device_memcpy_read_ce GPU0->GPU1: no figure (N/A: nvbandwidth could not enable peer access)"
    )


def test_output_problems_fail_the_run():
    waived = judge_mod.judge(text("2080ti-2x-v0.2-waiving.txt"), [WRITE], a6000_facts())
    assert waived["checks"][0]["reason"] == (
        "device_to_device_memcpy_write_ce was waived: it cannot run here (device to device with one GPU, or without"
        " peer access between the GPUs)"
    )
    unnamed = judge_mod.judge(text("gh200-superbench-fixture.txt"), [READ], h100_facts())
    assert (
        "device_to_device_memcpy_read_ce is not in the output and nvbandwidth printed 17 'Waived:' line(s): it waives"
        " a testcase that cannot run here (device to device with one GPU, or without peer access between the GPUs)"
    ) in unnamed["checks"][0]["reason"]
    died = judge_mod.judge(text("a100-8x-v0.7-d2d-read-assert.txt"), [READ], h100_facts())
    assert "device_to_device_memcpy_read_ce did not finish: Invalid value when checking the pattern" in died["reason"]
    extra = judge_mod.judge(text("h800-8x-v0.2-all.txt"), [H2D], h100_facts())
    assert "the output holds testcases that were not asked for (device_to_host_memcpy_ce, " in extra["reason"]
    for result in (waived, unnamed, died, extra):
        assert (result["passed"], result["status"], result["checks"][0]["status"]) == (False, "fail", "fail")


def test_a_testcase_the_build_does_not_know():
    # Synthetic line, as nvbandwidth.cpp's findTestcase/addTestcase print it ("ERROR: " + "Testcase
    # NAME not found!"), after the real v0.2 RTX 4090 output.
    out = sample("rtx4090-8x-v0.2-h2d-d2h-ce.txt") + "ERROR: Testcase device_to_device_memcpy_write_ce not found!\n"
    record = nvb.parse_text(out)
    assert record["testcases"][WRITE] == {
        "status": "not_found",
        "matrices": [],
        "errors": ["ERROR: Testcase device_to_device_memcpy_write_ce not found!"],
    }
    result = judge_mod.judge(record, [H2D, D2H, WRITE], h100_facts())
    assert result["checks"][0]["reason"] == (
        "device_to_device_memcpy_write_ce: this nvbandwidth does not have it (ERROR: Testcase"
        " device_to_device_memcpy_write_ce not found!): install a newer release"
    )
    assert result["checks"][0]["action"] == "fix the node configuration"


def test_gpus_that_do_not_match_the_facts():
    four = h100_facts()
    four["gpus"] = four["gpus"][:4]
    result = judge_mod.judge(text("h100-8x-v0.10.0-h2d-ce.txt"), [H2D], four)
    assert result["checks"][0]["reason"] == (
        "host_to_device_memcpy_ce: nvbandwidth measured 8 GPU(s) where the topology facts list 4 (a GPU hidden by"
        " CUDA_VISIBLE_DEVICES, a GPU the driver lost, or facts from another node)"
    )
    assert result["cells"] == [] and result["passed"] is False
    superbench = judge_mod.judge(
        text("gh200-superbench-fixture.txt"), [H2D], {"gpus": [{"index": 0, "pci_bus_id": "0009:01:00.0"}]}
    )
    assert (
        "host_to_device_memcpy_ce: the matrix has 2 rows where nvbandwidth prints one (the CPU)" in superbench["reason"]
    )
    a100 = {"gpus": [{"index": i, "pci_bus_id": bus} for i, bus in enumerate(["0000:34:00.0", "0000:36:00.0"])]}
    moved = judge_mod.judge(text("a100-8x-v0.7-d2d-read-assert.txt"), [READ], a100)
    assert "nvbandwidth's device 1 is at 00000000:35:00 but the facts' GPU1 is at 0000:36:00.0" in moved["reason"]


def test_a_cell_without_a_bar_is_not_a_pass():
    facts = h100_facts()
    del facts["gpus"][6]["pcie"]["width_max"]
    result = judge_mod.judge(text("h100-8x-v0.10.0-h2d-ce.txt"), [H2D], facts)
    assert result["passed"] is False
    cell = next(c for c in result["cells"] if c["dst"] == "GPU6")
    assert (cell["status"], cell["bar"], cell["basis"]) == (
        "unjudged",
        None,
        "the topology facts lack pcie.gen_max/width_max for GPU6",
    )
    assert (
        result["checks"][1]["reason"]
        == "1 cell(s) without a bar (the topology facts lack pcie.gen_max/width_max for GPU6)"
    )
    # A peer median gives it one.
    ok = judge_mod.judge(
        text("h100-8x-v0.10.0-h2d-ce.txt"), [H2D], facts, peer_medians={"host_to_device_memcpy_ce:CPU->GPU6": 55.36}
    )
    assert ok["passed"] is True


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((0.0, 0.96, {}, [H2D]), "threshold_fraction must be in (0, 1.5], got 0.0"),
        ((0.85, float("nan"), {}, [H2D]), "baseline_fraction must be in (0, 1.5], got nan"),
        ((0.85, 0.96, {}, []), "testcases is empty"),
        ((0.85, 0.96, {"x": "fast"}, [H2D]), "peer_medians['x'] must be a positive number of GB/s, got 'fast'"),
        ((0.85, 0.96, {}, ["host_to_device_memcpy_sm"]), "testcases host_to_device_memcpy_sm cannot be judged"),
    ],
)
def test_options_refused(args, error):
    with pytest.raises(judge_mod.JudgeError, match=re.escape(error)):
        judge_mod.check_options(*args)


# == the module ===============================================================================
def fake_nvbandwidth(tmp_path, help_sample, run_sample, rc=0, sleep=0):
    """A script that appends its argv (one per line, then ``--``) to ``argv.log``, answers
    ``--help`` with ``help_sample`` and any other call with ``run_sample`` and exit ``rc``."""
    script = tmp_path / "nvbandwidth"
    record = tmp_path / "argv.log"
    script.write_text(
        "#!/bin/sh\nprintf '%%s\\n' \"$@\" >> '%s'\necho -- >> '%s'\n"
        "if [ \"$1\" = --help ]; then cat '%s'; exit 0; fi\n%s"
        "cat '%s'\nexit %d\n"
        % (record, record, DATA / help_sample, "sleep %d\n" % sleep if sleep else "", DATA / run_sample, rc)
    )
    script.chmod(0o755)
    return script, record


def calls(record):
    return [chunk.strip("\n").split("\n") for chunk in record.read_text().split("--\n") if chunk.strip()]


def test_module_text_mode_passes_a_healthy_h100(tmp_path):
    # v0.2's --help (no --json) answers for the binary; the run prints the v0.4 H100 output.
    binary, record = fake_nvbandwidth(tmp_path, "help-v0.2.txt", "h100-8x-v0.4-d2d-read-ce.txt")
    result = run_module("nvbandwidth", {"binary": str(binary), "topology": h100_facts(), "testcases": [READ]})
    assert not result.get("failed"), result.get("msg")
    assert calls(record) == [["--help"], ["-t", READ]]
    assert result["cmd"] == [str(binary), "-t", READ]
    assert (result["changed"], result["available"], result["passed"], result["status"]) == (False, True, True, "pass")
    assert (result["format"], result["version"], result["rc"], len(result["cells"])) == ("text", "v0.4", 0, 56)
    assert result["matrices"][READ]["sum"] == 20785.58
    assert result["matrices"][READ]["rows"]["0"]["1"] == 370.9
    assert "stdout" not in result


# DCGM's JSON output does not name its GPU: these facts (one GPU on PCIe Gen3 x16, which its 12.4 and
# 13.2 GB/s fit) are the tests' assumption.
ONE_GEN3_GPU = {
    "gpus": [
        {"index": 0, "name": "GPU", "pcie": {"gen_max": 3, "width_max": 16, "gen_current": 3, "width_current": 16}}
    ]
}


def test_json_output_judged():
    record = nvb.parse_json(sample("json-v0.5-1gpu-dcgm.json"))
    # DCGM ran the whole suite; keep the two testcases this judgement asks for.
    record["testcases"] = {k: v for k, v in record["testcases"].items() if k in (H2D, D2H)}
    result = judge_mod.judge(record, [H2D, D2H], ONE_GEN3_GPU)
    assert (result["passed"], result["format"], result["version"]) == (True, "json", "v0.5")
    assert [(c["cell"], c["gbps"], c["bar"], c["basis"]) for c in result["cells"]] == [
        ("host_to_device_memcpy_ce:CPU->GPU0", 12.3964, 10.98, "PCIe Gen3 x16 15.75 GB/s x 0.82 (copy engine)"),
        ("device_to_host_memcpy_ce:GPU0->CPU", 13.2001, 10.98, "PCIe Gen3 x16 15.75 GB/s x 0.82 (copy engine)"),
    ]


def test_module_json_mode_when_help_lists_json(tmp_path):
    # v0.8's --help lists --json, so the run gets -j; the fake then prints DCGM's whole-suite output,
    # which is not what `-t` asked for: the run fails on it, read as JSON.
    binary, record = fake_nvbandwidth(tmp_path, "help-v0.8-readme.txt", "json-v0.5-1gpu-dcgm.json")
    result = run_module(
        "nvbandwidth",
        {"binary": str(binary), "topology": ONE_GEN3_GPU, "testcases": [H2D, D2H], "buffer_size": 512, "iterations": 5},
    )
    assert calls(record) == [["--help"], ["-j", "-t", H2D, "-t", D2H, "--bufferSize", "512", "--testSamples", "5"]]
    assert (result["format"], result["version"], result["passed"], result["failed"]) == ("json", "v0.5", False, True)
    assert result["matrices"][H2D]["rows"] == {"0": {"0": 12.3964}}
    assert [(c["cell"], c["status"]) for c in result["cells"]] == [
        ("host_to_device_memcpy_ce:CPU->GPU0", "pass"),
        ("device_to_host_memcpy_ce:GPU0->CPU", "pass"),
    ]
    assert result["checks"][0]["reason"].startswith(
        "the output holds testcases that were not asked for (host_to_device_bidirectional_memcpy_ce, "
    )


def test_module_fails_with_the_full_result_on_slow_cells(tmp_path):
    binary, _record = fake_nvbandwidth(tmp_path, "help-v0.2.txt", "h100-8x-v0.4-d2d-read-ce.txt")
    medians = {"device_to_device_memcpy_read_ce:GPU0->GPU1": 395.08}
    result = run_module(
        "nvbandwidth", {"binary": str(binary), "topology": h100_facts(), "testcases": [READ], "peer_medians": medians}
    )
    assert result["failed"] is True
    assert result["msg"].startswith(
        "nvbandwidth copy matrix judged unhealthy on `%s -t device_to_device_memcpy_read_ce`: device_to_device_memcpy_read_ce:"
        " device_to_device_memcpy_read_ce GPU0->GPU1 370.90 GB/s under its bar 379.28 GB/s (peers" % binary
    )
    assert [c["cell"] for c in result["slow_cells"]] == ["device_to_device_memcpy_read_ce:GPU0->GPU1"]
    assert (result["status"], result["changed"], len(result["cells"]), result["rc"]) == ("fail", False, 56, 0)
    assert result["stdout"].startswith("nvbandwidth Version: v0.4")


def test_module_non_zero_exit(tmp_path):
    binary, _record = fake_nvbandwidth(tmp_path, "help-v0.2.txt", "a100-8x-v0.7-d2d-read-assert.txt", rc=1)
    result = run_module("nvbandwidth", {"binary": str(binary), "topology": h100_facts(), "testcases": [READ]})
    assert result["failed"] is True and result["rc"] == 1
    assert "nvbandwidth exited 1: ASSERT in expression h_errorFlag == 0" in result["msg"]
    assert result["checks"][0]["status"] == "fail" and result["cells"] == []


def test_module_refuses_an_option_the_build_lacks(tmp_path):
    binary, record = fake_nvbandwidth(tmp_path, "help-v0.2.txt", "h100-8x-v0.4-d2d-read-ce.txt")
    result = run_module("nvbandwidth", {"binary": str(binary), "topology": h100_facts(), "iterations": 5})
    assert result["failed"] is True
    assert result["msg"].endswith(
        "%s (v0.2) has no --testSamples option: install a newer nvbandwidth (github.com/NVIDIA/nvbandwidth) or leave"
        " the option out" % binary
    )
    assert calls(record) == [["--help"]]


def test_module_refuses_a_binary_that_is_not_nvbandwidth(tmp_path):
    binary, record = fake_nvbandwidth(tmp_path, "h100-8x-v0.4-d2d-read-ce.txt", "h100-8x-v0.4-d2d-read-ce.txt")
    result = run_module("nvbandwidth", {"binary": str(binary), "topology": h100_facts()})
    assert result["failed"] is True and "printed no nvbandwidth option list" in result["msg"]
    assert calls(record) == [["--help"]]


def test_module_timeout_kills_the_run(tmp_path):
    binary, record = fake_nvbandwidth(tmp_path, "help-v0.2.txt", "h100-8x-v0.4-d2d-read-ce.txt", sleep=60)
    started = time.monotonic()
    result = run_module(
        "nvbandwidth", {"binary": str(binary), "topology": h100_facts(), "testcases": [READ], "timeout": 2}
    )
    assert time.monotonic() - started < 30
    assert result["failed"] is True and "rc" not in result
    assert (
        "`%s -t device_to_device_memcpy_read_ce` did not finish within 2 s; its process group was killed" % binary
        in result["msg"]
    )
    assert calls(record) == [["--help"], ["-t", READ]]


def test_module_check_mode_runs_nothing(tmp_path):
    binary, record = fake_nvbandwidth(tmp_path, "help-v0.2.txt", "h100-8x-v0.4-d2d-read-ce.txt")
    result = run_module("nvbandwidth", {"binary": str(binary), "topology": h100_facts()}, check_mode=True)
    assert not result.get("failed"), result.get("msg")
    assert not record.exists()
    assert (result["status"], result["passed"], result["changed"], result["cells"]) == ("not_run", None, False, [])
    assert result["cmd"] == [str(binary), "-t", H2D, "-t", D2H, "-t", READ]
    assert result["reason"].startswith("check mode: nvbandwidth was not run")


def test_module_without_a_binary(tmp_path):
    absent = run_module("nvbandwidth", {"binary": str(tmp_path / "nvbandwidth"), "topology": h100_facts()})
    assert not absent.get("failed")
    assert (absent["available"], absent["passed"], absent["status"], absent["cmd"]) == (
        False,
        False,
        "unavailable",
        None,
    )
    assert absent["reason"] == "%s is not an executable file" % (tmp_path / "nvbandwidth")
    named = run_module(
        "nvbandwidth", {"binary": "nvbandwidth-not-installed", "topology": h100_facts()}, check_mode=True
    )
    assert (named["available"], named["passed"]) == (False, False)
    assert named["reason"].startswith(
        "nvbandwidth-not-installed is not installed (not on PATH, /usr/local/bin, /opt/nvbandwidth)"
    )
