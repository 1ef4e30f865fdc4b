# SPDX-License-Identifier: GPL-3.0-or-later
"""_recycle: telling fragmentation from preemption/placement (the mixed A6000/4090 field
report), the textfile metrics; and the node agent run against a fake unit, server and balancer (it drives the balancer with the
collection's one runtime-API client, _haproxy, tested in test_haproxy.py)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
from pathlib import Path

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.common import _atomic as files
from ansible_collections.gpufleet.node.plugins.module_utils.common import _http as web
from ansible_collections.gpufleet.node.plugins.module_utils.lb import _haproxy as hx
from ansible_collections.gpufleet.node.plugins.module_utils.serving import _recycle as rc
from ansible_collections.gpufleet.node.plugins.module_utils.serving import _vllm_metrics as vm
from tests.harness.http import FakeHTTP, MetricsServer
from tests.unit.test_haproxy import fake_haproxy

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "roles" / "worker_recycle" / "files" / "gpufleet_worker_recycle.py"
MiB = 1024 * 1024


def history(rss_mib, p95):
    return [
        {"time": 60.0 * i, "rss_bytes": int(r * MiB), "ttft_p95": p}
        for i, (r, p) in enumerate(zip(rss_mib, p95, strict=True))
    ]


def test_slope():
    assert rc.slope([(0, 0), (1, 2), (2, 4)]) == pytest.approx(2.0)
    assert rc.slope([(0, 1)]) is None and rc.slope([(1, 1), (1, 2)]) is None


def test_too_few_samples_is_no_verdict():
    v = rc.judge(history([1000, 2000, 3000], [0.4, 0.8, 1.6]))
    assert v["classification"] == "insufficient_data" and not v["recycle"]


def test_fragmentation_rss_and_p95_rising_together_recycles():
    v = rc.judge(history([20000, 20100, 20230, 20300, 20420, 20500], [0.41, 0.48, 0.55, 0.66, 0.74, 0.83]))
    assert v["classification"] == "fragmentation" and v["recycle"]
    assert v["rss_slope_mib_per_min"] == pytest.approx(98.0, abs=3)
    assert "fragmentation" in v["reason"]


def test_memory_growth_with_flat_p95_recycles_too():
    v = rc.judge(history([20000, 20100, 20200, 20300, 20400], [0.41, 0.40, 0.42, 0.41, 0.40]))
    assert v["classification"] == "memory_growth" and v["recycle"]


def test_preemption_or_placement_p95_rising_rss_flat_is_not_recycled():
    v = rc.judge(history([20000, 20003, 19998, 20001, 20002, 20000], [0.41, 0.6, 0.9, 1.3, 2.0, 3.9]))
    assert v["classification"] == "preemption_or_placement" and not v["recycle"]
    assert "vllm:num_preemptions_total" in v["reason"]


def test_flat_is_steady_and_jitter_or_one_jump_is_not_growth():
    assert rc.judge(history([20000] * 6, [0.4] * 6))["classification"] == "steady"
    # a p95 jittering between two 20 ms buckets is not a rise, however large in relative terms
    jitter = rc.judge(history([20000] * 6, [0.03, 0.03, 0.04, 0.05, 0.05, 0.06]))
    assert jitter["ttft_p95_rise"] > 0.25 and not jitter["ttft_rising"] and jitter["classification"] == "steady"
    # a one-off jump (model reload, a big batch) is not a steady slope: most steps do not go up
    jump = rc.judge(history([20000, 20000, 20000, 23000, 23000, 23000], [0.4] * 6))
    assert jump["rss_slope_mib_per_min"] > 50 and not jump["rss_rising"] and not jump["recycle"]
    # a slope under the threshold
    slow = rc.judge(history([20000, 20010, 20020, 20030, 20040, 20050], [0.4] * 6))
    assert slow["rss_rising"] is False and slow["classification"] == "steady"


def test_window_only_judges_the_last_samples():
    old_growth = [20000 + 500 * i for i in range(10)] + [25000] * 12
    v = rc.judge(history(old_growth, [0.4] * 22), {"window": 12})
    assert v["classification"] == "steady" and v["samples"] == 12


def test_textfile_parses_as_prometheus_and_carries_the_class():
    v = rc.judge(history([20000, 20100, 20230, 20300, 20420, 20500], [0.41, 0.48, 0.55, 0.66, 0.74, 0.83]))
    text = rc.textfile(v, {"recycles": 3, "failures": 1, "last_recycle": 1.7e9, "last_recycle_kind": "fragmentation"})
    from prometheus_client.parser import text_string_to_metric_families

    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert values[("gpufleet_worker_decay", (("kind", "fragmentation"),))] == 1.0
    assert values[("gpufleet_worker_decay", (("kind", "steady"),))] == 0.0
    assert values[("gpufleet_worker_recycles_total", ())] == 3.0
    assert values[("gpufleet_worker_last_recycle_kind", (("kind", "fragmentation"),))] == 1.0
    assert values[("gpufleet_worker_rss_slope_bytes_per_second", ())] == pytest.approx(98 * MiB / 60, rel=0.05)


# --- the drain wait: a failed scrape is no proof that nothing runs --------------------------------


class FakeClock:
    """time.monotonic and time.sleep for drain_wait: sleeping moves the clock."""

    def __init__(self):
        self.now = 100.0
        self.sleeps = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def counts(*answers):
    """running() answering each of ``answers`` in turn (an exception is raised), the last for good."""
    answers = list(answers)

    def running():
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return running


def wait(running, timeout=10):
    clock = FakeClock()
    return rc.drain_wait(running, timeout, sleep=clock.sleep, clock=clock.clock), clock


def test_drain_wait_ends_when_no_request_runs():
    record, clock = wait(counts(3.0, 1.0, 0.0))
    assert (record["drained"], record["running"], record["scrapes"], record["failed_scrapes"]) == (True, 0.0, 3, 0)
    assert clock.sleeps == [1.0, 1.0] and record["reason"] == "no request running after 2.0 s"


def test_drain_wait_a_failed_scrape_waits_to_the_timeout_and_is_reported():
    record, clock = wait(counts(web.HttpError("http://127.0.0.1:8000/metrics", "connection refused")), timeout=10)
    assert not record["drained"] and record["running"] is None
    assert record["seconds"] == 10.0 and sum(clock.sleeps) == 10.0  # bounded by the drain timeout
    assert record["failed_scrapes"] == record["scrapes"] == 11
    assert "connection refused" in record["last_error"] and record["reason"].startswith(
        "could not tell whether requests still run: 11 of 11 scrape(s) failed in 10.0 s (the drain timeout), last: "
    )


def test_drain_wait_failed_scrapes_then_a_count_of_zero_is_drained():
    record, _clock = wait(counts(vm.MetricsError("not Prometheus text exposition"), RuntimeError("HTTP 503"), 0.0))
    assert (record["drained"], record["scrapes"], record["failed_scrapes"]) == (True, 3, 2)
    assert record["last_error"] == "RuntimeError: HTTP 503"


def test_drain_wait_a_count_that_is_no_count_is_a_failed_scrape():
    for bad in (float("nan"), -1.0):
        record, _clock = wait(counts(bad), timeout=3)
        assert not record["drained"] and record["running"] is None and record["failed_scrapes"] == 4, record


def test_drain_wait_requests_still_running_at_the_timeout():
    record, _clock = wait(counts(2.0, RuntimeError("HTTP 503")), timeout=5)
    assert not record["drained"] and record["running"] == 2.0 and record["seconds"] == 5.0
    assert record["reason"] == (
        "2 request(s) still running after 5.0 s (the drain timeout); 5 scrape(s) failed, last: RuntimeError: HTTP 503"
    )


def test_drain_wait_without_time_scrapes_once():
    record, clock = wait(counts(RuntimeError("HTTP 503")), timeout=0)
    assert (record["scrapes"], record["drained"], clock.sleeps) == (1, False, [])


# --- the agent, on a fake systemd and server ----------------------------------------------------


def load_agent():
    loader = importlib.machinery.SourceFileLoader("gpufleet_worker_recycle", str(AGENT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture
def agent_env(tmp_path, monkeypatch):
    agent = load_agent()
    httpd = MetricsServer(['vllm:num_requests_running{engine="0"} 0.0\n'])
    base = httpd.url
    calls = []
    rss = {"value": 20000 * MiB}
    clock = {"t": 1000.0}

    def systemctl(*args, check=True):
        calls.append(args)
        return "MainPID=4242\nControlGroup=\n" if args[0] == "show" else ""

    monkeypatch.setattr(agent, "systemctl", systemctl)
    monkeypatch.setattr(agent, "rss_bytes", lambda pids, proc_root="/proc": rss["value"])
    monkeypatch.setattr(agent.time, "time", lambda: clock["t"])
    config = {
        "unit": "vllm.service",
        "metrics_url": base + "/metrics",
        "health_url": base + "/health",
        "state_file": str(tmp_path / "state.json"),
        "textfile": str(tmp_path / "w.prom"),
        "status_file": str(tmp_path / "status.json"),
        "drain_timeout": 1,
        "health_timeout": 2,
        "judge": {"window": 6, "min_samples": 4, "rss_slope_mib_per_min": 50},
    }
    yield agent, config, calls, rss, clock
    httpd.close()


def run_until_restart(agent, config, calls, rss, clock, growth_mib):
    run = agent.Agent(config, vm, rc, hx, web, files)
    codes = []
    for _ in range(6):
        rss["value"] += growth_mib * MiB
        codes.append(run.run())
        clock["t"] += 60
        if any(c[0] == "restart" for c in calls):
            break
    return codes


def test_agent_flat_rss_never_restarts(agent_env, tmp_path):
    agent, config, calls, rss, clock = agent_env
    config["balancer"] = {"method": "none"}
    assert run_until_restart(agent, config, calls, rss, clock, 0) == [0] * 6
    assert [c for c in calls if c[0] == "restart"] == []
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["classification"] == "steady" and status["recycles"] == 0


def test_agent_drains_restarts_and_returns_on_growth(agent_env, tmp_path):
    agent, config, calls, rss, clock = agent_env
    endpoint, seen, lb = fake_haproxy(count=2)
    config["balancer"] = {"method": "runtime_api", "endpoint": endpoint, "backend": "vllm_pool", "server": "node1"}
    with lb:
        codes = run_until_restart(agent, config, calls, rss, clock, 200)
    assert codes == [0, 0, 0, 0]  # judged at the 4th sample, recycled in the same run
    assert ("restart", "vllm.service") in calls
    assert seen == ["set server vllm_pool/node1 state drain\n", "set server vllm_pool/node1 state ready\n"]
    status = json.loads((tmp_path / "status.json").read_text())
    assert (status["recycles"], status["last_recycle_kind"], status["recycled"]) == (1, "memory_growth", True)
    assert "gpufleet_worker_recycles_total 1.0" in (tmp_path / "w.prom").read_text()
    assert json.loads((tmp_path / "state.json").read_text())["history"] == []  # a fresh window after


def test_agent_leaves_the_node_drained_when_health_does_not_come_back(agent_env, tmp_path):
    agent, config, calls, rss, clock = agent_env
    endpoint, seen, lb = fake_haproxy(count=2)
    config["balancer"] = {"method": "runtime_api", "endpoint": endpoint, "backend": "vllm_pool", "server": "node1"}
    config["health_url"] = "http://127.0.0.1:9/health"
    with lb:
        codes = run_until_restart(agent, config, calls, rss, clock, 200)
    assert codes[-1] == 1
    assert seen == ["set server vllm_pool/node1 state drain\n"]  # never returned
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["failures"] == 1 and status["recycles"] == 0 and "stays drained" in status["error"]


def test_a_recycle_the_pools_budget_refuses_is_deferred_not_failed(agent_env, tmp_path, monkeypatch):
    """balancer method agent with the pool's decider: the decider's metrics (prometheus_client's
    exposition, as gpufleet-pool-decider serves it) say the removal is pending, so the run withdraws
    its drain request, restarts nothing, counts no failure, and the next run judges again."""
    agent, config, calls, rss, clock = agent_env
    from ansible_collections.gpufleet.node.plugins.module_utils.lb import _budget

    pending = (
        "# HELP gpufleet_pool_budget_pending 1 while a removal waits for the budget.\n"
        "# TYPE gpufleet_pool_budget_pending gauge\n"
        'gpufleet_pool_budget_pending{backend="vllm_pool",reason="recycle",server="node1"} 1.0\n'
    )
    decider = MetricsServer([pending])
    request = tmp_path / "request.json"
    config["balancer"] = {
        "method": "agent",
        "request_file": str(request),
        "settle": 0,
        "decider": {"url": decider.url + "/metrics", "backend": "vllm_pool", "server": "node1", "wait": 0},
    }
    monkeypatch.setattr(
        agent, "systemctl", lambda *a, check=True: "MainPID=4242\nControlGroup=\n" if a[0] == "show" else "active\n"
    )
    run = agent.Agent(config, vm, rc, hx, web, files, budget=_budget)
    codes = []
    with decider:
        for _ in range(5):
            rss["value"] += 200 * MiB
            codes.append(run.run())
            clock["t"] += 60
    assert codes == [0] * 5 and not request.exists()
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["recycle"] and not status["recycled"] and status["failures"] == 0, status
    assert "the pool's budget refused the drain for now (recycle)" in status["deferred"], status
    assert json.loads((tmp_path / "state.json").read_text())["history"], "the window is kept: judged again"


def test_agent_command_method(agent_env, tmp_path):
    agent, config, calls, rss, clock = agent_env
    marks = tmp_path / "marks"
    config["balancer"] = {
        "method": "command",
        "drain_command": ["sh", "-c", "echo drain >> %s" % marks],
        "return_command": ["sh", "-c", "echo ready >> %s" % marks],
    }
    assert run_until_restart(agent, config, calls, rss, clock, 200)[-1] == 0
    assert marks.read_text().split() == ["drain", "ready"]


def test_agent_configuration_errors_exit_2(tmp_path):
    agent = load_agent()
    assert agent.main(["--config", str(tmp_path / "missing.json")]) == 2
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"lib_dir": str(tmp_path / "nowhere")}))
    assert agent.main(["--config", str(cfg)]) == 2


def test_textfile_write_does_not_follow_symlinks(agent_env, tmp_path):
    """The agent runs as root and writes into a textfile directory another user may write to: a
    symlink planted at the old predictable temporary name (path.PID.tmp) or a fixed name must not
    make it write through to the link's target."""
    agent, config, calls, rss, clock = agent_env
    config["balancer"] = {"method": "none"}
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    victim.chmod(0o600)
    textfile = tmp_path / "w.prom"
    for planted in ("%s.%d.tmp" % (textfile, os.getpid()), "%s.tmp" % textfile):
        os.symlink(victim, planted)
    agent.Agent(config, vm, rc, hx, web, files).run()
    assert victim.read_text() == "root's file\n" and oct(victim.stat().st_mode & 0o777) == "0o600"
    assert "gpufleet_worker_rss_bytes" in textfile.read_text() and not textfile.is_symlink()
    assert oct(textfile.stat().st_mode & 0o777) == "0o644"
    assert oct((tmp_path / "state.json").stat().st_mode & 0o777) == "0o600"
    # a symlink at the target itself is replaced by the new file, not written through
    textfile.unlink()
    os.symlink(victim, textfile)
    files.write(str(textfile), "new\n")
    assert victim.read_text() == "root's file\n" and textfile.read_text() == "new\n" and not textfile.is_symlink()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    assert leftovers == []


