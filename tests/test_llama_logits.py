"""The Llama family's own checks on tiny random checkpoints: chunked prefill, thread counts and kernels
give the same logits, the old rope spelling, the context limit, prefix reuse and bad token ids. Its logits,
greedy continuations and prefill against transformers are tests/test_family_contract.py's."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import pyllm
import pyllm.scheduler
from pyllm import _core

from conftest import make_tiny_checkpoint
from families import CASES


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """One tiny Llama for the tests that only read it."""
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("llama")))


def test_chunked_prefill_equals_one_batch(tiny):
    llm = pyllm.load(tiny, threads=2)
    ids = np.random.default_rng(3).integers(2, 320, 50).tolist()
    whole = llm.logits(ids)
    seq = _core.CoreSequence(llm._core, 64, n_batch=7)
    assert np.abs(seq.forward(ids, all_logits=True) - whole).max() <= 1e-4


def test_thread_counts_give_the_same_logits(tiny):
    ids = list(range(2, 42))
    one = pyllm.load(tiny, threads=1).logits(ids)
    two = pyllm.load(tiny, threads=2).logits(ids)
    three = pyllm.load(tiny, threads=3).logits(ids)
    assert np.abs(one - two).max() <= 1e-5 and np.abs(one - three).max() <= 1e-5


def test_scalar_kernels_give_the_same_logits(tiny):
    ids = list(range(2, 42))
    best = pyllm.load(tiny, threads=2).logits(ids)
    try:
        _core.set_isa("scalar")
        scalar = pyllm.load(tiny, threads=2).logits(ids)
    finally:
        _core.set_isa("best")
    assert np.abs(best - scalar).max() <= 1e-4


def test_old_rope_config_spelling_reads_the_same(tmp_path):
    """Checkpoints from before transformers 5 write rope_theta and rope_scaling."""
    params = CASES["llama3_rope_scaling"].overrides["rope_parameters"]
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


def test_prompt_longer_than_context_raises_context_length_error(tiny):
    llm = pyllm.load(tiny, n_ctx=16)
    with pytest.raises(pyllm.ContextLengthError, match="17.*16"):
        llm.logits(list(range(2, 19)))


def test_generation_that_fills_the_context_ends_with_length(tiny):
    llm = pyllm.load(tiny, n_ctx=12)
    llm.eos_ids = set()  # only the context can stop it
    out = llm.generate(list(range(2, 10)), max_tokens=100)
    assert len(out.token_ids) == 12 - 8 + 1 and out.finish_reason == "length"


def test_reusing_a_prompt_prefix_runs_only_what_follows_its_whole_chunks(tiny):
    """A cache's whole prefill chunks are reused, and give the bits a fresh run computes."""
    llm = pyllm.load(tiny)
    chunk = pyllm.scheduler.PREFILL_CHUNK
    ids = [int(i) for i in np.random.default_rng(5).integers(2, llm.vocab_size, chunk + 100)]
    llm._prefill(ids[:chunk + 30])
    before = llm.tokens_processed
    reused = llm._prefill(ids)
    assert llm.tokens_processed - before == len(ids) - chunk
    llm.reset()
    assert np.array_equal(reused, llm._prefill(ids))


def test_token_ids_outside_the_vocabulary_raise(tiny):
    llm = pyllm.load(tiny)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.logits([5, 320])
    with pytest.raises(ValueError):
        llm.logits([-1])
