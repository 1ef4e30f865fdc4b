# SPDX-License-Identifier: GPL-3.0-or-later
"""_vllm_metrics on real /metrics samples (tests/data/vllm-metrics, sources in each file), on the
lab stand-in's engine, on the real llama-server's own /metrics (lab/llamacpp.py), and the
thresholds firing and staying quiet; the module end to end."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.serving import _vllm_metrics as vm
from lab import llamacpp
from lab.standins.vllm_engine import Engine
from tests.harness.http import MetricsServer

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm-metrics"


def sample(name):
    return (DATA / name).read_text()


def test_every_sample_records_its_source():
    files = sorted(DATA.glob("*.prom"))
    assert len(files) >= 4
    for f in files:
        assert f.read_text().startswith("# SOURCE: https://github.com/"), f


def test_every_sample_is_in_the_source_table():
    table = (DATA / "SOURCE.md").read_text()
    for f in sorted(DATA.glob("*.prom")):
        assert f"| `{f.name}` |" in table, f.name


# --- the pinned release's names (v0.33.0-two-engines.prom, vLLM 0.33.0's own exporter) -----------

PINNED = "v0.33.0-two-engines.prom"
ROLE = Path(__file__).resolve().parents[2] / "roles" / "monitoring"
READERS = {
    "the shipped rules": ROLE / "files" / "gpufleet.rules.yml",
    "the rules' template": ROLE / "templates" / "etc" / "prometheus" / "rules.d" / "gpufleet.rules.yml.j2",
    "the dashboard": ROLE / "files" / "gpufleet.dashboard.json",
}


def exported_families(text):
    """The metric families an exposition declares (its TYPE lines)."""
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def names_missing(reader_text, exposition_text):
    """The vllm: names a rule file or dashboard reads that the exposition does not export (a
    histogram's _bucket, _sum and _count series are its family's)."""
    families = exported_families(exposition_text)
    read = set(re.findall(r"vllm:[a-z_]+", reader_text))
    return sorted(n for n in read if n not in families and re.sub(r"_(bucket|sum|count)$", "", n) not in families)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_the_alerts_and_the_dashboard_read_names_the_pinned_vllm_exports(reader):
    text = READERS[reader].read_text()
    assert re.findall(r"vllm:[a-z_]+", text), reader
    assert names_missing(text, sample(PINNED)) == [], reader


def test_a_rule_on_a_name_vllm_no_longer_exports_is_caught():
    old = "- alert: X\n  expr: max by (node) (vllm:gpu_cache_usage_perc) >= 0.88\n"
    assert names_missing(old, sample(PINNED)) == ["vllm:gpu_cache_usage_perc"]
    assert names_missing(old, sample("v0-qwenvl-old-names.prom")) == []


def test_the_parser_reads_every_name_it_prefers_from_the_pinned_release():
    families = exported_families(sample(PINNED))
    for figure, names in {**vm.GAUGES, **vm.HISTOGRAMS}.items():
        vllm_names = [n for n in names if n.startswith("vllm:")]
        assert vllm_names[0] in families, (figure, vllm_names[0])


def test_the_pinned_release_two_engines_parse():
    """Engines summed, the KV usage the fullest engine's; TTFT quantiles from the release's own
    buckets (six first tokens: 0.06, 0.08, 0.11, 0.12, 0.35, 0.9 s)."""
    scrape = vm.parse(sample(PINNED))
    g = scrape["gauges"]
    assert scrape["engines"] == ["0", "1"]
    assert {f: (e["name"], e["value"]) for f, e in g.items()} == {
        "num_requests_running": ("vllm:num_requests_running", 7.0),
        "num_requests_waiting": ("vllm:num_requests_waiting", 1.0),
        "kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", 0.42),
        "num_preemptions_total": ("vllm:num_preemptions_total", 2.0),
    }
    assert g["kv_cache_usage_perc"]["per_engine"] == {"0": 0.42, "1": 0.17}
    h = scrape["histograms"]
    assert h["ttft_seconds"]["name"] == "vllm:time_to_first_token_seconds" and h["ttft_seconds"]["count"] == 6
    q = vm.quantiles(h["ttft_seconds"]["buckets"])
    assert q["p50"] == pytest.approx(0.1 + 0.15 * (3 - 2) / (4 - 2))  # in the (0.1, 0.25] bucket
    assert q["p95"] == pytest.approx(0.75 + 0.25 * (0.95 * 6 - 5) / 1)  # in the (0.75, 1.0] bucket
    assert h["itl_seconds"]["name"] == "vllm:inter_token_latency_seconds" and h["itl_seconds"]["count"] == 30


def test_module_on_the_pinned_release_exposition(run_module, metrics_server):
    url = "http://127.0.0.1:%d" % metrics_server.server_address[1]
    _Metrics.texts = [sample(PINNED)]
    res = run_module("vllm_metrics_info", {"url": url, "samples": 1, "interval": 0})
    assert not res.get("failed") and res["healthy"] is True and res["violations"] == [], res
    assert res["metrics"]["names"]["kv_cache_usage_perc"] == "vllm:kv_cache_usage_perc"
    assert res["metrics"]["engines"] == 2 and res["metrics"]["kv_cache_usage_perc"] == 0.42


def test_old_release_names_are_understood():
    scrape = vm.parse(sample("v0-qwenvl-old-names.prom"))
    g = scrape["gauges"]
    assert g["kv_cache_usage_perc"]["name"] == "vllm:gpu_cache_usage_perc"
    assert (
        g["kv_cache_usage_perc"]["value"],
        g["num_requests_running"]["value"],
        g["num_requests_waiting"]["value"],
    ) == (0.0, 0.0, 0.0)
    assert "num_preemptions_total" not in g
    assert scrape["engines"] == [""]


def test_v1_names_with_engine_label():
    scrape = vm.parse(sample("v0.10-glm45-kv-cache.prom"))
    kv = scrape["gauges"]["kv_cache_usage_perc"]
    assert kv["name"] == "vllm:kv_cache_usage_perc"
    assert kv["value"] == pytest.approx(9.75010481363281e-06)
    assert kv["per_engine"] == {"0": pytest.approx(9.75010481363281e-06)}
    assert scrape["engines"] == ["0"]


def test_new_name_wins_when_both_are_exported():
    text = sample("v0-qwenvl-old-names.prom") + sample("v0.10-glm45-kv-cache.prom")
    assert vm.parse(text)["gauges"]["kv_cache_usage_perc"]["name"] == "vllm:kv_cache_usage_perc"


def test_ttft_quantiles_from_real_buckets():
    # one request between 10 and 20 ms: Prometheus interpolates inside the bucket
    h = vm.parse(sample("v0.6-opt125m-ttft.prom"))["histograms"]["ttft_seconds"]
    assert vm.quantiles(h["buckets"]) == {"p50": 0.015, "p95": 0.0195, "p99": 0.0199}
    # 213 observations, 112 under 20 ms, 211 under 40 ms (no +Inf bucket in the published excerpt)
    h = vm.parse(sample("v0.4-bloom560m-ttft.prom"))["histograms"]["ttft_seconds"]
    q = vm.quantiles(h["buckets"])
    assert q["p50"] == pytest.approx(0.01 + 0.01 * (0.5 * 213) / 112, abs=1e-6)
    assert q["p95"] == pytest.approx(0.02 + 0.02 * (0.95 * 213 - 112) / 99, abs=1e-6)


def test_histogram_quantile_edges():
    assert vm.histogram_quantile(0.5, []) is None
    assert vm.histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None
    # everything beyond the last finite bound: Prometheus answers that bound
    assert vm.histogram_quantile(0.99, [(0.1, 0.0), (1.0, 0.0), (math.inf, 5.0)]) == 1.0
    assert vm.histogram_quantile(0.5, [(0.1, 10.0), (math.inf, 10.0)]) == pytest.approx(0.05)


ENGINES = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 10.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.91
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:num_preemptions_total{engine="1",model_name="m"} 3.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 10.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="m"} 10.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 10.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.5
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="1.0",model_name="m"} 10.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="m"} 10.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="m"} 10.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="m"} 5.0
"""


