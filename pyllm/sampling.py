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
step costs no full sort. Over a large vocabulary it reads float32 logits as float32 keys and
settles each decision in float64 on the few tokens it depends on, taking float32 sums over the
vocabulary only where an error bound proves they decide the same way ("The fast path" below):
the tokens are those of the float64 definitions. :func:`top_logprobs` reports the model's own
log-probabilities, before any of this, as OpenAI's ``logprobs`` do.

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

from .checks import is_int
from .errors import PyllmError

_INVERSE_CDF_BLOCK = 1024  # inverse CDF over long vectors: block sums first, one cumsum of a block


class SamplingParamsError(PyllmError, ValueError):
    """A sampling setting is out of range or of the wrong type; the message names the setting."""


def _is_real(x) -> bool:
    return is_int(x) or isinstance(x, (float, np.floating))


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
        if not is_int(self.top_k) or self.top_k < 0:
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
                if not is_int(k) or k < 0 or (vocab_size is not None and k >= vocab_size):
                    span = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
                    raise SamplingParamsError(f"logit_bias keys must be token ids (ints {span}), got {k!r}")
                if not _is_real(v) or not math.isfinite(v):
                    raise SamplingParamsError(f"logit_bias values must be finite numbers, got {v!r} for {k}")
        if self.seed is not None and (not is_int(self.seed) or self.seed < 0):
            bad("seed", "an int >= 0 or None")


# ---------------------------------------------------------------------------------------------
# Processors: float64 logits in, a new float64 vector out. Removed tokens become -inf.

def _f64(logits) -> np.ndarray:
    z = np.array(logits, dtype=np.float64)  # always a copy: callers may reuse their array
    if z.ndim != 1 or z.size == 0:
        raise ValueError(f"logits must be a non-empty 1-D vector, got shape {z.shape}")
    return z


def _id_array(ids) -> np.ndarray:
    return ids if isinstance(ids, np.ndarray) else np.fromiter(ids, dtype=np.int64)


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
    _check_bias_ids(ids, z.size)
    z[ids] += values


