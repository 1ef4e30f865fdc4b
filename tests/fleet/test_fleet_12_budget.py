# SPDX-License-Identifier: GPL-3.0-or-later
"""The pool's removal budget on a lab of its own: four serving nodes (the session's lab has two,
where a budget of 25 % allows none), one site.yml run with the budget on and a short window
(`-e gpufleet_pool_budget=true pool_decider_window=45`), then a fatal XID on three of the four
nodes at once.

Only the budget's share (one: 25 % of 4) leaves rotation while the others, whose agents hold them
(`up #hold-gpu-health-failed`), still answer the serving probe; the refused removals are exported
by the decider and alerted by the lab's Prometheus (GpufleetPoolBudgetRefused); the rest leave as
the window frees, until one server is left (min kept); a fault on that last one is held, and a
site.yml run that fails it leaves it in rotation too (its removal goes through the budget); and a
node whose probe fails (`lab fault NODE engine-wedge`) leaves at once whatever the budget. No
reboot: the lab goes down after it.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.harness.lab import own_lab
from tests.harness.prometheus import evaluate_dashboard, prometheus_api

pytestmark = [pytest.mark.slow, pytest.mark.needs_lab]

NODES = ["node1", "node2", "node3", "node4"]
FAULTY = NODES[:3]
# long enough for the checks made while two removals are pending (alerts, dashboard) on a loaded machine
WINDOW = 45
# Boot validation (a venv per node) and worker recycling are not what this lab tests: off, to keep
# its one site.yml run short; the GPU health watcher, the prober and the agent are all on.
EXTRA = {
    "gpufleet_pool_budget": True,
    "pool_decider_window": WINDOW,
    "pool_decider_interval": 1,
    "gpufleet_boot_validation": False,
    "gpufleet_worker_recycle": False,
}
# Bounds for a watcher, decider or Prometheus that never acts, not targets.
WAIT_S = 120
PROBE = "/run/gpufleet/serving-probe.json"


@pytest.fixture(scope="module")
def budget_lab():
    with own_lab(["l40s-4x-switch"] * len(NODES), "budget") as lab:
        run = lab.site(extra_vars=[EXTRA], label=f"site.yml (pool budget lab, budget on, window {WINDOW} s)")
        assert run.returncode == 0, run.explain()
        for node in NODES:
            assert lab.recap_ok(run, node), run.explain()
        yield lab


def wait(predicate, what, bound=WAIT_S):
    deadline = time.monotonic() + bound
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            assert value, f"waited {bound} s for {what}"
            return value
        time.sleep(0.5)


def in_rotation(lab, pool=None):
    pool = lab.pool() if pool is None else pool
    return {n for n, s in pool.items() if s["state"] == "ready" and s["op_state"] == "running"}


def drained(lab, pool=None):
    return {n for n, s in (lab.pool() if pool is None else pool).items() if s["state"] == "drain"}


def decider_metrics(lab, name):
    """{server: value} of one of the decider's metrics, read from the lab's Prometheus."""
    url = lab.status()["prometheus"]["url"]
    data = prometheus_api(url, "query", query=name)
    return {r["metric"].get("server"): float(r["value"][1]) for r in data["result"]}


def firing(lab, alertname):
    url = lab.status()["prometheus"]["url"]
    alerts = prometheus_api(url, "alerts")["alerts"]
    return {
        a["labels"].get("server") for a in alerts if a["labels"]["alertname"] == alertname and a["state"] == "firing"
    }


def probe_verdict(lab, node):
    return json.loads(lab.ssh(node, f"cat {PROBE}"))["verdict"]


def test_a_fault_on_three_of_four_nodes_drains_them_within_the_budget(budget_lab):
    lab = budget_lab
    status = lab.status(refresh=True)
    assert status["balancer"]["pool_decider"] == "running", status["balancer"]
    wait(lambda: in_rotation(lab) == set(NODES), "the four nodes in rotation")
    assert [lab.agent(n) for n in NODES] == ["up"] * 4
    # the lab's Prometheus scrapes the decider (site.yml's monitoring play, the budget on)
    wait(lambda: decider_metrics(lab, "gpufleet_pool_budget_servers") == {None: 4.0}, "the decider's metrics")
    assert decider_metrics(lab, "gpufleet_pool_budget_limit") == {None: 1.0}

    t0 = time.monotonic()
    for node in FAULTY:
        lab.lab("fault", node, "xid", "79")
    wait(
        lambda: all(lab.agent(n) == "up #hold-gpu-health-failed" for n in FAULTY),
        "the GPU health watchers' verdicts (the agents hold their nodes for the decider)",
    )
    # one leaves; the decider refuses the other two, which stay in rotation and still serve
    pending = wait(
        lambda: (
            len(decider_metrics(lab, "gpufleet_pool_budget_pending")) == 2
            and decider_metrics(lab, "gpufleet_pool_budget_pending")
        ),
        "two refused removals",
    )
    pool = lab.pool()
    (first,) = drained(lab, pool)
    assert first in FAULTY and set(pending) == set(FAULTY) - {first}, (pool, pending)
    assert in_rotation(lab, pool) == set(NODES) - {first}, pool
    assert decider_metrics(lab, "gpufleet_pool_budget_refused_total") == dict.fromkeys(pending, 1.0)
    for node in pending:
        assert probe_verdict(lab, node) in ("serving", "busy"), node
    wait(lambda: firing(lab, "GpufleetPoolBudgetRefused") == set(pending), "GpufleetPoolBudgetRefused for both")
    # the dashboard's budget panels (tests/fleet/test_fleet_6_prometheus.py evaluates the rest)
    panels = {
        k: v
        for k, v in evaluate_dashboard(lab.status()["prometheus"]["url"]).items()
        if "gpufleet_pool_budget_" in k[1]
    }
    assert len(panels) >= 5 and all(isinstance(v, int) and v >= 1 for v in panels.values()), panels
    log = (lab.state / "pool-decider" / "decider.log").read_text()
    assert all(f"refused to drain vllm_pool/{n}: gpu-health-failed" in log for n in pending), log[-3000:]

    # the window frees the budget: the removal refused first goes, then the last (one is kept)
    second = wait(lambda: drained(lab) - {first}, "the second removal as the window frees", WINDOW + WAIT_S)
    assert len(second) == 1 and time.monotonic() - t0 >= WINDOW - 5, second
    third = wait(lambda: drained(lab) - {first} - second, "the third removal", WINDOW + WAIT_S)
    assert drained(lab) == set(FAULTY) and in_rotation(lab) == {"node4"}, (third, lab.pool())
    wait(lambda: not decider_metrics(lab, "gpufleet_pool_budget_pending"), "no removal pending")
    assert set(decider_metrics(lab, "gpufleet_pool_budget_held")) == set(FAULTY)

    # the last server faults too: the decider keeps it (min kept), and a site.yml run that fails it
    # (its GPU health check) leaves it in rotation as well: its removal goes through the budget
    lab.lab("fault", "node4", "xid", "79")
    wait(lambda: lab.agent("node4") == "up #hold-gpu-health-failed", "node4's watcher verdict")
    wait(lambda: set(decider_metrics(lab, "gpufleet_pool_budget_pending")) == {"node4"}, "node4's refused removal")
    run = lab.site(
        "--tags",
        "gpu_health",
        limit="node4",
        extra_vars=[EXTRA],
        label="site.yml --limit node4 --tags gpu_health (held)",
    )
    assert run.returncode == 2, run.explain()
    failures = " ".join(" ".join(run.host_failures("node4")).split())
    assert "node4 stays in rotation, held for the decider of the pool" in failures, failures
    assert "(its agent says up #hold-gpu-health-failed;" in failures and "GPU health check failed" in failures
    assert in_rotation(lab) == {"node4"} and set(decider_metrics(lab, "gpufleet_pool_budget_pending")) == {"node4"}

    # a node whose probe fails leaves at once, whatever the budget (spent: three drains, one kept)
    lab.lab("fault", "node4", "engine-wedge")
    wait(
        lambda: probe_verdict(lab, "node4") == "wedged" and lab.agent("node4").startswith("down #"),
        "node4's probe to find its engine wedged (its agent says down: not every reason is budgeted)",
    )
    pool = wait(lambda: "node4" not in in_rotation(lab) and lab.pool(), "HAProxy to take node4 out")
    assert pool["node4"]["state"] == "ready" and pool["node4"]["op_state"] != "running", (
        pool
    )  # HAProxy's agent check, not a drain
    assert "node4" not in decider_metrics(lab, "gpufleet_pool_budget_held")
