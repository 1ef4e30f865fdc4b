# SPDX-License-Identifier: GPL-3.0-or-later
"""The serving probe's rule (module_utils serving/_probe): forward progress read from the engines'
own /metrics, the verdict of each case, the record and how the readiness rule reads it.

vLLM samples: tests/data/vllm-metrics/v0.33.0-two-engines.prom (vLLM 0.33.0's own exporter, see
its SOURCE.md), whose generated-token family keeps only its HELP and TYPE lines there: one sample
line per engine is added as the exporter writes them (same labels, a counter's float), and
v0.4-bloom560m-ttft.prom (a served 0.4). llama-server: the exposition its `/metrics` writes
(llama.cpp tools/server/server.cpp, `--metrics`), as tests/unit/test_llamaplan.py uses it; the
real server's is read in tests/integration/test_serving_probe_llamacpp.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _readiness
from ansible_collections.gpufleet.node.plugins.module_utils.serving import _probe, _probe_record

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm-metrics"
BOOT = "2b95257e-cc50-4a2b-8260-36f6af9dc4dc"
LABELS = 'engine="{}",model_name="Llama-3.3-70B-Instruct-FP8"'


def vllm_033(generated=(1200.0, 800.0)):
    """The 0.33.0 exporter's sample with a generation_tokens_total line per engine."""
    text = (DATA / "v0.33.0-two-engines.prom").read_text()
    marker = "# TYPE vllm:generation_tokens_total counter\n"
    assert marker in text
    lines = "".join(f"vllm:generation_tokens_total{{{LABELS.format(n)}}} {v}\n" for n, v in enumerate(generated))
    return text.replace(marker, marker + lines)


def llamacpp(predicted=8, processing=2, deferred=3):
    return (
        "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
        "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 12\n"
        "# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.\n"
        f"# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total {predicted}\n"
        "# HELP llamacpp:requests_processing Number of requests processing.\n"
        f"# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing {processing}\n"
        "# HELP llamacpp:requests_deferred Number of requests deferred.\n"
        f"# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred {deferred}\n"
    )


#: The readers of the exposition: the sample lines read here always, and prometheus_client's where
#: it is installed (on the controller always: a pinned dependency; a node's Python may lack it, as
#: the node-Python tier's do).
PARSERS = ["sample lines"] + (["prometheus_client"] if _probe.text_string_to_metric_families is not None else [])


@pytest.fixture(params=PARSERS)
def parser(request, monkeypatch):
    """Each reader of the exposition: prometheus_client's, and the sample lines without it."""
    if request.param == "sample lines":
        monkeypatch.setattr(_probe, "text_string_to_metric_families", None)
    return request.param


def test_vllm_progress_sums_the_engines(parser):
    # running 5 + 2, waiting 1 + 0 (the sample's own figures); generated 1200 + 800
    assert _probe.progress(vllm_033()) == {"generated": 2000.0, "active": 8.0}


def test_vllm_04_sample_has_no_running_gauge(parser):
    """An exposition without one of the figures cannot show progress: it is named."""
    with pytest.raises(_probe.ProbeError, match=r"no running-requests gauge \(vllm:num_requests_running or"):
        _probe.progress((DATA / "v0.4-bloom560m-ttft.prom").read_text())


def test_llamacpp_progress(parser):
    assert _probe.progress(llamacpp()) == {"generated": 8.0, "active": 5.0}


@pytest.mark.parametrize(
    "text, match",
    [
        ("<html>502 Bad Gateway</html>", "not Prometheus text exposition"),
        (llamacpp().replace("tokens_predicted_total 8", "tokens_predicted_total NaN"), "not a finite non-negative"),
        (llamacpp().replace("requests_deferred 3", "requests_deferred -1"), "not a finite non-negative"),
    ],
)
def test_unreadable_metrics_are_errors(parser, text, match):
    with pytest.raises(_probe.ProbeError, match=match):
        _probe.progress(text)


