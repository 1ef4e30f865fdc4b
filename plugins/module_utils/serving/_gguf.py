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

The header is read here, with :mod:`struct` over a memory map of the file, and the ``gguf``
package's own tables give every value type and every ggml type's block and byte size. Its
``GGUFReader`` is not used: it walks every item of every array through numpy, and a tokenizer's
vocabulary (``tokenizer.ggml.tokens``, ``.scores``, ``.merges``: 32k to 260k items each) then costs
seconds per file (about 4.5 s for the lab's 32k-token model, once per host and run; upstream:
ggml-org/llama.cpp pull request 10159, closed unmerged). The planner needs the scalars, the short
per-layer arrays and the vocabulary's length only, so an array of more than :data:`SHORT_ARRAY`
items is skipped and kept as its length. The weights are never read.

The header is not trusted: :func:`check_header` reads its fixed part (magic, version, tensor and
key-value counts) with :mod:`struct` first and refuses counts the file's bytes cannot hold, before
the ``gguf`` package walks them; every hyper-parameter must be a positive integer, ``block_count``
at most the tensors the file holds, and every tensor's data must lie inside the file.
"""

from __future__ import annotations

import mmap
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
    """``(byte_order, version, tensor_count, kv_count)`` from the fixed header at ``path``; :class:`GGUFError`
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
    return order, version, n_tensors, n_kv


#: Arrays longer than this are kept as their length only (a tokenizer's vocabulary); the planner
#: reads per-layer arrays (one item per layer) and the vocabulary's length.
SHORT_ARRAY = 4096
#: GGUF's value types (``gguf.GGUFValueType``) that are one fixed-size number, as struct formats.
_SCALAR_FORMATS = {
    "UINT8": "B", "INT8": "b", "UINT16": "H", "INT16": "h", "UINT32": "I", "INT32": "i",
    "FLOAT32": "f", "BOOL": "?", "UINT64": "Q", "INT64": "q", "FLOAT64": "d",
}  # fmt: skip
#: ggml's GGML_MAX_DIMS: a tensor info with more dimensions is corrupt.
MAX_DIMS = 4
#: How deep arrays of arrays may nest (the format allows it; no model needs more than one level).
MAX_ARRAY_DEPTH = 2


class SkippedArray:
    """An array of more than :data:`SHORT_ARRAY` items, kept as its length."""

    def __init__(self, length):
        self.length = length

    def __len__(self):
        return self.length


class Tensor:
    """One tensor info: its name, ggml type's name, dimensions, bytes and absolute data offset."""

    __slots__ = ("name", "type_name", "shape", "n_bytes", "data_offset")

    def __init__(self, name, type_name, shape, n_bytes, data_offset):
        self.name, self.type_name, self.shape = name, type_name, shape
        self.n_bytes, self.data_offset = n_bytes, data_offset


class _Cursor:
    """Reads the header's values in the file's byte order, refusing a read past the file's end."""

    def __init__(self, gguf, buf, order, path):
        self.gguf, self.buf, self.order, self.path = gguf, buf, order, path
        self.pos = 0
        self.scalars = {
            gguf.GGUFValueType[name].value: struct.Struct(order + fmt) for name, fmt in _SCALAR_FORMATS.items()
        }
        self.string_type = gguf.GGUFValueType.STRING.value
        self.array_type = gguf.GGUFValueType.ARRAY.value

    def _need(self, n, what):
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError(
                "%s: %s at byte %d needs %d bytes, beyond the file's %d: the file is truncated or corrupt"
                % (self.path, what, self.pos, n, len(self.buf))
            )

    def unpack(self, fmt, what):
        packer = struct.Struct(self.order + fmt)
        self._need(packer.size, what)
        values = packer.unpack_from(self.buf, self.pos)
        self.pos += packer.size
        return values

    def string(self, what):
        (length,) = self.unpack("Q", what)
        self._need(length, what)
        raw = self.buf[self.pos : self.pos + length]
        self.pos += length
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFError("%s: %s is not UTF-8 (%s)" % (self.path, what, exc)) from exc

    def value(self, vtype, what, depth=0):
        scalar = self.scalars.get(vtype)
        if scalar is not None:
            self._need(scalar.size, what)
            (value,) = scalar.unpack_from(self.buf, self.pos)
            self.pos += scalar.size
            return value
        if vtype == self.string_type:
            return self.string(what)
        if vtype == self.array_type and depth < MAX_ARRAY_DEPTH:
            item_type, count = self.unpack("IQ", what)
            if count > SHORT_ARRAY:
                self._skip(item_type, count, what, depth + 1)
                return SkippedArray(count)
            return [self.value(item_type, what, depth + 1) for _item in range(count)]
        raise GGUFError("%s: %s has value type %d, which GGUF does not define" % (self.path, what, vtype))

    def _skip(self, item_type, count, what, depth):
        scalar = self.scalars.get(item_type)
        if scalar is not None:
            self._need(count * scalar.size, what)
            self.pos += count * scalar.size
            return
        self._need(count * 8, what)  # every string or array item starts with its 8-byte length
        for _item in range(count):
            if item_type == self.string_type:
                (length,) = self.unpack("Q", what)
                self._need(length, what)
                self.pos += length
            else:
                self.value(item_type, what, depth)


