# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab's Prometheus after site.yml (lab/prometheus.py; role monitoring's rules and dashboard).

One converged fleet, one look: every lab node's node_exporter target and every serving fleet
node's vLLM target up (and HAProxy's exporter), the gate metrics of every fleet node with the
verdict site.yml reached, GpufleetNcclGateFailed firing for the node that must stay out and for no
other (the lab's rules give it `for: 5s`), and every panel expression of the dashboard returning at
least one series (the drift panel reads the drift report's metrics: drift.yml runs once if no test
has run it yet, with GPUFLEET_DRIFT_DIR on the directory the lab's drift exporter serves).
"""

from __future__ import annotations

import time
from pathlib import Path

from tests import support

GATE_ALERT = "GpufleetNcclGateFailed"
WAIT = 60.0  # scrapes every 2 s, rules every 1 s, the alert's `for:` 5 s


def look(url):
    """Targets by job and node, the gate verdicts and the gate alert's nodes, as Prometheus has them now."""
    targets = {}
    for t in support.prometheus_api(url, "targets", state="active")["activeTargets"]:
        labels = t["labels"]
        targets.setdefault(labels["job"], {})[labels.get("node") or labels.get("balancer")] = (
            t["health"],
            t["lastError"],
        )

    def by_node(query):
        return {
            r["metric"]["node"]: float(r["value"][1])
            for r in support.prometheus_api(url, "query", query=query)["result"]
        }

    alerts = support.prometheus_api(url, "alerts")["alerts"]
    return {
        "targets": targets,
        "passed": by_node('gpufleet_nccl_gate_passed{job="gpufleet_node"}'),
        "judged": by_node('gpufleet_nccl_gate_judged_busbw_gbps{job="gpufleet_node"}'),
        "threshold": by_node('gpufleet_nccl_gate_threshold_gbps{job="gpufleet_node"}'),
        "firing": {
            a["labels"]["node"] for a in alerts if a["labels"]["alertname"] == GATE_ALERT and a["state"] == "firing"
        },
    }


def test_prometheus_sees_the_converged_fleet(converged):
    fleet = converged
    st = fleet.status(refresh=True)
    prom = st["prometheus"]
    url = prom["url"]
    lab_nodes = [n["name"] for n in st["nodes"]]
    serving = fleet.healthy  # the fleet's nodes site.yml registers (and so serves vLLM on)

    def settled(s):
        t = s["targets"]
        return (
            all(t.get("gpufleet_node", {}).get(n, ("",))[0] == "up" for n in lab_nodes)
            and all(t.get("gpufleet_vllm", {}).get(n, ("",))[0] == "up" for n in serving)
            and set(fleet.names) <= set(s["passed"])
            and set(fleet.refused) <= s["firing"]
        )

    t0 = time.monotonic()
    while not settled(seen := look(url)) and time.monotonic() - t0 < WAIT:
        time.sleep(1)
    print(f"\nPrometheus {url}: settled {time.monotonic() - t0:.1f} s after site.yml")
    targets = seen["targets"]

    # every lab node's node_exporter; vLLM of the serving nodes, none of a node that never serves
    assert {n: h for n, (h, _e) in targets["gpufleet_node"].items()} == dict.fromkeys(lab_nodes, "up"), targets
    for node in serving:
        assert targets["gpufleet_vllm"][node][0] == "up", (node, targets["gpufleet_vllm"])
    assert not set(fleet.refused) & set(targets["gpufleet_vllm"]), "a node that never serves is scraped for vLLM"
    assert targets["gpufleet_haproxy"] == {"lab-balancer": ("up", "")}, targets
    assert targets["gpufleet_drift"] and all(h == "up" for h, _e in targets["gpufleet_drift"].values()), targets

    # the gate's metrics of every fleet node, with site.yml's verdict
    for node in fleet.names:
        assert seen["passed"].get(node) == (0.0 if node in fleet.refused else 1.0), (node, seen["passed"])
        assert node in seen["judged"] and seen["threshold"].get(node, 0) > 0, (node, seen)
    for node in fleet.refused:  # the degraded node's bandwidth is below its threshold
        assert seen["judged"][node] < seen["threshold"][node], seen

    # the gate alert fires for the node that must stay out, and for no other fleet node; anywhere
    # in the lab it fires only where a gate failed
    assert seen["firing"] & set(fleet.names) == set(fleet.refused), seen["firing"]
    assert seen["firing"] <= {n for n, v in seen["passed"].items() if v == 0}, seen

    # every dashboard panel returns a series (the drift panel needs a drift report)
    if not (Path(prom["drift_dir"]) / "gpufleet_drift.prom").exists():
        run = fleet.drift(drift_dir=prom["drift_dir"], label="drift.yml --check --diff (for the dashboard)")
        assert (Path(prom["drift_dir"]) / "gpufleet_drift.prom").exists(), run.explain()
    deadline = time.monotonic() + 20
    while True:
        results = support.evaluate_dashboard(url)
        empty = {k: v for k, v in results.items() if not isinstance(v, int) or v < 1}
        if not empty or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert len(results) >= 12
    assert not empty, "dashboard panels without a series (or refused):\n" + "\n".join(
        f"  {title}: {expr} -> {v}" for (title, expr), v in empty.items()
    )
