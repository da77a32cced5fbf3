"""Batched decoding: one forward step advances several sequences, each over its own cache, and each
gets the numbers of its own one-token step (bit for bit); Model.generate over a list of prompts gives
every prompt exactly what it gets alone — greedy or seeded sampling, prompts of very different
lengths, sequences that stop at different steps for different reasons."""
from __future__ import annotations

import os

import numpy as np
import pytest

import pyllm
from families import convert_to_gguf
from pyllm import _core


def _one_token_steps(llm, prompts, feeds):
    """For each prompt, the logits (steps, vocab) of its feed's tokens run one a call after it."""
    solo = []
    for seq, feed in zip(_prefilled(llm, prompts), feeds):
        solo.append(np.stack([seq.forward([t]) for t in feed]))
    return solo


def _prefilled(llm, prompts):
    seqs = [_core.CoreSequence(llm._core, 64) for _ in prompts]
    for seq, prompt in zip(seqs, prompts):
        seq.forward(prompt)
    return seqs


def _solo_and_batched(llm, prompts, steps, seed=0):
    """(logits of each sequence's solo steps, the same steps batched), feeding random tokens."""
    rng = np.random.default_rng(seed)
    feeds = [list(rng.integers(3, llm.vocab_size, steps)) for _ in prompts]
    solo = _one_token_steps(llm, prompts, feeds)
    seqs = _prefilled(llm, prompts)
    work = _core.CoreSequence(llm._core, 64, n_batch=len(prompts))
    batched = [[] for _ in prompts]
    for step in range(steps):
        out = work.forward_batch(seqs, [feed[step] for feed in feeds])
        for b, row in enumerate(out):
            batched[b].append(row)
    assert [s.pos for s in seqs] == [len(p) + steps for p in prompts]
    assert work.pos == 0
    return solo, batched


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen3", "gemma2", "gemma3", "phi3", "gpt2"])
def test_a_batched_step_is_each_sequence_s_own_step(family_checkpoint, family):
    """bf16 weights (vec path), windows shorter than the sequences (mistral, gemma2/3: window 8)."""
    llm = pyllm.load(family_checkpoint(family), threads=2)
    rng = np.random.default_rng(1)
    prompts = [list(rng.integers(3, llm.vocab_size, n)) for n in (1, 23, 9)]
    solo, batched = _solo_and_batched(llm, prompts, 12)
    for a, b in zip(solo, batched):
        np.testing.assert_array_equal(a, np.stack(b))


def test_quantized_weights_too(family_checkpoint, tmp_path):
    """8-bit activations are quantized per row: a row's numbers do not depend on its neighbours."""
    folder = family_checkpoint("llama")
    llm = pyllm.load(convert_to_gguf(folder, str(tmp_path / "llama-q8_0.gguf"), "q8_0"), threads=2)
    prompts = [[5, 6, 7], list(range(10, 40)), [9] * 17]
    solo, batched = _solo_and_batched(llm, prompts, 8)
    for a, b in zip(solo, batched):
        np.testing.assert_array_equal(a, np.stack(b))


