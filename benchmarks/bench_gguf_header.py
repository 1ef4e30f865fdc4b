#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark: the llama.cpp planner's GGUF header read against the ``gguf`` package's GGUFReader.

Writes, with the ``gguf`` package's own writer, a GGUF header of a Llama-3-shaped model (its
128,256-token vocabulary with scores and token types, 32 layers of tensor infos; the tensor data is
left sparse) and times, in the same run on the same file:

* ``serving._gguf.read_shape`` (struct over a memory map; vocabulary arrays skipped, lengths kept),
  what the role ``llamacpp_server`` plans with, once per host and run;
* ``gguf.GGUFReader(path)`` (every array item read through numpy), what it used before.

The ratio is the figure; the absolute times depend on the machine.

Usage: python3 benchmarks/bench_gguf_header.py [--vocab N] [--repeat N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for entry in (REPO / ".collections", REPO):
    sys.path.insert(0, str(entry))

import gguf  # noqa: E402
import numpy as np  # noqa: E402

from ansible_collections.gpufleet.node.plugins.module_utils.serving import _gguf  # noqa: E402

LAYERS = 32


def write(path, vocab):
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("bench-llama3-8b-shape")
    writer.add_block_count(LAYERS)
    writer.add_embedding_length(4096)
    writer.add_feed_forward_length(14336)
    writer.add_head_count(32)
    writer.add_head_count_kv(8)
    writer.add_context_length(8192)
    writer.add_token_list(["tok%d" % i for i in range(vocab)])
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types([1] * vocab)
    tiny = np.zeros((8, 8), dtype=np.float32)
    writer.add_tensor("token_embd.weight", tiny)
    for layer in range(LAYERS):
        for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down", "ffn_gate"):
            writer.add_tensor("blk.%d.%s.weight" % (layer, name), tiny)
    writer.add_tensor("output.weight", tiny)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def best_of(func, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=128256, help="the vocabulary's size (Llama 3: 128256)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per reader; the best is kept")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-gguf-") as tmp:
        path = Path(tmp) / "model.gguf"
        write(path, args.vocab)
        shape = _gguf.read_shape(str(path))
        assert shape["vocab_size"] == 8 and shape["n_layers"] == LAYERS, shape  # token_embd's 8 rows
        ours = best_of(lambda: _gguf.read_shape(str(path)), args.repeat)
        theirs = best_of(lambda: gguf.GGUFReader(str(path), "r"), args.repeat)
    print("GGUF header, %d-token vocabulary, %d layers (best of %d)" % (args.vocab, LAYERS, args.repeat))
    print("  read_shape (struct, memory map)   %8.3f s" % ours)
    print("  gguf.GGUFReader                   %8.3f s" % theirs)
    print("  ratio                             %8.0fx" % (theirs / ours))


if __name__ == "__main__":
    main()
