"""Model.embed: sentence vectors equal to the same pooling over transformers' output_hidden_states[-1]
(the final norm's output) on tiny checkpoints of several families."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import pyllm
from conftest import hf_float32

TEXTS = ["The capital of France is Paris.", "A cat sat on the mat", "Water boils at one hundred degrees"]


def reference(model, ids: list[int], pooling: str, normalize: bool) -> np.ndarray:
    with torch.no_grad():
        hidden = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0].double().numpy()
    v = hidden.mean(axis=0) if pooling == "mean" else hidden[-1]
    return v / np.linalg.norm(v) if normalize else v


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3", "gpt2"])
@pytest.mark.parametrize("pooling,normalize", [("mean", True), ("last", False)])
def test_embeddings_are_transformers_pooled_hidden_states(family_checkpoint, family, pooling, normalize):
    folder = family_checkpoint(family)
    llm = pyllm.load(folder, dtype="f32", threads=2)
    oracle = hf_float32(folder)
    got = llm.embed(TEXTS, pooling=pooling, normalize=normalize)
    assert got.shape == (len(TEXTS), llm.spec.dim) and got.dtype == np.float32
    for text, vector in zip(TEXTS, got):
        np.testing.assert_allclose(vector, reference(oracle, llm.tokenize(text), pooling, normalize),
                                   rtol=0, atol=1e-4)
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-6)
    one = llm.embed(TEXTS[0], pooling=pooling, normalize=normalize)
    assert one.shape == (llm.spec.dim,)
    np.testing.assert_array_equal(one, got[0])


def test_bad_arguments(family_checkpoint):
    llm = pyllm.load(family_checkpoint("llama"), threads=2)
    with pytest.raises(ValueError, match="pooling"):
        llm.embed("x", pooling="max")
    with pytest.raises(ValueError, match="empty"):
        llm.embed([])
    with pytest.raises(ValueError, match="texts"):
        llm.embed(42)
    with pytest.raises(ValueError):
        llm.embed(["fine", 7])


def test_embeddings_of_the_real_quantized_model_pool_its_own_final_hidden_states(smollm2_gguf):
    """On the default Q4_1 model the vector is the mean of the final norm's rows the model itself
    computes for the text (the same forward as a trace), unit length."""
    llm = pyllm.load(smollm2_gguf, threads=2)
    for text in ("Paris is the capital of France.", "A much longer sentence about the weather " * 4):
        rows = llm.trace(text, capture="final_norm")["final_norm"].astype(np.float64)
        want = rows.mean(axis=0)
        np.testing.assert_allclose(llm.embed(text), want / np.linalg.norm(want), rtol=0, atol=1e-6)
        np.testing.assert_allclose(llm.embed(text, pooling="last", normalize=False), rows[-1], atol=1e-6)