# --- the agent's drain wait on a server whose /metrics fails: it waits, then restarts, and says so -


def recycle_with_metrics(agent_env, tmp_path, capsys, metrics_url):
    """The agent recycling a growing worker whose /metrics fails as ``metrics_url`` does; returns
    the status file and the log."""
    agent, config, calls, rss, clock = agent_env
    config.update(balancer={"method": "none"}, metrics_url=metrics_url, drain_timeout=1)
    codes = run_until_restart(agent, config, calls, rss, clock, 200)
    assert codes[-1] == 0 and ("restart", "vllm.service") in calls
    status = json.loads((tmp_path / "status.json").read_text())
    drain = status["drain"]
    # it looked for the whole drain timeout, more than once, and never read the failure as zero
    assert not drain["drained"] and drain["running"] is None, drain
    assert drain["seconds"] >= 1.0 and drain["failed_scrapes"] == drain["scrapes"] >= 2, drain
    log = capsys.readouterr().out
    assert "recycle: drain not confirmed: could not tell whether requests still run" in log, log
    return drain, log


def test_agent_drain_wait_when_metrics_does_not_answer(agent_env, tmp_path, capsys):
    drain, _log = recycle_with_metrics(agent_env, tmp_path, capsys, "http://127.0.0.1:9/metrics")
    assert drain["last_error"].startswith("HttpError")


