"""Sampling: each logits processor against its definition and against transformers' processor of the
same name (same -inf masks, same finite values), OpenAI's penalties against a hand computation, the
Sampler's fast path against the reference pipeline, draws against their distribution (chi-square),
reproducibility by seed, and a ValueError naming the setting for every bad value."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers.generation.logits_process as lp
from scipy.stats import chisquare

from pyllm.errors import PyllmError
from pyllm.sampling import (
    Sampler,
    SamplingParams,
    SamplingParamsError,
    apply_logit_bias,
    apply_presence_frequency_penalty,
    apply_repetition_penalty,
    apply_temperature,
    min_p_filter,
    process_logits,
    top_k_filter,
    top_logprobs,
    top_p_filter,
    typical_filter,
)



def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def hf(processor, logits: np.ndarray, input_ids=(0,)) -> np.ndarray:
    """transformers' processor on one float64 row."""
    scores = torch.tensor(np.asarray(logits, dtype=np.float64))[None].clone()
    return processor(torch.tensor([list(input_ids)]), scores).numpy()[0]


def assert_same(ours: np.ndarray, theirs: np.ndarray) -> None:
    np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(theirs))
    kept = ~np.isneginf(theirs)
    np.testing.assert_allclose(ours[kept], theirs[kept], rtol=0, atol=1e-6)


def logit_vectors():
    """Fixed logits: peaked, flat, wide, with some tokens already -inf (as after top-k)."""
    g = np.random.default_rng(7)
    out = [np.array([2.0, -1.0, 0.5, 3.0, -3.0, 0.0, 1.5, -0.5]), g.standard_normal(100) * 0.3,
           g.standard_normal(257) * 4.0, g.standard_normal(1000) * 2.0]
    masked = g.standard_normal(64) * 2.0
    masked[g.choice(64, 20, replace=False)] = -np.inf
    masked[0] = 5.0
    out.append(masked)
    return out


VECTORS = logit_vectors()


# ---------------------------------------------------------------------------------------------
# Each processor against its definition and against transformers

@pytest.mark.parametrize("t", [0.1, 0.7, 1.0, 2.5])
def test_temperature_divides_and_matches_transformers(t):
    for z in VECTORS:
        finite = np.isfinite(z)
        np.testing.assert_allclose(apply_temperature(z, t)[finite], z[finite] / t)
        assert_same(apply_temperature(z, t), hf(lp.TemperatureLogitsWarper(float(t)), z))


@pytest.mark.parametrize("k", [1, 2, 5, 50, 999, 1000, 5000])
def test_top_k_keeps_the_k_largest_and_matches_transformers(k):
    for z in VECTORS:
        out = top_k_filter(z, k)
        kept = np.flatnonzero(np.isfinite(out))
        expected = np.sort(np.argsort(-z, kind="stable")[:min(k, z.size)])
        expected = expected[np.isfinite(z[expected])]
        np.testing.assert_array_equal(kept, expected)
        np.testing.assert_array_equal(out[kept], z[kept])
        assert_same(out, hf(lp.TopKLogitsWarper(k), z))


def test_top_k_keeps_every_tie_of_the_kth_like_transformers():
    z = np.array([3.0, 1.0, 2.0, 2.0, 2.0, 0.0])
    out = top_k_filter(z, 2)
    assert np.flatnonzero(np.isfinite(out)).tolist() == [0, 2, 3, 4]
    assert_same(out, hf(lp.TopKLogitsWarper(2), z))


def test_top_k_zero_is_off():
    z = VECTORS[2]
    np.testing.assert_array_equal(top_k_filter(z, 0), z)


def nucleus_by_definition(z: np.ndarray, top_p: float) -> set[int]:
    """The smallest most-likely-first set whose probability reaches top_p."""
    p = softmax(z)
    kept, mass = set(), 0.0
    for i in sorted(range(z.size), key=lambda i: -z[i]):
        if mass >= top_p:
            break
        kept.add(i)
        mass += p[i]
    return kept


@pytest.mark.parametrize("top_p", [0.01, 0.2, 0.5, 0.8, 0.9, 0.95, 0.999])
def test_top_p_keeps_the_nucleus_and_matches_transformers(top_p):
    for z in VECTORS:
        out = top_p_filter(z, top_p)
        assert set(np.flatnonzero(np.isfinite(out)).tolist()) == nucleus_by_definition(z, top_p)
        assert_same(out, hf(lp.TopPLogitsWarper(top_p), z))


