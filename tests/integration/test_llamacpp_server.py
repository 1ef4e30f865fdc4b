# SPDX-License-Identifier: GPL-3.0-or-later
"""llama.cpp backend against the REAL llama-server (built for CPU once by
scripts/build-llama-server.sh, cached under ~/.cache/gpufleet) and a tiny GGUF model written here
with the ``gguf`` package (lab/tiny_gguf.py).

One role run (-c local, service not started: the lab fleet starts it under systemd) writes the
command line, the unit and the verified model; the test then checks the rendered arguments against
the binary's own ``--help``, starts the binary with exactly that command line (on a free port) and
asks it for /health, a streamed OpenAI completion and /metrics. Refusals are checked before
anything is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from lab import tiny_gguf
from tests.harness.playbook import run_playbook
from tests.harness.prometheus import dashboard_queries

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "tests" / "integration" / "playbooks" / "llamacpp_server.yml"
RTX_A6000, RTX_4090 = 49140, 24564


@pytest.fixture(scope="module")
def llama_server():
    """The cached CPU build (built on first use: several minutes on 2 cores)."""
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "build-llama-server.sh")], capture_output=True, text=True, timeout=3600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    path = re.search(r"(?:cached|built) (\S+)", proc.stdout).group(1)
    assert os.access(path, os.X_OK)
    return path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "gpufleet-tiny.gguf"
    tiny_gguf.write(path)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def paths(tmp_path):
    root = tmp_path / "host"
    return {
        "llamacpp_server_config_dir": str(root / "etc" / "llamacpp"),
        "llamacpp_server_systemd_dir": str(root / "etc" / "systemd" / "system"),
        "llamacpp_server_model_dir": str(root / "var" / "lib" / "llamacpp" / "models"),
        "llamacpp_server_bin": str(root / "usr" / "local" / "bin" / "llama-server"),
        "llamacpp_server_runtime_env_file": str(root / "etc" / "gpufleet" / "gpu-runtime.env"),
    }


def base(tmp_path, model, sha, **kw):
    extra = dict(
        paths(tmp_path),
        llamacpp_server_model_src=str(model),
        llamacpp_server_model_sha256=sha,
        llamacpp_server_gpu_memory_mib=[RTX_A6000, RTX_4090],
        llamacpp_server_ctx_size=512,
        llamacpp_server_parallel=2,
        llamacpp_server_manage_service=False,
        llamacpp_server_extra_args=["--threads", "1"],
        ansible_python_interpreter=sys.executable,
    )
    extra.update(kw)
    return extra


def play(ansible_env, extra, *args):
    return run_playbook(PLAYBOOK, *args, local=True, extra_vars=extra, env=ansible_env, timeout=300)


def server_args(env_file):
    text = Path(env_file).read_text()
    (line,) = [ln for ln in text.splitlines() if ln.startswith("LLAMACPP_SERVER_ARGS=")]
    (value,) = shlex.split(line.split("=", 1)[1])  # one double-quoted value; systemd splits it on spaces
    return value.split()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url, timeout=5, key=None):
    headers = {"Authorization": "Bearer " + key} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def env_file(path):
    """KEY=value lines as systemd's EnvironmentFile= reads them (the role writes no quotes)."""
    lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return dict(ln.split("=", 1) for ln in lines)


def test_serving_config_renders_the_plan_alone(tmp_path, ansible_env, tiny_model):
    model, sha = tiny_model
    extra = base(tmp_path, model, sha)
    proc = play(ansible_env, extra, "--tags", "serving_config")
    assert proc.rc == 0, proc.explain()
    root = tmp_path / "host"
    # only the command line: no unit, no model, no binary
    assert [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()] == ["etc/llamacpp/llama-server.env"]
    args = server_args(root / "etc" / "llamacpp" / "llama-server.env")
    opt = {
        a: (b if not b.startswith("--") else None)
        for a, b in zip(args, args[1:] + ["--"], strict=False)
        if a.startswith("--")
    }
    assert opt["--model"] == extra["llamacpp_server_model_dir"] + "/gpufleet-tiny.gguf"
    assert opt["--alias"] == "gpufleet-tiny"
    # 4 layers + output on two GPUs of different sizes (llama.cpp's rule: position j of 5 goes to the
    # first GPU while j/5 < 46.5/69 GiB of room), ctx 512 x 2 slots
    assert opt["--n-gpu-layers"] == "5" and opt["--ctx-size"] == "1024" and opt["--parallel"] == "2"
    assert opt["--split-mode"] == "layer" and opt["--tensor-split"] == "4,1"
    assert "--metrics" in args


