"""From logits to the next token id: penalties, bias, temperature, truncation, then one draw.

The pipeline, in the order transformers' ``generate`` applies the same steps (so a
``LogitsProcessorList`` built from the same settings is an exact oracle for it)::

    logit_bias → repetition_penalty → presence/frequency penalties      (edit single logits)
    → temperature → top_k → top_p → min_p → typical_p                   (rescale, then truncate)
    → softmax over the survivors → inverse CDF on one uniform draw

Why this order: biases and penalties describe what the caller wants of particular tokens, so they
act on the model's own scale before anything is normalised (transformers adds its sequence bias
before the repetition penalty, and llama.cpp adds logit_bias before its penalties too). Temperature
comes before the truncation filters, so top_p and min_p see the distribution that is actually
sampled. The filters follow transformers' warper order; llama.cpp runs typical_p before top_p, which
only differs when both are set. Greedy decoding (temperature 0) applies the bias and penalties and
takes the argmax; the filters cannot change an argmax.

Every processor is a small pure function on a float64 logits vector that returns a new vector,
removed tokens set to -inf; :func:`process_logits` chains them. :class:`Sampler` runs the same
definitions on the shrinking set of surviving tokens (the filters only compare values), so one
step costs a few passes over the vocabulary and no full sort. :func:`top_logprobs` reports the
model's own log-probabilities, before any of this, as OpenAI's ``logprobs`` do.

Ties: top_k keeps every token tied with the k-th logit (as transformers does). top_p keeps every
token tied with the last one it needs, so its result never depends on token ids; transformers
breaks such ties by the order of an unstable sort instead. min_p and typical_p never split ties.

>>> sampler = Sampler(SamplingParams(temperature=0.8, top_p=0.95, seed=1))
>>> token = sampler.sample(logits, prompt_ids, generated_ids)  # doctest: +SKIP
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .errors import PyllmError

_INVERSE_CDF_BLOCK = 1024  # inverse CDF over long vectors: block sums first, one cumsum of a block


class SamplingParamsError(PyllmError, ValueError):
    """A sampling setting is out of range or of the wrong type; the message names the setting."""


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_real(x) -> bool:
    return _is_int(x) or isinstance(x, (float, np.floating))


@dataclass
class SamplingParams:
    """Sampling settings, checked when built (and again with the vocabulary size by validate).

    temperature        0 = greedy (argmax after bias and penalties); else logits / temperature
    top_k              keep the k highest logits (0 = off)
    top_p              nucleus: the smallest set of most likely tokens holding top_p of the mass
    min_p              keep tokens with probability >= min_p * the top probability (0 = off)
    typical_p          locally typical sampling, transformers' TypicalLogitsWarper (1 = off)
    repetition_penalty transformers/CTRL: every token seen in prompt or output has its logit
                       divided by it when positive, multiplied when negative (1 = off)
    presence_penalty   OpenAI, in [-2, 2]: subtracted once from every token already generated
    frequency_penalty  OpenAI, in [-2, 2]: subtracted once per time a token was generated
    logit_bias         {token id: value added to its logit}
    seed               seeds numpy's default_rng; the same seed gives the same tokens

    >>> SamplingParams(temperature=0.7, top_p=0.9, seed=42)  # doctest: +ELLIPSIS
    SamplingParams(temperature=0.7, top_k=0, top_p=0.9, ...)
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None

    def __post_init__(self):
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def validate(self, vocab_size: int | None = None) -> None:
        """Raises SamplingParamsError (a ValueError) naming the first bad setting; logit_bias ids
        are also checked against vocab_size when it is given."""
        def bad(name: str, rule: str):
            raise SamplingParamsError(f"{name} must be {rule}, got {getattr(self, name)!r}")

        t = self.temperature
        if not _is_real(t) or not math.isfinite(t) or t < 0:
            bad("temperature", "a finite number >= 0 (0 = greedy)")
        if not _is_int(self.top_k) or self.top_k < 0:
            bad("top_k", "an int >= 0 (0 = off)")
        for name in ("top_p", "typical_p"):
            v = getattr(self, name)
            if not _is_real(v) or not 0 < v <= 1:
                bad(name, "a number in (0, 1]")
        if not _is_real(self.min_p) or not 0 <= self.min_p <= 1:
            bad("min_p", "a number in [0, 1]")
        r = self.repetition_penalty
        if not _is_real(r) or not math.isfinite(r) or r <= 0:
            bad("repetition_penalty", "a finite number > 0 (1 = off)")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _is_real(v) or not -2 <= v <= 2:
                bad(name, "a number in [-2, 2]")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, Mapping):
                bad("logit_bias", "a dict {token id: bias}")
            for k, v in self.logit_bias.items():
                if not _is_int(k) or k < 0 or (vocab_size is not None and k >= vocab_size):
                    span = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
                    raise SamplingParamsError(f"logit_bias keys must be token ids (ints {span}), got {k!r}")
                if not _is_real(v) or not math.isfinite(v):
                    raise SamplingParamsError(f"logit_bias values must be finite numbers, got {v!r} for {k}")
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            bad("seed", "an int >= 0 or None")


