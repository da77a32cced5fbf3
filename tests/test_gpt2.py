"""GPT-2 (GPT2LMHeadModel and GGUF `gpt2`) on tiny random checkpoints (bf16 on disk, float32 compute on
both sides): what differs from the other families. Its logits, greedy continuations, prefill and GGUF files
against transformers are tests/test_family_contract.py's; here: checkpoints without the `transformer.`
prefix, f16 files that need no rounded oracle, the real GPT-2 tokenizer, the learned-position limit on the
context, and configs and files that must be refused."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import pyllm
from pyllm import _core

from conftest import english_text
from families import CASES, make_family_checkpoint

EOS = 50256
N_TOKENS = 48
SHORT = 12  # below the sgemm threshold: the vec_dot path
assert SHORT < _core.BLAS_MIN_TOKENS <= N_TOKENS

# families.CASES's GPT-2 rows whose function llama.cpp's converter can state
GGUF_CASES = ("gpt2_tied_head", "gpt2_odd_width_untied_head")


def oracle_model(folder: str):
    """transformers' float32 model; eager attention, the only one that honours reorder_and_upcast_attn."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def conversions(checkpoint, converted_gguf):
    """name -> (name, folder, {"f32": path, "f16": path}, ids): a case's checkpoint and llama.cpp's
    conversions of it, each made once per session."""
    def get(name: str) -> tuple:
        folder = checkpoint("gpt2", **CASES[name].overrides)
        ids = np.random.default_rng(11).integers(0, EOS, N_TOKENS).tolist()
        return name, folder, {t: converted_gguf(folder, t) for t in ("f32", "f16")}, ids
    return get


@pytest.fixture(scope="module")
def tied_gguf(conversions):
    """The tied-head case converted: the files the tokenizer and metadata tests read and rewrite."""
    return conversions("gpt2_tied_head")


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape
    return float(np.abs(a - b).max())


# ---------------------------------------------------------------- the HF folder

def test_gpt2_checkpoint_without_the_transformer_prefix_gives_the_same_logits(tmp_path):
    """OpenAI's own GPT-2 files name tensors "h.0.attn.c_attn.weight", beside the causal-mask buffers
    "h.0.attn.bias" that transformers ignores; transformers 5 saves "transformer.h.0...."."""
    from safetensors.torch import load_file, save_file

    folder = make_family_checkpoint(str(tmp_path / "prefixed"), "gpt2", n_positions=64, n_ctx=64)
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in os.listdir(folder):
        if name != "model.safetensors":
            os.symlink(os.path.join(folder, name), bare / name)
    saved = load_file(os.path.join(folder, "model.safetensors"))
    tensors = {k.removeprefix("transformer."): v for k, v in saved.items()}
    assert "wte.weight" in tensors
    mask = torch.tril(torch.ones(64, 64, dtype=torch.bfloat16)).view(1, 1, 64, 64)
    tensors.update({f"h.{i}.attn.bias": mask.clone() for i in range(3)})
    save_file(tensors, str(bare / "model.safetensors"), metadata={"format": "pt"})
    ids = list(range(100, 140))
    assert np.array_equal(pyllm.load(str(bare), threads=2).logits(ids), pyllm.load(folder, threads=2).logits(ids))


# ---------------------------------------------------------------- llama.cpp's GGUF

@pytest.mark.parametrize("name", GGUF_CASES)
def test_gpt2_f16_gguf_matches_transformers_on_the_unrounded_weights(conversions, name):
    """The converter transposes the Conv1D weights itself and keeps [q; k; v] fused: right names, right
    cut. f16 needs no rounded oracle: the bf16 weights convert to f16 exactly but for the few below f16's
    normal range (2^-14; 132 of 3.8M here), whose lost low bits move these logits by < 1e-6."""
    _, folder, files, ids = conversions(name)
    with torch.no_grad():
        expected = oracle_model(folder)(torch.tensor([ids])).logits[0].numpy()
    llm = pyllm.load(files["f16"], threads=2)
    assert max_diff(llm.logits(ids), expected) <= 1e-4, name
    assert max_diff(llm.logits(ids[:SHORT]), expected[:SHORT]) <= 1e-4, name
    assert max_diff(llm.logits(ids), pyllm.load(folder, threads=2).logits(ids)) <= 1e-4, name


