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

Constrained output (a JSON schema, a regex, a grammar: pyllm.constraints). Each row is judged as the
plain path samples a step: masked by the parser in the state the tokens before it left it, and the
token chosen consumed, so the parser only ever takes the tokens kept. Drafts the parser would not
take are cut before the call (no row is spent on them), and a draft model drafts among the tokens the
parser takes after its drafts so far (the parser advanced over them and rolled back). Where the parser
forces tokens after a draft taken (a key's name), the drafts that are those tokens are kept and the
round goes on past them; where one differs the round ends there, and the forced rest is run at the
head of the next call, as the plain path runs forced tokens in the call of the token before them.

Adaptive, never by a token: speculation decides only whether and how much to propose, from costs
and odds. The costs: a one-token step's time, a verifying call's time against it by its rows, and the
proposer's time per drafted token, all measured as the model runs (a model's costs are kept across its
generations); sampled generations use the fixed cost model instead (ROW_COST, the proposer's share of
the bytes a step reads), so that a seed's tokens never depend on timings. The odds: how often a
proposal of its kind is taken. A lookup keeps them by the length of its match and learns them from
every token the model makes, proposed or not (what its match predicted is known once the token is:
free), starting from priors that are low for short matches, so on text that does not repeat it
learns to stay quiet without paying for failed proposals. A round proposes the k that makes the
most tokens per step's worth of time, expecting each draft taken with its odds (a lookup's along the
match as it would grow) once the one before it was; where none pays (under 1 token per step),
it steps plainly and that kind of proposal waits: a lookup FIRST_PAUSE chances, then plans again with
the odds learned meanwhile; a proposer whose odds learn only from its proposals a number of chances
that doubles each time a probe after the wait still does not pay. Such a proposer's first rounds in a
new generation trust it (longer drafts each round) until it misses once. A proposer whose drafts
cost as much as the steps they would save (a self-draft of most layers, a draft model as large as
the target) gets one trusted round, then passes up LONGEST_PAUSE chances at a time. Once a proposer's
drafting is timed, its record over the model's generations decides first: where by that record it
does not pay (or cannot: as dear as above), the generations pass it up together, its pauses and
probes counted over all of them as one generation's are, so that a new generation (each of a
server's short replies) does not give it trusted rounds again. A draft model
first runs the tokens its cache lacks (the prompt, at a generation's first round): once the draft
has a record of drafts taken (the model's earlier generations), that catch-up is weighed against
what its rounds are expected to save over the tokens the generation may still make, and where they
cannot pay it back the draft is passed up (a long prompt with few tokens to make; jobs decoding
together, whose plain rows already share each step).
"""
from __future__ import annotations

import os
import time
import types
import weakref
from itertools import repeat

import numpy as np

from . import _core
from .kvpool import shared_prefix
from .sampling import Sampler, SamplingParams, _inverse_cdf

MAX_DRAFT = 16  # the most tokens one round proposes
START_DRAFT = 4  # a trusted proposer's first round; each trusted round after it proposes 2 more
TRUSTED_ROUNDS = 4  # a new generation's rounds that speculate until the proposer first misses
CHEAP_DRAFT = 0.25  # a proposer dearer than this share of a step per token starts trusted rounds at 1
# The extra cost of a verified row, as a share of a one-token step, until it is measured: decode
# reads the weights once for all rows, so a row adds its arithmetic (SmolLM2 on 2 threads: 0.19, a
# compute-bound 135M model; laptop-shape 1B files less: see benchmarks/RESULTS.md).
ROW_COST = 0.15
NEGLIGIBLE = 0.01  # the odds past which a longer draft is not considered
COST_MEMORY = 0.9  # the weight of the past in the running averages of measured times
ODDS_MEMORY = 0.9  # the weight of the past in the counts of taken proposals, per round (a lookup's: per token judged)
PRIOR_RATE, PRIOR_TRIES = 0.7, 2.0  # the odds before a proposal of a kind was judged, weighing 2 tries
# a lookup's odds before it was judged, by the length of its match (1, 2-3, 4-7, 8-15, 16): on
# bench_speculative's tasks a match of 1 predicted the next token 10-60% of the time, one of 8 or more 86-100%
LOOKUP_PRIORS = (0.3, 0.5, 0.7, 0.85, 0.9)
FIRST_PAUSE, LONGEST_PAUSE = 16, 512  # chances passed up while a kind of proposal does not pay
LOOKUP_NGRAMS = (4, 3, 2, 1)  # the n-gram lengths a lookup indexes, longest first
# the latest occurrences of an n-gram a lookup weighs: it proposes what followed the one whose tokens
# before it agree with the context's furthest back (the latest of those), not merely the latest one,
# which repeats itself where a text alternates between continuations (editing SmolLM2's output,
# replayed: 104 calls for 400 tokens -> 73)
LOOKUP_CANDIDATES = 4
LONGEST_MATCH = 16  # a lookup's match is measured back this far: its odds are kept by 1, 2-3, 4-7, 8-15, 16
CATCH_UP = MAX_DRAFT + 1  # a draft's round that first runs more tokens than a round takes is catching up (a prefill)


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
        gen.speculator = Speculator(self.name, proposer, gen, model.vocab_size, costs_of(model))
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


class Costs:
    """What forward calls of one model take, in one-token steps: running averages of the calls
    timed, by row count (the cost is not linear in rows: a few rows may cost what one does where a
    step waits on memory), and for row counts not timed yet the average share of a step each
    further row adds (before any: ROW_COST); and what each proposer's drafted token takes. threads:
    the model's DecodeThreads: while it measures, calls take other thread counts from one to the
    next, and none is timed (a Speculator plans from the fixed costs until its first choice)."""

    def __init__(self, threads=None):
        self.threads = threads
        self.step: float | None = None  # seconds
        self.guessed = False  # step was inferred from a call of several rows, none of one row timed yet
        self.row = ROW_COST
        self.by_rows: dict[int, float] = {}  # rows > 1 -> a call's time, in steps
        self.drafts: dict[str, float] = {}  # proposer name -> a drafted token's time, in steps
        # proposer name -> {k: a round's time drafting k tokens, in steps}: a draft model's round
        # first catches up with the tokens taken since its last one, so it is not k times a token's
        self.draft_rounds: dict[str, dict[int, float]] = {}
        # proposer name -> a token of its catch-up (a draft model's prefill of what its cache lacks), in steps
        self.catch_up: dict[str, float] = {}
        # proposer name -> how often its drafts were taken over the model's generations (a lookup's
        # are not kept: they are the context's): what a generation expects before its first round, and
        # the chances the generations pass it up together while by that record it does not pay
        self.taken: dict[str, Odds] = {}

    def ratio(self, rows: int) -> float:
        """The time of a call of rows tokens, in steps."""
        return 1.0 if rows == 1 else self.by_rows.get(rows, 1 + self.row * (rows - 1))

    @property
    def settled(self) -> bool:
        """Whether calls are timed: not while the decode threads are measured."""
        return self.threads is None or self.threads.chosen is not None

    @property
    def chosen_once(self) -> bool:
        """Whether the timings kept are of a chosen count (a later measure times nothing)."""
        return self.threads is None or self.threads.chosen is not None or self.threads.measured > 0

    def record(self, rows: int, seconds: float) -> None:
        if not self.settled:
            return
        if rows == 1:
            fresh = self.step is None or self.guessed
            self.step = seconds if fresh else COST_MEMORY * self.step + (1 - COST_MEMORY) * seconds
            self.guessed = False
        elif self.step is None:
            # jobs batched together from the start: a step's time as the row cost puts it, until one is timed
            self.step, self.guessed = seconds / (1 + self.row * (rows - 1)), True
        else:
            ratio = seconds / self.step
            self.by_rows[rows] = COST_MEMORY * self.by_rows.get(rows, ratio) + (1 - COST_MEMORY) * ratio
            self.row = COST_MEMORY * self.row + (1 - COST_MEMORY) * max(0.0, (ratio - 1) / (rows - 1))


_costs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # Model -> its Costs


def costs_of(model) -> Costs:
    if model not in _costs:
        _costs[model] = Costs(model.core.decode_threads)
    return _costs[model]


class Odds:
    """How often one kind of proposal is taken (running counts: each draft is a try until one is
    turned down), and the chances it passes up while it does not pay."""

    def __init__(self, prior: float = PRIOR_RATE):
        self.taken, self.tries = prior * PRIOR_TRIES, PRIOR_TRIES
        self.passing = 0  # chances still to pass up
        self.wait = FIRST_PAUSE  # the next pause
        self.probe = False  # the pause just ended: the next chance runs a round whatever it expects

    @property
    def rate(self) -> float:
        return self.taken / self.tries

    def record(self, proposed: int, taken: int) -> None:
        self.taken = ODDS_MEMORY * self.taken + taken
        self.tries = ODDS_MEMORY * self.tries + taken + (taken < proposed)


class PromptLookup:
    """Proposes what followed an earlier occurrence of the context's final n-gram (the longest of
    LOOKUP_NGRAMS that occurred): of its latest LOOKUP_CANDIDATES occurrences, the one the context
    matches furthest back from there, from an index that grows with the context. Its odds are kept
    by the length of the stretch that matches there, and they learn from every token the model
    makes, proposed or not: the token the match predicted is known as soon as the model's own is,
    so a lookup learns that it does not pay without proposing a thing."""

    cost = 0.0

    def __init__(self):
        self.seen = 0  # context tokens indexed
        # n-gram -> where the tokens after each of its latest occurrences start, oldest first
        self.index: dict[tuple, list[int]] = {}
        self.by_length = [Odds(prior) for prior in LOOKUP_PRIORS]
        # a match of n tokens predicts its next token with the odds at_length[n]
        self.at_length = [self.by_length[min(n, LONGEST_MATCH).bit_length() - 1]
                          for n in range(LONGEST_MATCH + MAX_DRAFT + 1)]
        self.at = 0  # where the drafts of the last match start
        self.length = 0  # how many tokens matched there (0: no match)
        self.end = 0  # the context's length then

    def odds(self, context: list[int]) -> tuple[Odds | None, int]:
        """The odds of a proposal from the context's match and the most tokens it can propose;
        (None, 0) without a match."""
        end = len(context)
        if self.length:  # the last match's predictions against the tokens made since, up to a miss
            for i in range(min(end - self.end, MAX_DRAFT + 1)):
                hit = context[self.at + i] == context[self.end + i]
                self.at_length[self.length + i].record(1, hit)
                if not hit:
                    break
        self.end, self.length = end, 0
        # an n-gram ending at e is indexed once a token follows it: e < end
        for e in range(max(self.seen, 1), end):
            for n in LOOKUP_NGRAMS:
                if e >= n:
                    starts = self.index.setdefault(tuple(context[e - n:e]), [])
                    starts.append(e)
                    if len(starts) > LOOKUP_CANDIDATES:
                        del starts[0]
        self.seen = end
        for n in LOOKUP_NGRAMS:
            starts = self.index.get(tuple(context[-n:])) if end >= n else None
            if starts:
                for at in reversed(starts):  # the latest first: it wins a tie
                    length = n
                    while length < min(LONGEST_MATCH, at) and context[at - 1 - length] == context[end - 1 - length]:
                        length += 1
                    if length > self.length:
                        self.at, self.length = at, length
                return self.at_length[self.length], end - self.at
        return None, 0

    def rates(self):
        """The odds of each draft along the match, once the ones before it were taken."""
        for odds in self.at_length[self.length:]:
            yield odds.rate

    def propose(self, context: list[int], k: int, choose) -> tuple[list[int], list]:
        drafts = context[self.at:self.at + k]
        return drafts, [None] * len(drafts)


class DraftModel:
    """A smaller model's own greedy (or sampled) continuation, k tokens, from a cache of its own
    that keeps the prefix it shares with the context between rounds."""

    def __init__(self, draft, n_ctx: int, cost: float):
        self.draft = draft
        self.seq = _core.CoreSequence(draft.core, n_ctx)
        self.held: list[int] = []  # the tokens the draft's cache holds
        self.cost = cost
        self.prefill_seconds = 0.0  # of the last propose(), which the Speculator does not count
        self.prefilled = 0  # the tokens that prefill ran
        self.single = Odds()

    def odds(self, context: list[int]) -> tuple[Odds, int]:
        return self.single, MAX_DRAFT

    def behind(self, context: list[int]) -> int:
        """The tokens a round must run in the draft before it drafts: what its cache lacks."""
        return len(context) - min(shared_prefix(self.held, context), len(context) - 1)

    def propose(self, context: list[int], k: int, choose) -> tuple[list[int], list]:
        keep = len(context) - self.behind(context)
        self.seq.truncate(keep)
        start = time.perf_counter()
        logits = self.seq.forward(context[keep:])
        # the prompt's prefill is no drafted token's cost (it is the catch-up's); the tokens taken
        # since the last round are
        self.prefilled = len(context) - keep if len(context) - keep > CATCH_UP else 0
        self.prefill_seconds = time.perf_counter() - start if self.prefilled else 0.0
        drafts, qs = [], []
        for i in range(k):
            token, q = choose(logits, drafts)
            if token is None:  # nothing may follow (a constraint's whole match)
                break
            drafts.append(token)
            qs.append(q)
            if i < k - 1:
                logits = self.seq.forward([token])
        self.held = context + drafts[:i]  # the last draft is not run, unless the loop broke before a next one
        return drafts, qs


class SelfDraft:
    """The target's first layers, then its final norm and head, run in the generation's own cache:
    those layers' keys and values at a new position are the ones the verifying call writes there,
    and the positions are forgotten before it runs."""

    def __init__(self, layers: int, cost: float):
        self.layers = layers
        self.cost = cost
        self.seq = None  # the generation's cache, set by the Speculator before each round
        self.single = Odds()

    def odds(self, context: list[int]) -> tuple[Odds, int]:
        return self.single, MAX_DRAFT

    def behind(self, context: list[int]) -> int:
        return 0  # it drafts in the generation's own cache, which holds the context

    def propose(self, context: list[int], k: int, choose) -> tuple[list[int], list]:
        start = self.seq.pos  # the cache holds the context but its last token (and any a constraint forced after it)
        logits = self.seq.forward(context[start:], n_layers=self.layers)
        drafts, qs = [], []
        try:
            for i in range(k):
                token, q = choose(logits, drafts)
                if token is None:  # nothing may follow (a constraint's whole match)
                    break
                drafts.append(token)
                qs.append(q)
                if i < k - 1:
                    logits = self.seq.forward([token], n_layers=self.layers)
        finally:
            self.seq.truncate(start)
        return drafts, qs


class Share:
    """The rows of one forward call that a round's proposal is weighed against, as they stand: the
    rows run, the tokens they are expected to make, the time spent drafting them (in steps), and
    the most rows the call may take. A generation alone: its own row, one token. In a batched step
    (pyllm.scheduler) every job's row first, then each job's drafts as it plans them: a draft pays
    where it raises the tokens the whole call makes per step's time."""

    def __init__(self, rows: int = 1, tokens: float = 1.0, capacity: int | None = None):
        self.rows = rows
        self.tokens = tokens
        self.drafting = 0.0
        self.capacity = capacity

    def room(self) -> int | None:
        return None if self.capacity is None else self.capacity - self.rows

    def add(self, drafts: int, expected: float, drafting: float) -> None:
        """A round's drafts join the call, expected to make `expected` tokens with its own row,
        drafted in `drafting` steps' time."""
        self.rows += drafts
        self.tokens += expected - 1
        self.drafting += drafting


class Speculator:
    """One generation's speculation: its proposer, how many tokens to propose, and what was
    proposed and taken (usage())."""

    def __init__(self, name: str, proposer, gen, vocab_size: int, costs: Costs | None = None):
        self.name = name
        self.vocab_size = vocab_size
        self.proposer = proposer
        self.gen = gen
        self.draft_sampler = Sampler(gen.sampler.params)  # q: the same settings on the draft's logits
        # a seed's tokens must not depend on timings: sampled generations keep the fixed cost model
        self.timed_costs = costs if gen.sampler.params.greedy else None
        self.timed, self.costs = False, None
        self._plan_costs()
        self.lookup = isinstance(proposer, PromptLookup)
        self.context = list(gen.ids)  # the prompt and the tokens generated, grown in place
        self.rounds = 0  # rounds that proposed
        self.missed = False  # a draft was turned down
        self.expected = 1.0  # the tokens this round's plan expects it to make
        self.lead = 0  # the rows of this round's call before the one that judges its first draft
        self.odds: Odds | None = None  # the kind of this round's proposal
        self.proposed = self.accepted = 0
        self.steps = 0  # forward calls of the model while decoding: plain steps and verifying calls

    def _plan_costs(self) -> None:
        """Plans from the model's timed costs once its decode threads have been chosen once (before,
        its calls take other thread counts from one to the next), else from the fixed cost model."""
        timed = self.timed_costs is not None and self.timed_costs.chosen_once
        if self.costs is not None and timed == self.timed:
            return
        self.timed = timed
        self.costs = self.timed_costs if timed else Costs()
        self.draft_cost = self.costs.drafts.get(self.name, self.proposer.cost)  # a drafted token's time, in steps
        self.draft_rounds = self.costs.draft_rounds.setdefault(self.name, {})  # a round's drafting time by k

    def usage(self) -> dict:
        """What a Completion's usage adds: OpenAI's prediction counts, and the proposer's: tokens
        proposed and accepted, and the model's forward calls after the prompt (plain decoding makes
        a token per call)."""
        return {"completion_tokens_details": {"accepted_prediction_tokens": self.accepted,
                                              "rejected_prediction_tokens": self.proposed - self.accepted},
                "speculative": {"proposer": self.name, "proposed": self.proposed, "accepted": self.accepted,
                                "steps": self.steps}}

    def round(self, pool, cache) -> np.ndarray:
        """Runs the tokens made since the cache's last call (the one just chosen, and what a
        constraint forced after it) and this round's drafts in cache as one forward call; the rows
        of logits, one per token run. Call under pool.lock; then judge(rows)."""
        tokens = self.prepare(cache)
        start = time.perf_counter()
        rows = pool.verify(cache, tokens) if self.drafts else pool.step(cache, tokens[0], tokens[1:])[None]
        if self.timed and (self.drafts or len(tokens) == 1):  # a step with forced tokens has one row of logits
            self.costs.record(len(tokens), time.perf_counter() - start)
        return rows

    def prepare(self, cache, share: Share | None = None) -> list[int]:
        """The tokens of this round's rows: those the cache lacks (the token just chosen, then any a
        constraint forced after it) and the drafts proposed after them, weighed against share (the
        other rows of a batched call; alone without it), which then counts them in. The caller runs
        them in cache (pyllm.scheduler: with the other jobs'), then judge(rows)."""
        gen = self.gen
        self.steps += 1
        self._plan_costs()
        share = share or Share()
        self.drafts, self.qs = [], []
        context = self.context
        context += gen.generated[len(context) - len(gen.ids):]
        pending = context[cache.seq.pos:]
        self.lead = len(pending) - 1
        share.rows += self.lead
        room = min(gen.max_tokens - len(gen.generated),  # the last row would go unused past these
                   gen.n_ctx - cache.seq.pos - len(pending), cache.seq.exact_rows - len(pending))
        if share.room() is not None:
            room = min(room, share.room())
        k = self._plan(context, room, share) if room > 0 else 0
        if k:
            if isinstance(self.proposer, SelfDraft):
                self.proposer.seq = cache.seq
            start = time.perf_counter()
            self.drafts, self.qs = self.proposer.propose(context, k, self._choose)
            if gen.constraint is not None:  # a draft the parser would not take cannot be taken: no row for it
                taken = gen.constraint.valid_prefix(self.drafts)
                self.drafts, self.qs = self.drafts[:taken], self.qs[:taken]
            n = len(self.drafts)
            prefill = getattr(self.proposer, "prefill_seconds", 0.0)
            if self.timed and self.costs.step and prefill:
                per_token = prefill / self.costs.step / self.proposer.prefilled
                self.costs.catch_up[self.name] = COST_MEMORY * self.catch_up_cost() + (1 - COST_MEMORY) * per_token
            if self.timed and self.costs.step and n:
                seconds = time.perf_counter() - start - prefill
                drafting = seconds / self.costs.step
                self.draft_rounds[n] = COST_MEMORY * self.drafting(n) + (1 - COST_MEMORY) * drafting
                self.draft_cost = COST_MEMORY * self.draft_cost + (1 - COST_MEMORY) * drafting / n
                self.costs.drafts[self.name] = self.draft_cost
            if n:
                share.add(n, self.expected, self.drafting(n))
        return pending + self.drafts

    def _plan(self, context: list[int], room: int, share: Share | None = None) -> int:
        """How many tokens this round proposes (0: a plain step), from the proposer's odds and the
        costs of share's call with them; self.odds the kind of proposal it makes, self.expected the
        tokens the round is then expected to make."""
        if self.timed and self.costs.step is None:
            return 0  # a plain step first: its time is the unit of every cost
        self.odds, most = self.proposer.odds(context)
        odds, most = self.odds, min(most, room, MAX_DRAFT)
        if odds is None:
            return 0
        if odds.passing:
            odds.passing -= 1
            odds.probe = odds.passing == 0 and not self.lookup
            return 0
        share = share or Share()
        plain = share.tokens / (self.costs.ratio(share.rows) + share.drafting)  # the call without drafts
        if self.lookup:
            k, value, self.expected = self._best(self.proposer.rates(), most, share)
            if value >= plain:
                return k
            odds.passing = FIRST_PAUSE  # its odds keep learning meanwhile: no probe, no longer pause
            return 0
        # a catch-up is weighed once the proposer has a record of drafts taken (before it, as in its
        # trusted rounds, it is given its chance); at a generation's first round, by that record
        record, behind = self.costs.taken.get(self.name), self.proposer.behind(context)
        if record and behind > CATCH_UP:
            if not self._pays_back(behind, odds.rate if self.rounds else record.rate, most, share):
                odds.passing = LONGEST_PAUSE  # the catch-up only grows with the context
                return 0
        hopeless = self._best(repeat(1.0), MAX_DRAFT, Share())[1] < 1  # not even drafts always taken would pay
        if record is not None and self.name in self.costs.drafts:  # its drafting timed, its record the model's
            # one that does not pay by its record over the model's generations (or at all: hopeless) is
            # passed up by them together, as a generation passes it up below, its pause counted over
            # them: a new generation does not give it trusted rounds again (a server's short replies
            # would each pay for them)
            if record.passing:
                record.passing -= 1
                return 0
            k, value, _ = self._best(repeat(record.rate), most, share)
            if hopeless or value < plain:
                if record.probe:  # the pause is over: one round, whatever it expects
                    record.probe = False
                    k = 1 if hopeless else k
                    self.expected = sum(record.rate ** i for i in range(k + 1))
                    return k
                record.passing = LONGEST_PAUSE if hopeless else record.wait
                record.wait, record.probe = min(2 * record.wait, LONGEST_PAUSE), True
                return 0
            record.wait = FIRST_PAUSE
        if not self.missed and self.rounds < (1 if hopeless else TRUSTED_ROUNDS):
            start = START_DRAFT if self.draft_cost < CHEAP_DRAFT else 1
            k = min(start + 2 * self.rounds, most)
            self.expected = sum(odds.rate ** i for i in range(k + 1))
            return k
        k, value, self.expected = self._best(repeat(odds.rate), most, share)
        if value >= plain or odds.probe:
            if value >= plain:
                odds.wait = FIRST_PAUSE
            odds.probe = False
            return k
        if hopeless:
            odds.passing = LONGEST_PAUSE
        else:
            odds.passing, odds.wait = odds.wait, min(2 * odds.wait, LONGEST_PAUSE)
        return 0

    def _best(self, rates, most: int, share: Share) -> tuple[int, float, float]:
        """The number of drafts (1 to most) that makes share's call make the most tokens per step's
        time, those tokens per step, and the tokens the round makes: each draft taken with the next
        of rates once the one before it was."""
        best = (1, 0.0, 1.0)
        expected = reach = 1.0  # the tokens a round makes; the odds that every draft so far is taken
        for k, rate in zip(range(1, most + 1), rates):
            reach *= rate
            expected += reach
            value = ((share.tokens - 1 + expected)
                     / (self.costs.ratio(share.rows + k) + share.drafting + self.drafting(k)))
            if value > best[1]:
                best = (k, value, expected)
            if reach < NEGLIGIBLE:  # longer drafts add next to nothing but their rows
                break
        return best

    def _pays_back(self, behind: int, rate: float, most: int, share: Share) -> bool:
        """Whether rounds of drafts taken at rate save more than a catch-up of behind tokens costs over
        the tokens the generation may still make: a round's drafts make tokens that would otherwise
        cost a step's share of the plain call each, and add their rows and drafting to it."""
        k, _, expected = self._best(repeat(rate), most, share)
        plain = share.tokens / (self.costs.ratio(share.rows) + share.drafting)
        added = self.costs.ratio(share.rows + k) - self.costs.ratio(share.rows) + self.drafting(k)
        saved = (expected - 1) / plain - added  # steps a round saves
        left = self.gen.max_tokens - len(self.gen.generated)
        return behind * self.catch_up_cost() <= max(saved, 0.0) * left / expected

    def catch_up_cost(self) -> float:
        """A token of the proposer's catch-up, in steps: as timed, else its drafted token's share of the
        bytes a step reads times what a verified row adds to a step (a prefill's token is compute,
        like a row)."""
        return self.costs.catch_up.get(self.name, self.proposer.cost * self.costs.row)

    def drafting(self, k: int) -> float:
        """A round's time proposing k tokens, in steps: as timed for k, else k drafted tokens'."""
        return self.draft_rounds.get(k, k * self.draft_cost)

    def judge(self, cache, rows: np.ndarray) -> list:
        """The Pieces (or a None at an end of sequence) of the tokens this round makes: the drafts
        taken, then the target's own token. The cache keeps only the positions of the tokens taken;
        the last Piece's token is not in it yet, nor what a constraint forced after it. A draft
        taken that the constraint forces tokens after (Generation.step adds them) keeps the drafts
        after it that are those tokens, and the round goes on past them; where they differ it ends,
        the rest of the forced tokens left for the next call, as the plain path runs them."""
        gen, drafts = self.gen, self.drafts
        if not drafts:  # a plain step
            return [gen.step(rows[-1])]
        rows = rows[self.lead:]  # row i judges draft i
        start = cache.seq.pos - len(rows)  # the position of the row before the first draft
        pieces, i = [], 0
        while i < len(drafts):
            token = None if gen.sampler.params.greedy else self._test(rows[i], drafts[i], self.qs[i])
            piece = gen.step(rows[i], token)  # greedy: the plain path's own step, the same token
            pieces.append(piece)
            taken = piece is not None and piece.token_id == drafts[i]
            if not taken or gen.finish_reason is not None:
                self._record(len(drafts), i + taken)
                cache.seq.truncate(start + 1 + i)
                return pieces
            i += 1
            forced = piece.forced
            same = 0
            while same < len(forced) and i + same < len(drafts) and drafts[i + same] == forced[same]:
                same += 1
            i += same
            if same < len(forced):
                self._record(len(drafts), i)
                cache.seq.truncate(start + 1 + i)
                return pieces
        self._record(len(drafts), len(drafts))
        pieces.append(gen.step(rows[-1]))
        return pieces

    def _choose(self, logits: np.ndarray, drafts: list[int]) -> tuple[int | None, tuple | None]:
        """A draft token from a proposer's logits and its q: greedy, the argmax after the penalties
        (q a point mass: None); sampled, a draw from the draft's distribution. Under a constraint,
        among the tokens it would take after the drafts so far (None: none may follow them)."""
        gen = self.gen
        logits = fit_vocabulary(logits, self.vocab_size)
        if gen.constraint is not None:
            logits = gen.constraint.mask_after(drafts, logits)
            if logits is None:
                return None, None
        if gen.sampler.params.greedy:
            return self.draft_sampler.sample(logits, gen.ids, gen.generated + drafts), None
        ids, probs = self.draft_sampler.distribution(logits, gen.ids, gen.generated + drafts)
        return int(ids[_inverse_cdf(probs, gen.sampler.rng.random())]), (ids, probs)

    def _test(self, row: np.ndarray, draft: int, q: tuple | None) -> int:
        """The token rejection sampling takes at this row: draft with probability min(1, p/q),
        else a draw from max(0, p - q), renormalised."""
        gen = self.gen
        allowed = gen.constraint.mask(row) if gen.constraint is not None else row  # as Generation.step samples
        ids, p = gen.sampler.distribution(allowed, gen.ids, gen.generated)
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

    def _record(self, proposed: int, taken: int) -> None:
        self.proposed += proposed
        self.accepted += taken
        self.rounds += 1
        self.missed = self.missed or taken < proposed
        if not self.lookup:  # a lookup's odds learn from the context (PromptLookup.odds)
            self.odds.record(proposed, taken)
            self.costs.taken.setdefault(self.name, Odds()).record(proposed, taken)


def lookup_rounds(prompt: list[int], output: list[int], costs: Costs, made: int = 1) -> list[tuple[int, int]]:
    """(drafts proposed, drafts taken) of each round greedy lookup speculation makes on output, the
    greedy generation after prompt, from its first `made` tokens on (1: the prefill made one), with
    costs in place of timings. Exact without running the model: greedy speculation makes the plain
    output whatever it proposes (benchmarks/project_speculative.py projects speed-ups from it)."""
    gen = types.SimpleNamespace(ids=prompt, sampler=types.SimpleNamespace(params=SamplingParams()))
    planner = Speculator("lookup", PromptLookup(), gen, 0, costs)
    rounds = []
    while made < len(output):
        context = prompt + output[:made]
        k = planner._plan(context, len(output) - made)
        drafts = planner.proposer.propose(context, k, None)[0] if k else []
        taken = 0
        while taken < len(drafts) and drafts[taken] == output[made + taken]:
            taken += 1
        if drafts:
            planner._record(len(drafts), taken)
        rounds.append((len(drafts), taken))
        made += taken + 1
    return rounds


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
                    rows = speculator.round(pool, cache)
                    pieces = speculator.judge(cache, rows)
                else:  # the pool was full and another generation took this cache
                    cache, logits = pool.prefill(gen.context(), owner)
                    pieces = [gen.step(logits)]
    finally:
        pool.release(cache, owner)
