# SPDX-License-Identifier: GPL-3.0-or-later
"""The llama.cpp planner refuses inputs it cannot trust: GGUF headers whose counts the file cannot
hold, truncated or non-GGUF files, counts that are not positive integers, non-finite splits and
caller-supplied shapes with negative sizes. One test per class; each bad file is written with the
``gguf`` package (``GGUFWriter``) and then edited byte by byte where the writer would not write it."""

from __future__ import annotations

import struct

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.filter.serving_backend import llamacpp_plan, serving_backend, vllm_plan
from ansible_collections.gpufleet.node.plugins.module_utils.serving import _llamaplan as lp

gguf = pytest.importorskip("gguf")

GPU = [24564]
L40S = 46068
#: The vLLM inputs under which one L40S does not fit a 70B model, so ``auto`` plans llama.cpp too.
VLLM_NO_FIT = vllm_plan("Llama-3.3-70B-Instruct-FP8", "NVIDIA L40S", 1)


def write_gguf(path, block_count=2, head_count=4, n_tensor_layers=2, extra=None, data=True):
    """A small llama GGUF: ``n_tensor_layers`` layers of two 64x64 F32 tensors, written in full."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    if block_count >= 2**32:
        writer.add_uint64("llama.block_count", block_count)
    elif block_count >= 0:
        writer.add_block_count(block_count)
    else:
        writer.add_int32("llama.block_count", block_count)
    writer.add_context_length(8192)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    if isinstance(head_count, str):
        writer.add_string("llama.attention.head_count", head_count)
    else:
        writer.add_uint32("llama.attention.head_count", head_count)
    writer.add_head_count_kv(4)
    for key, value in (extra or {}).items():
        writer.add_uint32(key, value)
    np = pytest.importorskip("numpy")
    writer.add_tensor("token_embd.weight", np.zeros((32, 64), dtype=np.float32))
    for i in range(n_tensor_layers):
        writer.add_tensor("blk.%d.attn_q.weight" % i, np.zeros((64, 64), dtype=np.float32))
        writer.add_tensor("blk.%d.ffn_up.weight" % i, np.zeros((64, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _refused(path, match):
    with pytest.raises(lp.PlanError, match=match) as info:
        lp.plan(GPU, model_path=str(path))
    assert str(path) in str(info.value)
    return info


def test_gguf_valid_small_file_is_planned(tmp_path):
    """The control: the same writer's well-formed file plans, so the refusals below are the edits'."""
    result = lp.plan(GPU, model_path=str(write_gguf(tmp_path / "ok.gguf")))
    assert result["n_layers"] == 2 and result["fits"] is True
    assert result["shape"]["n_head"] == 4


@pytest.mark.parametrize("block_count", [100_000, 2**40])
def test_gguf_layer_count_beyond_file_size_is_refused(tmp_path, block_count):
    path = write_gguf(tmp_path / "many.gguf", block_count=block_count)
    _refused(path, r"block_count %d exceeds the \d+ tensors the file holds" % block_count)


@pytest.mark.parametrize("cut", [0, 3, 20])
def test_gguf_truncated_header_is_refused(tmp_path, cut):
    whole = write_gguf(tmp_path / "whole.gguf").read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(whole[:cut])
    _refused(path, "not a GGUF file|truncated GGUF header")


def test_gguf_magic_only_file_is_refused(tmp_path):
    path = tmp_path / "magic.gguf"
    path.write_bytes(b"GGUF")
    _refused(path, r"truncated GGUF header \(4 bytes")


@pytest.mark.parametrize("offset,what", [(8, "tensors"), (16, "key-value pairs")])
@pytest.mark.parametrize("count", [2**60, 2**64 - 1, 10_000])
def test_gguf_header_count_beyond_file_size_is_refused(tmp_path, offset, what, count):
    data = bytearray(write_gguf(tmp_path / "ok.gguf").read_bytes())
    struct.pack_into("<Q", data, offset, count)
    path = tmp_path / "counts.gguf"
    path.write_bytes(bytes(data))
    info = _refused(path, "which need at least \\d+ bytes; the file has %d" % len(data))
    assert str(count) in str(info.value)


def test_gguf_truncated_tensor_data_is_refused(tmp_path):
    whole = write_gguf(tmp_path / "whole.gguf").read_bytes()
    path = tmp_path / "short.gguf"
    path.write_bytes(whole[: len(whole) - 1000])
    _refused(path, "beyond the file's|not a readable GGUF file")


@pytest.mark.parametrize("head_count", [0, "sixty-four"])
def test_gguf_zero_or_string_head_count_is_refused(tmp_path, head_count):
    path = write_gguf(tmp_path / "heads.gguf", head_count=head_count)
    _refused(path, r"llama\.attention\.head_count must be a positive integer, the header holds %r" % (head_count,))


@pytest.mark.parametrize("key", ["llama.attention.key_length", "llama.feed_forward_length"])
def test_gguf_zero_dimension_is_refused(tmp_path, key):
    path = write_gguf(tmp_path / "dims.gguf", extra={key: 0})
    _refused(path, r"%s must be a positive integer" % key.replace(".", r"\."))


@pytest.mark.parametrize("block_count", [-4, 0])
def test_gguf_negative_or_zero_block_count_is_refused(tmp_path, block_count):
    path = write_gguf(tmp_path / "neg.gguf", block_count=block_count)
    _refused(path, r"llama\.block_count must be a positive integer, the header holds %d" % block_count)


@pytest.mark.parametrize("split", [[float("nan"), 1], [float("inf"), 1], [-1, 2], ["x", 1], [True, 1], [0, 0]])
def test_plan_non_finite_tensor_split_is_refused(split):
    with pytest.raises(lp.PlanError, match="tensor_split: one finite, non-negative proportion per GPU"):
        lp.plan([24564, 24564], model="Llama-3.1-8B-Instruct", tensor_split=split)


def _shape(**change):
    shape = lp.shape_from_config(lp.MODEL_PROFILES["Llama-3.1-8B-Instruct"], "Q4_K_M", name="m")
    shape.update(change)
    return shape


@pytest.mark.parametrize(
    "change,match",
    [
        ({"layer_bytes": [-(2**40)] * 32}, r"layer_bytes\[0\]: must be an integer >= 0"),
        ({"layer_bytes": [1] * 3}, "layer_bytes: one size per layer \\(32\\)"),
        ({"input_bytes": -1}, "input_bytes: must be an integer >= 0"),
        ({"output_bytes": float("nan")}, "output_bytes: must be an integer >= 0"),
        ({"n_head_kv": 0}, "n_head_kv: must be an integer >= 1"),
        ({"n_layers": -4}, "n_layers: must be an integer >= 1"),
        ({"n_layers": 100_000, "layer_bytes": [1] * 100_000}, "n_layers: 100000 exceeds 512"),
    ],
)
def test_plan_caller_shape_with_invalid_sizes_is_refused(change, match):
    with pytest.raises(lp.PlanError, match=match):
        lp.plan(GPU, model=_shape(**change))


@pytest.mark.parametrize(
    "fields,match",
    [
        ({"num_hidden_layers": -4}, "num_hidden_layers: must be an integer >= 1"),
        ({"num_attention_heads": 0}, "num_attention_heads: must be an integer >= 1"),
        ({"num_attention_heads": "many"}, "num_attention_heads: must be an integer >= 1"),
        ({"hidden_size": float("nan")}, "hidden_size: must be an integer >= 1"),
        ({"num_hidden_layers": 100_000}, "num_hidden_layers: 100000 exceeds 512"),
    ],
)
def test_plan_model_fields_not_positive_integers_are_refused(fields, match):
    with pytest.raises(lp.PlanError, match=match):
        lp.plan(GPU, model=dict({"profile": "Llama-3.1-8B-Instruct"}, **fields))


def test_plan_more_gpus_than_llamacpp_splits_over_is_refused():
    with pytest.raises(lp.PlanError, match="17 GPUs; llama.cpp splits over at most 16"):
        lp.plan([24564] * 17, model="Llama-3.1-8B-Instruct")


def test_serving_backend_bad_gguf_is_a_filter_error_naming_the_file(tmp_path):
    path = tmp_path / "magic.gguf"
    path.write_bytes(b"GGUF")
    llamacpp = llamacpp_plan([L40S], ctx_size=4096, parallel=1, model_path=str(path))
    with pytest.raises(AnsibleFilterError, match="truncated GGUF header") as info:
        serving_backend("auto", [L40S], "x", vllm=VLLM_NO_FIT, llamacpp=llamacpp)
    assert str(path) in str(info.value)


def test_serving_backend_gguf_absent_on_the_controller_is_not_planned(tmp_path):
    llamacpp = llamacpp_plan([L40S], ctx_size=4096, parallel=1, model_path=str(tmp_path / "elsewhere.gguf"))
    assert llamacpp["here"] is False
    choice = serving_backend("auto", [L40S], "x", vllm=VLLM_NO_FIT, llamacpp=llamacpp)
    assert choice["plans"]["llamacpp"] is None


def _as_read_by_gguf(path):
    """The key-value fields and tensor infos as the ``gguf`` package's own GGUFReader reads them."""
    reader = gguf.GGUFReader(str(path), "r")
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = [
        (t.name, t.tensor_type.name, tuple(int(d) for d in t.shape), int(t.n_bytes), int(t.data_offset))
        for t in reader.tensors
    ]
    return fields, tensors