def test_bad_batches_are_refused(family_checkpoint):
    llm = pyllm.load(family_checkpoint("llama"), threads=2)
    other = pyllm.load(family_checkpoint("llama"), threads=2)
    work = _core.CoreSequence(llm._core, 64, n_batch=2)
    a, b = _core.CoreSequence(llm._core, 64), _core.CoreSequence(llm._core, 64)
    with pytest.raises(ValueError, match="distinct"):
        work.forward_batch([a, a], [5, 6])
    with pytest.raises(ValueError, match="holds 2"):
        work.forward_batch([a, b, _core.CoreSequence(llm._core, 64)], [5, 6, 7])
    with pytest.raises(ValueError, match="this model"):
        work.forward_batch([a, _core.CoreSequence(other._core, 64)], [5, 6])
    with pytest.raises(ValueError, match="as many tokens as counted"):
        work.forward_batch([a, b], [5])
    with pytest.raises(ValueError, match="as many tokens as counted"):
        work.forward_batch([a, b], [5, 6, 7], counts=[1, 1])
    with pytest.raises(ValueError, match="at least one token for each"):
        work.forward_batch([a, b], [5, 6], counts=[2, 0])
    with pytest.raises(ValueError, match="holds 2"):
        work.forward_batch([a, b], [5, 6, 7], counts=[1, 2])
    with pytest.raises(ValueError, match="outside"):
        work.forward_batch([a, b], [5, llm.vocab_size])
    with pytest.raises(ValueError, match="context"):  # a sequence longer than the buffer's context
        work.forward_batch([_core.CoreSequence(llm._core, 128)], [5])
    full = _core.CoreSequence(llm._core, 4)
    full.forward([5, 6, 7, 8])
    with pytest.raises(OverflowError, match="full"):
        work.forward_batch([full], [5])
    nearly = _core.CoreSequence(llm._core, 4)
    nearly.forward([5, 6, 7])
    with pytest.raises(OverflowError, match="full"):  # one position left, two tokens
        work.forward_batch([nearly], [5, 6], counts=[2])
    assert a.pos == b.pos == 0  # a refused step advances nothing


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3", "gpt2"])
def test_several_tokens_of_several_sequences_in_one_step_are_each_token_s_own_step(family_checkpoint, family):
    """Speculative rounds of several sequences at once: a sequence's rows attend over its earlier
    rows of the same call (gemma3: across its window of 8), each row the bits of its one-token step."""
    llm = pyllm.load(family_checkpoint(family), threads=2)
    rng = np.random.default_rng(2)
    prompts = [list(rng.integers(3, llm.vocab_size, n)) for n in (5, 19, 1)]
    rounds = [[3, 1, 6], [1, 9, 2], [4, 4, 1]]  # tokens per sequence in each call
    feeds = [list(rng.integers(3, llm.vocab_size, sum(r[b] for r in rounds))) for b in range(len(prompts))]
    solo = _one_token_steps(llm, prompts, feeds)
    seqs = _prefilled(llm, prompts)
    work = _core.CoreSequence(llm._core, 64, n_batch=16)
    batched, done = [[] for _ in prompts], [0] * len(prompts)
    for counts in rounds:
        tokens = [t for b, c in enumerate(counts) for t in feeds[b][done[b]:done[b] + c]]
        out = work.forward_batch(seqs, tokens, counts=counts)
        assert out.shape == (sum(counts), llm.vocab_size)
        for b, rows in enumerate(np.split(out, np.cumsum(counts)[:-1])):
            batched[b].append(rows)
            done[b] += counts[b]
    assert [s.pos for s in seqs] == [len(p) + d for p, d in zip(prompts, done)]
    for a, b in zip(solo, batched):
        np.testing.assert_array_equal(a, np.concatenate(b))


PROMPTS = ["The capital of France is", "Water boils at",
           "Once upon a time, in a land far away, there lived a king who had three daughters. The "
           "youngest of them was", "1, 2, 3,"]


def test_generate_a_list_is_each_prompt_alone(smollm2_gguf):
    """The real Q4_1 model: prompts of 4 to 30 tokens, ending by a stop string, by max_tokens."""
    llm = pyllm.load(smollm2_gguf, threads=2)
    settings = dict(max_tokens=14, stop=["\n\n", " 9,"])
    alone = [llm.generate(p, **settings) for p in PROMPTS]
    together = llm.generate(PROMPTS, **settings)
    assert isinstance(together, list) and len(together) == len(PROMPTS)
    for a, b in zip(alone, together):
        assert (a.text, a.token_ids, a.finish_reason, a.usage) == (b.text, b.token_ids, b.finish_reason, b.usage)
    assert {c.finish_reason for c in together} == {"stop", "length"}
    assert len({len(c.token_ids) for c in together}) > 1  # they ended at different steps


def test_generate_a_list_with_seeded_sampling_and_logprobs(smollm2_gguf):
    llm = pyllm.load(smollm2_gguf, threads=2)
    settings = dict(max_tokens=12, temperature=0.9, top_p=0.95, seed=11, logprobs=2)
    alone = [llm.generate(p, **settings) for p in PROMPTS]
    together = llm.generate(PROMPTS, **settings)
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids and a.text == b.text and a.logprobs == b.logprobs


def test_generate_a_list_of_ids_and_an_end_of_sequence(family_checkpoint):
    """Token-id prompts, max_tokens=0, one sequence ending at an EOS it is pushed to by logit_bias,
    one that runs out of context while the others go on."""
    llm = pyllm.load(family_checkpoint("qwen2"), threads=2, n_ctx=40)
    eos = min(llm.eos_ids)
    prompts = [list(range(5, 12)), list(range(20, 56)), [7, 8, 9]]
    for settings in (dict(max_tokens=10), dict(max_tokens=10, logit_bias={eos: 8.0}), dict(max_tokens=0)):
        alone = [llm.generate(p, **settings) for p in prompts]
        together = llm.generate(prompts, **settings)
        for a, b in zip(alone, together):
            assert (a.token_ids, a.finish_reason, a.usage) == (b.token_ids, b.finish_reason, b.usage)
    long = llm.generate(prompts, max_tokens=10)[1]
    assert long.finish_reason == "length" and len(long.token_ids) == 40 - 36 + 1


def test_bad_lists_are_refused(family_checkpoint):
    llm = pyllm.load(family_checkpoint("llama"), threads=2)
    with pytest.raises(ValueError, match="empty"):
        llm.generate([])
    with pytest.raises(ValueError, match="generate"):
        llm.stream(["a", "b"])
    with pytest.raises(ValueError, match="no tokens"):
        llm.generate(["fine", []])
    with pytest.raises(ValueError, match="temperature"):
        llm.generate(["a", "b"], temperature=-1)