def _check_bias_ids(ids: np.ndarray, n: int) -> None:
    if ids.size and ids.max() >= n:
        raise SamplingParamsError(f"logit_bias key {int(ids.max())} is outside the vocabulary [0, {n})")


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
    # a pairwise sum, not np.dot: BLAS threads a long dot (a wake-up costing milliseconds on a
    # busy machine, and a result that depends on the thread count)
    with np.errstate(invalid="ignore"):  # 0 * -inf where not live
        plogp = np.multiply(p, logp, out=s.c)
    entropy = -float(plogp.sum() if live.all() else plogp.sum(where=live))
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

    Two paths give that token. The exact path (_survivors) copies the logits to float64 and runs
    the definitions above on the shrinking set of survivors. The fast path (float32 logits, the
    model's) reads the logits as float32 keys and works in float64 only on the few tokens that
    decide the result; where its float32 error bounds cannot settle a decision, the exact path
    takes over. Both give the same token for the same uniform (see "The fast path" below).

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
        self._z = np.empty(0)  # (vocab,) the exact path's processed logits
        self._s = _Scratch(0)  # the exact path's buffers
        self._f = _Scratch32(0)  # the fast path's buffers

    def sample(self, logits: np.ndarray, context_ids: Sequence[int] = (),
               generated_ids: Sequence[int] = ()) -> int:
        """The next token id for these logits (vocab_size,); context_ids are the prompt ids (the
        generated ids may be included or not), generated_ids the ids sampled so far."""
        p = self.params
        logits = np.asarray(logits)
        _check_logits(logits)
        if p.greedy and not self._edits():
            i = int(np.argmax(logits))
            _check_finite(float(logits[i]))
            return i
        # read once: the fast path and then the exact path may both need them
        context_ids, generated_ids = _id_array(context_ids), _id_array(generated_ids)
        if p.greedy:  # edited logits: one float64 copy and argmax is as fast as anything here
            return int(self._survivors(logits, context_ids, generated_ids)[0][0])
        keys = self._keys(logits, context_ids, generated_ids)
        kept = self._truncate(keys) if keys is not None else None
        u = self.rng.random()  # one draw per sampled token, however many tokens survived
        if kept is not None:
            ids, z = kept
            if ids is not None:
                return int(ids[_inverse_cdf(_weights(z), u) if z.size > 1 else 0])
            i = keys.weights().draw(u)
            if i is not None:
                return i
        ids, w = self._survivors(logits, context_ids, generated_ids)
        i = _inverse_cdf(w, u) if w.size > 1 else 0
        return i if ids is None else int(ids[i])

    __call__ = sample

    def distribution(self, logits: np.ndarray, context_ids: Sequence[int] = (),
                     generated_ids: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """(ids, probabilities) of the tokens sample() can return, ids increasing; draws nothing."""
        logits = np.asarray(logits)
        _check_logits(logits)
        context_ids, generated_ids = _id_array(context_ids), _id_array(generated_ids)
        keys = None if self.params.greedy else self._keys(logits, context_ids, generated_ids)
        kept = self._truncate(keys) if keys is not None else None
        if kept is None or kept[0] is None:
            ids, w = self._survivors(logits, context_ids, generated_ids)
            return (np.arange(w.size) if ids is None else ids), w / w.sum()
        w = _weights(kept[1])
        return kept[0], w / w.sum()

    def _edits(self) -> bool:
        p = self.params
        return bool(self._bias is not None or p.repetition_penalty != 1 or p.presence_penalty
                    or p.frequency_penalty)

    def _survivors(self, logits, context_ids, generated_ids) -> tuple[np.ndarray | None, np.ndarray]:
        """The exact path: surviving ids (increasing; None for all of them) and their unnormalised
        probabilities (a view of a scratch buffer when every id survives)."""
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
        if p.temperature < _SMALL_TEMPERATURE:
            # logits / T would overflow to inf (inf - inf = NaN below) for T near 0: shift first,
            # so the maxima stay 0 and the rest fall to -inf, the T -> 0 limit (greedy over ties)
            with np.errstate(over="ignore"):
                z -= z.max()
                z /= p.temperature
        elif p.temperature != 1:
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

    def _keys(self, logits: np.ndarray, context_ids, generated_ids) -> _Keys | None:
        """The fast path's view of this step's logits, or None where it does not apply: logits
        float32 cannot hold exactly, a temperature outside _FAST_TEMPERATURES, a NaN, infinite or
        overflowing largest logit (the exact path then raises or copes)."""
        p, n = self.params, logits.size
        lo, hi = _FAST_TEMPERATURES
        if logits.dtype not in _FAST_DTYPES or not lo <= p.temperature <= hi:
            return None
        if self._f.n != n:
            self._f = _Scratch32(n)
        edit_ids, edit_z = self._edited(logits, context_ids, generated_ids)
        if edit_ids.size == 0 and logits.dtype == np.float32:
            y = logits
        else:
            y = self._f.y
            np.copyto(y, logits)
            with np.errstate(over="ignore"):  # an edit beyond float32: an infinite key, so the exact path
                y[edit_ids] = edit_z
        ymax = float(y.max())
        if not math.isfinite(ymax):
            return None
        return _Keys(logits, y, ymax, edit_ids, edit_z, float(p.temperature), self._f)

    def _edited(self, logits: np.ndarray, context_ids, generated_ids) -> tuple[np.ndarray, np.ndarray]:
        """(ids, z): the ids that logit_bias and the penalties touch (sorted, distinct) and their
        logits after those edits, in float64, by the same operations as the exact path's."""
        p, n = self.params, logits.size
        parts = []
        if self._bias is not None:
            _check_bias_ids(self._bias[0], n)
            parts.append(self._bias[0])
        if p.repetition_penalty != 1:
            repeated = np.concatenate((_ids_in_vocab(context_ids, n), _ids_in_vocab(generated_ids, n)))
            parts.append(repeated)
        if p.presence_penalty or p.frequency_penalty:
            generated = _ids_in_vocab(generated_ids, n)
            parts.append(generated)
        if not parts:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        ids = _unique_counts(np.concatenate(parts))[0]
        z = logits[ids].astype(np.float64)
        if self._bias is not None:
            _add_bias(z, np.searchsorted(ids, self._bias[0]), self._bias[1])
        if p.repetition_penalty != 1:
            _penalize_repetition(z, np.searchsorted(ids, repeated), float(p.repetition_penalty))
        if p.presence_penalty or p.frequency_penalty:
            _penalize_presence_frequency(z, np.searchsorted(ids, generated), float(p.presence_penalty),
                                         float(p.frequency_penalty))
        return ids, z

    def _truncate(self, keys: _Keys) -> tuple[np.ndarray | None, np.ndarray | None] | None:
        """The fast path's filters: (surviving ids, their tempered logits in float64), both None
        when every token survives; None when a float32 bound left a cut open (the exact path then
        decides). Once a filter has cut the vocabulary down, the rest run the exact path's code
        on the survivors."""
        p, n, t = self.params, keys.n, keys.t
        ids = z = None  # every id survives; no logit computed yet

        def size():
            return n if ids is None else ids.size

        if 0 < p.top_k < n:
            ids, z = keys.top_k(p.top_k)
            if t != 1:
                z /= t
        if p.top_p < 1 and size() > 1:
            if ids is None:
                ids = _nucleus(keys, p.top_p)
                if ids is None:
                    return None
                z = keys.tempered(ids)
            else:
                ids, z = self._cut(ids, z, _top_p_threshold(z, p.top_p, self._scratch_for(z)))
        if p.min_p > 0 and size() > 1:
            if ids is None:
                ids, z = keys.at_least((keys.zmax / t if t != 1 else keys.zmax) + math.log(p.min_p))
            else:
                ids, z = self._cut(ids, z, _min_p_threshold(z, p.min_p))
        if p.typical_p < 1 and size() > 1:
            if ids is None:
                ids = _typical_set(keys, p.typical_p)
                if ids is None:
                    return None
                z = keys.tempered(ids)
            else:
                sel = np.flatnonzero(_typical_keep(z, p.typical_p, self._scratch_for(z)))
                ids, z = ids[sel], z[sel]
        return ids, z

    def _scratch_for(self, z: np.ndarray) -> _Scratch:
        return self._s if z.size == self._s.n else _Scratch(z.size)

    def _where_at_least(self, z: np.ndarray, threshold: float) -> np.ndarray:
        return np.flatnonzero(np.greater_equal(z, threshold, out=self._scratch_for(z).mask))

    def _cut(self, ids, z, threshold):
        sel = self._where_at_least(z, threshold)
        return (sel if ids is None else ids[sel]), z[sel]


def _weights(z: np.ndarray) -> np.ndarray:
    """exp(z - max z): the exact path's unnormalised probabilities of survivors with tempered logits z."""
    w = z - z.max()
    return np.exp(w, out=w)


# ---------------------------------------------------------------------------------------------
# The fast path.
#
# Over 262k tokens a float64 exp costs ~1.3 ms and a partition ~0.6 ms, against ~0.02 ms for a
# float32 comparison pass. So:
#
# Keys. The logits are read as float32 keys y: the caller's array itself when nothing is edited;
# a logit edited by logit_bias or a penalty is kept exactly (float64, as the exact path computes
# it) and its key is its float32 rounding. Rounding to nearest is monotone, so a set {y >= g}
# holds every token whose exact logit is at least one of its members': an upper set of the exact
# order. top_k and min_p pick such a set a little larger than they need (from a strided sample
# of the keys) and redo their comparisons in float64 on it: their results are exact.
#
# Weights. top_p, typical_p and a draw over the untruncated vocabulary need sums of
# exp(z/T - max) over every token. These are summed from float32 estimates w = exp((y - ymax)/T)
# together with err, a bound on sum |w - exact| over all tokens, exact being what the float64
# path computes: numpy's float32 exp is within 2 ulp (tests check _EXP32_ERR), three float32
# roundings in (y - ymax)/T put at most _ARITH32_ERR * |x| on each x, edited keys add their
# rounding, and float64 sums here and in the exact path differ by rounding (_SUM_SLACK). A
# decision (where the nucleus ends, which tokens typical sampling keeps, which token a uniform
# falls on) is taken only when every set of values within those bounds leads to the same one;
# otherwise the exact path decides. Open decisions are rare (err is ~1e-6 of the total): a
# uniform within err of a step of the CDF, which happens to ~10% of the draws over a whole flat
# vocabulary and almost never when a few tokens dominate, or a typical_p boundary within err of
# a token's mass. So the fast path returns what the exact path returns, token for token.
#
# Long sums of products are einsum or float64 sums, never np.dot: OpenBLAS runs a long dot on
# its threads, and waking them costs milliseconds on a busy machine.

_FAST_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))  # logits float32 holds exactly
# (y - ymax) / T stays finite and far from float32's limits, and distinct float32 logits stay
# distinct after a float64 division by T; outside this range the exact path runs.
_FAST_TEMPERATURES = (2.0**-20, 2.0**20)
# Below this the float64 path divides logits already shifted to max 0 (none of which can overflow);
# at and above it, as transformers does. No temperature of the fast path is below it.
_SMALL_TEMPERATURE = _FAST_TEMPERATURES[0]
_X_FLOOR = 200.0  # x = z/T - max is floored here in float32: exp(-200) is 0 in float32 and < 1e-86 exact
_EXP32_ERR = 2.0**-21  # relative error bound of np.exp on float32 (measured within 2**-22; a test checks)
_ARITH32_ERR = 2.0**-22  # relative error bound of float32 (y - ymax) / T (three roundings)
_SUM_SLACK = 2.0**-30  # relative: float64 sums over a vocabulary of up to millions of tokens
_SAMPLE_STRIDE = 61  # keys sampled to guess a threshold; prime, so a periodic layout does not bias it
_F32_MAX = float(np.finfo(np.float32).max)


