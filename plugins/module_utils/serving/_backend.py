# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which server a node runs: vLLM or llama.cpp (``gpufleet_serving_backend``). Plain Python.

``auto`` picks vLLM where its plan fits with tensor parallelism over identical GPUs, and llama.cpp
where the GPUs differ in size (tensor parallelism splits every layer evenly, so the smallest GPU
bounds all of them: an RTX A6000 + RTX 4090 node), where the model is a GGUF file (vLLM's GGUF
support is experimental and single-file only), or where only a layer-offload plan fits (vLLM's
plan refused, llama.cpp's not). Where neither plan fits the node stays on vLLM, whose preflight
refuses with the planner's numbers. The plans are the serving roles' own, each made once per host
and run from the role's own settings by its ``tasks_from: plan`` (:func:`vllm_plan`:
``_vllm.serve_config``, the ``_kvplan`` planner of ``vllm_memory_plan``; :func:`llamacpp_plan`:
``_llamaplan.plan`` of ``llamacpp_memory_plan``); the roles' preflights write from the same plans,
and the rule judges a plan only where it needs it. The choice, its reason (with the
numbers that decided) and the plans' verdicts go to the run's output and to the NCCL gate's marker
JSON; the node's boot validation reuses the recorded verdicts (it cannot plan: the GGUF file and
the planner settings stay on the controller).
"""

from __future__ import annotations

import os

from ansible_collections.gpufleet.node.plugins.module_utils.serving import _kvplan, _llamaplan, _vllm

BACKENDS = ("auto", "vllm", "llamacpp")


class BackendError(ValueError):
    """An unknown backend name or GPU list; the message names it."""


def vllm_plan(model, gpu, gpu_count, **kwargs):
    """Role vllm_server's plan of this host (its ``tasks_from: plan``): ``{'serve': ..., 'error': ...}``.

    ``serve``: :func:`_vllm.serve_config`'s result (``config``, ``plan``, ...) for the role's own
    inputs, the one the role writes ``config.yaml`` from; None where there is nothing to plan (no
    model, GPU name or count: the role's preflight names them) or where the planner refuses, and
    then ``error`` says why (the preflight fails with it). Nothing is raised for a refusal: the
    backend choice plans every host, and only the role that serves refuses."""
    if not model or not gpu or not gpu_count:
        return {"serve": None, "error": None}
    try:
        return {"serve": _vllm.serve_config(model, gpu, gpu_count, **kwargs), "error": None}
    except (_vllm.ServingError, _kvplan.PlanError, ValueError) as exc:
        return {"serve": None, "error": str(exc)}


def vllm_verdict(planned):
    """``{'fits': bool, 'numbers': str}`` of a :func:`vllm_plan`, or None where it could not be
    planned (the role's preflight says why)."""
    plan = ((planned or {}).get("serve") or {}).get("plan")
    if plan is None:
        return None
    if plan["fits"]:
        numbers = "tensor_parallel_size %d, max_model_len %d, %d KV tokens, max concurrency %sx" % (
            plan["tensor_parallel_size"],
            plan["max_model_len"],
            plan["kv_capacity_tokens"],
            plan["max_concurrency"],
        )
    else:
        numbers = "tensor_parallel_size %d: %s" % (plan["tensor_parallel_size"], "; ".join(plan["reasons"]))
    return {"fits": bool(plan["fits"]), "numbers": numbers}


def llamacpp_plan(gpu_memory_mib, ctx_size, parallel, cache_type="f16", flash_attn=False, ubatch_size=512, **kwargs):
    """Role llamacpp_server's layer-offload plan of this host (its ``tasks_from: plan``), made by
    ``llamacpp_memory_plan``'s planner on the controller: ``{'plan': ..., 'error': ..., 'here': bool}``.

    ``plan``: the planner's result with the ``server_args`` it decides, or None. ``error``: why the
    planner refused (the role's preflight fails with it). ``here``: False where nothing can be planned
    on this host (no ``model_path`` nor ``model`` configured, or the file is not on the controller):
    the backend choice then has no llama.cpp plan. Nothing is raised: the choice plans every host.
    ``ctx_size`` to ``ubatch_size`` also decide llama-server's command line; ``kwargs``: the model
    (``model_path``, or ``model`` and ``quant``), ``n_gpu_layers`` and the reserves, where set."""
    line = {"ctx_size": ctx_size, "parallel": parallel, "cache_type": cache_type}
    line.update(flash_attn=flash_attn, ubatch_size=ubatch_size)
    kwargs = {k: v for k, v in kwargs.items() if v not in (None, "")}
    if not kwargs.get("model_path") and not kwargs.get("model"):
        return {"plan": None, "error": None, "here": False}
    if kwargs.get("model_path"):
        kwargs.pop("model", None)
        kwargs.pop("quant", None)
    try:
        result = _llamaplan.plan(gpu_memory_mib, **dict(kwargs, **line))
    except _llamaplan.PlanError as exc:
        here = not kwargs.get("model_path") or os.path.exists(kwargs["model_path"])
        return {"plan": None, "error": str(exc), "here": here}
    except OSError as exc:
        return {"plan": None, "error": "model_path: %s" % exc, "here": False}
    return {"plan": dict(result, server_args=_llamaplan.server_args(result, **line)), "error": None, "here": True}


def llamacpp_verdict(planned):
    """``{'fits': bool, 'numbers': str}`` of a :func:`llamacpp_plan`, or None where the host has no
    llama.cpp plan (none configured, or the file is not on this host: the role's preflight says
    why). A file that is here but is no GGUF model the planner reads, or inputs the planner refuses,
    raise :class:`BackendError` naming them."""
    planned = planned or {}
    if not planned.get("here"):
        return None
    if planned.get("error"):
        raise BackendError("gpufleet_serving_backend auto, llama.cpp's plan: %s" % planned["error"])
    plan = planned["plan"]
    numbers = plan["message"].split(": ", 1)[-1]
    if not plan["fits"]:
        numbers += ": " + "; ".join(plan["reasons"])
    return {"fits": bool(plan["fits"]), "numbers": numbers}


def choose(requested, gpu_memory_mib, model="", plans=None):
    """``{'backend': 'vllm'|'llamacpp', 'requested': ..., 'reason': ..., 'plans': {...}}``.

    ``gpu_memory_mib``: each GPU's memory (nvidia-smi ``memory.total``); ``model``: the model a host
    serves (a name or path; ``.gguf`` means GGUF). ``plans``: the verdicts ``{'vllm': v,
    'llamacpp': v}`` (each ``{'fits', 'numbers'}`` or None: not planned), or a callable
    ``plans()`` returning them, called only where the rule needs them (auto, identical
    GPUs, not GGUF); ``plans`` is in the result only then."""
    requested = (requested or "auto").strip().lower()
    if requested not in BACKENDS:
        raise BackendError("gpufleet_serving_backend: %r is not one of %s" % (requested, ", ".join(BACKENDS)))
    sizes = [int(m) for m in gpu_memory_mib or []]
    out = {"requested": requested}
    if requested != "auto":
        return dict(out, backend=requested, reason="set by gpufleet_serving_backend")
    if not sizes:
        raise BackendError("gpufleet_serving_backend auto: no GPUs in the topology facts to choose by")
    if str(model or "").lower().endswith(".gguf"):
        return dict(out, backend="llamacpp", reason="the model is a GGUF file (%s)" % str(model).rsplit("/", 1)[-1])
    if len(set(sizes)) > 1:
        reason = (
            "the GPUs differ in size (%s MiB): tensor parallelism would be bound by the smallest; layer offload splits by size"
            % ", ".join(str(s) for s in sizes)
        )
        return dict(out, backend="llamacpp", reason=reason)
    gpus = "%d identical GPUs (%d MiB)" % (len(sizes), sizes[0]) if len(sizes) > 1 else "1 GPU (%d MiB)" % sizes[0]
    verdicts = plans() if callable(plans) else dict(plans or {})
    vllm, llamacpp = verdicts.get("vllm"), verdicts.get("llamacpp")
    out["plans"] = {"vllm": vllm, "llamacpp": llamacpp}
    if vllm is None:
        return dict(out, backend="vllm", reason="%s: vLLM with tensor parallelism" % gpus)
    if vllm["fits"]:
        return dict(out, backend="vllm", reason="%s: vLLM's tensor-parallel plan fits (%s)" % (gpus, vllm["numbers"]))
    not_fit = "%s: vLLM's tensor-parallel plan does not fit (%s)" % (gpus, vllm["numbers"])
    if llamacpp is None:
        reason = "%s and no llama.cpp plan (no llama.cpp model configured): vLLM refuses with its plan" % not_fit
        return dict(out, backend="vllm", reason=reason)
    if llamacpp["fits"]:
        reason = "%s; llama.cpp's layer-offload plan fits (%s)" % (not_fit, llamacpp["numbers"])
        return dict(out, backend="llamacpp", reason=reason)
    reason = "%s, nor does llama.cpp's layer-offload plan (%s): vLLM refuses with its plan" % (
        not_fit,
        llamacpp["numbers"],
    )
    return dict(out, backend="vllm", reason=reason)


def choose_planned(requested, gpu_memory_mib, model="", vllm=None, llamacpp=None, recorded=None):
    """:func:`choose` over the serving roles' own plans of this host: ``vllm`` a :func:`vllm_plan`,
    ``llamacpp`` a :func:`llamacpp_plan` (judged only where vLLM's plan does not fit).
    ``recorded``: verdicts an earlier run recorded (``{'vllm': ..., 'llamacpp': ...}``), used
    instead of the plans (the node's boot validation, which cannot plan)."""

    def plans():
        if recorded is not None:
            return dict(recorded)
        v = vllm_verdict(vllm)
        lc = llamacpp_verdict(llamacpp) if v is not None and not v["fits"] else None
        return {"vllm": v, "llamacpp": lc}

    return choose(requested, gpu_memory_mib, model=model, plans=plans)
