# SPDX-License-Identifier: GPL-3.0-or-later
"""The collection's Grafana dashboard (its panels and their PromQL) and a live Prometheus' HTTP API."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

from tests.harness import REPO

DASHBOARD = REPO / "roles" / "monitoring" / "files" / "gpufleet.dashboard.json"
# What a dashboard variable stands for when the expression runs outside Grafana.
DASHBOARD_VALUES = {"__rate_interval": "5m", "node": ".+", "backend": "vllm_pool"}


def dashboard():
    return json.loads(DASHBOARD.read_text())


def dashboard_panels(board):
    """Every panel of a dashboard, those inside rows included."""
    for p in board["panels"]:
        yield p
        yield from p.get("panels", [])


def dashboard_queries(board=None, values=None):
    """[(panel title, PromQL)] with the dashboard's variables replaced by ``values``."""
    values = {**DASHBOARD_VALUES, **(values or {})}
    out = []
    for p in dashboard_panels(board or dashboard()):
        for t in p.get("targets", []):
            expr = t["expr"]
            for name in sorted(values, key=len, reverse=True):
                expr = expr.replace("${%s}" % name, values[name]).replace("$" + name, values[name])
            out.append((p["title"], expr))
    return out


def prometheus_api(url, path, timeout=10, **params):
    """GET <url>/api/v1/<path>?params from a live Prometheus; its `data` (raises on an error answer:
    an HTTPError carries Prometheus' parse error)."""
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/{path}{query}", timeout=timeout) as resp:
        body = json.load(resp)
    if body.get("status") != "success":
        raise AssertionError(f"Prometheus answered {path} {params}: {body}")
    return body["data"]


def evaluate_dashboard(prometheus_url, values=None, timeout=10):
    """Run every panel's expression against a live Prometheus; return {(title, expr): series
    count, or the error text}. The lab's test asserts every count is at least 1."""
    results = {}
    for title, expr in dashboard_queries(values=values):
        try:
            results[(title, expr)] = len(prometheus_api(prometheus_url, "query", timeout=timeout, query=expr)["result"])
        except Exception as exc:  # an HTTPError carries Prometheus' parse error
            detail = exc.read().decode(errors="replace") if hasattr(exc, "read") else ""
            results[(title, expr)] = f"{exc} {detail}".strip()
    return results
