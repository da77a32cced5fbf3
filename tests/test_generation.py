"""Stop strings, streaming, logprobs and results of Model.generate/stream on a tiny model."""
from __future__ import annotations

import os

import numpy as np
import pytest

import pyllm
from pyllm.generation import StopMatcher

from conftest import make_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("gen")))


@pytest.fixture(scope="module")
def tiny(tiny_folder):
    return pyllm.load(tiny_folder, threads=2)


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
    full = llm.detokenize(s.completion.token_ids)
    assert "".join(pieces) == s.completion.text
    # all of it, less a character that max_tokens cut (which decodes as one U+FFFD)
    assert s.completion.text in (full, full[:-1] if full.endswith("\ufffd") else full)


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


def test_a_finished_stream_has_every_field_of_a_generate_result(tiny):
    s = tiny.stream([5, 6, 7], max_tokens=6, logprobs=2)
    assert (s.text, s.token_ids, s.finish_reason, s.usage, s.logprobs) == (None,) * 5  # not finished yet
    list(s)
    full = tiny.generate([5, 6, 7], max_tokens=6, logprobs=2)
    assert s.text == full.text and s.token_ids == full.token_ids and s.finish_reason == full.finish_reason
    assert s.usage == full.usage and s.logprobs == full.logprobs and len(s.logprobs) == len(s.token_ids)


@pytest.mark.slow
def test_a_generation_cut_inside_a_character_holds_back_its_bytes(smollm2_gguf):
    """SmolLM2 writes Japanese in byte tokens that split characters, so max_tokens can end between
    the bytes of one: the text stops before it (no U+FFFD), token_ids keep every token."""
    llm = pyllm.load(smollm2_gguf, threads=2)
    cut_inside = 0
    for n in range(1, 9):
        out = llm.generate("東京は", max_tokens=n)
        s = llm.stream("東京は", max_tokens=n)
        pieces = list(s)
        assert len(out.token_ids) == n and out.finish_reason == "length"
        assert "".join(pieces) == s.text == out.text and "\ufffd" not in out.text
        everything = llm.detokenize(out.token_ids)
        if everything.endswith("\ufffd"):  # the last token(s) hold the start of a character
            cut_inside += 1
            assert out.text == everything[:-1]
        else:
            assert out.text == everything
    assert cut_inside  # the prompt does end inside a character for some n


def test_an_unfinished_character_of_byte_tokens_is_held_back_at_the_end():
    """SentencePiece byte fallback (Gemma, Llama 2): <0xF0><0x9F><0xA7> begin 🧌 without ending it,
    and decode each byte of a run that is not valid UTF-8 as U+FFFD."""
    from test_tokenizer_gguf import sentencepiece_metadata

    from pyllm.tokenizer import IncrementalDecoder, Tokenizer
    from pyllm.tokenizer_gguf import tokenizer_from_gguf

    tok = Tokenizer(hf=tokenizer_from_gguf(sentencepiece_metadata()).tokenizer)
    ids = tok.hf.encode("ab\U0001F9CC", add_special_tokens=False).ids
    assert [tok.hf.id_to_token(i) for i in ids] == ["\u2581", "ab", "<0xF0>", "<0x9F>", "<0xA7>", "<0x8C>"]
    assert tok.decode(ids[:-1]) == "ab\ufffd\ufffd\ufffd"  # each byte of the unfinished run
    for end in range(len(ids) + 1):
        decoder = IncrementalDecoder(tok)
        text = "".join(decoder.push(i) for i in ids[:end]) + decoder.flush()
        assert text == ("ab\U0001F9CC" if end == len(ids) else tok.decode(ids[: min(end, 2)]))


def test_token_ids_must_be_ints_inside_the_vocabulary_naming_the_argument(tiny):
    for bad in ([1.5], ["1"], [True], [np.float32(3)], "12"):
        with pytest.raises(ValueError, match="ids must"):
            tiny.logits(bad)
        with pytest.raises(ValueError, match="ids must"):
            tiny.detokenize(bad)
        with pytest.raises(ValueError, match="prompt must"):  # ids after an int: one prompt of ids
            tiny.generate([5] + (bad if isinstance(bad, list) else [bad]), max_tokens=1)
    assert isinstance(tiny.generate(["1"], max_tokens=1), list)  # texts in a list: a list of prompts
    for bad in (-1, tiny.vocab_size):
        with pytest.raises(ValueError, match=rf"ids: token id {bad} is outside the vocabulary \[0, 320\)"):
            tiny.detokenize([bad])
        with pytest.raises(ValueError, match=rf"ids: token id {bad} is outside the vocabulary"):
            tiny.logits([5, bad])
    assert tiny.detokenize(np.array([40, 41])) == tiny.detokenize([40, 41])  # numpy ints are ints
    assert tiny.logits(np.array([5, 6], dtype=np.int32)).shape == (2, 320)


def test_max_tokens_and_logprobs_must_be_real_ints_and_are_checked_at_once(tiny):
    for name, value in (("max_tokens", True), ("max_tokens", 2.0), ("max_tokens", "2"), ("logprobs", True),
                        ("logprobs", 1.0)):
        with pytest.raises(ValueError, match=name):
            tiny.stream([5], **{name: value})  # before the first next()


def test_a_lone_surrogate_in_a_prompt_is_a_value_error_naming_it(tiny):
    with pytest.raises(ValueError, match=r"prompt holds a lone surrogate '\\ud800' at index 2"):
        tiny.generate("ab\ud800c", max_tokens=1)
    with pytest.raises(ValueError, match="text holds a lone surrogate"):
        tiny.tokenize("\udcff")


@pytest.mark.parametrize("settings, message", [
    (dict(threads=0), "threads must be an int in \\[1, 1024\\], got 0"),
    (dict(threads=1.5), "threads must be an int .* got 1.5"),
    (dict(threads="2"), "threads must be an int .* got '2'"),
    (dict(threads=True), "threads must be an int .* got True"),
    (dict(n_ctx=0), "n_ctx must be an int >= 1, got 0"),
    (dict(n_ctx=1.5), "n_ctx must be an int >= 1, got 1.5"),
    (dict(n_ctx="8"), "n_ctx must be an int >= 1, got '8'"),
    (dict(n_ctx=257), "n_ctx 257 is more than the model's context of 256 tokens"),
    (dict(n_ctx=2 ** 31), "n_ctx 2147483648 is more than the model's context of 256 tokens"),
])
def test_load_refuses_threads_and_n_ctx_that_are_not_counts_in_range(tiny_folder, settings, message):
    with pytest.raises(ValueError, match=message):
        pyllm.load(tiny_folder, **settings)


def test_load_takes_numpy_counts_and_the_models_whole_context(tiny_folder):
    llm = pyllm.load(tiny_folder, threads=np.int64(1), n_ctx=256)
    assert (llm.threads, llm.n_ctx) == (1, 256)


def test_repr_says_what_was_loaded_and_how_it_runs(tiny_folder):
    llm = pyllm.load(tiny_folder, threads=2, n_ctx=64)
    text = repr(llm)
    spec = llm.spec
    assert text.startswith(f"Model({os.path.basename(os.path.normpath(tiny_folder))!r}, {spec.family}, ")
    assert f"{spec.n_layers} layers, dim {spec.dim}" in text
    kinds = {w.wtype.name.lower() for w in llm.weights.values() if len(w.shape) == 2}
    assert f"weights {' + '.join(sorted(kinds))} (" in text
    assert text.endswith(f"n_ctx 64, {llm.kv_dtype} KV cache, 2 threads)")
