# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""A GGUF model's shape, read from the file's own header with the ``gguf`` package (PyPI).

Plain Python, no Ansible. :func:`read_shape` returns what the layer-offload planner
(:mod:`_llamaplan`) needs: the architecture's hyper-parameters (``<arch>.block_count``,
``.embedding_length``, ``.feed_forward_length``, ``.attention.head_count``, ``.head_count_kv``,
``.key_length``, ``.value_length``, ``.context_length``) and the exact bytes of every tensor, grouped
the way llama.cpp places them (``src/llama-model.cpp`` ``load_tensors``): the repeating layers
``blk.N.*`` (one entry per layer), the input layer (``token_embd.*``, always kept on the CPU) and the
output layer (``output.*``, ``output_norm.*``, offloaded only when ``--n-gpu-layers`` exceeds the
repeating layers). Quantized tensors are exact: the reader gives each tensor's byte size from its
ggml type's block size.

``gguf.GGUFReader`` memory-maps the file and reads the header only; the weights are never loaded.
"""

from __future__ import annotations

import re

_BLK = re.compile(r"^blk\.(\d+)\.")


class GGUFError(ValueError):
    """The file is not a GGUF model this planner can read (the message says why)."""


def _import_gguf():
    try:
        import gguf
    except ImportError as exc:
        raise GGUFError(
            "reading a GGUF header needs the Python package 'gguf' (pip install gguf) on the host that plans; "
            "or pass 'model' (a profile name or the model's fields) instead of 'model_path'"
        ) from exc
    return gguf


def _field(reader, key, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    return value


def read_shape(path):
    """The model's shape and tensor bytes from the GGUF file at ``path`` (see the module doc)."""
    gguf = _import_gguf()
    try:
        reader = gguf.GGUFReader(path, "r")
    except (OSError, ValueError) as exc:
        raise GGUFError("%s: not a readable GGUF file (%s)" % (path, exc)) from exc
    arch = _field(reader, "general.architecture")
    if not arch:
        raise GGUFError("%s: no general.architecture in the GGUF header" % path)

    def hp(key, default=None):
        return _field(reader, "%s.%s" % (arch, key), default)

    n_layers = hp("block_count")
    n_embd = hp("embedding_length")
    n_head = hp("attention.head_count")
    if n_layers is None or n_embd is None or n_head is None:
        raise GGUFError(
            "%s: the header lacks %s.block_count, .embedding_length or .attention.head_count" % (path, arch)
        )
    if isinstance(n_head, list):  # per-layer head counts (some architectures): plan with the largest
        n_head = max(n_head)
    n_head_kv = hp("attention.head_count_kv", n_head)
    if isinstance(n_head_kv, list):
        n_head_kv = max(n_head_kv)
    head_dim_k = hp("attention.key_length", n_embd // n_head)
    head_dim_v = hp("attention.value_length", n_embd // n_head)
    n_ff = hp("feed_forward_length", 4 * n_embd)
    if isinstance(n_ff, list):
        n_ff = max(n_ff)

    layer_bytes = [0] * int(n_layers)
    input_bytes = output_bytes = other_bytes = 0
    vocab = None
    types = {}
    for tensor in reader.tensors:
        nbytes = int(tensor.n_bytes)
        tname = tensor.tensor_type.name
        types[tname] = types.get(tname, 0) + nbytes
        match = _BLK.match(tensor.name)
        if match:
            index = int(match.group(1))
            if index >= n_layers:
                raise GGUFError("%s: tensor %s beyond block_count %d" % (path, tensor.name, n_layers))
            layer_bytes[index] += nbytes
        elif tensor.name.startswith("token_embd."):
            input_bytes += nbytes
            if tensor.name == "token_embd.weight":
                vocab = int(max(tensor.shape))
        elif tensor.name.startswith(("output.", "output_norm.")):
            output_bytes += nbytes
        else:  # rope_freqs and the like: small, placed with the output here
            other_bytes += nbytes
    if vocab is None:
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        vocab = len(tokens.data) if tokens is not None else 0
    return {
        "name": _field(reader, "general.name") or str(path).rsplit("/", 1)[-1],
        "architecture": arch,
        "source": "gguf",
        "n_layers": int(n_layers),
        "n_embd": int(n_embd),
        "n_head": int(n_head),
        "n_head_kv": int(n_head_kv),
        "head_dim_k": int(head_dim_k),
        "head_dim_v": int(head_dim_v),
        "n_ff": int(n_ff),
        "vocab_size": int(vocab),
        "n_ctx_train": int(hp("context_length", 0) or 0),
        "layer_bytes": layer_bytes,
        "input_bytes": input_bytes,
        "output_bytes": output_bytes + other_bytes,
        "tied_output": not any(t.name == "output.weight" for t in reader.tensors),
        "tensor_types": types,
        "file_type": _field(reader, "general.file_type"),
    }
