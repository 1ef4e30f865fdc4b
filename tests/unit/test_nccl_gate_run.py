# SPDX-License-Identifier: GPL-3.0-or-later
"""The NCCL gate's run (plugins/module_utils/nccl/_gate.py), without a module: the checks before
anything runs, the repeats (stop at the first pass, keep the best figure, never retry past a
correctness or completeness failure) and the result, on real outputs (tests/data/nccl)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _gate

DATA = Path(__file__).resolve().parent.parent / "data" / "nccl"
LOW = (DATA / "gh200-2node-v2.17-noofi.txt").read_text()  # 5.41 GB/s judged
GOOD = (DATA / "gh200-2node-v2.17-good.txt").read_text()  # 107.69 GB/s judged
WRONG = (DATA / "dgx-h100-2node-wrong.txt").read_text()  # #wrong above 0


def params(**kw):
    p = dict(
        topology=None,
        binary="all_reduce_perf",
        min_busbw_gbps="100",
        threshold_fraction=0.85,
        baselines={},
        baseline_fraction=0.96,
        baseline_min_samples=5,
        baseline_window=50,
        host=None,
        sysfs_path=None,
        gpus=2,
        min_bytes="256M",
        max_bytes="4G",
        warmup_iters=5,
        check=True,
        environment={},
        **_gate.COUNTS,
    )
    p.update(kw)
    return p


def runs(*outputs):
    """A fake all_reduce_perf: each call prints the next output; the calls are recorded."""
    calls = []

    def run(argv, environment, timeout):
        calls.append((argv, environment, timeout))
        return 0, outputs[len(calls) - 1], False, 1.5

    return run, calls


def gate(p, *outputs):
    plan = _gate.prepare(p, warnings.append)
    argv = ["all_reduce_perf", "-b", "1"]
    run, calls = runs(*outputs)
    result, stdout, message = _gate.measure(plan, argv, _gate.planned_result(plan, argv), p, run=run)
    return result, stdout, message, calls


warnings = []


def test_repeats_stop_at_the_first_pass():
    result, stdout, message, calls = gate(params(repeats=3), LOW, GOOD, LOW)
    assert len(calls) == 2 and stdout == GOOD and message is None
    assert [r["kind"] for r in result["runs"]] == ["low_bandwidth", "ok"]
    assert result["passed"] is True and result["judged_busbw_gbps"] == 107.69
    assert result["duration_s"] == 3.0 and result["rc"] == 0 and result["threshold_gbps"] == 100.0


def test_the_best_low_run_is_kept_and_the_task_fails():
    result, _stdout, message, calls = gate(params(repeats=2), LOW, LOW)
    assert len(calls) == 2 and result["passed"] is False and result["kind"] == "low_bandwidth"
    assert message.startswith("NCCL all-reduce gate failed on all_reduce_perf -b 1: bus bandwidth 5.41 GB/s")


def test_a_wrong_result_is_never_retried():
    result, stdout, message, calls = gate(params(repeats=3), WRONG, GOOD)
    assert len(calls) == 1 and stdout == WRONG and result["kind"] == "wrong" and message


@pytest.mark.parametrize(
    "change,error",
    [
        ({"baseline_window": 0}, "baseline_min_samples and baseline_window must be at least 1"),
        ({"repeats": 0}, "repeats must be at least 1, got 0"),
        ({"min_bytes": "8X"}, "min_bytes/max_bytes: "),
        ({"min_bytes": "8G"}, "min_bytes (8G) is larger than max_bytes (4G)"),
        ({"gpus": 0}, "no GPUs to test"),
        ({"min_busbw_gbps": "nan"}, "a NaN or infinite threshold can never be judged"),
        ({"min_busbw_gbps": "-1"}, "min_busbw_gbps must be positive"),
        ({"min_busbw_gbps": "fast"}, "min_busbw_gbps must be a number of GB/s or 'auto'"),
        ({"min_busbw_gbps": "auto", "topology": {}}, "cannot derive the auto threshold from the topology facts"),
    ],
)
def test_nothing_runs_when_the_options_are_refused(change, error):
    with pytest.raises(_gate.GateError) as refused:
        _gate.prepare(params(**change), warnings.append)
    assert error in str(refused.value)


def test_check_mode_says_nothing_was_run():
    plan = _gate.prepare(params(), warnings.append)
    result = _gate.check_mode(_gate.planned_result(plan, ["x"]))
    assert result["kind"] == "check_mode" and result["passed"] is None and result["rule"] == "fixed"
    assert result["runs"] == [] and result["cmd"] == ["x"]


def test_visible_devices_by_index_or_uuid():
    topology = {"gpus": [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}]}
    assert _gate.visible_devices({"CUDA_VISIBLE_DEVICES": "GPU-b, 0"}, topology) == [1, 0]
    assert _gate.visible_devices({"CUDA_VISIBLE_DEVICES": "MIG-x"}, topology) is None
    assert _gate.visible_devices({}, topology) is None