def test_a_plan_that_does_not_fit_is_refused_before_anything_is_written(tmp_path, ansible_env, tiny_model):
    _, sha = tiny_model
    extra = base(
        tmp_path,
        "",
        sha,
        llamacpp_server_model_src="",
        llamacpp_server_model_url="http://127.0.0.1:9/Llama-3.3-70B-Instruct-Q4_K_M.gguf",
        llamacpp_server_model="Llama-3.3-70B-Instruct",
        llamacpp_server_gpu_memory_mib=[RTX_A6000],
        llamacpp_server_ctx_size=4096,
        llamacpp_server_parallel=4,
        llamacpp_server_n_gpu_layers=80,
    )
    proc = play(ansible_env, extra)
    assert proc.rc != 0
    assert "llamacpp_server refuses to write or start anything" in proc.output
    assert "n_gpu_layers 80 does not fit GPU0 (49140 MiB)" in proc.output
    assert not (tmp_path / "host").exists()


def test_role_installs_and_the_real_server_runs_its_command_line(tmp_path, ansible_env, tiny_model, llama_server):
    model, sha = tiny_model
    key = "test-key-" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:24]
    # the default: the node's vLLM key (the inventory's vaulted vllm_server_api_key)
    extra = base(tmp_path, model, sha, llamacpp_server_binary_src=llama_server, vllm_server_api_key=key)
    proc = play(ansible_env, extra, "-v", "--diff")
    assert proc.rc == 0, proc.explain()
    assert key not in proc.output
    again = play(ansible_env, extra, "--check", "--diff")
    assert again.rc == 0 and again.host("localhost")["changed"] == 0, again.explain()
    assert key not in again.output
    root = tmp_path / "host"
    # the key: LLAMA_API_KEY in a 0600 root-owned env file the unit reads, not on the command line
    secrets = Path(extra["llamacpp_server_config_dir"]) / "secrets.env"
    assert secrets.stat().st_mode & 0o777 == 0o600 and secrets.stat().st_uid == os.geteuid()
    assert env_file(secrets) == {"LLAMA_API_KEY": key}
    assert key not in (root / "etc" / "llamacpp" / "llama-server.env").read_text()
    assert key not in (root / "etc" / "systemd" / "system" / "llama-server.service").read_text()
    model_on_node = Path(extra["llamacpp_server_model_dir"]) / "gpufleet-tiny.gguf"
    assert hashlib.sha256(model_on_node.read_bytes()).hexdigest() == sha
    unit = (root / "etc" / "systemd" / "system" / "llama-server.service").read_text()
    assert "EnvironmentFile=-%s" % extra["llamacpp_server_runtime_env_file"] in unit
    assert "ExecStart=%s $LLAMACPP_SERVER_ARGS" % extra["llamacpp_server_bin"] in unit
    assert "EnvironmentFile=%s\n" % secrets in unit
    if shutil.which("systemd-analyze"):
        res = subprocess.run(
            ["systemd-analyze", "verify", str(root / "etc/systemd/system/llama-server.service")],
            capture_output=True,
            text=True,
        )
        assert "llama-server.service" not in res.stdout + res.stderr or res.returncode == 0, res.stderr

    # every rendered option is one the real binary knows
    args = server_args(root / "etc" / "llamacpp" / "llama-server.env")
    helptext = subprocess.run(
        [extra["llamacpp_server_bin"], "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    for arg in args:
        if arg.startswith("--"):
            assert re.search(r"(^|[ ,])%s([ ,=]|$)" % re.escape(arg), helptext, re.M), arg

    # start it exactly as the unit would, on a free port
    port = free_port()
    args[args.index("--port") + 1] = str(port)
    args[args.index("--host") + 1] = "127.0.0.1"
    log = open(tmp_path / "llama-server.log", "w")
    server = subprocess.Popen(
        [extra["llamacpp_server_bin"], *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=dict(os.environ, **env_file(secrets)),
    )
    try:
        base_url = "http://127.0.0.1:%d" % port
        deadline = time.monotonic() + 120
        status = None
        while time.monotonic() < deadline:
            try:
                status, _ = get(base_url + "/health")
                if status == 200:
                    break
            except OSError:
                pass
            assert server.poll() is None, (tmp_path / "llama-server.log").read_text()[-3000:]
            time.sleep(0.5)
        assert status == 200, (tmp_path / "llama-server.log").read_text()[-3000:]
        # public with a key (llama-server's own list): /health and /v1/models, which the balancer's
        # check and the node's readiness check ask without a key
        status, models = get(base_url + "/v1/models")
        assert status == 200 and [m["id"] for m in json.loads(models)["data"]] == ["gpufleet-tiny"]
        body = json.dumps(
            {"model": "gpufleet-tiny", "prompt": "hello the world", "max_tokens": 8, "stream": True}
        ).encode()

        def complete(headers):
            req = urllib.request.Request(
                base_url + "/v1/completions", data=body, headers={"Content-Type": "application/json", **headers}
            )
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    return resp.status, resp.read().decode()
            except urllib.error.HTTPError as err:
                return err.code, err.read().decode()

        # without the key, or with another: 401, for the completions and for /metrics
        for headers in ({}, {"Authorization": "Bearer not-" + key}):
            status, text = complete(headers)
            assert status == 401 and "Invalid API Key" in text, (status, text)
        assert get(base_url + "/metrics")[0] == 401
        assert get(base_url + "/metrics", key="not-" + key)[0] == 401
        status, text = complete({"Authorization": "Bearer " + key})
        assert status == 200, text
        events = [ln[6:] for ln in text.splitlines() if ln.startswith("data: ")]
        assert events[-1] == "[DONE]" and len(events) >= 3
        assert all("choices" in json.loads(e) for e in events[:-1])
        status, metrics = get(base_url + "/metrics", key=key)
        assert status == 200, metrics
        assert key not in (tmp_path / "llama-server.log").read_text()
        # every llama.cpp metric the dashboard (role monitoring) plots is one this build exports
        plotted = {m for _t, e in dashboard_queries() for m in re.findall(r"llamacpp:\w+", e)}
        exported = set(re.findall(r"^(llamacpp:\w+) ", metrics, re.M))
        assert plotted and plotted <= exported, (plotted - exported, exported)
        assert re.search(r"^llamacpp:tokens_predicted_total \d", metrics, re.M), metrics
        assert re.search(r"^llamacpp:prompt_tokens_total [1-9]", metrics, re.M), metrics
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_an_api_key_that_would_add_a_line_is_refused_before_anything_is_written(tmp_path, ansible_env, tiny_model):
    model, sha = tiny_model
    extra = base(tmp_path, model, sha, llamacpp_server_api_key="first-line\nLD_PRELOAD=/tmp/x.so")
    proc = play(ansible_env, extra, "--tags", "serving_config")
    assert proc.rc != 0
    assert "llamacpp_server_api_key contains a newline" in proc.output, proc.output[-3000:]
    assert "LD_PRELOAD" not in proc.output and "first-line" not in proc.output
    assert not (tmp_path / "host").exists()


def test_a_model_with_another_sha256_is_refused(tmp_path, ansible_env, tiny_model):
    model, _ = tiny_model
    extra = base(tmp_path, model, "0" * 64, llamacpp_server_binary_src=sys.executable)
    proc = play(ansible_env, extra, "--skip-tags", "llamacpp_service")
    assert proc.rc != 0
    assert "expected 0000000000000000000000000000000000000000000000000000000000000000" in proc.output
