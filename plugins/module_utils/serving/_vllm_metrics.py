# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vLLM's Prometheus ``/metrics``: the figures an operator judges a serving node by.

Parsing is done by ``prometheus_client``'s own text parser (``text_string_to_metric_families``);
this file only knows vLLM's metric names across releases and the arithmetic on top:

* gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``
  (vLLM before the V1 engine: ``vllm:gpu_cache_usage_perc``);
* the counter ``vllm:num_preemptions_total``;
* histograms ``vllm:time_to_first_token_seconds`` and ``vllm:inter_token_latency_seconds`` (older:
  ``vllm:time_per_output_token_seconds``), whose quantiles are computed from the cumulative
  buckets as Prometheus' ``histogram_quantile()`` does (linear interpolation inside a bucket).

A server with several engines (data parallel) or label sets reports one series per engine: counts
and histograms are summed over them; a KV-cache usage, being a fraction of each engine's own pool,
is reported as the fullest engine's (a sum of fractions means nothing).

Sampling over a window (``summarize``) uses the increase of the histograms between the first and
the last scrape, so the quantiles describe the window, not everything since the server started.

Samples it uses that are not finite non-negative numbers (NaN, +-Inf) fail the scrape, and
thresholds that are not finite numbers in their range are refused (``check_thresholds``): a
comparison with NaN is always false, so either would pass a server nobody measured.

No Ansible here; the only third-party import is prometheus_client (``MISSING_LIBRARY`` says so).
It imports nothing else of the collection: the worker-recycle agent copies it beside itself.
Fetching is ``_http``'s (the modules fetch, this file reads what they fetched).
"""

from __future__ import annotations

import math

try:
    from prometheus_client.parser import text_string_to_metric_families

    MISSING_LIBRARY = None
except ImportError as _exc:  # the module reports it with missing_required_lib()
    text_string_to_metric_families = None
    MISSING_LIBRARY = str(_exc)

LIBRARY = "prometheus-client"

# figure -> sample names, newest first (the first one present wins)
GAUGES = {
    "kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    # llama.cpp's llama-server (--metrics) names its slots' figures llamacpp:requests_processing
    # and llamacpp:requests_deferred; it has no KV usage, preemption or latency histogram series.
    "num_requests_running": ("vllm:num_requests_running", "llamacpp:requests_processing"),
    "num_requests_waiting": ("vllm:num_requests_waiting", "llamacpp:requests_deferred"),
    "num_preemptions_total": ("vllm:num_preemptions_total",),
}
# how series of several engines/labels combine
COMBINE = {"kv_cache_usage_perc": "max"}
HISTOGRAMS = {
    "ttft_seconds": ("vllm:time_to_first_token_seconds",),
    "itl_seconds": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
}
QUANTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))

DEFAULT_THRESHOLDS = {
    "max_kv_cache_usage": 0.88,
    "max_num_requests_waiting": 8,
    "waiting_sustained_samples": 3,
    "max_preemptions": 0,
    "max_ttft_p95_seconds": None,
}

ADVICE = {
    "kv_cache_usage": (
        "the KV cache is near full at peak: vLLM preempts and recomputes running requests and "
        "streams stall. Cap max_num_seqs so the pool holds the concurrency you admit, use an fp8 "
        "kv_cache_dtype, or give the model more GPUs (keep usage under {threshold} at peak)"
    ),
    "num_requests_waiting": (
        "a sustained waiting queue means prefill starvation: lower max_num_batched_tokens (e.g. "
        "4096 -> 2048) to interleave decode steps, or add capacity behind the balancer"
    ),
    "preemptions": (
        "preemptions are climbing: the KV pool is oversubscribed. Lower max_num_seqs (or the "
        "oversubscription factor of the plan), shorten max_model_len to the measured prompt p99, "
        "or use an fp8 KV cache; host swap is no remedy (vLLM V1 recomputes, and swapping turns a "
        "crash into a 40x slowdown)"
    ),
    "ttft_p95": (
        "TTFT p95 is above the target: look at the waiting queue and preemptions first; with both "
        "quiet, a TTFT that rises with resident memory is fragmentation (recycle the worker), one "
        "that rises with flat memory is placement or preemption"
    ),
}


#: Each threshold's range (inclusive): a value outside it, or not a finite number, is refused.
THRESHOLD_RANGES = {
    "max_kv_cache_usage": (0.0, 1.0),
    "max_num_requests_waiting": (0, math.inf),
    "waiting_sustained_samples": (1, math.inf),
    "max_preemptions": (0, math.inf),
    "max_ttft_p95_seconds": (0.0, math.inf),
}


class MetricsError(Exception):
    """A /metrics text that cannot be read as Prometheus exposition, or figures that cannot be judged."""


class ScrapeError(MetricsError):
    """No /metrics text came back (the message names the URL)."""


def judging_spec():
    """The options of every module that judges a vLLM server, for its argument_spec."""
    return {"max_ttft_p95_seconds": {"type": "float"}, "report_only": {"type": "bool", "default": False}}


def gauge_values(scrape):
    """{figure: value or None} of every gauge figure of a parsed scrape."""
    return {figure: (scrape["gauges"][figure]["value"] if figure in scrape["gauges"] else None) for figure in GAUGES}


def check_range(name, value, low, high=math.inf):
    """ValueError naming ``name`` unless ``value`` is a finite number from ``low`` to ``high``.

    A NaN compares false with every bound, so a threshold of ``nan`` would let everything pass:
    it is refused here, with infinities, before anything is measured."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        bounds = f"at least {low:g}" if math.isinf(high) else f"from {low:g} to {high:g}"
        raise ValueError(f"{name} must be a finite number {bounds}, got {value!r}")
    return value