def test_engines_are_summed_and_kv_is_the_fullest():
    """Synthetic (two data-parallel engines), in the V1 exposition format of the samples above."""
    scrape = vm.parse(ENGINES)
    g = scrape["gauges"]
    assert (
        g["num_requests_running"]["value"],
        g["num_requests_waiting"]["value"],
        g["num_preemptions_total"]["value"],
    ) == (8.0, 11.0, 5.0)
    assert g["kv_cache_usage_perc"]["value"] == 0.91
    h = scrape["histograms"]["ttft_seconds"]
    assert h["buckets"] == [(0.1, 10.0), (1.0, 20.0), (math.inf, 20.0)] and h["count"] == 20.0
    assert vm.quantiles(h["buckets"])["p50"] == pytest.approx(0.1)
    assert scrape["engines"] == ["0", "1"]


def test_merge_buckets_with_different_bounds():
    merged = vm.merge_buckets([[(0.1, 1.0), (math.inf, 2.0)], [(0.5, 3.0), (math.inf, 3.0)]])
    assert merged == [(0.1, 1.0), (0.5, 4.0), (math.inf, 5.0)]


def test_not_prometheus_text_is_an_error():
    with pytest.raises(vm.MetricsError):
        vm.parse('vllm:num_requests_running{engine="0" 1.0\n')


