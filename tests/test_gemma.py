"""Gemma 1, 2 and 3 (text): what differs from the other families, on tiny random checkpoints (bf16 on
disk, f32 compute on both sides). Their logits, greedy continuations, prefill and GGUF files against
transformers are tests/test_family_contract.py's (windows of 8, GQA and MQA, tied and untied heads, the
soft-caps, Gemma 3's two rope tables and q/k norms); here:

- the spec reads each Gemma recipe, and each soft-cap, window and rope spelling moves the logits and is
  followed as transformers follows it; the text part of Gemma3ForConditionalGeneration;
- a config or GGUF file with a bad Gemma setting raises FormatError naming it;
- Gemma's chat template renders as transformers renders it.
"""
from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pytest
import torch

import pyllm
from pyllm.chat import ChatTemplateError

from conftest import hf_float32
from families import CASES, llama_cpp_converter

N_POSITIONS = 48

# families.CASES's Gemma rows that keep the table's own layers, window and attention scale
GEMMA_CASES = ["gemma_gqa_tied", "gemma_mqa", "gemma_untied_attention_bias", "gemma2_gqa_soft_caps_window_8",
               "gemma2_mqa", "gemma3_gqa_two_ropes_window_8", "gemma3_mqa_untied_final_soft_cap"]


def token_ids(n: int = N_POSITIONS, seed: int = 7) -> list[int]:
    return np.random.default_rng(seed).integers(4, 419, n).tolist()


def oracle_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


@pytest.mark.parametrize("name", GEMMA_CASES)
def test_spec_reads_the_gemma_recipe(name, checkpoint):
    family, overrides = CASES[name].family, CASES[name].overrides
    spec = pyllm.load(checkpoint(family, **overrides), threads=1).spec
    assert spec.family == family and spec.activation == "gelu_tanh"
    assert spec.embed_scale == np.float32(spec.dim ** 0.5)
    assert spec.n_kv_heads == overrides.get("num_key_value_heads", 2)
    assert spec.tied_embeddings == overrides.get("tie_word_embeddings", True)
    if family == "gemma":
        assert spec.sliding_windows == [0, 0, 0] and spec.attn_scale == pytest.approx(24 ** -0.5)
    elif family == "gemma2":
        assert spec.sliding_windows == [8, 0, 8] and spec.attn_scale == pytest.approx(32 ** -0.5)
        assert (spec.attn_softcap, spec.logit_softcap) == (6.0, 8.0)
    else:
        assert spec.sliding_windows == [8, 8, 0] and spec.attn_scale == pytest.approx(20 ** -0.5)
        assert spec.layer_ropes == [1, 1, 0] and len(spec.ropes) == 2
        # global: base 1e6 with linear factor 8; local: base 1e4
        assert spec.ropes[0].inv_freq[0] == np.float32(1 / 8) and spec.ropes[1].inv_freq[0] == 1.0
        assert spec.ropes[0].inv_freq[1] == pytest.approx(1e6 ** (-2 / 24) / 8, rel=1e-6)
        assert spec.ropes[1].inv_freq[1] == pytest.approx(1e4 ** (-2 / 24), rel=1e-6)
        assert (spec.attn_softcap, spec.logit_softcap) == (0.0, overrides.get("final_logit_softcapping", 0.0))


# ---------------------------------------------------------------- what each Gemma difference does


REMOVE = object()


def with_config(folder: str, target, **changes) -> str:
    """A copy of a checkpoint (weights linked) whose config.json has changes (None writes null, REMOVE
    leaves the key out)."""
    os.makedirs(target, exist_ok=True)
    for name in os.listdir(folder):
        if name != "config.json" and not name.endswith(".gguf"):
            os.symlink(os.path.join(folder, name), os.path.join(target, name))
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    for key, value in changes.items():
        if value is REMOVE:
            config.pop(key, None)
        else:
            config[key] = value
    with open(os.path.join(target, "config.json"), "w") as f:
        json.dump(config, f)
    return str(target)


