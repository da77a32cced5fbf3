"""Continuous batching: many generations advanced together, one forward step at a time.

Each step (Engine.step):
  1. cancelled jobs leave, their caches freed;
  2. waiting jobs take a free cache of the model's pool (`parallel` of them), reusing the whole
     prefill chunks of the longest prefix any free cache holds (a shared system prompt);
  3. every job whose next-token logits are ready samples its token, emits it, and either finishes
     or joins this step's batch (a job whose token speculation chose joins it as it is);
  4. the batch runs as one forward pass (pl_forward_batch: each weight read once for all rows); a
     job that speculates (pyllm.speculative) runs a round in it: its token and the ones proposed
     after it, each job's proposal weighed against the rows of the whole call (speculative.Share),
     the tokens it takes emitted at once;
  5. prefill chunks run, oldest job first, up to PREFILL_CHUNK positions in all (the first chunk
     always): a long prompt costs the others one chunk's delay per step instead of its whole
     prefill, and a burst of short prompts is in after one step, so their batch forms at once;
  6. the first waiting embedding input runs its next prefill chunk (EmbedJob).

Nothing here changes a job's numbers: its prompt is prefilled in the same position-aligned chunks
every prefill uses (PREFILL_CHUNK), and a batch row takes the decode path of a solo step, so each job gets
exactly the tokens Model.generate gives that prompt alone (greedy, or sampled with the same seed).
A job that speculates keeps that for greedy decoding; sampled, its tokens follow the same distribution,
but which of its steps ran as rounds depends on the other jobs, and so do the draws of its seed.

Engine is the synchronous core (Model.generate over a list drives it); Scheduler runs one on a
background thread for the server and hands events to a callback.
"""
from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import _core
from .checks import check_run_settings
from .errors import QueueFullError
from .generation import Completion, Generation, Piece, StopMatcher
from .kvpool import PREFILL_CHUNK, prefill_chunks
from .sampling import SamplingParams
from .speculative import MAX_DRAFT, Share, costs_of

MAX_STEP_ROWS = 64  # rows of one forward_batch call; more take several calls per step


@dataclass
class Finished:
    """The job's last event: its Completion (the Pieces' texts join to completion.text)."""
    completion: Completion


@dataclass
class Embedded:
    """An embedding job's only event on success: its vector (mean pooled, unit length)."""
    vector: object


@dataclass
class Failed:
    """The job's last event when the engine could not run it."""
    error: BaseException


class Job:
    """One generation in an engine. cancel() may be called from any thread."""

    def __init__(self, model, ids: list[int], params: SamplingParams, max_tokens: int, stop,
                 logprobs: int | None, on_event: Callable, grammar: str | None = None, speculation=None):
        self.gen = Generation(model, ids, params, max_tokens, stop, logprobs, grammar)
        self.speculator = speculation.start(model, self.gen) if speculation is not None else None
        self.on_event = on_event
        self.cache = None         # the pool's Cache while the job holds one
        self.logits = None        # next-token logits once the prompt is in
        self.chosen = False       # a speculative round chose next_token: no logits to sample
        self.next_token = -1      # the token this step's batch row runs
        self.forced: list[int] = []  # tokens a constraint forced after it: the job runs alone
        self.cancelled = False

    def cancel(self) -> None:
        """Ends the job at the engine's next step; no more events are sent."""
        self.cancelled = True

    @property
    def prefilling(self) -> bool:
        return self.cache is not None and self.logits is None and not self.chosen

    def take(self, pieces: list) -> bool:
        """Emits the tokens a speculative round made (speculator.judge's pieces); whether the job
        goes on (next_token then the first token its cache lacks, chosen; forced any after it that
        a constraint forced)."""
        for piece in pieces:
            if piece is not None:
                self.on_event(piece)
        if self.gen.finish_reason is not None:
            self.finish()
            return False
        pending = self.gen.generated[self.cache.seq.pos - len(self.gen.ids):]  # the prompt is in the cache
        self.next_token, self.forced, self.chosen = pending[0], pending[1:], True
        return True

    def choose(self) -> int | None:
        """Samples, emits and records the next token; None when the job ends instead of stepping."""
        piece = self.gen.step(self.logits)
        if piece is not None:
            self.on_event(piece)
        if self.gen.finish_reason is not None:
            self.finish()
            return None
        self.forced = piece.forced
        return piece.token_id

    def finish(self) -> None:
        tail, completion = self.gen.finish()
        if tail:
            self.on_event(Piece(tail, -1, None))
        self.on_event(Finished(completion))


