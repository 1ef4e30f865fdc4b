# SPDX-License-Identifier: GPL-3.0-or-later
"""The load test: its figures against the lab's vLLM stand-in with a known latency, the server's
queue seen during the run, the table, and the refusal of hosts outside the inventory."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.serving import _loadtest as lt
from ansible_collections.gpufleet.node.plugins.module_utils.serving import _vllm_metrics as vm

REPO = Path(__file__).resolve().parents[2]
VLLM = REPO / "lab" / "bin" / "vllm"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# the stand-in's latency model: a step of ITL + ITL_PER_SEQ x decoding + prefill tokens / PREFILL_TPS
ITL, ITL_PER_SEQ, PREFILL_TPS = 0.02, 0.0, 10000.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_standin(node, tmp_path, max_num_seqs=64, **env_extra):
    port = free_port()
    cfg = tmp_path / ("vllm-%d.yaml" % port)
    cfg.write_text(
        "model: %s\nhost: 127.0.0.1\nport: %d\nmax_model_len: 4096\nmax_num_seqs: %d\n" % (MODEL, port, max_num_seqs)
    )
    env = dict(
        os.environ,
        GPUFLEET_LAB_ROOT=str(node.root),
        GPUFLEET_LAB_VLLM_STARTUP_S="0",
        GPUFLEET_LAB_VLLM_ITL_S=str(ITL),
        GPUFLEET_LAB_VLLM_ITL_PER_SEQ_S=str(ITL_PER_SEQ),
        GPUFLEET_LAB_VLLM_PREFILL_TPS=str(PREFILL_TPS),
        **env_extra,
    )
    proc = subprocess.Popen(
        [sys.executable, str(VLLM), "serve", "--config", str(cfg)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = "http://127.0.0.1:%d" % port
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return proc, url
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("the stand-in did not come up")


@pytest.fixture
def standin(lab_node, tmp_path):
    node = lab_node("l40s-4x-switch")
    started = []

    def start(**kw):
        proc, url = start_standin(node, tmp_path, **kw)
        started.append(proc)
        return url

    yield start
    for proc in started:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def sampler_for(url):
    def sampler():
        scrape = vm.parse(urllib.request.urlopen(url + "/metrics", timeout=5).read().decode())
        return {f: (scrape["gauges"][f]["value"] if f in scrape["gauges"] else None) for f in vm.GAUGES}

    return sampler


def test_percentile_is_numpys_linear():
    assert lt.percentile([], 50) is None
    assert lt.percentile([1.0], 99) == 1.0
    assert lt.percentile([1, 2, 3, 4], 50) == 2.5
    assert lt.percentile(list(range(101)), 95) == 95


def test_figures_match_the_stand_ins_known_latency(standin):
    url = standin()
    assert lt.served_model(url) == MODEL
    results, wall, samples = lt.run(
        url,
        MODEL,
        concurrency=1,
        duration=1.5,
        prompt_lengths=[128, 512, 2048],
        max_tokens=8,
        sampler=sampler_for(url),
        sample_interval=0.5,
    )
    summary, server, violations = lt.summarize(results, wall, samples)
    assert violations == [] and summary["errors"] == 0 and summary["requests"] >= 4
    for length in (128, 512, 2048):
        entry = summary["by_prompt_length"][str(length)]
        # The first token cannot come before the stand-in's step: its decode time plus the prompt's
        # prefill (the measurement starts before the request and ends at the first token). The
        # upper bound only catches a runaway figure; how close the figures come is no assertion
        # here (scheduling on a loaded runner adds its own delay).
        expected = ITL + length / PREFILL_TPS
        assert expected - 0.002 <= entry["ttft_p50"] <= expected + 2, (length, entry)
    assert ITL - 0.002 <= summary["itl_seconds"]["p50"] <= ITL + 2
    assert summary["output_tokens"] == 8 * summary["completed"]
    # one client, one request at a time: tokens/s is the output over the wall time
    assert summary["output_tokens_per_second"] == pytest.approx(summary["output_tokens"] / wall, rel=0.01)
    assert server["samples"] >= 3 and server["num_requests_waiting_peak"] == 0
    assert server["num_preemptions"] == 0
    text = "\n".join(lt.table(summary, server))
    assert "TTFT p50 / p95 / p99 (ms)" in text and "prompt 2048: n / TTFT p50 / p95 (ms)" in text


def test_over_capacity_the_queue_and_ttft_grow(standin):
    url = standin(max_num_seqs=2)
    results, wall, samples = lt.run(
        url,
        MODEL,
        concurrency=8,
        duration=1.5,
        prompt_lengths=[128],
        max_tokens=8,
        sampler=sampler_for(url),
        sample_interval=0.2,
    )
    summary, server, _v = lt.summarize(results, wall, samples, max_ttft_p95=0.1)
    # two run, six wait: a request waits for three generations of 8 tokens before its prefill
    assert server["num_requests_waiting_peak"] >= 4 and server["num_requests_running_peak"] == 2
    assert summary["ttft_seconds"]["p50"] > 3 * 7 * ITL
    assert _v and "TTFT p95" in _v[0]


def test_errors_are_counted_not_raised(standin):
    url = standin()
    # 4096 max_model_len: a 4090-token prompt plus 64 output tokens is refused by the server
    results, wall, _s = lt.run(url, MODEL, concurrency=2, duration=0.3, prompt_lengths=[4090], max_tokens=64)
    summary, _server, violations = lt.summarize(results, wall)
    assert summary["errors"] == summary["requests"] > 0
    assert "maximum context length is 4096 tokens" in summary["error_examples"][0]
    assert violations and violations[0].startswith("error rate 100.00%")
    bad = lt.one_request("http://127.0.0.1:9", MODEL, 8, 4, timeout=2)
    assert bad["error"] and bad["ttft"] is None


def test_only_inventory_hosts_are_targets():
    assert lt.check_target("http://10.213.5.2:8000", ["10.213.5.2", "node2"]) == "10.213.5.2"
    assert lt.check_target("http://localhost:8000", ["127.0.0.1", "localhost"]) == "localhost"
    # a listed name whose address is the URL's host
    assert lt.check_target("http://127.0.0.1:8000", ["localhost"]) == "127.0.0.1"
    for url, allowed in (
        ("http://10.213.5.3:8000", ["10.213.5.2"]),
        ("http://example.com", ["10.0.0.1"]),
        ("http://10.0.0.1:8000", []),
    ):
        with pytest.raises(lt.LoadTestError, match="refusing to send load|no allowed hosts"):
            lt.check_target(url, allowed)
    with pytest.raises(lt.LoadTestError, match="url must be"):
        lt.check_target("ftp://10.0.0.1/", ["10.0.0.1"])


def test_module_refuses_a_host_outside_the_inventory(run_module, standin):
    url = standin()
    before = urllib.request.urlopen(url + "/metrics").read()
    res = run_module("vllm_load_test", {"url": url, "allowed_hosts": ["10.213.1.2"], "duration": 1})
    assert res["failed"] and "refusing to send load to 127.0.0.1" in res["msg"]
    assert urllib.request.urlopen(url + "/metrics").read() == before  # not one request reached it
    res = run_module("vllm_load_test", {"url": url, "allowed_hosts": ["127.0.0.1"], "duration": 1}, check_mode=True)
    assert res.get("skipped") and not res.get("failed")


def test_module_end_to_end(run_module, standin):
    url = standin()
    res = run_module(
        "vllm_load_test",
        {
            "url": url,
            "allowed_hosts": ["127.0.0.1"],
            "concurrency": 2,
            "duration": 1,
            "prompt_lengths": [128, 512],
            "max_tokens": 4,
            "sample_interval": 0.3,
            "max_ttft_p95_seconds": 1.0,
        },
    )
    assert not res.get("failed"), res
    assert res["passed"] and res["model"] == MODEL and res["summary"]["errors"] == 0
    assert set(res["summary"]["by_prompt_length"]) == {"128", "512"}
    assert any(line.startswith("output tokens/s") for line in res["table"])
    assert res["server"]["samples"] >= 2
    res = run_module(
        "vllm_load_test",
        {
            "url": url,
            "allowed_hosts": ["127.0.0.1"],
            "concurrency": 1,
            "duration": 0.5,
            "max_tokens": 4,
            "max_ttft_p95_seconds": 0.001,
        },
    )
    assert res["failed"] and "TTFT p95" in res["msg"] and res["passed"] is False


@pytest.mark.parametrize(
    "option,value",
    [
        ("max_error_rate", "nan"),
        ("max_error_rate", 1.5),
        ("max_error_rate", -0.1),
        ("max_ttft_p95_seconds", "nan"),
        ("max_ttft_p95_seconds", "inf"),
        ("duration", "nan"),
        ("duration", 0),
        ("sample_interval", "nan"),
        ("timeout", "inf"),
        ("timeout", 0),
        ("max_bytes", 0),
        ("concurrency", 0),
        ("prompt_lengths", [128, 0]),
    ],
)
def test_non_finite_threshold_refused(run_module, option, value):
    """A limit that NaN would make always false (never crossed) is refused before a request."""
    res = run_module("vllm_load_test", {"url": "http://127.0.0.1:9", "allowed_hosts": ["127.0.0.1"], option: value})
    assert res["failed"] and "must" in res["msg"] and "cannot list" not in res["msg"], res
    assert option.split("_")[0] in res["msg"] or "prompt length" in res["msg"]


def test_run_options_are_run_parameters():
    import inspect

    assert set(lt.RUN_OPTIONS) <= set(inspect.signature(lt.run).parameters)
