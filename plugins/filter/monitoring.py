# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The judging defaults of the collection's module_utils, for templates that must agree with them
(role monitoring renders its Prometheus alert rules from these, so an alert and the module that
judges the same figure never disagree on a number)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpufleet.node.plugins.module_utils.serving import _recycle, _vllm_metrics

_SOURCES = {
    # vllm_metrics_info / vllm_load_test: KV usage, waiting queue, preemptions, TTFT p95
    "vllm_metrics": lambda: dict(_vllm_metrics.DEFAULT_THRESHOLDS),
    # the same modules' advice per figure ({threshold} is the limit's place)
    "vllm_advice": lambda: dict(_vllm_metrics.ADVICE),
    # the histogram quantiles the modules report, {'p50': 0.5, ...}
    "vllm_quantiles": lambda: dict(_vllm_metrics.QUANTILES),
    # worker_recycle's judge: window, RSS slope, TTFT rise
    "recycle": lambda: dict(_recycle.DEFAULTS),
}


def judging_defaults(source):
    """``{{ 'vllm_metrics' | gpufleet.node.judging_defaults }}``: a copy of the defaults of one
    judging source (vllm_metrics, vllm_advice, vllm_quantiles, recycle)."""
    try:
        return _SOURCES[source]()
    except (KeyError, TypeError):
        raise AnsibleFilterError(
            "judging_defaults: unknown source %r; one of %s" % (source, ", ".join(sorted(_SOURCES)))
        ) from None


def serving_key_mismatches(hosts, hostvars, key):
    """``{{ gpu_nodes | gpufleet.node.serving_key_mismatches(hostvars, monitoring_serving_api_key) }}``:
    the scraped hosts (monitoring_vllm_scrape not false) whose serving API key
    (llamacpp_server_api_key, else vllm_server_api_key) is set and is not ``key``, the one
    Prometheus sends. The keys themselves are never returned."""
    bad = []
    for host in hosts:
        own = hostvars[host]
        if not boolean(own.get("monitoring_vllm_scrape", True), strict=False):
            continue
        node_key = own.get("llamacpp_server_api_key") or own.get("vllm_server_api_key") or ""
        if node_key and node_key != key:
            bad.append(host)
    return bad


class FilterModule:
    def filters(self):
        return {"judging_defaults": judging_defaults, "serving_key_mismatches": serving_key_mismatches}