class EmbedJob:
    """One input of an embeddings request (Model.embed's mean pooling, unit length), run through
    its own sequence one prefill chunk per engine step, so a long input delays the generations
    as a prompt's prefill does rather than by its whole forward pass."""

    def __init__(self, ids: list[int], on_event: Callable):
        self.ids = ids
        self.on_event = on_event
        self.cancelled = False
        self.seq = None
        self.total = None  # the sum of the final hidden states so far (float64)

    def cancel(self) -> None:
        self.cancelled = True

    def advance(self, core) -> bool:
        """Runs the next chunk of the input; True once every position is in."""
        if self.seq is None:
            self.seq = _core.CoreSequence(core, len(self.ids))
        a = self.seq.pos
        b = prefill_chunks(a, len(self.ids))[0][1]
        _, out = self.seq.forward_traced(self.ids[a:b], {"out_norm": True}, logits=False)
        rows = out["out_norm"].astype(np.float64).sum(axis=0)
        self.total = rows if self.total is None else self.total + rows
        return b == len(self.ids)

    def vector(self) -> np.ndarray:
        """The input's vector, once advance() is done; its sequence (a KV cache as long as the
        input) is freed here rather than when the request lets go of its jobs."""
        self.seq = None
        mean = self.total / len(self.ids)
        norm = np.linalg.norm(mean)
        return (mean / norm if norm > 0 else mean).astype(np.float32)


