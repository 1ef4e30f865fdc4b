# SPDX-License-Identifier: GPL-3.0-or-later
"""The one textfile builder (plugins/module_utils/common/_textfile.py): what it writes is read
back by prometheus_client's parser of the text format (the reference client's), label values with
a double quote, a backslash and a line feed included; names the format refuses are refused here.
The four writers that use it (GPU health history, serving prober, worker recycle, drift report)
read back the same way."""

from __future__ import annotations

import importlib.util
import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.gpufleet.node.plugins.action.drift_report import prometheus
from ansible_collections.gpufleet.node.plugins.module_utils.common import _textfile
from ansible_collections.gpufleet.node.plugins.module_utils.health import _history
from ansible_collections.gpufleet.node.plugins.module_utils.serving import _recycle
from tests.harness import REPO

AWKWARD = 'a "quoted" C:\\path\nsecond line'


def parsed(text):
    """{metric: (type, help, [(labels, value)])} as prometheus_client reads ``text``."""
    return {
        f.name: (f.type, f.documentation, [(s.labels, s.value) for s in f.samples])
        for f in text_string_to_metric_families(text)
    }


def test_a_label_with_a_quote_a_backslash_and_a_line_feed_reads_back():
    out = _textfile.Exposition()
    out.metric("gpufleet_test_info", "gauge", "Help with a \\ and a\nline feed.", [({"gpu": AWKWARD, "code": 79}, 1)])
    text = out.text()
    # one sample line: the line feed is escaped, not written
    assert text.splitlines()[2] == 'gpufleet_test_info{gpu="a \\"quoted\\" C:\\\\path\\nsecond line",code="79"} 1'
    assert parsed(text) == {
        "gpufleet_test_info": ("gauge", "Help with a \\ and a\nline feed.", [({"gpu": AWKWARD, "code": "79"}, 1.0)])
    }


def test_values_families_without_samples_and_none():
    out = _textfile.Exposition()
    out.metric("gpufleet_a", "gauge", "A.", [((), 3), ((("k", "x"),), None), ((("k", "y"),), True)])
    out.metric("gpufleet_b_seconds", "gauge", "B.", [((), 1.7e9 + 0.12345)], decimals=3)
    out.metric("gpufleet_c", "gauge", "C.", [((), float("nan")), ((("s", "up"),), float("inf"))])
    out.metric("gpufleet_d_total", "counter", "D.", [])
    out.metric("gpufleet_e", "untyped", "E.", [((), 0.25)])
    text = out.text()
    assert text.splitlines() == [
        "# HELP gpufleet_a A.",
        "# TYPE gpufleet_a gauge",
        "gpufleet_a 3",
        'gpufleet_a{k="y"} 1',
        "# HELP gpufleet_b_seconds B.",
        "# TYPE gpufleet_b_seconds gauge",
        "gpufleet_b_seconds 1700000000.123",
        "# HELP gpufleet_c C.",
        "# TYPE gpufleet_c gauge",
        "gpufleet_c NaN",
        'gpufleet_c{s="up"} +Inf',
        "# HELP gpufleet_d_total D.",
        "# TYPE gpufleet_d_total counter",
        "# HELP gpufleet_e E.",
        "# TYPE gpufleet_e untyped",
        "gpufleet_e 0.25",
    ]
    families = parsed(text)
    assert families["gpufleet_a"][2] == [({}, 3.0), ({"k": "y"}, 1.0)]
    assert families["gpufleet_b_seconds"][2] == [({}, 1700000000.123)]
    (nan, inf) = families["gpufleet_c"][2]
    assert math.isnan(nan[1]) and inf == ({"s": "up"}, math.inf)
    assert families["gpufleet_d"][:2] == ("counter", "D.")  # the reader drops a counter's _total
    assert families["gpufleet_e"][0] == "unknown"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda out: out.metric("gpufleet-bad", "gauge", "x"), "'gpufleet-bad' is not a metric name"),
        (lambda out: out.metric("9lives", "gauge", "x"), "'9lives' is not a metric name"),
        (lambda out: out.metric("gpufleet_x", "histogram", "x"), "gpufleet_x: type 'histogram', not one of"),
        (lambda out: out.metric("gpufleet_x", "gauge", "x", [({"bad-name": 1}, 1)]), "'bad-name' is not a label name"),
        (lambda out: out.metric("gpufleet_x", "gauge", "x", [({"__name__": 1}, 1)]), "'__name__' is not a label"),
        (lambda out: out.metric("gpufleet_x", "gauge", "x", [((("a", 1), ("a", 2)), 1)]), "a label given twice"),
        (lambda out: out.metric("gpufleet_x", "gauge", "x", [((), "1")]), "must be a number, got '1'"),
        (lambda out: out.metric("gpufleet_x", "gauge", "x").metric("gpufleet_x", "gauge", "x"), "given twice"),
    ],
)
def test_what_the_format_refuses_is_refused(call, message):
    with pytest.raises(_textfile.TextfileError) as err:
        call(_textfile.Exposition())
    assert message in str(err.value)


def _prober():
    spec = importlib.util.spec_from_file_location(
        "gpufleet_serving_probe", REPO / "roles" / "lb_registration" / "files" / "gpufleet_serving_probe.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_writers_read_back():
    history = _history.empty()
    history["events"] = [
        {"boot_id": "b1", "gpu": AWKWARD, "code": 79, "count": 2, "first_seen": 1.0, "last_seen": 2.5, "scope": "gpu"}
    ]
    history["holds"] = [{"gpu": AWKWARD, "code": 79, "boots": ["b0", "b1"]}]
    families = parsed(_history.textfile(history, "b1"))
    assert families["gpufleet_gpu_health_xid_count"][2] == [
        ({"gpu": AWKWARD, "code": "79", "scope": "boot"}, 2.0),
        ({"gpu": AWKWARD, "code": "79", "scope": "history"}, 2.0),
    ]
    assert families["gpufleet_gpu_health_hold_xid"][2] == [({"gpu": AWKWARD, "code": "79"}, 1.0)]
    assert families["gpufleet_gpu_health_xid_last_seen_timestamp_seconds"][2] == [({"gpu": AWKWARD, "code": "79"}, 2.5)]

    recycle = parsed(_recycle.textfile({"rss_bytes": 7}, {"recycles": 2, "last_recycle_kind": "fragmentation"}))
    assert recycle["gpufleet_worker_rss_bytes"][2] == [({}, 7.0)]
    assert recycle["gpufleet_worker_recycles"][0] == "counter"
    assert recycle["gpufleet_worker_last_recycle_kind"][2] == [({"kind": "fragmentation"}, 1.0)]

    probe = parsed(_prober().textfile(_textfile, "busy", 9.9, 1.7e9, 10.0))
    assert probe["gpufleet_serving_probe_verdict"][2] == [
        ({"verdict": v}, 1.0 if v == "busy" else 0.0) for v in ("serving", "busy", "wedged", "down")
    ]
    assert probe["gpufleet_serving_probe_duration_seconds"][2] == [({}, 9.9)]
    assert probe["gpufleet_serving_probe_deadline_seconds"][2] == [({}, 10.0)]
    drift = parsed(prometheus({AWKWARD: [{"kind": "changed"}], "n2": []}, [AWKWARD], 1700000000))
    assert drift["gpufleet_drift_detected"][2] == [({"node": AWKWARD}, 1.0), ({"node": "n2"}, 0.0)]
    unanswered = parsed(_prober().textfile(_textfile, "down", None, 1.7e9, 10.0))
    assert math.isnan(unanswered["gpufleet_serving_probe_duration_seconds"][2][0][1])
