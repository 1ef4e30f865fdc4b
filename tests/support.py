# SPDX-License-Identifier: GPL-3.0-or-later
"""Helpers shared by the test modules (tests/conftest.py puts the repository on sys.path).

One way each: run a playbook and read its PLAY RECAP (`run_playbook`), say why the lab cannot run
here (`lab_prerequisites`), serve HTTP from a test (`FakeHTTP`, `MetricsServer`), run a module as
Ansible does (`run_module`), install a node-side agent as its role does (`install_agent`), boot a
lab for a with-block (`own_lab`: the session's lab, which is `tests/conftest.py`'s `session_lab`
fixture, and a module's lab of its own).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent

needs_lspci = pytest.mark.skipif(not shutil.which("lspci"), reason="pciutils is not installed")

DEV_LINE = re.compile(r"^((?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ")
_ACS_LINE = re.compile(r"^\t\t(ACSCap|ACSCtl):\t(.*)$")


# --- a node-side agent as its role installs it -----------------------------------------------------


def install_agent(agent, lib_dir):
    """``agent`` (its script) and the collection's code it imports, written under ``lib_dir`` as
    its role writes them (the entries of gpufleet.node.agent_files); returns the installed script."""
    from ansible_collections.gpufleet.node.plugins.filter.agent_files import agent_files

    lib_dir = Path(lib_dir)
    for entry in agent_files(str(agent), str(lib_dir)):
        dest = Path(entry["dest"])
        dest.parent.mkdir(parents=True, exist_ok=True)
        if "file" in entry:
            shutil.copyfile(entry["file"], dest)
        else:
            dest.write_text(entry["content"])
    lib_dir.mkdir(parents=True, exist_ok=True)
    script = lib_dir / Path(agent).name
    shutil.copyfile(agent, script)
    return script


# --- ansible-playbook from a test ------------------------------------------------------------------

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
):
    """Run a playbook from the repository root; return its PlaybookRun (recap parsed).

    env: the whole environment (e.g. the `ansible_env` fixture's, changed), else
    ansible_environment(); json_callback: ANSIBLE_STDOUT_CALLBACK=ansible.builtin.json, the
    document in ``run.json``; merge_stderr: stderr interleaved into stdout, as on a terminal."""
    argv = playbook_argv(playbook, *args, inventory=inventory, local=local, limit=limit, extra_vars=extra_vars)
    env = dict(ansible_environment() if env is None else env)
    if json_callback:
        env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.builtin.json"
    t0 = time.monotonic()
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
    return PlaybookRun(
        argv, proc.returncode, proc.stdout, proc.stderr or "", time.monotonic() - t0, parse_recap(proc.stdout)
    )


# --- the lab's prerequisites ----------------------------------------------------------------------


def lab_prerequisites(prometheus=False):
    """Why the lab cannot run on this machine (root, its programs, the kernel's namespaces), or
    None.  prometheus: the operations tests' modules also need prometheus_client, on the
    controller and in the nodes' python3."""
    if os.geteuid() != 0:
        return "the lab needs root"
    try:
        from lab import preflight

        preflight.check()
    except Exception as exc:  # LabError, or a host without the lab's programs
        return str(exc)
    if prometheus:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            return "prometheus-client is not installed"
        if subprocess.run(
            ["/usr/bin/python3", "-c", "import prometheus_client"], capture_output=True, check=False
        ).returncode:
            return "the nodes' python3 lacks prometheus_client (Debian package python3-prometheus-client)"
    return None


# --- HTTP servers for tests -------------------------------------------------------------------


class FakeHTTP:
    """A local HTTP server (a thread) answering GETs from `routes`: {path: body}, where body is
    text, a (status, text) pair, or a callable taking the request handler and returning either.
    Unknown paths answer 404.  ``url``, ``port``, ``requests`` (paths asked, in order); use as a
    context manager or call close()."""

    def __init__(self, routes=None, host="127.0.0.1"):
        self.routes = dict(routes or {})
        self.requests = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests.append(self.path)
                answer = outer.routes.get(self.path, (404, ""))
                if callable(answer):
                    answer = answer(self)
                status, body = answer if isinstance(answer, tuple) else (200, answer)
                body = body if isinstance(body, bytes) else str(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.server_address = self.httpd.server_address
        self.port = self.server_address[1]
        self.url = f"http://{host}:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class MetricsServer(FakeHTTP):
    """A fake vLLM: /metrics answers the texts of `texts` in turn, the last one for good (a list
    the test may replace at any time, here or on `source`, an object with a `texts` attribute);
    /health answers 200."""

    def __init__(self, texts=("",), host="127.0.0.1", source=None):
        self.texts = list(texts)
        self.source = source if source is not None else self
        super().__init__({"/metrics": self._next, "/health": ""}, host)

    def _next(self, _handler):
        texts = self.source.texts
        return texts.pop(0) if len(texts) > 1 else texts[0]


# --- Prometheus and the collection's dashboard ------------------------------------------------------

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
    import urllib.parse
    import urllib.request

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


# --- the session's lab ----------------------------------------------------------------------------

FLEET_PROFILES = [
    p.strip()
    for p in os.environ.get("GPUFLEET_FLEET_PROFILES", "l40s-4x-switch,l40s-x8-degraded,a6000-4090-hetero").split(",")
    if p.strip()
]
SPARE_PROFILE = "l40s-4x-switch"


def gpu_memory_sizes(profile):
    """The distinct GPU memory sizes (MiB) of a lab profile, from the hardware model."""
    import lab.hwmodel as hw

    models = []

    def walk(node):
        if node.get("kind") == "gpu":
            models.append(node["model"])
        for child in node.get("children", []) + ([node["child"]] if node.get("child") else []):
            walk(child)

    for bridge in hw.PROFILES[profile]["host_bridges"]:
        for port in bridge["root_ports"]:
            walk(port)
    return {hw.profiles.GPU_MODELS[m]["memory_total_mib"] for m in models}


#: The fleet's nodes that `gpufleet_serving_backend: auto` must serve with llama.cpp: GPUs of
#: different sizes (the lab's own reading of the rule, not the collection's code).
FLEET_LLAMACPP_NODES = [f"node{i + 1}" for i, p in enumerate(FLEET_PROFILES) if len(gpu_memory_sizes(p)) > 1]


def server_unit(node):
    """The serving unit a converged fleet node runs."""
    return "llama-server.service" if node in FLEET_LLAMACPP_NODES else "vllm.service"


LAB_TIMINGS: list = []  # (label, seconds, rc) of lab boots and fleet playbook runs, for the run's summary


class SessionLab:
    """The one lab of a pytest run (tests/conftest.py's `session_lab` fixture).

    Nodes node1..nodeN are the fleet of tests/fleet (GPUFLEET_FLEET_PROFILES, default a healthy
    ``l40s-4x-switch`` and the ``l40s-x8-degraded`` node that must never be registered); the last
    node, the spare (``l40s-4x-switch``), is where the tests of the lab itself and the operations
    tests change things, each establishing the state it needs there first.  State in
    ``.lab-state/pytest-<pid>`` (never the default ``.lab-state`` nor ``inventories/lab/hosts.yml``);
    each group of tests gets an inventory of its own nodes (``inventory(nodes, name)``)."""

    def __init__(self, state, fleet_profiles=None, export_vault=True, spare=True):
        self.state = Path(state)
        self.export_vault = export_vault  # the session's lab: every ansible run of the process gets its password
        self.fleet_profiles = list(fleet_profiles or FLEET_PROFILES)
        self.profiles = self.fleet_profiles + ([SPARE_PROFILE] if spare else [])
        self.fleet_nodes = [f"node{i + 1}" for i in range(len(self.fleet_profiles))]
        self.spare = f"node{len(self.profiles)}" if spare else None
        self.up_seconds = None

    def cli(self, *args, check=True, timeout=180):
        """`python -m lab VERB ... --state-dir STATE`; AssertionError (with its output) on failure."""
        proc = subprocess.run(
            [sys.executable, "-m", "lab", *map(str, args), "--state-dir", str(self.state)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode:
            raise AssertionError(
                f"lab {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )
        return proc

    def up(self):
        self.cli("down", check=False)
        shutil.rmtree(self.state, ignore_errors=True)
        t0 = time.monotonic()
        self.cli("up", "--profiles", ",".join(self.profiles), timeout=400)
        self.up_seconds = time.monotonic() - t0
        LAB_TIMINGS.append((f"lab up --profiles {','.join(self.profiles)}", self.up_seconds, 0))
        # The inventory's secrets are vaulted (lab/fleet.py): every ansible run of this process
        # (ansible_environment(), the fleet's runs, testinfra) gets the lab's vault password.
        if self.export_vault:
            os.environ["ANSIBLE_VAULT_PASSWORD_FILE"] = str(self.vault_password_file)

    def down(self):
        """Down on the first try (issue: a cgroup not yet empty), then the state directory goes."""
        try:
            self.cli("down", timeout=120)
        finally:
            shutil.rmtree(self.state, ignore_errors=True)
            if os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE") == str(self.vault_password_file):
                del os.environ["ANSIBLE_VAULT_PASSWORD_FILE"]

    @property
    def fleet(self):
        """lab.fleet.Fleet of this lab (records, balancer, machines, lock)."""
        from lab.fleet import Fleet

        return Fleet(self.state)

    @property
    def key(self):
        return self.state / "ssh" / "id_ed25519"

    @property
    def vault_password_file(self):
        return self.state / "vault-password"

    @property
    def secrets(self):
        """{variable: plain text} of the secrets vaulted in the lab's inventory (api key, HF token)."""
        return self.fleet.secrets()

    def spec(self, node):
        return next(n for n in self.fleet.data()["nodes"] if n["name"] == node)

    def hw(self, node):
        import lab.hwmodel as hw

        return hw.Node.load(self.state / "nodes" / node / "hw")

    def inventory(self, nodes, name):
        """An inventory of `nodes` (and the balancer) only, written as <state>/hosts-<name>.yml."""
        import yaml

        inv = yaml.safe_load((self.state / "hosts.yml").read_text())
        hosts = inv["all"]["children"]["gpu_nodes"]["hosts"]
        inv["all"]["children"]["gpu_nodes"]["hosts"] = {n: hosts[n] for n in nodes}
        path = self.state / f"hosts-{name}.yml"
        path.write_text(
            f"# {name}: nodes {', '.join(nodes)} of the lab at {self.state}\n"
            + yaml.safe_dump(inv, sort_keys=False, default_flow_style=False)
        )
        return path

    def ssh(self, node, command, check=True, timeout=60):
        """Run a shell command on node as root over SSH; its stdout (AssertionError on failure)."""
        return ssh(self.key, self.spec(node), command, check=check, timeout=timeout)


@contextlib.contextmanager
def own_lab(profiles, name=None, *, lab_class=None, spare=False, export_vault=False):
    """A lab of `profiles` (node1..nodeN) for the with-block, down at its end; the test is skipped,
    saying why, where the lab cannot run.  State in .lab-state/pytest-<pid>[-<name>].  The
    session's lab (tests/conftest.py) adds the spare node and exports its vault password to the
    process; a module's own lab (``name``) does neither: its runs name its password themselves.
    lab_class: a SessionLab subclass with the module's own helpers."""
    missing = lab_prerequisites()
    if missing:
        pytest.skip(f"lab prerequisites: {missing}")
    state = REPO / ".lab-state" / (f"pytest-{os.getpid()}-{name}" if name else f"pytest-{os.getpid()}")
    lab = (lab_class or SessionLab)(state, profiles, export_vault=export_vault, spare=spare)
    try:
        lab.up()
        yield lab
    finally:
        lab.down()


def run_module(name, args, check_mode=False, diff=False, env=None):
    """Run plugins/modules/<name>.py as Ansible runs it (JSON args on stdin); return its JSON."""
    payload = {"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=check_mode, _ansible_diff=diff)}
    environ = dict(os.environ, **(env or {}))
    environ["PYTHONPATH"] = os.pathsep.join([str(REPO / ".collections"), str(REPO)])
    proc = subprocess.run(
        [sys.executable, str(REPO / "plugins" / "modules" / f"{name}.py")],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=environ,
        timeout=300,
    )
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"{name} printed no JSON: {proc.stdout!r} {proc.stderr!r}") from None


def lspci_acs(text):
    """``{bdf: {'ACSCap': {name: bool}, 'ACSCtl': {...}}}`` from `lspci -vvv` output."""
    result, current = {}, None
    for line in text.splitlines():
        match = DEV_LINE.match(line)
        if match:
            current = match.group(1)
            result[current] = {}
            continue
        match = _ACS_LINE.match(line)
        if match and current:
            result[current][match.group(1)] = {flag[:-1]: flag[-1] == "+" for flag in match.group(2).split()}
    return result


# -- test-only parsers (moved out of the shipped module_utils) --------------------------------
_DUMP_DEV_RE = re.compile(r"^((?:[0-9a-fA-F]{4,}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s")
_DUMP_HEX_RE = re.compile(r"^([0-9a-fA-F]{2,3}):((?:\s[0-9a-fA-F]{2})+)\s*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_lspci_dump(text):
    """Parse ``lspci -x/-xxx/-xxxx`` output (also with ``-vvv`` text between) into ``{bdf: bytes}``.

    This is the format ``lspci -F FILE`` reads. BDFs are kept as printed (``00:02.0``).
    """
    result = {}
    current = None
    for line in text.splitlines():
        match = _DUMP_DEV_RE.match(line)
        if match:
            current = match.group(1)
            result[current] = bytearray()
            continue
        match = _DUMP_HEX_RE.match(line)
        if match and current is not None:
            off = int(match.group(1), 16)
            values = bytes(int(x, 16) for x in match.group(2).split())
            blob = result[current]
            if len(blob) < off:
                blob.extend(b"\xff" * (off - len(blob)))
            blob[off : off + len(values)] = values
    return {bdf: bytes(blob) for bdf, blob in result.items() if blob}


def parse_env_file(text):
    """KEY=value lines (systemd EnvironmentFile / docker --env-file); comments and blanks skipped."""
    env = {}
    for num, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not _ENV_NAME.match(key):
            raise ValueError("line %d is not KEY=value: %r" % (num, line))
        env[key] = value
    return env


class _NodeInventoryLoader(yaml.SafeLoader):
    """YAML's safe loader, reading a mapping tagged ``!unsafe`` (ansible-core takes everything
    under it as data, never a template) as :class:`Unsafe`, so that a test sees what was tagged."""


class Unsafe(dict):
    """A mapping a node-local inventory wrote ``!unsafe``."""


def _construct_unsafe(loader, node):
    if not isinstance(node, yaml.MappingNode):
        raise yaml.constructor.ConstructorError(None, None, "!unsafe on a %s" % node.id, node.start_mark)
    return Unsafe(loader.construct_mapping(node, deep=True))


_NodeInventoryLoader.add_constructor("!unsafe", _construct_unsafe)


def node_inventory(text):
    """``(hosts, group_vars)`` of boot validation's node-local inventory (``all.children.gpu_nodes``)."""
    group = yaml.load(text, Loader=_NodeInventoryLoader)["all"]["children"]["gpu_nodes"]
    return group["hosts"], group.get("vars", {})


def node_inventory_hosts(text):
    """``{host: vars}`` of boot validation's node-local inventory."""
    return node_inventory(text)[0]


def node_inventory_vars(text, host):
    """What the node's own run gets as ``host``'s variables: the group's, then the host's."""
    hosts, group_vars = node_inventory(text)
    return {**group_vars, **hosts[host]}


def ssh(key, spec, command, check=True, timeout=60):
    """Run a shell command as root over SSH on the lab node ``spec`` (its entry in the lab's
    state); its stdout (AssertionError on failure)."""
    argv = ["ssh", "-i", str(key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    argv += ["-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-p", str(spec["ssh_port"]), f"root@{spec['address']}"]
    proc = subprocess.run([*argv, command], capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode:
        raise AssertionError(f"ssh {spec['name']} {command!r} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout
