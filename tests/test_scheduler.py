"""Continuous batching (pyllm.scheduler): jobs join and leave a running batch at step boundaries,
long prompts prefill a chunk per step between the others' decode steps, a shared prefix's whole
chunks are reused — and through all of it every job gets exactly what its prompt gets alone."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import pyllm
from pyllm.errors import QueueFullError
from pyllm.sampling import SamplingParams
from pyllm.scheduler import PREFILL_CHUNK, Engine, Failed, Finished, Piece, Scheduler, prefill_chunks


class Recorder:
    """The events of one job, and at which engine step each came."""

    def __init__(self, clock):
        self.clock = clock
        self.pieces: list[Piece] = []
        self.steps: list[int] = []
        self.end = None

    def __call__(self, event) -> None:
        assert self.end is None, "an event after the last one"
        if isinstance(event, Piece):
            self.pieces.append(event)
            self.steps.append(self.clock[0])
        else:
            self.end = event


def run_engine(engine: Engine, clock: list[int]) -> None:
    while engine.busy():
        engine.step()
        clock[0] += 1


def submit(engine, clock, ids, **settings) -> tuple:
    rec = Recorder(clock)
    max_tokens = settings.pop("max_tokens", 12)
    stop = settings.pop("stop", None)
    logprobs = settings.pop("logprobs", None)
    job = engine.submit(ids, sampling=SamplingParams(**settings), max_tokens=max_tokens, stop=stop,
                        logprobs=logprobs, on_event=rec)
    return job, rec


def assert_alone(llm, ids, rec: Recorder, **settings) -> None:
    alone = llm.generate(ids, **settings)
    assert isinstance(rec.end, Finished), rec.end
    got = rec.end.completion
    assert (got.token_ids, got.text, got.finish_reason, got.usage, got.logprobs) == \
        (alone.token_ids, alone.text, alone.finish_reason, alone.usage, alone.logprobs)
    assert "".join(p.text for p in rec.pieces) == got.text


def test_prefill_chunks_fall_on_multiples_of_the_chunk():
    c = PREFILL_CHUNK
    assert prefill_chunks(0, 5) == [(0, 5)]
    assert prefill_chunks(0, c) == [(0, c)]
    assert prefill_chunks(0, 2 * c + 3) == [(0, c), (c, 2 * c), (2 * c, 2 * c + 3)]
    assert prefill_chunks(c, c + 1) == [(c, c + 1)]
    assert prefill_chunks(c, 3 * c) == [(c, 2 * c), (2 * c, 3 * c)]


@pytest.fixture(scope="module")
def real(smollm2_gguf):
    return pyllm.load(smollm2_gguf, threads=2, parallel=4)


def text_ids(llm, n: int) -> list[int]:
    from conftest import english_text

    ids = llm.tokenize(english_text())
    assert len(ids) >= n
    return ids[:n]


def test_jobs_joining_and_leaving_get_their_solo_tokens_on_the_real_model(real):
    """Five jobs on four slots: prompts of 4 to 2.5 chunks, greedy and seeded, stop strings and
    logprobs; one joins while the others decode. Each equals Model.generate of its prompt alone."""
    llm = real
    clock = [0]
    engine = Engine(llm)
    long = text_ids(llm, 2 * PREFILL_CHUNK + 60)
    jobs = [
        (llm.tokenize("The capital of France is"), dict(max_tokens=16)),
        (long, dict(max_tokens=10)),
        (llm.tokenize("Water boils at"), dict(max_tokens=14, temperature=0.8, top_p=0.9, seed=3, logprobs=2)),
        (llm.tokenize("1, 2, 3,"), dict(max_tokens=20, stop=[" 8,"])),
    ]
    records = [submit(engine, clock, ids, **dict(s))[1] for ids, s in jobs]
    for _ in range(3):
        engine.step()
        clock[0] += 1
    late_ids = llm.tokenize("Once upon a time")
    records.append(submit(engine, clock, late_ids, max_tokens=8)[1])
    jobs.append((late_ids, dict(max_tokens=8)))
    run_engine(engine, clock)
    assert engine.active == 0 and engine.queued == 0
    assert all(c.owner is None for c in llm.pool.caches)
    for (ids, settings), rec in zip(jobs, records):
        assert_alone(llm, ids, rec, **settings)
    # the short prompts decoded while the long one was still prefilling its chunks
    long_first = records[1].steps[0]
    assert records[0].steps[0] < long_first and sum(s < long_first for s in records[0].steps) >= 2


def test_a_long_prompt_prefills_a_chunk_per_step_between_the_others_tokens(family_checkpoint):
    llm = pyllm.load(family_checkpoint("llama"), threads=2)
    llm.eos_ids = set()
    clock = [0]
    engine = Engine(llm)
    short = [5, 6, 7]
    long = [int(i) for i in np.random.default_rng(1).integers(3, llm.vocab_size, 2 * PREFILL_CHUNK - 10)]
    _, first = submit(engine, clock, short, max_tokens=12)
    _, second = submit(engine, clock, long, max_tokens=4)
    run_engine(engine, clock)
    # step 0 prefills the short prompt, then its tokens come one a step while the long prompt's
    # two chunks run one a step: its first token comes at step 3
    assert first.steps == list(range(1, 13))
    assert second.steps[0] == 1 + 2
    assert_alone(llm, short, first, max_tokens=12)
    assert_alone(llm, long, second, max_tokens=4)


@pytest.mark.parametrize("which", ["float", "q4_1"])
def test_a_burst_of_short_prompts_is_prefilled_in_one_step_within_the_chunk_budget(which, family_checkpoint,
                                                                                    smollm2_gguf):
    """Prompts arriving together prefill together while their positions fit one chunk's budget, so
    their batch forms at once; a prompt whose chunk does not fit what is left waits a step, and a
    shorter one behind it still goes in. On a tiny float checkpoint and on the real Q4_1 file."""
    source = family_checkpoint("llama") if which == "float" else smollm2_gguf
    llm = pyllm.load(source, threads=2, parallel=5)
    llm.eos_ids = set()
    clock = [0]
    engine = Engine(llm)
    rng = np.random.default_rng(2)
    short = [[int(i) for i in rng.integers(3, llm.vocab_size, n)] for n in (20, 30, 40)]
    big = [int(i) for i in rng.integers(3, llm.vocab_size, PREFILL_CHUNK - 80)]  # 48: over what is left
    tail = [int(i) for i in rng.integers(3, llm.vocab_size, 25)]
    recs = [submit(engine, clock, ids, max_tokens=5)[1] for ids in short + [big, tail]]
    run_engine(engine, clock)
    # step 0 prefills 20 + 30 + 40 + 25 positions (115 of 128); the 48-token prompt goes in at step 1
    assert [r.steps[0] for r in recs] == [1, 1, 1, 2, 1]
    for ids, rec in zip(short + [big, tail], recs):
        assert_alone(llm, ids, rec, max_tokens=5)


def test_a_shared_prefix_is_reused_in_whole_chunks_with_the_same_tokens(real):
    llm = real
    llm.reset()
    prefix = text_ids(llm, PREFILL_CHUNK + 40)
    a, b = prefix + llm.tokenize(" First,", add_special=False), prefix + llm.tokenize(" Then", add_special=False)
    clock = [0]
    engine = Engine(llm)
    _, ra = submit(engine, clock, a, max_tokens=6)
    run_engine(engine, clock)
    before = llm.tokens_processed
    _, rb = submit(engine, clock, b, max_tokens=6)
    run_engine(engine, clock)
    out = rb.end.completion
    assert llm.tokens_processed - before == len(b) - PREFILL_CHUNK + len(out.token_ids) - (out.finish_reason == "length")
    llm.reset()
    assert_alone(llm, a, ra, max_tokens=6)
    llm.reset()
    assert_alone(llm, b, rb, max_tokens=6)


def test_a_cancelled_job_frees_its_slot_at_the_next_step_and_sends_nothing_more(family_checkpoint):
    llm = pyllm.load(family_checkpoint("llama"), threads=2, parallel=2)
    llm.eos_ids = set()
    clock = [0]
    engine = Engine(llm)
    job, cancelled = submit(engine, clock, [5, 6, 7], max_tokens=50)
    _, other = submit(engine, clock, [9, 10], max_tokens=8)
    _, waiting = submit(engine, clock, [11, 12, 13], max_tokens=5)
    for _ in range(4):
        engine.step()
        clock[0] += 1
    assert engine.active == 2 and engine.queued == 1
    job.cancel()
    seen = len(cancelled.pieces)
    engine.step()
    assert engine.active == 2 and engine.queued == 0  # the waiting job took the freed slot
    run_engine(engine, clock)
    assert len(cancelled.pieces) == seen and cancelled.end is None
    assert engine.active == 0 and all(c.owner is None for c in llm.pool.caches)
    assert_alone(llm, [9, 10], other, max_tokens=8)
    assert_alone(llm, [11, 12, 13], waiting, max_tokens=5)


def test_refusals_a_full_queue_a_long_prompt_bad_settings(family_checkpoint):
    llm = pyllm.load(family_checkpoint("llama"), threads=2, n_ctx=32)
    engine = Engine(llm, max_queue=2)
    clock = [0]
    for i in range(engine.slots + 2):  # the free slots' jobs do not count against the queue
        submit(engine, clock, [5 + i], max_tokens=1)
    with pytest.raises(QueueFullError, match=f"{engine.slots + 2} requests are already waiting"):
        submit(engine, clock, [7], max_tokens=1)
    with pytest.raises(pyllm.ContextLengthError, match="33 tokens"):
        Engine(llm).submit(list(range(3, 36)), sampling=SamplingParams(), max_tokens=1, on_event=print)
    with pytest.raises(ValueError, match="max_tokens"):
        Engine(llm).submit([5], sampling=SamplingParams(), max_tokens=-1, on_event=print)
    with pytest.raises(ValueError, match="stop"):
        Engine(llm).submit([5], sampling=SamplingParams(), max_tokens=1, stop=[""], on_event=print)
    run_engine(engine, clock)
    assert engine.active == 0


def test_a_job_whose_callback_fails_ends_with_failed_and_the_others_go_on(family_checkpoint):
    llm = pyllm.load(family_checkpoint("llama"), threads=2)
    clock = [0]
    engine = Engine(llm)
    events = []

    def broken(event):
        events.append(event)
        if isinstance(event, Piece):
            raise RuntimeError("the client went away")

    engine.submit([5, 6], sampling=SamplingParams(), max_tokens=6, on_event=broken)
    _, fine = submit(engine, clock, [7, 8], max_tokens=6)
    run_engine(engine, clock)
    assert isinstance(events[-1], Failed) and "went away" in str(events[-1].error)
    assert_alone(llm, [7, 8], fine, max_tokens=6)
    assert engine.active == 0


def test_the_scheduler_thread_serves_many_submitters_and_runs_calls_between_steps(family_checkpoint):
    llm = pyllm.load(family_checkpoint("qwen2"), threads=2, parallel=3)
    prompts = [[3 + i, 4 + i, 5 + i * 2] for i in range(8)]
    expected = [llm.generate(p, max_tokens=10) for p in prompts]
    sched = Scheduler(llm, max_queue=16)
    sched.start()
    try:
        results: list = [None] * len(prompts)
        done = [threading.Event() for _ in prompts]

        def work(i):
            def on_event(event):
                if not isinstance(event, Piece):
                    results[i] = event
                    done[i].set()
            sched.submit(prompts[i], sampling=SamplingParams(), max_tokens=10, on_event=on_event)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        vectors = sched.call(lambda: llm.embed(["a cat", "a dog"])).result(timeout=60)
        assert vectors.shape == (2, llm.spec.dim)
        assert all(d.wait(timeout=60) for d in done)
        assert [r.completion.token_ids for r in results] == [e.token_ids for e in expected]
        with pytest.raises(ZeroDivisionError):
            sched.call(lambda: 1 / 0).result(timeout=10)
        assert sched.active == 0 and sched.queued == 0 and sched.slots == 3
    finally:
        sched.close()


def test_a_job_whose_cache_a_stream_takes_prefills_its_context_again(family_checkpoint):
    """parallel=2, two engine jobs and a stream on the same model: the stream takes a job's cache
    (the pool is full), the job takes one back and runs its prompt and tokens again — no two
    generations ever share a cache, and every one ends with what it gets alone."""
    llm = pyllm.load(family_checkpoint("llama"), threads=2, parallel=2)
    llm.eos_ids = set()
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    clock = [0]
    engine = Engine(llm)
    records = [submit(engine, clock, p, max_tokens=10)[1] for p in prompts]
    for _ in range(4):
        engine.step()
        clock[0] += 1
    before = llm.tokens_processed
    stream = llm.stream([12, 13, 14], max_tokens=10)
    next(stream)
    assert sum(c.owner is not None for c in llm.pool.caches) == 2 and len(llm.pool.caches) == 2
    run_engine(engine, clock)
    for _ in stream:
        pass
    assert llm.tokens_processed - before > 3 + 10 + 10  # contexts ran again
    for p, rec in zip(prompts, records):
        assert_alone(llm, p, rec, max_tokens=10)
    assert stream.completion.token_ids == llm.generate([12, 13, 14], max_tokens=10).token_ids
