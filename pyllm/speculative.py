"""Speculative decoding, exact: a proposer guesses the next tokens, one forward call of the model
checks them all (reading the weights once for all of them), and only what the model itself would
have produced is kept.

    lookup       n-gram match against the prompt and the text so far: no second model, pays off
                 where the answer copies its prompt (editing code, summaries, extraction)
    draft:FILE   a smaller model with the same tokenizer, on the target's thread pool
    self:N       the model's own first N layers, then its final norm and head (early exit)

A round: the token just chosen (t) and k proposed tokens d1..dk run as one forward call of k + 1
rows; row i is the next-token distribution after t, d1..di, so it judges d(i+1) and the last row
gives one more token when every draft is taken. The cache keeps the positions of the tokens taken;
the rest are forgotten by truncation. The cache is linear (n_ctx positions; a sliding window only
limits the keys a query reads, csrc/attention.c), so nothing is overwritten that a rollback would
have to restore.

Exactness. A row of a forward call of several tokens is the bits of that token's own one-token step
(every quantized matmul multiplies 8-bit activations at any batch size; float weights stay off
sgemm below its threshold: CoreSequence.exact_rows caps k + 1), so greedy speculation makes exactly
the plain path's tokens, logprobs and text. Sampled, each draft d is taken with probability
min(1, p(d) / q(d)) and a rejection draws from max(0, p - q), renormalised (Leviathan et al. 2023,
Chen et al. 2023): p is the target's distribution after pyllm's samplers (Sampler.distribution: the
same penalties, temperature, top-k/p, min-p, typical-p), q the draft's under the same settings (a
point mass for lookup proposals and greedy drafts). Every draw comes from the generation's seeded
generator in a fixed order and every decision follows from the logits and the counts of taken
tokens, never from timings, so a seed gives the same tokens on any thread count.

Adaptive: k grows by 2 after a round that takes every draft and shrinks by 1 otherwise; a round's
gain, the tokens it made per step's worth of work (estimated from the bytes each forward reads),
is averaged, and while that average stays under 1 speculation pauses for a number of plain steps
that doubles each time it does not pay.
"""
from __future__ import annotations

import os

import numpy as np

from . import _core
from .kvpool import shared_prefix
from .sampling import Sampler, _inverse_cdf

MAX_DRAFT = 12  # the most tokens one round proposes
START_DRAFT = 4
# The extra cost of a verified row, as a share of a one-token step: decode reads the weights once
# for all rows, so a row adds its arithmetic (SmolLM2 Q4_1 on 2 threads: see benchmarks/RESULTS.md).
ROW_COST = 0.12
GAIN_MEMORY = 0.8  # the weight of the past in the running average of a round's gain
GAIN_START = 3.0  # an optimistic start: a proposer gets a few rounds before a miss pauses it
FIRST_PAUSE, LONGEST_PAUSE = 8, 256  # plain steps while speculation does not pay
LOOKUP_NGRAMS = (4, 3, 2, 1)  # the n-gram lengths a lookup tries, longest first


class Speculation:
    """How a model speculates: "lookup", "self" (layers) or "draft" (a Model); start() makes the
    state of one generation. Build one with parse()."""

    def __init__(self, kind: str, *, layers: int = 0, draft=None, name: str = ""):
        self.kind = kind
        self.layers = layers
        self.draft = draft
        self.name = name or kind

    def __repr__(self) -> str:
        return f"Speculation({self.name!r})"

    def start(self, model, gen) -> "Speculator":
        """gen's Speculator, which gen keeps (its usage reports it)."""
        if self.kind == "lookup":
            proposer = PromptLookup()
        elif self.kind == "self":
            proposer = SelfDraft(self.layers, read_cost(model, self.layers))
        else:
            proposer = DraftModel(self.draft, model.n_ctx, read_cost(self.draft) / read_cost(model))
        gen.speculator = Speculator(self.name, proposer, gen, model.vocab_size)
        return gen.speculator


