# SPDX-License-Identifier: GPL-3.0-or-later
"""A tiny llama-architecture GGUF model that the real ``llama-server`` loads and completes with.

Written with the ``gguf`` package (PyPI): 4 layers, 64-wide, 4 heads (2 KV heads), random F32
weights from a fixed seed (so the file and its sha256 are the same on every machine), and a real
SentencePiece-style vocabulary small enough to write: the special tokens, the 256 byte-fallback
tokens ``<0x00>``..``<0xFF>`` llama.cpp's SPM tokenizer needs, printable ASCII and a few hundred
common English word pieces (``▁the``, ...), padded with plain pieces to 32768 tokens. Its completions are gibberish; what the lab and the
tests check is that the server loads the file, plans its layers, answers ``/health``, streams
through the OpenAI API and counts its tokens in ``/metrics``.

    python -m lab.tiny_gguf OUTPUT.gguf
"""

from __future__ import annotations

import sys

N_LAYERS, N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_CTX = 4, 64, 4, 2, 128, 4096

_WORDS = (
    "the of and to a in is it you that he was for on are with as I his they be at one have this from "
    "or had by hot word but what some we can out other were all there when up use your how said an each "
    "she which do their time if will way about many then them write would like so these her long make "
    "thing see him two has look more day could go come did number sound no most people my over know water "
    "than call first who may down side been now find any new work part take get place made live where after "
    "back little only round man year came show every good me give our under name very through just form "
    "sentence great think say help low line differ turn cause much mean before move right boy old too same "
    "tell does set three want air well also play small end put home read hand port large spell add even land "
    "here must big high such follow act why ask men change went light kind off need house picture try us again "
    "animal point mother world near build self earth father head stand own page should country found answer "
    "school grow study still learn plant cover food sun four between state keep eye never last let thought city "
    "tree cross farm hard start might story saw far sea draw left late run while press close night real life "
    "few north open seem together next white children begin got walk example ease paper group always music "
    "those both mark often letter until mile river car feet care second book carry took science eat room friend "
    "began idea fish mountain stop once base hear horse cut sure watch color face wood main enough plain girl "
    "usual young ready above ever red list though feel talk bird soon body dog family direct pose leave song "
    "measure door product black short numeral class wind question happen complete ship area half rock order fire "
    "south problem piece told knew pass since top whole king space heard best hour better true during hundred "
    "five remember step early hold west ground interest reach fast verb sing listen six table travel less morning "
    "ten simple several vowel toward war lay against pattern slow center love person money serve appear road map "
    "rain rule govern pull cold notice voice unit power town fine certain fly fall lead cry dark machine note wait "
    "plan figure star box noun field rest correct able pound done beauty drive stood contain front teach week final "
    "gave green oh quick develop ocean warm free minute strong special mind behind clear tail produce fact street "
    "inch multiply nothing course stay wheel full force blue object decide surface deep moon island foot system "
    "busy test record boat common gold possible plane stead dry wonder laugh thousand ago ran check game shape "
    "equate miss brought heat snow tire bring yes distant fill east paint language among hello GPU model server"
).split()


#: Tokens of the vocabulary: the words above, padded (see vocabulary()).
VOCAB_SIZE = 32768


def vocabulary():
    """(tokens, scores, token types) of the SentencePiece-style vocabulary."""
    import gguf

    T = gguf.TokenType
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [T.UNKNOWN, T.CONTROL, T.CONTROL]
    for byte in range(256):
        tokens.append("<0x%02X>" % byte)
        scores.append(0.0)
        types.append(T.BYTE)
    pieces = ["\u2581"] + [chr(c) for c in range(33, 127)] + ["\u2581" + w for w in dict.fromkeys(_WORDS)]
    for rank, piece in enumerate(dict.fromkeys(pieces)):
        tokens.append(piece)
        scores.append(-float(rank))
        types.append(T.NORMAL)
    # Padded to VOCAB_SIZE with plain pieces: the lab serves this model under the pool's model name
    # (one HAProxy backend, one model), so it must take the token ids a client of a real model's
    # vocabulary sends (vllm_load_test's prompts are ids 1000-30000).
    for index in range(VOCAB_SIZE - len(tokens)):
        tokens.append("\u2581t%d" % index)
        scores.append(-float(len(pieces) + index))
        types.append(T.NORMAL)
    return tokens, scores, types


def write(path, seed=20260):
    """Write the tiny model to ``path``; returns the number of tokens of its vocabulary."""
    import gguf
    import numpy as np

    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)
    head_dim = N_EMBD // N_HEAD

    def w(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("gpufleet-tiny-llama")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYERS)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_tensor("token_embd.weight", w(n_vocab, N_EMBD))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output.weight", w(n_vocab, N_EMBD))
    for i in range(N_LAYERS):
        writer.add_tensor("blk.%d.attn_norm.weight" % i, np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor("blk.%d.attn_q.weight" % i, w(N_EMBD, N_EMBD))
        writer.add_tensor("blk.%d.attn_k.weight" % i, w(N_HEAD_KV * head_dim, N_EMBD))
        writer.add_tensor("blk.%d.attn_v.weight" % i, w(N_HEAD_KV * head_dim, N_EMBD))
        writer.add_tensor("blk.%d.attn_output.weight" % i, w(N_EMBD, N_EMBD))
        writer.add_tensor("blk.%d.ffn_norm.weight" % i, np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor("blk.%d.ffn_gate.weight" % i, w(N_FF, N_EMBD))
        writer.add_tensor("blk.%d.ffn_up.weight" % i, w(N_FF, N_EMBD))
        writer.add_tensor("blk.%d.ffn_down.weight" % i, w(N_EMBD, N_FF))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return n_vocab


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m lab.tiny_gguf OUTPUT.gguf")
    print("wrote %s: %d tokens" % (sys.argv[1], write(sys.argv[1])))
