# SPDX-License-Identifier: GPL-3.0-or-later
"""all_reduce_perf output as real runs print it (tests/data/nccl/*.txt, source beside each file),
read by plugins/module_utils/nccl/_output.py, and the gate's verdict on each."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _command, _judge, _output

DATA = Path(__file__).resolve().parent.parent / "data" / "nccl"
SAMPLES = sorted(p.stem for p in DATA.glob("*.txt"))


def parsed(name):
    return _output.parse((DATA / f"{name}.txt").read_text())


def test_every_sample_records_its_source():
    assert len(SAMPLES) >= 10
    for name in SAMPLES:
        source = (DATA / f"{name}.source").read_text()
        assert source.startswith("url: https://github.com/"), name


# name: (rows, columns, has_root, first row, last row, out_of_bounds, avg, footer)
# where a row is (size, count, busbw_oop, busbw_ip, wrong_oop, wrong_ip)
EXPECTED = {
    "h100-a3mega-2node-new": (
        31,
        "new",
        True,
        (8, 2, 0.0, 0.0, 0, 0),
        (8589934592, 2147483648, 338.82, 337.35, 0, 0),
        0,
        70.742,
        True,
    ),
    "a100-sxm-8x-old-c0": (
        34,
        "old",
        False,
        (0, 0, 0.0, 0.0, None, None),
        (8589934592, 2147483648, 235.26, 235.03, None, None),
        0,
        68.4048,
        True,
    ),
    "h100nvl-2node-v2.18-bad": (
        11,
        "new",
        True,
        (500000, 125000, 3.97, 4.01, 0, 0),
        (1500000, 375000, 11.28, 11.33, 0, 0),
        0,
        7.20321,
        True,
    ),
    "2080ti-2x-pcie-nop2p": (
        28,
        "new",
        True,
        (8, 2, 0.0, 0.0, 0, 0),
        (1073741824, 268435456, 4.0, 4.0, 0, 0),
        0,
        2.05774,
        True,
    ),
    "p4de-2node-srun-nofooter": (
        29,
        "new",
        True,
        (8, 2, 0.0, 0.0, 0, 0),
        (2147483648, 536870912, 78.33, 78.33, 0, 0),
        None,
        None,
        False,
    ),
    "p5-2node-mpirun-prefix": (
        32,
        "new",
        True,
        (0, 0, 0.0, 0.0, 0, 0),
        (2147483648, 536870912, 437.79, 437.89, 0, 0),
        0,
        52.9753,
        True,
    ),
    "5090-2x-debug-crash": (0, "new", True, None, None, None, None, False),
    "dgx-h100-2node-wrong": (
        3,
        "new",
        True,
        (8, 2, 0.0, 0.0, 0, 0),
        (524288, 131072, 0.79, 0.92, 237858, 238038),
        None,
        None,
        False,
    ),
    "gh200-2node-v2.17-good": (
        25,
        "new",
        True,
        (8, 2, 0.0, 0.0, 0, 0),
        (134217728, 33554432, 122.57, 123.11, 0, 0),
        0,
        19.7866,
        True,
    ),
    "gh200-2node-v2.17-noofi": (
        25,
        "new",
        True,
        (8, 2, 0.0, 0.0, 0, 0),
        (134217728, 33554432, 5.43, 5.41, 0, 0),
        0,
        1.58767,
        True,
    ),
    "4090-6x-pcie-p2p-1size": (
        1,
        "new",
        True,
        (33554432, 8388608, 24.58, 24.50, 0, 0),
        (33554432, 8388608, 24.58, 24.50, 0, 0),
        0,
        24.5413,
        True,
    ),
}


def _brief(row):
    return (row["size"], row["count"], row["busbw_oop"], row["busbw_ip"], row["wrong_oop"], row["wrong_ip"])


def test_every_sample_has_expectations():
    assert set(EXPECTED) == set(SAMPLES)


@pytest.mark.parametrize("name", SAMPLES)
def test_rows_and_footers(name):
    nrows, columns, has_root, first, last, oob, avg, footer = EXPECTED[name]
    out = parsed(name)
    assert len(out["rows"]) == nrows
    assert out["columns"] == columns
    assert out["has_root"] is has_root
    if nrows:
        assert _brief(out["rows"][0]) == first
        assert _brief(out["rows"][-1]) == last
    assert out["out_of_bounds"] == oob
    assert out["avg_busbw_gbps"] == avg
    assert out["footer"] is footer
    sizes = [r["size"] for r in out["rows"]]
    assert sizes == sorted(sizes)


def test_full_row_of_the_new_format():
    row = parsed("h100-a3mega-2node-new")["rows"][28]
    assert row == {
        "size": 2147483648,
        "count": 536870912,
        "type": "float",
        "redop": "sum",
        "root": -1,
        "time_oop": 12646.0,
        "algbw_oop": 169.81,
        "busbw_oop": 318.40,
        "wrong_oop": 0,
        "time_ip": 12641.0,
        "algbw_ip": 169.88,
        "busbw_ip": 318.52,
        "wrong_ip": 0,
    }


def test_old_format_error_column_and_na():
    out = parsed("a100-sxm-8x-old-c0")
    row = out["rows"][-1]
    assert row["root"] is None and row["redop"] == "sum" and row["time_oop"] == 63896.0
    assert row["wrong_oop"] is None and row["error_oop"] is None  # N/A: -c 0
    assert out["params"]["validation"] == 0 and out["params"]["ngpus"] == 8
    assert out["noise_lines"] == 1  # the interleaved "NCCL INFO Launch mode Parallel"
    assert [d["name"] for d in out["devices"]] == ["A100-SXM4-40GB"] * 8


def test_old_format_error_floats_and_no_redop():
    text = """# nThread 1 nGpus 2 minBytes 8 maxBytes 16 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#                                                 out-of-place                    in-place
