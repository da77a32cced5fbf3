"""The Llama-family forward against transformers on tiny random checkpoints (bf16 on disk, f32
compute on both sides): logits, greedy continuations, and prefill == token-by-token decoding."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import pyllm
import pyllm.scheduler
from pyllm import _core

from conftest import hf_float32, make_tiny_checkpoint

N_POSITIONS = 40

CASES = {
    "llama_gqa_untied": ("llama", {}),
    "llama_tied_embeddings": ("llama", {"tie_word_embeddings": True}),
    "llama_multi_head_attention": ("llama", {"num_key_value_heads": 4}),
    "llama3_rope_scaling": ("llama", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "linear_rope_scaling": ("llama", {"rope_parameters": {
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}}),
    "mistral_sliding_window": ("mistral", {"sliding_window": 8}),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    family, overrides = CASES[request.param]
    folder = make_tiny_checkpoint(str(tmp_path_factory.mktemp(request.param)), family, **overrides)
    ids = np.random.default_rng(7).integers(2, 320, N_POSITIONS).tolist()
    with torch.no_grad():
        oracle = hf_float32(folder)
        expected = oracle(torch.tensor([ids])).logits[0].numpy()
    return request.param, folder, ids, expected, oracle


def test_logits_match_transformers(case):
    name, folder, ids, expected, _ = case
    got = pyllm.load(folder, threads=2).logits(ids)
    assert got.shape == expected.shape and got.dtype == np.float32
    assert np.abs(got - expected).max() <= 1e-3, name


def test_greedy_continuation_matches_transformers(case):
    name, folder, ids, _, oracle = case
    prompt = ids[:8]
    with torch.no_grad():
        out = oracle.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                              attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    expected = out[0, len(prompt):].tolist()
    expected = [t for t in expected if t != 1][:16]  # transformers pads after an EOS
    llm = pyllm.load(folder, threads=2)
    assert llm.generate(prompt, max_tokens=16).token_ids == expected, name


def test_prefill_equals_token_by_token_decoding(case):
    _, folder, ids, _, _ = case
    llm = pyllm.load(folder, threads=2)
    batch = llm.logits(ids)
    llm.reset()
    steps = np.stack([llm._step(t) for t in ids])
    assert np.abs(batch - steps).max() <= 1e-4


def test_chunked_prefill_equals_one_batch(tmp_path):
    folder = make_tiny_checkpoint(str(tmp_path))
    llm = pyllm.load(folder, threads=2)
    ids = np.random.default_rng(3).integers(2, 320, 50).tolist()
    whole = llm.logits(ids)
    seq = _core.CoreSequence(llm._core, 64, n_batch=7)
    assert np.abs(seq.forward(ids, all_logits=True) - whole).max() <= 1e-4


def test_thread_counts_give_the_same_logits(tmp_path):
    folder = make_tiny_checkpoint(str(tmp_path))
    ids = list(range(2, 42))
    one = pyllm.load(folder, threads=1).logits(ids)
    two = pyllm.load(folder, threads=2).logits(ids)
    three = pyllm.load(folder, threads=3).logits(ids)
    assert np.abs(one - two).max() <= 1e-5 and np.abs(one - three).max() <= 1e-5


def test_scalar_kernels_give_the_same_logits(tmp_path):
    folder = make_tiny_checkpoint(str(tmp_path))
    ids = list(range(2, 42))
    best = pyllm.load(folder, threads=2).logits(ids)
    try:
        _core.set_isa("scalar")
        scalar = pyllm.load(folder, threads=2).logits(ids)
    finally:
        _core.set_isa("best")
    assert np.abs(best - scalar).max() <= 1e-4


def test_old_rope_config_spelling_reads_the_same(tmp_path):
    """Checkpoints from before transformers 5 write rope_theta and rope_scaling."""
    params = CASES["llama3_rope_scaling"][1]["rope_parameters"]
    folder = make_tiny_checkpoint(str(tmp_path), rope_parameters=params)
    new = pyllm.load(folder).logits(list(range(2, 30)))
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        config = json.load(f)
    rp = config.pop("rope_parameters")
    config["rope_theta"] = rp.pop("rope_theta")
    config["rope_scaling"] = {"type" if k == "rope_type" else k: v for k, v in rp.items()}
    with open(path, "w") as f:
        json.dump(config, f)
    old = pyllm.load(folder).logits(list(range(2, 30)))
    assert np.array_equal(new, old)


def test_prompt_longer_than_context_raises_context_length_error(tmp_path):
    llm = pyllm.load(make_tiny_checkpoint(str(tmp_path)), n_ctx=16)
    with pytest.raises(pyllm.ContextLengthError, match="17.*16"):
        llm.logits(list(range(2, 19)))


def test_generation_that_fills_the_context_ends_with_length(tmp_path):
    llm = pyllm.load(make_tiny_checkpoint(str(tmp_path)), n_ctx=12)
    llm.eos_ids = set()  # only the context can stop it
    out = llm.generate(list(range(2, 10)), max_tokens=100)
    assert len(out.token_ids) == 12 - 8 + 1 and out.finish_reason == "length"


def test_reusing_a_prompt_prefix_runs_only_what_follows_its_whole_chunks(tmp_path):
    """A cache's whole prefill chunks are reused, and give the bits a fresh run computes."""
    llm = pyllm.load(make_tiny_checkpoint(str(tmp_path)))
    chunk = pyllm.scheduler.PREFILL_CHUNK
    ids = [int(i) for i in np.random.default_rng(5).integers(2, llm.vocab_size, chunk + 100)]
    llm._prefill(ids[:chunk + 30])
    before = llm.tokens_processed
    reused = llm._prefill(ids)
    assert llm.tokens_processed - before == len(ids) - chunk
    llm.reset()
    assert np.array_equal(reused, llm._prefill(ids))


def test_token_ids_outside_the_vocabulary_raise(tmp_path):
    llm = pyllm.load(make_tiny_checkpoint(str(tmp_path)))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.logits([5, 320])
    with pytest.raises(ValueError):
        llm.logits([-1])