# ---------------------------------------------------------------- the tokenizer

SENTENCE = ("Hello world! It's 2024 — naïve café owners don't   count 12345 ü€ tokens,\n\n"
            "  they'll say: \"GPT-2's byte-level BPE\"\t<|endoftext|> ok.")


def test_gpt2_tokenizer_from_tokenizer_json_and_from_gguf_encodes_like_transformers(tied_gguf):
    import transformers

    _, folder, files, _ = tied_gguf
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    texts = [SENTENCE, english_text()[:3000]]
    for source in (folder, files["f32"]):
        llm = pyllm.load(source, threads=1)
        for text in texts:
            ids = llm.tokenize(text)
            assert ids == reference(text)["input_ids"], source
            assert llm.detokenize(ids) == reference.decode(ids), source
    assert len(reference(SENTENCE)["input_ids"]) > 30


def test_gpt2_has_no_chat_template_and_chat_says_so(tied_gguf):
    _, folder, _, _ = tied_gguf
    with pytest.raises(pyllm.ChatTemplateError, match="no chat template"):
        pyllm.load(folder, threads=1).chat([{"role": "user", "content": "Hi"}])


# ---------------------------------------------------------------- the learned-position limit

@pytest.fixture(scope="module")
def short_context(tmp_path_factory) -> str:
    return make_family_checkpoint(str(tmp_path_factory.mktemp("ctx")), "gpt2", n_positions=24, n_ctx=24)


def test_gpt2_context_defaults_to_the_learned_positions(short_context):
    assert pyllm.load(short_context, threads=1).n_ctx == 24


def test_gpt2_context_beyond_the_learned_positions_is_refused(short_context):
    with pytest.raises(ValueError, match="n_ctx 25"):
        pyllm.load(short_context, threads=1, n_ctx=25)
    llm = pyllm.load(short_context, threads=1)
    with pytest.raises(pyllm.ContextLengthError, match="25"):
        llm.logits(list(range(100, 125)))