class _Scratch32:
    """(n,) float32 buffers of the fast path, allocated once per vocabulary size."""

    def __init__(self, n: int):
        self.n = n
        self.y = np.empty(n, np.float32)  # keys when some logit is edited
        self.x = np.empty(n, np.float32)  # (y - ymax) / T
        self.w = np.empty(n, np.float32)  # exp(x)
        self.k = np.empty(n, np.float32)  # w * x for typical's moments
        self.mask = np.empty(n, dtype=bool)


class _Keys:
    """One step's logits after logit_bias and penalties, as float32 keys (see "The fast path").

    raw     (n,) the caller's logits, float32 or float16, never written
    y       (n,) float32 keys: raw itself, or a scratch copy with the edited logits rounded in
    edit_*  (m,) the edited ids (sorted), their exact float64 logits, |key - exact logit|
    zmax    the exact largest logit
    """

    def __init__(self, raw: np.ndarray, y: np.ndarray, ymax: float, edit_ids: np.ndarray, edit_z: np.ndarray,
                 temperature: float, scratch: _Scratch32):
        self.raw, self.y, self.n, self.ymax = raw, y, raw.size, ymax
        self.edit_ids, self.edit_z = edit_ids, edit_z
        self.t, self.s = temperature, scratch
        self.zmax = self.ymax
        self.edit_off = np.zeros(edit_ids.size)
        if edit_ids.size:  # the tokens holding the largest key hold the largest exact logit
            top = np.flatnonzero(np.equal(y, np.float32(self.ymax), out=scratch.mask))
            self.zmax = float(self.exact(top).max())
            rounded = y[edit_ids].astype(np.float64)
            off = np.subtract(rounded, edit_z, out=self.edit_off, where=rounded != edit_z)  # -inf: exact
            np.abs(off, out=self.edit_off)
        self._weights = None

    def exact(self, ids: np.ndarray) -> np.ndarray:
        """(len(ids),) float64: the exact logits of ids."""
        z = self.raw[ids].astype(np.float64)
        if self.edit_ids.size:
            pos = np.minimum(np.searchsorted(self.edit_ids, ids), self.edit_ids.size - 1)
            hit = self.edit_ids[pos] == ids
            z[hit] = self.edit_z[pos[hit]]
        return z

    def tempered(self, ids: np.ndarray) -> np.ndarray:
        """The exact path's z / T for ids."""
        z = self.exact(ids)
        if self.t != 1:
            z /= self.t
        return z

    def top_k(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids, exact logits) of the tokens at or above the k-th largest logit, 0 < k < n."""
        ids = _upper_set(self.y, k, self.s.mask)
        z = self.exact(ids)
        keep = z >= np.partition(z, z.size - k)[z.size - k]
        return ids[keep], z[keep]

    def at_least(self, threshold: float) -> tuple[np.ndarray, np.ndarray]:
        """(ids, tempered logits) of the tokens whose exact z / T >= threshold."""
        # fl(z / T) >= threshold needs z >= T * threshold less a few float64 ulps; below that
        # bound, keys are below its float32 rounding down.
        bound = threshold * self.t
        g = _f32_at_most(bound - abs(bound) * 2.0**-40 - 2.0**-1000)
        ids = np.flatnonzero(np.greater_equal(self.y, g, out=self.s.mask))
        z = self.tempered(ids)
        keep = z >= threshold
        return ids[keep], z[keep]

    def one_value(self, g: np.float32) -> bool:
        """Whether the tokens with key g share one exact tempered logit that no other token has.
        Without edits this always holds: the keys are then the logits, and distinct float32
        logits stay distinct after a float64 division by a temperature in range."""
        if not self.edit_ids.size:
            return True
        z = self.tempered(np.flatnonzero(np.equal(self.y, g, out=self.s.mask)))
        if z.min() != z.max():
            return False
        edited = self.edit_z / self.t if self.t != 1 else self.edit_z
        return bool(np.array_equal(self.y[self.edit_ids] == g, edited == z[0]))

    def weights(self) -> _Weights:
        if self._weights is None:
            self._weights = _Weights(self)
        return self._weights


def _x32(y: np.ndarray, ymax: float, t: float, out: np.ndarray | None = None) -> np.ndarray:
    """(y - ymax) / t in float32, floored at -_X_FLOOR: every estimate of x = z/T - max is made by
    these same operations, so equal keys always give equal estimates. The floor keeps -inf
    logits (and float32 overflow) out of products with zero weights; the pass is skipped when
    nothing is below it."""
    with np.errstate(over="ignore"):  # -inf, then floored
        x = np.subtract(y, np.float32(ymax), out=out)
        if t != 1:
            np.divide(x, np.float32(t), out=x)
    if x.min() < -_X_FLOOR:
        np.maximum(x, np.float32(-_X_FLOOR), out=x)
    return x


class _Weights:
    """Float32 estimates of the exact path's weights exp(z/T - max) over the whole vocabulary.

    x, w    (n,) float32 estimates of z/T - max and of the weights (views of scratch buffers)
    total   their sum (float64, by blocks of _INVERSE_CDF_BLOCK: cum_blocks)
    b       a bound on the error of every x that does not shrink with |x|; an edited token's x
            is off by its edit_off / T more
    err     a bound on sum |w - exact weight| over all tokens plus float64 rounding: any partial
            sum of w, total included, is within err of the exact path's
    """

    def __init__(self, keys: _Keys):
        n = keys.n
        self.keys = keys
        self.x = x = _x32(keys.y, keys.ymax, keys.t, keys.s.x)
        self.w = w = np.exp(x, out=keys.s.w)
        self.cum_blocks = np.cumsum(np.add.reduceat(w, np.arange(0, n, _INVERSE_CDF_BLOCK), dtype=np.float64))
        self.total = total = float(self.cum_blocks[-1])  # >= 1: the largest key's weight is exp(0)
        # |x - exact| <= _ARITH32_ERR |x| + b: b from the exact path's own float64 rounding of
        # z/T - max and from a maximum that is an edited logit rounded to its key
        self.b = (2.0**-50 * abs(keys.zmax) + 1.01 * abs(keys.ymax - keys.zmax)) / keys.t
        # sum w |x|, bounded above: a float32 sum of same-sign terms is off by n ulps at most
        # (einsum, not np.dot: BLAS threads long dots, and waking its threads costs milliseconds)
        self.w_abs_x = -float(np.einsum("i,i->", w, x)) * (1 + n * 2.0**-24) * 1.01
        # edited tokens: weights off by a factor exp(edit_off / T) more
        off = keys.edit_off / keys.t
        with np.errstate(over="ignore", invalid="ignore"):  # edits far beyond float32: inf, nothing decided
            w_edit = w[keys.edit_ids].astype(np.float64) * np.exp(off)
            self.edit_err = _nan_to_inf(1.02 * float(np.einsum("i,i->", w_edit, np.expm1(off))))
            off_x = np.expm1(off) * np.abs(x[keys.edit_ids]) + off
            self.edit_err_x = _nan_to_inf(1.05 * float(np.einsum("i,i->", w_edit, off_x)))
        self.err = self.bound(total, self.w_abs_x) + self.edit_err + _SUM_SLACK * total

    def bound(self, mass: float, w_abs_x: float) -> float:
        """A bound on sum |w - exact weight| over unedited tokens holding this estimated mass
        and sum w |x| (upper bounds), with float32 underflow (n * 2**-124)."""
        return 1.02 * ((_EXP32_ERR + self.b) * mass + _ARITH32_ERR * w_abs_x) + self.keys.n * 2.0**-124

    def moments(self) -> tuple[float, float]:
        """(sum w x accumulated in float64, an upper bound on sum w x^2)."""
        wx = np.multiply(self.w, self.x, out=self.keys.s.k)
        return (float(wx.sum(dtype=np.float64)),
                float(np.einsum("i,i->", wx, self.x)) * (1 + self.keys.n * 2.0**-24) * 1.01)

    def draw(self, u: float) -> int | None:
        """The token the exact path's inverse CDF picks for u over every token, or None when u
        falls within err of a step of the CDF."""
        cb, block = self.cum_blocks, _INVERSE_CDF_BLOCK
        t = u * self.total
        k = min(int(np.searchsorted(cb, t, side="right")), cb.size - 1)
        base = float(cb[k - 1]) if k else 0.0
        c = np.cumsum(self.w[k * block:(k + 1) * block], dtype=np.float64)
        i = int(np.searchsorted(c, t - base, side="right"))
        if i >= c.size:
            return None
        lo, hi = base + (float(c[i - 1]) if i else 0.0), base + float(c[i])
        # the exact t and steps are within err of these: the exact path lands on the same token
        return k * block + i if lo + 2 * self.err <= t and t + 2 * self.err < hi else None


def _nan_to_inf(v: float) -> float:
    return math.inf if math.isnan(v) else v


def _f32_at_most(v: float) -> np.float32:
    """The largest float32 <= v (a float64)."""
    if v < -_F32_MAX:
        return np.float32(-np.inf)
    g = np.float32(min(v, _F32_MAX))
    return np.nextafter(g, np.float32(-np.inf)) if float(g) > v else g


def _upper_set(y: np.ndarray, m: int, mask: np.ndarray | None = None) -> np.ndarray:
    """Indices (increasing) of a set {y >= g} with at least m members, 0 < m < y.size; usually
    about 2m + 500 of them. g is read off a strided sample of y; in the rare case that the sample
    misleads, a partition of all of y gives the m-th largest value."""
    sample = y[::_SAMPLE_STRIDE]
    r = min(sample.size, 2 * (m // _SAMPLE_STRIDE) + 8)
    g = np.partition(sample, sample.size - r)[sample.size - r]
    ids = np.flatnonzero(np.greater_equal(y, g, out=mask))
    if ids.size < m:
        g = np.partition(y, y.size - m)[y.size - m]
        ids = np.flatnonzero(np.greater_equal(y, g, out=mask))
    return ids


def _nucleus(keys: _Keys, top_p: float) -> np.ndarray | None:
    """The ids (increasing) the exact top_p filter keeps from the whole vocabulary, or None when
    the bounds cannot tell.

    The nucleus is {y >= g}, g the key where the mass summed from the top reaches top_p of the
    total. Sorting the keys of an upper set that holds that mass finds g; it is taken when the
    bounds leave no doubt that the exact mass above g falls short of top_p * total and the mass
    down to g's tokens reaches it, and g's tokens share one exact logit. In a flat distribution
    the token at the boundary weighs about as little as err: the candidates are then weighed
    exactly (float64, as the exact path does), which leaves only the rest's mass estimated."""
    wts = keys.weights()
    total, err, y = wts.total, wts.err, keys.y
    cand = None
    for m in (256, 4096, 32768):
        if m >= keys.n:
            break
        ids = _upper_set(y, m, keys.s.mask)
        if wts.w[ids].sum(dtype=np.float64) - err >= top_p * (total + err):
            cand = ids
            break
    if cand is None:  # the tokens below eps weigh (1 - top_p) / 4 of the total at most, together
        eps = (1 - top_p) * total / (4 * keys.n)
        cand = np.flatnonzero(np.greater_equal(y, _f32_at_most(keys.ymax + keys.t * math.log(eps)),
                                               out=keys.s.mask))
        if wts.w[cand].sum(dtype=np.float64) - err < top_p * (total + err):
            return None
    vals = np.sort(y[cand])
    from_top = np.cumsum(np.exp(_x32(vals, keys.ymax, keys.t))[::-1], dtype=np.float64)
    j = int(np.searchsorted(from_top, top_p * total))
    if j >= vals.size:
        return None
    g = vals[vals.size - 1 - j]
    above = vals.size - int(np.searchsorted(vals, g, side="right"))
    down_to = vals.size - int(np.searchsorted(vals, g, side="left"))
    mass_above = from_top[above - 1] if above else 0.0
    if mass_above + err < top_p * (total - err) and top_p * (total + err) <= from_top[down_to - 1] - err:
        return cand[y[cand] >= g] if keys.one_value(g) else None
    # exact weights of the candidates; the rest's mass and its bound from the estimates
    x = keys.tempered(cand)
    x -= keys.zmax / keys.t if keys.t != 1 else keys.zmax
    e = np.exp(x)
    rest = max(total - float(wts.w[cand].sum(dtype=np.float64)), 0.0)
    w_abs_x = -float(np.multiply(wts.w, wts.x, out=keys.s.k).sum(dtype=np.float64)) * (1 + 2.0**-12)
    rest_abs_x = max(w_abs_x + float(np.einsum("i,i->", e, np.where(e > 0, x, 0.0))), 0.0)  # -inf weighs 0
    total = float(e.sum()) + rest
    err = wts.bound(rest * 1.001, rest_abs_x) + wts.edit_err + _SUM_SLACK * total
    need_lo, need_hi = top_p * (total - err), top_p * (total + err)
    yc = y[cand]
    for _ in range(4):  # the estimates may have put g a group or two off
        above = float(e[yc > g].sum()) + _SUM_SLACK * total
        down_to = float(e[yc >= g].sum()) - _SUM_SLACK * total
        if above < need_lo and down_to >= need_hi:
            return cand[yc >= g] if keys.one_value(g) else None
        if above >= need_lo and g != vals[-1]:
            g = vals[np.searchsorted(vals, g, side="right")]  # the next key up
        elif down_to < need_hi and g != vals[0]:
            g = vals[np.searchsorted(vals, g) - 1]  # the next key down
        else:
            return None
    return None


