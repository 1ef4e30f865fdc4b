# SPDX-License-Identifier: GPL-3.0-or-later
"""ansible-playbook from a test: the one runner (``run_playbook``), its command line, its
environment and its PLAY RECAP.

A vault password is an argument of one run (``vault_password``): the runner writes it to a 0600
file of that run only, passes ``--vault-password-file``, and removes the file when the run ends;
no environment variable of the test process carries it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness import REPO, VENV_BIN

RECAP = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
    r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)"
    r"(?:\s+skipped=(?P<skipped>\d+))?(?:\s+rescued=(?P<rescued>\d+))?"
    r"(?:\s+ignored=(?P<ignored>\d+))?",
    re.M,
)
_COUNTS = ("ok", "changed", "unreachable", "failed", "skipped", "rescued", "ignored")


def parse_recap(output):
    """{host: {ok, changed, unreachable, failed, skipped, rescued, ignored}} of a run's output:
    the default callback's PLAY RECAP, or the `stats` of the JSON callback."""
    text = output.lstrip()
    if text.startswith("{"):
        try:
            stats = json.loads(text).get("stats", {})
        except ValueError:
            stats = None
        if stats is not None:
            return {h: {k: int(c.get(k, 0)) for k in _COUNTS} for h, c in stats.items()}
    return {m["host"]: {k: int(m[k] or 0) for k in _COUNTS} for m in RECAP.finditer(output)}


