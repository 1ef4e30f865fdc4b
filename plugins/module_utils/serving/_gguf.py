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

The header is not trusted: :func:`check_header` reads its fixed part (magic, version, tensor and
key-value counts) with :mod:`struct` first and refuses counts the file's bytes cannot hold, before
the ``gguf`` package walks them; every hyper-parameter must be a positive integer, ``block_count``
at most the tensors the file holds, and every tensor's data must lie inside the file.
"""

from __future__ import annotations

import os
import re
import struct

_BLK = re.compile(r"^blk\.(\d+)\.")

#: The fixed header: magic ``GGUF``, version (uint32), tensor count and key-value count (uint64).
HEADER_BYTES = 24
#: The versions the ``gguf`` reader reads (version 1 had 32-bit counts).
VERSIONS = (2, 3)
#: The fewest bytes one key-value pair takes: key length (uint64), value type (uint32), 1 value byte.
MIN_KV_BYTES = 8 + 4 + 1
#: The fewest bytes one tensor info takes: name length (uint64), n_dims, ggml type (uint32), offset (uint64).
MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8


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


def check_header(path):
    """``(version, tensor_count, kv_count)`` from the fixed header at ``path``; :class:`GGUFError`
    where the file is shorter than the header, is not GGUF, has a version the reader does not read,
    or claims more tensors and key-value pairs than its bytes can hold."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            head = handle.read(HEADER_BYTES)
    except OSError as exc:
        raise GGUFError("%s: cannot read the file (%s)" % (path, exc)) from exc
    if len(head) < 4 or head[:4] != b"GGUF":
        raise GGUFError("%s: not a GGUF file (the first bytes are %r, not b'GGUF')" % (path, head[:4]))
    if len(head) < HEADER_BYTES:
        raise GGUFError(
            "%s: truncated GGUF header (%d bytes; the fixed header alone is %d): the file is cut short, "
            "copy it again" % (path, len(head), HEADER_BYTES)
        )
    order = "<"
    (version,) = struct.unpack_from("<I", head, 4)
    if version & 0xFFFF == 0:  # written on a big-endian host
        order = ">"
        (version,) = struct.unpack_from(">I", head, 4)
    if version not in VERSIONS:
        raise GGUFError(
            "%s: GGUF version %d; this planner reads versions %s" % (path, version, ", ".join(map(str, VERSIONS)))
        )
    n_tensors, n_kv = struct.unpack_from(order + "QQ", head, 8)
    need = HEADER_BYTES + n_kv * MIN_KV_BYTES + n_tensors * MIN_TENSOR_INFO_BYTES
    if need > size:
        raise GGUFError(
            "%s: the header claims %d tensors and %d key-value pairs, which need at least %d bytes; the file "
            "has %d: it is truncated or corrupt" % (path, n_tensors, n_kv, need, size)
        )
    return version, n_tensors, n_kv


def _field(reader, key, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    return value


def _positive(path, key, value, per_layer=False):
    """``value`` as a positive int; a per-layer list (some architectures) plans with its largest."""
    values = value if per_layer and isinstance(value, list) and value else [value]
    for item in values:
        if isinstance(item, bool) or not isinstance(item, int) or item <= 0:
            raise GGUFError("%s: %s must be a positive integer, the header holds %r" % (path, key, value))
    return max(values)


def read_shape(path):
    """The model's shape and tensor bytes from the GGUF file at ``path`` (see the module doc)."""
    gguf = _import_gguf()
    _version, n_tensors, _n_kv = check_header(path)
    size = os.path.getsize(path)
    try:
        reader = gguf.GGUFReader(path, "r")
        tensors = list(reader.tensors)
    except Exception as exc:  # the gguf package raises what numpy raises on a corrupt header
        raise GGUFError("%s: not a readable GGUF file (%s: %s)" % (path, type(exc).__name__, exc)) from exc
    try:
        return _shape(path, reader, tensors, n_tensors, size)
    except GGUFError:
        raise
    except Exception as exc:  # a field of an unexpected type (a string where a count belongs)
        raise GGUFError("%s: a GGUF header field is malformed (%s: %s)" % (path, type(exc).__name__, exc)) from exc


def _shape(path, reader, tensors, n_tensors, size):
    arch = _field(reader, "general.architecture")
    if not arch or not isinstance(arch, str):
        raise GGUFError("%s: no general.architecture (a string) in the GGUF header" % path)

    def hp(key, default=None):
        return _field(reader, "%s.%s" % (arch, key), default)

    for key in ("block_count", "embedding_length", "attention.head_count"):
        if hp(key) is None:
            raise GGUFError(
                "%s: the header lacks %s.block_count, .embedding_length or .attention.head_count" % (path, arch)
            )
    n_layers = _positive(path, arch + ".block_count", hp("block_count"))
    if n_layers > n_tensors:
        raise GGUFError(
            "%s: %s.block_count %d exceeds the %d tensors the file holds (every layer has tensors): "
            "the header is corrupt" % (path, arch, n_layers, n_tensors)
        )
    n_embd = _positive(path, arch + ".embedding_length", hp("embedding_length"))
    n_head = _positive(path, arch + ".attention.head_count", hp("attention.head_count"), per_layer=True)
    n_head_kv = _positive(
        path, arch + ".attention.head_count_kv", hp("attention.head_count_kv", n_head), per_layer=True
    )
    head_dim_k = _positive(path, arch + ".attention.key_length", hp("attention.key_length", n_embd // n_head or 1))
    head_dim_v = _positive(path, arch + ".attention.value_length", hp("attention.value_length", n_embd // n_head or 1))
    n_ff = _positive(path, arch + ".feed_forward_length", hp("feed_forward_length", 4 * n_embd), per_layer=True)
    n_ctx_train = hp("context_length", 0) or 0
    if isinstance(n_ctx_train, bool) or not isinstance(n_ctx_train, int) or n_ctx_train < 0:
        raise GGUFError("%s: %s.context_length must be a non-negative integer, not %r" % (path, arch, n_ctx_train))

    layer_bytes = [0] * n_layers
    input_bytes = output_bytes = other_bytes = 0
    vocab = None
    types = {}
    for tensor in tensors:
        nbytes = int(tensor.n_bytes)
        end = int(tensor.data_offset) + nbytes
        if nbytes < 0 or end > size:
            raise GGUFError(
                "%s: tensor %s's data (%d bytes) ends at byte %d, beyond the file's %d: the file is truncated"
                % (path, tensor.name, nbytes, end, size)
            )
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
    name = _field(reader, "general.name")
    return {
        "name": name if isinstance(name, str) and name else str(path).rsplit("/", 1)[-1],
        "architecture": arch,
        "source": "gguf",
        "n_layers": n_layers,
        "n_embd": n_embd,
        "n_head": n_head,
        "n_head_kv": n_head_kv,
        "head_dim_k": head_dim_k,
        "head_dim_v": head_dim_v,
        "n_ff": n_ff,
        "vocab_size": int(vocab),
        "n_ctx_train": n_ctx_train,
        "layer_bytes": layer_bytes,
        "input_bytes": input_bytes,
        "output_bytes": output_bytes + other_bytes,
        "tied_output": not any(t.name == "output.weight" for t in tensors),
        "tensor_types": types,
        "file_type": _field(reader, "general.file_type"),
    }