def test_gpt2_generation_that_reaches_the_last_position_ends_with_length(short_context):
    """The last token comes from the logits at position 23, the last one GPT-2 has learned; transformers
    continues the same way up to there."""
    prompt = list(range(300, 320))
    with torch.no_grad():
        out = oracle_model(short_context).generate(
            torch.tensor([prompt]), max_new_tokens=5, do_sample=False,
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    llm = pyllm.load(short_context, threads=1)
    llm.eos_ids = set()  # only the context can stop it
    done = llm.generate(prompt, max_tokens=100)
    assert done.finish_reason == "length"
    assert done.token_ids == out[0, len(prompt):].tolist() and len(done.token_ids) == 24 - 20 + 1


# ---------------------------------------------------------------- configs that must be refused

@pytest.fixture(scope="module")
def gpt2_folder(family_checkpoint) -> str:
    return family_checkpoint("gpt2")


def with_config(checkpoint: str, folder, drop: tuple[str, ...] = (), **changes) -> str:
    """A copy of the checkpoint (files linked) whose config.json lacks `drop` and has `changes`."""
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(checkpoint):
        if name != "config.json":
            os.symlink(os.path.join(checkpoint, name), os.path.join(folder, name))
    with open(os.path.join(checkpoint, "config.json")) as f:
        config = json.load(f)
    config.update(changes)
    for key in drop:
        del config[key]
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return str(folder)


@pytest.mark.parametrize("drop,changes,named", [
    ((), {"n_head": 5}, "n_head 5"),          # does not divide n_embd 72
    ((), {"n_head": 0}, "n_head"),
    (("n_positions",), {}, "n_positions"),
    (("n_embd",), {}, "n_embd"),
    (("n_layer",), {}, "n_layer"),
    (("vocab_size",), {}, "vocab_size"),
    ((), {"n_embd": "72"}, "n_embd"),
    ((), {"n_positions": 0}, "n_positions"),
    ((), {"n_inner": -1}, "n_inner"),
    ((), {"layer_norm_epsilon": 0}, "layer_norm_epsilon"),
    ((), {"layer_norm_epsilon": -1e-5}, "layer_norm_epsilon"),
    ((), {"layer_norm_epsilon": float("nan")}, "layer_norm_epsilon"),
], ids=lambda v: str(v))
def test_gpt2_bad_config_raises_format_error_naming_the_key(gpt2_folder, tmp_path, drop, changes, named):
    folder = with_config(gpt2_folder, tmp_path / "m", drop=drop, **changes)
    with pytest.raises(pyllm.FormatError, match="config.json") as raised:
        pyllm.load(folder, threads=1)
    assert named in str(raised.value)


@pytest.mark.parametrize("changes,tensor", [
    ({"n_positions": 100}, "wpe.weight"),    # the file holds 128 learned positions
    ({"n_inner": 300}, "c_fc.weight"),
])
def test_gpt2_config_contradicting_the_weights_raises_format_error(gpt2_folder, tmp_path, changes, tensor):
    with pytest.raises(pyllm.FormatError, match=f"{tensor}.*shape"):
        pyllm.load(with_config(gpt2_folder, tmp_path / "m", **changes), threads=1)


@pytest.mark.parametrize("changes,named", [
    ({"activation_function": "gelu"}, "activation_function 'gelu'"),   # the exact erf GELU
    ({"activation_function": "relu"}, "activation_function 'relu'"),
    ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
])
def test_gpt2_settings_pyllm_does_not_reproduce_are_unsupported(gpt2_folder, tmp_path, changes, named):
    with pytest.raises(pyllm.UnsupportedModelError, match=named):
        pyllm.load(with_config(gpt2_folder, tmp_path / "m", **changes), threads=1)


def rewrite_gguf(src: str, dst: str, drop: tuple[str, ...] = (), **changes) -> str:
    """A copy of a GGUF file without the metadata keys `drop`, with `changes` (same value types)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(src)
    writer = GGUFWriter(dst, str(reader.fields["general.architecture"].contents()))
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop:
            continue
        value = changes.get(key, f.contents())
        sub = f.types[1] if f.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, f.types[0], sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def test_gguf_rewrite_without_changes_loads_the_same(tied_gguf, tmp_path):
    _, _, files, ids = tied_gguf
    copy = rewrite_gguf(files["f16"], str(tmp_path / "copy.gguf"))
    assert np.array_equal(pyllm.load(copy, threads=2).logits(ids[:SHORT]),
                          pyllm.load(files["f16"], threads=2).logits(ids[:SHORT]))


@pytest.mark.parametrize("drop,changes,named", [
    ((), {"gpt2.attention.head_count": 5}, "gpt2.attention.head_count 5"),
    ((), {"gpt2.attention.layer_norm_epsilon": 0.0}, "gpt2.attention.layer_norm_epsilon"),
    (("gpt2.attention.layer_norm_epsilon",), {}, "gpt2.attention.layer_norm_epsilon"),
    (("gpt2.context_length",), {}, "gpt2.context_length"),
    (("gpt2.feed_forward_length",), {}, "gpt2.feed_forward_length"),
    ((), {"gpt2.context_length": 100}, "position_embd.weight"),     # the table holds 128 rows
    ((), {"gpt2.feed_forward_length": 300}, "ffn_up.weight"),
], ids=lambda v: str(v))
def test_gpt2_bad_gguf_metadata_raises_format_error_naming_it(tied_gguf, tmp_path, drop, changes, named):
    _, _, files, _ = tied_gguf
    bad = rewrite_gguf(files["f16"], str(tmp_path / "bad.gguf"), drop=drop, **changes)
    with pytest.raises(pyllm.FormatError, match="bad.gguf") as raised:
        pyllm.load(bad, threads=1)
    assert named in str(raised.value)
