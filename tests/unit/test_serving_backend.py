# SPDX-License-Identifier: GPL-3.0-or-later
"""The backend choice (``gpufleet_serving_backend``, plugins/module_utils/serving/_backend.py): the rule, and
the serving roles' own plans it judges under ``auto`` (each role's ``tasks_from: plan``, made once,
judged only where the rule needs them; playbooks/tasks/serving_backend.yml restates none of the
roles' settings)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.filter.serving_backend import llamacpp_plan, serving_backend, vllm_plan
from ansible_collections.gpufleet.node.plugins.module_utils.serving import _backend

REPO = Path(__file__).resolve().parents[2]
RTX_A6000 = 49140
RTX_4090 = 24564
L40S = 46068
FITS = {"fits": True, "numbers": "tensor_parallel_size 4, 568336 KV tokens"}
NO_FIT = {"fits": False, "numbers": "tensor_parallel_size 1: weights alone exceed the budget"}
LC_FITS = {"fits": True, "numbers": "74 of 80 layers"}
LC_NO_FIT = {"fits": False, "numbers": "80 of 80 layers: 49142 MiB > 46068 MiB"}


@pytest.mark.parametrize(
    "requested,gpus,model,plans,backend,why",
    [
        ("auto", [L40S] * 4, "Llama-3.3-70B-Instruct", None, "vllm", "4 identical GPUs (46068 MiB): vLLM"),
        ("auto", [RTX_A6000, RTX_4090], "m", None, "llamacpp", "differ in size (49140, 24564 MiB)"),
        ("auto", [RTX_A6000], "/models/m-Q4_K_M.gguf", None, "llamacpp", "GGUF file (m-Q4_K_M.gguf)"),
        ("auto", [L40S] * 4, "m", {"vllm": FITS}, "vllm", "tensor-parallel plan fits (tensor_parallel_size 4, 568336"),
        # vLLM's plan does not fit: llama.cpp where its plan fits, vLLM (which refuses) otherwise
        ("auto", [L40S], "m", {"vllm": NO_FIT, "llamacpp": LC_FITS}, "llamacpp", "layer-offload plan fits (74 of 80"),
        ("auto", [L40S], "m", {"vllm": NO_FIT, "llamacpp": LC_NO_FIT}, "vllm", "nor does llama.cpp's"),
        ("auto", [L40S], "m", {"vllm": NO_FIT, "llamacpp": None}, "vllm", "no llama.cpp model configured"),
        ("vllm", [RTX_A6000, RTX_4090], "x", None, "vllm", "set by gpufleet_serving_backend"),
        ("LlamaCpp", [L40S] * 4, "x", {"vllm": FITS}, "llamacpp", "set by"),
    ],
)
def test_backend_choice(requested, gpus, model, plans, backend, why):
    choice = _backend.choose(requested, gpus, model=model, plans=plans)
    assert choice["backend"] == backend and why in choice["reason"], choice["reason"]


def test_neither_fits_names_both_plans_numbers():
    reason = _backend.choose("auto", [L40S], "m", plans={"vllm": NO_FIT, "llamacpp": LC_NO_FIT})["reason"]
    assert "weights alone exceed the budget" in reason and "49142 MiB > 46068 MiB" in reason


def test_plans_are_made_only_where_the_rule_needs_them():
    def refuse():
        raise AssertionError("planned although the rule did not need it")

    for requested, gpus, model in (
        ("vllm", [L40S] * 4, "m"),
        ("llamacpp", [L40S] * 4, "m"),
        ("auto", [RTX_A6000, RTX_4090], "m"),
        ("auto", [L40S], "m.gguf"),
    ):
        choice = _backend.choose(requested, gpus, model=model, plans=refuse)
        assert "plans" not in choice


def test_backend_choice_refuses_unknown_names_and_no_gpus():
    with pytest.raises(_backend.BackendError, match="'sglang' is not one of auto, vllm, llamacpp"):
        _backend.choose("sglang", [1])
    with pytest.raises(_backend.BackendError, match="no GPUs"):
        _backend.choose("auto", [])
    with pytest.raises(AnsibleFilterError, match="'sglang' is not one of"):
        serving_backend("sglang", [1])


VLLM_ONE_L40S = {"model": "Llama-3.3-70B-Instruct-FP8", "gpu": "NVIDIA L40S", "gpu_count": 1}
LLAMA_70B = {"model": "Llama-3.3-70B-Instruct", "ctx_size": 4096, "parallel": 4}


def _vllm(**inputs):
    inputs = dict(VLLM_ONE_L40S, **inputs)
    return vllm_plan(inputs.pop("model"), inputs.pop("gpu"), inputs.pop("gpu_count"), **inputs)


def _llamacpp(**inputs):
    return llamacpp_plan([L40S], **dict(LLAMA_70B, **inputs))


def test_the_planners_decide_one_l40s_serves_a_70b_with_llamacpp():
    """The filter, over the roles' plans (the planners of vllm_memory_plan and llamacpp_memory_plan):
    a 70B model's FP8 weights alone exceed one L40S (vLLM refused), a Q4_K_M layer-offload plan
    keeps 74 of its 80 layers on the GPU."""
    choice = serving_backend("auto", [L40S], "Llama-3.3-70B-Instruct-FP8", vllm=_vllm(), llamacpp=_llamacpp())
    assert choice["backend"] == "llamacpp"
    assert choice["plans"]["vllm"]["fits"] is False and choice["plans"]["llamacpp"]["fits"] is True
    assert "67.67 GiB of weights per GPU" in choice["reason"]
    assert "74 of 80 layers" in choice["reason"]


def test_the_planners_decide_four_l40s_serve_it_with_vllm_and_llamacpp_is_not_judged():
    choice = serving_backend(
        "auto", [L40S] * 4, "Llama-3.3-70B-Instruct-FP8", vllm=_vllm(gpu_count=4), llamacpp=_llamacpp()
    )
    assert choice["backend"] == "vllm"
    assert "tensor_parallel_size 4, max_model_len 16384" in choice["reason"]
    assert choice["plans"] == {"vllm": choice["plans"]["vllm"], "llamacpp": None}


def test_neither_planner_fits_stays_on_vllm_and_no_model_is_not_a_plan():
    choice = serving_backend("auto", [L40S], "x", vllm=_vllm(), llamacpp=_llamacpp(n_gpu_layers=81))
    assert choice["backend"] == "vllm" and "at most 74 layers fit" in choice["reason"]
    for no_model in ({"model": "", "model_path": ""}, {"model_path": "/nonexistent/m.gguf"}):
        choice = serving_backend("auto", [L40S], "x", vllm=_vllm(), llamacpp=_llamacpp(**no_model))
        assert choice["backend"] == "vllm" and choice["plans"]["llamacpp"] is None
    # an unknown profile is not planned here: the role's preflight refuses it with the planner's message
    unknown = _vllm(gpu="GTX 480")
    assert unknown["serve"] is None and "GTX 480" in unknown["error"]
    assert serving_backend("auto", [L40S], "x", vllm=unknown)["plans"]["vllm"] is None


def test_the_vllm_plan_is_the_config_the_role_writes():
    """vllm_server's preflight writes config.yaml from the plan's ``serve``: vllm_serve_config's own
    result for the same inputs, not a second plan."""
    from ansible_collections.gpufleet.node.plugins.filter.kvplan import vllm_serve_config

    planned = _vllm(gpu_count=4, port=8001, served_model_name="llama")
    assert planned["error"] is None
    assert planned["serve"] == vllm_serve_config(
        "Llama-3.3-70B-Instruct-FP8", "NVIDIA L40S", 4, port=8001, served_model_name="llama"
    )
    assert vllm_plan("", "NVIDIA L40S", 4) == {"serve": None, "error": None}


def test_the_llamacpp_plan_carries_the_modules_server_args():
    """llamacpp_server's preflight composes the command line from the plan's ``server_args``: the
    ones llamacpp_memory_plan returns for the same inputs."""
    from ansible_collections.gpufleet.node.plugins.module_utils.serving import _llamaplan

    planned = _llamacpp()
    inputs = dict(LLAMA_70B, quant="Q4_K_M")
    result = _llamaplan.plan([L40S], **inputs)
    assert planned["here"] and planned["error"] is None
    assert planned["plan"] == dict(result, server_args=_llamaplan.server_args(result, 4096, 4))
    assert planned["plan"]["server_args"][:6] == ["--n-gpu-layers", "74", "--ctx-size", "16384", "--parallel", "4"]


def test_a_plan_the_planner_refuses_fails_the_choice_only_where_it_is_judged(tmp_path):
    """A file that is here but no GGUF model: the llama.cpp plan keeps the refusal; the choice
    fails with it only where vLLM's plan does not fit (the llama.cpp plan is judged there)."""
    bad = tmp_path / "m.gguf"
    bad.write_bytes(b"not a gguf file")
    planned = _llamacpp(model_path=str(bad))
    assert planned["here"] and planned["plan"] is None and planned["error"]
    with pytest.raises(AnsibleFilterError, match="llama.cpp's plan: model_path"):
        serving_backend("auto", [L40S], "x", vllm=_vllm(), llamacpp=planned)
    assert serving_backend("auto", [L40S] * 4, "x", vllm=_vllm(gpu_count=4), llamacpp=planned)["backend"] == "vllm"
    assert serving_backend("llamacpp", [L40S], "x", vllm=_vllm(), llamacpp=planned)["backend"] == "llamacpp"


