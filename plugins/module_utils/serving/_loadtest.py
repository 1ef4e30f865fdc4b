# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A bounded, streaming load test of an OpenAI-compatible server (vLLM).

``concurrency`` clients each send ``/v1/completions`` requests back to back, streaming, cycling
through the prompt lengths (by default 128, 512 and 2048 tokens) until ``duration`` seconds have
passed; requests in flight then finish (each bounded by ``timeout``). Prompts are lists of token
ids, so their length is exact whatever the model's tokenizer. Measured per request, on the client:
TTFT (request sent -> first streamed token), inter-token latencies (gaps between tokens), output
tokens (the server's usage chunk, else the chunks counted), errors. Meanwhile a sampler scrapes the
server's ``/metrics`` (KV-cache usage, waiting and running queues, preemptions).

Only hosts named in ``allowed_hosts`` (the inventory's) are sent traffic: ``check_target`` refuses
any other URL before a byte is sent. Every request goes through ``_http`` (http/https only, one
overall deadline per request, a cap on the bytes read). Standard library plus this collection's
``_http``.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time

from ansible_collections.gpufleet.node.plugins.module_utils.common import _http

#: The keyword arguments of ``run`` that a caller (the module) passes by their own names.
RUN_OPTIONS = (
    "concurrency",
    "duration",
    "prompt_lengths",
    "max_tokens",
    "api_key",
    "timeout",
    "seed",
    "sample_interval",
    "max_bytes",
    "validate_certs",
)


class LoadTestError(Exception):
    pass


def percentile(values, q):
    """Linear-interpolated percentile (numpy's default, as `vllm bench serve` reports)."""
    if not values:
        return None
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def split_url(url):
    try:
        scheme, host, port, path = _http.check_url(url)
    except _http.HttpError as exc:
        raise LoadTestError(f"url must be http(s)://HOST[:PORT][/PATH]: {exc}") from None
    return scheme, host, port, path.rstrip("/")


def check_target(url, allowed_hosts, resolve=socket.getaddrinfo):
    """Refuse a URL whose host is not one of the inventory's hosts (names or addresses).

    A name matches when it is listed; an address matches when it is listed or when a listed name
    resolves to it. Returns the host. Raises LoadTestError naming what is allowed.
    """
    _scheme, host, _port, _path = split_url(url)
    allowed = {str(h).strip().lower() for h in allowed_hosts if str(h).strip()}
    if not allowed:
        raise LoadTestError("no allowed hosts given: pass the inventory's hosts (allowed_hosts)")
    if host.lower() in allowed:
        return host
    for name in allowed:
        try:
            addrs = {info[4][0] for info in resolve(name, None)}
        except (OSError, UnicodeError):
            continue
        if host in addrs:
            return host
    raise LoadTestError(
        "refusing to send load to %s: it is not a host of the inventory (allowed: %s)"
        % (host, ", ".join(sorted(allowed)))
    )


def _headers(api_key):
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    return headers


def served_model(url, api_key=None, timeout=10.0, max_bytes=_http.DEFAULT_MAX_BYTES, validate_certs=True):
    """The first model id the server lists on /v1/models (one bounded GET: deadline and size)."""
    url = url.rstrip("/")
    try:
        status, body = _http.get(
            url + "/v1/models",
            headers=_headers(api_key),
            timeout=timeout,
            max_bytes=max_bytes,
            validate_certs=validate_certs,
        )
        if status != 200:
            raise LoadTestError("%s/v1/models answered %d: %s" % (url, status, body[:200].decode("utf-8", "replace")))
        data = json.loads(body).get("data") or []
    except (_http.HttpError, ValueError, AttributeError) as exc:
        raise LoadTestError("cannot list the models of %s: %s" % (url, exc)) from None
    if not data:
        raise LoadTestError("%s/v1/models lists no model" % url)
    return data[0]["id"]


def one_request(
    url,
    model,
    prompt_len,
    max_tokens,
    api_key=None,
    timeout=60.0,
    rng=None,
    clock=time.monotonic,
    max_bytes=_http.DEFAULT_MAX_BYTES,
    validate_certs=True,
):
    """Send one streaming completion; return its measurements (never raises).

    ``timeout`` is the request's overall deadline (connect to the last streamed byte) and
    ``max_bytes`` caps what is read of its stream: past either, the request is an error."""
    rng = rng or random.Random(prompt_len)
    body = json.dumps(
        {
            "model": model,
            "prompt": [rng.randint(1000, 30000) for _index in range(prompt_len)],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    result = {"prompt_len": prompt_len, "ttft": None, "itl": [], "output_tokens": 0, "error": None, "latency": None}
    start = clock()
    try:
        with _http.request(
            "POST",
            url.rstrip("/") + "/v1/completions",
            body=body,
            headers=_headers(api_key),
            timeout=timeout,
            max_bytes=max_bytes,
            validate_certs=validate_certs,
        ) as resp:
            if resp.status != 200:
                text = resp.read()[:300].decode("utf-8", "replace")
                result["error"] = "HTTP %d: %s" % (resp.status, text)
                return result
            last = None
            chunks = 0
            usage = None
            for raw in resp.lines():
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                event = json.loads(payload)
                if event.get("usage"):
                    usage = event["usage"]
                choices = event.get("choices") or []
                if not choices or not (choices[0].get("text") or (choices[0].get("delta") or {}).get("content")):
                    continue
                now = clock()
                if last is None:
                    result["ttft"] = now - start
                else:
                    result["itl"].append(now - last)
                last = now
                chunks += 1
        result["output_tokens"] = int(usage["completion_tokens"]) if usage else chunks
        result["latency"] = clock() - start
        if chunks == 0:
            result["error"] = "the stream ended without a token"
    except _http.HttpError as exc:
        result["error"] = "HttpError: %s" % exc.what
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        result["error"] = "%s: %s" % (type(exc).__name__, exc)
    return result


def run(
    url,
    model,
    concurrency=8,
    duration=30.0,
    prompt_lengths=(128, 512, 2048),
    max_tokens=64,
    api_key=None,
    timeout=60.0,
    seed=0,
    sampler=None,
    sample_interval=1.0,
    max_bytes=_http.DEFAULT_MAX_BYTES,
    validate_certs=True,
):
    """Drive the server; return (results, wall seconds, server samples).

    ``sampler`` is a callable returning one server sample (a dict) or raising; it is called every
    ``sample_interval`` seconds while clients run, and once before and after.
    """
    if concurrency < 1 or duration <= 0 or not prompt_lengths or max_tokens < 1:
        raise LoadTestError("concurrency, duration, prompt_lengths and max_tokens must be positive")
    results = []
    lock = threading.Lock()
    deadline = time.monotonic() + duration
    stop = threading.Event()
    samples = []

    def client(index):
        rng = random.Random(seed * 1000 + index)
        turn = index
        while time.monotonic() < deadline:
            res = one_request(
                url,
                model,
                prompt_lengths[turn % len(prompt_lengths)],
                max_tokens,
                api_key,
                timeout,
                rng,
                max_bytes=max_bytes,
                validate_certs=validate_certs,
            )
            turn += 1
            with lock:
                results.append(res)

    def sample_loop():
        while True:
            _take(sampler, samples)
            if stop.wait(sample_interval):
                return

    started = time.monotonic()
    watcher = threading.Thread(target=sample_loop, daemon=True) if sampler else None
    if watcher:
        watcher.start()
    workers = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(duration + timeout + 5)
    wall = time.monotonic() - started
    stop.set()
    if watcher:
        watcher.join(sample_interval + 10)
        _take(sampler, samples)
    return results, wall, samples


def _take(sampler, samples):
    try:
        samples.append(sampler())
    except Exception as exc:  # a scrape that fails is recorded, the load test goes on
        samples.append({"error": str(exc)})


def _stats(values, scale=1.0):
    if not values:
        return {"p50": None, "p95": None, "p99": None, "mean": None}
    return {
        "p50": round(percentile(values, 50) * scale, 6),
        "p95": round(percentile(values, 95) * scale, 6),
        "p99": round(percentile(values, 99) * scale, 6),
        "mean": round(sum(values) / len(values) * scale, 6),
    }


def summarize(results, wall, samples=(), max_ttft_p95=None, max_error_rate=0.0):
    """Figures of a run, the server's view during it, and the verdict."""
    ok = [r for r in results if not r["error"]]
    errors = [r for r in results if r["error"]]
    ttfts = [r["ttft"] for r in ok if r["ttft"] is not None]
    itls = [g for r in ok for g in r["itl"]]
    tokens = sum(r["output_tokens"] for r in ok)
    by_len = {}
    for length in sorted({r["prompt_len"] for r in results}):
        mine = [r for r in results if r["prompt_len"] == length]
        good = [r["ttft"] for r in mine if not r["error"] and r["ttft"] is not None]
        entry = {"requests": len(mine), "errors": sum(1 for r in mine if r["error"])}
        entry.update({"ttft_" + k: v for k, v in _stats(good).items() if k in ("p50", "p95")})
        by_len[str(length)] = entry
    good_samples = [s for s in samples if "error" not in s]

    def peak(key):
        values = [s.get(key) for s in good_samples if s.get(key) is not None]
        return max(values) if values else None

    pre = [s.get("num_preemptions_total") for s in good_samples if s.get("num_preemptions_total") is not None]
    server = {
        "samples": len(good_samples),
        "scrape_errors": len(samples) - len(good_samples),
        "kv_cache_usage_perc_peak": peak("kv_cache_usage_perc"),
        "num_requests_waiting_peak": peak("num_requests_waiting"),
        "num_requests_running_peak": peak("num_requests_running"),
        "num_preemptions": (pre[-1] - pre[0]) if len(pre) > 1 else None,
        "timeline": list(good_samples),
    }
    summary = {
        "requests": len(results),
        "completed": len(ok),
        "errors": len(errors),
        "error_rate": round(len(errors) / len(results), 4) if results else None,
        "error_examples": sorted({r["error"] for r in errors})[:5],
        "duration_seconds": round(wall, 3),
        "ttft_seconds": _stats(ttfts),
        "itl_seconds": _stats(itls),
        "output_tokens": tokens,
        "output_tokens_per_second": round(tokens / wall, 2) if wall > 0 else None,
        "requests_per_second": round(len(ok) / wall, 3) if wall > 0 else None,
        "by_prompt_length": by_len,
    }
    violations = []
    if not results:
        violations.append("no request completed within the run")
    elif summary["error_rate"] > max_error_rate:
        violations.append(
            "error rate %.2f%% above %.2f%% (%s)"
            % (summary["error_rate"] * 100, max_error_rate * 100, "; ".join(summary["error_examples"]))
        )
    p95 = summary["ttft_seconds"]["p95"]
    if max_ttft_p95 is not None and (p95 is None or p95 > max_ttft_p95):
        violations.append("TTFT p95 %s s above %.3f s" % ("n/a" if p95 is None else "%.3f" % p95, max_ttft_p95))
    return summary, server, violations


def table(summary, server):
    """The run as a fixed-width text table (one line per row)."""

    def ms(value):
        return "-" if value is None else "%.1f" % (value * 1000)

    t, i = summary["ttft_seconds"], summary["itl_seconds"]
    rows = [
        ("requests (ok / errors)", "%d / %d" % (summary["completed"], summary["errors"])),
        ("duration (s)", "%.1f" % summary["duration_seconds"]),
        ("TTFT p50 / p95 / p99 (ms)", "%s / %s / %s" % (ms(t["p50"]), ms(t["p95"]), ms(t["p99"]))),
        ("ITL p50 / p95 / p99 (ms)", "%s / %s / %s" % (ms(i["p50"]), ms(i["p95"]), ms(i["p99"]))),
        (
            "output tokens/s",
            "-" if summary["output_tokens_per_second"] is None else "%.1f" % summary["output_tokens_per_second"],
        ),
        ("requests/s", "-" if summary["requests_per_second"] is None else "%.2f" % summary["requests_per_second"]),
    ]
    for length, entry in summary["by_prompt_length"].items():
        rows.append(
            (
                "prompt %s: n / TTFT p50 / p95 (ms)" % length,
                "%d / %s / %s" % (entry["requests"], ms(entry.get("ttft_p50")), ms(entry.get("ttft_p95"))),
            )
        )
    rows += [
        (
            "server KV-cache usage peak",
            "-" if server["kv_cache_usage_perc_peak"] is None else "%.3f" % server["kv_cache_usage_perc_peak"],
        ),
        (
            "server waiting queue peak",
            "-" if server["num_requests_waiting_peak"] is None else "%d" % server["num_requests_waiting_peak"],
        ),
        (
            "server running peak",
            "-" if server["num_requests_running_peak"] is None else "%d" % server["num_requests_running_peak"],
        ),
        ("server preemptions", "-" if server["num_preemptions"] is None else "%d" % server["num_preemptions"]),
    ]
    width = max(len(k) for k, _v in rows)
    return ["%-*s  %s" % (width, k, v) for k, v in rows]
