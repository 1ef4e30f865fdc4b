# SPDX-License-Identifier: GPL-3.0-or-later
"""The records the nccl_gate role writes, as the nccl_allreduce module returns them (JSON
arguments in, JSON out): the full result and the readiness marker, built by the module on a pass,
on a failed gate and when the gate could not run, against fake binaries that replay real outputs
(tests/data/nccl)."""

from __future__ import annotations

import pytest

from tests.integration.test_nccl_module import replay, run_module
from tests.unit.test_nccl_records import passed_marker

RECORD = {
    "boot_id": "3f1c2b9e-5a7d-4c1e-9b2a-0d6e8f4a1c33",
    "result_path": "/var/lib/gpufleet/nccl-gate.json",
    "serving_backend": "llamacpp",
    "serving_backend_reason": "1 GPU (46068 MiB): llama.cpp with 74 of 81 layers on the GPU",
}


def test_the_records_come_back_ready_to_write(tmp_path):
    binary = replay(tmp_path, "gh200-2node-v2.17-good")
    res = run_module({"binary": binary, "min_busbw_gbps": "100", "gpus": 8, "host": "node1", "record": RECORD})
    assert res["passed"] is True
    assert res["marker"] == passed_marker(RECORD, res)
    assert res["marker"]["serving_backend"] == "llamacpp"
    verdict = res["verdict"]
    assert verdict["host"] == "node1" and verdict["boot_id"] == RECORD["boot_id"]
    assert verdict["rows"] == res["rows"] and verdict["cmd"] == res["cmd"] and verdict["rc"] == 0
    assert "serving_backend" not in verdict and "result_path" not in verdict


def test_a_failed_gate_returns_its_records(tmp_path):
    binary = replay(tmp_path, "gh200-2node-v2.17-noofi")
    res = run_module({"binary": binary, "min_busbw_gbps": "100", "gpus": 8, "host": "node1", "record": RECORD})
    assert res["failed"] and res["marker"]["passed"] is False and res["marker"]["kind"] == "low_bandwidth"
    assert res["marker"]["reason"] == res["reason"] and res["verdict"]["judged_busbw_gbps"] == 5.41


@pytest.mark.parametrize(
    "args,message",
    [
        ({"binary": "no_such_all_reduce_perf"}, 'Failed to find required executable "no_such_all_reduce_perf"'),
        ({"binary": "/nonexistent/all_reduce_perf"}, "/nonexistent/all_reduce_perf is not an executable file"),
        ({"min_bytes": "1G", "max_bytes": "1M"}, "min_bytes (1G) is larger than max_bytes (1M)"),
    ],
)
def test_a_gate_that_cannot_run_records_kind_error_with_its_message(args, message):
    res = run_module(dict({"min_busbw_gbps": "22", "gpus": 2, "host": "node1", "record": RECORD}, **args))
    assert res["failed"] and message in res["msg"]
    assert res["marker"]["kind"] == "error" and res["marker"]["passed"] is False
    assert res["marker"]["reason"] == res["msg"] and res["marker"]["boot_id"] == RECORD["boot_id"]
    assert res["verdict"]["rows"] == [] and res["verdict"]["host"] == "node1"