def _first_true(values, pred) -> int:
    """The first index whose value satisfies pred, for a pred that is False then True along
    values; len(values) if none does (bisect's key= needs Python 3.10)."""
    lo, hi = 0, len(values)
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(values[mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _typical_set(keys: _Keys, mass: float) -> np.ndarray | None:
    """The ids (increasing) the exact typical filter keeps from the whole vocabulary, or None when
    the float32 weights cannot tell.

    With x = z/T - max and p = softmax(x), |-log p - H| = |x - c| where c = sum p x: the filter
    ranks tokens by their distance from c and keeps those up to the distance d where the mass
    reaches typical_p, i.e. the tokens with x in [c - d, c + d]. Near c, x is monotone in the key
    on either side, so sorting the keys of an upper set that reaches below c - d gives the masses
    by distance from both sides; d is taken when the bounds on c, on each x and on the masses
    leave no doubt about which tokens fall inside, and the tokens at distance d (within the
    bounds) share one exact logit."""
    wts = keys.weights()
    total, err, n, t = wts.total, wts.err, keys.n, keys.t
    sum_wx, wx2 = wts.moments()
    wx1 = -sum_wx * 1.001 + 1e-300  # sum w |x|, bounded above
    c = sum_wx / total
    log_total = math.log(total)
    a, b = _ARITH32_ERR, wts.b
    edit_b = float(keys.edit_off.max(initial=0.0)) / t  # an edited token's x is off by this much more
    # |sum w x - exact|: the weights' and the x's errors, the products' float32 rounding
    err_wx = (1.02 * ((_EXP32_ERR + a + b + 2.0**-23) * wx1 + a * wx2 + b * total) + wts.edit_err_x
              + _SUM_SLACK * wx1)
    # |c - the exact path's c|, whose entropy is a float64 dot over the vocabulary
    err_c = 1.01 * (err_wx + abs(c) * err) / (total - err) + n * 2.0**-50 * (abs(c) + log_total + 1)
    c32 = np.float32(c)
    x_low = math.log((1 - mass) * total / (8 * n))  # the tokens below hold (1 - mass) / 8 of the mass
    for _ in range(2):  # a second time from below c - d when the first set did not reach it
        g = _f32_at_most(keys.ymax + t * max(x_low, -_X_FLOOR))
        cand = np.flatnonzero(np.greater_equal(keys.y, g, out=keys.s.mask))
        vals = np.sort(keys.y[cand])
        x = _x32(vals, keys.ymax, t)
        w = np.exp(x)
        split = int(np.searchsorted(x, c32))  # x[:split] < c <= x[split:]
        # distances from c on either side, increasing (float32, as computed, widened exactly)
        left = (c32 - x[:split])[::-1].astype(np.float64)
        right = (x[split:] - c32).astype(np.float64)
        left_mass = np.concatenate(([0.0], np.cumsum(w[:split][::-1], dtype=np.float64)))
        right_mass = np.concatenate(([0.0], np.cumsum(w[split:], dtype=np.float64)))

        def reaches(dist: float) -> bool:  # the candidates at most dist from c hold the mass
            return (left_mass[np.searchsorted(left, dist, side="right")]
                    + right_mass[np.searchsorted(right, dist, side="right")]) >= mass * total

        d = math.inf  # the smallest distance, on either side, that reaches the mass
        for side in (left, right):
            i = _first_true(side, reaches)
            if i < side.size:
                d = min(d, float(side[i]))
        if d == math.inf:
            return None
        # |distance computed - the exact path's shifted| for tokens near d
        eta = (1.01 * ((a + 2.0**-23) * (abs(c) + d + 1) + b + edit_b + err_c + 2.0**-24 * abs(c))
               + 2.0**-49 * (2 * abs(c) + d + 1 + 2 * log_total))
        if split and left[-1] > d + 2 * eta:  # every token within d + 2 eta of c is a candidate
            break
        x_low = c - d - 1
    else:
        return None
    if c - d - 2 * eta < 1 - _X_FLOOR:  # the window reaches floored estimates
        return None
    lo, hi = d - 2 * eta, d + 2 * eta
    left_lo, left_hi = int(np.searchsorted(left, lo)), int(np.searchsorted(left, hi, side="right"))
    right_lo, right_hi = int(np.searchsorted(right, lo)), int(np.searchsorted(right, hi, side="right"))
    before = left_mass[left_lo] + right_mass[right_lo]  # surely closer to c than d's tokens
    through = left_mass[left_hi] + right_mass[right_hi]
    if not (before + err) / (total - err) + _SUM_SLACK < mass <= (through - err) / (total + err) - _SUM_SLACK:
        return None
    band = np.concatenate((vals[split - left_hi:split - left_lo], vals[split + right_lo:split + right_hi]))
    if band.min() != band.max() or not keys.one_value(band[0]):
        return None
    inside = vals[split - left_hi:split + right_hi]  # keys of the tokens kept: a range
    sel = keys.y[cand]
    return cand[(sel >= inside[0]) & (sel <= inside[-1])]


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
    if not is_int(n) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    logits = np.asarray(logits)
    z = _f64(logits)
    m = z.max()
    _check_finite(m)  # NaN anywhere makes the max NaN
    # exp in place, then logits - m once more: the same values as log(exp(z - m).sum()) with no
    # second vocabulary-sized array (a fresh one page-faults: it costs more than the exp)
    z -= m
    total = np.exp(z, out=z).sum()
    np.subtract(logits, m, out=z, dtype=np.float64)
    z -= math.log(total)
    n = min(int(n), z.size)
    if n == 0:
        best = np.zeros(0, dtype=np.int64)
    else:
        # every tie of the n-th, in id order, then cut after sorting; the n-th value is found
        # in an upper set a little larger than n rather than by partitioning the vocabulary
        cand = _upper_set(z, n) if n < z.size else np.arange(z.size)
        kth = np.partition(z[cand], cand.size - n)[cand.size - n]
        best = cand[z[cand] >= kth]
        best = best[np.argsort(-z[best], kind="stable")][:n]
    return TopLogprobs(z, best.astype(np.int64), z[best])
