# SPDX-License-Identifier: GPL-3.0-or-later
"""What the lab's nodes need to serve with llama.cpp (role gpufleet.node.llamacpp_server): the real
``llama-server`` that scripts/build-llama-server.sh built for CPU (cached outside the checkout) and
the tiny GGUF model of lab/tiny_gguf.py, written once into the lab's state directory. The role
copies both from the controller to the node and verifies the model's sha256.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "scripts" / "build-llama-server.sh"
MODEL_NAME = "gpufleet-tiny.gguf"


def pin():
    """The llama-cpp-python release whose vendored llama.cpp the build script builds."""
    return re.search(r"^LLAMA_CPP_PYTHON_VERSION=(\S+)$", BUILD_SCRIPT.read_text(), re.M).group(1)


def llama_server_binary():
    """<cache>/gpufleet/llama-server-<pin>/llama-server, as the build script writes it."""
    cache = (
        os.environ.get("GPUFLEET_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpufleet"
    )
    return Path(cache) / f"llama-server-{pin()}" / "llama-server"


def tiny_model(state):
    """The tiny model in ``<state>/models`` (written on first use) and its sha256."""
    from lab import tiny_gguf

    path = Path(state) / "models" / MODEL_NAME
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tiny_gguf.write(tmp)
        tmp.rename(path)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def inventory_vars(state, served_model_name):
    """Group variables of the lab's GPU nodes for the llama.cpp backend (used only where a node
    serves with llama.cpp: `gpufleet_serving_backend` auto on a heterogeneous profile). The tiny
    model is served under the pool's model name: every server of one HAProxy backend must answer
    for the same model, or a client is sent to a server that does not know it."""
    model, sha256 = tiny_model(state)
    return {
        "llamacpp_server_served_model_name": served_model_name,
        "llamacpp_server_binary_src": str(llama_server_binary()),
        "llamacpp_server_model_src": str(model),
        "llamacpp_server_model_sha256": sha256,
        # the tiny model: short slots are enough, and CPU threads are scarce on the lab's host
        "llamacpp_server_ctx_size": 512,
        "llamacpp_server_parallel": 2,
        "llamacpp_server_extra_args": ["--threads", "1"],
        "llamacpp_server_health_delay": 1,
    }


ARGS_FILE = "/etc/llamacpp/llama-server.env"


def serving_summary(machine, marker):
    """For `lab report`: how a node serves, from its gate marker (the backend the run chose) and,
    for llama.cpp, the plan's command line the role wrote; None when the marker names no backend."""
    backend = (marker or {}).get("serving_backend")
    if backend != "llamacpp":
        return backend
    out = machine.nsenter("cat", ARGS_FILE, timeout=10) if machine.pid() else None
    if out is None or out.returncode != 0:
        return f"llama.cpp (no {ARGS_FILE})"
    found = re.search(r'^LLAMACPP_SERVER_ARGS="([^"]*)"', out.stdout, re.M)
    args = found.group(1).split() if found else []

    def opt(name):
        return args[args.index(name) + 1] if name in args[:-1] else "-"

    plan = re.search(r"^# (fits: .*)$", out.stdout, re.M)
    return "llama.cpp: --n-gpu-layers %s --tensor-split %s --ctx-size %s --parallel %s%s" % (
        opt("--n-gpu-layers"),
        opt("--tensor-split"),
        opt("--ctx-size"),
        opt("--parallel"),
        " (%s)" % plan.group(1) if plan else "",
    )


class Server:
    """A real llama-server (the cached build) on 127.0.0.1 serving the tiny model, for the tests that
    judge a server by its own answers (``/health``, ``/v1/models``, ``/metrics``): started as role
    llamacpp_server starts it where it matters here (``--metrics``, the API key from
    ``LLAMA_API_KEY``, never on the command line), one thread, short slots; ready once ``/health``
    answers 200.  A context manager; ``url``, ``port``, ``log``."""

    def __init__(self, model, workdir, api_key="", alias="gpufleet-tiny", binary=None, parallel=2):
        self.model, self.api_key, self.alias = str(model), api_key, alias
        self.binary = str(binary or llama_server_binary())
        self.parallel = parallel
        self.log = Path(workdir) / "llama-server.log"
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def argv(self):
        return [
            self.binary,
            "--model",
            self.model,
            "--alias",
            self.alias,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--ctx-size",
            str(256 * self.parallel),
            "--parallel",
            str(self.parallel),
            "--threads",
            "1",
            "--metrics",
        ]

    def start(self, timeout=120.0):
        import subprocess
        import time
        import urllib.error
        import urllib.request

        env = dict(os.environ)
        env.pop("LLAMA_API_KEY", None)
        if self.api_key:
            env["LLAMA_API_KEY"] = self.api_key
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        return self
            except (OSError, urllib.error.URLError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-3000:]
                self.stop()
                raise RuntimeError(f"llama-server ({self.binary}) did not answer {self.url}/health 200:\n{tail}")
            time.sleep(0.2)

    def stop(self):
        import subprocess

        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # a server that ignores SIGTERM is killed
                self.proc.kill()
                self.proc.wait(timeout=30)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_server(workdir, api_key=""):
    """A :class:`Server` (not started) of the real llama-server serving the tiny model written into
    ``workdir``; the binary is built first where it is not cached (scripts/build-llama-server.sh:
    several CPU-minutes, once). RuntimeError, with the build's output, when it cannot be built."""
    import subprocess

    from lab import tiny_gguf

    build = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=3600, check=False)
    if build.returncode or not os.access(llama_server_binary(), os.X_OK):
        raise RuntimeError(
            f"no llama-server at {llama_server_binary()} ({BUILD_SCRIPT}):\n{build.stdout}{build.stderr}"
        )
    model = Path(workdir) / MODEL_NAME
    if not model.exists():
        tiny_gguf.write(model)
    return Server(model, workdir, api_key=api_key)
