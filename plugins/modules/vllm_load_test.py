#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_load_test
short_description: Drive a vLLM server (or the balancer) with streaming requests and measure it
version_added: 0.1.0
description:
  - Sends streaming C(/v1/completions) requests from O(concurrency) clients, back to back, cycling
    through O(prompt_lengths) (by default 128, 512 and 2048 tokens), for O(duration) seconds;
    requests in flight then finish.
  - Reports, measured on the client, TTFT p50/p95/p99, inter-token latency, output tokens per
    second, requests per second and errors, per prompt length too; and, scraped from the server's
    C(/metrics) during the run, its KV-cache usage, waiting and running queues and preemptions. The
    same figures come back as a text table (RV(table)) and as data.
  - Sends traffic only to the hosts listed in O(allowed_hosts) (pass the inventory's hosts); any
    other URL is refused before a request is sent.
  - Fails when the error rate or the TTFT p95 crosses its limit, unless O(report_only=true).
author:
  - gpufleet.node developers (@gpufleet)
requirements:
  - prometheus-client (Python library, for the server's metrics; on the host that runs the module)
options:
  url:
    description: Base URL of the server or of the balancer's frontend, for example V(http://10.0.0.11:8000).
    type: str
    required: true
  allowed_hosts:
    description:
      - Host names and addresses traffic may go to (the inventory's). The host of O(url) must be one
        of them, or resolve from one of them.
    type: list
    elements: str
    required: true
  metrics_url:
    description:
      - Where to scrape the server's metrics during the run. Default - O(url) + C(/metrics). Must be
        an allowed host too. Through a balancer this is whichever node answers.
    type: str
  model:
    description: Model name to request. Default - the first model the server lists on C(/v1/models).
    type: str
  api_key:
    description: Bearer token for the server's C(/v1) API and its C(/metrics) (llama.cpp asks for it there too).
    type: str
  concurrency:
    description: Clients sending at the same time.
    type: int
    default: 8
  duration:
    description: Seconds during which new requests are sent.
    type: float
    default: 30.0
  prompt_lengths:
    description: Prompt lengths in tokens, used in turn by each client.
    type: list
    elements: int
    default: [128, 512, 2048]
  max_tokens:
    description: Output tokens per request (C(ignore_eos) is set, so each request generates them all).
    type: int
    default: 64
  timeout:
    description:
      - Seconds one request may take in all, from connecting to the last streamed byte (an overall
        deadline on the monotonic clock, not per read); a request past it counts as an error.
    type: float
    default: 60.0
  max_bytes:
    description: Most bytes read of one answer (a streamed completion, C(/v1/models), C(/metrics)); past it the request is an error.
    type: int
    default: 16777216
  validate_certs:
    description: Verify the TLS certificate of the server or the balancer (https URLs).
    type: bool
    default: true
  sample_interval:
    description: Seconds between scrapes of the server's metrics.
    type: float
    default: 1.0
  seed:
    description: Seed of the prompts' random token ids.
    type: int
    default: 0
  max_error_rate:
    description: Fraction of requests that may fail (0 to 1).
    type: float
    default: 0.0
  max_ttft_p95_seconds:
    description: TTFT p95 (seconds) not to exceed; not judged when omitted.
    type: float
  report_only:
    description: Report without failing on the limits.
    type: bool
    default: false
extends_documentation_fragment:
  - gpufleet.node.attributes
attributes:
  check_mode:
    support: full
    description: In check mode the target is validated and nothing is sent.
  platform:
    support: full
    platforms: posix
    description: Runs where the server is reachable; usually the controller (C(delegate_to=localhost)).
seealso:
  - module: gpufleet.node.vllm_metrics_info
"""

EXAMPLES = r"""
- name: Load node1 for a minute at concurrency 16
  gpufleet.node.vllm_load_test:
    url: "http://{{ hostvars['node1'].ansible_host }}:8000"
    allowed_hosts: "{{ groups['all'] | map('extract', hostvars, 'ansible_host') | list }}"
    concurrency: 16
    duration: 60
    max_ttft_p95_seconds: 1.5
  delegate_to: localhost
  register: load

- name: Show the table
  ansible.builtin.debug:
    msg: "{{ load.table }}"
"""

RETURN = r"""
summary:
  description: Client-side figures of the run.
  returned: success
  type: dict
  contains:
    requests:
      description: Requests sent.
      type: int
    completed:
      description: Requests that streamed to the end.
      type: int
    errors:
      description: Requests that failed.
      type: int
    error_rate:
      description: errors / requests.
      type: float
    error_examples:
      description: Up to five distinct error texts.
      type: list
      elements: str
    duration_seconds:
      description: Wall time of the run.
      type: float
    ttft_seconds:
      description: Time to first token, seconds (C(p50), C(p95), C(p99), C(mean)).
      type: dict
    itl_seconds:
      description: Inter-token latency, seconds (C(p50), C(p95), C(p99), C(mean)).
      type: dict
    output_tokens:
      description: Tokens generated in all.
      type: int
    output_tokens_per_second:
      description: Output tokens per second of wall time.
      type: float
    requests_per_second:
      description: Completed requests per second.
      type: float
    by_prompt_length:
      description: Per prompt length - C(requests), C(errors), C(ttft_p50), C(ttft_p95).
      type: dict
server:
  description: The server's view during the run, from its C(/metrics).
  returned: success
  type: dict
  contains:
    samples:
      description: Scrapes that succeeded.
      type: int
    scrape_errors:
      description: Scrapes that failed.
      type: int
    kv_cache_usage_perc_peak:
      description: Highest KV-cache usage seen.
      type: float
    num_requests_waiting_peak:
      description: Longest waiting queue seen.
      type: float
    num_requests_running_peak:
      description: Most requests running at once.
      type: float
    num_preemptions:
      description: Preemptions during the run.
      type: float
    timeline:
      description: Each scrape's gauges.
      type: list
      elements: dict
table:
  description: The run as text lines (a table).
  returned: success
  type: list
  elements: str
violations:
  description: Limits crossed.
  returned: success
  type: list
  elements: str
passed:
  description: Whether no limit was crossed.
  returned: success
  type: bool
model:
  description: The model requested.
  returned: success
  type: str
url:
  description: The URL loaded.
  returned: always
  type: str
"""

import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.node.plugins.module_utils.common import _http
from ansible_collections.gpufleet.node.plugins.module_utils.serving import _loadtest as lt
from ansible_collections.gpufleet.node.plugins.module_utils.serving import _vllm_metrics as vm

#: Seconds one scrape of the server's /metrics may take during the run.
SCRAPE_TIMEOUT = 10.0


def check_arguments(p):
    """ValueError naming the first option that is not a finite number in its range."""
    _http.check_limits(p["timeout"], p["max_bytes"])
    for name, low in (("concurrency", 1), ("max_tokens", 1), ("seed", 0)):
        vm.check_range(name, p[name], low)
    for name in ("duration", "sample_interval"):
        vm.check_range(name, p[name], 0.001)
    if not p["prompt_lengths"]:
        raise ValueError("prompt_lengths must list at least one prompt length")
    for length in p["prompt_lengths"]:
        vm.check_range("every prompt length", length, 1)
    vm.check_range("max_error_rate", p["max_error_rate"], 0, 1)
    if p["max_ttft_p95_seconds"] is not None:
        vm.check_range("max_ttft_p95_seconds", p["max_ttft_p95_seconds"], 0)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            allowed_hosts=dict(type="list", elements="str", required=True),
            metrics_url=dict(type="str"),
            model=dict(type="str"),
            api_key=dict(type="str", no_log=True),
            concurrency=dict(type="int", default=8),
            duration=dict(type="float", default=30.0),
            prompt_lengths=dict(type="list", elements="int", default=[128, 512, 2048]),
            max_tokens=dict(type="int", default=64, no_log=False),
            sample_interval=dict(type="float", default=1.0),
            seed=dict(type="int", default=0),
            max_error_rate=dict(type="float", default=0.0),
            **vm.judging_spec(),
            **_http.argument_spec(timeout=60.0),
        ),
        supports_check_mode=True,
    )
    p = module.params
    url = p["url"].rstrip("/")
    metrics_url = (p["metrics_url"] or url + "/metrics").rstrip("/")
    try:
        lt.check_target(url, p["allowed_hosts"])
        lt.check_target(metrics_url, p["allowed_hosts"])
        check_arguments(p)
    except (lt.LoadTestError, ValueError) as exc:
        module.fail_json(msg=str(exc), url=url)
    if vm.MISSING_LIBRARY:
        module.fail_json(
            msg=missing_required_lib(vm.LIBRARY, reason="to read the server's /metrics during the run"),
            exception=vm.MISSING_LIBRARY,
            url=url,
        )
    if module.check_mode:
        module.exit_json(changed=False, url=url, skipped=True, msg="check mode: target allowed, nothing sent")

    try:
        model = p["model"] or lt.served_model(url, p["api_key"], p["timeout"], p["max_bytes"], p["validate_certs"])
    except lt.LoadTestError as exc:
        module.fail_json(msg=str(exc), url=url)

    def sampler():
        text = _http.get_text(
            metrics_url,
            # llama.cpp's /metrics asks for the API key too (vLLM's does not)
            headers={"Authorization": "Bearer " + p["api_key"]} if p["api_key"] else None,
            timeout=min(SCRAPE_TIMEOUT, p["timeout"]),
            max_bytes=p["max_bytes"],
            validate_certs=p["validate_certs"],
        )
        return dict({"time": round(time.time(), 3)}, **vm.gauge_values(vm.parse(text)))

    options = {name: p[name] for name in lt.RUN_OPTIONS}
    results, wall, samples = lt.run(url, model, sampler=sampler, **options)
    summary, server, violations = lt.summarize(
        results, wall, samples, max_ttft_p95=p["max_ttft_p95_seconds"], max_error_rate=p["max_error_rate"]
    )
    result = dict(changed=False, url=url, model=model, summary=summary, server=server, violations=violations)
    result.update(table=lt.table(summary, server), passed=not violations)
    if violations and not p["report_only"]:
        module.fail_json(msg="load test of %s failed: %s" % (url, "; ".join(violations)), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