def check_thresholds(thresholds):
    """ValueError naming the first threshold (None: not judged) outside ``THRESHOLD_RANGES``."""
    for name, value in thresholds.items():
        if value is not None and name in THRESHOLD_RANGES:
            check_range(name, value, *THRESHOLD_RANGES[name])


def _require_library():
    if text_string_to_metric_families is None:
        raise MetricsError("the Python library %s is required to parse /metrics (%s)" % (LIBRARY, MISSING_LIBRARY))


def _engine(labels):
    return labels.get("engine", "")


def parse(text):
    """Prometheus text -> a scrape: {'gauges': {figure: {...}}, 'histograms': {figure: {...}}}.

    Each gauge: ``value`` (combined over series), ``series`` (count), ``name`` (the vLLM name it
    came from), ``per_engine`` ({engine label: value}). Each histogram: ``buckets`` (sorted
    [(upper bound, cumulative count)] summed over series, +Inf last), ``count``, ``sum``, ``name``.
    Figures the server does not export are absent.
    """
    _require_library()
    samples = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsError("not Prometheus text exposition: %s" % exc) from None
    _refuse_non_finite(samples)
    scrape = {"gauges": {}, "histograms": {}, "engines": []}
    engines = set()
    for figure, names in GAUGES.items():
        for name in names:
            series = samples.get(name)
            if not series:
                continue
            per_engine = {}
            for labels, value in series:
                key = _engine(labels)
                engines.add(key)
                if COMBINE.get(figure) == "max":
                    per_engine[key] = max(per_engine.get(key, value), value)
                else:
                    per_engine[key] = per_engine.get(key, 0.0) + value
            values = [v for _labels, v in series]
            combined = max(values) if COMBINE.get(figure) == "max" else sum(values)
            scrape["gauges"][figure] = {
                "value": combined,
                "series": len(series),
                "name": name,
                "per_engine": per_engine,
            }
            break
    for figure, names in HISTOGRAMS.items():
        for name in names:
            buckets = samples.get(name + "_bucket")
            if not buckets:
                continue
            by_series = {}
            for labels, value in buckets:
                le = labels.pop("le", None)
                if le is None:
                    continue
                engines.add(_engine(labels))
                key = tuple(sorted(labels.items()))
                by_series.setdefault(key, []).append((float(le), value))
            merged = merge_buckets(list(by_series.values()))
            count = sum(v for _labels, v in samples.get(name + "_count", []))
            total = sum(v for _labels, v in samples.get(name + "_sum", []))
            scrape["histograms"][figure] = {
                "buckets": merged,
                "count": count,
                "sum": total,
                "name": name,
                "series": len(by_series),
            }
            break
    scrape["engines"] = sorted(engines)
    return scrape


def _used_names():
    for names in GAUGES.values():
        yield from names
    for names in HISTOGRAMS.values():
        for name in names:
            yield from (name + "_bucket", name + "_count", name + "_sum")


