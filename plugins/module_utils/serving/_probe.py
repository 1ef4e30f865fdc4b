# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The serving probe: whether the engine still does work, judged by a real request.

``/health`` answers 200 while a vLLM engine core is hung (vllm-project/vllm#39863), and a stopped
llama-server keeps its port open; so the node's prober (roles/lb_registration,
``gpufleet_serving_probe.py``) asks the engine for one token, as a client would:

* ``POST /v1/completions`` with ``max_tokens: 1`` for the served model (the API key as a bearer
  token), with one overall deadline (the common package's ``_http``); vLLM's ``priority`` field is
  sent only when asked for (``priority``), as vLLM refuses it unless the server runs with
  ``--scheduling-policy priority``;
* and the engine's own forward progress from ``/metrics``, sampled before the request and after a
  deadline that passed: generated tokens (vLLM ``vllm:generation_tokens_total``, llama-server
  ``llamacpp:tokens_predicted_total``) and requests running or waiting (vLLM
  ``vllm:num_requests_running`` + ``vllm:num_requests_waiting``, llama-server
  ``llamacpp:requests_processing`` + ``llamacpp:requests_deferred``). Parsed by structure:
  prometheus_client's text parser where it is installed, else the exposition format's sample
  lines (name, labels, value) read here.

The verdict of one probe (:func:`judge`):

=========  ===================================================================================
serving    the completion answered 200 in time
busy       the deadline passed, but requests run or wait and generated tokens rose between the
           two samples (at saturation a probe waits in the engine's queue like any request)
wedged     the deadline passed and the engine made no progress (its counters are frozen, or
           nothing runs)
down       refused, an answer other than 200, or metrics that cannot be read after a deadline
           (unreadable is not healthy)
=========  ===================================================================================

The probe record the prober writes, and its judgement by the readiness rule, are
``serving/_probe_record`` (the balancer's agent reads it on every check). Standard library only
besides the optional prometheus_client; no Ansible. Runs on the node's Python 3.9+.
"""

from __future__ import annotations

import json
import math
import re
import time

from ansible_collections.gpufleet.node.plugins.module_utils.common import _http

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # the sample lines are read below
    text_string_to_metric_families = None

#: figure -> the metric names of each backend (the first one a scrape has wins).
GENERATED = ("vllm:generation_tokens_total", "llamacpp:tokens_predicted_total")
RUNNING = ("vllm:num_requests_running", "llamacpp:requests_processing")
WAITING = ("vllm:num_requests_waiting", "llamacpp:requests_deferred")

# name{labels} value [timestamp]: the exposition format's sample line
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)(\s+\S+)?\s*$")


class ProbeError(Exception):
    """Metrics that cannot be read (the message says what and where)."""


def _samples(text):
    """{metric name: [values]} of a Prometheus text exposition."""
    found = {}
    if text_string_to_metric_families is not None:
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    found.setdefault(sample.name, []).append(float(sample.value))
        except (ValueError, TypeError, IndexError) as exc:
            raise ProbeError("not Prometheus text exposition: %s" % exc) from None
        return found
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            raise ProbeError("not Prometheus text exposition: line %d: %r" % (number, line[:80]))
        try:
            value = float(match.group(3))
        except ValueError:
            raise ProbeError("not Prometheus text exposition: line %d: value %r" % (number, match.group(3))) from None
        found.setdefault(match.group(1), []).append(value)
    return found


def _figure(samples, names, what):
    """The sum over series of the first of ``names`` the scrape has."""
    for name in names:
        values = samples.get(name)
        if values:
            if any(not math.isfinite(v) or v < 0 for v in values):
                raise ProbeError("%s (%s) is not a finite non-negative number: %r" % (what, name, values))
            return sum(values)
    raise ProbeError("the engine's /metrics has no %s (%s)" % (what, " or ".join(names)))


def progress(text):
    """``{'generated': tokens so far, 'active': requests running + waiting}`` of one /metrics
    text (vLLM or llama-server); ProbeError when it cannot be read or lacks a figure."""
    samples = _samples(text)
    return {
        "generated": _figure(samples, GENERATED, "generated-token counter"),
        "active": _figure(samples, RUNNING, "running-requests gauge")
        + _figure(samples, WAITING, "waiting-requests gauge"),
    }


def judge(answered, before, after, timed_out, problem=None):
    """``(verdict, reason)`` of one probe.

    ``answered``: the completion's HTTP status (None when nothing came back); ``timed_out``:
    the deadline passed before an answer; ``before``/``after``: :func:`progress` of the samples
    before the request and after it (None when the scrape failed; ``after`` is taken only after
    a deadline); ``problem``: what went wrong, in words (the reason of a ``down``).
    """
    if answered == 200:
        return "serving", "a one-token completion answered in time"
    if not timed_out:
        if answered is not None:
            return "down", "the completion answered HTTP %s, not 200%s" % (
                answered,
                ": %s" % problem if problem else "",
            )
        return "down", "the completion failed: %s" % (problem or "no answer")
    if before is None or after is None:
        return "down", "no answer within the deadline, and the engine's /metrics cannot be read: %s" % (
            problem or "no scrape"
        )
    rose = after["generated"] > before["generated"] or (
        # a counter that went back: the engine restarted between the samples and generates again
        after["generated"] < before["generated"] and after["generated"] > 0
    )
    if rose and after["active"] > 0:
        return "busy", "no answer within the deadline, but %g request(s) run or wait and %g token(s) were generated" % (
            after["active"],
            after["generated"] - before["generated"]
            if after["generated"] >= before["generated"]
            else after["generated"],
        )
    return "wedged", "no answer within the deadline and no progress: %g request(s) run or wait, generated tokens %s" % (
        after["active"],
        "frozen at %g" % after["generated"] if not rose else "rose with nothing running",
    )


def completion_body(model, priority=None):
    """The probe's request: one token of the served model (``priority`` where the server
    schedules by priority; lower is served first)."""
    body = {"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0}
    if priority is not None:
        body["priority"] = int(priority)
    return json.dumps(body).encode()


def probe(base_url, model, api_key=None, timeout=10.0, priority=None, clock=time.monotonic):
    """``(verdict, reason, elapsed seconds)`` of one probe of the server at ``base_url``."""
    base = base_url.rstrip("/")
    auth = {"Authorization": "Bearer %s" % api_key} if api_key else {}

    def sample():
        try:
            return progress(_http.get_text(base + "/metrics", headers=auth, timeout=min(timeout, 5.0))), None
        except (_http.HttpError, ProbeError) as exc:
            return None, str(exc)

    before, before_problem = sample()
    started = clock()
    answered, problem, timed_out = None, None, False
    try:
        with _http.request(
            "POST",
            base + "/v1/completions",
            body=completion_body(model, priority),
            headers=dict(auth, **{"Content-Type": "application/json"}),
            timeout=timeout,
            max_bytes=1024 * 1024,
        ) as answer:
            answered = answer.status
            text = answer.read().decode("utf-8", "replace")
            if answered != 200:
                problem = " ".join(text.split())[:200]
    except _http.HttpError as exc:
        # a failure that took the whole deadline is the deadline, whatever the socket said
        timed_out = clock() - started >= timeout * 0.98
        answered, problem = None, exc.what
    elapsed = round(clock() - started, 3)
    after = None
    if timed_out:
        after, after_problem = sample()
        problem = before_problem or after_problem or problem
    verdict, reason = judge(answered, before, after, timed_out, problem)
    return verdict, reason, elapsed
