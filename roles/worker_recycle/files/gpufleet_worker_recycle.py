# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet-worker-recycle: one sample of a vLLM worker's decay, and a recycle when it is due.

Run by gpufleet-worker-recycle.timer (installed by the gpufleet.node.worker_recycle role). Each run:
reads the resident memory of the vLLM unit's processes and the TTFT p95 since the previous run,
judges the window (gpufleet.node's _recycle.judge), logs the verdict, writes Prometheus textfile
metrics and a status file, and - when RSS grows steadily and the action is `recycle` - drains the
node in the balancer, waits (at most drain_timeout) until no request runs - a /metrics scrape that
fails waits on and is reported in the log and the status file's `drain`, never read as "none
running" - restarts the server, waits for /health and returns the node. By default
(balancer method `agent`) it drains by asking the node's own HAProxy agent to report `drain` (a
request file under /run) and returns it with `ready`: the node needs no access to the balancer.

Where the pool has a decider (gpufleet-pool-decider, the balancer's removal budget; the config's
``balancer.decider``), the agent holds the node for it (``up #hold-recycle``) and the decider drains
it within the budget: the recycle waits until the decider's metrics say it holds the node
(``gpufleet_pool_budget_held``), at most ``decider.wait`` seconds. A drain the budget refused (or
metrics that cannot be read: unreadable is not drained) defers the recycle: the request is
withdrawn, nothing is restarted, and the next run tries again.

    python3 /usr/local/lib/gpufleet/gpufleet_worker_recycle.py [--config /etc/gpufleet/worker-recycle.json]
        [--dry-run]

Exit status: 0 (sampled, maybe recycled or deferred by the pool's budget), 1 (a recycle failed:
the node is left drained), 2 (bad configuration).
"""

import argparse
import json
import os
import subprocess
import sys
import time

DEFAULT_CONFIG = "/etc/gpufleet/worker-recycle.json"
#: The collection's module_utils, as the role copies them into the lib dir (imported by their
#: collection names, as a module imports them).
TREE = "ansible_collections/gpufleet/node/plugins/module_utils"
#: The node's HAProxy agent (role lb_registration), which balancer method `agent` asks to drain.
AGENT_SOCKET = "gpufleet-lb-agent.socket"


def log(message, **fields):
    extra = " ".join(
        "%s=%s" % (k, json.dumps(v) if isinstance(v, str) and " " in v else v) for k, v in sorted(fields.items())
    )
    print(("%s %s" % (message, extra)).strip(), flush=True)


def systemctl(*args, check=True):
    proc = subprocess.run(
        ["systemctl", *args], capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"), check=False
    )
    if check and proc.returncode:
        raise RuntimeError("systemctl %s failed (%d): %s" % (" ".join(args), proc.returncode, proc.stderr.strip()))
    return proc.stdout


def unit_processes(unit, cgroup_root):
    """(main pid, [pids of the unit's cgroup])."""
    out = systemctl("show", "-p", "MainPID", "-p", "ControlGroup", unit)
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    main = int(props.get("MainPID") or 0)
    pids = []
    group = props.get("ControlGroup") or ""
    if group:
        try:
            with open(os.path.join(cgroup_root, group.lstrip("/"), "cgroup.procs")) as handle:
                pids = [int(p) for p in handle.read().split()]
        except OSError:
            pids = []
    if not pids and main:
        pids = [main]
    return main, pids


def rss_bytes(pids, proc_root="/proc"):
    total = 0
    for pid in pids:
        try:
            with open(os.path.join(proc_root, str(pid), "status")) as handle:
                for line in handle:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError):
            continue
    return total


def fetch(web, url, timeout=10):
    """(status, text) of a GET through the collection's bounded client (``web``: its _http):
    http/https only, one deadline for the whole answer, a size limit."""
    status, body = web.get(url, timeout=timeout)
    return status, body.decode("utf-8", "replace")


def load_state(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


class Deferred(Exception):
    """The pool's decider did not drain the node in time: the recycle waits for a later run."""


class Agent:
    """vm, rc, hx, web, files, budget: the collection's _vllm_metrics, _recycle, _haproxy, _http,
    _atomic and _budget (the role installs them in the lib dir, under ``TREE``; budget reads the
    pool's decider where the balancer config names one)."""

    def __init__(self, config, vm, rc, hx, web, files, dry_run=False, budget=None):
        self.cfg = config
        self.budget = budget  # module_utils lb/_budget, to read the pool's decider
        self.vm = vm
        self.rc = rc
        self.hx = hx
        self.web = web
        self.files = files
        self.dry_run = dry_run
        #: the record of the last drain wait (_recycle.drain_wait), reported in the status file
        self.drain = None

    # --- the balancer ---------------------------------------------------------------------------
    def balancer(self, state):
        bal = self.cfg.get("balancer") or {}
        method = bal.get("method", "none")
        if method == "none":
            log("balancer: none configured, the node keeps its place in the pool during the restart", step=state)
            return
        if method == "agent":
            # the node's own HAProxy agent (role lb_registration) passes the request on at the
            # balancer's next agent check; nothing here can change any other server
            if state == "drain" and systemctl("is-active", AGENT_SOCKET, check=False).strip() != "active":
                raise RuntimeError(
                    "%s is not active: nothing would tell the balancer to drain this node, so it is not "
                    "restarted (install lb_registration's agent, or set worker_recycle_balancer_method)" % AGENT_SOCKET
                )
            now = time.time()
            request = {"state": state, "reason": "recycle", "time": now}
            if state == "ready":  # said for a while, then the agent's answers leave the admin state alone
                request["until"] = now + float(bal.get("ready_hold", 20))
            self.files.write(bal["request_file"], json.dumps(request) + "\n", 0o644)
            settle = float(bal.get("settle", 5))
            log("balancer: asked the node's HAProxy agent to report %s" % state, request=bal["request_file"])
            time.sleep(settle)  # the balancer asks the agent every few seconds
            if state == "drain" and bal.get("decider"):
                self.wait_for_decider(bal["decider"], bal["request_file"])
            return
        if method == "runtime_api":
            api = self.hx.RuntimeAPI(bal["endpoint"], timeout=float(bal.get("timeout", 5)))
            command = api.set_state(bal["backend"], bal["server"], state)
            log("balancer: %s" % command, endpoint=bal["endpoint"])
            return
        if method == "command":
            argv = bal["drain_command" if state == "drain" else "return_command"]
            proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
            if proc.returncode:
                raise RuntimeError("%s failed (%d): %s" % (argv[0], proc.returncode, proc.stdout.strip()[-300:]))
            log("balancer: ran %s" % argv[0], step=state)
            return
        raise RuntimeError("unknown balancer method %r" % method)

    def wait_for_decider(self, decider, request_file):
        """Return once the pool's decider holds this node drained; else withdraw the drain request
        and raise Deferred saying why (refused by the budget, not judged yet, metrics unreadable)."""
        deadline = time.monotonic() + float(decider.get("wait", 60))
        while True:
            try:
                status, text = fetch(self.web, decider["url"], 5)
                if status != 200:
                    raise RuntimeError("HTTP %s" % status)
                standing, reason = self.budget.standing(text, decider["backend"], decider["server"])
            except Exception as exc:  # unreadable is not drained
                standing, reason = "unreadable", "cannot read %s: %s" % (decider["url"], exc)
            if standing == "held":
                log("balancer: the pool's decider drained the node (%s)" % reason, decider=decider["url"])
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(1)
        try:
            os.unlink(request_file)
        except FileNotFoundError:
            pass
        why = {
            "pending": "the pool's budget refused the drain for now (%s)" % reason,
            "unreadable": reason,
        }.get(standing, "the pool's decider has not drained the node")
        raise Deferred(
            "%s within %ss; the drain request is withdrawn and nothing restarted: the next run tries again"
            % (why, decider.get("wait", 60))
        )

    def running_requests(self):
        """How many requests the server runs, from its /metrics; raises when that cannot be read
        (no answer, not 200, not Prometheus text, no running-requests gauge): never 0 for a
        failed scrape, which would restart a server that is still serving."""
        status, text = fetch(self.web, self.cfg["metrics_url"], 5)
        if status != 200:
            raise RuntimeError("%s answered HTTP %s" % (self.cfg["metrics_url"], status))
        entry = self.vm.parse(text)["gauges"].get("num_requests_running")
        if not entry:
            names = " or ".join(self.vm.GAUGES.get("num_requests_running", ("num_requests_running",)))
            raise RuntimeError("%s has no running-requests gauge (%s)" % (self.cfg["metrics_url"], names))
        return entry["value"]

    def wait_health(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if fetch(self.web, self.cfg["health_url"], 5)[0] == 200:
                    return True
            except Exception:
                pass
            time.sleep(1)
        return False

    def cycle(self):
        """Drain, restart, wait for health, return. Raises (node left drained) on failure."""
        t0 = time.monotonic()
        self.balancer("drain")
        # bounded by drain_timeout; a failed scrape waits on (it is no proof that nothing runs)
        self.drain = self.rc.drain_wait(
            self.running_requests, float(self.cfg.get("drain_timeout", 60)), sleep=time.sleep, clock=time.monotonic
        )
        if not self.drain["drained"]:
            log("recycle: drain not confirmed: %s" % self.drain["reason"], metrics=self.cfg["metrics_url"])
        log(
            "recycle: restarting %s" % self.cfg["unit"],
            drained=self.drain["drained"],
            drained_s=round(time.monotonic() - t0, 1),
            failed_scrapes=self.drain["failed_scrapes"],
        )
        systemctl("restart", self.cfg["unit"])
        if not self.wait_health(float(self.cfg.get("health_timeout", 600))):
            raise RuntimeError(
                "%s did not answer 200 within %ss after the restart; the node stays drained"
                % (self.cfg["health_url"], self.cfg.get("health_timeout", 600))
            )
        self.balancer("ready")
        log("recycle: done, the node is back in the pool", seconds=round(time.monotonic() - t0, 1))

    # --- one run --------------------------------------------------------------------------------
    def run(self):
        cfg = self.cfg
        state = load_state(cfg["state_file"])
        now = time.time()
        main, pids = unit_processes(cfg["unit"], cfg.get("cgroup_root", "/sys/fs/cgroup"))
        if not main:
            log("worker-recycle: %s is not running, nothing to sample" % cfg["unit"])
            state["pid"] = 0
            self.finish(
                state,
                {"classification": "insufficient_data", "recycle": False, "reason": "%s is not running" % cfg["unit"]},
            )
            return 0
        if state.get("pid") != main:
            state.update(pid=main, history=[], buckets=None)
        rss = rss_bytes(pids)
        p95 = None
        try:
            _status, text = fetch(self.web, cfg["metrics_url"])
            hist = self.vm.parse(text)["histograms"].get("ttft_seconds")
            if hist:
                window = self.vm.delta_buckets(
                    hist["buckets"], [tuple(b) for b in state["buckets"]] if state.get("buckets") else None
                )
                if state.get("buckets") and window and window[-1][1] > 0:
                    p95 = self.vm.histogram_quantile(0.95, window)
                state["buckets"] = hist["buckets"]  # json keeps +Inf as Infinity
        except Exception as exc:  # no TTFT this time; RSS is still judged
            log("worker-recycle: cannot read %s: %s" % (cfg["metrics_url"], exc))
        history = state.get("history") or []
        history.append({"time": now, "rss_bytes": rss, "ttft_p95": p95})
        state["history"] = history[-2 * int(cfg.get("judge", {}).get("window", 12)) :]
        verdict = self.rc.judge(state["history"], cfg.get("judge"))
        log(
            "worker-recycle: %s" % verdict["classification"],
            rss_mib=round(rss / 1048576.0, 1),
            rss_slope_mib_per_min=verdict["rss_slope_mib_per_min"],
            ttft_p95_s=p95,
            ttft_p95_rise=verdict["ttft_p95_rise"],
            samples=verdict["samples"],
            recycle=verdict["recycle"],
            reason=verdict["reason"],
        )
        code = 0
        if verdict["recycle"] and cfg.get("action", "recycle") == "recycle" and not self.dry_run:
            self.drain = None
            try:
                self.cycle()
            except Deferred as exc:
                log("recycle: deferred: %s" % exc)
                verdict.update(recycled=False, deferred=str(exc))
            except Exception as exc:
                state["failures"] = state.get("failures", 0) + 1
                log("recycle: FAILED: %s" % exc)
                verdict.update(recycled=False, error=str(exc))
                code = 1
            else:
                state.update(
                    recycles=state.get("recycles", 0) + 1,
                    last_recycle=time.time(),
                    history=[],
                    buckets=None,
                    pid=None,
                    last_recycle_kind=verdict["classification"],
                )
                verdict["recycled"] = True
            if self.drain is not None:
                verdict["drain"] = self.drain
        self.finish(state, verdict)
        return code

    def finish(self, state, verdict):
        cfg = self.cfg
        self.files.write(cfg["state_file"], json.dumps(state), 0o600)
        if cfg.get("textfile"):
            self.files.write(cfg["textfile"], self.rc.textfile(verdict, state))
        if cfg.get("status_file"):
            status = dict(
                verdict,
                time=time.time(),
                recycles=state.get("recycles", 0),
                failures=state.get("failures", 0),
                last_recycle=state.get("last_recycle"),
                last_recycle_kind=state.get("last_recycle_kind"),
            )
            self.files.write(cfg["status_file"], json.dumps(status, indent=1) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="gpufleet-worker-recycle")
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--dry-run", action="store_true", help="judge and report, never recycle")
    args = parser.parse_args(argv)
    try:
        with open(args.config) as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        print("gpufleet-worker-recycle: cannot read %s: %s" % (args.config, exc), file=sys.stderr)
        return 2
    lib_dir = config.get("lib_dir", "/usr/local/lib/gpufleet")
    try:
        if not os.path.isdir(os.path.join(lib_dir, TREE)):
            raise ImportError("no %s" % TREE)
        sys.path.insert(0, lib_dir)
        from ansible_collections.gpufleet.node.plugins.module_utils.common import _atomic as files
        from ansible_collections.gpufleet.node.plugins.module_utils.common import _http as web
        from ansible_collections.gpufleet.node.plugins.module_utils.lb import _budget as budget
        from ansible_collections.gpufleet.node.plugins.module_utils.lb import _haproxy as hx
        from ansible_collections.gpufleet.node.plugins.module_utils.serving import _recycle as rc
        from ansible_collections.gpufleet.node.plugins.module_utils.serving import _vllm_metrics as vm
    except ImportError as exc:
        print(
            "gpufleet-worker-recycle: %s (the role installs the collection's code the agent imports under %s/%s)"
            % (exc, lib_dir, TREE),
            file=sys.stderr,
        )
        return 2
    if vm.MISSING_LIBRARY:
        print(
            "gpufleet-worker-recycle: the Python library prometheus-client is missing (Debian: "
            "python3-prometheus-client): %s" % vm.MISSING_LIBRARY,
            file=sys.stderr,
        )
        return 2
    return Agent(config, vm, rc, hx, web, files, dry_run=args.dry_run, budget=budget).run()


if __name__ == "__main__":
    sys.exit(main())