# ---------------------------------------------------------------------------------------------
# Processors: float64 logits in, a new float64 vector out. Removed tokens become -inf.

def _f64(logits) -> np.ndarray:
    z = np.array(logits, dtype=np.float64)  # always a copy: callers may reuse their array
    if z.ndim != 1 or z.size == 0:
        raise ValueError(f"logits must be a non-empty 1-D vector, got shape {z.shape}")
    return z


def _ids_in_vocab(ids, n: int) -> np.ndarray:
    a = np.fromiter(ids, dtype=np.int64) if not isinstance(ids, np.ndarray) else ids.astype(np.int64)
    return a[(a >= 0) & (a < n)]


def _unique_counts(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # np.unique without return_counts hashes, which is slow on numpy 2.x; one sort is cheap.
    s = np.sort(ids)
    if s.size == 0:
        return s, s
    starts = np.flatnonzero(np.concatenate(([True], s[1:] != s[:-1])))
    return s[starts], np.diff(np.append(starts, s.size))


def apply_logit_bias(logits, logit_bias: Mapping[int, float] | None) -> np.ndarray:
    """logits[id] += bias for each (id, bias) in logit_bias (OpenAI's logit_bias)."""
    z = _f64(logits)
    if logit_bias:
        _add_bias(z, *_bias_arrays(logit_bias))
    return z


def _bias_arrays(logit_bias: Mapping[int, float]) -> tuple[np.ndarray, np.ndarray]:
    return (np.fromiter((int(k) for k in logit_bias), dtype=np.int64, count=len(logit_bias)),
            np.fromiter((float(v) for v in logit_bias.values()), dtype=np.float64, count=len(logit_bias)))


def _add_bias(z: np.ndarray, ids: np.ndarray, values: np.ndarray) -> None:
    if ids.size and ids.max() >= z.size:
        raise SamplingParamsError(f"logit_bias key {int(ids.max())} is outside the vocabulary [0, {z.size})")
    z[ids] += values


def apply_repetition_penalty(logits, token_ids: Sequence[int], penalty: float) -> np.ndarray:
    """transformers' RepetitionPenaltyLogitsProcessor (CTRL, Keskar et al. 2019): for every distinct
    id in token_ids (prompt and output so far), logit / penalty if logit > 0, else logit * penalty.
    Each id counts once however often it occurs; ids outside the vocabulary are ignored."""
    z = _f64(logits)
    if penalty != 1:
        _penalize_repetition(z, _ids_in_vocab(token_ids, z.size), float(penalty))
    return z


def _penalize_repetition(z: np.ndarray, ids: np.ndarray, penalty: float) -> None:
    v = z[ids]  # repeated ids read and write the same value, so no need to deduplicate
    z[ids] = np.where(v < 0, v * penalty, v / penalty)


def apply_presence_frequency_penalty(logits, generated_ids: Sequence[int], presence_penalty: float,
                                     frequency_penalty: float) -> np.ndarray:
    """OpenAI's penalties: logit[id] -= frequency_penalty * count[id] + presence_penalty * (count[id] > 0),
    where count[id] is how often id occurs in generated_ids.

    Only generated tokens count (OpenAI's definition: "tokens that appear in the text so far" of the
    completion); the prompt is left alone, which repetition_penalty covers when wanted."""
    z = _f64(logits)
    if presence_penalty or frequency_penalty:
        _penalize_presence_frequency(z, _ids_in_vocab(generated_ids, z.size),
                                     float(presence_penalty), float(frequency_penalty))
    return z


def _penalize_presence_frequency(z: np.ndarray, ids: np.ndarray, presence: float, frequency: float) -> None:
    ids, counts = _unique_counts(ids)
    z[ids] -= frequency * counts + presence


def apply_temperature(logits, temperature: float) -> np.ndarray:
    """logits / temperature (transformers' TemperatureLogitsWarper); temperature > 0."""
    if not temperature > 0:
        raise SamplingParamsError(f"temperature must be > 0 to rescale logits, got {temperature!r}")
    return _f64(logits) / temperature


class _Scratch:
    """(n,) buffers reused from step to step: over a 262k vocabulary a fresh temporary costs more
    than the arithmetic done in it, so the sampler allocates these once."""

    def __init__(self, n: int):
        self.n = n
        self.a, self.b, self.c = np.empty(n), np.empty(n), np.empty(n)
        self.mask = np.empty(n, dtype=bool)


def top_k_filter(logits, top_k: int) -> np.ndarray:
    """transformers' TopKLogitsWarper: tokens whose logit is below the k-th largest become -inf
    (every token tied with the k-th stays). top_k = 0 or >= the vocabulary keeps all."""
    z = _f64(logits)
    if top_k <= 0 or top_k >= z.size:
        return z
    return np.where(z >= _top_k_threshold(z, top_k, _Scratch(z.size)), z, -np.inf)


def _top_k_threshold(z: np.ndarray, k: int, s: _Scratch) -> float:
    part = s.a
    np.copyto(part, z)
    part.partition(z.size - k)
    return float(part[z.size - k])


def top_p_filter(logits, top_p: float) -> np.ndarray:
    """Nucleus sampling, transformers' TopPLogitsWarper: in order of decreasing probability, keep a
    token when the probability of the tokens before it is < top_p, i.e. keep the smallest set whose
    cumulative probability reaches top_p (the most likely token always stays); the rest become
    -inf. Tokens tied with the last one kept are kept too. top_p = 1 keeps all."""
    z = _f64(logits)
    return z if top_p >= 1 else np.where(z >= _top_p_threshold(z, top_p, _Scratch(z.size)), z, -np.inf)


def _top_p_threshold(z: np.ndarray, top_p: float, s: _Scratch) -> float:
    """The smallest logit the nucleus keeps."""
    e = np.subtract(z, z.max(), out=s.a)
    np.exp(e, out=e)
    total = e.sum()
    needed = top_p * total
    # Tokens below eps hold less than (1 - top_p) of the mass all together, so the nucleus lies
    # among the rest: only those are sorted (a handful for a peaked distribution).
    cand = np.flatnonzero(np.greater_equal(e, (1 - top_p) * total / z.size, out=s.mask))
    if e[cand].sum() < needed:  # rounding at the edge: fall back to every token
        cand = np.flatnonzero(np.greater(e, 0, out=s.mask))
    cand = cand[_prefix_holding(-z[cand], e[cand], needed)]
    order = cand[np.argsort(-z[cand], kind="stable")]
    cum = np.cumsum(e[order])
    last = min(int(np.searchsorted(cum, needed, side="left")), cum.size - 1)
    return float(z[order[last]])


def min_p_filter(logits, min_p: float) -> np.ndarray:
    """transformers' MinPLogitsWarper (Nguyen et al. 2024): tokens whose probability is below
    min_p * the largest probability become -inf, i.e. logit < max logit + log(min_p).
    min_p = 0 keeps all; the most likely token always stays."""
    z = _f64(logits)
    return z if min_p <= 0 else np.where(z >= _min_p_threshold(z, min_p), z, -np.inf)


def _min_p_threshold(z: np.ndarray, min_p: float) -> float:
    return float(z.max() + math.log(min_p))


def typical_filter(logits, typical_p: float) -> np.ndarray:
    """Locally typical sampling (Meister et al. 2022), transformers' TypicalLogitsWarper: with
    H = -sum p log p, rank tokens by |-log p - H| (closest to the entropy first), find the first
    rank where the cumulative probability reaches typical_p, and make every token ranked further
    from H than that one -inf (the closest token always stays). typical_p = 1 keeps all."""
    z = _f64(logits)
    return z if typical_p >= 1 else np.where(_typical_keep(z, typical_p, _Scratch(z.size)), z, -np.inf)


def _typical_keep(z: np.ndarray, mass: float, s: _Scratch) -> np.ndarray:
    """The tokens typical sampling keeps, as a mask (in s.mask)."""
    logp = np.subtract(z, z.max(), out=s.a)
    p = np.exp(logp, out=s.b)
    total = p.sum()
    logp -= math.log(total)
    p /= total
    live = np.greater(p, 0, out=s.mask)  # -inf logits and underflows add nothing to the entropy
    entropy = -float(np.dot(p, logp) if live.all() else np.dot(p[live], logp[live]))
    shifted = np.abs(np.subtract(np.negative(logp, out=logp), entropy, out=logp), out=logp)
    cand = _prefix_holding(shifted, p, mass, s)
    order = cand[np.argsort(shifted[cand], kind="stable")]
    cum = np.cumsum(p[order])
    last = min(int(np.count_nonzero(cum < mass)), order.size - 1)
    keep = np.less_equal(shifted, shifted[order[last]], out=s.mask)
    keep[order[0]] = True
    return keep


def _prefix_holding(key: np.ndarray, weight: np.ndarray, needed: float, s: _Scratch | None = None,
                    first: int = 2048) -> np.ndarray:
    """Indices (increasing) of the tokens with the m smallest keys, ties included, for the first m
    in first, 8 * first, ... whose weights add up to needed; every index if none does. Sorting
    just these by key gives the head of the full sorted order, so a cumulative sum over them
    reaches needed exactly where the full one would, without sorting the whole vocabulary.
    s (buffers the size of key) must not hold key or weight in s.c or s.mask."""
    m = first
    while m < key.size:
        part = key.copy() if s is None else s.c
        if s is not None:
            np.copyto(part, key)
        part.partition(m - 1)
        cand = np.flatnonzero(np.less_equal(key, part[m - 1], out=None if s is None else s.mask))
        if weight[cand].sum() >= needed:
            return cand
        m *= 8
    return np.arange(key.size)


def process_logits(logits, params: SamplingParams, context_ids: Sequence[int] = (),
                   generated_ids: Sequence[int] = ()) -> np.ndarray:
    """The whole pipeline on a full vector (float64, removed tokens -inf): the reference that
    Sampler's faster path is tested against. Greedy params stop after bias and penalties.
    context_ids are the prompt (with or without the generated ids: the repetition penalty counts
    each id once), generated_ids the tokens sampled so far."""
    z = apply_logit_bias(logits, params.logit_bias)
    z = apply_repetition_penalty(z, list(context_ids) + list(generated_ids), params.repetition_penalty)
    z = apply_presence_frequency_penalty(z, generated_ids, params.presence_penalty, params.frequency_penalty)
    if params.greedy:
        return z
    z = apply_temperature(z, params.temperature)
    z = top_k_filter(z, params.top_k)
    z = top_p_filter(z, params.top_p)
    z = min_p_filter(z, params.min_p)
    return typical_filter(z, params.typical_p)


# ---------------------------------------------------------------------------------------------

class Sampler:
    """Picks the next token; the same params (seed included) and logits give the same tokens.

    Each sampled token uses exactly one uniform draw from numpy.random.default_rng(seed), mapped
    through the inverse CDF of the surviving tokens in increasing id order, so a run does not
    depend on thread counts or on how numpy partitions arrays. Greedy draws nothing.

    Sampler(SamplingParams(...)) is the interface; Sampler(temperature, seed) is kept as a
    shorthand. sampler(logits) is sampler.sample(logits). Scratch buffers the size of the
    vocabulary are allocated at the first call and reused.

    >>> s = Sampler(SamplingParams(temperature=0.7, top_k=40, seed=0))
    >>> s.sample(np.array([1.0, 3.0, 2.0], np.float32), [], [])  # doctest: +SKIP
    1
    """

    def __init__(self, params: SamplingParams | float | None = None, seed: int | None = None):
        if params is None or _is_real(params):
            params = SamplingParams(temperature=0.0 if params is None else params, seed=seed)
        elif not isinstance(params, SamplingParams):
            raise TypeError(f"Sampler takes a SamplingParams, got {type(params).__name__}")
        elif seed is not None:
            raise ValueError("pass the seed inside SamplingParams, not beside it")
        params.validate()
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self._bias = _bias_arrays(params.logit_bias) if params.logit_bias else None
        self._z = np.empty(0)  # (vocab,) the processed logits
        self._s = _Scratch(0)

    def sample(self, logits: np.ndarray, context_ids: Sequence[int] = (),
               generated_ids: Sequence[int] = ()) -> int:
        """The next token id for these logits (vocab_size,); context_ids are the prompt ids (the
        generated ids may be included or not), generated_ids the ids sampled so far."""
        p = self.params
        if p.greedy and not self._edits():
            logits = np.asarray(logits)
            _check_logits(logits)
            i = int(np.argmax(logits))
            _check_finite(float(logits[i]))
            return i
        ids, w = self._survivors(logits, context_ids, generated_ids)
        if p.greedy:
            return int(ids[0])
        u = self.rng.random()  # one draw per sampled token, however many tokens survived
        i = _inverse_cdf(w, u) if w.size > 1 else 0
        return i if ids is None else int(ids[i])

    __call__ = sample

    def distribution(self, logits: np.ndarray, context_ids: Sequence[int] = (),
                     generated_ids: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """(ids, probabilities) of the tokens sample() can return, ids increasing; draws nothing."""
        ids, w = self._survivors(logits, context_ids, generated_ids)
        return (np.arange(w.size) if ids is None else ids), w / w.sum()

    def _edits(self) -> bool:
        p = self.params
        return bool(self._bias is not None or p.repetition_penalty != 1 or p.presence_penalty
                    or p.frequency_penalty)

    def _survivors(self, logits, context_ids, generated_ids) -> tuple[np.ndarray | None, np.ndarray]:
        """Surviving ids (increasing; None for all of them) and their unnormalised probabilities
        (a view of a scratch buffer when every id survives)."""
        p = self.params
        logits = np.asarray(logits)
        _check_logits(logits)
        n = logits.size
        if self._z.size != n:
            self._z, self._s = np.empty(n), _Scratch(n)
        z = self._z
        z[...] = logits
        if self._bias is not None:
            _add_bias(z, *self._bias)
        if p.repetition_penalty != 1:
            ids = np.concatenate((_ids_in_vocab(context_ids, n), _ids_in_vocab(generated_ids, n)))
            _penalize_repetition(z, ids, float(p.repetition_penalty))
        if p.presence_penalty or p.frequency_penalty:
            _penalize_presence_frequency(z, _ids_in_vocab(generated_ids, n),
                                         float(p.presence_penalty), float(p.frequency_penalty))
        if p.greedy:
            i = int(np.argmax(z))
            _check_finite(z[i])
            return np.array([i]), np.ones(1)
        _check_finite(z.max())

        ids = None  # every id survives so far
        if 0 < p.top_k < n:
            # Dividing by T > 0 keeps the order of the logits, so top-k before the division selects
            # the same set, and the division then touches only the k survivors.
            ids = self._where_at_least(z, _top_k_threshold(z, p.top_k, self._s))
            z = z[ids]
        if p.temperature != 1:
            z /= p.temperature
        if p.top_p < 1 and z.size > 1:
            ids, z = self._cut(ids, z, _top_p_threshold(z, p.top_p, self._scratch_for(z)))
        if p.min_p > 0 and z.size > 1:
            ids, z = self._cut(ids, z, _min_p_threshold(z, p.min_p))
        if p.typical_p < 1 and z.size > 1:
            sel = np.flatnonzero(_typical_keep(z, p.typical_p, self._scratch_for(z)))
            ids, z = (sel if ids is None else ids[sel]), z[sel]
        z -= z.max()
        return ids, np.exp(z, out=z)

    def _scratch_for(self, z: np.ndarray) -> _Scratch:
        return self._s if z.size == self._s.n else _Scratch(z.size)

    def _where_at_least(self, z: np.ndarray, threshold: float) -> np.ndarray:
        return np.flatnonzero(np.greater_equal(z, threshold, out=self._scratch_for(z).mask))

    def _cut(self, ids, z, threshold):
        sel = self._where_at_least(z, threshold)
        return (sel if ids is None else ids[sel]), z[sel]


def _check_logits(logits: np.ndarray) -> None:
    if logits.ndim != 1 or logits.size == 0:
        raise ValueError(f"logits must be a non-empty 1-D vector, got shape {logits.shape}")


def _check_finite(value: float) -> None:
    if not math.isfinite(value):
        raise PyllmError(f"the model produced a non-finite logit ({value}); cannot sample")


def _inverse_cdf(w: np.ndarray, u: float) -> int:
    """The index i with cumsum(w)[i-1] <= u * sum(w) < cumsum(w)[i], so never one of weight 0.
    Long vectors go by block sums first (numpy's cumsum is slow), then one block's cumsum."""
    start, seg = 0, w
    if w.size > 4 * _INVERSE_CDF_BLOCK:
        starts = np.arange(0, w.size, _INVERSE_CDF_BLOCK)
        blocks = np.cumsum(np.add.reduceat(w, starts))
        t = u * blocks[-1]
        k = min(int(np.searchsorted(blocks, t, side="right")), starts.size - 1)
        if k:
            t -= blocks[k - 1]
        start = int(starts[k])
        seg = w[start:start + _INVERSE_CDF_BLOCK]
        c = np.cumsum(seg)
    else:
        c = np.cumsum(seg)
        t = u * c[-1]
    i = int(np.searchsorted(c, t, side="right"))
    if i >= seg.size:  # u * total rounded onto the end: the last token with weight
        positive = np.flatnonzero(seg)
        if positive.size == 0:
            start, positive = 0, np.flatnonzero(w)
        i = int(positive[-1])
    return start + i


class TopLogprobs(NamedTuple):
    """Log-probabilities under the model's own distribution (raw logits, before any transform)."""

    logprobs: np.ndarray  # (vocab_size,) float64: logprobs[id]
    ids: np.ndarray       # (n,) int64, most likely first (ties: lower id first)
    values: np.ndarray    # (n,) float64, logprobs[ids]


def top_logprobs(logits: np.ndarray, n: int) -> TopLogprobs:
    """log_softmax of the raw logits and the n most likely ids, as OpenAI's logprobs report them
    (before temperature, penalties or truncation).

    >>> lp = top_logprobs(np.array([0.0, 1.0, 2.0]), 2)
    >>> lp.ids.tolist(), round(float(lp.logprobs[2]), 4)
    ([2, 1], -0.4076)
    """
    if not _is_int(n) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    z = _f64(logits)
    m = z.max()
    _check_finite(m)  # NaN anywhere makes the max NaN
    z -= m
    z -= math.log(np.exp(z).sum())
    n = min(int(n), z.size)
    if n == 0:
        best = np.zeros(0, dtype=np.int64)
    else:
        best = np.argpartition(-z, n - 1)[:n] if n < z.size else np.arange(z.size)
        kth = z[best].min()
        best = np.flatnonzero(z >= kth)  # every tie of the n-th, in id order, then cut after sorting
        best = best[np.argsort(-z[best], kind="stable")][:n]
    return TopLogprobs(z, best.astype(np.int64), z[best])