def gauges(kv, waiting, running=1, preempt=0.0, ttft=None):
    lines = [
        'vllm:kv_cache_usage_perc{engine="0"} %s' % kv,
        'vllm:num_requests_waiting{engine="0"} %s' % waiting,
        'vllm:num_requests_running{engine="0"} %s' % running,
        'vllm:num_preemptions_total{engine="0"} %s' % preempt,
    ]
    for bound, count in ttft or []:
        lines.append('vllm:time_to_first_token_seconds_bucket{engine="0",le="%s"} %s' % (bound, count))
    return vm.parse("\n".join(lines) + "\n")


def window(*scrapes):
    return [(1000.0 + 5 * i, s) for i, s in enumerate(scrapes)]


def test_quiet_server_has_no_violation():
    metrics, samples, violations = vm.summarize(window(gauges(0.5, 2), gauges(0.87, 8), gauges(0.6, 0)), 5)
    assert violations == []
    assert metrics["kv_cache_usage_perc"] == 0.6 and metrics["kv_cache_usage_perc_peak"] == 0.87
    assert metrics["num_requests_waiting_peak"] == 8 and metrics["num_preemptions_window"] == 0
    assert metrics["window_seconds"] == 10 and len(samples) == 3


def test_kv_peak_fires_with_advice():
    _m, _s, violations = vm.summarize(window(gauges(0.5, 0), gauges(0.99, 0)), 5)
    assert [v["name"] for v in violations] == ["kv_cache_usage"]
    assert "max_num_seqs" in violations[0]["message"] and "0.99" in violations[0]["message"]


def test_waiting_queue_fires_only_when_sustained():
    quiet = window(gauges(0.5, 20), gauges(0.5, 0), gauges(0.5, 20), gauges(0.5, 0))
    assert vm.summarize(quiet, 5)[2] == []
    loud = window(gauges(0.5, 0), gauges(0.5, 9), gauges(0.5, 12), gauges(0.5, 30))
    violations = vm.summarize(loud, 5)[2]
    assert [v["name"] for v in violations] == ["num_requests_waiting"]
    assert "lower max_num_batched_tokens" in violations[0]["message"]
    # a single scrape above the limit is judged on its own
    assert vm.summarize(window(gauges(0.5, 9)), 5)[2][0]["name"] == "num_requests_waiting"


def test_climbing_preemptions_fire_and_a_restart_is_not_negative():
    violations = vm.summarize(window(gauges(0.5, 0, preempt=3), gauges(0.5, 0, preempt=7)), 5)[2]
    assert [v["name"] for v in violations] == ["preemptions"] and violations[0]["value"] == 4
    assert "host swap is no remedy" in violations[0]["message"]
    assert vm.summarize(window(gauges(0.5, 0, preempt=3), gauges(0.5, 0, preempt=3)), 5)[2] == []
    metrics = vm.summarize(window(gauges(0.5, 0, preempt=9), gauges(0.5, 0, preempt=0)), 5)[0]
    assert metrics["num_preemptions_window"] == 0


