# SPDX-License-Identifier: GPL-3.0-or-later
"""The vllm_server role through ansible-playbook (-c local) against temporary directories: the
config-only tag, both runtimes' units (systemd-analyze verify), secrets, refusals, check mode and
idempotence. Services are not started here (vllm_server_manage_service: false): the lab fleet does
that with systemd as PID 1."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.node.plugins.module_utils.serving import _vllm
from tests.harness.parsers import parse_env_file
from tests.harness.playbook import run_playbook

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "tests" / "integration" / "playbooks" / "vllm_server.yml"
TOKEN = "hf_LabTokenThatMustNeverBeLogged0123456789"
API_KEY = "sk-lab-api-key-never-logged-42"


def paths(tmp_path):
    root = tmp_path / "host"
    return {
        "vllm_server_config_dir": str(root / "etc" / "vllm"),
        "vllm_server_systemd_dir": str(root / "etc" / "systemd" / "system"),
        "vllm_server_runtime_env_file": str(root / "etc" / "gpufleet" / "gpu-runtime.env"),
        "vllm_server_hf_cache": str(root / "var" / "cache" / "huggingface"),
    }


def play(ansible_env, extra, *args):
    extra = dict(extra, ansible_python_interpreter=sys.executable)
    return run_playbook(PLAYBOOK, *args, local=True, extra_vars=extra, env=ansible_env, timeout=300)


def recap(proc):
    return proc.host("localhost")


def files_under(root):
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*") if p.is_file())


def fake_bin(tmp_path, name):
    path = tmp_path / "bin" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return str(path)


def verify_unit(unit, tmp_path, extra_units=()):
    """systemd-analyze verify with fake dependency units on the search path; no output allowed."""
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    units = tmp_path / "units"
    units.mkdir(exist_ok=True)
    for name in extra_units:
        (units / name).write_text(
            "[Unit]\nDescription=fake %s\n[Service]\nExecStart=%s\n" % (name, fake_bin(tmp_path, "true-" + name))
        )
    env = dict(os.environ, SYSTEMD_UNIT_PATH="%s:" % units, SYSTEMD_LOG_COLOR="0")
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, env=env)
    assert res.returncode == 0 and res.stdout + res.stderr == "", res.stdout + res.stderr


def base(tmp_path, **kw):
    extra = dict(
        paths(tmp_path),
        vllm_server_model="Llama-3.3-70B-Instruct",
        vllm_server_gpu="L40S",
        vllm_server_gpu_count=4,
        vllm_server_manage_service=False,
    )
    extra.update(kw)
    return extra


def test_config_tag_writes_config_yaml_alone(ansible_env, tmp_path):
    extra = base(tmp_path)
    proc = play(ansible_env, extra, "--tags", "vllm_config")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert files_under(tmp_path / "host") == ["etc/vllm/config.yaml"]
    text = (tmp_path / "host/etc/vllm/config.yaml").read_text()
    assert text.startswith("#\n# Ansible managed")
    assert "327,680 B/token for the whole model" in text
    cfg = yaml.safe_load(text)
    expected = _vllm.serve_config("Llama-3.3-70B-Instruct", "L40S", 4, host="0.0.0.0", port=8000)["config"]
    assert cfg == expected
    assert (cfg["tensor_parallel_size"], cfg["max_model_len"], cfg["block_size"]) == (4, 16384, 16)
    again = play(ansible_env, extra, "--tags", "vllm_config")
    assert recap(again)["changed"] == 0, again.stdout


def test_settings_override_and_extra_options(ansible_env, tmp_path):
    extra = base(
        tmp_path,
        vllm_server_model="Llama-3.1-8B-Instruct",
        vllm_server_gpu="H100-80GB",
        vllm_server_gpu_count=1,
        vllm_server_port=8001,
        vllm_server_settings={"max-num-seqs": 64, "enable_log_requests": True},
    )
    proc = play(ansible_env, extra, "--tags", "vllm_config")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cfg = yaml.safe_load((tmp_path / "host/etc/vllm/config.yaml").read_text())
    assert (cfg["max_num_seqs"], cfg["enable_log_requests"], cfg["port"]) == (64, True, 8001)


@pytest.mark.parametrize("runtime", ["native", "docker"])
def test_full_role_writes_unit_secrets_and_config(ansible_env, tmp_path, runtime):
    extra = base(
        tmp_path,
        vllm_server_runtime=runtime,
        vllm_server_hf_token=TOKEN,
        vllm_server_api_key=API_KEY,
        vllm_server_vllm_bin=fake_bin(tmp_path, "vllm"),
        vllm_server_docker_bin=fake_bin(tmp_path, "docker"),
    )
    proc = play(ansible_env, extra, "-v")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert TOKEN not in proc.stdout + proc.stderr and API_KEY not in proc.stdout + proc.stderr
    host = tmp_path / "host"
    written = ["etc/systemd/system/vllm.service", "etc/vllm/config.yaml", "etc/vllm/secrets.env"]
    if runtime == "docker":  # docker --env-file needs the runtime env file, even empty
        written.insert(0, "etc/gpufleet/gpu-runtime.env")
    assert files_under(host) == written
    secrets = host / "etc/vllm/secrets.env"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    assert parse_env_file(secrets.read_text()) == {"HF_TOKEN": TOKEN, "VLLM_API_KEY": API_KEY}
    unit = host / "etc/systemd/system/vllm.service"
    text = unit.read_text()
    for line in (
        "Restart=on-failure",
        "LimitMEMLOCK=infinity",
        "TimeoutStopSec=95",
        "Wants=network-online.target\n",
        "EnvironmentFile=-%s" % extra["vllm_server_runtime_env_file"],
        "EnvironmentFile=%s" % secrets,
    ):
        assert line in text
    assert re.search(r"^After=.*gpufleet-acs\.service", text, re.M)
    if runtime == "docker":
        for arg in (
            "--gpus all",
            "--ipc=host",
            "--ulimit memlock=-1",
            "--env-file %s" % secrets,
            "--volume %s:/root/.cache/huggingface" % extra["vllm_server_hf_cache"],
            "vllm/vllm-openai:v0.33.0 --config %s/config.yaml" % extra["vllm_server_config_dir"],
        ):
            assert arg in text
        assert "Requires=docker.service" in text
        verify_unit(unit, tmp_path, ["docker.service"])
    else:
        assert (
            "ExecStart=%s serve --config %s/config.yaml"
            % (extra["vllm_server_vllm_bin"], extra["vllm_server_config_dir"])
            in text
        )
        verify_unit(unit, tmp_path)
    again = play(ansible_env, extra)
    assert recap(again)["changed"] == 0, again.stdout


def test_broken_unit_fails_verify(tmp_path):
    """The verify helper itself fails on a bad unit (a test that cannot fail is a defect)."""
    unit = tmp_path / "bad.service"
    unit.write_text("[Service]\nExecStart=%s\nRestart=sometimes\n" % fake_bin(tmp_path, "x"))
    with pytest.raises(AssertionError, match="restart specifier"):
        verify_unit(unit, tmp_path)


def test_docker_shm_size_instead_of_host_ipc(ansible_env, tmp_path):
    extra = base(
        tmp_path,
        vllm_server_docker_ipc_host=False,
        vllm_server_docker_shm_size="32g",
        vllm_server_docker_bin=fake_bin(tmp_path, "docker"),
    )
    assert play(ansible_env, extra).returncode == 0
    text = (tmp_path / "host/etc/systemd/system/vllm.service").read_text()
    assert "--shm-size=32g" in text and "--ipc=host" not in text


def _prior_state(tmp_path):
    cfg_dir = Path(paths(tmp_path)["vllm_server_config_dir"])
    cfg_dir.mkdir(parents=True)
    (cfg_dir / "config.yaml").write_text("# the config that serves today\nmodel: x\n")
    return cfg_dir


@pytest.mark.parametrize("tags", [[], ["--tags", "vllm_config"]])
def test_refusal_fails_the_host_with_numbers_and_touches_nothing(ansible_env, tmp_path, tags):
    cfg_dir = _prior_state(tmp_path)
    before = files_under(tmp_path / "host")
    # 70B BF16 on one L40S: the weights alone exceed the budget
    extra = base(tmp_path, vllm_server_gpu_count=1, vllm_server_docker_bin=fake_bin(tmp_path, "docker"))
    proc = play(ansible_env, extra, *tags)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert recap(proc)["failed"] == 1
    assert (
        "vllm_server refuses to write or start anything: does not fit: weights alone exceed the budget" in proc.stdout
    )
    assert "131.42 GiB of weights per GPU" in proc.stdout
    assert files_under(tmp_path / "host") == before
    assert (cfg_dir / "config.yaml").read_text() == "# the config that serves today\nmodel: x\n"


def test_max_model_len_that_does_not_fit_is_refused(ansible_env, tmp_path):
    _prior_state(tmp_path)
    extra = base(tmp_path, vllm_server_settings={"max_model_len": 131072})
    proc = play(ansible_env, extra)
    assert proc.returncode == 2
    assert "one max_model_len request does not fit: 131,072 tokens need 10.00 GiB" in proc.stdout
    assert files_under(tmp_path / "host") == ["etc/vllm/config.yaml"]


def test_oversubscribed_concurrency_is_refused(ansible_env, tmp_path):
    extra = base(tmp_path, vllm_server_settings={"max_num_seqs": 64})
    proc = play(ansible_env, extra, "--tags", "vllm_config")
    assert proc.returncode == 2
    assert "max_num_seqs 64 x expected request length 8,192" in proc.stdout
    assert not (tmp_path / "host").exists()
    ok = play(ansible_env, dict(extra, vllm_server_oversubscription_factor=8), "--tags", "vllm_config")
    assert ok.returncode == 0, ok.stdout


@pytest.mark.parametrize(
    "setting,replacement",
    [
        ("swap_space", "preempts and recomputes"),
        ("calculate_kv_scales", "calibrated k/v scales"),
        ("disable-log-requests", "enable_log_requests"),
    ],
)
def test_removed_settings_are_refused_naming_the_replacement(ansible_env, tmp_path, setting, replacement):
    proc = play(ansible_env, base(tmp_path, vllm_server_settings={setting: 4}), "--tags", "vllm_config")
    assert proc.returncode == 2
    assert "%s: " % setting in proc.stdout and replacement in proc.stdout
    assert not (tmp_path / "host").exists()


def test_check_mode_writes_nothing(ansible_env, tmp_path):
    extra = base(tmp_path, vllm_server_hf_token=TOKEN, vllm_server_docker_bin=fake_bin(tmp_path, "docker"))
    proc = play(ansible_env, extra, "--check", "--diff")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert recap(proc)["changed"] >= 2
    assert not (tmp_path / "host").exists()
    assert TOKEN not in proc.stdout + proc.stderr


def test_missing_inputs_say_what_to_set(ansible_env, tmp_path):
    extra = paths(tmp_path)
    extra.update(vllm_server_model="Llama-3.1-8B-Instruct", vllm_server_manage_service=False)
    proc = play(ansible_env, extra, "--tags", "vllm_config")
    assert proc.returncode == 2
    assert "gather gpufleet.node.gpu_topology_facts first" in proc.stdout


def test_model_from_the_nodes_config_json(ansible_env, tmp_path):
    config_json = tmp_path / "config.json"
    config_json.write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "num_hidden_layers": 16,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 64,
                "hidden_size": 2048,
                "intermediate_size": 8192,
                "vocab_size": 128256,
                "max_position_embeddings": 131072,
                "torch_dtype": "bfloat16",
            }
        )
    )
    extra = base(
        tmp_path,
        vllm_server_model="my-org/Small-Llama",
        vllm_server_gpu="RTX-4090",
        vllm_server_gpu_count=1,
        vllm_server_model_config_path=str(config_json),
        vllm_server_model_config={"num_parameters": 1235814400},
    )
    proc = play(ansible_env, extra, "--tags", "vllm_config")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (tmp_path / "host/etc/vllm/config.yaml").read_text()
    cfg = yaml.safe_load(text)
    assert (cfg["model"], cfg["served_model_name"], cfg["max_model_len"]) == ("my-org/Small-Llama",) * 2 + (16384,)
    assert "32,768 B/token for the whole model" in text  # 2 x 16 x 8 x 64 x 2
    # without the parameter count the planner cannot size the weights: the host fails, saying so
    bad = play(
        ansible_env,
        dict(extra, vllm_server_model_config={}, vllm_server_config_dir=str(tmp_path / "x")),
        "--tags",
        "vllm_config",
    )
    assert bad.returncode == 2 and "'num_parameters' is missing" in bad.stdout


EVIL = "/tmp/gpufleet-evil.so"
REFUSED = {  # host: (its variables, what the failure must say)
    "tp_zero": (
        {"vllm_server_settings": {"tensor_parallel_size": 0}},
        "tensor_parallel_size must be a positive integer",
    ),
    "len_zero": ({"vllm_server_settings": {"max_model_len": 0}}, "max_model_len must be a positive integer"),
    "len_negative": ({"vllm_server_settings": {"max-model-len": -5}}, "max_model_len must be a positive integer"),
    "seqs_zero": ({"vllm_server_settings": {"max_num_seqs": 0}}, "max_num_seqs must be a positive integer"),
    "seqs_negative": ({"vllm_server_settings": {"max_num_seqs": -1}}, "max_num_seqs must be a positive integer"),
    "block_zero": ({"vllm_server_settings": {"block_size": 0}}, "block_size must be a positive integer"),
    "no_heads": (
        {"vllm_server_model_config": {"num_attention_heads": 0}},
        "config field 'num_attention_heads' must be a positive integer",
    ),
    "negative_reserve": (
        {"vllm_server_reserves": {"activation_bytes": -1073741824}},
        "activation_bytes must be a non-negative integer number of bytes",
    ),
    "unknown_setting": ({"vllm_server_settings": {"max_num_seq": 8}}, "`vllm serve` 0.33.0 has no option max_num_seq"),
    "secret_setting": ({"vllm_server_settings": {"api_key": API_KEY}}, "api_key: set vllm_server_api_key"),
    "token_newline": (
        {"vllm_server_hf_token": TOKEN + "\nLD_PRELOAD=" + EVIL},
        "vllm_server_hf_token contains a newline",
    ),
    "name_newline": (
        {"vllm_server_served_model_name": "llama\nExecStartPre=/bin/touch " + EVIL},
        "vllm_server_served_model_name contains a newline",
    ),
    "cache_newline": (
        {"vllm_server_hf_cache": "/var/cache/hf\nExecStartPre=/bin/touch " + EVIL},
        "vllm_server_hf_cache contains a newline",
    ),
}


def test_bad_numbers_secrets_and_injections_are_refused_before_anything_is_written(ansible_env, tmp_path):
    """One host per case in one run (with --diff): each fails naming the input and what
    to do, no file is written, and no secret or injected line appears in the output."""
    hosts = {}
    for name, (extra, _) in REFUSED.items():
        hosts[name] = dict(
            base(tmp_path / name, vllm_server_docker_bin=fake_bin(tmp_path, "docker")),
            **extra,
            ansible_connection="local",
            ansible_python_interpreter=sys.executable,
        )
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    proc = run_playbook(PLAYBOOK, "--diff", "--forks", "4", inventory=inventory, env=ansible_env)
    assert proc.returncode == 2, proc.explain()
    for name, (_, message) in REFUSED.items():
        assert proc.host(name)["failed"] == 1, proc.explain()
        # the YAML callback folds long messages and doubles single quotes
        failures = re.sub(r"\s+", " ", " ".join(proc.host_failures(name))).replace("''", "'")
        assert message in failures, "%s: %s" % (name, failures or proc.explain())
        assert not (tmp_path / name / "host").exists(), files_under(tmp_path / name)
    assert TOKEN not in proc.output and API_KEY not in proc.output and EVIL not in proc.output