def test_top_p_on_a_large_flat_vocabulary_matches_transformers():
    # Wide enough that only a prefix of the candidates is sorted (the path real vocabularies take).
    z = np.random.default_rng(3).standard_normal(50_000) * 0.5
    for top_p in (0.05, 0.5, 0.9):
        assert_same(top_p_filter(z, top_p), hf(lp.TopPLogitsWarper(top_p), z))


def test_top_p_always_keeps_the_top_token():
    z = np.array([10.0, 0.0, -1.0])
    assert np.flatnonzero(np.isfinite(top_p_filter(z, 1e-9))).tolist() == [0]


def test_top_p_keeps_every_token_tied_with_the_last_one_needed():
    # Four tokens of 0.25: top_p = 0.6 needs three. transformers keeps the three its sort happens
    # to put last; the definition here keeps the whole tie, so the result ignores token order.
    z = np.zeros(4)
    ours = set(np.flatnonzero(np.isfinite(top_p_filter(z, 0.6))).tolist())
    theirs = set(np.flatnonzero(np.isfinite(hf(lp.TopPLogitsWarper(0.6), z))).tolist())
    assert ours == {0, 1, 2, 3} and len(theirs) == 3 and theirs <= ours
    # A tie away from the boundary changes nothing.
    z = np.array([1.0, 1.0, 0.0, -5.0])
    assert_same(top_p_filter(z, 0.6), hf(lp.TopPLogitsWarper(0.6), z))


@pytest.mark.parametrize("min_p", [0.0, 0.01, 0.1, 0.5, 1.0])
def test_min_p_keeps_tokens_near_the_top_probability_and_matches_transformers(min_p):
    for z in VECTORS:
        out = min_p_filter(z, min_p)
        p = softmax(z)
        np.testing.assert_array_equal(np.isfinite(out), (p >= min_p * p.max()) & np.isfinite(z))
        assert_same(out, hf(lp.MinPLogitsWarper(min_p), z))


@pytest.mark.parametrize("mass", [0.05, 0.2, 0.5, 0.9, 0.99])
def test_typical_keeps_the_tokens_closest_to_the_entropy_and_matches_transformers(mass):
    for z in VECTORS:
        out = typical_filter(z, mass)
        assert_same(out, hf(lp.TypicalLogitsWarper(mass), z))
        # The definition: rank by |-log p - H|, keep the ranks up to where the mass reaches `mass`.
        live = np.isfinite(z)
        p = softmax(z)
        logp = np.where(live, np.log(np.where(live, p, 1.0)), -np.inf)
        h = -np.sum(p[live] * logp[live])
        dist = np.where(live, np.abs(-logp - h), np.inf)
        order = np.argsort(dist, kind="stable")
        last = min(int(np.count_nonzero(np.cumsum(p[order]) < mass)), z.size - 1)
        expected = dist <= dist[order[last]]
        expected[order[0]] = True
        np.testing.assert_array_equal(np.isfinite(out), expected & live)


def test_typical_on_a_large_vocabulary_matches_transformers():
    z = np.random.default_rng(4).standard_normal(40_000) * 1.5
    for mass in (0.2, 0.9):
        assert_same(typical_filter(z, mass), hf(lp.TypicalLogitsWarper(mass), z))


@pytest.mark.parametrize("penalty", [0.5, 1.0, 1.3, 2.0])
def test_repetition_penalty_divides_positive_multiplies_negative_and_matches_transformers(penalty):
    z = np.array([2.0, -1.0, 0.5, 3.0, -3.0, 0.0, 1.5, -0.5])
    seen = [0, 1, 1, 5, 7, 0]  # duplicates count once; 0.0 stays 0.0
    expected = z.copy()
    for i in set(seen):
        expected[i] = z[i] / penalty if z[i] > 0 else z[i] * penalty
    out = apply_repetition_penalty(z, seen, penalty)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-15)
    assert_same(out, hf(lp.RepetitionPenaltyLogitsProcessor(float(penalty)), z, seen))
    big = VECTORS[3]
    ids = np.random.default_rng(5).integers(0, big.size, 300).tolist()
    assert_same(apply_repetition_penalty(big, ids, penalty),
                hf(lp.RepetitionPenaltyLogitsProcessor(float(penalty)), big, ids))


def test_repetition_penalty_ignores_ids_outside_the_vocabulary():
    z = np.array([1.0, -1.0])
    np.testing.assert_array_equal(apply_repetition_penalty(z, [5, -1, 1], 2.0), [1.0, -2.0])


