#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_metrics_info
short_description: Judge a vLLM server by its Prometheus metrics over a sampling window
version_added: 0.1.0
description:
  - Scrapes a vLLM server's C(/metrics) O(samples) times, O(interval) seconds apart, parses each
    scrape with prometheus_client's text parser, and returns the figures an operator judges a
    serving node by - KV-cache usage, running and waiting requests, preemptions, and
    time-to-first-token and inter-token latency quantiles computed from the histogram buckets.
  - Understands the metric names of older vLLM releases (C(vllm:gpu_cache_usage_perc) before
    C(vllm:kv_cache_usage_perc), C(vllm:time_per_output_token_seconds) before
    C(vllm:inter_token_latency_seconds)).
  - A server with several engines or label sets reports one series each - counts and histograms
    are summed over them; the KV-cache usage is the fullest engine's (a fraction of each engine's
    own pool).
  - Histogram quantiles describe the window (the increase between the first and the last scrape)
    when requests completed during it, else everything since the server started.
  - A scrape whose figures are not finite (NaN or infinite gauges, counters or histogram samples)
    fails the module - a server cannot be judged healthy on numbers it did not measure.
  - Judges the window against thresholds (a published field report's operational checklist - KV
    usage under 0.88 at peak, a waiting queue not above 8 for long, preemptions not climbing) and
    fails when one is crossed, naming it with what to change, unless O(report_only=true).
author:
  - gpufleet.node developers (@gpufleet)
requirements:
  - prometheus-client (Python library, on the host that runs the module)
