"""The real SmolLM2-135M-Instruct Q4_1 GGUF run from its quantized blocks, against transformers'
load of the same file (dequantized to float32); and quantize-on-load of the bf16 folder."""
from __future__ import annotations

import gc
import os
import sys

import gguf
import numpy as np
import pytest
import safetensors
import torch

import pyllm
from pyllm import _core
from pyllm.scheduler import PREFILL_CHUNK

from conftest import english_text, perplexity

pytestmark = pytest.mark.slow

CHAT_PROMPT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
               "<|im_end|>\n<|im_start|>user\nName the capital of France.<|im_end|>\n"
               "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def gguf_model(smollm2_gguf):
    return pyllm.load(smollm2_gguf, threads=2)


@pytest.fixture(scope="module")
def text_ids(gguf_model):
    return gguf_model.tokenize(english_text())[:256]


def test_gguf_logits_agree_with_transformers(gguf_model, smollm2_gguf, smollm2_hf_from_gguf, text_ids):
    """transformers dequantizes the file to float32. Widened alike (dtype="f32") pyllm computes its
    numbers; as the file is, pyllm multiplies 8-bit activations (as llama.cpp does), which moves
    the argmax of near ties (observed: 95% agreement, perplexity 1.3% off; llama.cpp agrees with
    pyllm on 96% of them) but not the model's quality."""
    with torch.no_grad():
        theirs = smollm2_hf_from_gguf(torch.tensor([text_ids])).logits[0].numpy()
    ppl_theirs = perplexity(theirs, text_ids)
    wide = pyllm.load(smollm2_gguf, threads=2, dtype="f32").logits(text_ids)
    assert float(np.mean(wide.argmax(-1) == theirs.argmax(-1))) == 1.0
    assert abs(perplexity(wide, text_ids) / ppl_theirs - 1) <= 1e-4
    ours = gguf_model.logits(text_ids)
    agreement = float(np.mean(ours.argmax(-1) == theirs.argmax(-1)))
    assert agreement >= 0.92, agreement
    assert abs(perplexity(ours, text_ids) / ppl_theirs - 1) <= 0.03, (perplexity(ours, text_ids), ppl_theirs)


def test_gguf_tokenizer_matches_transformers(gguf_model, smollm2_gguf):
    import os

    import transformers

    src, name = os.path.split(smollm2_gguf)
    hf = transformers.AutoTokenizer.from_pretrained(src, gguf_file=name)
    text = english_text()[:2000] + " é 日本 🙂 <|im_start|>user\n"
    assert gguf_model.tokenize(text) == hf(text)["input_ids"]


def test_gguf_chat_prompt_is_answered_with_paris(gguf_model):
    out = gguf_model.generate(CHAT_PROMPT, max_tokens=24)
    assert "Paris" in out.text
    assert out.finish_reason == "stop"


def test_smollm2_alias_loads_the_cached_gguf(smollm2_gguf):
    llm = pyllm.load("smollm2", threads=1)
    assert llm.source == smollm2_gguf


@pytest.mark.parametrize("dtype,tolerance", [("q8_0", 0.01), ("q4_0", 0.10)])
def test_quantize_on_load_keeps_perplexity(smollm2_folder, dtype, tolerance):
    bf16 = pyllm.load(smollm2_folder, threads=2)
    ids = bf16.tokenize(english_text())[:256]
    reference = perplexity(bf16.logits(ids), ids)
    quantized = pyllm.load(smollm2_folder, threads=2, dtype=dtype)
    assert quantized._core is not bf16._core
    ppl = perplexity(quantized.logits(ids), ids)
    assert ppl <= reference * (1 + tolerance), (dtype, ppl, reference)


def test_unknown_dtype_raises_value_error(smollm2_folder):
    with pytest.raises(ValueError, match="dtype"):
        pyllm.load(smollm2_folder, dtype="q3_z")


def test_chat_answers_paris_and_stops_on_its_end_of_turn_token(gguf_model):
    out = gguf_model.chat([{"role": "user", "content": "Name the capital of France."}], max_tokens=32)
    assert "Paris" in out.text
    assert out.finish_reason == "stop"


TUTOR = ("You are a friendly geography tutor. You answer questions about countries, their capitals, "
         "rivers and mountains in one short sentence. You never make up facts; when you do not know "
         "something, you say so. You write in plain English, without lists or headings, and you keep "
         "every answer brief, because your students read your answers on small phone screens while "
         "travelling between classes. Your students are preparing for an examination in which they "
         "must name the capital city of every country in Europe, so precision matters more than "
         "style. Always name the city in your answer.")


def test_chat_keeps_the_context_of_earlier_turns_and_reuses_its_cache(gguf_model):
    """ "And of Germany?" only means "the capital of Germany" after the first turn. The second turn
    runs only what follows the cache's whole prefill chunks, and gets the tokens of a fresh run.
    (Asked a name and then to say it back, this 135M model invents another name whatever the
    engine.)"""
    history = [{"role": "system", "content": TUTOR},
               {"role": "user", "content": "What is the capital of France?"}]
    first = gguf_model.chat(history, max_tokens=48)
    assert "Paris" in first.text
    assert first.usage["prompt_tokens"] > PREFILL_CHUNK  # a whole chunk to reuse
    history += [{"role": "assistant", "content": first.text},
                {"role": "user", "content": "And of Germany?"}]
    before = gguf_model.tokens_processed
    second = gguf_model.chat(history, max_tokens=32)
    assert "Berlin" in second.text
    assert second.finish_reason == "stop"  # so every generated token ran, to give the end's logits
    ran = gguf_model.tokens_processed - before
    assert ran == second.usage["prompt_tokens"] - PREFILL_CHUNK + len(second.token_ids)
    gguf_model.reset()
    assert gguf_model.chat(history, max_tokens=32).token_ids == second.token_ids


