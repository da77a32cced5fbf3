"""Decode steps run on the part of the pool measured fastest (pyllm.threads.DecodeThreads): the
choice follows the timings, and a step gives the same bits on any part of the pool, whatever count
the calls before it took (csrc/threadpool.c parks the threads a run leaves out)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import pyllm
from laptop_gguf import make_q4_k_m
from pyllm import _core
from pyllm.threads import DECODE_BLOCK, DECODE_PASSES, DECODE_RECHECK, DecodeThreads, decode_candidates


def test_a_pool_tries_all_its_threads_three_quarters_half_and_a_quarter():
    assert decode_candidates(1) == [1]
    assert decode_candidates(2) == [2, 1]
    assert decode_candidates(3) == [3, 2, 1]
    assert decode_candidates(4) == [4, 3, 2, 1]
    assert decode_candidates(8) == [8, 6, 4, 2]
    assert decode_candidates(16) == [16, 12, 8, 4]
    assert DecodeThreads(1).chosen == 1  # nothing to choose


def _measure(tuner: DecodeThreads, seconds_of) -> list[int]:
    """Runs tuner to its choice with step times seconds_of(count, i); the counts it asked for."""
    asked = []
    for i in itertools.count():
        if tuner.chosen is not None:
            return asked
        count = tuner.next()
        asked.append(count)
        tuner.record(count, seconds_of(count, i))


def test_the_counts_take_turns_in_blocks_the_slow_ones_drop_out_and_the_least_median_wins():
    tuner = DecodeThreads(16)
    fast = {16: 3.0, 12: 2.5, 8: 2.0, 4: 4.0}
    # each block's first step slow (it wakes or parks threads), and one scored step of 8 threads too
    asked = _measure(tuner, lambda c, i: 50.0 if i % DECODE_BLOCK == 0 or i == 2 * DECODE_BLOCK + 1 else fast[c])
    block = lambda *counts: [c for c in counts for _ in range(DECODE_BLOCK)]  # noqa: E731
    # 16 and 4 threads, more than DECODE_DROP times 8's median, are not tried again
    assert asked == block(16, 12, 8, 4) + block(12, 8)
    scored = DECODE_BLOCK - 1
    assert {c: len(t) for c, t in tuner.times.items()} == {16: scored, 12: 2 * scored, 8: 2 * scored, 4: scored}
    assert 50.0 in tuner.times[8] and max(tuner.times[16]) == 3.0
    assert tuner.chosen == 8 and tuner.next() == 8
    tuner.record(8, 100.0)  # once chosen, timings change nothing
    assert tuner.chosen == 8 and 100.0 not in tuner.times[8]


def test_one_pass_decides_where_fewer_threads_are_far_slower():
    tuner = DecodeThreads(2)
    asked = _measure(tuner, lambda c, i: {2: 1.0, 1: 1.8}[c])
    assert asked == [2] * DECODE_BLOCK + [1] * DECODE_BLOCK and tuner.chosen == 2


def test_the_counts_are_measured_again_after_a_while_and_a_fixed_count_never_is():
    tuner = DecodeThreads(2)
    _measure(tuner, lambda c, i: {2: 3.0, 1: 1.0}[c])  # while another process held a core
    assert tuner.chosen == 1 and tuner.measured == 1
    for _ in range(DECODE_RECHECK):
        assert tuner.next() == 1 and tuner.next(rows=5) == 1  # only one-row steps count
    assert tuner.next() == 2 and tuner.chosen is None  # the next step measures again, from all threads
    assert tuner.next(rows=5) == 1  # a call of several rows keeps the last choice meanwhile
    assert all(not t for t in tuner.times.values())
    _measure(tuner, lambda c, i: {2: 1.0, 1: 3.0}[c])  # the core free again
    assert tuner.chosen == 2 and tuner.measured == 2
    fixed = DecodeThreads(2, fixed=2)
    for _ in range(3 * DECODE_RECHECK):
        assert fixed.next() == 2
    assert fixed.chosen == 2 and fixed.measured == 0


def test_a_tie_keeps_the_most_threads_and_a_fixed_count_is_checked():
    tuner = DecodeThreads(4)
    asked = _measure(tuner, lambda c, i: 1.0)
    assert len(asked) == DECODE_PASSES * 4 * DECODE_BLOCK and tuner.chosen == 4
    assert DecodeThreads(4, fixed=3).next() == 3
    for bad in (0, 5):
        with pytest.raises(ValueError, match=r"decode threads must be in \[1, 4\]"):
            DecodeThreads(4, fixed=bad)


@pytest.fixture(scope="module")
def q4_k_m_file(tmp_path_factory) -> str:
    return make_q4_k_m(str(tmp_path_factory.mktemp("laptop") / "llama-3.2-1b-2-layers.Q4_K_M.gguf"))


@pytest.mark.parametrize("weights", ["q4_k_m", "bf16"])
def test_decode_steps_on_any_part_of_the_pool_give_the_bits_of_one_thread(weights, q4_k_m_file, checkpoint):
    """A pool of 4 threads: each decode step on another count (the threads it leaves out parked,
    then woken by a larger count), between short prefills, on the count of their turn too."""
    source = q4_k_m_file if weights == "q4_k_m" else checkpoint("llama")
    one, four = pyllm.load(source, threads=1, n_ctx=64), pyllm.load(source, threads=4, n_ctx=64)
    ids = [int(i) for i in np.random.default_rng(5).integers(3, min(one.vocab_size, 2048), 40)]
    mine, theirs = (_core.CoreSequence(m._core, 64) for m in (one, four))
    np.testing.assert_array_equal(theirs.forward(ids[:6]), mine.forward(ids[:6]))
    counts = itertools.cycle([1, 4, 3, 2, 2, 1, 3, 4])
    pos = 6
    while pos < len(ids):
        four.core.decode_threads.fix(next(counts))
        if pos % 7 == 0:  # a prefill of 3 tokens
            np.testing.assert_array_equal(theirs.forward(ids[pos:pos + 3]), mine.forward(ids[pos:pos + 3]))
            pos += 3
            continue
        np.testing.assert_array_equal(theirs.forward([ids[pos]]), mine.forward([ids[pos]]),
                                      err_msg=f"position {pos} on {four.core.decode_threads.chosen} threads")
        pos += 1
    # a batched call of one row takes the decode count too
    work = _core.CoreSequence(four._core, 64, n_batch=4)
    four.core.decode_threads.fix(3)
    np.testing.assert_array_equal(work.forward_batch([theirs], [ids[0]])[0], mine.forward([ids[0]]))


def test_a_draft_on_its_target_s_pool_follows_the_target_s_decode_count(checkpoint):
    folder = checkpoint("llama")
    alone = pyllm.load(folder, threads=1)
    target, draft = pyllm.load(folder, threads=3), pyllm.load(folder, threads=3)
    draft.core.share_pool(target.core)
    assert draft.core.decode_threads is target.core.decode_threads  # its steps are not timed among the target's
    ids = [int(i) for i in np.random.default_rng(6).integers(3, alone.vocab_size, 12)]
    seqs = [_core.CoreSequence(m.core, 32) for m in (alone, target, draft)]
    for s in seqs:
        s.forward(ids[:4])
    for i, token in enumerate(ids[4:]):
        target.core.decode_threads.fix(1 + i % 3)
        want = seqs[0].forward([token])
        np.testing.assert_array_equal(seqs[1].forward([token]), want)
        np.testing.assert_array_equal(seqs[2].forward([token]), want)


def test_a_model_measures_its_decode_threads_while_it_generates_and_its_tokens_stay_the_same(checkpoint):
    folder = checkpoint("llama")
    plain = pyllm.load(folder, threads=1).generate("the cat sat", max_tokens=40, speculative="off")
    llm = pyllm.load(folder, threads=2)
    assert llm.core.decode_threads.chosen is None
    out = llm.generate("the cat sat", max_tokens=40, speculative="off")
    assert out.token_ids == plain.token_ids
    tuner = llm.core.decode_threads
    assert tuner.chosen in (1, 2)
    assert all(len(t) >= DECODE_BLOCK - 1 for t in tuner.times.values())
    assert all(s > 0 for t in tuner.times.values() for s in t)


def test_a_float_model_s_prompt_gives_the_same_bits_whatever_the_decode_count(checkpoint):
    """Up to 15 rows a call runs on the decode count, its bits those of any count; from 16 float
    weights go through sgemm, cut by the thread count, and such a call takes every thread whatever
    the decode count (a 17-token prompt prefilled while the counts are measured, and again after)."""
    llm = pyllm.load(checkpoint("llama"), threads=3)
    ids = [int(i) for i in np.random.default_rng(8).integers(3, llm.vocab_size, 17)]
    for n in (15, 17):
        got = []
        for count in (1, 2, 3):
            llm.core.decode_threads.fix(count)
            got.append(_core.CoreSequence(llm.core, 32).forward(ids[:n], all_logits=True))
        for other in got[1:]:
            np.testing.assert_array_equal(other, got[0], err_msg=f"{n} tokens")


def test_on_the_real_q4_1_file_the_measured_count_gives_the_tokens_and_logprobs_of_one_thread(smollm2_gguf):
    """The default model, quantized: its 8-bit activations and packed kernels on whichever count
    the measure takes and keeps, the generation the same as on one thread."""
    plain = pyllm.load(smollm2_gguf, threads=1).generate("The capital of France is", max_tokens=30,
                                                        logprobs=2, speculative="off")
    llm = pyllm.load(smollm2_gguf, threads=2)
    out = llm.generate("The capital of France is", max_tokens=30, logprobs=2, speculative="off")
    assert llm.core.decode_threads.chosen in (1, 2) and llm.core.decode_threads.measured == 1
    assert out.token_ids == plain.token_ids and out.logprobs == plain.logprobs
