"""Stop strings, streaming, logprobs and results of Model.generate/stream on a tiny model."""
from __future__ import annotations

import numpy as np
import pytest

import pyllm
from pyllm.generation import StopMatcher

from conftest import make_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return pyllm.load(make_tiny_checkpoint(str(tmp_path_factory.mktemp("gen"))), threads=2)


def _feed_all(matcher: StopMatcher, pieces: list[str]) -> str:
    out = "".join(matcher.feed(p) for p in pieces)
    return out + matcher.flush()


def test_stop_string_spanning_pieces_is_cut_and_never_emitted():
    m = StopMatcher(["END"])
    emitted = [m.feed(p) for p in ["hello E", "N", "D world"]]
    assert "".join(emitted) == "hello " and m.stopped
    assert all("E" not in e for e in emitted)  # the start of END was held back, not emitted


def test_text_that_only_looks_like_a_stop_prefix_is_released():
    m = StopMatcher(["END"])
    assert _feed_all(m, ["an E", "ND", "ing"]) == "an " and m.stopped
    m = StopMatcher(["END"])
    assert _feed_all(m, ["an E", "lk"]) == "an Elk" and not m.stopped


def test_earliest_of_several_stop_strings_wins():
    m = StopMatcher(["world", "lo w"])
    assert _feed_all(m, ["hello world"]) == "hel"


def test_empty_stop_string_is_rejected():
    with pytest.raises(ValueError, match="stop"):
        StopMatcher([""])


def test_generate_cuts_at_a_stop_string(tiny):
    free = tiny.generate([5, 6, 7], max_tokens=24)
    assert len(free.text) > 4
    stop = free.text[2:4]
    cut = tiny.generate([5, 6, 7], max_tokens=24, stop=[stop])
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[: free.text.index(stop)]


def test_stream_pieces_join_to_the_generated_text_and_expose_final_state(tiny):
    s = tiny.stream([5, 6, 7], max_tokens=12)
    assert s.completion is None
    pieces = list(s)
    full = tiny.generate([5, 6, 7], max_tokens=12)
    assert "".join(pieces) == full.text
    assert s.finish_reason == full.finish_reason
    assert s.usage == {"prompt_tokens": 3, "completion_tokens": len(full.token_ids),
                       "total_tokens": 3 + len(full.token_ids)}


def test_logprobs_come_from_the_raw_distribution(tiny):
    out = tiny.generate([5, 6, 7], max_tokens=5, logprobs=3)
    assert len(out.logprobs) == len(out.token_ids)
    ids = [5, 6, 7]
    for token, entry in zip(out.token_ids, out.logprobs):
        logits = tiny.logits(ids)[-1].astype(np.float64)
        logp = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        assert entry["token_id"] == token
        assert entry["logprob"] == pytest.approx(logp[token], abs=1e-4)
        top = [e["token_id"] for e in entry["top_logprobs"]]
        assert top == list(np.argsort(-logp)[:3])
        assert entry["top_logprobs"][0]["logprob"] >= entry["top_logprobs"][-1]["logprob"]
        ids.append(token)


def test_stream_never_splits_a_utf8_character(tmp_path):
    """Byte-level BPE spreads emoji and CJK over several tokens; logit_bias makes the model write
    them. Streamed pieces must hold no replacement character and join to the full decode."""
    llm = pyllm.load(make_tiny_checkpoint(str(tmp_path)), threads=1)
    text = "日本語の文章🙂👍🏽😀中文é"
    ids = llm.tokenize(text, add_special=False)
    assert llm.detokenize(ids) == text and len(ids) > len(text)  # characters span tokens
    from pyllm.tokenizer import IncrementalDecoder

    decoder = IncrementalDecoder(llm.tokenizer)
    pieces = [decoder.push(t) for t in ids] + [decoder.flush()]
    assert "".join(pieces) == text and all("\ufffd" not in p for p in pieces)

    # A whole generation made of those byte tokens, in the order the text has them: each one is
    # pushed to the top in turn by a bias on it alone.
    streamed = []
    for i, target in enumerate(ids):
        s = llm.stream(ids[:i] or [5], max_tokens=1, logit_bias={target: 1000.0})
        streamed.append((list(s), s.completion.token_ids))
    assert [tok for _, toks in streamed for tok in toks] == ids
    # and one stream with the model free among those tokens
    bias = {t: 1000.0 for t in set(ids)}
    s = llm.stream([5], max_tokens=40, logit_bias=bias, temperature=1.0, seed=3)
    pieces = list(s)
    assert "".join(pieces) == s.completion.text == llm.detokenize(s.completion.token_ids)


def test_bad_generation_settings_raise_value_error_naming_them(tiny):
    with pytest.raises(ValueError, match="temperature"):
        tiny.generate([5], temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        tiny.generate([5], top_p=1.5)
    with pytest.raises(ValueError, match="max_tokens"):
        tiny.generate([5], max_tokens=-1)
    with pytest.raises(ValueError, match="logprobs"):
        tiny.generate([5], logprobs=99)
    with pytest.raises(ValueError, match="unknown sampling setting"):
        tiny.generate([5], temprature=0.5)


def test_same_seed_gives_the_same_tokens_across_runs_and_thread_counts(tmp_path):
    folder = make_tiny_checkpoint(str(tmp_path))
    runs = [pyllm.load(folder, threads=t).generate([5, 6], max_tokens=20, temperature=1.0, seed=42).token_ids
            for t in (1, 2, 1)]
    assert runs[0] == runs[1] == runs[2]
    other = pyllm.load(folder).generate([5, 6], max_tokens=20, temperature=1.0, seed=43).token_ids
    assert other != runs[0]