#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)             (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2   float    40.17    0.00    0.00  1e-07    62.08    0.00    0.00  0e+00
          16             4   float    32.28    0.00    0.00  3e-08    33.14    0.00    0.00  3e-08
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.0
"""
    out = _output.parse(text)
    assert out["columns"] == "old" and out["has_root"] is False
    assert out["rows"][0]["error_oop"] == 1e-07 and out["rows"][0]["redop"] is None
    assert out["rows"][1]["error_ip"] == 3e-08


def test_newest_format_and_loader_warnings():
    out = parsed("gh200-2node-v2.17-noofi")
    assert out["noise_lines"] == 8
    assert out["params"]["iters"] == 20 and out["params"]["warmup_iters"] == 1
    assert parsed("h100nvl-2node-v2.18-bad")["version"] == "2.18.3"
    assert parsed("h100nvl-2node-v2.18-bad")["params"]["step_type"] == "bytes"


def test_launcher_prefixes_are_stripped():
    assert _output.strip_prefix("[1,0]<stdout>:# Out of bounds values : 0 OK") == "# Out of bounds values : 0 OK"
    assert _output.strip_prefix(" 0:            8             2") == "           8             2"
    assert _output.strip_prefix("13: host:1:2 [5] NCCL INFO x") == "host:1:2 [5] NCCL INFO x"
    assert _output.strip_prefix("[0] h100:497888 NCCL INFO") == "h100:497888 NCCL INFO"
    row = "           8             2     float     sum      -1    42.56    0.00    0.00      0"
    assert _output.strip_prefix(row) == row


def test_crash_lines_are_kept():
    out = parsed("5090-2x-debug-crash")
    assert out["header_found"] and not out["rows"]
    assert out["failures"][0].startswith("GENOA-06: Test NCCL failure common.cu:392")


def test_a_garbled_row_is_noise_not_data():
    text = (DATA / "h100nvl-2node-v2.18-bad.txt").read_text()
    text = text.replace("     1100000", "[0]     75.38    0.05    0.10      0\n     1100000", 1)
    out = _output.parse(text)
    assert len(out["rows"]) == 11 and out["noise_lines"] == 1


# name: (verdict kind at the threshold, judged busbw, threshold)
VERDICTS = {
    "h100-a3mega-2node-new": ("ok", 330.51, 300.0),
    "a100-sxm-8x-old-c0": ("ok", 234.37, 228.0),  # Azure's 8x A100 floor
    "h100nvl-2node-v2.18-bad": ("low_bandwidth", 10.93, 20.0),
    "2080ti-2x-pcie-nop2p": ("low_bandwidth", 4.0, 11.3),  # Gen3 x16 P2P: 15.75 x 0.8 x 0.9
    "p4de-2node-srun-nofooter": ("truncated", 76.79, 50.0),
    "p5-2node-mpirun-prefix": ("ok", 313.29, 300.0),
    "5090-2x-debug-crash": ("no_rows", None, 40.0),
    "dgx-h100-2node-wrong": ("wrong", 0.79, 1.0),
    "gh200-2node-v2.17-good": ("ok", 107.69, 100.0),
    "gh200-2node-v2.17-noofi": ("low_bandwidth", 5.41, 100.0),
    "4090-6x-pcie-p2p-1size": ("ok", 24.50, 22.12),  # the 4x L40S field report's bar for PCIe Gen4
}


@pytest.mark.parametrize("name", SAMPLES)
def test_verdict(name):
    kind, judged, threshold = VERDICTS[name]
    verdict = _judge.judge(parsed(name), threshold, judge_sizes=2)
    assert verdict["kind"] == kind
    assert verdict["passed"] is (kind == "ok")
    assert verdict["judged_busbw_gbps"] == judged
    assert verdict["reason"]


def test_at_least_two_real_samples_fail_and_both_transports_are_covered():
    failing = [n for n, (kind, _, _) in VERDICTS.items() if kind != "ok"]
    assert len(failing) >= 2
    assert {"2080ti-2x-pcie-nop2p", "5090-2x-debug-crash", "4090-6x-pcie-p2p-1size"} <= set(SAMPLES)  # PCIe
    assert {"h100-a3mega-2node-new", "a100-sxm-8x-old-c0"} <= set(SAMPLES)  # NVLink


def test_judged_on_the_largest_sizes_not_the_average():
    out = parsed("gh200-2node-v2.17-good")
    verdict = _judge.judge(out, 100.0, judge_sizes=2)
    assert out["avg_busbw_gbps"] < 20 and verdict["passed"]
    assert [r["size"] for r in verdict["judged_rows"]] == [67108864, 134217728]
    # One size: the best of the two largest; more sizes: the lowest of them all.
    assert _judge.judge(out, 100.0, judge_sizes=1)["judged_busbw_gbps"] == 122.57
    assert _judge.judge(out, 100.0, judge_sizes=3)["judged_busbw_gbps"] == 85.52


def test_low_bandwidth_reason_gives_measured_expected_and_cause():
    verdict = _judge.judge(
        parsed("2080ti-2x-pcie-nop2p"),
        22.12,
        expected_gbps=24.58,
        causes=["peer-to-peer reads not OK between GPU0-GPU1 NS: ACS redirect"],
    )
    assert verdict["reason"] == (
        "bus bandwidth 4.00 GB/s at sizes [536870912, 1073741824] B is under the threshold 22.12 GB/s "
        "(a healthy node of this design reaches 24.58); likely cause: peer-to-peer reads not OK between "
        "GPU0-GPU1 NS: ACS redirect"
    )


def _footer_failed():
    text = (DATA / "gh200-2node-v2.17-good.txt").read_text()
    return text.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 3 FAILED")


def test_fail_closed_out_of_bounds_footer():
    verdict = _judge.judge(_output.parse(_footer_failed()), 100.0)
    assert verdict["kind"] == "out_of_bounds" and not verdict["passed"]
    assert "'# Out of bounds values : 3 FAILED'" in verdict["reason"]


def test_fail_closed_nonzero_exit_even_with_a_clean_table():
    verdict = _judge.judge(parsed("gh200-2node-v2.17-good"), 100.0, rc=1)
    assert verdict["kind"] == "exit" and "exited with status 1" in verdict["reason"]


def test_fail_closed_timeout():
    verdict = _judge.judge(parsed("p4de-2node-srun-nofooter"), 50.0, timed_out=True, timeout=600)
    assert verdict["kind"] == "timeout"
    assert verdict["reason"].startswith("all_reduce_perf did not finish within 600 s and its process group was killed")


def test_fail_closed_no_header_at_all():
    verdict = _judge.judge(_output.parse("Segmentation fault (core dumped)\n"), 10.0, rc=0)
    assert verdict["kind"] == "no_rows" and "(and no column header)" in verdict["reason"]


def test_wrong_results_beat_a_fast_table():
    verdict = _judge.judge(parsed("dgx-h100-2node-wrong"), 0.1)
    assert verdict["kind"] == "wrong"
    assert "#wrong 237858 out-of-place and 238038 in-place at 524288 B" in verdict["reason"]


@pytest.mark.parametrize(
    "text,size",
    [
        ("8", 8),
        ("128K", 131072),
        ("512M", 536870912),
        ("8G", 8589934592),
        ("4g", 4294967296),
        (" 64M ", 67108864),
        (1024, 1024),
    ],
)
def test_parse_size(text, size):
    assert _command.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "1.5G", "8X", "-1", "G"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        _command.parse_size(text)


def test_build_argv():
    assert _command.build_argv("/opt/all_reduce_perf", "256M", "4G", 2, 4, 20, 5, True) == [
        "/opt/all_reduce_perf",
        "-b",
        "268435456",
        "-e",
        "4294967296",
        "-f",
        "2",
        "-g",
        "4",
        "-n",
        "20",
        "-w",
        "5",
        "-c",
        "1",
    ]
    assert _command.build_argv("x", 8, 16, 2, 2, 1, 0, False)[-2:] == ["-c", "0"]


# --- numbers nobody measured (a gate never passes on numbers it did not measure) ------------------


def with_cell(name, size, column, value, text=None):
    """A sample's text with one cell of the row of ``size`` replaced: columns 5-8 are out-of-place
    time/algbw/busbw/#wrong, 9-12 in-place (new format, with redop and root)."""
    lines = (text if text is not None else (DATA / f"{name}.txt").read_text()).splitlines()
    for index, line in enumerate(lines):
        tokens = line.split()
        if tokens and tokens[0] == str(size):
            tokens[column] = value
            lines[index] = "  ".join(tokens)
            return "\n".join(lines) + "\n"
    raise AssertionError(f"no row of size {size} in {name}")


