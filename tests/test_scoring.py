"""Model.score and `pyllm perplexity` against transformers' logits on the same ids: per-token
log-probabilities, the top alternatives, sliding windows past the context, and the real SmolLM2 over
a public-domain text (the Gettysburg Address, tests/data)."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

import pyllm
from pyllm import cli

TEXT = os.path.join(os.path.dirname(__file__), "data", "gettysburg.txt")


def reference_logprobs(model, ids: list[int], window: int, stride: int) -> np.ndarray:
    """log p(ids[t] | the window before it) from transformers, windows as transformers' perplexity
    guide slides them: each scores only the tokens the earlier ones did not."""
    n = len(ids)
    out = np.full(n - 1, np.nan)
    scored_to, begin = 1, 0
    while scored_to < n:
        end = min(begin + window, n)
        with torch.no_grad():
            logits = model(torch.tensor([ids[begin:end]])).logits[0].double()
        lp = torch.log_softmax(logits, -1).numpy()
        for t in range(max(scored_to, begin + 1), end):
            out[t - 1] = lp[t - 1 - begin, ids[t]]
        scored_to = end
        begin += stride
    return out


@pytest.fixture(scope="module")
def tiny(family_checkpoint):
    from conftest import hf_float32

    folder = family_checkpoint("llama")
    return pyllm.load(folder, dtype="f32", threads=2, n_ctx=64), hf_float32(folder)


def test_scores_are_transformers_log_probabilities(tiny):
    llm, ref = tiny
    text = "Four score and seven years ago our fathers brought forth on this continent a new nation."
    s = llm.score(text, top=3)
    ids = s.token_ids
    with torch.no_grad():
        lp = torch.log_softmax(ref(torch.tensor([ids])).logits[0].double(), -1).numpy()
    assert s.first == 1 and s.n_scored == len(ids) - 1
    np.testing.assert_allclose(s.logprobs, lp[np.arange(len(ids) - 1), ids[1:]], atol=1e-4)
    for t, alternatives in enumerate(s.top):
        assert [i for _, i, _ in alternatives] == list(np.argsort(-lp[t], kind="stable")[:3])
        assert alternatives[0][2] == pytest.approx(lp[t].max(), abs=1e-4)
    assert s.perplexity == pytest.approx(math.exp(-lp[np.arange(len(ids) - 1), ids[1:]].mean()), rel=1e-5)
    np.testing.assert_allclose(s.surprisal, -s.logprobs / math.log(2))


@pytest.mark.parametrize("window,stride", [(64, 32), (24, 7), (17, 16)])
def test_sliding_windows_past_the_context(tiny, window, stride):
    llm, ref = tiny
    with open(TEXT, encoding="utf-8") as f:
        ids = llm.tokenize(f.read())[:150]  # longer than n_ctx = 64
    s = llm.score(ids, top=0, window=window, stride=stride)
    assert not np.isnan(s.logprobs).any()
    np.testing.assert_allclose(s.logprobs, reference_logprobs(ref, ids, window, stride), atol=1e-4)


def test_bad_settings_are_refused(tiny):
    llm, _ = tiny
    with pytest.raises(ValueError, match="at least 2 tokens"):
        llm.score([5])
    with pytest.raises(ValueError, match="window"):
        llm.score([5, 6, 7], window=65)  # more than n_ctx
    with pytest.raises(ValueError, match="stride"):
        llm.score([5, 6, 7], window=8, stride=8)
    with pytest.raises(ValueError, match="top"):
        llm.score([5, 6, 7], top=-1)


# SmolLM2 Q4_1 through 8-bit activations: its perplexity on the text moves with each ISA's float order
# (measured 2026-11-28: 13.39 AVX2, 13.56 AVX-512, 13.57 scalar, transformers 13.40), as llama.cpp's
# does; the same weights widened to f32 leave no such noise.
Q4_1_PERPLEXITY_REL = 0.02
F32_PERPLEXITY_REL = 1e-4


@pytest.mark.slow
def test_smollm2_perplexity_agrees_with_transformers(smollm2_gguf, smollm2_hf_from_gguf, capsys):
    """`pyllm perplexity` on the real Q4_1 file, in sliding windows, within 2% of transformers'
    perplexity on the same ids (its own load of the same file)."""
    llm = pyllm.load(smollm2_gguf, threads=2)
    with open(TEXT, encoding="utf-8") as f:
        ids = llm.tokenize(f.read())
    assert len(ids) > 300
    code = cli.main(["perplexity", smollm2_gguf, TEXT, "--window", "128", "--stride", "64", "--json",
                     "--threads", "2"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["tokens"] == len(ids) and result["scored"] == len(ids) - 1
    want = math.exp(-reference_logprobs(smollm2_hf_from_gguf, ids, 128, 64).mean())
    assert result["perplexity"] == pytest.approx(want, rel=Q4_1_PERPLEXITY_REL)
    print(f"SmolLM2 Q4_1 perplexity: pyllm {result['perplexity']:.4f}, transformers {want:.4f}")


@pytest.mark.slow
def test_smollm2_widened_to_f32_scores_the_text_as_transformers_does(smollm2_gguf, smollm2_hf_from_gguf):
    """The same file with its weights widened to f32 (float activations, no 8-bit rounding): the
    perplexity in the same sliding windows within 1e-4 of transformers', on every ISA."""
    llm = pyllm.load(smollm2_gguf, threads=2, dtype="f32")
    with open(TEXT, encoding="utf-8") as f:
        ids = llm.tokenize(f.read())
    score = llm.score(ids, top=0, window=128, stride=64)
    want = math.exp(-reference_logprobs(smollm2_hf_from_gguf, ids, 128, 64).mean())
    assert score.n_scored == len(ids) - 1
    assert score.perplexity == pytest.approx(want, rel=F32_PERPLEXITY_REL)


def test_perplexity_of_a_missing_file_is_a_clear_error(tiny, capsys):
    assert cli.main(["perplexity", "smollm2", "/nonexistent/text.txt"]) == 1
    assert "cannot read /nonexistent/text.txt" in capsys.readouterr().err