@pytest.fixture(scope="module")
def gemma2_folder(family_checkpoint):
    return family_checkpoint("gemma2")


@pytest.fixture(scope="module")
def gemma3_folder(family_checkpoint):
    return family_checkpoint("gemma3")


def test_gemma2_soft_caps_and_window_each_change_the_logits_and_are_matched(gemma2_folder, tmp_path):
    """Each of the attention soft-cap, the final soft-cap and the window moves the logits by far more
    than the tolerance on this checkpoint, and pyllm follows transformers with and without each."""
    ids = token_ids()
    base = pyllm.load(gemma2_folder, threads=2).logits(ids)
    for i, change in enumerate([{"attn_logit_softcapping": None}, {"final_logit_softcapping": None},
                                {"layer_types": ["full_attention"] * 3}]):
        folder = with_config(gemma2_folder, tmp_path / str(i), **change)  # null: no cap (absent: the default)
        got = pyllm.load(folder, threads=2).logits(ids)
        assert np.abs(got - oracle_logits(hf_float32(folder), ids)).max() <= 1e-4, change
        assert np.abs(got - base).max() > 0.05, change


def test_gemma3_missing_rope_keys_take_transformers_defaults(gemma3_folder, tmp_path):
    """The older spelling — rope_theta, rope_local_base_freq, rope_scaling — reads as rope_parameters."""
    ids = token_ids()
    new = pyllm.load(gemma3_folder, threads=2).logits(ids)
    folder = with_config(gemma3_folder, tmp_path / "old", rope_parameters=REMOVE, rope_theta=1_000_000.0,
                         rope_local_base_freq=10_000.0, rope_scaling={"rope_type": "linear", "factor": 8.0})
    old = pyllm.load(folder, threads=2).logits(ids)
    assert np.array_equal(new, old)
    assert np.abs(old - oracle_logits(hf_float32(folder), ids)).max() <= 1e-4


def test_gemma3_stale_sliding_window_pattern_is_ignored_for_layer_types(gemma3_folder, tmp_path):
    ids = token_ids()
    folder = with_config(gemma3_folder, tmp_path / "stale", _sliding_window_pattern=2)
    llm = pyllm.load(folder, threads=2)
    assert llm.spec.sliding_windows == [8, 8, 0]
    assert np.abs(llm.logits(ids) - oracle_logits(hf_float32(folder), ids)).max() <= 1e-4


def test_gemma3_without_layer_types_slides_five_layers_in_six(gemma3_folder, tmp_path):
    folder = with_config(gemma3_folder, tmp_path / "pattern", layer_types=REMOVE, num_hidden_layers=3,
                         sliding_window_pattern=2)
    assert pyllm.load(folder, threads=1).spec.sliding_windows == [8, 0, 8]
    folder = with_config(gemma3_folder, tmp_path / "default", layer_types=REMOVE)
    spec = pyllm.load(folder, threads=1).spec
    assert spec.sliding_windows == [8, 8, 8] and spec.layer_ropes == [0, 0, 0] and len(spec.ropes) == 1


def test_gemma_legacy_gelu_means_the_tanh_approximation(family_checkpoint, tmp_path):
    ids = token_ids()
    legacy = with_config(family_checkpoint("gemma"), tmp_path / "legacy", hidden_act="gelu")
    got = pyllm.load(legacy, threads=2).logits(ids)
    assert np.abs(got - pyllm.load(family_checkpoint("gemma"), threads=2).logits(ids)).max() == 0
    assert np.abs(got - oracle_logits(hf_float32(legacy), ids)).max() <= 1e-4


# ---------------------------------------------------------------- Gemma3ForConditionalGeneration's text part