GOOD, LARGEST = "gh200-2node-v2.17-good", 134217728


@pytest.mark.parametrize(
    "column,value",
    [
        (11, "nan"),
        (11, "-nan"),
        (11, "NaN"),
        (11, "inf"),
        (11, "-inf"),  # in-place busbw, the example
        (7, "nan"),
        (7, "inf"),  # out-of-place busbw
        (6, "nan"),
        (10, "inf"),
        (5, "nan"),
        (9, "-nan"),  # algbw and time: the busbw derives from them
    ],
)
def test_non_finite_busbw_fails(column, value):
    out = _output.parse(with_cell(GOOD, LARGEST, column, value))
    assert len(out["rows"]) == 25, "the row is read, not dropped as noise"
    verdict = _judge.judge(out, 100.0, judge_sizes=2)
    assert verdict["passed"] is False and verdict["kind"] == "non_finite", verdict
    assert f"at {LARGEST} B" in verdict["reason"] and "not finite" in verdict["reason"]
    assert verdict["judged_busbw_gbps"] is None or verdict["judged_busbw_gbps"] == 107.69


@pytest.mark.parametrize("size", [8, 1048576, 67108864])
def test_non_finite_busbw_fails_at_any_size(size):
    """A NaN below the judged sizes is still a figure the run did not measure."""
    verdict = _judge.judge(_output.parse(with_cell(GOOD, size, 11, "nan")), 100.0, judge_sizes=2)
    assert verdict["kind"] == "non_finite" and f"at {size} B" in verdict["reason"]


