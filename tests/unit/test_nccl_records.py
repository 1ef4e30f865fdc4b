# SPDX-License-Identifier: GPL-3.0-or-later
"""The NCCL gate's records (plugins/module_utils/nccl/_readiness.gate_records): the full result and
the readiness marker, built once beside the rule that reads the marker, from the module's result
(the run of tests/data/nccl outputs through _gate) or a failed task's; their fields are the ones
docs/gate.md lists; and the filter the role uses when the module could not build them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.filter.nccl_gate import nccl_gate_records
from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _gate, _readiness
from tests.unit.test_nccl_gate_run import GOOD, LOW, gate, params

REPO = Path(__file__).resolve().parents[2]
GATE_DOC = REPO / "docs" / "gate.md"
RECORD = dict(
    boot_id="3f1c2b9e-5a7d-4c1e-9b2a-0d6e8f4a1c33",
    result_path="/var/lib/gpufleet/nccl-gate.json",
    serving_backend="vllm",
    serving_backend_reason="4 identical GPUs (46068 MiB): vLLM with tensor parallelism",
)


def passed_marker(record, result):
    """The marker of the pass of tests/data/nccl/gh200-2node-v2.17-good.txt (107.69 GB/s judged
    against a fixed 100 GB/s) for `record`, with the result's own timestamp and reason."""
    return {
        "boot_id": record["boot_id"],
        "passed": True,
        "kind": "ok",
        "judged_busbw_gbps": 107.69,
        "threshold_gbps": 100.0,
        "design_key": None,
        "rule": "fixed",
        "timestamp": result["timestamp"],
        "reason": result["reason"],
        "serving_backend": record["serving_backend"],
        "serving_backend_reason": record["serving_backend_reason"],
        "result_path": record["result_path"],
    }