def test_streamed_chat_equals_the_completion(gguf_model):
    messages = [{"role": "user", "content": "Name three colors."}]
    s = gguf_model.chat(messages, stream=True, max_tokens=24)
    text = "".join(s)
    assert text == gguf_model.chat(messages, max_tokens=24).text
    assert s.finish_reason in ("stop", "length") and s.usage["completion_tokens"] > 0


def test_chat_without_a_template_needs_one_passed(gguf_model):
    saved = gguf_model.tokenizer.chat_template
    gguf_model.tokenizer.chat_template = None
    try:
        with pytest.raises(pyllm.ChatTemplateError, match="chat_template"):
            gguf_model.chat([{"role": "user", "content": "hi"}])
        out = gguf_model.chat([{"role": "user", "content": "hi"}], max_tokens=4,
                              chat_template="{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
        assert out.usage["prompt_tokens"] > 0
    finally:
        gguf_model.tokenizer.chat_template = saved


def test_reused_prefix_gives_the_bits_of_a_fresh_run_on_quantized_weights(gguf_model, text_ids):
    ids = text_ids[:PREFILL_CHUNK + 70]
    assert len(ids) == PREFILL_CHUNK + 70
    fresh = gguf_model._prefill(ids)
    gguf_model.reset()
    gguf_model.generate(ids[:PREFILL_CHUNK + 20], max_tokens=5)  # decoded tokens land in the cache too
    before = gguf_model.tokens_processed
    reused = gguf_model._prefill(ids)
    assert gguf_model.tokens_processed - before == len(ids) - PREFILL_CHUNK
    assert np.array_equal(reused, fresh)
    assert np.abs(reused - gguf_model.logits(ids)[-1]).max() <= 1e-4  # the head's batch path


@pytest.mark.parametrize("threads", [1, 3])
def test_any_thread_count_gives_the_same_bits(gguf_model, smollm2_gguf, text_ids, threads):
    """Matrix rows are dealt to the threads in chunks as each finishes the last (README): which
    thread computes a row, and how many there are, changes none of the logits' bits — for a prefill
    and for decode steps."""
    other = pyllm.load(smollm2_gguf, threads=threads)
    ids = text_ids[:150]
    np.testing.assert_array_equal(other.logits(ids), gguf_model.logits(ids))
    mine, theirs = (_core.CoreSequence(m._core, 64) for m in (gguf_model, other))
    for token in ids[:20]:
        np.testing.assert_array_equal(theirs.forward([token]), mine.forward([token]))


def mapping_of(address: int) -> dict | None:
    """The /proc/self/smaps entry of the mapping that holds address: its start, end and VmFlags."""
    found = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:  # "start-end perms offset dev inode [path]"
                start, end = (int(x, 16) for x in head[0].split("-"))
                found = {"start": start, "end": end} if start <= address < end else None
            elif found is not None and head[0] == "VmFlags:":
                found["flags"] = set(head[1:])
                return found
    return None


def matrix_bytes(source: str) -> list[int]:
    """The stored bytes of every matrix the forward multiplies by, the tied head once: the GGUF's
    quantized tensors, or the folder's 2-D ones."""
    if source.endswith(".gguf"):
        quantized = [t for t in gguf.GGUFReader(source).tensors if t.tensor_type.name != "F32"]
        assert {t.tensor_type.name for t in quantized} == {"Q4_1", "Q8_0"}  # both have packed kernels
        return [int(t.n_bytes) for t in quantized]
    with safetensors.safe_open(os.path.join(source, "model.safetensors"), "np") as f:
        shapes = [f.get_slice(k).get_shape() for k in f.keys()]
    return [rows * cols * 2 for rows, cols in (s for s in shapes if len(s) == 2)]  # bf16


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps and madvise are Linux's")
@pytest.mark.parametrize("source", ["smollm2_gguf", "smollm2_folder"])
def test_the_weights_lie_in_one_block_advised_onto_huge_pages(source, request):
    """Every matrix the forward multiplies by, packed (Q4_1, Q8_0) or as stored (bf16), the tied head
    once, side by side in one 2 MB-aligned block the kernel is asked to back with huge pages ("hg");
    unloading the model unmaps it."""
    path = request.getfixturevalue(source)
    model = pyllm.load(path, threads=2)
    address, size = model._core.weights_block
    assert size == sum((b + 63) // 64 * 64 for b in matrix_bytes(path))  # 8-row groups: no padding
    assert address % (2 << 20) == 0
    mapping = mapping_of(address)
    assert mapping is not None and "hg" in mapping["flags"]
    assert mapping["start"] <= address and address + size <= mapping["end"]
    assert model.generate("The capital of France is", max_tokens=2, temperature=0).text == " Paris."
    del model
    gc.collect()
    after = mapping_of(address)
    assert after is None or after["start"] != mapping["start"] or "hg" not in after["flags"]


def test_weights_re_encoded_at_load_keep_their_own_copy(smollm2_gguf):
    """dtype= owns its converted matrices: copying them into the block would hold both."""
    assert pyllm.load(smollm2_gguf, threads=1, dtype="f32")._core.weights_block == (0, 0)
