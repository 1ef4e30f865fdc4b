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

import importlib.util
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
    assert len(names) == 19
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


def exported():
    """What writes gpufleet_* metrics: the roles' textfile templates, the action plugins (the drift
    report's), the node-side agents and daemons (the serving prober's, the pool decider's), module_utils
    (the pool budget's), and the textfiles module_utils builds (GPU health history, worker recycle)."""
    sources = "".join(
        p.read_text()
        for pattern in (
            "roles/*/templates/**/*.prom.j2",
            "playbooks/templates/*.prom.j2",
            "plugins/action/*.py",
            "roles/*/files/*.py",
            "plugins/module_utils/**/*.py",
        )
        for p in REPO.glob(pattern)
    ) + _recycle.textfile({"rss_slope_mib_per_min": 1.0, "rss_bytes": 1}, {"last_recycle_kind": "x"})
    return sources + _history.textfile(_history.empty(), "boot")


def gpufleet_metrics(exprs):
    """The gpufleet_* metric names PromQL expressions read (not label values, not recording rules)."""
    return set(re.findall(r'(?<!["\w])gpufleet_[a-z_]+', " ".join(exprs)))


def test_rules_read_the_metrics_the_roles_write():
    """Every gpufleet_* metric the rules use is written by the collection."""
    used = gpufleet_metrics(r["expr"] for r in alerts().values())
    sources = exported()
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
        "Serving probe verdict",
        "Serving probe latency and its deadline",
        "Fatal XID lines per GPU and code",
        "Fatal XID last seen",
        "Held for hardware inspection",
        "Pool budget",
        "Removals refused by the budget",
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
    # the slow probe's line is the alert's bound; the verdict's colours are the prober's codes
    slow = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["monitoring_serving_probe_slow_fraction"]
    assert steps["Serving probe latency, share of the deadline"][-1]["value"] == slow
    assert _number_after(alerts()["GpufleetServingProbeSlow"]["expr"], ">=") == slow
    (verdict,) = [p for p in panels(board) if p["title"].startswith("Serving probe verdict")]
    (mapping,) = verdict["fieldConfig"]["defaults"]["mappings"]
    assert {int(code): m["text"] for code, m in mapping["options"].items()} == {
        code: name for name, code in _prober().VERDICT_CODES.items()
    }


