# SPDX-License-Identifier: GPL-3.0-or-later
"""The NCCL gate's baseline store does not trust what it is given (plugins/module_utils/nccl/_baseline.py,
plugins/action/nccl_baseline.py): a store readable but not writable is read; only verdicts judged
by their design's own rule become peers; a node's clock cannot pin its figure; a timestamp that is
not a finite time is refused; every figure not kept is reported. One test per class."""

from __future__ import annotations

import json
import os
import time

import pytest

from ansible_collections.gpufleet.node.plugins.action import nccl_baseline as action
from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _baseline, _threshold

KEY = "h100-80gb-hbm3-8x-nvswitch-4f1c0a9e"
#: The controller's clock now: the action takes its own, so the verdicts are written around it.
NOW = float(int(time.time()))


def verdict(host, gbps, t=NOW - 60, rule="peer_median", **change):
    out = {
        "host": host,
        "design_key": KEY,
        "passed": True,
        "kind": "ok",
        "judged_busbw_gbps": gbps,
        "timestamp": t,
        "boot_id": "b-" + host,
        "rule": rule,
    }
    out.update(change)
    return out


def _stored(tmp_path):
    store = _baseline.Store(tmp_path)
    store.update([verdict("n%d" % i, 470.0 + i) for i in range(5)], now=NOW)
    return store


def _read_only(monkeypatch):
    """Opening anything for writing fails, as it does for an operator with read access only."""
    real = os.open
    opened = []

    def guarded(path, flags, *args, **kwargs):
        opened.append((str(path), flags))
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", guarded)
    return opened


@pytest.mark.parametrize("lock", ["present", "absent"])
def test_baseline_read_only_store_is_read(tmp_path, monkeypatch, lock):
    store = _stored(tmp_path)
    if lock == "absent":
        os.unlink(tmp_path / _baseline.LOCK_NAME)
    opened = _read_only(monkeypatch)
    result = action.read(store)
    assert result["problem"] is None and result["counts"] == {KEY: 5}, result
    assert any(path.endswith(_baseline.LOCK_NAME) for path, _flags in opened)
    # the peers' median is there, so the gate judges by it, not by the physics floor
    stat = _baseline.statistic(result["designs"][KEY]["samples"], exclude_host="me")
    assert _threshold.decide(480.0, 0.5, KEY, stat)["rule"] == "peer_median"


def test_baseline_read_only_store_refuses_a_write_saying_why(tmp_path, monkeypatch):
    store = _stored(tmp_path)
    _read_only(monkeypatch)
    result = action.update(store, [verdict("x", 470.0)], 50, False)
    assert "for writing" in result["problem"] and "needs write access" in result["problem"]


@pytest.mark.parametrize("rule", ["fixed", None, "", "peer-median"])
def test_baseline_fixed_threshold_verdict_is_not_a_peer(tmp_path, rule):
    store = _baseline.Store(tmp_path)
    out = store.update([verdict("fixed-node", 200.0, rule=rule), verdict("peer", 470.0)], now=NOW)
    assert out["updated"] == {KEY: ["peer"]}
    assert [d["host"] for d in out["dropped"]] == ["fixed-node"]
    assert "not a peer of its design" in out["dropped"][0]["reason"] and repr(rule) in out["dropped"][0]["reason"]
    assert [s["host"] for s in store.read()[0][KEY]] == ["peer"]


@pytest.mark.parametrize("ahead", [301.0, 86400.0 * 365, 1e12])
def test_baseline_clock_ahead_does_not_pin_a_figure(tmp_path, ahead):
    store = _baseline.Store(tmp_path)
    store.update([verdict("fast", 470.0, t=NOW + ahead)], now=NOW)
    assert store.read()[0][KEY][0]["timestamp"] == NOW  # the controller's time, not the node's
    out = store.update([verdict("fast", 455.0, t=NOW + 100)], now=NOW + 100)
    assert out["updated"] == {KEY: ["fast"]} and out["dropped"] == []
    assert [s["gbps"] for s in store.read()[0][KEY]] == [455.0]


