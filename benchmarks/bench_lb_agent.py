#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark: the CPU one HAProxy agent check costs on a node.

systemd starts the node's agent (roles/lb_registration, ``gpufleet_lb_agent.py``) once per
connection, and HAProxy connects every ``lb_registration_agent_interval`` (2 s), so its start-up is
paid on every node all the time. The agent is installed here as the role installs it (the script
and the module_utils files ``gpufleet.node.agent_files`` computes from its imports), then timed in
the same run, each run a fresh interpreter answering one check (no gate marker: ``down
#no-marker``):

* ``python3 -c pass``: the interpreter's own start-up, the floor;
* the agent as installed;
* the agent with the serving prober (``serving/_probe``: the HTTP client, the Prometheus parser)
  imported first, which is what it paid while the probe's record lived in the prober's module.

User + system CPU of the children, per run; the ratios are the figures.

Usage: python3 benchmarks/bench_lb_agent.py [--python /usr/bin/python3] [--repeat 20]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / ".collections"))
sys.path.insert(0, str(REPO))

from tests.harness.modules import install_agent  # noqa: E402

AGENT = REPO / "roles" / "lb_registration" / "files" / "gpufleet_lb_agent.py"
PROBER = "ansible_collections.gpufleet.node.plugins.module_utils.serving._probe"


def cpu_per_run(argv, repeat):
    """Mean user + system CPU seconds of ``repeat`` runs of argv (children's rusage)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(repeat):
        subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / repeat


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="/usr/bin/python3", help="the node's interpreter (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = install_agent(AGENT, Path(tmp) / "lib")
        missing = Path(tmp) / "missing"
        agent_args = [
            "--marker",
            str(missing / "nccl-gate.json"),
            "--boot-id",
            "/proc/sys/kernel/random/boot_id",
            "--request",
            str(missing / "request.json"),
            "--allow",
            "127.0.0.1",
            "localhost",
            "--probe",
            str(missing / "serving-probe.json"),
            "--probe-interval",
            "5",
            "--probe-timeout",
            "10",
        ]
        answer = subprocess.run(
            [args.python, str(script), *agent_args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        if not answer.startswith("down #no-marker"):
            sys.exit(f"the installed agent did not answer a check: {answer!r}")
        preload = (
            f"import sys, runpy; sys.path.insert(0, {str(REPO / '.collections')!r}); import {PROBER}; "
            f"sys.argv = [{str(script)!r}] + sys.argv[1:]; runpy.run_path({str(script)!r}, run_name='__main__')"
        )
        floor = cpu_per_run([args.python, "-c", "pass"], args.repeat)
        agent = cpu_per_run([args.python, str(script), *agent_args], args.repeat)
        before = cpu_per_run([args.python, "-c", preload, *agent_args], args.repeat)
    print(f"{args.python}, {args.repeat} runs each, CPU per run (user + system):")
    print(f"  interpreter start-up      {floor * 1000:6.1f} ms")
    print(f"  agent check               {agent * 1000:6.1f} ms  ({agent / floor:.1f}x the start-up)")
    print(f"  with the prober imported  {before * 1000:6.1f} ms  ({before / agent:.2f}x the agent's)")


if __name__ == "__main__":
    main()