class Engine:
    """Jobs waiting and running on one model; step() advances all of them by one token, and the
    first embedding input by one prefill chunk (embedding inputs count against max_queue like
    waiting generations, until their vector is out)."""

    def __init__(self, model, max_queue: int | None = None):
        self.model = model
        self.pool = model.pool
        self.max_queue = max_queue
        self.slots = self.pool.size
        self.waiting: deque[Job] = deque()
        self.embeds: deque[EmbedJob] = deque()
        self.running: list[Job] = []  # holding a cache: prefilling, then decoding
        self._lock = threading.Lock()  # guards waiting against submitting threads
        # a step's rows: one a job, and as many as a round proposes where jobs speculate
        self._work = self.pool.batch_sequence(min(self.slots * (1 + MAX_DRAFT), MAX_STEP_ROWS))

    def submit(self, prompt_ids, *, sampling: SamplingParams, max_tokens: int, stop=None,
               logprobs: int | None = None, on_event: Callable, grammar: str | None = None,
               speculative=None) -> Job:
        """Queues a generation of prompt_ids; on_event(event) is called from the thread running
        step(): zero or more Pieces, then one Finished or Failed. grammar (constraints.output_grammar)
        constrains its output; speculative as Model.generate's."""
        model = self.model
        ids = model.prompt_ids(prompt_ids)  # ContextLengthError when it does not fit
        check_run_settings(max_tokens, logprobs)
        sampling.validate(model.vocab_size)
        StopMatcher(stop)
        job = Job(model, ids, sampling, max_tokens, stop, logprobs, on_event, grammar,
                  model.speculation(speculative))
        self._enqueue(self.waiting, job)
        return job

    def submit_embedding(self, ids: list[int], *, on_event: Callable) -> EmbedJob:
        """Queues one embedding input (ids that fit the context); on_event gets Embedded or Failed."""
        job = EmbedJob(self.model.prompt_ids(ids, "input"), on_event)
        self._enqueue(self.embeds, job)
        return job

    def _enqueue(self, queue: deque, job) -> None:
        with self._lock:
            room = self.max_queue
            if room is not None and queue is self.waiting:
                # generations that the next step admits into free slots do not wait: a request of
                # slots + max_queue jobs fits an idle engine however its submits and the steps interleave
                room += max(0, self.slots - len(self.running))
            if room is not None and self.queued >= room:
                raise QueueFullError(f"{self.queued} requests are already waiting (the queue holds "
                                     f"{self.max_queue} besides the free slots); try again later")
            queue.append(job)

    def cancel(self, job) -> None:
        """Ends job: one still waiting leaves the queue at once (its place is free for the next
        request); a running one leaves at the next step."""
        job.cancel()
        self._dequeue(job)

    def _dequeue(self, job) -> None:
        with self._lock:
            for queue in (self.waiting, self.embeds):
                if job in queue:
                    queue.remove(job)

    @property
    def active(self) -> int:
        return len(self.running)

    @property
    def queued(self) -> int:
        return len(self.waiting) + len(self.embeds)

    def busy(self) -> bool:
        return bool(self.running or self.waiting or self.embeds)

    def step(self) -> None:
        with self.pool.lock:
            self._drop_cancelled()
            self._admit()
            self._reclaim_taken_caches()
            batch = [j for j in list(self.running) if j.chosen or (j.logits is not None and self._choose(j))]
            self._decode(batch)
            self._prefill_chunks()
            self._embed_chunk()

    def _embed_chunk(self) -> None:
        with self._lock:
            job = self.embeds[0] if self.embeds else None
        if job is None:
            return
        try:
            if not job.advance(self.model.core):
                return
            event = Embedded(job.vector())
        except Exception as e:  # noqa: BLE001 — the job fails, the engine goes on
            event = Failed(e)
        self._dequeue(job)
        job.on_event(event)

    def _drop_cancelled(self) -> None:
        with self._lock:
            self.waiting = deque(j for j in self.waiting if not j.cancelled)
        for job in [j for j in self.running if j.cancelled]:
            self._leave(job)

    def _admit(self) -> None:
        while len(self.running) < self.slots and self.pool.has_free():
            with self._lock:
                if not self.waiting:
                    return
                job = self.waiting.popleft()
            if job.gen.finish_reason is not None:  # max_tokens=0, as a solo generation: no prefill
                try:
                    job.finish()
                except Exception as e:  # noqa: BLE001
                    job.on_event(Failed(e))
                continue
            job.cache = self.pool.take_prefix(job.gen.ids, job)
            self.running.append(job)

    def _reclaim_taken_caches(self) -> None:
        """A generation outside this engine (a stream on the same model) may take the stalest cache
        when the pool is full; a job that lost its cache takes another and prefills its context
        again, as a solo generation does."""
        for job in self.running:
            if not self.pool.holds(job.cache, job):
                job.cache = self.pool.take_prefix(job.gen.context(), job)
                job.logits, job.chosen = None, False

    def _choose(self, job: Job) -> bool:
        """Whether the job goes on with the token it samples (emitted by choose)."""
        try:
            token = job.choose()
        except Exception as e:  # noqa: BLE001 — the job fails, the engine goes on
            self._fail(job, e)
            return False
        if token is None:
            self._leave(job)
            return False
        job.next_token = token
        return True

    def _decode(self, batch: list[Job]) -> None:
        for job in [j for j in batch if j.forced]:  # several tokens: a call of their own, as solo
            try:
                job.logits, job.chosen = self.pool.step(job.cache, job.next_token, job.forced), False
            except Exception as e:  # noqa: BLE001
                self._fail(job, e)
        batch = [j for j in batch if not j.forced]
        for start in range(0, len(batch), MAX_STEP_ROWS):
            group = batch[start:start + MAX_STEP_ROWS]
            if any(j.speculator is not None for j in group):
                self._decode_rounds(group)
                continue
            try:
                logits = self.pool.step_batch(self._work, [j.cache for j in group], [j.next_token for j in group])
            except Exception as e:  # noqa: BLE001
                for job in group:
                    self._fail(job, e)
                continue
            for job, row in zip(group, logits):
                job.logits, job.chosen = row, False

    def _decode_rounds(self, group: list[Job]) -> None:
        """One call for the group's rows: each job's token, and after it the tokens the jobs that
        speculate propose, weighed against the rows of the whole call. A job that speculates takes
        what its rows make at once; the others get their logits, as in a plain batched step."""
        share = Share(rows=len(group), tokens=len(group), capacity=self._work.n_batch)
        jobs, tokens = [], []
        for job in group:
            try:
                run = (job.speculator.prepare(job.cache, share) if job.speculator is not None
                       else [job.next_token])
            except Exception as e:  # noqa: BLE001 — a proposer that failed fails its job alone
                self._fail(job, e)
                continue
            jobs.append(job)
            tokens.append(run)
        if not jobs:
            return
        counts = [len(run) for run in tokens]
        begin = time.perf_counter()
        try:
            logits = self.pool.step_batch(self._work, [j.cache for j in jobs], [t for run in tokens for t in run],
                                          counts)
        except Exception as e:  # noqa: BLE001
            for job in jobs:
                self._fail(job, e)
            return
        if any(j.speculator is not None and j.speculator.timed for j in jobs):
            costs_of(self.model).record(sum(counts), time.perf_counter() - begin)
        first = 0
        for job, count in zip(jobs, counts):
            rows, first = logits[first:first + count], first + count
            if job.speculator is None:
                job.logits, job.chosen = rows[0], False
                continue
            try:
                going = job.take(job.speculator.judge(job.cache, rows))
            except Exception as e:  # noqa: BLE001
                self._fail(job, e)
                continue
            job.logits = None
            if not going:
                self._leave(job)

    def _prefill_chunks(self) -> None:
        budget = PREFILL_CHUNK
        for job in [j for j in self.running if j.prefilling]:
            context = job.gen.context()
            a, b = prefill_chunks(job.cache.seq.pos, len(context))[0]
            if b - a > budget and budget < PREFILL_CHUNK:
                continue  # a later, shorter prompt may still fit this step
            budget -= b - a
            try:
                logits = self.pool.prefill_to(job.cache, context, b)
            except Exception as e:  # noqa: BLE001
                self._fail(job, e)
                continue
            if b == len(context):
                job.logits = logits
            if budget <= 0:
                return

    def _leave(self, job: Job) -> None:
        self.running.remove(job)
        if job.cache is not None:
            self.pool.release(job.cache, job)
        job.cache = job.logits = None

    def _fail(self, job: Job, error: BaseException) -> None:
        if job in self.running:
            self._leave(job)
        job.on_event(Failed(error))

    def fail_all(self, error: BaseException) -> None:
        """Ends every job with error: what a step that went wrong leaves behind cannot be trusted."""
        with self._lock:
            jobs, self.waiting, self.embeds = list(self.waiting) + list(self.embeds), deque(), deque()
        for job in list(self.running) + jobs:
            try:
                self._fail(job, error)
            except Exception:  # noqa: BLE001 — a failing callback must not stop the others' ends
                pass


