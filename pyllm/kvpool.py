"""The KV caches of one model: acquire, longest-prefix reuse, release, and prefill's chunking rules.

Generations that interleave (streams, threads sharing the model, the jobs of a scheduler) each
hold a cache of their own, up to `size` caches made as they are needed; past that the stalest is
taken, and the generation that held it runs its context again at its next step (`holds` tells
it). Callers run every step under `lock`.
"""
from __future__ import annotations

import threading

import numpy as np

from . import _core

# Prompts are prefilled in chunks whose edges fall on multiples of this many positions. A token's
# keys/values depend on the shape of the forward call that computed them (sgemm's blocking changes
# with the number of tokens; short calls multiply 8-bit activations), so position-aligned chunks
# make a prompt's cache the same bits however it is reached: alone, prefilled a chunk at a time
# between other sequences' decode steps, or after a reused prefix — which is reused in whole
# chunks for the same reason. 128 keeps sgemm's tiles wide (a 512-token prompt prefills at ~90% of
# the speed of one call) while letting long prompts interleave with other streams.
PREFILL_CHUNK = 128


def prefill_chunks(start: int, end: int) -> list[tuple[int, int]]:
    """The forward calls that prefill positions [start, end): cut at multiples of PREFILL_CHUNK."""
    edges = [start] + list(range((start // PREFILL_CHUNK + 1) * PREFILL_CHUNK, end, PREFILL_CHUNK)) + [end]
    return list(zip(edges[:-1], edges[1:]))


def whole_chunks(ids: list[int]) -> list[int]:
    """The ids of a prefill's whole aligned chunks: the part of its cache another prompt may reuse."""
    return ids[:len(ids) - len(ids) % PREFILL_CHUNK]


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Cache:
    """One KV cache of the pool: the ids of the whole prefill chunks it holds (what another prompt
    may reuse), and the generation using it (None: free, kept for a later prompt that shares its
    prefix)."""

    def __init__(self, seq: _core.CoreSequence):
        self.seq = seq
        self.ids: list[int] = []
        self.owner: object | None = None
        self.used = 0  # when it was last used, for taking the stalest one when none is free


class KVPool:
    """The caches of one model, n_ctx positions each, at most size of them."""

    def __init__(self, core: _core.CoreModel, n_ctx: int, size: int):
        self.core = core
        self.n_ctx = n_ctx
        self.size = size
        self.caches: list[Cache] = [Cache(_core.CoreSequence(core, n_ctx))]
        self.lock = threading.RLock()
        self._clock = 0

    @property
    def tokens_processed(self) -> int:
        return sum(c.seq.tokens_processed for c in self.caches)

    def batch_sequence(self, n_batch: int) -> _core.CoreSequence:
        """A work sequence for step_batch, running up to n_batch caches' rows in one call."""
        return _core.CoreSequence(self.core, self.n_ctx, n_batch=n_batch)

    def reset(self) -> None:
        """Empties every cache (a generation under way runs its context again at its next step)."""
        with self.lock:
            for cache in self.caches:
                cache.seq.truncate(0)
                cache.ids = []
                cache.owner = None

    def acquire(self, ids: list[int], owner: object | None) -> Cache:
        """A cache for a generation (owner) about to run ids: the free one holding the longest
        prefix of them; when none is free, a new one while the pool has room (so one generation
        at a time uses one cache's memory), else the stalest."""
        with self.lock:
            free = [c for c in self.caches if c.owner is None]
            if free:
                cache = max(free, key=lambda c: (shared_prefix(c.ids, ids), -c.used))
            elif len(self.caches) < self.size:
                cache = Cache(_core.CoreSequence(self.core, self.n_ctx))
                self.caches.append(cache)
            else:
                cache = min(self.caches, key=lambda c: c.used)
            cache.owner = owner
            self._touch(cache)
            return cache

    def has_free(self) -> bool:
        """Whether acquire can give a cache without taking one a generation holds."""
        return len(self.caches) < self.size or any(c.owner is None for c in self.caches)

    def holds(self, cache: Cache, owner: object) -> bool:
        """Whether owner still holds cache (no other generation took it)."""
        return cache.owner is owner

    def release(self, cache: Cache, owner: object) -> None:
        with self.lock:
            if cache.owner is owner:
                cache.owner = None

    def take_prefix(self, ids: list[int], owner: object | None) -> Cache:
        """A cache for owner, truncated to the whole chunks it holds of ids (never all of ids: the
        last token must run to give logits)."""
        with self.lock:
            cache = self.acquire(ids, owner)
            common = min(shared_prefix(cache.ids, ids), len(ids) - 1)
            common -= common % PREFILL_CHUNK
            cache.seq.truncate(common)
            cache.ids = ids[:common]
            return cache

    def prefill(self, ids: list[int], owner: object | None) -> tuple[Cache, np.ndarray]:
        """A cache for owner holding ids, and the logits after them; the longest prefix of ids a
        free cache holds is reused."""
        with self.lock:
            cache = self.take_prefix(ids, owner)
            for _, end in prefill_chunks(cache.seq.pos, len(ids)):
                logits = self.prefill_to(cache, ids, end)
            return cache, logits

    def prefill_to(self, cache: Cache, context: list[int], end: int) -> np.ndarray:
        """Runs context[cache.seq.pos:end] (one chunk of prefill_chunks) in cache; the logits of its
        last position."""
        logits = cache.seq.forward(context[cache.seq.pos:end])
        cache.ids = whole_chunks(context[:end])
        self._touch(cache)
        return logits

    def all_logits(self, ids: list[int]) -> np.ndarray:
        """Logits (len(ids), vocab) of ids run from position 0, in prefill's chunks."""
        with self.lock:
            cache = self.acquire(ids, None)
            cache.seq.truncate(0)
            cache.ids = []
            out = np.concatenate([cache.seq.forward(ids[a:b], all_logits=True)
                                  for a, b in prefill_chunks(0, len(ids))])
            cache.ids = whole_chunks(ids)
            return out

    def step(self, cache: Cache, token: int, forced: list[int] = ()) -> np.ndarray:
        """Decodes one token in cache (and the tokens a constraint forced after it, in the same
        call). Decoded keys/values are not reusable: a prefill computes those positions
        differently, so cache.ids does not grow."""
        logits = cache.seq.forward([token, *forced])
        self._touch(cache)
        return logits

    def verify(self, cache: Cache, tokens: list[int]) -> np.ndarray:
        """Runs tokens (those the cache lacks: a chosen token, any a constraint forced after it; then
        the ones proposed after them) in cache as one forward call: logits (len(tokens), vocab), each
        row the bits of that token's own step when len(tokens) is at most cache.seq.exact_rows. The
        caller truncates the cache to the tokens it keeps."""
        logits = cache.seq.forward(tokens, all_logits=True)
        self._touch(cache)
        return logits

    def step_batch(self, work: _core.CoreSequence, caches: list[Cache], tokens: list[int],
                   counts: list[int] | None = None) -> np.ndarray:
        """Decodes one token in each cache (counts[i] tokens in caches[i], tokens holding each
        cache's in turn) in one forward call of work (from batch_sequence); logits (len(tokens),
        vocab), each row the bits of that token's own step. A speculative round's caller truncates
        a cache to the tokens it keeps."""
        logits = work.forward_batch([c.seq for c in caches], np.asarray(tokens), counts)
        for cache in caches:
            self._touch(cache)
        return logits

    def _touch(self, cache: Cache) -> None:
        self._clock += 1
        cache.used = self._clock