def test_presence_and_frequency_penalties_follow_openai_by_hand():
    z = np.array([1.0, -1.0, 0.5, 2.0, 0.0])
    generated = [0, 0, 3, 2, 0]  # counts: 0 → 3, 2 → 1, 3 → 1; 1 and 4 never generated
    out = apply_presence_frequency_penalty(z, generated, presence_penalty=0.25, frequency_penalty=0.5)
    expected = [1.0 - 3 * 0.5 - 0.25, -1.0, 0.5 - 0.5 - 0.25, 2.0 - 0.5 - 0.25, 0.0]
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-15)
    # negative values reward repetition
    out = apply_presence_frequency_penalty(z, generated, presence_penalty=-1.0, frequency_penalty=-0.5)
    np.testing.assert_allclose(out, [1.0 + 1.5 + 1.0, -1.0, 0.5 + 0.5 + 1.0, 2.0 + 0.5 + 1.0, 0.0])


def test_presence_and_frequency_penalties_count_only_generated_tokens():
    z = np.array([1.0, 1.0, 1.0])
    params = SamplingParams(presence_penalty=1.0, frequency_penalty=1.0)
    out = process_logits(z, params, context_ids=[0, 0, 0, 1], generated_ids=[2])
    np.testing.assert_allclose(out, [1.0, 1.0, -1.0])


def test_logit_bias_is_added():
    z = np.array([0.0, 1.0, 2.0])
    np.testing.assert_allclose(apply_logit_bias(z, {0: 5.0, 2: -1.5}), [5.0, 1.0, 0.5])
    np.testing.assert_array_equal(apply_logit_bias(z, None), z)


def test_processors_do_not_modify_their_input():
    z = VECTORS[3].copy()
    before = z.copy()
    apply_logit_bias(z, {0: 1.0})
    apply_repetition_penalty(z, [0, 1, 2], 1.5)
    apply_presence_frequency_penalty(z, [0, 1], 0.5, 0.5)
    apply_temperature(z, 0.5)
    top_k_filter(z, 3)
    top_p_filter(z, 0.5)
    min_p_filter(z, 0.2)
    typical_filter(z, 0.5)
    np.testing.assert_array_equal(z, before)


def test_pipeline_matches_transformers_processor_list_in_order():
    z = VECTORS[3]
    ctx, gen = [1, 2, 3, 50, 50], [7, 8, 9]
    params = SamplingParams(temperature=0.7, top_k=200, top_p=0.9, min_p=0.02, typical_p=0.95,
                            repetition_penalty=1.3)
    chain = lp.LogitsProcessorList([
        lp.RepetitionPenaltyLogitsProcessor(1.3), lp.TemperatureLogitsWarper(0.7),
        lp.TopKLogitsWarper(200), lp.TopPLogitsWarper(0.9), lp.MinPLogitsWarper(0.02),
        lp.TypicalLogitsWarper(0.95)])
    ours = process_logits(z, params, ctx, gen)
    theirs = hf(chain, z, ctx + gen)
    assert_same(ours, theirs)
    assert 1 < np.isfinite(ours).sum() < 200


# ---------------------------------------------------------------------------------------------
# The Sampler

def sampler_cases():
    g = np.random.default_rng(11)
    cases = []
    for n in (2, 300, 5000, 40_000):
        for settings in ({"temperature": 1.0}, {"temperature": 0.6, "top_k": 10},
                         {"temperature": 1.3, "top_p": 0.8}, {"temperature": 0.9, "min_p": 0.1},
                         {"temperature": 0.8, "typical_p": 0.7},
                         {"temperature": 0.7, "top_k": 50, "top_p": 0.95, "min_p": 0.05, "typical_p": 0.9},
                         {"temperature": 1.0, "repetition_penalty": 1.4, "presence_penalty": 0.5,
                          "frequency_penalty": 0.3, "logit_bias": {1: 4.0, 0: -2.0}, "top_p": 0.9}):
            cases.append((n, settings, (g.standard_normal(n) * 3).astype(np.float32)))
    return cases


@pytest.mark.parametrize("n,settings,z", sampler_cases(),
                         ids=lambda v: str(v) if isinstance(v, (int, dict)) else "")