@pytest.mark.parametrize("model", ["lab", "small"])
def test_header_reads_as_the_gguf_package_reads_it(tmp_path, model):
    """The planner's own header read (struct over a memory map) gives the fields and tensors of
    gguf's GGUFReader; an array longer than SHORT_ARRAY (the lab model's 32k-token vocabulary)
    keeps its length only."""
    from ansible_collections.gpufleet.node.plugins.module_utils.serving import _gguf
    from lab import tiny_gguf

    path = tmp_path / "m.gguf"
    if model == "lab":
        tiny_gguf.write(path)
    else:
        write_gguf(path)
    fields, tensors = _gguf.read_header(str(path))
    want_fields, want_tensors = _as_read_by_gguf(path)
    assert sorted(fields) == sorted(want_fields)
    skipped = [k for k, v in fields.items() if isinstance(v, _gguf.SkippedArray)]
    for key, value in fields.items():
        if key in skipped:
            assert len(value) == len(want_fields[key]) > _gguf.SHORT_ARRAY, key
        else:
            assert value == want_fields[key], key
    assert [(t.name, t.type_name, tuple(t.shape), t.n_bytes, t.data_offset) for t in tensors] == want_tensors
    assert bool(skipped) == (model == "lab"), skipped


def test_an_array_longer_than_the_file_is_refused(tmp_path):
    """A vocabulary whose item count the file's bytes cannot hold is refused before it is walked."""
    writer = gguf.GGUFWriter(str(tmp_path / "v.gguf"), "llama")
    writer.add_token_list(["a", "b", "c"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    data = bytearray((tmp_path / "v.gguf").read_bytes())
    key = b"tokenizer.ggml.tokens"
    count_at = data.index(key) + len(key) + 4 + 4  # the value type (ARRAY), the item type (STRING)
    assert struct.unpack_from("<Q", data, count_at) == (3,)
    struct.pack_into("<Q", data, count_at, 2**40)
    path = tmp_path / "vocab.gguf"
    path.write_bytes(bytes(data))
    _refused(path, r"tokenizer\.ggml\.tokens at byte \d+ needs \d+ bytes, beyond the file's %d" % len(data))
