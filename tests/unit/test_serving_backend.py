# SPDX-License-Identifier: GPL-3.0-or-later
"""The backend choice (``gpufleet_serving_backend``, plugins/module_utils/serving/_backend.py): the rule, the
plans it consults under ``auto`` (the planners' own verdicts, computed only where the rule needs
them), and the planner inputs of playbooks/tasks/serving_backend.yml against the roles' defaults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.filter.serving_backend import serving_backend
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
LLAMA_70B = {"model": "Llama-3.3-70B-Instruct", "gpu_memory_mib": [L40S], "ctx_size": 4096, "parallel": 4}


def test_the_planners_decide_one_l40s_serves_a_70b_with_llamacpp():
    """The filter, with the planners of vllm_memory_plan and llamacpp_memory_plan: a 70B model's
    FP8 weights alone exceed one L40S (vLLM refused), a Q4_K_M layer-offload plan keeps 74 of its
    80 layers on the GPU."""
    choice = serving_backend("auto", [L40S], "Llama-3.3-70B-Instruct-FP8", vllm=VLLM_ONE_L40S, llamacpp=LLAMA_70B)
    assert choice["backend"] == "llamacpp"
    assert choice["plans"]["vllm"]["fits"] is False and choice["plans"]["llamacpp"]["fits"] is True
    assert "67.67 GiB of weights per GPU" in choice["reason"]
    assert "74 of 80 layers" in choice["reason"]


def test_the_planners_decide_four_l40s_serve_it_with_vllm_and_llamacpp_is_not_planned():
    vllm = dict(VLLM_ONE_L40S, gpu_count=4)
    choice = serving_backend("auto", [L40S] * 4, "Llama-3.3-70B-Instruct-FP8", vllm=vllm, llamacpp=LLAMA_70B)
    assert choice["backend"] == "vllm"
    assert "tensor_parallel_size 4, max_model_len 16384" in choice["reason"]
    assert choice["plans"] == {"vllm": choice["plans"]["vllm"], "llamacpp": None}


def test_neither_planner_fits_stays_on_vllm_and_no_model_is_not_a_plan():
    all_layers = dict(LLAMA_70B, n_gpu_layers=81)
    choice = serving_backend("auto", [L40S], "x", vllm=VLLM_ONE_L40S, llamacpp=all_layers)
    assert choice["backend"] == "vllm" and "at most 74 layers fit" in choice["reason"]
    for no_model in ({"model": "", "model_path": ""}, {"model_path": "/nonexistent/m.gguf"}):
        choice = serving_backend("auto", [L40S], "x", vllm=VLLM_ONE_L40S, llamacpp=dict(LLAMA_70B, **no_model))
        assert choice["backend"] == "vllm" and choice["plans"]["llamacpp"] is None
    # an unknown profile is not planned here: the role's preflight refuses it with its own message
    assert serving_backend("auto", [L40S], "x", vllm=dict(VLLM_ONE_L40S, gpu="GTX 480"))["plans"]["vllm"] is None


def test_recorded_verdicts_replace_planning():
    """The node's boot validation: the verdicts site.yml recorded, not a plan made again."""
    recorded = {"vllm": NO_FIT, "llamacpp": LC_FITS}
    choice = serving_backend("auto", [L40S], "x", vllm=dict(VLLM_ONE_L40S, gpu_count=4), recorded=recorded)
    assert choice["backend"] == "llamacpp" and choice["plans"] == recorded


def _role_defaults(role):
    return yaml.safe_load((REPO / "roles" / role / "defaults/main.yml").read_text())


def test_task_file_defaults_are_the_roles_defaults():
    """playbooks/tasks/serving_backend.yml runs before the serving roles are included, so it names
    their defaults itself; each literal one must be the role's."""
    text = (REPO / "playbooks/tasks/serving_backend.yml").read_text()
    defaults = dict(_role_defaults("vllm_server"), **_role_defaults("llamacpp_server"))
    found = re.findall(r"\b((?:vllm|llamacpp)_server_\w+) \| default\(([^()]*)\)", text)
    assert len(found) >= 15
    for name, literal in found:
        if not literal or literal.startswith("__"):
            continue  # derived from the topology facts, as the role's default is
        assert name in defaults, name
        assert yaml.safe_load(literal.replace("none", "null")) == defaults[name], name


def test_unknown_planner_inputs_are_refused_not_ignored():
    with pytest.raises(AnsibleFilterError, match="unknown inputs max_num_seq"):
        serving_backend("auto", [L40S], "x", vllm=dict(VLLM_ONE_L40S, max_num_seq=4))
    with pytest.raises(TypeError):
        serving_backend("auto", [L40S], "x", vllm=VLLM_ONE_L40S, llamacpp=dict(LLAMA_70B, ctx=4096))