def test_recorded_verdicts_replace_planning():
    """The node's boot validation: the verdicts site.yml recorded, not a plan made again."""
    recorded = {"vllm": NO_FIT, "llamacpp": LC_FITS}
    choice = serving_backend("auto", [L40S], "x", vllm=_vllm(gpu_count=4), recorded=recorded)
    assert choice["backend"] == "llamacpp" and choice["plans"] == recorded


def test_the_choice_restates_no_setting_of_the_serving_roles():
    """playbooks/tasks/serving_backend.yml includes each role's own plan (entry point plan, with its
    argument spec) and reads the published plans; it names no role setting with a fallback."""
    text = (REPO / "playbooks/tasks/serving_backend.yml").read_text()
    assert re.findall(r"\b(?:vllm|llamacpp)_server_\w+ *\| *default\(", text) == []
    tasks = yaml.safe_load(text)
    includes = [t["ansible.builtin.include_role"] for t in tasks if "ansible.builtin.include_role" in t]
    assert [(i["name"], i["tasks_from"], i["public"]) for i in includes] == [
        ("gpufleet.node.vllm_server", "plan", True),
        ("gpufleet.node.llamacpp_server", "plan", True),
    ]
    for role in ("vllm_server", "llamacpp_server"):
        specs = yaml.safe_load((REPO / "roles" / role / "meta/argument_specs.yml").read_text())["argument_specs"]
        assert "plan" in specs, role
        assert (REPO / "roles" / role / "tasks/plan.yml").is_file(), role
    for role, fact in (("vllm_server", "vllm_server_planned"), ("llamacpp_server", "llamacpp_server_planned")):
        preflight = (REPO / "roles" / role / "tasks/preflight.yml").read_text()
        assert "when: %s is not defined" % fact in preflight, role


def test_unknown_planner_inputs_are_refused_not_ignored():
    with pytest.raises(TypeError):
        _vllm(max_num_seq=4)
    with pytest.raises(AnsibleFilterError, match="unexpected keyword argument 'ctx'"):
        llamacpp_plan([L40S], ctx=4096, ctx_size=4096, parallel=4, model="Llama-3.3-70B-Instruct")