def documented_fields(heading):
    """The backquoted names in the first column of the table after ``heading`` in docs/gate.md."""
    lines = GATE_DOC.read_text().splitlines()
    start = lines.index(heading) + 1
    fields = []
    for line in lines[start:]:
        if fields and not line.startswith("|"):
            break
        if line.startswith("| ") and not line.startswith("| field "):
            fields.extend(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    return fields


def test_the_builders_fields_are_the_documented_ones():
    marker = documented_fields("The marker's fields:")
    full = documented_fields("The full result's fields:")
    assert len(marker) == len(set(marker)) and len(full) == len(set(full))
    assert set(marker) == set(_readiness.MARKER_FIELDS)
    assert set(full) == set(_readiness.RESULT_FIELDS)
    built_full, built_marker = _readiness.gate_records({}, "node1", **RECORD)
    assert set(built_marker) == set(marker) and set(built_full) == set(full)


def test_the_documented_judging_defaults_are_the_rules():
    text = GATE_DOC.read_text()
    floor = re.search(r"^\| physics floor \|.*\| ([0-9.]+) \|$", text, re.M)
    peers = re.search(r"^\| `nccl_gate_baseline_fraction` \|.*\| ([0-9.]+) \|$", text, re.M)
    assert float(floor.group(1)) == _gate._threshold.DEFAULT_THRESHOLD_FRACTION
    assert float(peers.group(1)) == _gate._threshold.DEFAULT_FRACTION


def test_unset_fractions_are_the_rules_defaults():
    p = params(threshold_fraction=None, baseline_fraction=None)
    assert _gate.with_rule_defaults(p)["threshold_fraction"] == _gate._threshold.DEFAULT_THRESHOLD_FRACTION
    assert _gate.with_rule_defaults(p)["baseline_fraction"] == _gate._threshold.DEFAULT_FRACTION
    assert _gate.with_rule_defaults(params(threshold_fraction=0.5))["threshold_fraction"] == 0.5
    assert p["threshold_fraction"] is None, "the caller's parameters are left as they are"


def test_a_measured_pass_becomes_both_records():
    result, _stdout, _message, _calls = gate(params(repeats=3), LOW, GOOD)
    full, marker = _readiness.gate_records(result, "node1", **RECORD)
    assert marker == passed_marker(RECORD, result)
    assert marker["serving_backend"] == "vllm" and marker["result_path"] == "/var/lib/gpufleet/nccl-gate.json"
    assert full["host"] == "node1" and full["boot_id"] == RECORD["boot_id"]
    assert {k: v for k, v in full.items() if k not in ("host", "boot_id")} == {
        k: result[k] for k in _readiness.RESULT_FIELDS if k not in ("host", "boot_id")
    }
    assert [r["kind"] for r in full["runs"]] == ["low_bandwidth", "ok"] and full["rc"] == 0


def test_a_failed_gate_keeps_its_verdict_and_reason():
    result, _stdout, message, _calls = gate(params(repeats=2), LOW, LOW)
    full, marker = _readiness.gate_records(dict(result, msg=message, failed=True), "node1", **RECORD)
    assert marker["passed"] is False and marker["kind"] == "low_bandwidth"
    assert marker["reason"] == result["reason"] != message and marker["judged_busbw_gbps"] == 5.41
    assert "msg" not in full and "failed" not in full


def test_a_task_that_failed_without_a_verdict_records_kind_error_and_its_message():
    full, marker = _readiness.gate_records({"msg": "MODULE FAILURE", "failed": True, "rc": 1}, "node1", **RECORD)
    assert marker["kind"] == "error" and marker["passed"] is False and marker["reason"] == "MODULE FAILURE"
    assert marker["judged_busbw_gbps"] is None and marker["threshold_gbps"] is None and marker["rule"] is None
    assert full["rows"] == [] and full["runs"] == [] and full["cmd"] == [] and full["rc"] == 1
    assert full["duration_s"] is None and full["model"] is None
    assert _readiness.gate_records({}, None)[1]["reason"] == "the gate did not run"


@pytest.mark.parametrize("passed", [None, "true", 1, "yes"])
def test_only_a_json_true_passes(passed):
    result, _stdout, _message, _calls = gate(params(), GOOD)
    full, marker = _readiness.gate_records(dict(result, passed=passed), "node1", **RECORD)
    assert full["passed"] is False and marker["passed"] is False


def test_check_mode_records_say_nothing_was_measured():
    plan = _gate.prepare(params(), print)
    full, marker = _readiness.gate_records(_gate.check_mode(_gate.planned_result(plan, ["x"])), "n", **RECORD)
    assert marker["kind"] == "check_mode" and marker["passed"] is False and full["cmd"] == ["x"]


def test_without_the_callers_part_the_marker_carries_nulls():
    _full, marker = _readiness.gate_records({"kind": "ok", "passed": True}, None)
    assert marker["boot_id"] is None and marker["serving_backend"] is None and marker["result_path"] is None
    # a marker without the current boot id never lets the node take traffic
    assert _readiness.marker_reasons(marker, None, "b", "/run/m")


def test_the_filter_keeps_the_modules_records_and_builds_missing_ones():
    result, _stdout, _message, _calls = gate(params(), GOOD)
    full, marker = _readiness.gate_records(result, "node1", **RECORD)
    returned = dict(result, verdict=full, marker=marker)
    assert nccl_gate_records(returned, "other", {}) == returned
    built = nccl_gate_records({"msg": "one of the following is required: gpus, topology"}, "node1", RECORD)
    assert built["marker"]["kind"] == "error" and built["verdict"]["host"] == "node1"
    assert built["marker"]["reason"] == "one of the following is required: gpus, topology"
    assert built["msg"] == "one of the following is required: gpus, topology"


@pytest.mark.parametrize(
    "result,record,error",
    [
        ("failed", RECORD, "the task result must be a dict"),
        ({"msg": "x"}, {"boot": "b"}, "record must be a dict of boot_id, result_path"),
        ({"msg": "x"}, None, "record must be a dict of"),
    ],
)
def test_the_filter_refuses_what_it_cannot_build_from(result, record, error):
    with pytest.raises(AnsibleFilterError, match=error):
        nccl_gate_records(result, "node1", record)
