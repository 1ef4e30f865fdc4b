# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet.node.drift_report: the drift check's judgement and report files, written in the
controller's process (no module run): unreached hosts, out of service is not drift, the table's
columns, the metrics, and a record without this run's token refused."""

from __future__ import annotations

import json

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.gpufleet.node.plugins.action.drift_report import judge, prometheus, report, start, table

ACS = {"kind": "changed", "role": "pcie_p2p", "task": "Clear ACS redirect", "detail": "changed_ports: 0000:02:08.0"}
GATE = {"kind": "out_of_service", "role": "nccl_gate", "task": "Gate", "detail": "the gate failed in this boot"}


def test_judges_every_targeted_host_and_only_those():
    nodes, drifted = judge(
        {"node1": [], "node2": [ACS], "node3": [GATE], "other": [ACS]}, ["node1", "node2", "node3", "node4"]
    )
    assert list(nodes) == ["node1", "node2", "node3", "node4"]
    assert nodes["node4"] == [{"kind": "unreachable", "role": "", "task": "-", "detail": "no result from the node"}]
    assert drifted == ["node2", "node4"]


def test_table_and_metrics():
    nodes, drifted = judge(
        {"node1": [], "node2": [dict(ACS, detail="x" * 80)], "node3": [GATE]}, ["node1", "node2", "node3"]
    )
    lines = table(nodes).splitlines()
    assert lines[0].split() == ["node", "state", "concern", "task", "detail"]
    assert lines[1].split() == ["node1", "clean", "-", "-", "-"]
    assert lines[2].startswith("node2  changed         pcie_p2p   Clear ACS redirect") and lines[2].endswith(
        "x" * 67 + "..."
    )
    assert lines[3].split()[:3] == ["node3", "out_of_service", "nccl_gate"]
    prom = prometheus(nodes, drifted, 1700000000)
    assert 'gpufleet_drift_items{node="node2"} 1\n' in prom and 'gpufleet_drift_items{node="node3"} 0\n' in prom
    assert 'gpufleet_drift_detected{node="node2"} 1\n' in prom and 'gpufleet_drift_detected{node="node3"} 0\n' in prom
    assert (
        'gpufleet_node_out_of_service{node="node3"} 1\n' in prom
        and 'gpufleet_node_out_of_service{node="node1"} 0\n' in prom
    )
    assert prom.endswith("gpufleet_drift_last_run_timestamp_seconds 1700000000\n")


def test_report_writes_the_files_and_ends_the_run(tmp_path):
    token = start(str(tmp_path))
    (tmp_path / "record.json").write_text(json.dumps({"token": token, "hosts": {"node1": [], "node3": [GATE]}}))
    metrics = tmp_path / "textfile" / "drift.prom"
    nodes, drifted, text = report(str(tmp_path), ["node1", "node3"], str(metrics), now=1700000000)
    assert drifted == [] and "out_of_service" in text
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc == {"timestamp": 1700000000, "drifted": [], "out_of_service": ["node3"], "nodes": nodes}
    assert (tmp_path / "report.txt").read_text() == text
    assert 'gpufleet_node_out_of_service{node="node3"} 1' in metrics.read_text()
    assert not (tmp_path / "token").exists()


@pytest.mark.parametrize("record", [None, {"token": "stale", "hosts": {}}])
def test_a_record_not_from_this_run_is_refused(tmp_path, record):
    start(str(tmp_path))
    if record is not None:
        (tmp_path / "record.json").write_text(json.dumps(record))
    with pytest.raises(AnsibleActionFail, match="No drift record from this run"):
        report(str(tmp_path), ["node1"])
    assert not (tmp_path / "report.json").exists()


def test_callback_names_each_changed_file_of_a_files_task():
    from ansible_collections.gpufleet.node.plugins.callback.drift import _changed_dests

    res = {"changed": True, "changed_dests": ["/etc/a", "/etc/b"], "results": [{}, {}]}
    assert _changed_dests(res, {}) == ["/etc/a", "/etc/b"]
    # a no_log task: its result is censored, its arguments name the files
    censored = {"changed": True, "censored": "the output has been hidden"}
    assert _changed_dests(censored, {"files": [{"dest": "/etc/vllm/secrets.env"}]}) == ["/etc/vllm/secrets.env"]
    assert _changed_dests(censored, {"files": [{"dest": "{{ x }}"}]}) is None
    assert _changed_dests({"changed": True, "dest": "/etc/x"}, {"dest": "/etc/x"}) is None