options:
  url:
    description:
      - Base URL of the vLLM server, for example V(http://10.0.0.11:8000). C(/metrics) is appended
        unless the URL already ends with it.
      - Only C(http) and C(https) URLs; any other scheme is refused before anything is opened.
    type: str
    required: true
  samples:
    description: Number of scrapes in the window (at least 1).
    type: int
    default: 3
  interval:
    description: Seconds between scrapes.
    type: float
    default: 5.0
  timeout:
    description:
      - Seconds one scrape may take in all (connect, headers and body), on the monotonic clock; a
        server that has not answered completely by then (one that drips its answer too) fails it.
    type: float
    default: 10.0
  max_bytes:
    description: Largest C(/metrics) answer read, in bytes; a larger one fails the scrape unread.
    type: int
    default: 16777216
  validate_certs:
    description: Verify the server's TLS certificate (https URLs).
    type: bool
    default: true
  api_key:
    description:
      - Sent as a bearer token (C(Authorization) header). llama.cpp's llama-server answers C(/metrics) only with the
        API key it was started with (role gpufleet.node.llamacpp_server); vLLM's C(/metrics) does not ask for it.
    type: str
  max_kv_cache_usage:
    description: KV-cache usage (0 to 1) the window's peak must stay under.
    type: float
    default: 0.88
  max_num_requests_waiting:
    description: Waiting requests above which the queue counts as long.
    type: int
    default: 8
  waiting_sustained_samples:
    description:
      - Consecutive scrapes the waiting queue must stay above O(max_num_requests_waiting) to be a
        violation (all scrapes when fewer were taken).
    type: int
    default: 3
  max_preemptions:
    description: Preemptions allowed during the window (the counter's increase).
    type: int
    default: 0
  max_ttft_p95_seconds:
    description: TTFT p95 (seconds) not to exceed; not judged when omitted.
    type: float
  report_only:
    description: Report violations without failing.
    type: bool
    default: false
extends_documentation_fragment:
  - gpufleet.node.attributes.read_only
attributes:
  platform:
    support: full
    platforms: posix
    description: Runs on any host that reaches the URL (the node itself, or the controller).
notes:
  - The thresholds are a published field report's operational checklist; a second field report's advice
    (pin concurrency, keep host swap off) is in the violation messages.
seealso:
  - module: gpufleet.node.vllm_load_test
"""

EXAMPLES = r"""
- name: Judge node1's vLLM over 30 seconds
  gpufleet.node.vllm_metrics_info:
    url: http://10.0.0.11:8000
    samples: 7
    interval: 5
  delegate_to: localhost

- name: Report only, with a TTFT target
  gpufleet.node.vllm_metrics_info:
    url: http://127.0.0.1:8000
    max_ttft_p95_seconds: 1.2
    report_only: true
  register: vllm_health
"""

RETURN = r"""
metrics:
  description: The figures of the window.
  returned: success
  type: dict
  contains:
    kv_cache_usage_perc:
      description: KV-cache usage (0 to 1) at the last scrape, the fullest engine's.
      type: float
      sample: 0.42
    kv_cache_usage_perc_peak:
      description: Highest KV-cache usage over the scrapes.
      type: float
    num_requests_running:
      description: Requests in the running batch at the last scrape, summed over engines.
      type: float
    num_requests_running_peak:
      description: Highest running count over the scrapes.
      type: float
    num_requests_waiting:
      description: Requests waiting at the last scrape, summed over engines.
      type: float
    num_requests_waiting_peak:
      description: Highest waiting count over the scrapes.
      type: float
    num_preemptions_total:
      description: The preemption counter at the last scrape (null when the server has none).
      type: float
    num_preemptions_window:
      description: Preemptions during the window.
      type: float
    ttft_seconds:
      description: Time-to-first-token quantiles from the histogram buckets.
      type: dict
      sample: {"p50": 0.41, "p95": 1.18, "p99": 2.1, "count": 320, "scope": "window"}
      contains:
        p50:
          description: Median, seconds (null without observations).
          type: float
        p95:
          description: 95th percentile, seconds.
          type: float
        p99:
          description: 99th percentile, seconds.
          type: float
        count:
          description: Observations the quantiles are computed from.
          type: int
        scope:
          description: V(window), V(since_start) or V(absent).
          type: str
    itl_seconds:
      description: Inter-token latency quantiles, same keys as RV(metrics.ttft_seconds).
      type: dict
    engines:
      description: Engines (data-parallel ranks) the server reports.
      type: int
    names:
      description: The vLLM metric name each figure was read from.
      type: dict
    window_seconds:
      description: Seconds between the first and the last scrape.
      type: float
    samples:
      description: Number of scrapes.
      type: int
samples:
  description: The gauges of each scrape, oldest first.
  returned: success
  type: list
  elements: dict
  sample: [{"time": 1764400000.0, "kv_cache_usage_perc": 0.4, "num_requests_running": 12.0,
            "num_requests_waiting": 0.0, "num_preemptions_total": 0.0}]
violations:
  description: Thresholds crossed, each with its figure and what to change.
  returned: success
  type: list
  elements: dict
  contains:
    name:
      description: V(kv_cache_usage), V(num_requests_waiting), V(preemptions) or V(ttft_p95).
      type: str
    value:
      description: The figure that crossed.
      type: float
    threshold:
      description: The threshold it crossed.
      type: float
    message:
      description: What happened and the advice.
      type: str
healthy:
  description: Whether no threshold was crossed.
  returned: success
  type: bool
url:
  description: The metrics URL scraped.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.node.plugins.module_utils.common import _http
from ansible_collections.gpufleet.node.plugins.module_utils.serving import _vllm_metrics as vm


def metrics_url(url):
    url = url.rstrip("/")
    return url if url.endswith("/metrics") else url + "/metrics"


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            samples=dict(type="int", default=3),
            interval=dict(type="float", default=5.0),
            max_kv_cache_usage=dict(type="float", default=0.88),
            max_num_requests_waiting=dict(type="int", default=8),
            waiting_sustained_samples=dict(type="int", default=3),
            max_preemptions=dict(type="int", default=0),
            api_key=dict(type="str", no_log=True),
            **vm.judging_spec(),
            **_http.argument_spec(timeout=10.0),
        ),
        supports_check_mode=True,
    )
    p = module.params
    url = metrics_url(p["url"])
    thresholds = {name: p[name] for name in vm.THRESHOLD_RANGES}
    try:
        _http.check_url(url)
        _http.check_limits(p["timeout"], p["max_bytes"])
        vm.check_range("samples", p["samples"], 1)
        vm.check_range("interval", p["interval"], 0)
        vm.check_thresholds(thresholds)
    except (_http.HttpError, ValueError) as exc:
        module.fail_json(msg=f"{exc}", url=url)
    if vm.MISSING_LIBRARY:
        module.fail_json(
            msg=missing_required_lib(vm.LIBRARY, reason="to parse vLLM's /metrics"),
            exception=vm.MISSING_LIBRARY,
            url=url,
        )

    def fetch():
        try:
            return _http.get_text(
                url,
                headers={"Authorization": "Bearer " + p["api_key"]} if p["api_key"] else None,
                timeout=p["timeout"],
                max_bytes=p["max_bytes"],
                validate_certs=p["validate_certs"],
            )
        except _http.HttpError as exc:
            raise vm.ScrapeError(
                f"cannot scrape {url}: {exc.what}. Is vLLM up on that address and port, and is its port "
                "reachable from this host?"
            ) from None

    try:
        scrapes = vm.scrape_window(fetch, p["samples"], p["interval"])
        metrics, samples, violations = vm.summarize(scrapes, p["interval"], thresholds=thresholds)
    except vm.ScrapeError as exc:
        module.fail_json(msg=str(exc), url=url)
    except vm.MetricsError as exc:
        module.fail_json(msg="%s: %s" % (url, exc), url=url)
    result = dict(
        changed=False, url=url, metrics=metrics, samples=samples, violations=violations, healthy=not violations
    )
    if violations and not p["report_only"]:
        module.fail_json(
            msg="vLLM at %s crossed %d threshold(s): %s"
            % (url, len(violations), " | ".join(v["message"] for v in violations)),
            **result,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
