# SPDX-License-Identifier: GPL-3.0-or-later
"""The collection's Prometheus alert rules and Grafana dashboard (role monitoring's files).

* ``promtool check rules`` on the shipped rule file, and ``promtool test rules`` on
  tests/data/promtool: every alert has a test where it fires and one where it stays quiet;
* the thresholds in the shipped rules are the collection's judging defaults (one source:
  _vllm_metrics.DEFAULT_THRESHOLDS, _vllm_metrics.QUANTILES, _recycle.DEFAULTS) and its ``for:``
  the role's defaults (the shipped file is the role's template rendered with its defaults:
  tests/integration/test_monitoring_role.py renders it and compares);
* every dashboard panel's PromQL parses (as recording rules, ``promtool check rules``), and
  ``tests.harness.prometheus.evaluate_dashboard(url)`` runs each against the lab's live Prometheus
  (tests/fleet/test_fleet_6_prometheus.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.node.plugins.module_utils.health import _history
from ansible_collections.gpufleet.node.plugins.module_utils.serving import _recycle, _vllm_metrics
from tests.harness.prometheus import DASHBOARD, dashboard, dashboard_queries
from tests.harness.prometheus import dashboard_panels as panels

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "monitoring"
RULES = ROLE / "files" / "gpufleet.rules.yml"
PROMTOOL_TESTS = REPO / "tests" / "data" / "promtool"
PROMTOOL = shutil.which("promtool")

needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is missing (Debian package prometheus; scripts/setup.sh installs it)"
)


def rules():
    return yaml.safe_load(RULES.read_text())


def alerts():
    return {r["alert"]: r for g in rules()["groups"] for r in g["rules"] if "alert" in r}


def promtool(*args, cwd=None):
    return subprocess.run(
        [PROMTOOL, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


@needs_promtool
def test_shipped_rules_pass_promtool_check():
    proc = promtool("check", "rules", RULES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in proc.stdout


@needs_promtool
def test_promtool_unit_tests(tmp_path):
    """promtool compares annotations verbatim, so the tests run on the rules without them."""
    doc = rules()
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "gpufleet.rules.yml").write_text(yaml.safe_dump(doc))
    files = sorted(PROMTOOL_TESTS.glob("*.test.yml"))
    assert files
    for f in files:
        shutil.copy(f, tmp_path / f.name)
    proc = promtool("test", "rules", *[f.name for f in files], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FAILED" not in proc.stdout + proc.stderr


def test_every_alert_has_a_firing_and_a_quiet_test():
    fires, quiet = set(), set()
    for f in PROMTOOL_TESTS.glob("*.test.yml"):
        doc = yaml.safe_load(f.read_text())
        assert doc["rule_files"] == ["gpufleet.rules.yml"], f
        for test in doc["tests"]:
            for case in test.get("alert_rule_test", []):
                (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = set(alerts())
    assert len(names) == 17
    assert names - fires == set(), "alerts without a test where they fire"
    assert names - quiet == set(), "alerts without a test where they stay quiet"
    assert (fires | quiet) - names == set(), "tests of alerts that do not exist"


def _number_after(expr, op):
    m = re.search(re.escape(op) + r"\s*\(?\s*([0-9.]+)", expr)
    assert m, (op, expr)
    return float(m.group(1))


def test_thresholds_are_the_modules_defaults():
    a = alerts()
    limits = _vllm_metrics.DEFAULT_THRESHOLDS
    # vllm_metrics_info judges usage >= max_kv_cache_usage a violation, waiting > max, preemptions > max
    assert _number_after(a["GpufleetVllmKvCacheHigh"]["expr"], ">=") == limits["max_kv_cache_usage"]
    assert _number_after(a["GpufleetVllmWaitingQueueHigh"]["expr"], ">") == limits["max_num_requests_waiting"]
    assert _number_after(a["GpufleetVllmPreempting"]["expr"], ">") == limits["max_preemptions"]
    assert "vllm:kv_cache_usage_perc" in _vllm_metrics.GAUGES["kv_cache_usage_perc"]
    assert "vllm:time_to_first_token_seconds" in _vllm_metrics.HISTOGRAMS["ttft_seconds"]
    ttft = a["GpufleetVllmTtftP95High"]["expr"]
    assert _number_after(ttft, "histogram_quantile(") == dict(_vllm_metrics.QUANTILES)["p95"]
    assert _number_after(ttft, ") >") == 2.0  # the role's default bound; the modules have none
    assert limits["max_ttft_p95_seconds"] is None
    # the recycle judge's RSS slope, in the textfile's unit (bytes per second)
    rss = a["GpufleetWorkerRssGrowing"]["expr"]
    assert _number_after(rss, ">") == _recycle.DEFAULTS["rss_slope_mib_per_min"]
    assert f"* {_recycle.MiB} / 60" in rss
    assert "gpufleet_worker_rss_slope_bytes_per_second" in _recycle.textfile({"rss_slope_mib_per_min": 1.0}, {})


def test_for_durations_are_the_roles_defaults():
    defaults = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__monitoring_alert_for_defaults"]
    assert {name: rule["for"] for name, rule in alerts().items()} == defaults
    # KV usage and the waiting queue for 5 minutes
    assert defaults["GpufleetVllmKvCacheHigh"] == defaults["GpufleetVllmWaitingQueueHigh"] == "5m"


def test_rules_read_the_metrics_the_roles_write():
    """Every gpufleet_* metric the rules use is written by a template, an action plugin (the drift
    report's), a node-side agent (the serving prober's) or module_utils."""
    sources = "".join(
        p.read_text()
        for pattern in (
            "roles/*/templates/**/*.prom.j2",
            "playbooks/templates/*.prom.j2",
            "plugins/action/*.py",
            "roles/*/files/*.py",
        )
        for p in REPO.glob(pattern)
    ) + _recycle.textfile({"rss_slope_mib_per_min": 1.0, "rss_bytes": 1}, {"last_recycle_kind": "x"})
    sources += _history.textfile(_history.empty(), "boot")
    used = set(re.findall(r'(?<!["\w])gpufleet_[a-z_]+', " ".join(r["expr"] for r in alerts().values())))
    assert used and {m for m in used if m not in sources} == set()


# --- the dashboard --------------------------------------------------------------------------------


def test_dashboard_shape():
    board = dashboard()
    assert DASHBOARD.name.endswith(".dashboard.json")
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    titles = [p["title"] for p in panels(board)]
    for needed in (
        "bus bandwidth",
        "Pool membership",
        "Drift",
        "GPU health",
        "KV-cache",
        "running and waiting",
        "Preemptions",
        "p50 / p95 / p99",
        "llama.cpp tokens per second",
        "llama.cpp requests processing and deferred",
    ):
        assert any(needed in t for t in titles), needed
    # llama-server's metrics (role llamacpp_server, --metrics) by the names this build exports
    exprs = " ".join(e for _t, e in dashboard_queries(board))
    for metric in ("prompt_tokens_total", "tokens_predicted_total", "requests_processing", "requests_deferred"):
        assert "llamacpp:" + metric in exprs, metric
    for p in panels(board):
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            assert p["targets"] and all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])
    # the bound lines are the alerts' thresholds
    steps = {
        p["title"]: p.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps", [])
        for p in panels(board)
    }
    assert steps["KV-cache usage"][-1]["value"] == _vllm_metrics.DEFAULT_THRESHOLDS["max_kv_cache_usage"]
    assert (
        steps["Requests running and waiting"][-1]["value"]
        == _vllm_metrics.DEFAULT_THRESHOLDS["max_num_requests_waiting"]
    )
    ttft = [e for t, e in dashboard_queries(board) if "first token" in t]
    assert [_number_after(e, "histogram_quantile(") for e in ttft] == [q for _n, q in _vllm_metrics.QUANTILES]


@needs_promtool
def test_dashboard_queries_parse(tmp_path):
    queries = dashboard_queries()
    assert len(queries) >= 12
    doc = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"gpufleet:dashboard_query_{i}", "expr": expr} for i, (_t, expr) in enumerate(queries)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(doc))
    proc = promtool("check", "rules", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
def test_a_broken_query_fails_the_parse_check(tmp_path):
    """The parse check above can fail: promtool refuses a bad expression."""
    path = tmp_path / "bad.rules.yml"
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "sum by (node (up)"}]}]})
    )
    assert promtool("check", "rules", path).returncode != 0