def _refuse_non_finite(samples):
    """MetricsError for a NaN, an infinity or a negative value among the samples judged.

    Every figure read here (counts, a fraction, latencies) is finite and never negative: a
    server that exports anything else did not measure it, and a comparison with NaN is always
    false, so judging it would pass anything. The ``le="+Inf"`` bucket bound is a label, not a
    value, and stays allowed."""
    bad = []
    for name in _used_names():
        for labels, value in samples.get(name, ()):
            if not math.isfinite(value) or value < 0:
                where = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                bad.append(f"{name}{{{where}}} = {value}")
    if bad:
        raise MetricsError(
            "the server exports %d sample(s) that are not finite non-negative figures (%s%s): "
            "it reports numbers it did not measure, so the scrape fails; look at the server's "
            "engine and its metrics export" % (len(bad), "; ".join(bad[:3]), "; ..." if len(bad) > 3 else "")
        )


def merge_buckets(series):
    """Sum cumulative bucket lists of several series (their bounds may differ).

    A series' cumulative count at a bound it does not have is its count at its largest bound
    below it (a cumulative distribution is a step function), so the sum stays cumulative.
    """
    bounds = sorted({b for s in series for b, _c in s})
    merged = []
    for bound in bounds:
        total = 0.0
        for s in series:
            below = [c for b, c in sorted(s) if b <= bound]
            total += below[-1] if below else 0.0
        merged.append((bound, total))
    return merged


