"""Proves the fixtures in families.py: each family's tiny checkpoint runs in transformers with varied
predictions, its tokenizer encodes like the reference it was built from, and llama.cpp's own converter turns
it into GGUF files (f32, f16) whose metadata and tensors relate to the Hugging Face weights exactly as pyllm's
GGUF reader has to expect (q/k row permutation, Gemma's +1 norms, GPT-2's transposed Conv1D, fused Phi-3
projections)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import english_text, hf_float32
from families import FAMILIES, GGUF_ARCH, llama_cpp_converter, phi3_longrope

ALL = list(FAMILIES)
SPM = [f for f in ALL if FAMILIES[f].tokenizer in ("llama", "phi3", "gemma")]
BPE = [f for f in ALL if FAMILIES[f].tokenizer in ("gpt2", "qwen2")]

pytestmark = pytest.mark.slow  # llama.cpp's converter and transformers run every family


@pytest.fixture(scope="module")
def gguf_file(family_checkpoint, converted_gguf):
    """(family, outtype) -> (path, GGUFReader), converted once per session and read once per module."""
    from gguf import GGUFReader

    done = {}

    def get(family: str, outtype: str):
        if (family, outtype) not in done:
            path = converted_gguf(family_checkpoint(family), outtype)
            done[family, outtype] = path, GGUFReader(path)
        return done[family, outtype]
    return get


def _metadata(reader) -> dict:
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def _tensors(reader) -> dict:
    return {t.name: t for t in reader.tensors}


def _hf_weights(folder: str) -> dict:
    from safetensors.torch import load_file

    return {k: v.float().numpy() for k, v in load_file(os.path.join(folder, "model.safetensors")).items()}


def _ids(folder: str, n: int) -> list[int]:
    """The first n tokens of English prose, through the checkpoint's own tokenizer (with its bos, if any)."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(folder).encode(english_text()[:2000])[:n]


def _config(folder: str) -> dict:
    import json

    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("family", ALL)
def test_family_checkpoint_runs_in_transformers_with_varied_predictions(family, family_checkpoint):
    import torch

    folder = family_checkpoint(family)
    ids = _ids(folder, 48)
    with torch.no_grad():
        logits = hf_float32(folder)(torch.tensor([ids])).logits[0].numpy()
    assert logits.shape == (len(ids), _config(folder)["vocab_size"])
    assert np.isfinite(logits).all()
    top = logits.argmax(-1)
    assert len(set(top.tolist())) >= len(ids) // 4, "argmax barely changes with position"
    assert (top != np.array(ids)).mean() > 0.1, "the model only echoes its input"
    assert logits.std() > 0.5


@pytest.mark.parametrize("family", SPM)
def test_spm_tokenizer_json_encodes_like_its_sentencepiece_model(family, family_checkpoint):
    import sentencepiece as spm
    from tokenizers import Tokenizer

    folder = family_checkpoint(family)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(folder, "tokenizer.model"))
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    text = english_text()[:20000] + "\n\n  3.14159 naïve café 🦙 ~~~\t done"
    assert tok.encode(text, add_special_tokens=False).ids == sp.encode(text)
    assert tok.encode("Hello").ids[0] == sp.bos_id()


@pytest.mark.parametrize("family", BPE)
def test_bpe_tokenizer_encodes_llama_cpp_test_vectors(family, family_checkpoint):
    from tokenizers import Tokenizer

    name = {"gpt2": "gpt-2", "qwen2": "qwen2"}[FAMILIES[family].tokenizer]
    base = os.path.join(os.path.dirname(llama_cpp_converter()), "models", f"ggml-vocab-{name}.gguf")
    with open(base + ".inp", encoding="utf-8", newline="") as f:
        texts = f.read().split("\n__ggml_vocab_test__\n")[:-1]
    with open(base + ".out", encoding="utf-8", newline="") as f:
        expected = [[int(i) for i in line.split()] for line in f.read().split("\n")[:len(texts)]]
    tok = Tokenizer.from_file(os.path.join(family_checkpoint(family), "tokenizer.json"))
    assert [tok.encode(t, add_special_tokens=False).ids for t in texts] == expected


