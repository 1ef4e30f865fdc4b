# SPDX-License-Identifier: GPL-3.0-or-later
"""The NCCL gate's peer baselines (plugins/module_utils/nccl/_baseline.py, the rule in nccl/_threshold.py): which verdicts count, the
robust statistic, the threshold rule, and the store under concurrent writers and corruption."""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _baseline, _threshold

KEY = "h100-80gb-hbm3-8x-nvswitch-4f1c0a9e"


def verdict(host, gbps, t=1.7e9, passed=True, kind="ok", key=KEY, rule="physics_floor"):
    return {
        "host": host,
        "design_key": key,
        "passed": passed,
        "kind": kind,
        "judged_busbw_gbps": gbps,
        "timestamp": t,
        "boot_id": "b-" + host,
        "rule": rule,
    }


# --- which verdicts count, and the statistic --------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        verdict("n", 300.0, passed=False, kind="low_bandwidth"),
        verdict("n", 470.0, passed=False, kind="wrong"),
        verdict("n", 470.0, kind="check_mode"),
        verdict("n", float("nan")),
        verdict("n", None),
        verdict("n", 0.0),
        verdict("n", 470.0, key=None),
        "not a verdict",
    ],
)
def test_failed_or_unmeasured_verdicts_do_not_count(bad):
    assert _baseline.healthy_sample(bad) is None


def test_string_passed_from_a_role_fact_counts():
    assert _baseline.healthy_sample(verdict("n", 470.0) | {"passed": "True"})["gbps"] == 470.0


def test_statistic_ignores_outliers_itself_and_older_figures():
    samples = [_baseline.healthy_sample(verdict(f"n{i}", 465.0 + i, t=1.7e9 + i)) for i in range(7)]
    samples.append(_baseline.healthy_sample(verdict("slow", 300.0, t=1.8e9)))  # an outlier
    samples.append(_baseline.healthy_sample(verdict("me", 100.0, t=1.8e9)))  # the judged node
    samples.append(_baseline.healthy_sample(verdict("n0", 400.0, t=1.6e9)))  # n0's older figure
    stat = _baseline.statistic(samples, exclude_host="me")
    assert stat["median"] == 468.0 and stat["count"] == 7
    assert stat["outliers"] == [{"host": "slow", "gbps": 300.0}] and "me" not in stat["hosts"]


def test_statistic_window_keeps_the_most_recent_nodes():
    samples = [_baseline.healthy_sample(verdict(f"n{i}", 400.0 + i, t=1.7e9 + i)) for i in range(10)]
    stat = _baseline.statistic(samples, window=3)
    assert stat["hosts"] == ["n7", "n8", "n9"] and stat["median"] == 408.0


def test_statistic_of_identical_figures_keeps_them_all():
    samples = [_baseline.healthy_sample(verdict(f"n{i}", 23.3)) for i in range(5)]
    assert _baseline.statistic(samples) == {
        "median": 23.3,
        "count": 5,
        "hosts": ["n0", "n1", "n2", "n3", "n4"],
        "outliers": [],
    }


# --- the rule -----------------------------------------------------------------------------------


def test_rule_peer_median_over_the_physics_floor():
    stat = {"median": 471.2, "count": 14, "hosts": [], "outliers": []}
    d = _threshold.decide(450.0, 0.85, "h100-sxm-8x-nvswitch", stat, fraction=0.95, min_samples=5)
    assert d["rule"] == "peer_median" and d["threshold_gbps"] == 447.64 and d["physics_floor_gbps"] == 382.5
    assert d["rule_text"] == "0.95 x the median 471.2 GB/s of 14 healthy nodes of design h100-sxm-8x-nvswitch"


def test_rule_physics_floor_until_enough_peers_and_when_higher():
    few = {"median": 471.2, "count": 4, "hosts": [], "outliers": []}
    d = _threshold.decide(450.0, 0.85, "k", few, min_samples=5)
    assert d["rule"] == "physics_floor" and d["threshold_gbps"] == 382.5 and d["baseline_gbps"] is None
    assert d["rule_text"] == (
        "the physics floor 382.50 GB/s (0.85 x the 450.00 GB/s the model gives a healthy node of this "
        "design); the peer baseline of design k has 4 of the 5 healthy nodes it needs"
    )
    # A design whose peers all run low (ACS on everywhere) never lowers the bar under the floor.
    low = {"median": 11.6, "count": 9, "hosts": [], "outliers": []}
    d = _threshold.decide(24.58, 0.85, "k", low)
    assert d["rule"] == "physics_floor" and d["threshold_gbps"] == 20.89
    assert "; above 0.96 x the median 11.6 GB/s of 9 healthy nodes of design k" in d["rule_text"]
    assert _threshold.decide(24.58, 0.85, "k")["rule_text"].endswith("; no peer baseline yet for design k")