def histogram_quantile(q, buckets):
    """Quantile q (0..1) from cumulative buckets [(upper bound, count)], as Prometheus computes it.

    Returns None when there are no observations. The first bucket's lower bound is 0 (latencies
    are positive); a rank that falls in the +Inf bucket returns the largest finite bound.
    """
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    if not math.isinf(buckets[-1][0]):
        # without +Inf the total is unknown beyond the last bound; treat the last as the total
        buckets = buckets + [(float("inf"), buckets[-1][1])]
    total = buckets[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank and count > prev_count:
            if math.isinf(bound):
                return prev_bound if prev_bound > 0 else None
            lower = prev_bound if prev_bound < bound else 0.0
            return lower + (bound - lower) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


def quantiles(buckets):
    return {key: _round(histogram_quantile(q, buckets)) for key, q in QUANTILES}


def delta_buckets(later, earlier):
    """The increase of a cumulative histogram between two scrapes (a reset restarts from zero)."""
    if not earlier:
        return list(later)
    before = dict(earlier)
    if later and later[-1][1] < before.get(later[-1][0], 0.0):
        return list(later)  # the server restarted between the scrapes
    return [(b, max(0.0, c - before.get(b, 0.0))) for b, c in later]


def _round(value, digits=6):
    return None if value is None else round(value, digits)


def summarize(scrapes, interval=0.0, thresholds=None):
    """Judge a window of scrapes [(unix time, scrape)], oldest first.

    Returns (metrics, samples, violations). ``metrics`` holds the last scrape's gauges under the
    issue's names plus window figures (peaks, the preemption increase, histogram quantiles over the
    window); ``violations`` is a list of {'name', 'value', 'threshold', 'message'}.
    """
    if not scrapes:
        raise MetricsError("no scrape to judge")
    limits = dict(DEFAULT_THRESHOLDS)
    limits.update({k: v for k, v in (thresholds or {}).items() if v is not None or k == "max_ttft_p95_seconds"})
    try:
        check_thresholds(limits)
    except ValueError as exc:
        raise MetricsError(str(exc)) from None

    def gauge(scrape, figure):
        return gauge_values(scrape)[figure]

    samples = [dict({"time": round(stamp, 3)}, **gauge_values(scrape)) for stamp, scrape in scrapes]
    first, last = scrapes[0][1], scrapes[-1][1]
    # vLLM exports its KV usage; llama.cpp's llama-server exports none (its figures are judged
    # without it, never as zero)
    running = last["gauges"].get("num_requests_running")
    llamacpp = running is not None and running["name"].startswith("llamacpp:")
    required = (
        ("num_requests_running", "num_requests_waiting")
        if llamacpp
        else (
            "kv_cache_usage_perc",
            "num_requests_running",
            "num_requests_waiting",
        )
    )
    missing = [f for f in required if f not in last["gauges"]]
    if missing:
        raise MetricsError(
            "the server does not export %s: is this vLLM's /metrics (or was it started "
            "with --disable-log-stats)?" % ", ".join(GAUGES[f][0] for f in missing)
        )

    def peak(figure):
        values = [s[figure] for s in samples if s[figure] is not None]
        return max(values) if values else None

    pre_first, pre_last = gauge(first, "num_preemptions_total"), gauge(last, "num_preemptions_total")
    if pre_first is None or pre_last is None:
        pre_delta = None
    else:
        pre_delta = pre_last - pre_first if pre_last >= pre_first else pre_last
    metrics = {
        "kv_cache_usage_perc": gauge(last, "kv_cache_usage_perc"),
        "kv_cache_usage_perc_peak": peak("kv_cache_usage_perc"),
        "num_requests_running": gauge(last, "num_requests_running"),
        "num_requests_running_peak": peak("num_requests_running"),
        "num_requests_waiting": gauge(last, "num_requests_waiting"),
        "num_requests_waiting_peak": peak("num_requests_waiting"),
        "num_preemptions_total": pre_last,
        "num_preemptions_window": pre_delta,
        "engines": len(last["engines"]) or 1,
        "names": {f: e["name"] for f, e in sorted(last["gauges"].items())},
        "window_seconds": round(scrapes[-1][0] - scrapes[0][0], 3),
        "samples": len(scrapes),
    }
    for figure in HISTOGRAMS:
        hist = last["histograms"].get(figure)
        if not hist:
            metrics[figure] = dict({k: None for k, _q in QUANTILES}, count=0, scope="absent")
            continue
        earlier = first["histograms"].get(figure) if len(scrapes) > 1 else None
        window = delta_buckets(hist["buckets"], earlier["buckets"] if earlier else None)
        if earlier is not None and window and window[-1][1] > 0:
            buckets, scope = window, "window"
        else:
            buckets, scope = hist["buckets"], "since_start"
        entry = quantiles(buckets)
        entry.update(count=int(buckets[-1][1]) if buckets else 0, scope=scope)
        metrics[figure] = entry
        metrics["names"][figure] = hist["name"]

    violations = []
    kv_peak = metrics["kv_cache_usage_perc_peak"]
    if kv_peak is not None and kv_peak >= limits["max_kv_cache_usage"]:
        violations.append(
            _violation(
                "kv_cache_usage",
                kv_peak,
                limits["max_kv_cache_usage"],
                "KV-cache usage peaked at %.3f (limit %.2f)" % (kv_peak, limits["max_kv_cache_usage"]),
            )
        )
    waits = [s["num_requests_waiting"] or 0 for s in samples]
    need = max(1, min(int(limits["waiting_sustained_samples"]), len(waits)))
    run = longest = 0
    for w in waits:
        run = run + 1 if w > limits["max_num_requests_waiting"] else 0
        longest = max(longest, run)
    if longest >= need:
        violations.append(
            _violation(
                "num_requests_waiting",
                max(waits),
                limits["max_num_requests_waiting"],
                "%d request(s) waiting, above %d for %d consecutive sample(s) of %d (%.0f s apart)"
                % (max(waits), limits["max_num_requests_waiting"], longest, len(waits), float(interval or 0)),
            )
        )
    if pre_delta is not None and len(scrapes) > 1 and pre_delta > limits["max_preemptions"]:
        violations.append(
            _violation(
                "preemptions",
                pre_delta,
                limits["max_preemptions"],
                "%d preemption(s) during the %.0f s window (allowed %d)"
                % (pre_delta, float(scrapes[-1][0] - scrapes[0][0]), limits["max_preemptions"]),
            )
        )
    p95 = metrics["ttft_seconds"].get("p95")
    if limits.get("max_ttft_p95_seconds") is not None and p95 is not None and p95 > limits["max_ttft_p95_seconds"]:
        violations.append(
            _violation(
                "ttft_p95",
                p95,
                limits["max_ttft_p95_seconds"],
                "TTFT p95 %.3f s (limit %.3f s)" % (p95, float(limits["max_ttft_p95_seconds"])),
            )
        )
    return metrics, samples, violations


def scrape_window(fetch, count, interval, sleep=None, clock=None):
    """Call ``fetch()`` (returns /metrics text) ``count`` times, ``interval`` seconds apart.

    Returns [(unix time, parsed scrape)]. A fetch or parse error propagates (MetricsError or the
    fetcher's own exception).
    """
    import time

    sleep = sleep or time.sleep
    clock = clock or time.time
    scrapes = []
    for index in range(max(1, int(count))):
        if index:
            sleep(interval)
        scrapes.append((clock(), parse(fetch())))
    return scrapes


def _violation(name, value, threshold, what):
    advice = ADVICE[name].format(threshold=threshold)
    return {"name": name, "value": value, "threshold": threshold, "message": "%s: %s" % (what, advice)}