class Scheduler:
    """An Engine stepped by a thread of its own: the server's view of a model.

    >>> sched = Scheduler(llm); sched.start()  # doctest: +SKIP
    >>> job = sched.submit(llm.tokenize("Hi"), sampling=SamplingParams(), max_tokens=8,
    ...                    on_event=print)  # doctest: +SKIP
    """

    def __init__(self, model, max_queue: int = 64):
        self.engine = Engine(model, max_queue=max_queue)
        self._wake = threading.Condition()
        self._calls: deque = deque()
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> int:
        return self.engine.active

    @property
    def queued(self) -> int:
        return self.engine.queued

    @property
    def slots(self) -> int:
        return self.engine.slots

    @property
    def max_queue(self) -> int:
        return self.engine.max_queue

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="pyllm-scheduler", daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()

    def submit(self, prompt_ids, *, sampling: SamplingParams, max_tokens: int, stop=None,
               logprobs: int | None = None, on_event: Callable, grammar: str | None = None) -> Job:
        """As Engine.submit; events arrive on the scheduler's thread."""
        job = self.engine.submit(prompt_ids, sampling=sampling, max_tokens=max_tokens, stop=stop,
                                 logprobs=logprobs, on_event=on_event, grammar=grammar)
        self._notify()
        return job

    def submit_embedding(self, ids: list[int], *, on_event: Callable) -> EmbedJob:
        """As Engine.submit_embedding; the event arrives on the scheduler's thread."""
        job = self.engine.submit_embedding(ids, on_event=on_event)
        self._notify()
        return job

    def call(self, fn: Callable) -> concurrent.futures.Future:
        """Runs fn() on the scheduler's thread between two steps (work that needs the model to
        itself, such as embeddings); its result or exception comes back through the Future."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._wake:
            self._calls.append((fn, future))
            self._wake.notify()
        return future

    def cancel(self, job) -> None:
        self.engine.cancel(job)
        self._notify()

    def _notify(self) -> None:
        with self._wake:
            self._wake.notify()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not (self._stopping or self._calls or self.engine.busy()):
                    self._wake.wait()
                if self._stopping:
                    return
                calls, self._calls = list(self._calls), deque()
            for fn, future in calls:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as e:  # noqa: BLE001 — handed to the caller
                        future.set_exception(e)
            if self.engine.busy():
                try:
                    self.engine.step()
                except Exception as e:  # noqa: BLE001 — the thread must outlive a bad step
                    self.engine.fail_all(e)


def run_to_completion(model, prompts: list[list[int]], params: SamplingParams, max_tokens: int, stop,
                      logprobs, grammar: str | None = None, speculative=None) -> list[Completion]:
    """Model.generate over a list: every prompt a job of one engine, stepped until all finish."""
    results: list[Completion | None] = [None] * len(prompts)

    def collect(i: int) -> Callable:
        def on_event(event) -> None:
            if isinstance(event, Finished):
                results[i] = event.completion
            elif isinstance(event, Failed):
                raise event.error
        return on_event

    engine = Engine(model)
    for i, ids in enumerate(prompts):
        engine.submit(ids, sampling=params, max_tokens=max_tokens, stop=stop, logprobs=logprobs,
                      on_event=collect(i), grammar=grammar, speculative=speculative)
    while engine.busy():
        engine.step()
    return results
