# SPDX-License-Identifier: GPL-3.0-or-later
"""The node's HAProxy agent with --budgeted (the pool has a decider): a budgeted fault of a node
that still serves is held (`up #hold-WORD`) for the decider, anything else leaves at once."""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.test_lb_agent import BOOT, run_agent

BUDGETED = ["--budgeted", "gpu-health-failed", "gate-failed"]


def agent(tmp_path, marker, health=None, probe=None, budgeted=True, request=None):
    """(line, journal) of the agent for these records."""
    (tmp_path / "boot_id").write_text(BOOT + "\n")
    marker_path = tmp_path / "nccl-gate.json"
    if marker is not None:
        marker_path.write_text(json.dumps(marker))
    if health is not None:  # beside the marker, where the agent looks for it
        (tmp_path / "gpu-health.json").write_text(json.dumps(health))
    args = ["--marker", str(marker_path), "--boot-id", str(tmp_path / "boot_id")]
    if probe is not None:
        (tmp_path / "probe.json").write_text(json.dumps(probe))
        args += ["--probe", str(tmp_path / "probe.json"), "--probe-interval", "5", "--probe-timeout", "10"]
    if request is not None:
        (tmp_path / "request.json").write_text(json.dumps(request))
        args += ["--request", str(tmp_path / "request.json")]
    if budgeted:
        args += BUDGETED
    proc = run_agent(tmp_path, *args)
    assert proc.stdout.count("\n") == 1, proc.stdout
    return proc.stdout.rstrip("\n"), proc.stderr


PASSED = {"boot_id": BOOT, "passed": True}
GATE_FAILED = {"boot_id": BOOT, "passed": False, "reason": "bus bandwidth 11.5 GB/s under 22.1"}
HEALTH_FAILED = {"boot_id": BOOT, "passed": False, "source": "gpu-health-watch", "reason": "XID 79 on 0000:3b:00.0"}


def probe(verdict, age=0.0):
    return {"boot_id": BOOT, "time": time.time() - age, "verdict": verdict, "reason": "test", "interval_s": 5}


def test_the_health_verdict_path_is_beside_the_marker(tmp_path):
    """The test writes the verdict where the agent reads it (the readiness rule's health_path_for)."""
    from ansible_collections.gpufleet.node.plugins.module_utils.nccl._readiness import health_path_for

    assert health_path_for(str(tmp_path / "nccl-gate.json")) == str(tmp_path / "gpu-health.json")


@pytest.mark.parametrize(
    "marker, health, probed, line",
    [
        (PASSED, HEALTH_FAILED, "serving", "up #hold-gpu-health-failed"),
        (GATE_FAILED, None, "serving", "up #hold-gate-failed"),
        (PASSED, HEALTH_FAILED, "busy", "up #hold-gpu-health-failed"),  # slow but generating: serves
        (PASSED, HEALTH_FAILED, None, "up #hold-gpu-health-failed"),  # no prober: the health check judges
        (GATE_FAILED, HEALTH_FAILED, "serving", "up #hold-gpu-health-failed"),  # both budgeted
        # a node that cannot serve leaves at once, whatever the budget
        (PASSED, HEALTH_FAILED, "wedged", "down #gpu-health-failed"),
        (PASSED, HEALTH_FAILED, "down", "down #gpu-health-failed"),
        (PASSED, None, "wedged", "down #engine-wedged"),
        # a marker not of this boot (or none) is no budgeted word
        (None, HEALTH_FAILED, "serving", "down #gpu-health-failed"),
        ({"boot_id": "old", "passed": True}, None, "serving", "down #stale-marker"),
        (None, None, "serving", "down #no-marker"),
        (PASSED, None, "serving", "up"),
    ],
)
def test_budgeted_answers(tmp_path, marker, health, probed, line):
    got, journal = agent(tmp_path, marker, health, probe(probed) if probed else None)
    assert got == line, journal
    if got.startswith("up #hold"):
        assert "held in rotation for the pool's decider" in journal, journal


def test_a_stale_probe_record_is_not_held(tmp_path):
    got, _journal = agent(tmp_path, PASSED, HEALTH_FAILED, probe("serving", age=3600))
    assert got == "down #gpu-health-failed"


def test_without_budgeted_the_node_decides_alone(tmp_path):
    got, _journal = agent(tmp_path, PASSED, HEALTH_FAILED, probe("serving"), budgeted=False)
    assert got == "down #gpu-health-failed"


def test_only_the_words_given_are_held(tmp_path):
    (tmp_path / "boot_id").write_text(BOOT + "\n")
    (tmp_path / "nccl-gate.json").write_text(json.dumps(GATE_FAILED))
    proc = run_agent(
        tmp_path,
        "--marker",
        str(tmp_path / "nccl-gate.json"),
        "--boot-id",
        str(tmp_path / "boot_id"),
        "--budgeted",
        "gpu-health-failed",
    )
    assert proc.stdout == "down #gate-failed\n"


def test_a_node_request_goes_with_a_hold(tmp_path):
    got, _journal = agent(
        tmp_path, PASSED, HEALTH_FAILED, probe("serving"), request={"state": "drain", "reason": "recycle"}
    )
    assert got == "drain up #hold-gpu-health-failed"


RECYCLE = {"state": "drain", "reason": "recycle"}


@pytest.mark.parametrize(
    "marker, health, probed, asked, line",
    [
        # worker_recycle's drain, budgeted: the decider's to make, within the budget
        (PASSED, None, "serving", RECYCLE, "up #hold-recycle"),
        (PASSED, HEALTH_FAILED, "serving", RECYCLE, "up #hold-gpu-health-failed"),
        # the node cannot serve: it leaves at once, its own drain said as before
        (PASSED, None, "wedged", RECYCLE, "drain down #engine-wedged"),
        (None, None, "serving", RECYCLE, "drain down #no-marker"),
        # a drain of another reason is not the decider's
        (PASSED, None, "serving", {"state": "drain", "reason": "operator"}, "drain up #operator"),
        (PASSED, None, "serving", {"state": "maint", "reason": "recycle"}, "maint up #recycle"),
    ],
)
def test_the_nodes_own_recycle_drain_is_budgeted(tmp_path, marker, health, probed, asked, line):
    (tmp_path / "boot_id").write_text(BOOT + "\n")
    args = ["--marker", str(tmp_path / "nccl-gate.json"), "--boot-id", str(tmp_path / "boot_id")]
    if marker is not None:
        (tmp_path / "nccl-gate.json").write_text(json.dumps(marker))
    if health is not None:
        (tmp_path / "gpu-health.json").write_text(json.dumps(health))
    (tmp_path / "probe.json").write_text(json.dumps(probe(probed)))
    (tmp_path / "request.json").write_text(json.dumps(asked))
    args += ["--probe", str(tmp_path / "probe.json"), "--probe-interval", "5", "--probe-timeout", "10"]
    args += ["--request", str(tmp_path / "request.json"), *BUDGETED, "recycle"]
    assert run_agent(tmp_path, *args).stdout == line + "\n"