def ansible_environment(base=None, **extra):
    """The environment of an ansible-playbook run from the repository root (this checkout's
    ansible.cfg, the venv's programs first on PATH, no colour); extra entries win."""
    env = dict(os.environ if base is None else base)
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    if str(VENV_BIN) not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("ANSIBLE_NOCOLOR", "1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


@dataclass
class PlaybookRun:
    """One ansible-playbook run: what ran, its exit status and output, its PLAY RECAP per host
    (``run.recap["node1"]["changed"]``), its wall time.  Reads like a CompletedProcess too
    (``returncode``, ``stdout``, ``stderr``)."""

    argv: list
    returncode: int
    stdout: str
    stderr: str = ""
    seconds: float = 0.0
    recap: dict = field(default_factory=dict)

    @property
    def rc(self):
        return self.returncode

    @property
    def output(self):
        return self.stdout + self.stderr

    @property
    def json(self):
        """The JSON callback's document (ANSIBLE_STDOUT_CALLBACK=ansible.builtin.json)."""
        return json.loads(self.stdout)

    def host(self, name=None):
        """The recap of host `name`, or of the only host; AssertionError (with the output) if none."""
        if name is None and len(self.recap) == 1:
            return next(iter(self.recap.values()))
        assert name in self.recap, f"no PLAY RECAP line for {name}:\n{self.explain()}"
        return self.recap[name]

    def explain(self, tail=6000):
        return (
            f"`{' '.join(map(str, self.argv))}` exited {self.returncode} in {self.seconds:.1f} s:\n"
            f"{self.output[-tail:]}"
        )

    def host_failures(self, host):
        """The messages of the tasks that failed on host (default callback)."""
        return re.findall(
            rf"^fatal: \[{re.escape(host)}(?: -> [^\]]+)?\]: FAILED! =>.*?(?=^\S|\Z)", self.output, re.M | re.S
        )


def playbook_argv(playbook, *args, inventory=None, local=False, limit=None, extra_vars=None):
    """The ansible-playbook command line: `playbook` is a path, or a name under playbooks/;
    `local` runs it on localhost (-i localhost, -c local, with this Python as the interpreter
    unless extra_vars say otherwise); extra_vars: dicts (as JSON) or strings."""
    path = Path(playbook)
    if not path.is_absolute() and not path.exists():
        path = REPO / "playbooks" / playbook
    argv = [str(VENV_BIN / "ansible-playbook")]
    if local:
        argv += [
            "-i",
            str(inventory or "localhost,"),
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
        ]
    elif inventory:
        argv += ["-i", str(inventory)]
    argv.append(str(path))
    if limit:
        argv += ["--limit", limit]
    if isinstance(extra_vars, dict):
        extra_vars = [extra_vars]
    for value in extra_vars or ():
        argv += ["-e", value if isinstance(value, str) else json.dumps(value)]
    return argv + [str(a) for a in args]


@contextlib.contextmanager
def vault_password_file(password):
    """A file holding `password` (mode 0600, in a 0700 directory of its own) for the with-block,
    removed at its end."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-vault-") as directory:
        path = Path(directory) / "vault-password"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(password)
        yield path


def run_playbook(
    playbook,
    *args,
    inventory=None,
    local=False,
    limit=None,
    extra_vars=None,
    env=None,
    timeout=900,
    merge_stderr=False,
    json_callback=False,
    vault_password=None,
    watch=None,
):
    """Run a playbook from the repository root; return its PlaybookRun (recap parsed).

    env: the whole environment (e.g. the `ansible_env` fixture's, changed), else
    ansible_environment(); json_callback: ANSIBLE_STDOUT_CALLBACK=ansible.builtin.json, the
    document in ``run.json``; merge_stderr: stderr interleaved into stdout, as on a terminal;
    vault_password: the password of the inventory's vaulted values, for this run only (a 0600
    file passed as --vault-password-file); watch: called with each line of the output (stderr
    interleaved) as it comes, while the run goes on.  A run past `timeout` seconds is killed
    (subprocess.TimeoutExpired)."""
    argv = playbook_argv(playbook, *args, inventory=inventory, local=local, limit=limit, extra_vars=extra_vars)
    env = dict(ansible_environment() if env is None else env)
    if json_callback:
        env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.builtin.json"
    with contextlib.ExitStack() as stack:
        if vault_password is not None:
            argv += ["--vault-password-file", str(stack.enter_context(vault_password_file(vault_password)))]
        t0 = time.monotonic()
        if watch is None:
            proc = subprocess.run(
                argv,
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                text=True,
                timeout=timeout,
                check=False,
            )
            returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr or ""
        else:
            returncode, stdout = _run_watched(argv, env, timeout, watch)
            stderr = ""
    return PlaybookRun(argv, returncode, stdout, stderr, time.monotonic() - t0, parse_recap(stdout))


def _run_watched(argv, env, timeout, watch):
    """(exit status, output) of argv, each output line handed to watch as it comes."""
    lines, killed = [], threading.Event()
    with subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:

        def kill():
            killed.set()
            proc.kill()

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            for line in proc.stdout:
                lines.append(line)
                watch(line)
            proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:  # watch raised: the run goes with it
                proc.kill()
                proc.wait()
    if killed.is_set():
        raise subprocess.TimeoutExpired(argv, timeout, "".join(lines))
    return proc.returncode, "".join(lines)


def one_role_playbook(directory, hosts, role, tasks_from):
    """(playbook, inventory) written into `directory`: an inventory of `hosts` ({name: vars}) and
    a playbook that includes the entry point `tasks_from` of the collection's role `role` on every
    one of them, so that one run tries one step of a role for many cases, a host per case."""
    directory = Path(directory)
    inventory = directory / "inventory.json"
    inventory.write_text(json.dumps({"all": {"hosts": hosts}}))
    playbook = directory / f"{role}-{tasks_from}.yml"
    playbook.write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        f"    - ansible.builtin.include_role:\n        name: gpufleet.node.{role}\n"
        f"        tasks_from: {tasks_from}\n"
    )
    return playbook, inventory


def task_results(run, name):
    """{host: result} of the task `name` of an included role in a run with the JSON callback (a
    role included per host gives each host's result in a task of its own)."""
    results = {}
    for play in run.json["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"].endswith(" : " + name):
                results.update(task["hosts"])
    return results