BEFORE = _probe.progress(vllm_033((1200.0, 800.0)))
ROSE = _probe.progress(vllm_033((1260.0, 815.0)))
FROZEN = _probe.progress(vllm_033((1200.0, 800.0)))
IDLE = _probe.progress(llamacpp(predicted=8, processing=0, deferred=0))


def test_an_answer_in_time_is_serving():
    assert _probe.judge(200, None, None, False) == ("serving", "a one-token completion answered in time")


def test_slow_with_rising_tokens_is_busy():
    verdict, reason = _probe.judge(None, BEFORE, ROSE, True)
    assert verdict == "busy" and "8 request(s) run or wait and 75 token(s) were generated" in reason


def test_slow_with_frozen_counters_is_wedged():
    verdict, reason = _probe.judge(None, BEFORE, FROZEN, True)
    assert verdict == "wedged" and reason.endswith("8 request(s) run or wait, generated tokens frozen at 2000")


def test_slow_with_nothing_running_is_wedged():
    """Tokens that rose while nothing runs or waits any more: the probe itself did not get them."""
    before = _probe.progress(llamacpp(predicted=5, processing=0, deferred=0))
    verdict, reason = _probe.judge(None, before, IDLE, True)
    assert verdict == "wedged" and "0 request(s) run or wait, generated tokens rose with nothing running" in reason


def test_a_counter_reset_with_work_is_progress():
    """The engine restarted between the samples (the counter went back) and generates again."""
    after = _probe.progress(llamacpp(predicted=3, processing=1, deferred=0))
    assert _probe.judge(None, _probe.progress(llamacpp(predicted=900)), after, True)[0] == "busy"


def test_slow_with_unreadable_metrics_is_down():
    verdict, reason = _probe.judge(None, BEFORE, None, True, "http://x/metrics: it answered HTTP 500, not 200")
    assert verdict == "down" and "cannot be read: http://x/metrics: it answered HTTP 500" in reason
    assert _probe.judge(None, None, ROSE, True)[0] == "down"


@pytest.mark.parametrize(
    "status, problem, reason",
    [
        (503, "Service Unavailable", "the completion answered HTTP 503, not 200: Service Unavailable"),
        (401, None, "the completion answered HTTP 401, not 200"),
        (
            None,
            "ConnectionRefusedError: [Errno 111] Connection refused",
            "the completion failed: ConnectionRefusedError",
        ),
    ],
)
def test_refused_or_an_error_status_is_down(status, problem, reason):
    verdict, said = _probe.judge(status, BEFORE, None, False, problem)
    assert verdict == "down" and said.startswith(reason), said


def test_the_request_is_one_token_and_priority_only_when_asked():
    assert json.loads(_probe.completion_body("m")) == {
        "model": "m",
        "prompt": "ping",
        "max_tokens": 1,
        "temperature": 0,
    }
    assert json.loads(_probe.completion_body("m", -10))["priority"] == -10


def test_max_age_covers_the_longest_cycle():
    # interval 5, deadline 10: a cycle of at most 10 + 2 x 5 s of scrapes; two of them and 5 s
    assert _probe_record.max_age(5, 10) == 45.0
    assert _probe_record.max_age(60, 2) == 125.0


# -- the record and the readiness rule -----------------------------------------------------------
def files(tmp_path, probe=None, raw=None, marker=True):
    (tmp_path / "boot_id").write_text(BOOT + "\n")
    if marker:
        (tmp_path / "nccl-gate.json").write_text(json.dumps({"boot_id": BOOT, "passed": True}))
    path = tmp_path / _probe_record.RECORD_FILE
    if raw is not None:
        path.write_text(raw)
    elif probe is not None:
        path.write_text(json.dumps(probe))
    return str(tmp_path / "nccl-gate.json"), str(tmp_path / "boot_id"), str(path)


#: The time the readiness rule judges at (records are stamped relative to it).
NOW = 1764650000.0


