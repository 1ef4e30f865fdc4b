# SPDX-License-Identifier: GPL-3.0-or-later
"""`python -m lab report`'s table (lab/report.py render): a drained node is shown as `drain`, out
of rotation, and judged `ok` when it is expected out; a node absent from the pool reads `absent`."""

from __future__ import annotations

from lab import report


def _row(name, pool_state, health, expected, registered, **kw):
    return dict(
        {
            "name": name,
            "profile": "l40s-x8-degraded",
            "expect_registered": expected,
            "registered": registered,
            "pool_state": pool_state,
            "health": health,
            "gate": "FAILED",
            "gpu_health": "passed",
            "faults": [],
            "held": False,
            "busbw_gbps": 11.69,
            "threshold_gbps": 20.89,
            "reason": "bus bandwidth 11.69 GB/s is under the threshold",
            "ok": registered == expected,
            "serving": None,
        },
        **kw,
    )


def test_a_drained_node_expected_out_is_ok():
    text = report.render([_row("node4", "drain", "stopped", expected=False, registered=False)])
    (line,) = [ln for ln in text.splitlines() if ln.startswith("node4 ")]
    assert line.split()[-4:] == ["drain", "down", "out", "ok"], line
    assert "  node4: bus bandwidth 11.69 GB/s is under the threshold" in text


def test_a_drained_node_expected_in_is_wrong():
    row = _row("node2", "drain", "stopped", expected=True, registered=False, gate="passed", profile="l40s-4x-switch")
    line = report.render([row]).splitlines()[1]
    assert line.split()[-4:] == ["drain", "down", "in", "WRONG"], line
