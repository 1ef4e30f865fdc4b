# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet-pool-decider: the one place that decides removals from the serving pool, with a budget.

Runs on the balancer host (role gpufleet.node.pool_decider: a systemd service, or a plain daemon
where no systemd runs). Every few seconds it reads the backend's servers through HAProxy's
runtime API (the collection's client, module_utils ``lb/_haproxy``: ``show servers state``), asks
each server's HAProxy agent itself (the agent's protocol: connect, read one line; the balancer is
in every agent's allow list), and decides with the pool's budget (module_utils ``lb/_budget``):

    up #hold-WORD      the node still serves but reports a fault the budget judges (its GPU
                       health, its gate): drained (`set server B/S state drain`) if the budget
                       allows, else a refused removal (pending: logged, counted, retried every poll)
    up                 a server the decider drained returns (`set server B/S state ready`): only
                       its own drains are ever lifted, never an operator's
    down ..., none     nothing: HAProxy's own agent check already takes the server out

Its state (what it drained, when and why; the refused removals) is kept in a JSON file, written
atomically, so that a restart keeps it; a state file it cannot read stops it (exit 2) rather than
forgetting which servers it drained. Its Prometheus metrics (with the configuration's
metrics_port): gpufleet_pool_budget_refused_total, gpufleet_pool_budget_pending,
gpufleet_pool_budget_held (labels backend, server, reason), gpufleet_pool_budget_limit,
gpufleet_pool_budget_servers and gpufleet_pool_decider_poll_ok (label backend).

    python3 /usr/local/lib/gpufleet/gpufleet_pool_decider.py --config /etc/gpufleet/pool-decider.json [--once]

The collection's module_utils are imported by their full names from the copy the role installs
beside this file (``ansible_collections/gpufleet/node/plugins/module_utils/...``).
"""

import argparse
import os
import signal
import sys
import threading
import traceback

TREE = "ansible_collections/gpufleet/node/plugins/module_utils"


def log(message):
    sys.stderr.write("gpufleet-pool-decider: %s\n" % message)
    sys.stderr.flush()


class Metrics:
    """A prometheus_client collector of the decider's latest snapshot (no stale label sets: each
    scrape says what is pending and held now)."""

    def __init__(self, decider, status, budget):
        self.decider = decider
        self.status = status
        self.budget = budget  # module_utils lb/_budget: the series the nodes read have their names there

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snap = self.decider.snapshot
        backend = snap["backend"]
        labels = ["backend", "server", "reason"]
        refused = CounterMetricFamily(
            "gpufleet_pool_budget_refused",
            "Removals from the pool that the budget refused (each counted when it became pending).",
            labels=labels,
        )
        for (server, reason), count in sorted(snap["refused"].items()):
            refused.add_metric([backend, server, reason], count)
        pending = GaugeMetricFamily(
            self.budget.PENDING_SERIES,
            "1 while a removal the budget refused waits (retried every poll).",
            labels=labels,
        )
        for server, reason in sorted(snap["pending"].items()):
            pending.add_metric([backend, server, reason], 1)
        held = GaugeMetricFamily(
            self.budget.HELD_SERIES, "1 while the decider holds the server drained.", labels=labels
        )
        for server, reason in sorted(snap["held"].items()):
            held.add_metric([backend, server, reason], 1)
        metrics = [refused, pending, held]
        for name, key, text in (
            ("gpufleet_pool_budget_limit", "limit", "How many of the backend's servers the decider may have out."),
            ("gpufleet_pool_budget_servers", "servers", "The backend's servers at the last poll."),
        ):
            if snap[key] is not None:
                family = GaugeMetricFamily(name, text, labels=["backend"])
                family.add_metric([backend], snap[key])
                metrics.append(family)
        ok = GaugeMetricFamily(
            "gpufleet_pool_decider_poll_ok",
            "1 when the last poll read the backend and applied its decision, 0 when it failed.",
            labels=["backend"],
        )
        ok.add_metric([backend], 1 if self.status["ok"] else 0)
        metrics.append(ok)
        return metrics


def serve_metrics(decider, status, address, port, budget):
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Metrics(decider, status, budget))
    start_http_server(port, addr=address or "0.0.0.0", registry=registry)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="gpufleet-pool-decider", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", default="/etc/gpufleet/pool-decider.json", help="the decider's configuration (JSON)"
    )
    parser.add_argument("--once", action="store_true", help="one poll, then exit (1 when it failed)")
    args = parser.parse_args(argv)
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        if not os.path.isdir(os.path.join(here, TREE)):
            raise ImportError("no %s" % TREE)
        sys.path.insert(0, here)
        from ansible_collections.gpufleet.node.plugins.module_utils.lb import _budget, _haproxy
    except ImportError as exc:
        log("%s (the role installs the collection's code the decider imports under %s/%s)" % (exc, here, TREE))
        return 2
    try:
        config = _budget.load_config(args.config)
        api = _haproxy.RuntimeAPI(config["socket"], timeout=5.0)
        decider = _budget.Decider(config, api, log=log)
    except (_budget.BudgetError, _haproxy.HAProxyError) as exc:
        log("cannot start: %s" % exc)
        return 2
    status = {"ok": False}
    if config["metrics_port"] and not args.once:
        try:
            serve_metrics(decider, status, config["metrics_address"], config["metrics_port"], _budget)
        except (OSError, ImportError) as exc:
            log(
                "cannot serve metrics on %s:%s: %s (the Python library prometheus-client: Debian "
                "python3-prometheus-client)" % (config["metrics_address"] or "*", config["metrics_port"], exc)
            )
            return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: stop.set())
    budget = config["budget"]
    log(
        "deciding removals from backend %s (at most %g of its servers drained within %g s, %d kept in "
        "rotation), state %s"
        % (config["backend"], budget.fraction, budget.window, budget.min_kept, config["state_file"])
    )
    problem = None
    while True:
        try:
            decider.poll()
            status["ok"] = True
            if problem:
                log("polling again: %s" % config["backend"])
            problem = None
        except _haproxy.HAProxyError as exc:
            status["ok"] = False
            if str(exc) != problem:  # once per new problem, not every poll
                log("cannot read backend %s: %s" % (config["backend"], exc))
            problem = str(exc)
        except Exception as exc:  # a state that cannot be saved, a bug: said, and tried again
            status["ok"] = False
            if str(exc) != problem:
                log("poll failed: %s: %s\n%s" % (type(exc).__name__, exc, traceback.format_exc().rstrip()))
            problem = str(exc)
        if args.once:
            return 0 if status["ok"] else 1
        if stop.wait(config["interval"]):
            break
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
