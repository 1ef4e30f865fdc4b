# SPDX-License-Identifier: GPL-3.0-or-later
"""Every config the vllm_server role renders (each shipped model x hardware profile) parses with
vLLM 0.33.0's OWN argument parser, and the settings the role refuses are the ones that parser
rejects.

The parser lives in a separate venv (vLLM without CUDA: `bash tests/vllm_parser/setup.sh`, default
<repo>/.vllm-venv, or $GPUFLEET_VLLM_VENV). Without that venv these tests are skipped, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.node.plugins.module_utils.serving import _kvplan, _vllm, _vllm_options

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("GPUFLEET_VLLM_VENV", REPO / ".vllm-venv"))
VPY = VENV / "bin" / "python"
PARSE = Path(__file__).resolve().parent / "parse_config.py"
PLAYBOOK = REPO / "tests" / "integration" / "playbooks" / "vllm_server.yml"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not VPY.exists(),
        reason="vLLM parser venv %s is absent: create it with "
        "`bash tests/vllm_parser/setup.sh` (about 3 GB, a few minutes)" % VENV,
    ),
]


def parse(files, with_options=False):
    """One run of vLLM's parser over ``files`` (and its option list first): {file: result}."""
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
    argv = [str(VPY), str(PARSE), *(["--options"] if with_options else []), *map(str, files)]
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    lines = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    results = {r["file"]: r for r in lines if "file" in r}
    assert len(results) == len(files), res.stdout + res.stderr[-3000:]
    if with_options:
        (options,) = [r["options"] for r in lines if "options" in r]
        results["--options"] = options
    return results


def smallest_fitting_count(model, gpu):
    for count in (1, 2, 4, 8):
        if _vllm.serve_config(model, gpu, count)["plan"]["fits"]:
            return count
    raise AssertionError("%s fits on no count of %s" % (model, gpu))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory, request):
    """Render config.yaml for every model x hardware profile with the role (tag vllm_config), one
    inventory host per combination, in one ansible-playbook run."""
    tmp = tmp_path_factory.mktemp("rendered")
    hosts = {}
    for model in sorted(_kvplan.MODEL_PROFILES):
        for gpu in sorted(_vllm.HARDWARE_PROFILES):
            name = ("%s__%s" % (model, gpu)).replace(".", "_")
            hosts[name] = {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "vllm_server_model": model,
                "vllm_server_gpu": gpu,
                "vllm_server_gpu_count": smallest_fitting_count(model, gpu),
                "vllm_server_config_dir": str(tmp / name),
                "vllm_server_manage_service": False,
            }
    inventory = tmp / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env["PATH"] = "%s:%s" % (Path(sys.executable).parent, env.get("PATH", ""))
    proc = subprocess.run(
        ["ansible-playbook", "-i", str(inventory), str(PLAYBOOK), "--tags", "vllm_config", "--forks", "4"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr
    return {name: tmp / name / "config.yaml" for name in hosts}


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    """Files the parser must reject: each removed setting, and a wrongly typed value."""
    tmp = tmp_path_factory.mktemp("probes")
    removed = {}
    for key in _vllm.REMOVED_SETTINGS:
        removed[key] = tmp / ("%s.yaml" % key)
        removed[key].write_text("model: meta-llama/Llama-3.1-8B-Instruct\n%s: 1\n" % key)
    bad = tmp / "bad.yaml"
    bad.write_text("model: x\ntensor_parallel_size: four\n")
    return {"removed": removed, "bad": bad}


@pytest.fixture(scope="module")
def parsed(rendered, probes):
    """vLLM's parser, imported once for the whole module: its option list and every file."""
    return parse([*rendered.values(), *probes["removed"].values(), probes["bad"]], with_options=True)


def test_every_rendered_config_parses_with_vllms_parser(rendered, parsed):
    assert len(rendered) == len(_kvplan.MODEL_PROFILES) * len(_vllm.HARDWARE_PROFILES)
    results = parsed
    for name, path in rendered.items():
        result = results[str(path)]
        assert result["ok"], "%s: %s" % (name, result["error"])
        config = yaml.safe_load(path.read_text())
        for key, value in config.items():
            parsed = result["args"][key]
            if key == "served_model_name":
                assert value in parsed
            else:
                assert parsed == value, "%s: %s parsed as %r, rendered %r" % (name, key, parsed, value)


def test_removed_settings_are_what_vllms_parser_rejects(probes, parsed):
    for key, path in probes["removed"].items():
        result = parsed[str(path)]
        if key == "disable_log_requests":
            # still parsed as the negative of its replacement, --enable-log-requests
            assert "keys not known to the parser: ['disable_log_requests']" in result["error"]
        else:
            assert not result["ok"] and "unrecognized arguments: --%s" % key.replace("_", "-") in result["error"]


def test_the_parser_check_can_fail(probes, parsed):
    assert not parsed[str(probes["bad"])]["ok"]


def test_the_collections_option_list_is_vllms(parsed):
    """_vllm_options.VLLM_SERVE_OPTIONS (what the role accepts in vllm_server_settings) is exactly
    the option set of the pinned release's own parser: regenerate it from `parse_config.py --options`."""
    real = set(parsed["--options"])
    assert len(real) > 100
    assert _vllm_options.VLLM_SERVE_OPTIONS_VERSION == _vllm.VLLM_VERSION
    assert (
        sorted(real - _vllm_options.VLLM_SERVE_OPTIONS) == [] and sorted(_vllm_options.VLLM_SERVE_OPTIONS - real) == []
    )