def test_baseline_stored_future_figure_is_replaced_by_the_nodes_next(tmp_path):
    """A file written before timestamps were bounded: the node's next figure replaces it."""
    store = _baseline.Store(tmp_path)
    samples = [{"host": "fast", "gbps": 470.0, "timestamp": NOW + 1e9, "boot_id": "b"}]
    doc = {"format": 1, "design_key": KEY, "design": None, "samples": samples, "checksum": _baseline.checksum(samples)}
    (tmp_path / (KEY + ".json")).write_text(json.dumps(doc))
    out = store.update([verdict("fast", 440.0, t=NOW - 5)], now=NOW)
    assert out["updated"] == {KEY: ["fast"]}
    assert [(s["gbps"], s["timestamp"]) for s in store.read()[0][KEY]] == [(440.0, NOW - 5)]


@pytest.mark.parametrize("t", [float("nan"), float("inf"), "nan", "-inf", None, True, -1.0, 0, "yesterday"])
def test_baseline_non_finite_timestamp_is_refused(tmp_path, t):
    store = _baseline.Store(tmp_path)
    out = store.update([verdict("n", 470.0, t=t)], now=NOW)
    assert out["updated"] == {} and out["ignored"] == 1
    assert "is not a finite time" in out["dropped"][0]["reason"]
    assert not (tmp_path / (KEY + ".json")).exists()


@pytest.mark.parametrize("t", ["NaN", "Infinity", "true"])
def test_baseline_stored_non_finite_timestamp_is_corrupt(tmp_path, t):
    text = '{"host": "a", "gbps": 470.0, "timestamp": %s}' % t
    samples = [json.loads(text)]
    doc = {"format": 1, "design_key": KEY, "samples": samples, "checksum": _baseline.checksum(samples)}
    (tmp_path / (KEY + ".json")).write_text(json.dumps(doc))
    assert "finite timestamp" in _baseline.Store(tmp_path).read()[1][KEY]


@pytest.mark.parametrize("gbps", [float("nan"), float("inf"), -470.0, True, "fast"])
def test_baseline_non_finite_figure_is_refused(tmp_path, gbps):
    out = _baseline.Store(tmp_path).update([verdict("n", gbps)], now=NOW)
    assert out["updated"] == {} and "not a finite positive GB/s" in out["dropped"][0]["reason"]


def test_baseline_every_dropped_sample_is_reported(tmp_path):
    store = _baseline.Store(tmp_path)
    store.update([verdict("a", 470.0, t=NOW - 30), verdict("b", 471.0, t=NOW - 20)], window=2, now=NOW)
    verdicts = [
        verdict("c", 472.0, t=NOW - 10),  # pushes out a, the oldest
        verdict("d", 300.0, passed=False, kind="low_bandwidth"),
        verdict("e", 470.0, t=NOW - 50),
        verdict("e", 469.0, t=NOW - 40),  # e's newer verdict in the same update wins over its older
    ]
    out = action.update(store, verdicts, 2, False)
    reasons = {(d["host"], d["gbps"]): d["reason"] for d in out["dropped"]}
    assert set(reasons) == {("a", 470.0), ("d", 300.0), ("e", 470.0), ("e", 469.0)}, reasons
    assert reasons[("e", 470.0)] == "a newer verdict of the same host in this update"
    assert reasons[("a", 470.0)] == reasons[("e", 469.0)] == "outside the window of the 2 most recent nodes"
    assert out["ignored"] == 1
    # every figure not kept is a warning, except the verdict that failed
    assert len(out["warnings"]) == 3 and not any("d (design" in w for w in out["warnings"])
    assert sorted(s["host"] for s in store.read()[0][KEY]) == ["b", "c"]