@pytest.mark.parametrize("avg", ["nan", "-nan", "inf", "NaN", "-"])
def test_non_finite_busbw_fails_in_the_average_footer(avg):
    text = (
        (DATA / f"{GOOD}.txt")
        .read_text()
        .replace("# Avg bus bandwidth    : 19.7866", f"# Avg bus bandwidth    : {avg}")
    )
    out = _output.parse(text)
    assert out["footer"] and not math.isfinite(out["avg_busbw_gbps"])
    verdict = _judge.judge(out, 100.0)
    assert verdict["kind"] == "non_finite" and "Avg bus bandwidth" in verdict["reason"]


def test_non_finite_busbw_fails_in_the_old_error_column():
    text = """# nThread 1 nGpus 2 minBytes 8 maxBytes 16 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error
           8             2   float    40.17    0.00    0.00    nan    62.08    0.00    0.00  0e+00
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.0
"""
    verdict = _judge.judge(_output.parse(text), 0.0001)
    assert verdict["kind"] == "non_finite" and "error_oop nan at 8 B" in verdict["reason"]


@pytest.mark.parametrize("threshold", [float("nan"), float("inf"), float("-inf"), 0, 0.0, -1, -22.0, None, "22", True])
def test_non_finite_threshold_refused(threshold):
    with pytest.raises(ValueError, match="threshold must be a finite number of GB/s above 0"):
        _judge.judge(parsed(GOOD), threshold)


@pytest.mark.parametrize("columns", [(8, 12), (12,), (8,)])
def test_wrong_na_with_check_fails(columns):
    text = None
    for column in columns:
        text = with_cell(GOOD, LARGEST, column, "N/A", text)
    out = _output.parse(text)
    assert out["params"]["validation"] == 1
    for check in (True, None):  # asked by the module, or as the run's own header says
        verdict = _judge.judge(out, 100.0, check=check)
        assert verdict["passed"] is False and verdict["kind"] == "unvalidated", verdict
        assert "reads N/A" in verdict["reason"] and f"first {LARGEST} B" in verdict["reason"]
    assert _judge.judge(out, 100.0, check=False)["kind"] == "ok"  # -c 0: only the bandwidth is judged


def test_wrong_na_with_check_fails_in_the_old_format():
    out = parsed("a100-sxm-8x-old-c0")  # a -c 0 run: every error cell reads N/A
    assert _judge.judge(out, 228.0)["kind"] == "ok"
    verdict = _judge.judge(out, 228.0, check=True)
    assert verdict["kind"] == "unvalidated" and "the error column reads N/A at 34 size(s)" in verdict["reason"]


def test_json_safe_replaces_non_finite_figures():
    rows = _output.parse(with_cell(GOOD, LARGEST, 11, "nan"))["rows"]
    safe = _judge.json_safe(rows)
    assert safe[-1]["busbw_ip"] is None and safe[-1]["busbw_oop"] == 122.57 and safe[0] == rows[0]