def verdict(tmp_path, probe=None, raw=None, max_age=45.0, marker=True):
    marker_path, boot_id, record = files(tmp_path, probe, raw, marker)
    return _readiness.agent_verdict(marker_path, boot_id, probe_path=record, probe_max_age=max_age, now=NOW)


def rec(verdict_, reason="r", boot_id=BOOT, age=1.0):
    return _probe_record.record(verdict_, reason, boot_id, 0.01, "vllm", 5.0, 10.0, now=NOW - age)


def test_record_fields():
    assert tuple(rec("serving")) == _probe_record.RECORD_FIELDS


@pytest.mark.parametrize("kept", ["serving", "busy"])
def test_serving_and_busy_keep_the_node_in(tmp_path, kept):
    assert verdict(tmp_path, rec(kept)) == (None, [])


@pytest.mark.parametrize(
    "probe, raw, word, reason",
    [
        (rec("wedged", "no progress"), None, "engine-wedged", "the serving probe finds the engine wedged: no progress"),
        (rec("down", "refused"), None, "engine-down", "the serving probe finds the engine down: refused"),
        (None, None, "probe-missing", "no serving probe record at {path}: the prober has not probed since boot"),
        (rec("serving", boot_id="old"), None, "probe-stale", "the serving probe record at {path} is not of this boot"),
        (rec("serving", age=60), None, "probe-stale", "the serving probe record at {path} is 60 s old (at most 45 s)"),
        (dict(rec("serving"), time="yesterday"), None, "probe-stale", "is not of this boot"),
        (dict(rec("serving"), time=True), None, "probe-stale", "is not of this boot"),
        (dict(rec("fine")), None, "probe-unreadable", "has no verdict of serving, busy, wedged, down"),
        (None, "{broken", "probe-unreadable", "unreadable serving probe record at {path}: Expecting"),
        (None, "[1, 2]", "probe-unreadable", "unreadable serving probe record at {path}: not a JSON object"),
        (None, "[" * 100000, "probe-unreadable", "unreadable serving probe record at {path}: nested too deep"),
    ],
)
def test_what_keeps_the_node_out(tmp_path, probe, raw, word, reason):
    got_word, reasons = verdict(tmp_path, probe, raw)
    path = str(tmp_path / _probe_record.RECORD_FILE)
    assert got_word == word and len(reasons) == 1 and reason.format(path=path) in reasons[0], reasons


def test_a_future_record_counts_as_fresh(tmp_path):
    """A record a second ahead (clocks read by two processes) is not stale."""
    assert verdict(tmp_path, rec("serving", age=-1)) == (None, [])


def test_the_gate_and_health_words_come_first(tmp_path):
    """The existing words are kept: a node without a gate says so, whatever the probe says."""
    word, _reasons = verdict(tmp_path, rec("wedged"), marker=False)
    assert word == "no-marker"


def test_without_a_prober_the_engine_is_not_judged(tmp_path):
    marker_path, boot_id, _record = files(tmp_path)
    assert _readiness.agent_verdict(marker_path, boot_id) == (None, [])


def test_a_verdict_nested_too_deep_is_unreadable_not_a_traceback(tmp_path):
    """json's recursion limit: a GPU health verdict (or marker) thousands of arrays deep."""
    marker_path, boot_id, _record = files(tmp_path)
    (tmp_path / "gpu-health.json").write_text("[" * 100000)
    word, reasons = _readiness.agent_verdict(marker_path, boot_id)
    assert word == "health-unreadable" and reasons == [
        f"unreadable GPU health verdict at {tmp_path / 'gpu-health.json'}: nested too deep"
    ]
    (tmp_path / "gpu-health.json").unlink()
    (tmp_path / "nccl-gate.json").write_text("[" * 100000)
    word, reasons = _readiness.agent_verdict(marker_path, boot_id)
    assert word == "marker-unreadable" and reasons[0].endswith("nested too deep")
