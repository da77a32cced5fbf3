"""Generations that share one model: interleaved streams, logits() between steps and Python threads
each get what they would get alone, and nothing races inside the C core."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import pyllm

from conftest import make_tiny_checkpoint

PROMPTS = [[5, 17, 42, 9], [100, 3, 250, 77, 12, 8], [64, 64, 2], [300, 1, 150]]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return pyllm.load(make_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny"))), threads=2)


def alone(llm, prompt, **params):
    llm.reset()
    return llm.generate(prompt, max_tokens=12, **params).token_ids


def _interleave(streams) -> None:
    live = list(streams)
    while live:  # one token of each in turn
        for s in list(live):
            try:
                next(s)
            except StopIteration:
                live.remove(s)


def test_interleaved_streams_each_continue_their_own_prompt(llm):
    expected = [alone(llm, p) for p in PROMPTS[:2]]
    streams = [llm.stream(p, max_tokens=12) for p in PROMPTS[:2]]
    _interleave(streams)
    assert [s.completion.token_ids for s in streams] == expected


def test_logits_between_the_steps_of_a_stream_do_not_change_it(llm):
    expected = alone(llm, PROMPTS[0])
    stream = llm.stream(PROMPTS[0], max_tokens=12)
    next(stream)
    other = llm.logits(PROMPTS[1])
    for _ in stream:
        pass
    assert stream.completion.token_ids == expected
    assert np.abs(llm.logits(PROMPTS[1]) - other).max() <= 1e-4


def test_threads_sharing_a_model_get_what_each_would_alone(llm):
    settings = [dict(temperature=0.9, seed=i) for i in range(len(PROMPTS))]
    expected = [alone(llm, p, **kw) for p, kw in zip(PROMPTS, settings)]
    results: dict[int, list[list[int]]] = {i: [] for i in range(len(PROMPTS))}
    errors = []

    def work(i):
        try:
            for _ in range(3):
                results[i].append(llm.generate(PROMPTS[i], max_tokens=12, **settings[i]).token_ids)
        except Exception as e:  # surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)
    assert all(results[i] == [expected[i]] * 3 for i in range(len(PROMPTS)))


def test_interleaved_streams_hold_caches_of_their_own(llm):
    """Nothing is run twice: each stream steps its own cache."""
    expected = [alone(llm, p) for p in PROMPTS]
    llm.reset()
    before = llm.tokens_processed
    streams = [llm.stream(p, max_tokens=12) for p in PROMPTS]
    _interleave(streams)
    assert [s.completion.token_ids for s in streams] == expected
    ran = sum(len(p) + len(s.completion.token_ids) - 1 for p, s in zip(PROMPTS, streams))
    assert llm.tokens_processed - before == ran


def test_more_streams_than_caches_take_turns_and_still_get_their_own_tokens(tmp_path):
    small = pyllm.load(make_tiny_checkpoint(str(tmp_path)), threads=2, parallel=2)
    expected = [alone(small, p) for p in PROMPTS]
    streams = [small.stream(p, max_tokens=12) for p in PROMPTS]
    _interleave(streams)
    assert [s.completion.token_ids for s in streams] == expected
    assert len(small.pool.caches) == 2
    with pytest.raises(ValueError, match="parallel"):
        pyllm.load(make_tiny_checkpoint(str(tmp_path)), parallel=0)


@pytest.mark.slow
def test_interleaved_streams_on_the_real_quantized_model(smollm2_gguf):
    """Quantized weights decode with 8-bit activations: two streams stepped alternately once gave
    stream 2 other tokens than alone; with a cache each they are each exactly their solo run."""
    model = pyllm.load(smollm2_gguf, threads=2)
    prompts = ["The capital of France is", "Water boils at"]
    expected = [model.generate(p, max_tokens=24).token_ids for p in prompts]
    streams = [model.stream(p, max_tokens=24) for p in prompts]
    _interleave(streams)
    assert [s.completion.token_ids for s in streams] == expected


@pytest.mark.slow
def test_threads_sharing_the_real_quantized_model_get_what_each_would_alone(smollm2_gguf):
    model = pyllm.load(smollm2_gguf, threads=2)
    prompts = ["The capital of France is", "Water boils at", "Once upon a time", "1, 2, 3,"]
    expected = [model.generate(p, max_tokens=16, temperature=0.8, seed=i).token_ids
                for i, p in enumerate(prompts)]
    results: dict[int, list[int]] = {}

    def work(i):
        results[i] = model.generate(prompts[i], max_tokens=16, temperature=0.8, seed=i).token_ids

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [results.get(i) for i in range(len(prompts))] == expected