def test_sampler_distribution_equals_the_reference_pipeline(n, settings, z):
    ctx = [int(i) for i in np.random.default_rng(n).integers(0, n, 40)]
    gen = ctx[-5:] + [1, 1]
    params = SamplingParams(**settings)
    ref = process_logits(z, params, ctx, gen)
    kept = np.flatnonzero(np.isfinite(ref))
    sampler = Sampler(params)
    for _ in range(2):  # the second call reuses the scratch buffers
        ids, probs = sampler.distribution(z, ctx, gen)
        np.testing.assert_array_equal(ids, kept)
        np.testing.assert_allclose(probs, softmax(ref[kept]), rtol=1e-9, atol=1e-15)


def draw(params: SamplingParams, z: np.ndarray, n: int) -> np.ndarray:
    sampler = Sampler(params)
    return np.bincount([sampler.sample(z, [], []) for _ in range(n)], minlength=z.size)


def test_sampling_matches_the_distribution_chi_square():
    p = np.array([0.30, 0.20, 0.15, 0.10, 0.08, 0.07, 0.05, 0.03, 0.015, 0.005])
    counts = draw(SamplingParams(temperature=1.0, seed=2024), np.log(p).astype(np.float32), 20_000)
    assert chisquare(counts, 20_000 * p).pvalue > 0.001


def test_sampling_at_a_temperature_matches_the_rescaled_distribution():
    p = np.array([0.30, 0.20, 0.15, 0.10, 0.08, 0.07, 0.05, 0.03, 0.015, 0.005])
    expected = softmax(np.log(p) / 0.5)
    counts = draw(SamplingParams(temperature=0.5, seed=5), np.log(p).astype(np.float32), 20_000)
    assert chisquare(counts, 20_000 * expected).pvalue > 0.001


@pytest.mark.parametrize("settings", [{"top_k": 4}, {"top_p": 0.7}, {"min_p": 0.2},
                                      {"top_k": 6, "top_p": 0.8, "min_p": 0.1}, {"typical_p": 0.6}])
def test_truncated_sampling_matches_the_kept_distribution_and_never_leaves_it(settings):
    p = np.array([0.30, 0.20, 0.15, 0.10, 0.08, 0.07, 0.05, 0.03, 0.015, 0.005])
    z = np.log(p).astype(np.float32)
    params = SamplingParams(temperature=1.0, seed=99, **settings)
    ref = process_logits(z, params)
    kept = np.isfinite(ref)
    assert 1 < kept.sum() < z.size
    counts = draw(params, z, 20_000)
    assert counts[~kept].sum() == 0
    assert chisquare(counts[kept], 20_000 * softmax(ref[kept])).pvalue > 0.001


def test_sampling_over_a_large_vocabulary_matches_the_distribution():
    # Over 4096 tokens the inverse CDF goes through block sums; bins of 100 ids keep counts large.
    z = (np.random.default_rng(8).standard_normal(6000) * 0.5).astype(np.float32)
    counts = draw(SamplingParams(temperature=1.0, seed=3), z, 20_000)
    expected = softmax(z.astype(np.float64))
    assert chisquare(counts.reshape(60, 100).sum(1), 20_000 * expected.reshape(60, 100).sum(1)).pvalue > 0.001