def parse(value, model) -> Speculation | None:
    """The Speculation value names for model: "lookup", "self:N" (N in [1, layers)), a Model (the
    draft: pyllm.load(target, speculative="draft:FILE") loads one), a Speculation as it is; None,
    False, "" or "off" for none."""
    if value is None or value is False or value == "" or value == "off":
        return None
    if isinstance(value, Speculation):
        return value
    if isinstance(value, str):
        kind, _, arg = value.partition(":")
        if kind == "lookup" and not arg:
            return Speculation("lookup")
        if kind == "self" and arg:
            layers = int(arg) if arg.isdigit() else 0
            if not 1 <= layers < model.spec.n_layers:
                raise ValueError(f"self:N needs N in [1, {model.spec.n_layers - 1}] (the model has "
                                 f"{model.spec.n_layers} layers), got {value!r}")
            return Speculation("self", layers=layers, name=value)
        if kind == "draft":
            raise ValueError(f"{value!r}: pass the draft as a loaded Model, or load the target with "
                             f"pyllm.load(..., speculative={value!r}), which loads the draft once")
        raise ValueError(f"speculative must be 'lookup', 'self:N' or 'draft:FILE', got {value!r}")
    if hasattr(value, "tokenizer") and hasattr(value, "core"):
        return with_draft(model, value)
    raise ValueError(f"speculative must be 'lookup', 'self:N', 'draft:FILE' or a Model, got {type(value).__name__}")


def with_draft(model, draft, name: str = "") -> Speculation:
    """A draft model's Speculation after checking it can propose for model: the same tokens."""
    check_same_tokenizer(model, draft)
    if draft.threads == model.threads:
        draft.core.share_pool(model.core)
    return Speculation("draft", draft=draft, name=name or f"draft:{os.path.basename(draft.source.rstrip('/'))}")