@pytest.mark.parametrize("family", ALL)
def test_converter_writes_family_architecture_and_hyperparameters(family, family_checkpoint, gguf_file):
    folder = family_checkpoint(family)
    cfg = _config(folder)
    _, reader = gguf_file(family, "f32")
    meta = _metadata(reader)
    arch = GGUF_ARCH[family]
    assert meta["general.architecture"] == arch
    assert meta["general.file_type"] == 0
    n_layer = cfg.get("num_hidden_layers", cfg.get("n_layer"))
    assert meta[f"{arch}.block_count"] == n_layer
    assert meta[f"{arch}.embedding_length"] == cfg.get("hidden_size", cfg.get("n_embd"))
    assert meta[f"{arch}.attention.head_count"] == cfg.get("num_attention_heads", cfg.get("n_head"))
    assert len(meta["tokenizer.ggml.tokens"]) == cfg["vocab_size"]
    assert meta["tokenizer.ggml.eos_token_id"] == cfg["eos_token_id"]
    if family == "gpt2":
        assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
        assert meta["gpt2.context_length"] == cfg["n_positions"]
        assert meta["gpt2.feed_forward_length"] == 4 * cfg["n_embd"]
        return
    assert meta[f"{arch}.attention.head_count_kv"] == cfg["num_key_value_heads"]
    assert meta[f"{arch}.feed_forward_length"] == cfg["intermediate_size"]
    assert meta[f"{arch}.context_length"] == cfg["max_position_embeddings"]
    assert meta[f"{arch}.attention.layer_norm_rms_epsilon"] == pytest.approx(cfg["rms_norm_eps"])
    if "head_dim" in FAMILIES[family].settings:
        assert meta[f"{arch}.attention.key_length"] == cfg["head_dim"]
        assert cfg["head_dim"] != cfg["hidden_size"] // cfg["num_attention_heads"]
    if FAMILIES[family].tokenizer == "qwen2":
        assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "qwen2"
    else:
        assert meta["tokenizer.ggml.model"] == "llama" and meta["tokenizer.ggml.pre"] == "default"
        assert "tokenizer.ggml.scores" in meta
    if family in ("llama", "mistral"):
        assert meta["llama.rope.dimension_count"] == cfg["hidden_size"] // cfg["num_attention_heads"]
        assert not any("sliding" in k for k in meta), "llama.cpp's llama arch has no window"
    if family in ("qwen2", "qwen3"):
        assert meta[f"{arch}.rope.freq_base"] == cfg["rope_parameters"]["rope_theta"]
    if family == "gemma2":
        assert meta["gemma2.attn_logit_softcapping"] == cfg["attn_logit_softcapping"]
        assert meta["gemma2.final_logit_softcapping"] == cfg["final_logit_softcapping"]
        assert meta["gemma2.attention.sliding_window"] == cfg["sliding_window"]
    if family == "gemma3":
        rope = cfg["rope_parameters"]
        assert meta["gemma3.attention.sliding_window"] == cfg["sliding_window"]
        assert meta["gemma3.rope.freq_base"] == rope["full_attention"]["rope_theta"]
        assert meta["gemma3.rope.freq_base_swa"] == rope["sliding_attention"]["rope_theta"]
        assert meta["gemma3.rope.scaling.type"] == "linear"
        assert meta["gemma3.rope.scaling.factor"] == rope["full_attention"]["factor"]
    if family in ("gemma2", "gemma3"):
        # neither the layer pattern nor query_pre_attn_scalar reaches the file
        assert not any("pattern" in k or "scalar" in k for k in meta)
    if family == "phi3":
        assert meta["phi3.rope.dimension_count"] == cfg["hidden_size"] // cfg["num_attention_heads"]
        assert meta["phi3.rope.scaling.original_context_length"] == cfg["original_max_position_embeddings"]
        assert meta["phi3.attention.sliding_window"] == 0
        assert cfg["vocab_size"] > len([t for t in meta["tokenizer.ggml.tokens"] if not t.startswith("[PAD")])


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter: rotate-half (HF) rows to interleaved pairs, per head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _expected_gguf_tensors(family: str, hf: dict, cfg: dict) -> dict[str, np.ndarray]:
    """What each GGUF tensor must hold, in numpy layout (GGUF ne reversed), computed from the HF weights."""
    out = {}
    if family == "gpt2":
        out["token_embd.weight"] = hf["transformer.wte.weight"]
        out["position_embd.weight"] = hf["transformer.wpe.weight"]
        for p in ("weight", "bias"):
            out[f"output_norm.{p}"] = hf[f"transformer.ln_f.{p}"]
        for i in range(cfg["n_layer"]):
            h, b = f"transformer.h.{i}.", f"blk.{i}."
            for src, dst in (("ln_1", "attn_norm"), ("ln_2", "ffn_norm"), ("attn.c_attn", "attn_qkv"),
                             ("attn.c_proj", "attn_output"), ("mlp.c_fc", "ffn_up"), ("mlp.c_proj", "ffn_down")):
                w = hf[h + src + ".weight"]
                out[b + dst + ".weight"] = w if src.startswith("ln") else w.T  # Conv1D stores (in, out)
                out[b + dst + ".bias"] = hf[h + src + ".bias"]
        return out

    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    plus = 1.0 if FAMILIES[family].norm_offset else 0.0  # Gemma's (1 + w) is stored folded, added in f32
    out["token_embd.weight"] = hf["model.embed_tokens.weight"]
    out["output_norm.weight"] = hf["model.norm.weight"] + plus
    if "lm_head.weight" in hf and not cfg.get("tie_word_embeddings"):
        out["output.weight"] = hf["lm_head.weight"]
    # Phi-3's fused projections keep their rows, [q; k; v] and [gate; up]: the latter is stored as ffn_up
    names = {"input_layernorm": "attn_norm", "self_attn.o_proj": "attn_output", "mlp.down_proj": "ffn_down",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}
    if family in ("gemma2", "gemma3"):
        names.update({"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                      "post_feedforward_layernorm": "post_ffw_norm"})
    else:
        names["post_attention_layernorm"] = "ffn_norm"
    for key, w in hf.items():
        if not key.startswith("model.layers."):
            continue
        i, rest = key[len("model.layers."):].split(".", 1)
        module, kind = rest.rsplit(".", 1)
        dst = f"blk.{i}.{names[module]}.{kind}"
        if family in ("llama", "mistral") and module == "self_attn.q_proj":
            w = _permute(w, n_head)
        elif family in ("llama", "mistral") and module == "self_attn.k_proj":
            w = _permute(w, n_kv)
        if "norm" in module:
            w = w + plus
        out[dst] = w
    return out


@pytest.mark.parametrize("family", ALL)
def test_f32_gguf_tensors_are_the_hf_weights_in_llama_cpp_layout(family, family_checkpoint, gguf_file):
    folder = family_checkpoint(family)
    cfg = _config(folder)
    _, reader = gguf_file(family, "f32")
    tensors = _tensors(reader)
    expected = _expected_gguf_tensors(family, _hf_weights(folder), cfg)
    assert sorted(tensors) == sorted(expected)
    for name, want in expected.items():
        got = np.asarray(tensors[name].data)
        assert tensors[name].tensor_type.name == "F32"
        assert [int(n) for n in tensors[name].shape] == list(reversed(want.shape)), name
        np.testing.assert_array_equal(got.reshape(want.shape), want, err_msg=name)
    if family in ("llama", "mistral"):  # the permutation really moved rows
        assert not np.array_equal(_hf_weights(folder)["model.layers.0.self_attn.q_proj.weight"],
                                  np.asarray(tensors["blk.0.attn_q.weight"].data))


@pytest.mark.parametrize("family", ALL)
def test_f16_gguf_rounds_matrices_and_keeps_vectors_f32(family, family_checkpoint, gguf_file):
    folder = family_checkpoint(family)
    _, r32 = gguf_file(family, "f32")
    _, r16 = gguf_file(family, "f16")
    t32, t16 = _tensors(r32), _tensors(r16)
    assert _metadata(r16)["general.file_type"] == 1
    assert sorted(t16) == sorted(t32)
    for name, t in t16.items():
        want = np.asarray(t32[name].data)
        if len(t.shape) == 1 or name == "position_embd.weight":
            assert t.tensor_type.name == "F32", name
        else:
            assert t.tensor_type.name == "F16", name
        np.testing.assert_allclose(np.asarray(t.data, dtype=np.float32).reshape(want.shape), want,
                                   rtol=1e-3, atol=1e-6, err_msg=name)


def test_phi3_longrope_factors_become_rope_factor_tensors(checkpoint, converted_gguf):
    from gguf import GGUFReader

    overrides = phi3_longrope()
    reader = GGUFReader(converted_gguf(checkpoint("phi3", **overrides), "f32"))
    meta, tensors = _metadata(reader), _tensors(reader)
    rope = overrides["rope_parameters"]
    np.testing.assert_allclose(tensors["rope_factors_long.weight"].data, rope["long_factor"], rtol=1e-6)
    np.testing.assert_allclose(tensors["rope_factors_short.weight"].data, rope["short_factor"], rtol=1e-6)
    assert meta["phi3.rope.scaling.original_context_length"] == overrides["original_max_position_embeddings"]
    assert meta["phi3.context_length"] == overrides["max_position_embeddings"]
    scale = overrides["max_position_embeddings"] / overrides["original_max_position_embeddings"]
    assert meta["phi3.rope.scaling.attn_factor"] == pytest.approx(
        np.sqrt(1 + np.log(scale) / np.log(overrides["original_max_position_embeddings"])))


def test_gemma2_softcaps_bend_attention_and_final_logits(family_checkpoint):
    import torch

    folder = family_checkpoint("gemma2")
    ids = torch.tensor([_ids(folder, 40)])
    model = hf_float32(folder)
    final_cap = model.config.final_logit_softcapping
    with torch.no_grad():
        capped = model(ids).logits
        model.config.final_logit_softcapping = None
        uncapped_final = model(ids).logits
        for layer in model.model.layers:
            layer.self_attn.attn_logit_softcapping = None
        uncapped = model(ids).logits
    assert capped.abs().max() < final_cap
    assert capped.abs().max() < 0.85 * uncapped_final.abs().max()  # the final cap bends the largest logits
    assert (uncapped - uncapped_final).abs().max() > 0.1  # and the attention cap changes what flows on