def _prober():
    spec = importlib.util.spec_from_file_location(
        "gpufleet_serving_probe", REPO / "roles" / "lb_registration" / "files" / "gpufleet_serving_probe.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dashboard_reads_the_metrics_the_collection_exports():
    """Every gpufleet_* metric a panel plots is written by the collection (as the rules' are)."""
    used = gpufleet_metrics(e for _t, e in dashboard_queries())
    assert {"gpufleet_serving_probe_verdict", "gpufleet_gpu_health_xid_count", "gpufleet_pool_budget_limit"} <= used
    sources = exported()
    assert {m for m in used if m not in sources} == set()


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


def _query(title_start, index=0):
    return [e for t, e in dashboard_queries(values={"node": ".+"}) if t.startswith(title_start)][index]


@needs_promtool
def test_the_probe_recurrence_and_budget_panels_on_the_writers_series(tmp_path):
    """promtool evaluates those panels' queries on series shaped as the prober, the GPU health
    history and the pool decider write them: the verdict's code per node; a node without any fatal
    XID, or a backend without any held, pending or refused removal, reads 0 (a series, not none);
    one with them reads theirs."""
    node = 'instance="10.0.0.%d:9100",job="gpufleet_node",node="n%d"'
    pool = 'instance="lb:9105",job="gpufleet_pool_decider",backend="vllm_pool"'
    series = {
        # n1 busy, n2 serving, n3 wedged
        **{
            f'gpufleet_serving_probe_verdict{{{node % (i, i)},verdict="{v}"}}': "1x5" if v == seen else "0x5"
            for i, seen in ((1, "busy"), (2, "serving"), (3, "wedged"))
            for v in ("serving", "busy", "wedged", "down")
        },
        # n1 without any fatal XID, n2 with XID 79 on one GPU in two boots (held)
        f"gpufleet_gpu_health_hold{{{node % (1, 1)}}}": "0x5",
        f"gpufleet_gpu_health_hold{{{node % (2, 2)}}}": "1x5",
        f'gpufleet_gpu_health_xid_count{{{node % (2, 2)},gpu="0000:3b:00.0",code="79",scope="history"}}': "3x5",
        f'gpufleet_gpu_health_xid_count{{{node % (2, 2)},gpu="0000:3b:00.0",code="79",scope="boot"}}': "1x5",
        f'gpufleet_gpu_health_xid_last_seen_timestamp_seconds{{{node % (2, 2)},gpu="0000:3b:00.0",code="79"}}': "1700000000x5",
        # the budget: 4 servers, 1 may be out, none held, pending or refused
        f"gpufleet_pool_budget_limit{{{pool}}}": "1x5",
        f"gpufleet_pool_budget_servers{{{pool}}}": "4x5",
    }
    busy_pool = dict(
        series,
        **{
            f'gpufleet_pool_budget_held{{{pool},server="n2",reason="gate-failed"}}': "1x5",
            f'gpufleet_pool_budget_pending{{{pool},server="n3",reason="gpu-health-failed"}}': "1x5",
            f'gpufleet_pool_budget_refused_total{{{pool},server="n3",reason="gpu-health-failed"}}': "0 1 2 3 4 5",
        },
    )

    def case(expr, samples):
        return {"expr": expr, "eval_time": "5m", "exp_samples": [{"labels": k, "value": v} for k, v in samples]}

    quiet_tests = [
        case(_query("Serving probe verdict"), [('{node="n1"}', 1), ('{node="n2"}', 0), ('{node="n3"}', 2)]),
        case(_query("Fatal XID lines"), [('{node="n1"}', 0), ('{node="n2",gpu="0000:3b:00.0",code="79"}', 3)]),
        case(
            _query("Fatal XID last seen"),
            [('{node="n1"}', 0), ('{node="n2",gpu="0000:3b:00.0",code="79"}', 1700000000000)],
        ),
        case(_query("Held for hardware inspection"), [('{node="n1"}', 0), ('{node="n2"}', 1)]),
        case(_query("Pool budget", 1), [('{backend="vllm_pool"}', 1)]),
        case(_query("Pool budget", 2), [('{backend="vllm_pool"}', 0)]),
        case(_query("Removals held and pending"), [('{backend="vllm_pool"}', 0)]),
        case(_query("Removals refused"), [('{backend="vllm_pool"}', 0)]),
    ]
    busy_tests = [
        case(_query("Pool budget", 2), [('{backend="vllm_pool"}', 1)]),
        case(_query("Removals held and pending"), [('{backend="vllm_pool",server="n2",reason="gate-failed"}', 1)]),
        case(
            _query("Removals held and pending", 1),
            [('{backend="vllm_pool",server="n3",reason="gpu-health-failed"}', 1)],
        ),
        case(_query("Removals refused"), [('{backend="vllm_pool",server="n3",reason="gpu-health-failed"}', 5)]),
    ]
    doc = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": name,
                "interval": "1m",
                "input_series": [{"series": k, "values": v} for k, v in inputs.items()],
                "promql_expr_test": tests,
            }
            for name, inputs, tests in (("quiet fleet", series, quiet_tests), ("removals", busy_pool, busy_tests))
        ],
    }
    (tmp_path / "panels.test.yml").write_text(yaml.safe_dump(doc))
    proc = promtool("test", "rules", "panels.test.yml", cwd=tmp_path)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


@needs_promtool
def test_a_broken_query_fails_the_parse_check(tmp_path):
    """The parse check above can fail: promtool refuses a bad expression."""
    path = tmp_path / "bad.rules.yml"
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "sum by (node (up)"}]}]})
    )
    assert promtool("check", "rules", path).returncode != 0
