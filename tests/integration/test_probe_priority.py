# SPDX-License-Identifier: GPL-3.0-or-later
"""The serving probe's request priority follows the served engine: role vllm_server publishes
`probe_priority: -1` in the serving endpoint where vLLM schedules by priority
(`vllm_server_settings: {scheduling_policy: priority}`, either spelling of the key), none under
vLLM's default policy (vLLM refuses the field there) and llamacpp_server none; lb_registration's
prober is run with `--priority` exactly where one is published. One ansible-playbook run, a host
per case (tests/integration/playbooks/probe_priority.yml); each rendered command line is then
parsed by the prober's own argument parser."""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys

from tests.harness import REPO
from tests.harness.playbook import run_playbook

PLAYBOOK = REPO / "tests" / "integration" / "playbooks" / "probe_priority.yml"
PROBER = REPO / "roles" / "lb_registration" / "files" / "gpufleet_serving_probe.py"
VLLM = {"server_role": "vllm_server", "vllm_server_model": "Llama-3.1-8B-Instruct"}
LLAMA = {"server_role": "llamacpp_server", "llamacpp_server_served_model_name": "tiny"}
CASES = {
    # host: (its variables, the --priority its prober is given)
    "vllm-fcfs": (VLLM, None),
    "vllm-fcfs-named": (dict(VLLM, vllm_server_settings={"scheduling_policy": "fcfs"}), None),
    "vllm-priority": (dict(VLLM, vllm_server_settings={"scheduling_policy": "priority"}), -1),
    "vllm-priority-dashed": (dict(VLLM, vllm_server_settings={"scheduling-policy": "priority"}), -1),
    "llamacpp": (LLAMA, None),
    # no server role published an endpoint: the collection's default one has no priority (nor a
    # model: the role runs no prober there; its unit is only rendered here)
    "no-server": ({"server_role": "none"}, None),
}


def _prober():
    spec = importlib.util.spec_from_file_location("gpufleet_serving_probe", PROBER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exec_start(unit_text):
    (line,) = [line for line in unit_text.splitlines() if line.startswith("ExecStart=")]
    return shlex.split(line[len("ExecStart=") :])


def test_the_probe_priority_follows_the_engines_scheduling_policy(ansible_env, tmp_path):
    hosts = {
        name: dict(variables, ansible_connection="local", ansible_python_interpreter=sys.executable)
        for name, (variables, _priority) in CASES.items()
    }
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"all": {"hosts": hosts}}))
    run = run_playbook(
        PLAYBOOK, inventory=str(inventory), extra_vars={"repo": str(REPO), "out_dir": str(tmp_path)}, env=ansible_env
    )
    assert run.returncode == 0, run.explain()
    parse = _prober().parse_args
    for name, (variables, priority) in CASES.items():
        argv = exec_start((tmp_path / f"{name}.service").read_text())
        assert argv[1] == "/usr/local/lib/gpufleet/gpufleet_serving_probe.py", argv
        if variables["server_role"] == "none":
            assert "--priority" not in argv and "--backend" not in argv, argv
            continue
        args = parse(argv[2:])
        assert args.priority == priority, (name, argv)
        assert ("--priority" in argv) == (priority is not None), (name, argv)
        if variables["server_role"] == "vllm_server":
            assert args.backend == "vllm" and args.model == "Llama-3.1-8B-Instruct", (name, argv)
        elif variables["server_role"] == "llamacpp_server":
            assert args.backend == "llamacpp" and args.model == "tiny", (name, argv)