def make_gemma3_multimodal(folder: str, like: str, seed: int = 0) -> str:
    """A tiny Gemma3ForConditionalGeneration whose language model has the tiny gemma3's shapes, saved as
    transformers saves it (language_model.model.*), with the same tokenizer."""
    import transformers

    with open(os.path.join(like, "config.json")) as f:
        text = {k: v for k, v in json.load(f).items() if k not in ("architectures", "dtype", "transformers_version")}
    vision = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                       boi_token_index=5, eoi_token_index=6, image_token_index=text["vocab_size"])
    torch.manual_seed(seed)
    model = transformers.Gemma3ForConditionalGeneration(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") and "language_model" in name:
                p.copy_(0.3 * torch.randn_like(p))
            elif "language_model" in name:
                p.normal_(0.0, 0.15)
    model.to(torch.bfloat16).save_pretrained(folder)
    for name in os.listdir(like):
        if name.startswith("tokenizer") or name == "special_tokens_map.json":
            shutil.copy(os.path.join(like, name), folder)
    return folder


def test_gemma3_multimodal_checkpoint_text_logits_match_transformers(gemma3_folder, tmp_path):
    import transformers

    folder = make_gemma3_multimodal(str(tmp_path / "mm"), gemma3_folder)
    with open(os.path.join(folder, "config.json")) as f:
        assert json.load(f)["architectures"] == ["Gemma3ForConditionalGeneration"]
    oracle = transformers.Gemma3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    ids = token_ids()
    llm = pyllm.load(folder, threads=2)
    assert llm.spec.family == "gemma3" and llm.spec.sliding_windows == [8, 8, 0]
    assert np.abs(llm.logits(ids) - oracle_logits(oracle, ids)).max() <= 1e-4


# ---------------------------------------------------------------- bad input


BAD_CONFIGS = [
    ("gemma2", {"query_pre_attn_scalar": 0}, "query_pre_attn_scalar"),
    ("gemma3", {"query_pre_attn_scalar": -4}, "query_pre_attn_scalar"),
    ("gemma2", {"attn_logit_softcapping": 0.0}, "attn_logit_softcapping"),
    ("gemma2", {"final_logit_softcapping": -30.0}, "final_logit_softcapping"),
    ("gemma3", {"final_logit_softcapping": 0}, "final_logit_softcapping"),
    ("gemma2", {"sliding_window": 512}, "sliding_window 512 is larger than the context 256"),
    ("gemma3", {"sliding_window": 257}, "sliding_window 257 is larger than the context 256"),
    ("gemma2", {"sliding_window": 0}, "sliding_window"),
    ("gemma3", {"sliding_window": "8"}, "sliding_window"),
    ("gemma2", {"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
    ("gemma3", {"layer_types": ["sliding_attention", "full_attention", "chunked_attention"]}, "layer_types"),
    ("gemma3", {"layer_types": "sliding_attention"}, "layer_types"),
    ("gemma", {"num_key_value_heads": 3}, "num_key_value_heads"),
    ("gemma2", {"num_attention_heads": 3}, "num_key_value_heads"),
    ("gemma3", {"num_key_value_heads": -1}, "num_key_value_heads"),
    ("gemma3", {"head_dim": 0}, "head_dim"),
    ("gemma3", {"sliding_window_pattern": 0, "layer_types": REMOVE}, "sliding_window_pattern"),
    ("gemma3", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}, "rope_parameters"),
    ("gemma3", {"rope_parameters": {"full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 0},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     "rope factor"),
]


@pytest.mark.parametrize("family,changes,named", BAD_CONFIGS,
                         ids=[f"{f}-{'-'.join(c)}" for f, c, _ in BAD_CONFIGS])
def test_bad_gemma_setting_raises_format_error_naming_it(family_checkpoint, tmp_path, family, changes, named):
    folder = with_config(family_checkpoint(family), tmp_path / "m", **changes)
    with pytest.raises(pyllm.FormatError, match="config.json") as raised:
        pyllm.load(folder, threads=1)
    assert named in str(raised.value)


def test_null_sliding_window_with_sliding_layers_raises_format_error(family_checkpoint, tmp_path):
    folder = with_config(family_checkpoint("gemma2"), tmp_path / "m", sliding_window=None)
    with pytest.raises(pyllm.FormatError, match="sliding_window is not set"):
        pyllm.load(folder, threads=1)


UNSUPPORTED_CONFIGS = [
    ("gemma", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ("gemma3", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ("gemma3", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ("gemma2", {"hidden_activation": "gelu"}, "hidden_activation 'gelu'"),
    ("gemma", {"hidden_act": "silu"}, "hidden_act 'silu'"),
]


@pytest.mark.parametrize("family,changes,named", UNSUPPORTED_CONFIGS,
                         ids=[f"{f}-{'-'.join(c)}" for f, c, _ in UNSUPPORTED_CONFIGS])
def test_gemma_setting_pyllm_does_not_run_raises_unsupported_model_error(family_checkpoint, tmp_path, family, changes,
                                                                         named):
    folder = with_config(family_checkpoint(family), tmp_path / "m", **changes)
    with pytest.raises(pyllm.UnsupportedModelError, match=named):
        pyllm.load(folder, threads=1)


def rewrite_gguf(source: str, target: str, changes: dict) -> str:
    """A copy of a GGUF file with metadata changed: key -> (value, GGUFValueType), or None to drop it."""
    import gguf

    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(target, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in changes:
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for key, change in changes.items():
        if change is not None:
            value, vtype = change
            sub = None
            if vtype == gguf.GGUFValueType.ARRAY:
                sub = gguf.GGUFValueType.BOOL if isinstance(value[0], bool) else gguf.GGUFValueType.INT32
            writer.add_key_value(key, value, vtype, sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


@pytest.fixture(scope="module")
def gguf_files(family_checkpoint, converted_gguf):
    """family -> llama.cpp's f32 conversion of its tiny checkpoint."""
    return lambda family: converted_gguf(family_checkpoint(family), "f32")


def _u32(v):
    import gguf
    return (v, gguf.GGUFValueType.UINT32)


def _f32(v):
    import gguf
    return (v, gguf.GGUFValueType.FLOAT32)


def _flags(v):
    import gguf
    return (v, gguf.GGUFValueType.ARRAY)


BAD_GGUF = [
    ("gemma2", {"gemma2.attn_logit_softcapping": _f32(0.0)}, "gemma2.attn_logit_softcapping"),
    ("gemma2", {"gemma2.final_logit_softcapping": _f32(-8.0)}, "gemma2.final_logit_softcapping"),
    ("gemma3", {"gemma3.final_logit_softcapping": _f32(0.0)}, "gemma3.final_logit_softcapping"),
    ("gemma2", {"gemma2.attention.sliding_window": _u32(300)}, "gemma2.attention.sliding_window 300 is larger"),
    ("gemma3", {"gemma3.attention.sliding_window": _u32(1024)}, "gemma3.attention.sliding_window 1024 is larger"),
    ("gemma3", {"gemma3.attention.sliding_window_pattern": _flags([True, False])},
     "gemma3.attention.sliding_window_pattern"),
    ("gemma2", {"gemma2.attention.sliding_window_pattern": _u32(2**31)}, "gemma2.attention.sliding_window_pattern"),
    ("gemma", {"gemma.attention.head_count_kv": _u32(3)}, "num_key_value_heads 3"),
    ("gemma3", {"gemma3.attention.key_length": _u32(0)}, "gemma3.attention.key_length"),
    ("gemma3", {"gemma3.rope.freq_base_swa": _f32(-1.0)}, "gemma3.rope.freq_base_swa"),
]


@pytest.mark.parametrize("family,changes,named", BAD_GGUF, ids=[f"{f}-{'-'.join(c)}" for f, c, _ in BAD_GGUF])
def test_bad_gemma_gguf_metadata_raises_format_error_naming_it(gguf_files, tmp_path, family, changes, named):
    path = rewrite_gguf(gguf_files(family), str(tmp_path / "bad.gguf"), changes)
    with pytest.raises(pyllm.FormatError, match="bad.gguf") as raised:
        pyllm.load(path, threads=1)
    assert named in str(raised.value)


def test_gguf_without_gemma_defaults_reads_them_as_llama_cpp_does(gguf_files, tmp_path):
    """Gemma 2 files without soft-caps or window get llama.cpp's 50, 30 and 4096; a Gemma 3 file
    without rope.freq_base_swa gets the local base 10,000; a per-layer pattern list is honoured."""
    path = rewrite_gguf(gguf_files("gemma2"), str(tmp_path / "g2.gguf"),
                        {"gemma2.attn_logit_softcapping": None, "gemma2.final_logit_softcapping": None,
                         "gemma2.attention.sliding_window": None, "gemma2.context_length": _u32(8192)})
    spec = pyllm.load(path, threads=1).spec
    assert (spec.attn_softcap, spec.logit_softcap) == (50.0, 30.0) and spec.sliding_windows == [4096, 0, 4096]
    path = rewrite_gguf(gguf_files("gemma3"), str(tmp_path / "g3.gguf"),
                        {"gemma3.rope.freq_base_swa": None,
                         "gemma3.attention.sliding_window_pattern": _flags([False, True, True])})
    spec = pyllm.load(path, threads=1).spec
    assert spec.sliding_windows == [0, 8, 8] and spec.layer_ropes == [0, 1, 1]
    assert spec.ropes[1].inv_freq[1] == pytest.approx(1e4 ** (-2 / 24), rel=1e-6)
    path = rewrite_gguf(gguf_files("gemma3"), str(tmp_path / "g3-full.gguf"),
                        {"gemma3.attention.sliding_window": None})
    spec = pyllm.load(path, threads=1).spec
    assert spec.sliding_windows == [0, 0, 0] and len(spec.ropes) == 1


# ---------------------------------------------------------------- chat template


def gemma_template() -> str:
    """Gemma's chat template as google/gemma-2-2b-it ships it; llama.cpp's source keeps a copy for its
    own template tests (transformers ships none)."""
    path = os.path.join(os.path.dirname(llama_cpp_converter()), "models", "templates", "google-gemma-2-2b-it.jinja")
    with open(path, encoding="utf-8") as f:
        return f.read()


CONVERSATION = [
    {"role": "user", "content": "  What is the capital of France?\n"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]


@pytest.mark.parametrize("turns", [1, 3])
def test_gemma_chat_template_renders_as_transformers(family_checkpoint, tmp_path, turns):
    import transformers

    folder = with_config(family_checkpoint("gemma"), tmp_path / "chat")
    with open(os.path.join(folder, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(gemma_template())
    messages = CONVERSATION[:turns]
    theirs = transformers.AutoTokenizer.from_pretrained(folder).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)
    llm = pyllm.load(folder, threads=1)
    ours = llm.render_chat(messages)
    assert ours == theirs
    assert ours.startswith("<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n")
    assert ours.endswith("<start_of_turn>model\n")


def test_gemma_chat_template_refuses_a_system_turn_like_transformers(family_checkpoint, tmp_path):
    folder = with_config(family_checkpoint("gemma"), tmp_path / "chat")
    with open(os.path.join(folder, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(gemma_template())
    llm = pyllm.load(folder, threads=1)
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        llm.render_chat([{"role": "system", "content": "Be brief."}] + CONVERSATION[:1])


@pytest.mark.parametrize("dtype,named", [("q4_0", "dtype=q4_0 needs rows of whole 32-element blocks"),
                                         ("q4_k", "dtype=q4_k (here q5_0) needs rows of whole 32")])
def test_a_dtype_whose_blocks_do_not_fit_the_rows_names_the_tensor(family_checkpoint, dtype, named):
    """The tiny Gemma's FFN is 181 wide: no 32-element block type fits its down projection."""
    with pytest.raises(ValueError, match=re.escape(named)) as e:
        pyllm.load(family_checkpoint("gemma"), dtype=dtype)
    assert "mlp.down_proj.weight" in str(e.value) and "181" in str(e.value)
