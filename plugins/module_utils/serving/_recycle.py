# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Catching the slow decay of a vLLM worker (resident memory that keeps rising), and recycling it
on evidence.

Each run of the node's timer adds one sample: the server's resident memory (every process of its
systemd unit) and its TTFT p95 over the interval since the previous run (from the histogram's
increase). Over a window of samples:

* RSS rising steadily (least-squares slope above ``rss_slope_mib_per_min`` and most steps up) with
  p95 rising too: **fragmentation** (KV pool growth, allocator fragmentation) - recycle;
* RSS rising with a flat p95: **memory growth** - recycle before it costs latency;
* p95 rising with a flat RSS: **preemption or placement** - a restart would not help; reported
  with the advice to look at preemptions, the waiting queue and where the model landed;
* neither: **steady**.

Recycling: drain the node in the balancer, wait (bounded) until no request runs
(:func:`drain_wait`: a ``/metrics`` scrape that fails is never read as "none running"), restart
the server, wait for ``/health``, return it.
By default the node's recycle agent asks the node's own HAProxy agent to report ``drain`` (then
``ready``) and the balancer follows it; or it reaches the balancer through HAProxy's runtime API
with the collection's one client, ``_haproxy.RuntimeAPI`` (``tcp://HOST:PORT`` for a ``stats
socket ipv4@...`` listener, unauthenticated and admin level, or ``unix:///path`` on the balancer
itself), or through configured commands. Plain Python, no Ansible (the node's agent imports it too).
"""

from __future__ import annotations

import math
import time

from ansible_collections.gpufleet.node.plugins.module_utils.common import _textfile

MiB = 1024 * 1024
DEFAULTS = {
    "window": 12,  # samples judged
    "min_samples": 4,  # fewer: insufficient data
    "rss_slope_mib_per_min": 50.0,  # steady growth above this recycles
    "rss_rising_fraction": 0.7,  # share of steps that must go up ("steadily")
    "ttft_rise_ratio": 0.25,  # p95 rising: the fit grows by this fraction over the window
    "ttft_rise_min_seconds": 0.05,  # ... and by at least this much (bucket interpolation is noisy)
}


def slope(points):
    """Least-squares slope of [(x, y)]; None with fewer than two distinct x."""
    pts = [(float(x), float(y)) for x, y in points if y is not None]
    if len(pts) < 2:
        return None
    n = len(pts)
    mx = sum(x for x, _y in pts) / n
    my = sum(y for _x, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _y in pts)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in pts) / sxx


def judge(history, config=None):
    """history: [{'time', 'rss_bytes', 'ttft_p95'}] oldest first. Returns the verdict dict."""
    cfg = dict(DEFAULTS)
    cfg.update({k: v for k, v in (config or {}).items() if k in DEFAULTS and v is not None})
    window = history[-int(cfg["window"]) :]
    verdict = {
        "samples": len(window),
        "rss_bytes": window[-1]["rss_bytes"] if window else None,
        "ttft_p95_seconds": None,
        "rss_slope_mib_per_min": None,
        "ttft_p95_rise": None,
        "rss_rising": False,
        "ttft_rising": False,
        "classification": "insufficient_data",
        "recycle": False,
        "reason": "",
    }
    p95s = [h for h in window if h.get("ttft_p95") is not None]
    if p95s:
        verdict["ttft_p95_seconds"] = p95s[-1]["ttft_p95"]
    if len(window) < int(cfg["min_samples"]):
        verdict["reason"] = "%d sample(s), %d needed before judging" % (len(window), cfg["min_samples"])
        return verdict
    rss_slope = slope([(h["time"], h["rss_bytes"]) for h in window])
    steps = [b["rss_bytes"] - a["rss_bytes"] for a, b in zip(window, window[1:])]
    ups = sum(1 for s in steps if s > 0) / float(len(steps)) if steps else 0.0
    per_min = None if rss_slope is None else rss_slope * 60.0 / MiB
    verdict["rss_slope_mib_per_min"] = None if per_min is None else round(per_min, 3)
    verdict["rss_rising"] = bool(
        per_min is not None and per_min > cfg["rss_slope_mib_per_min"] and ups >= cfg["rss_rising_fraction"]
    )
    if len(p95s) >= max(2, int(cfg["min_samples"]) // 2):
        p_slope = slope([(h["time"], h["ttft_p95"]) for h in p95s])
        span = p95s[-1]["time"] - p95s[0]["time"]
        start = sum(h["ttft_p95"] for h in p95s) / len(p95s) - (p_slope or 0.0) * span / 2.0
        rise = (p_slope or 0.0) * span / max(start, 1e-3)
        verdict["ttft_p95_rise"] = round(rise, 4)
        verdict["ttft_rising"] = (
            rise > cfg["ttft_rise_ratio"] and (p_slope or 0.0) * span > cfg["ttft_rise_min_seconds"]
        )
    rss, ttft = verdict["rss_rising"], verdict["ttft_rising"]
    if rss and ttft:
        verdict.update(
            classification="fragmentation",
            recycle=True,
            reason=(
                "RSS grows %.1f MiB/min and TTFT p95 rises with it (%+.0f%% over the window): KV pool growth "
                "and fragmentation; recycling the worker" % (per_min, verdict["ttft_p95_rise"] * 100)
            ),
        )
    elif rss:
        verdict.update(
            classification="memory_growth",
            recycle=True,
            reason=(
                "RSS grows %.1f MiB/min steadily (above %.1f) while TTFT p95 holds: recycling before it "
                "costs latency" % (per_min, cfg["rss_slope_mib_per_min"])
            ),
        )
    elif ttft:
        verdict.update(
            classification="preemption_or_placement",
            reason=(
                "TTFT p95 rises (%+.0f%% over the window) with flat RSS: preemption or placement, which a "
                "restart does not cure; look at vllm:num_preemptions_total, the waiting queue, max_num_seqs "
                "and where the model landed" % (verdict["ttft_p95_rise"] * 100)
            ),
        )
    else:
        verdict.update(
            classification="steady",
            reason="RSS %s MiB/min, TTFT p95 flat" % ("n/a" if per_min is None else "%.1f" % per_min),
        )
    return verdict


def drain_wait(running, timeout, interval=1.0, sleep=None, clock=None):
    """Wait, at most ``timeout`` seconds, until no request runs on the drained server.

    ``running()`` returns how many requests run, or raises when it cannot tell (the scrape failed,
    answered no count). A failed scrape is never read as zero: the wait goes on, to the deadline
    at most, and the failures are counted and the last one kept. ``sleep`` and ``clock`` default
    to ``time.sleep`` and ``time.monotonic``.

    Returns the record of the wait: ``drained`` (a scrape said none run), ``seconds``, ``running``
    (the last count read, None when none was), ``scrapes``, ``failed_scrapes``, ``last_error``,
    and ``reason`` (one line: why the wait ended).
    """
    sleep = sleep or time.sleep
    clock = clock or time.monotonic
    start = clock()
    deadline = start + max(0.0, float(timeout))
    record = {"drained": False, "running": None, "scrapes": 0, "failed_scrapes": 0, "last_error": None}
    while True:
        record["scrapes"] += 1
        try:
            count = float(running())
        except Exception as exc:  # whatever the reason, the count is unknown: not zero
            record["failed_scrapes"] += 1
            record["last_error"] = "%s: %s" % (type(exc).__name__, exc)
        else:
            if math.isnan(count) or count < 0:  # NaN or negative: no count either
                record["failed_scrapes"] += 1
                record["last_error"] = "ValueError: %r requests running" % count
            else:
                record["running"] = count
                if count == 0:
                    record["drained"] = True
                    break
        now = clock()
        if now >= deadline:
            break
        sleep(min(float(interval), deadline - now))
    record["seconds"] = round(clock() - start, 3)
    if record["drained"]:
        record["reason"] = "no request running after %.1f s" % record["seconds"]
    elif record["running"] is None:
        record["reason"] = (
            "could not tell whether requests still run: %d of %d scrape(s) failed in %.1f s (the drain timeout), last: %s"
            % (record["failed_scrapes"], record["scrapes"], record["seconds"], record["last_error"])
        )
    else:
        record["reason"] = "%s request(s) still running after %.1f s (the drain timeout)%s" % (
            "%g" % float(record["running"]),
            record["seconds"],
            "; %d scrape(s) failed, last: %s" % (record["failed_scrapes"], record["last_error"])
            if record["failed_scrapes"]
            else "",
        )
    return record


CLASSES = ("steady", "memory_growth", "fragmentation", "preemption_or_placement", "insufficient_data")


def textfile(verdict, state):
    """Prometheus textfile-collector exposition of the last verdict and the recycle counters
    (every value written as a float, ``1.0``)."""
    out = _textfile.Exposition()

    def metric(name, kind, helptext, samples):
        out.metric(
            name, kind, helptext, [(labels, None if value is None else float(value)) for labels, value in samples]
        )

    metric(
        "gpufleet_worker_rss_bytes",
        "gauge",
        "Resident memory of the vLLM unit's processes.",
        [((), verdict.get("rss_bytes"))],
    )
    metric(
        "gpufleet_worker_rss_slope_bytes_per_second",
        "gauge",
        "Least-squares RSS slope over the window.",
        [((), None if verdict.get("rss_slope_mib_per_min") is None else verdict["rss_slope_mib_per_min"] * MiB / 60.0)],
    )
    metric(
        "gpufleet_worker_ttft_p95_seconds",
        "gauge",
        "TTFT p95 over the last interval.",
        [((), verdict.get("ttft_p95_seconds"))],
    )
    metric(
        "gpufleet_worker_ttft_p95_rise_ratio",
        "gauge",
        "Relative rise of TTFT p95 over the window.",
        [((), verdict.get("ttft_p95_rise"))],
    )
    metric(
        "gpufleet_worker_decay",
        "gauge",
        "1 for the window's classification of the worker's decay.",
        [((("kind", c),), 1 if verdict.get("classification") == c else 0) for c in CLASSES],
    )
    metric(
        "gpufleet_worker_recycles_total",
        "counter",
        "Recycles done by this node's timer.",
        [((), state.get("recycles", 0))],
    )
    metric(
        "gpufleet_worker_recycle_failures_total",
        "counter",
        "Recycles that failed (node left drained).",
        [((), state.get("failures", 0))],
    )
    metric(
        "gpufleet_worker_last_recycle_timestamp_seconds",
        "gauge",
        "When the last recycle finished.",
        [((), state.get("last_recycle"))],
    )
    metric(
        "gpufleet_worker_last_recycle_kind",
        "gauge",
        "1 for the decay that caused the last recycle.",
        [((("kind", state["last_recycle_kind"]),), 1)] if state.get("last_recycle_kind") else [],
    )
    return out.text()