def check_same_tokenizer(model, draft) -> None:
    a, b = model.tokenizer, draft.tokenizer
    sample = "def f(x):\n    return x * 2  # Über naïve café, 東京 🙂"
    same = a.n_ids == b.n_ids and a.encode(sample) == b.encode(sample)
    step = max(1, a.n_ids // 4096)
    same = same and all(a.decode([i]) == b.decode([i]) for i in range(0, a.n_ids, step))
    if not same:
        raise ValueError(f"the draft {draft.source} has another tokenizer than {model.source}: a draft must "
                         f"give the same ids for the same text")


def read_cost(model, layers: int | None = None) -> float:
    """Bytes of weights a one-token step reads (the head, and the first layers' share of the rest
    when layers is given): decode's cost, which is memory-bound."""
    matrices = [w for w in model.weights.values() if len(w.shape) == 2]
    vocab_sized = sorted((w.nbytes for w in matrices if model.spec.vocab_size in w.shape), reverse=True)
    total = sum(w.nbytes for w in matrices) - sum(vocab_sized[1:])  # an untied embedding is read by row
    head = vocab_sized[0] if vocab_sized else 0
    if layers is None:
        return float(max(total, 1))
    return (head + (total - head) * layers / model.spec.n_layers) / max(total, 1)


class PromptLookup:
    """Proposes what followed the last earlier occurrence of the context's final n-gram (the
    longest of LOOKUP_NGRAMS that occurred), from an index that grows with the context."""

    cost = 0.0

    def __init__(self):
        self.seen = 0  # context tokens indexed
        self.index: dict[tuple, int] = {}  # n-gram -> where the tokens after its latest occurrence start

    def propose(self, context: list[int], k: int, choose) -> tuple[list[int], list]:
        # an n-gram ending at e is indexed once a token follows it: e < len(context)
        for end in range(max(self.seen, 1), len(context)):
            for n in LOOKUP_NGRAMS:
                if end >= n:
                    self.index[tuple(context[end - n:end])] = end
        self.seen = max(self.seen, len(context))
        for n in LOOKUP_NGRAMS:
            at = self.index.get(tuple(context[-n:])) if len(context) >= n else None
            if at is not None:
                drafts = context[at:at + k]
                return drafts, [None] * len(drafts)
        return [], []


class DraftModel:
    """A smaller model's own greedy (or sampled) continuation, k tokens, from a cache of its own
    that keeps the prefix it shares with the context between rounds."""

    def __init__(self, draft, n_ctx: int, cost: float):
        self.draft = draft
        self.seq = _core.CoreSequence(draft.core, n_ctx)
        self.held: list[int] = []  # the tokens the draft's cache holds
        self.cost = cost

    def propose(self, context: list[int], k: int, choose) -> tuple[list[int], list]:
        keep = min(shared_prefix(self.held, context), len(context) - 1)
        self.seq.truncate(keep)
        logits = self.seq.forward(context[keep:])
        drafts, qs = [], []
        for i in range(k):
            token, q = choose(logits, drafts)
            drafts.append(token)
            qs.append(q)
            if i < k - 1:
                logits = self.seq.forward([token])
        self.held = context + drafts[:-1]
        return drafts, qs


class SelfDraft:
    """The target's first layers, then its final norm and head, run in the generation's own cache:
    those layers' keys and values at a new position are the ones the verifying call writes there,
    and the positions are forgotten before it runs."""

    def __init__(self, layers: int, cost: float):
        self.layers = layers
        self.cost = cost
        self.seq = None  # the generation's cache, set by the Speculator before each round

    def propose(self, context: list[int], k: int, choose) -> tuple[list[int], list]:
        start = self.seq.pos  # the cache holds every token of the context but the last
        logits = self.seq.forward(context[-1:], n_layers=self.layers)
        drafts, qs = [], []
        try:
            for i in range(k):
                token, q = choose(logits, drafts)
                drafts.append(token)
                qs.append(q)
                if i < k - 1:
                    logits = self.seq.forward([token], n_layers=self.layers)
        finally:
            self.seq.truncate(start)
        return drafts, qs


class Speculator:
    """One generation's speculation: its proposer, how many tokens to propose, and what was
    proposed and taken (usage())."""

    def __init__(self, name: str, proposer, gen, vocab_size: int):
        self.name = name
        self.vocab_size = vocab_size
        self.proposer = proposer
        self.gen = gen
        self.draft_sampler = Sampler(gen.sampler.params)  # q: the same settings on the draft's logits
        self.k = START_DRAFT
        self.proposed = self.accepted = 0
        self.steps = 0  # forward calls of the model while decoding: plain steps and verifying calls
        self.gain = GAIN_START
        self.paused = 0
        self.pause = FIRST_PAUSE

    def usage(self) -> dict:
        """What a Completion's usage adds: OpenAI's prediction counts, and the proposer's: tokens
        proposed and accepted, and the model's forward calls after the prompt (plain decoding makes
        a token per call)."""
        return {"completion_tokens_details": {"accepted_prediction_tokens": self.accepted,
                                              "rejected_prediction_tokens": self.proposed - self.accepted},
                "speculative": {"proposer": self.name, "proposed": self.proposed, "accepted": self.accepted,
                                "steps": self.steps}}

    def round(self, pool, cache, token: int) -> np.ndarray:
        """Runs token (just chosen) and this round's drafts in cache as one forward call; the rows
        of logits, one per token run. Call under pool.lock; then judge(rows)."""
        gen = self.gen
        self.steps += 1
        room = min(gen.max_tokens - len(gen.generated),  # the last row would go unused past these
                   gen.n_ctx - cache.seq.pos - 1, cache.seq.exact_rows - 1)
        self.drafts, self.qs = [], []
        if self.paused:
            self.paused -= 1
        elif room > 0:
            if isinstance(self.proposer, SelfDraft):
                self.proposer.seq = cache.seq
            self.drafts, self.qs = self.proposer.propose(gen.context(), min(self.k, room), self._choose)
        if not self.drafts:
            return pool.step(cache, token)[None]
        return pool.verify(cache, [token] + self.drafts)

    def judge(self, cache, rows: np.ndarray) -> list:
        """The Pieces (or a None at an end of sequence) of the tokens this round makes: the drafts
        taken, then the target's own token. The cache keeps only the positions of the tokens taken;
        the last Piece's token is not in it yet."""
        gen, drafts = self.gen, self.drafts
        if not drafts:  # a plain step
            return [gen.step(rows[-1])]
        start = cache.seq.pos - len(rows)
        pieces = []
        for i, draft in enumerate(drafts):
            token = None if gen.sampler.params.greedy else self._test(rows[i], draft, self.qs[i])
            piece = gen.step(rows[i], token)  # greedy: the plain path's own step, the same token
            pieces.append(piece)
            taken = piece is not None and piece.token_id == draft
            if not taken or gen.finish_reason is not None:
                self._adapt(len(drafts), i + taken)
                cache.seq.truncate(start + 1 + i)
                return pieces
        self._adapt(len(drafts), len(drafts))
        pieces.append(gen.step(rows[-1]))
        return pieces

    def _choose(self, logits: np.ndarray, drafts: list[int]) -> tuple[int, tuple | None]:
        """A draft token from a proposer's logits and its q: greedy, the argmax after the penalties
        (q a point mass: None); sampled, a draw from the draft's distribution."""
        gen = self.gen
        logits = fit_vocabulary(logits, self.vocab_size)
        if gen.sampler.params.greedy:
            return self.draft_sampler.sample(logits, gen.ids, gen.generated + drafts), None
        ids, probs = self.draft_sampler.distribution(logits, gen.ids, gen.generated + drafts)
        return int(ids[_inverse_cdf(probs, gen.sampler.rng.random())]), (ids, probs)

    def _test(self, row: np.ndarray, draft: int, q: tuple | None) -> int:
        """The token rejection sampling takes at this row: draft with probability min(1, p/q),
        else a draw from max(0, p - q), renormalised."""
        gen = self.gen
        ids, p = gen.sampler.distribution(row, gen.ids, gen.generated)
        dense_p = np.zeros(row.size)
        dense_p[ids] = p
        dense_q = np.zeros(row.size)
        if q is None:
            dense_q[draft] = 1.0
        else:
            dense_q[q[0]] = q[1]
        if gen.sampler.rng.random() * dense_q[draft] < dense_p[draft]:
            return draft
        # rejected, so p(draft) < q(draft): the rest has mass, none of it on draft
        return _inverse_cdf(np.maximum(dense_p - dense_q, 0.0), gen.sampler.rng.random())

    def _adapt(self, proposed: int, taken: int) -> None:
        self.proposed += proposed
        self.accepted += taken
        self.k = min(self.k + 2, MAX_DRAFT) if taken == proposed else max(1, self.k - 1)
        gain = (1 + taken) / (1 + ROW_COST * proposed + self.proposer.cost * proposed)
        self.gain = GAIN_MEMORY * self.gain + (1 - GAIN_MEMORY) * gain
        if self.gain >= 1:
            self.pause = FIRST_PAUSE
        else:
            self.paused, self.pause = self.pause, min(2 * self.pause, LONGEST_PAUSE)
            self.gain = 1.0


def fit_vocabulary(logits: np.ndarray, vocab_size: int) -> np.ndarray:
    """A draft's logits over the target's ids: cut, or padded with a logit far below the rest
    (a draft's padded vocabulary rows hold no token of the shared tokenizer)."""
    if logits.size == vocab_size:
        return logits
    if logits.size > vocab_size:
        return logits[:vocab_size]
    return np.concatenate([logits, np.full(vocab_size - logits.size, logits.min() - 1e4, np.float32)])


def decode(pool, gen):
    """Model._decode with gen's Speculator: text pieces until gen finishes."""
    owner, speculator = object(), gen.speculator
    cache, logits = pool.prefill(gen.ids, owner)
    try:
        pieces = [gen.step(logits)]
        while True:
            for piece in pieces:
                if piece is not None and piece.text:
                    yield piece.text
            if gen.finish_reason is not None:
                return
            with pool.lock:
                if pool.holds(cache, owner):
                    rows = speculator.round(pool, cache, pieces[-1].token_id)
                    pieces = speculator.judge(cache, rows)
                else:  # the pool was full and another generation took this cache
                    cache, logits = pool.prefill(gen.context(), owner)
                    pieces = [gen.step(logits)]
    finally:
        pool.release(cache, owner)