def test_ttft_over_the_window_and_its_threshold():
    before = gauges(0.5, 0, ttft=[(0.1, 100), (1.0, 100), ("+Inf", 100)])
    after = gauges(0.5, 0, ttft=[(0.1, 100), (1.0, 110), ("+Inf", 110)])  # 10 slow requests in the window
    metrics, _s, violations = vm.summarize(window(before, after), 5, {"max_ttft_p95_seconds": 0.5})
    assert metrics["ttft_seconds"]["scope"] == "window" and metrics["ttft_seconds"]["count"] == 10
    assert metrics["ttft_seconds"]["p50"] == pytest.approx(0.55)
    assert [v["name"] for v in violations] == ["ttft_p95"]
    # nothing new in the window: quantiles since start, and no TTFT threshold by default
    metrics, _s, violations = vm.summarize(window(before, before), 5)
    assert metrics["ttft_seconds"]["scope"] == "since_start" and violations == []


def test_a_server_without_the_gauges_is_an_error():
    with pytest.raises(vm.MetricsError, match="vllm:kv_cache_usage_perc"):
        vm.summarize(window(vm.parse(sample("v0.6-opt125m-ttft.prom"))))


def test_stand_in_engine_metrics_parse_and_count():
    engine = Engine(
        kv_tokens=4096,
        block_size=16,
        max_num_seqs=4,
        max_num_batched_tokens=2048,
        prefill_tps=1e6,
        itl=0.001,
        itl_per_seq=0.0,
    )
    engine.start()
    reqs = [engine.submit(300, 5) for _ in range(3)]
    for r in reqs:
        assert len(list(r.tokens())) == 5
    scrape = vm.parse(engine.metrics("m"))
    g = scrape["gauges"]
    assert (g["num_requests_running"]["value"], g["num_requests_waiting"]["value"]) == (0.0, 0.0)
    assert g["kv_cache_usage_perc"]["value"] == 0.0
    h = scrape["histograms"]
    assert h["ttft_seconds"]["count"] == 3 and h["itl_seconds"]["count"] == 12
    assert 0 < vm.quantiles(h["ttft_seconds"]["buckets"])["p50"] < 0.1


def test_stand_in_engine_preempts_when_the_pool_is_short():
    # 64 blocks of 16 tokens; four 200-token prompts generating 100 tokens each cannot all fit
    engine = Engine(
        kv_tokens=1024,
        block_size=16,
        max_num_seqs=8,
        max_num_batched_tokens=4096,
        prefill_tps=1e6,
        itl=0.0005,
        itl_per_seq=0.0,
    )
    engine.start()
    reqs = [engine.submit(200, 100) for _ in range(4)]
    assert [len(list(r.tokens())) for r in reqs] == [100] * 4
    g = vm.parse(engine.metrics("m"))["gauges"]
    assert g["num_preemptions_total"]["value"] > 0


class _Metrics:
    """What the fake server's /metrics answers, in turn (tests.harness.http.MetricsServer)."""

    texts = []


@pytest.fixture
def metrics_server():
    with MetricsServer(source=_Metrics) as server:
        yield server


def test_module_reports_and_fails_on_violation(run_module, metrics_server):
    url = "http://127.0.0.1:%d" % metrics_server.server_address[1]
    _Metrics.texts = [ENGINES]
    res = run_module("vllm_metrics_info", {"url": url, "samples": 2, "interval": 0.01})
    assert res.get("failed") and res["url"] == url + "/metrics"
    names = [v["name"] for v in res["violations"]]
    assert names == ["kv_cache_usage", "num_requests_waiting"], res
    assert "crossed 2 threshold(s)" in res["msg"]
    res = run_module(
        "vllm_metrics_info",
        {"url": url + "/metrics", "samples": 2, "interval": 0.01, "report_only": True},
        check_mode=True,
    )
    assert not res.get("failed") and res["healthy"] is False and res["changed"] is False
    assert res["metrics"]["ttft_seconds"]["p50"] == pytest.approx(0.1)
    _Metrics.texts = [sample("v0-qwenvl-old-names.prom")]
    res = run_module("vllm_metrics_info", {"url": url, "samples": 1, "interval": 0})
    assert not res.get("failed") and res["healthy"] is True, res
    assert res["metrics"]["names"]["kv_cache_usage_perc"] == "vllm:gpu_cache_usage_perc"