def test_agent_drain_wait_when_metrics_answers_an_error_status(agent_env, tmp_path, capsys):
    with FakeHTTP({"/metrics": (503, "vllm:num_requests_running 0.0\n")}) as srv:
        drain, _log = recycle_with_metrics(agent_env, tmp_path, capsys, srv.url + "/metrics")
    assert "answered HTTP 503" in drain["last_error"]


def test_agent_drain_wait_when_metrics_is_not_prometheus_text(agent_env, tmp_path, capsys):
    with FakeHTTP({"/metrics": "<html>502 Bad Gateway</html>{"}) as srv:
        drain, _log = recycle_with_metrics(agent_env, tmp_path, capsys, srv.url + "/metrics")
    assert drain["last_error"].startswith("MetricsError")


def test_agent_drain_wait_when_metrics_has_no_running_requests_gauge(agent_env, tmp_path, capsys):
    with FakeHTTP({"/metrics": "process_resident_memory_bytes 1.0e9\n"}) as srv:
        drain, _log = recycle_with_metrics(agent_env, tmp_path, capsys, srv.url + "/metrics")
    assert (
        "has no running-requests gauge (vllm:num_requests_running or llamacpp:requests_processing)"
        in (drain["last_error"])
    )


def test_standing_reads_one_servers_series_by_name_and_labels():
    """What the recycle reads of the pool's decider (lb/_budget.standing: prometheus_client's parser,
    which the recycle needs anyway; the stdlib-only budget tests run on the nodes' Pythons too)."""
    from ansible_collections.gpufleet.node.plugins.module_utils.lb import _budget

    text = (
        "# TYPE gpufleet_pool_budget_held gauge\n"
        'gpufleet_pool_budget_held{backend="vllm_pool",reason="recycle",server="node1"} 1.0\n'
        'gpufleet_pool_budget_held{backend="other_pool",reason="xid",server="node2"} 1.0\n'
        "# TYPE gpufleet_pool_budget_pending gauge\n"
        'gpufleet_pool_budget_pending{backend="vllm_pool",reason="gate-failed",server="node3"} 1.0\n'
    )
    assert _budget.standing(text, "vllm_pool", "node1") == ("held", "recycle")
    assert _budget.standing(text, "vllm_pool", "node2") == (None, None)  # another backend's
    assert _budget.standing(text, "vllm_pool", "node3") == ("pending", "gate-failed")
    assert _budget.standing("", "vllm_pool", "node1") == (None, None)
    with pytest.raises(ValueError):
        _budget.standing("this is { not metrics", "vllm_pool", "node1")