def test_default_fraction_separates_one_nvlink_down_from_healthy_spread():
    # One NVLink of 18 down costs 1/18; healthy nodes spread about 1 % (4 sigma of 0.5 % node
    # spread under 0.96 is 0.98): the default sits between with room on both sides.
    assert 1 - 1 / 18 < _threshold.DEFAULT_FRACTION - 0.01
    assert _threshold.DEFAULT_FRACTION < 1 - 4 * 0.005 - 0.01


# --- the store ----------------------------------------------------------------------------------


def _writer(directory, worker, count):
    store = _baseline.Store(directory)
    for n in range(count):
        store.update([verdict(f"w{worker}-n{n}", 460.0 + worker + n / 100, t=1.7e9 + worker * 1000 + n)], window=10_000)


def test_store_survives_concurrent_writers(tmp_path):
    directory = str(tmp_path / "baselines")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(directory, w, 25)) for w in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    designs, corrupt = _baseline.Store(directory).read()
    assert corrupt == {}
    hosts = {s["host"] for s in designs[KEY]}
    assert hosts == {f"w{w}-n{n}" for w in range(6) for n in range(25)}  # no update was lost
    assert sorted(os.listdir(directory)) == [".lock", KEY + ".json"]  # no temporary file left


def test_store_keeps_the_latest_figure_per_node_and_the_window(tmp_path):
    store = _baseline.Store(tmp_path)
    out = store.update([verdict("a", 460.0, t=1), verdict("b", 470.0, t=2), verdict("c", 1.0, passed=False)], window=2)
    failed = {"host": "c", "design_key": KEY, "gbps": 1.0, "reason": "did not pass (passed False, kind 'ok')"}
    assert out == {"updated": {KEY: ["a", "b"]}, "corrupt": {}, "ignored": 1, "dropped": [failed]}
    assert store.update([verdict("a", 460.0, t=1)], window=2)["updated"] == {}  # nothing new
    store.update([verdict("a", 465.0, t=3), verdict("d", 466.0, t=4)], window=2)
    samples = store.read()[0][KEY]
    assert [(s["host"], s["gbps"]) for s in samples] == [("a", 465.0), ("d", 466.0)]
    assert oct(os.stat(store.path(KEY)).st_mode & 0o777) == "0o644"


def test_dry_run_writes_nothing(tmp_path):
    store = _baseline.Store(tmp_path / "none")
    assert store.update([verdict("a", 460.0)], dry_run=True)["updated"] == {KEY: ["a"]}
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize(
    "content, reason",
    [
        ('{"format": 1, "design_key": "', "not JSON"),
        ("[]", "not a JSON object"),
        ('{"format": 7}', "format 7, not 1"),
        ('{"format": 1, "design_key": "other", "samples": []}', "names design 'other'"),
        ('{"format": 1, "design_key": "%s", "samples": [{"host": "a"}]}' % KEY, "sample 0 is not"),
    ],
)
def test_corrupt_file_is_reported_and_left_untouched(tmp_path, content, reason):
    store = _baseline.Store(tmp_path)
    path = tmp_path / (KEY + ".json")
    path.write_text(content)
    designs, corrupt = store.read()
    assert KEY not in designs and reason in corrupt[KEY] and str(path) in corrupt[KEY]
    out = store.update([verdict("a", 460.0)])
    assert out["updated"] == {} and reason in out["corrupt"][KEY]
    assert path.read_text() == content  # never reset


def test_edited_figure_fails_the_checksum(tmp_path):
    store = _baseline.Store(tmp_path)
    store.update([verdict("a", 460.0), verdict("b", 470.0)])
    path = tmp_path / (KEY + ".json")
    doc = json.loads(path.read_text())
    doc["samples"][0]["gbps"] = 999.0
    path.write_text(json.dumps(doc))
    assert "checksum does not match" in store.read()[1][KEY]


def test_bad_design_key_is_refused_before_writing(tmp_path):
    with pytest.raises(_baseline.BaselineError, match="not a design key"):
        _baseline.Store(tmp_path).update([verdict("a", 460.0, key="../etc/passwd")])
    assert os.listdir(tmp_path) == []