def read_header(path):
    """``(fields, tensors)`` of the GGUF file at ``path``: the key-value fields (key: a number, a
    string, a list, or a :class:`SkippedArray`) and the :class:`Tensor` infos, their data offsets
    absolute; :class:`GGUFError` where the header is not one the ``gguf`` package would read."""
    gguf = _import_gguf()
    order, _version, n_tensors, n_kv = check_header(path)
    try:
        handle = open(path, "rb")
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:
        raise GGUFError("%s: cannot read the file (%s)" % (path, exc)) from exc
    with handle, mapped:
        cursor = _Cursor(gguf, mapped, order, path)
        cursor.pos = HEADER_BYTES
        fields = {}
        for index in range(n_kv):
            key = cursor.string("key-value pair %d's key" % index)
            (vtype,) = cursor.unpack("I", "%s's value type" % key)
            fields[key] = cursor.value(vtype, key)
        infos = [_tensor_info(cursor, index) for index in range(n_tensors)]
        start = cursor.pos
    alignment = fields.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0:
        raise GGUFError("%s: general.alignment must be a positive integer, the header holds %r" % (path, alignment))
    start += -start % alignment
    return fields, _tensors(gguf, path, infos, start)


def _tensor_info(cursor, index):
    name = cursor.string("tensor info %d's name" % index)
    (n_dims,) = cursor.unpack("I", "tensor %s's dimension count" % name)
    if n_dims > MAX_DIMS:
        raise GGUFError("%s: tensor %s has %d dimensions; ggml has at most %d" % (cursor.path, name, n_dims, MAX_DIMS))
    dims = cursor.unpack("%dQ" % n_dims, "tensor %s's dimensions" % name)
    raw_type, offset = cursor.unpack("IQ", "tensor %s's type and offset" % name)
    return name, dims, raw_type, offset


def _tensors(gguf, path, infos, start):
    tensors, names = [], set()
    for name, dims, raw_type, offset in infos:
        if name in names:
            raise GGUFError("%s: tensor %s appears twice in the header" % (path, name))
        names.add(name)
        try:
            qtype = gguf.GGMLQuantizationType(raw_type)
            block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError) as exc:
            raise GGUFError(
                "%s: tensor %s has ggml type %d, which this gguf package does not know" % (path, name, raw_type)
            ) from exc
        n_elements = 1
        for dim in dims:
            n_elements *= dim
        tensors.append(Tensor(name, qtype.name, dims, n_elements * type_size // block_size, start + offset))
    return tensors


def _positive(path, key, value, per_layer=False):
    """``value`` as a positive int; a per-layer list (some architectures) plans with its largest."""
    values = value if per_layer and isinstance(value, list) and value else [value]
    for item in values:
        if isinstance(item, bool) or not isinstance(item, int) or item <= 0:
            raise GGUFError("%s: %s must be a positive integer, the header holds %r" % (path, key, value))
    return max(values)


def read_shape(path):
    """The model's shape and tensor bytes from the GGUF file at ``path`` (see the module doc)."""
    fields, tensors = read_header(path)
    try:
        return _shape(path, fields, tensors, os.path.getsize(path))
    except GGUFError:
        raise
    except Exception as exc:  # a field of an unexpected type (a string where a count belongs)
        raise GGUFError("%s: a GGUF header field is malformed (%s: %s)" % (path, type(exc).__name__, exc)) from exc


def _shape(path, fields, tensors, size):
    n_tensors = len(tensors)
    arch = fields.get("general.architecture")
    if not arch or not isinstance(arch, str):
        raise GGUFError("%s: no general.architecture (a string) in the GGUF header" % path)

    def hp(key, default=None):
        return fields.get("%s.%s" % (arch, key), default)

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
        tname = tensor.type_name
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
        vocab = len(fields.get("tokenizer.ggml.tokens", ()))
    name = fields.get("general.name")
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
        "file_type": fields.get("general.file_type"),
    }