# --- llama.cpp: the real llama-server's /metrics -------------------------------------------------

LLAMA_KEY = "sk-llama-metrics-0123456789"


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    """The real llama-server (the cached CPU build) serving the tiny model, behind an API key."""
    with llamacpp.tiny_server(tmp_path_factory.mktemp("llama"), api_key=LLAMA_KEY) as server:
        yield server


def _complete(server, prompt="hello the world", max_tokens=8):
    body = json.dumps({"model": server.alias, "prompt": prompt, "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(
        server.url + "/v1/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {LLAMA_KEY}"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200


def test_llamacpp_server_is_judged_by_its_own_metrics(run_module, llama_server):
    """vllm_metrics_info on llama-server: its slots' gauges are the running and waiting figures,
    the counters it exports are finite, and the KV usage it does not export is judged as absent,
    never as zero; the key it needs is sent and never returned."""
    _complete(llama_server)
    res = run_module(
        "vllm_metrics_info", {"url": llama_server.url, "samples": 2, "interval": 0.2, "api_key": LLAMA_KEY}
    )
    assert not res.get("failed") and res["healthy"] is True and res["violations"] == [], res
    metrics = res["metrics"]
    assert metrics["names"] == {
        "num_requests_running": "llamacpp:requests_processing",
        "num_requests_waiting": "llamacpp:requests_deferred",
    }
    assert metrics["num_requests_running"] == 0 and metrics["num_requests_waiting"] == 0, metrics
    assert metrics["kv_cache_usage_perc"] is None and metrics["kv_cache_usage_perc_peak"] is None
    assert metrics["ttft_seconds"]["scope"] == "absent" and metrics["num_preemptions_total"] is None
    assert LLAMA_KEY not in json.dumps(res)


def test_llamacpp_server_without_its_key_is_no_scrape(run_module, llama_server):
    res = run_module("vllm_metrics_info", {"url": llama_server.url, "samples": 1, "interval": 0})
    assert res["failed"] and "answered HTTP 401" in res["msg"], res
    res = run_module("vllm_metrics_info", {"url": llama_server.url, "samples": 1, "api_key": "not-" + LLAMA_KEY})
    assert res["failed"] and "answered HTTP 401" in res["msg"], res


def test_llamacpp_server_metrics_parse_as_the_parser_expects(llama_server):
    """The real exposition, parsed: every llamacpp: family the parser reads is there by its name."""
    req = urllib.request.Request(llama_server.url + "/metrics", headers={"Authorization": f"Bearer {LLAMA_KEY}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        text = resp.read().decode()
    read = {name for names in vm.GAUGES.values() for name in names if name.startswith("llamacpp:")}
    assert read == {"llamacpp:requests_processing", "llamacpp:requests_deferred"}
    exported = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert read <= exported, exported
    values = vm.gauge_values(vm.parse(text))
    assert values["num_requests_running"] == 0.0 and values["kv_cache_usage_perc"] is None


def test_module_names_an_unreachable_server(run_module):
    res = run_module("vllm_metrics_info", {"url": "http://127.0.0.1:9", "samples": 1, "timeout": 2})
    assert res["failed"] and "cannot scrape http://127.0.0.1:9/metrics" in res["msg"]


def test_module_names_the_missing_library(tmp_path):
    """A target without prometheus_client: the module fails naming the package (no fallback)."""
    blocker = tmp_path / "prometheus_client"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('No module named prometheus_client')\n")
    repo = Path(__file__).resolve().parents[2]
    payload = {"ANSIBLE_MODULE_ARGS": {"url": "http://127.0.0.1:9"}}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(repo / ".collections"), str(repo)]))
    proc = subprocess.run(
        [sys.executable, str(repo / "plugins/modules/vllm_metrics_info.py")],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    res = json.loads(proc.stdout)
    assert res["failed"] and "prometheus-client" in res["msg"], res


# --- numbers nobody measured ----------------------------------------------------------------------

QUIET = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 0.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 5.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 5.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.4
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.05",model_name="m"} 90.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 100.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 100.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 3.0
"""


def _spoil(sample_prefix, value, text=QUIET):
    lines = [
        line.rsplit(" ", 1)[0] + " " + value if line.startswith(sample_prefix) else line for line in text.splitlines()
    ]
    assert lines != text.splitlines(), sample_prefix
    return "\n".join(lines) + "\n"


SPOILED = [
    ("vllm:kv_cache_usage_perc{", "NaN"),  # the example: a NaN gauge on a quiet server
    ("vllm:kv_cache_usage_perc{", "+Inf"),
    ("vllm:num_requests_waiting{", "NaN"),
    ("vllm:num_requests_running{", "-Inf"),
    ("vllm:num_preemptions_total{", "NaN"),  # a counter
    ('vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1"', "NaN"),  # a bucket
    ('vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"', "+Inf"),
    ("vllm:time_to_first_token_seconds_sum{", "NaN"),  # a histogram sum
    ("vllm:inter_token_latency_seconds_count{", "Inf"),
    ("vllm:kv_cache_usage_perc{", "-0.5"),  # never negative either
]


def test_non_finite_metrics_fail_reference_is_healthy():
    metrics, _samples, violations = vm.summarize(window(vm.parse(QUIET)))
    assert not violations and metrics["kv_cache_usage_perc"] == 0.2


@pytest.mark.parametrize("prefix,value", SPOILED)
def test_non_finite_metrics_fail(prefix, value):
    with pytest.raises(vm.MetricsError, match="not finite non-negative figures") as failed:
        vm.parse(_spoil(prefix, value))
    assert prefix.split("{")[0] in str(failed.value)


def test_non_finite_metrics_fail_also_in_older_names_and_other_engines():
    text = sample("v0-qwenvl-old-names.prom").replace(
        'vllm:gpu_cache_usage_perc{model_name="qwenvl"} 0.0', 'vllm:gpu_cache_usage_perc{model_name="qwenvl"} NaN'
    )
    with pytest.raises(vm.MetricsError, match="gpu_cache_usage_perc"):
        vm.parse(text)
    with pytest.raises(vm.MetricsError, match=r'engine="1"'):
        vm.parse(_spoil('vllm:kv_cache_usage_perc{engine="1"', "NaN", ENGINES))


def test_non_finite_metrics_fail_but_unused_series_do_not_matter():
    scrape = vm.parse(QUIET + "# TYPE vllm:other_gauge gauge\nvllm:other_gauge NaN\n")
    assert scrape["gauges"]["kv_cache_usage_perc"]["value"] == 0.2


def test_non_finite_metrics_fail_in_the_module(run_module, metrics_server):
    url = "http://127.0.0.1:%d" % metrics_server.server_address[1]
    _Metrics.texts = [QUIET]
    assert run_module("vllm_metrics_info", {"url": url, "samples": 1})["healthy"] is True
    _Metrics.texts = [_spoil("vllm:kv_cache_usage_perc{", "NaN")]
    res = run_module("vllm_metrics_info", {"url": url, "samples": 1, "report_only": True})
    assert res["failed"] and "healthy" not in res, res
    assert "vllm:kv_cache_usage_perc" in res["msg"] and "did not measure" in res["msg"]


@pytest.mark.parametrize(
    "option,value",
    [
        ("max_kv_cache_usage", "nan"),
        ("max_kv_cache_usage", "inf"),
        ("max_kv_cache_usage", -0.1),
        ("max_kv_cache_usage", 1.5),
        ("max_ttft_p95_seconds", "nan"),
        ("max_num_requests_waiting", -1),
        ("waiting_sustained_samples", 0),
        ("max_preemptions", -1),
        ("interval", "nan"),
        ("interval", -1),
        ("samples", 0),
        ("timeout", "nan"),
        ("timeout", 0),
        ("max_bytes", 0),
    ],
)
def test_non_finite_threshold_refused(run_module, option, value):
    res = run_module("vllm_metrics_info", {"url": "http://127.0.0.1:9", option: value})
    assert res["failed"] and option in res["msg"] and "cannot scrape" not in res["msg"], res
