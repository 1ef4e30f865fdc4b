# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which server a node runs: vLLM or llama.cpp (``gpufleet_serving_backend``). Plain Python.

``auto`` picks vLLM where its plan fits with tensor parallelism over identical GPUs, and llama.cpp
where the GPUs differ in size (tensor parallelism splits every layer evenly, so the smallest GPU
bounds all of them: an RTX A6000 + RTX 4090 node), where the model is a GGUF file (vLLM's GGUF
support is experimental and single-file only), or where only a layer-offload plan fits (vLLM's
plan refused, llama.cpp's not). Where neither plan fits the node stays on vLLM, whose preflight
refuses with the planner's numbers. The plans are the planners' own (``_vllm.serve_config``, the
``_kvplan`` planner of ``vllm_memory_plan``; ``_llamaplan.plan`` of ``llamacpp_memory_plan``),
computed on the controller only where the rule needs them. The choice, its reason (with the
numbers that decided) and the plans' verdicts go to the run's output and to the NCCL gate's marker
JSON; the node's boot validation reuses the recorded verdicts (it cannot plan: the GGUF file and
the planner settings stay on the controller).
"""

from __future__ import annotations

import os

from ansible_collections.gpufleet.node.plugins.module_utils.serving import _kvplan, _llamaplan, _vllm

BACKENDS = ("auto", "vllm", "llamacpp")

#: The serve_config() arguments a vLLM plan takes (the vllm_server role's inputs of the same names).
VLLM_ARGS = (
    "overrides",
    "expected_request_len",
    "gpu_memory_mib",
    "oversubscription_factor",
    "reserves",
)


class BackendError(ValueError):
    """An unknown backend name or GPU list; the message names it."""


def vllm_verdict(model, gpu, gpu_count, **kwargs):
    """``{'fits': bool, 'numbers': str}`` of vLLM's plan on this host, or None where it cannot be
    planned here (no model, an unknown profile or setting: the role's preflight says why)."""
    if not model or not gpu or not gpu_count:
        return None
    unknown = sorted(set(kwargs) - set(VLLM_ARGS))
    if unknown:
        raise BackendError("vLLM plan: unknown inputs %s; known: %s" % (", ".join(unknown), ", ".join(VLLM_ARGS)))
    try:
        plan = _vllm.serve_config(model, gpu, gpu_count, **kwargs)["plan"]
    except (_vllm.ServingError, _kvplan.PlanError, ValueError):
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


def llamacpp_verdict(**kwargs):
    """``{'fits': bool, 'numbers': str}`` of llama.cpp's layer-offload plan, or None where the host
    has no llama.cpp model configured (``model_path`` nor ``model``) or the plan cannot be made
    here (the file is not on this host: the role's preflight says why). A file that is here but is
    no GGUF model the planner reads, or inputs the planner refuses, raise :class:`BackendError`
    naming them."""
    kwargs = {k: v for k, v in kwargs.items() if v not in (None, "")}
    if not kwargs.get("model_path") and not kwargs.get("model"):
        return None
    if kwargs.get("model_path"):
        kwargs.pop("model", None)
        kwargs.pop("quant", None)
    try:
        plan = _llamaplan.plan(**kwargs)
    except _llamaplan.PlanError as exc:
        if kwargs.get("model_path") and not os.path.exists(kwargs["model_path"]):
            return None
        raise BackendError("gpufleet_serving_backend auto, llama.cpp's plan: %s" % exc) from exc
    except OSError:
        return None
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
    """:func:`choose` with the plans made here, only where the rule needs them: ``vllm`` holds
    :func:`vllm_verdict`'s arguments (``model``, ``gpu``, ``gpu_count`` and :data:`VLLM_ARGS`),
    ``llamacpp`` those of :func:`llamacpp_verdict` (planned only where vLLM's plan does not fit).
    ``recorded``: verdicts an earlier run recorded (``{'vllm': ..., 'llamacpp': ...}``), used
    instead of planning (the node's boot validation)."""

    def plans():
        if recorded is not None:
            return dict(recorded)
        v = vllm_verdict(**dict(vllm or {}))
        lc = llamacpp_verdict(**dict(llamacpp or {})) if v is not None and not v["fits"] else None
        return {"vllm": v, "llamacpp": lc}

    return choose(requested, gpu_memory_mib, model=model, plans=plans)
