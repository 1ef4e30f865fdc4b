# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which server a node runs: vLLM or llama.cpp (``gpufleet_serving_backend``). Plain Python.

``auto`` picks vLLM where its plan fits with tensor parallelism over identical GPUs, and llama.cpp
where the GPUs differ in size (tensor parallelism splits every layer evenly, so the smallest GPU
bounds all of them: seed 001's A6000 + 4090 node), where the model is a GGUF file (vLLM's GGUF
support is experimental and single-file only), or where only a layer-offload plan fits (vLLM's
plan refused, llama.cpp's not). The choice and its reason go to the run's output and to the
NCCL gate's marker JSON.
"""

from __future__ import annotations

BACKENDS = ("auto", "vllm", "llamacpp")


class BackendError(ValueError):
    """An unknown backend name or GPU list; the message names it."""


def choose(requested, gpu_memory_mib, model="", vllm_fits=None, llamacpp_fits=None):
    """``{'backend': 'vllm'|'llamacpp', 'requested': ..., 'reason': ...}``.

    ``gpu_memory_mib``: each GPU's memory (nvidia-smi ``memory.total``); ``model``: the model a host
    serves (a name or path; ``.gguf`` means GGUF); ``vllm_fits`` / ``llamacpp_fits``: the plans'
    verdicts when known (None: not planned yet)."""
    requested = (requested or "auto").strip().lower()
    if requested not in BACKENDS:
        raise BackendError("gpufleet_serving_backend: %r is not one of %s" % (requested, ", ".join(BACKENDS)))
    sizes = [int(m) for m in gpu_memory_mib or []]
    if requested != "auto":
        return {"backend": requested, "requested": requested, "reason": "set by gpufleet_serving_backend"}
    if not sizes:
        raise BackendError("gpufleet_serving_backend auto: no GPUs in the topology facts to choose by")
    if str(model or "").lower().endswith(".gguf"):
        reason = "the model is a GGUF file (%s)" % str(model).rsplit("/", 1)[-1]
        return {"backend": "llamacpp", "requested": requested, "reason": reason}
    if len(set(sizes)) > 1:
        reason = (
            "the GPUs differ in size (%s MiB): tensor parallelism would be bound by the smallest; layer offload splits by size"
            % ", ".join(str(s) for s in sizes)
        )
        return {"backend": "llamacpp", "requested": requested, "reason": reason}
    if vllm_fits is False and llamacpp_fits is not False:
        reason = "vLLM's tensor-parallel plan does not fit; only a layer-offload plan does"
        return {"backend": "llamacpp", "requested": requested, "reason": reason}
    reason = "%d identical GPUs (%d MiB): vLLM with tensor parallelism%s" % (
        len(sizes),
        sizes[0],
        "" if vllm_fits is None else " (its plan fits)",
    )
    return {"backend": "vllm", "requested": requested, "reason": reason}
