"""Model.trace against transformers' own intermediates (pyllm.oracle's hooks, eager attention) on the
tiny checkpoint of every family: sliding windows, soft-caps, GQA/MQA, q/k norms, sandwich norms,
learned positions. Short prompts run the vec path, long ones the sgemm path."""
from __future__ import annotations


import numpy as np
import pytest

import pyllm
from families import FAMILIES
from pyllm.oracle import load_reference, reference_trace
from pyllm.trace import CAPTURES

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def family_model(family_checkpoint):
    built = {}

    def get(family: str):
        if family not in built:
            folder = family_checkpoint(family)
            built[family] = folder, pyllm.load(folder, dtype="f32", threads=2), load_reference(folder)
        return built[family]
    return get


def _ids(llm, n: int, seed: int = 0) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(3, llm.vocab_size, n)]


@pytest.mark.parametrize("n_tokens", [9, 24])  # below and above the sgemm path's 16 tokens
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_capture_matches_transformers(family_model, family, n_tokens):
    _, llm, reference = family_model(family)
    ids = _ids(llm, n_tokens)
    trace = llm.trace(ids, capture=CAPTURES)
    want = reference_trace(reference, ids, trace.layers, CAPTURES)
    for name in CAPTURES:
        assert trace[name].shape == want[name].shape, name
        np.testing.assert_allclose(trace[name], want[name], rtol=0, atol=TOLERANCE, err_msg=f"{family} {name}")
    # and transformers' own outputs: output_hidden_states (the last one normed), eager output_attentions
    import torch

    with torch.no_grad():
        out = reference(torch.tensor([ids]), output_hidden_states=True, output_attentions=True)
    hidden = [h[0].numpy() for h in out.hidden_states]
    np.testing.assert_allclose(trace["embed"], hidden[0], rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(trace["hidden"][:-1], np.stack(hidden[1:-1]), rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(trace["final_norm"], hidden[-1], rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(trace["attn"], np.stack([a[0].numpy() for a in out.attentions]), rtol=0,
                               atol=TOLERANCE)
    # the windows really cut: a query past the window gives its oldest keys nothing
    window = FAMILIES[family].settings.get("sliding_window")
    if window and n_tokens > window:
        assert (trace["attn"][0, :, -1, :n_tokens - window] == 0).all()


def test_shapes_as_documented(family_model):
    _, llm, _ = family_model("qwen3")  # head_dim 24 != dim / heads
    spec = llm.spec
    t = llm.trace(_ids(llm, 7), layers=[-1, 0], capture=CAPTURES)
    assert t.layers == [spec.n_layers - 1, 0]
    assert t["embed"].shape == t["final_norm"].shape == (7, spec.dim)
    assert t["q"].shape == (2, 7, spec.n_heads, spec.head_dim)
    assert t["k"].shape == t["v"].shape == (2, 7, spec.n_kv_heads, spec.head_dim)
    assert t["attn"].shape == (2, spec.n_heads, 7, 7)
    for name in ("attn_norm", "attn_out", "resid_attn", "ffn_norm", "mlp_out", "hidden"):
        assert t[name].shape == (2, 7, spec.dim)
    assert t["logits"].shape == (7, spec.vocab_size)
    np.testing.assert_allclose(t["attn"].sum(-1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(t.layer("hidden", 0), t["hidden"][1])
    assert len(t.tokens) == 7 and "q" in t and "nothing" not in t


def test_trace_is_the_ordinary_forward_and_leaves_the_cache(family_model):
    _, llm, _ = family_model("llama")
    ids = _ids(llm, 20, seed=1)
    before = llm.generate(ids[:6], max_tokens=5).token_ids
    t = llm.trace(ids, capture=("logits", "hidden"))
    np.testing.assert_array_equal(t["logits"], llm.logits(ids))
    assert llm.generate(ids[:6], max_tokens=5).token_ids == before
    # the last layer's residual through the final norm and head is the model's own output
    np.testing.assert_allclose(llm.logit_lens(t["hidden"][-1]), t["logits"], rtol=0, atol=1e-5)


def test_gguf_queries_and_keys_come_back_in_the_halves_layout(family_model, converted_gguf):
    """llama.cpp's converter permutes q/k rows for adjacent-pair rope; a trace undoes it."""
    folder, llm, reference = family_model("llama")
    gguf = pyllm.load(converted_gguf(folder, "f32"), threads=2)
    assert gguf.spec.rope_interleaved
    ids = _ids(llm, 12, seed=2)
    got = gguf.trace(ids, capture=("q", "k", "attn", "hidden"))
    want = llm.trace(ids, capture=("q", "k", "attn", "hidden"))
    for name in ("q", "k", "attn", "hidden"):
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=TOLERANCE, err_msg=name)


def test_bad_arguments_are_refused(family_model):
    _, llm, _ = family_model("llama")
    with pytest.raises(ValueError, match="capture"):
        llm.trace([5, 6], capture=("hidden", "nope"))
    with pytest.raises(ValueError, match="layers"):
        llm.trace([5, 6], layers=[llm.spec.n_layers])
    with pytest.raises(ValueError, match="twice"):
        llm.trace([5, 6], layers=[0, -llm.spec.n_layers])
    with pytest.raises(ValueError):
        llm.trace([], capture="hidden")
    with pytest.raises(ValueError, match="width"):
        llm.logit_lens(np.zeros((2, llm.spec.dim + 1), np.float32))
    with pytest.raises(KeyError, match="not captured"):
        llm.trace([5, 6], capture="hidden")["attn"]
