"""The file people run on laptops, cut to CI's size: a Q4_K_M GGUF of Llama-3.2-1B's shape (2 of its layers,
a 2,048-token vocabulary, random weights, quantized by llama.cpp's own code: tests/laptop_gguf.py). Its q4_K
and q6_K matrices go through the packed kernels; a position's logits must be the same bits prefilled whole,
in pieces or a token at a time, on 1, 2 or 3 threads."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader

import pyllm
from laptop_gguf import make_q4_k_m
from pyllm import _core

IDS = list(np.random.default_rng(33).integers(3, 2048, 24))


@pytest.fixture(scope="module")
def q4_k_m_file(tmp_path_factory) -> str:
    return make_q4_k_m(str(tmp_path_factory.mktemp("laptop") / "llama-3.2-1b-2-layers.Q4_K_M.gguf"))


def feed(llm, cuts: list[int]) -> np.ndarray:
    """Every position's logits (len(IDS), vocab) after feeding IDS in pieces cut at cuts, on a fresh
    sequence with the default cache of quantized weights (f16)."""
    seq = _core.CoreSequence(llm._core, len(IDS), kv_dtype="f16")
    bounds = [0, *cuts, len(IDS)]
    return np.concatenate([seq.forward(IDS[lo:hi], all_logits=True) for lo, hi in zip(bounds[:-1], bounds[1:])])


def test_the_file_holds_llama_cpp_s_q4_k_m_mix(q4_k_m_file):
    types = {t.name: t.tensor_type for t in GGUFReader(q4_k_m_file).tensors}
    assert types["token_embd.weight"] == Q.Q6_K  # the tied head
    assert types["blk.0.attn_v.weight"] == types["blk.0.ffn_down.weight"] == Q.Q4_K
    assert types["blk.1.attn_v.weight"] == types["blk.1.ffn_down.weight"] == Q.Q6_K  # use_more_bits: the last layer
    for name in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
        assert types[f"blk.0.{name}.weight"] == types[f"blk.1.{name}.weight"] == Q.Q4_K
    assert all(_core.packed_type(int(t)) for t in types.values() if t not in (Q.F32, Q.F16))


def test_prefill_whole_in_pieces_and_token_by_token_on_1_2_3_threads_give_the_same_bits(q4_k_m_file):
    whole = None
    for threads in (1, 2, 3):
        llm = pyllm.load(q4_k_m_file, threads=threads, n_ctx=64)
        got = feed(llm, [])
        if whole is None:
            whole = got
            assert got.shape == (len(IDS), 2048) and np.isfinite(got).all() and got.std() > 0
        np.testing.assert_array_equal(got, whole, err_msg=f"whole, {threads} threads")
        np.testing.assert_array_equal(feed(llm, [5, 6, 17]), whole, err_msg=f"in pieces, {threads} threads")
        np.testing.assert_array_equal(feed(llm, list(range(1, len(IDS)))), whole,
                                      err_msg=f"token by token, {threads} threads")
        del llm
