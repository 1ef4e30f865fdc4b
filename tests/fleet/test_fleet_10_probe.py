# SPDX-License-Identifier: GPL-3.0-or-later
"""The serving probe (role lb_registration's gpufleet-serving-probe): a wedged engine leaves
rotation by itself, through the node's HAProxy agent, with nothing else restarted, and returns
when the engine is restarted or continued; a healthy node at saturation stays in.

The vLLM stand-in is wedged with `python -m lab fault NODE engine-wedge` (its /health and
/metrics answer, completions never return, its counters freeze), the real llama-server by stopping
its process (SIGSTOP on the unit's main PID). How long a wedge takes to leave rotation is a figure
(printed with the lab's timings, and measured by benchmarks/probe_wedge.py), never an assertion:
the waits below are bounds for a prober that does not work.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import yaml

from tests.harness.lab import FLEET_LLAMACPP_NODES, LAB_TIMINGS

pytestmark = pytest.mark.slow

RECORD = "/run/gpufleet/serving-probe.json"
#: A bound for a prober that does not work, not a target (the probe's deadline is 10 s).
BOUND = 120


def _vllm_node(fleet):
    for node in fleet.healthy:
        if node not in FLEET_LLAMACPP_NODES and fleet.nodes[node]["profile"] == "l40s-4x-switch":
            return node
    pytest.fail("the fleet has no healthy vLLM node of profile l40s-4x-switch")


def _llamacpp_node(fleet):
    nodes = [n for n in fleet.healthy if n in FLEET_LLAMACPP_NODES]
    if not nodes:
        pytest.fail(
            f"the fleet has no healthy llama.cpp node (profiles: {[fleet.nodes[n]['profile'] for n in fleet.healthy]})"
        )
    return nodes[0]


def _record(fleet, node):
    return json.loads(fleet.sh(node, f"cat {RECORD}"))


def _pids(fleet, node, *units):
    return {u: fleet.sh(node, f"systemctl show -p MainPID --value {u}").strip() for u in units}


def _wait(fleet, node, agent_word, running, bound=BOUND):
    """Poll the node's agent and the pool until the agent says ``agent_word`` (a prefix) and the
    server's op_state is (or is not) ``running``; returns (seconds, answer, pool entry)."""
    t0 = time.monotonic()
    answer, entry = None, {}
    while time.monotonic() - t0 < bound:
        answer = fleet.agent_verdict(node)
        entry = fleet.pool().get(node, {})
        if answer.startswith(agent_word) and (entry.get("op_state") == "running") == running:
            break
        time.sleep(0.3)
    return time.monotonic() - t0, answer, entry


def _leaves_and_returns(fleet, node, server_unit, wedge, unwedge, word, label):
    assert fleet.agent_verdict(node) == "up" and fleet.pool()[node]["op_state"] == "running"
    assert _record(fleet, node)["verdict"] == "serving"
    others = [u for u in ("gpufleet-serving-probe.service", "gpufleet-gpu-health-watch.service") if u]
    before = _pids(fleet, node, server_unit, *others)
    fleet.changed(node)
    try:
        wedge()
        seconds, answer, entry = _wait(fleet, node, "down", running=False)
        LAB_TIMINGS.append((f"{label} on {node} to out of rotation", seconds, 0))
        assert answer == f"down #{word}", (answer, seconds, _record(fleet, node))
        assert entry.get("op_state") != "running", (entry, seconds)
        record = _record(fleet, node)
        assert record["boot_id"] == fleet.nodes[node]["boot_id"], record
        # nothing was restarted: not the server, not the prober, not the health watcher
        assert _pids(fleet, node, server_unit, *others) == before
        journal = fleet.sh(node, "journalctl -b --no-pager -o cat -u gpufleet-serving-probe.service")
        assert record["verdict"] in journal and "no answer within the deadline" in journal, journal[-2000:]
    finally:
        unwedge()
    seconds, answer, entry = _wait(fleet, node, "up", running=True)
    LAB_TIMINGS.append((f"{label} on {node} ended to back in rotation", seconds, 0))
    assert answer == "up" and entry.get("op_state") == "running", (answer, entry, _record(fleet, node))
    assert _record(fleet, node)["verdict"] == "serving"
    fleet.restored(node)


def test_a_wedged_vllm_engine_leaves_rotation_and_returns_when_restarted(fleet, converged):
    node = _vllm_node(fleet)

    def unwedge():
        fleet.sh(node, "systemctl restart vllm.service")
        fleet.lab("fault", node, "clear")

    _leaves_and_returns(
        fleet,
        node,
        "vllm.service",
        lambda: fleet.lab("fault", node, "engine-wedge"),
        unwedge,
        "engine-wedged",
        "vLLM engine wedge",
    )


def test_a_stopped_llama_server_leaves_rotation_and_returns_when_continued(fleet, converged):
    node = _llamacpp_node(fleet)
    pid = _pids(fleet, node, "llama-server.service")["llama-server.service"]
    assert pid not in ("", "0")
    # SIGSTOP: the port still accepts connections and nothing answers, /metrics neither: down
    _leaves_and_returns(
        fleet,
        node,
        "llama-server.service",
        lambda: fleet.sh(node, f"kill -STOP {pid}"),
        lambda: fleet.sh(node, f"kill -CONT {pid}"),
        "engine-down",
        "llama-server stop",
    )


def test_a_saturated_node_stays_in_rotation(fleet, converged, tmp_path):
    """The collection's load test at three times the node's max_num_seqs: requests wait in the
    engine's queue, the probe with them, and the node is never taken out."""
    node = _vllm_node(fleet)
    config = yaml.safe_load(fleet.sh(node, "cat /etc/vllm/config.yaml"))
    seqs = int(config["max_num_seqs"])
    concurrency = 3 * seqs
    done = threading.Event()
    result = {}

    def load():
        try:
            result["run"] = fleet.playbook(
                "load_test.yml",
                limit=node,
                extra_vars=[
                    f"load_test_concurrency={concurrency}",
                    "load_test_duration=25",
                    "load_test_max_tokens=256",
                    "load_test_timeout=120",
                    "load_test_report_only=true",
                    f"load_test_output_dir={tmp_path}",
                ],
                label=f"load_test.yml --limit {node} (concurrency {concurrency}, 3x max_num_seqs)",
            )
        finally:
            done.set()

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    answers, states, verdicts = set(), set(), set()
    while not done.is_set():
        answers.add(fleet.agent_verdict(node))
        states.add(fleet.pool().get(node, {}).get("op_state"))
        verdicts.add(_record(fleet, node)["verdict"])
        time.sleep(0.5)
    thread.join()
    run = result["run"]
    assert run.rc == 0, run.explain()
    report = json.loads((tmp_path / f"{node}.json").read_text())
    # the engine was saturated: requests waited behind max_num_seqs running ones
    assert report["server"]["num_requests_waiting_peak"] > 0, report["server"]
    assert report["server"]["num_requests_running_peak"] >= seqs, report["server"]
    assert answers == {"up"} and states == {"running"}, (answers, states, verdicts)
    assert verdicts <= {"serving", "busy"}, verdicts