def test_inverse_cdf_matches_a_plain_cumsum_and_never_picks_a_zero_weight():
    from pyllm.sampling import _inverse_cdf

    g = np.random.default_rng(6)
    for n in (3, 100, 4096, 4097, 20_000):
        w = g.random(n) ** 4
        w[g.choice(n, n // 4, replace=False)] = 0.0
        c = np.cumsum(w)
        for u in g.random(200):
            assert _inverse_cdf(w, u) == np.searchsorted(c, u * c[-1], side="right")
    top = np.nextafter(1.0, 0.0)  # the largest uniform numpy can draw
    assert _inverse_cdf(np.array([1.0, 2.0, 0.0, 0.0]), top) == 1
    assert _inverse_cdf(np.array([1.0, 2.0, 0.0, 0.0]), 0.0) == 0
    w = np.zeros(10_000)
    w[[3, 5000, 6001]] = [1e-300, 1.0, 1e-300]
    assert {_inverse_cdf(w, u) for u in (0.0, 0.3, 0.9, top)} <= {3, 5000, 6001}
    assert _inverse_cdf(w, 0.5) == 5000


def test_same_seed_gives_the_same_tokens_and_another_seed_does_not():
    g = np.random.default_rng(0)
    steps = [(g.standard_normal(3000) * 2).astype(np.float32) for _ in range(100)]

    def run(seed):
        s = Sampler(SamplingParams(temperature=0.9, top_p=0.95, seed=seed))
        return [s.sample(z, [], []) for z in steps]

    assert run(42) == run(42)
    assert run(42) != run(43)


def test_each_sampled_token_consumes_exactly_one_uniform():
    z = np.array([0.0, 0.5, 1.0], dtype=np.float32)
    s = Sampler(SamplingParams(temperature=1.0, top_k=1, seed=5))
    for _ in range(7):
        s.sample(z, [], [])
    reference = np.random.default_rng(5)
    reference.random(7)
    assert s.rng.random() == reference.random()


def test_greedy_takes_the_argmax_after_bias_and_penalties():
    z = np.array([1.0, 3.0, 2.9, -1.0], dtype=np.float32)
    assert Sampler(SamplingParams()).sample(z, [], []) == 1
    assert Sampler(SamplingParams(repetition_penalty=1.5)).sample(z, [1], []) == 2
    assert Sampler(SamplingParams(frequency_penalty=2.0)).sample(z, [], [1]) == 2
    assert Sampler(SamplingParams(logit_bias={3: 10.0})).sample(z, [], []) == 3
    # the prompt does not count for OpenAI's penalties
    assert Sampler(SamplingParams(presence_penalty=2.0)).sample(z, [1, 1, 1], []) == 1


def test_legacy_construction_and_call_still_work():
    z = np.array([0.0, 2.0, 1.0], dtype=np.float32)
    assert Sampler(0.0)(z) == 1
    assert Sampler()(z) == 1
    a, b = Sampler(0.8, 7), Sampler(SamplingParams(temperature=0.8, seed=7))
    assert [a(z) for _ in range(20)] == [b(z) for _ in range(20)]
    with pytest.raises(ValueError, match="seed"):
        Sampler(SamplingParams(), seed=3)


def test_sampler_leaves_the_callers_logits_alone():
    z = np.array([0.0, 2.0, 1.0], dtype=np.float64)
    Sampler(SamplingParams(temperature=0.5, repetition_penalty=2.0, logit_bias={0: 1.0}, seed=1)).sample(z, [1], [2])
    np.testing.assert_array_equal(z, [0.0, 2.0, 1.0])


def test_non_finite_logits_raise_a_pyllm_error():
    for params in (SamplingParams(), SamplingParams(temperature=1.0)):
        with pytest.raises(PyllmError, match="non-finite"):
            Sampler(params).sample(np.array([0.0, np.nan, 1.0], dtype=np.float32), [], [])


def test_logit_bias_outside_the_logits_raises_at_sampling():
    with pytest.raises(ValueError, match="logit_bias"):
        Sampler(SamplingParams(logit_bias={10: 1.0})).sample(np.zeros(5, np.float32), [], [])


# ---------------------------------------------------------------------------------------------
# Logprobs

def test_top_logprobs_are_the_raw_log_softmax():
    z = VECTORS[3].astype(np.float32)
    out = top_logprobs(z, 5)
    ref = torch.log_softmax(torch.tensor(z, dtype=torch.float64), -1).numpy()
    np.testing.assert_allclose(out.logprobs, ref, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(out.ids, np.argsort(-ref, kind="stable")[:5])
    np.testing.assert_allclose(out.values, ref[out.ids])
    _, ids, values = top_logprobs(z, 0)
    assert ids.size == 0 and values.size == 0
    assert top_logprobs(np.array([1.0, 3.0, 3.0, 2.0]), 2).ids.tolist() == [1, 2]
    assert top_logprobs(np.array([1.0, 2.0]), 9).ids.tolist() == [1, 0]


# ---------------------------------------------------------------------------------------------
# Validation

BAD_SETTINGS = [
    ("temperature", -0.1), ("temperature", math.nan), ("temperature", math.inf), ("temperature", "hot"),
    ("top_k", -1), ("top_k", 2.5), ("top_k", True),
    ("top_p", 0.0), ("top_p", 1.5), ("top_p", -0.2), ("top_p", math.nan),
    ("typical_p", 0.0), ("typical_p", 1.01), ("typical_p", math.nan),
    ("min_p", -0.01), ("min_p", 1.5), ("min_p", math.nan),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("repetition_penalty", math.nan),
    ("presence_penalty", 2.5), ("presence_penalty", -2.01), ("presence_penalty", math.nan),
    ("frequency_penalty", 3.0), ("frequency_penalty", -2.5), ("frequency_penalty", math.nan),
    ("logit_bias", {"5": 1.0}), ("logit_bias", {-1: 1.0}), ("logit_bias", {5: math.inf}),
    ("logit_bias", {5: math.nan}), ("logit_bias", {5: "x"}), ("logit_bias", [(5, 1.0)]),
    ("seed", 1.5), ("seed", "42"), ("seed", -1),
]


@pytest.mark.parametrize("name,value", BAD_SETTINGS, ids=[f"{n}={v!r}" for n, v in BAD_SETTINGS])
def test_bad_setting_raises_value_error_naming_it(name, value):
    with pytest.raises(ValueError, match=name) as info:
        SamplingParams(**{name: value})
    assert isinstance(info.value, PyllmError)
    params = SamplingParams()
    setattr(params, name, value)  # changed after construction: validate() catches it again
    with pytest.raises(SamplingParamsError, match=name):
        params.validate()


def test_logit_bias_ids_are_checked_against_the_vocabulary():
    params = SamplingParams(logit_bias={99: 1.0})
    params.validate()
    params.validate(vocab_size=100)
    with pytest.raises(ValueError, match="logit_bias"):
        params.validate(vocab_size=99)


def test_edge_values_are_valid():
    SamplingParams(temperature=0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, repetition_penalty=1.0,
                   presence_penalty=-2, frequency_penalty=2, logit_bias={0: -100.0}, seed=0)
    SamplingParams(temperature=5, top_k=np.int64(3), top_p=1e-9, min_p=1.0, seed=2**70)


# ---------------------------------------------------------------------------------------------
# The fast path: float32 keys and bounded float32 weights, against the exact float64 path and
# against plain full-sort definitions, at Gemma 3's vocabulary size

VOCAB = 262_144


def big_logits(kind: str, seed: int = 0, n: int = VOCAB) -> np.ndarray:
    g = np.random.default_rng(seed)
    z = (g.standard_normal(n) * 3).astype(np.float32)
    if kind == "peaked":  # a few tokens well above the rest, as after a confident context
        z[g.choice(n, 5, replace=False)] = [20, 18.5, 17, 16, 15]
    elif kind == "ties":  # coarse values: large groups of equal logits everywhere, some -inf
        z = np.round(z / 1.5).astype(np.float32)
        z[g.choice(n, n // 10, replace=False)] = -np.inf
    elif kind == "quantized":
        z = (np.round(z * 4) / 4).astype(np.float32)
    return z


def exact_sampler(params: SamplingParams) -> Sampler:
    """A Sampler that always takes the exact float64 path (the code the fast path must agree with)."""
    s = Sampler(params)
    s._keys = lambda *args: None
    return s


FAST_SETTINGS = [
    {"temperature": 1.0}, {"temperature": 0.7}, {"temperature": 0.8, "top_k": 40},
    {"temperature": 1.0, "top_k": 1}, {"temperature": 0.8, "top_p": 0.9}, {"temperature": 1.0, "top_p": 0.95},
    {"temperature": 0.6, "top_p": 0.3},
    {"temperature": 0.8, "min_p": 0.05}, {"temperature": 1.0, "min_p": 0.3},
    {"temperature": 0.8, "typical_p": 0.9}, {"temperature": 1.0, "typical_p": 0.4},
    {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05},
    {"temperature": 0.9, "top_p": 0.9, "min_p": 0.02, "typical_p": 0.95},
    {"temperature": 0.8, "top_p": 0.9, "repetition_penalty": 1.2, "presence_penalty": 0.5,
     "frequency_penalty": 0.4},
    {"temperature": 1.0, "repetition_penalty": 1.3, "typical_p": 0.8, "logit_bias": {3: 6.0, 11: -100.0}},
    {"temperature": 0.8, "logit_bias": {5: 9.0, 17: -100.0, 1000: 1.5}, "frequency_penalty": 1.0},
]


@pytest.mark.parametrize("kind", ["peaked", "flat", "ties", "quantized"])
@pytest.mark.parametrize("settings", FAST_SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_fast_path_gives_the_exact_paths_tokens_and_distribution_at_262k(kind, settings):
    steps = [big_logits(kind, seed) for seed in range(3)]
    ctx = np.random.default_rng(1).integers(0, VOCAB, 200).tolist()
    params = SamplingParams(seed=7, **settings)
    fast, exact = Sampler(params), exact_sampler(params)
    gen_fast, gen_exact = ctx[-4:], ctx[-4:]
    for i in range(12):
        gen_fast.append(fast.sample(steps[i % 3], ctx, gen_fast))
        gen_exact.append(exact.sample(steps[i % 3], ctx, gen_exact))
    assert gen_fast == gen_exact
    ids, probs = fast.distribution(steps[0], ctx, gen_fast)
    ref_ids, ref_probs = exact.distribution(steps[0], ctx, gen_fast)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(probs, ref_probs)


def test_fast_path_takes_float16_logits_and_edits_that_land_on_other_logits():
    # An edited logit that rounds to the same float32 key as other tokens but is not equal to
    # them: the boundaries of top_k, top_p and min_p fall on that key.
    z = big_logits("quantized", 3)
    ctx = [int(np.flatnonzero(z == 5.0)[0])]
    for settings in ({"top_k": int((z >= 5.0).sum()) - 3}, {"top_p": 0.5},
                     {"min_p": float(np.exp(5.0 - z.max()))}, {"typical_p": 0.5}, {}):
        for bias in (1e-9, -1e-9, 0.0):
            params = SamplingParams(temperature=1.0, seed=1, logit_bias={ctx[0]: bias}, **settings)
            for logits in (z, z.astype(np.float16)):
                fast, exact = Sampler(params), exact_sampler(params)
                assert ([fast.sample(logits, ctx, []) for _ in range(20)]
                        == [exact.sample(logits, ctx, []) for _ in range(20)])
                np.testing.assert_array_equal(fast.distribution(logits, ctx, [])[0],
                                              exact.distribution(logits, ctx, [])[0])


def kept_by_full_sort(z: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The ids each filter keeps, straight from the definitions with one full sort per filter."""
    z = z.astype(np.float64) / params.temperature
    keep = np.isfinite(z)
    if params.top_k:
        keep &= z >= np.sort(z)[-params.top_k]  # every tie of the k-th stays
    if params.top_p < 1:
        p = softmax(np.where(keep, z, -np.inf))
        order = np.argsort(-p, kind="stable")
        last = np.searchsorted(np.cumsum(p[order]), params.top_p)  # the first position reaching top_p
        keep &= z >= z[order[last]]  # every tie of the last token needed stays
    if params.min_p:
        p = softmax(np.where(keep, z, -np.inf))
        keep &= p >= params.min_p * p.max()
    return np.flatnonzero(keep)


@pytest.mark.parametrize("settings", [
    {"top_k": 40}, {"top_k": 1000}, {"top_p": 0.9}, {"top_p": 0.95}, {"top_p": 0.5}, {"min_p": 0.05},
    {"top_k": 40, "top_p": 0.9, "min_p": 0.02}], ids=str)
@pytest.mark.parametrize("kind", ["peaked", "flat", "ties"])
def test_fast_kept_set_equals_a_full_sort_reference_at_262k(kind, settings):
    z = big_logits(kind, 5)
    params = SamplingParams(temperature=0.8, **settings)
    ids, probs = Sampler(params).distribution(z)
    np.testing.assert_array_equal(ids, kept_by_full_sort(z, params))
    np.testing.assert_allclose(probs, softmax(z[ids].astype(np.float64) / 0.8), rtol=1e-9)


def test_top_k_keeps_every_tie_of_the_kth_at_262k():
    z = np.full(VOCAB, -3.0, np.float32)
    z[np.random.default_rng(2).choice(VOCAB, 1000, replace=False)] = 1.0  # ranks 11..1010 all tie
    z[:10] = np.arange(10, 20)
    for k in (10, 11, 40, 1010):
        ids, _ = Sampler(SamplingParams(temperature=1.0, top_k=k)).distribution(z)
        np.testing.assert_array_equal(ids, kept_by_full_sort(z, SamplingParams(temperature=1.0, top_k=k)))
        assert ids.size == (10 if k == 10 else 1010)


def test_top_p_boundary_inside_or_at_the_edge_of_a_tie_group_at_262k():
    # One token holding half the mass, then eight equal tokens holding 1/16 each; the rest weigh
    # nothing. top_p reaching into the tie keeps all eight; top_p = 1/2 exactly stops at the first.
    z = np.full(VOCAB, -1e4, np.float32)
    z[100] = np.log(8.0)
    z[[5, 6000, 70_000, 80_000, 90_000, 150_000, 200_000, VOCAB - 1]] = 0.0
    for top_p, expected in ((0.5, 1), (0.5 + 1 / 32, 9), (0.75, 9), (0.99, 9)):
        params = SamplingParams(temperature=1.0, top_p=top_p)
        ids, _ = Sampler(params).distribution(z)
        assert ids.size == expected, top_p
        np.testing.assert_array_equal(ids, exact_sampler(params).distribution(z)[0])


def test_nucleus_over_flat_logits_is_settled_by_the_fast_path():
    # In a flat distribution the token at the nucleus boundary weighs about as little as the
    # float32 error bound: the candidates are then weighed exactly rather than handing the step
    # to the exact path.
    from pyllm.sampling import _nucleus

    z = big_logits("flat", 9)
    params = SamplingParams(temperature=1.0, top_p=0.95)
    sampler = Sampler(params)
    kept = _nucleus(sampler._keys(z, [], []), 0.95)
    assert kept is not None
    np.testing.assert_array_equal(kept, exact_sampler(params).distribution(z)[0])


@pytest.mark.parametrize("kind", ["peaked", "flat", "uniform"])
def test_fast_draw_lands_where_the_exact_inverse_cdf_does(kind):
    from pyllm.sampling import _inverse_cdf

    z = np.zeros(VOCAB, np.float32) if kind == "uniform" else big_logits(kind, 4)
    params = SamplingParams(temperature=0.9)
    weights = Sampler(params)._keys(z, [], []).weights()
    w = exact_sampler(params)._survivors(z, [], [])[1].copy()
    cdf = np.cumsum(w)
    g = np.random.default_rng(0)
    # uniforms at random and right at the steps of the CDF, where a bound must not decide wrongly
    at_steps = cdf[g.integers(0, VOCAB, 300)] / cdf[-1]
    us = np.concatenate((g.random(500), at_steps, [0.0, np.nextafter(1.0, 0.0)]))
    decided = []
    for u in us:
        i = weights.draw(float(u))
        decided.append(i is not None)
        if i is not None:
            assert i == _inverse_cdf(w, float(u))
    if kind == "peaked":  # the fast path does the work in the common case
        assert np.mean(decided[:500]) > 0.95


def test_numpy_float32_exp_is_within_the_bound_the_fast_path_assumes():
    from pyllm.sampling import _EXP32_ERR, _X_FLOOR

    g = np.random.default_rng(0)
    x = np.concatenate((g.uniform(-_X_FLOOR, 0, 2_000_000), g.uniform(-1, 0, 500_000),
                        -np.logspace(-8, 2, 10_000), [0.0])).astype(np.float32)
    got, want = np.exp(x).astype(np.float64), np.exp(x.astype(np.float64))
    normal = want >= 2.0**-126
    assert np.max(np.abs(got[normal] - want[normal]) / want[normal]) < _EXP32_ERR / 2
    assert np.max(np.abs(got[~normal] - want[~normal])) <= 2.0**-126


def test_top_logprobs_at_262k_match_a_full_sort_with_ties():
    z = big_logits("quantized", 6)
    z[[7, 70, 700, 7000]] = z.max()  # ties at the top, broken by id
    ref = torch.log_softmax(torch.tensor(z, dtype=torch.float64), -1).numpy()
    for n in (1, 3, 5, 20):
        out = top_logprobs(z, n)
        np.testing.assert_array_equal(out.ids, np.argsort(-ref, kind="stable")[:n])
        np.testing.assert_allclose(out.logprobs, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("temperature", [1e-308, 5e-324, 1e-200, 1e-30])
def test_temperatures_near_zero_sample_the_argmax_not_nan(temperature):
    """logits / 1e-308 overflow: the draw must be the T -> 0 limit, the argmax, not an arbitrary id."""
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, 49152).astype(np.float32)
    logits[1234] = 25.0
    for seed in range(5):
        s = Sampler(SamplingParams(temperature=temperature, top_p=0.9, seed=seed))
        assert s.sample(logits) == 1234
    ids, probs = Sampler(SamplingParams(temperature=temperature)).distribution(logits)
    assert ids.tolist() == [1234] or (probs[ids == 1234][0] == 1.0 and np.count_nonzero(probs) == 1)


def test_a_temperature_near_zero_splits_exact_ties_evenly():
    logits = np.full(1000, -5.0, dtype=np.float32)
    logits[[10, 20]] = 3.0
    ids, probs = Sampler(SamplingParams(temperature=1e-308)).distribution(logits)
    kept = dict(zip(ids.tolist(), probs.tolist()))
    assert {k: v for k, v in kept.items() if v > 0} == {10: 0.5, 20: 0.5}
