"""The Qwen2, Qwen3 and Phi-3 families' own differences on tiny random checkpoints (bf16 on disk, f32
compute on both sides); their logits, greedy continuations, prefill and GGUF files against transformers
are tests/test_family_contract.py's. Here: the rope tables (within 1 ULP) and the per-layer windows,
Phi-3's fused projections and LongRoPE, Qwen's layer windows; malformed configs and GGUF files raise
FormatError naming the key; the families' real chat templates (as llama.cpp's sdist ships them) render
as transformers renders them."""
from __future__ import annotations

import functools
import json
import os
import shutil
from dataclasses import dataclass

import numpy as np
import pytest

import pyllm
from pyllm.arch import phi3, qwen2
from pyllm.chat import render_chat
from pyllm.formats.mapped import TensorInfo
from pyllm.tokenizer import Tokenizer

from conftest import hf_float32
from families import CASES as ALL_CASES
from families import llama_cpp_converter

N_POSITIONS = 48


# families.CASES's Qwen2, Qwen3 and Phi-3 rows
CASES = {name: c for name, c in ALL_CASES.items() if c.family in ("qwen2", "qwen3", "phi3")}


@dataclass
class Built:
    folder: str
    ids: list[int]

    @functools.cached_property
    def oracle(self):
        return hf_float32(self.folder)


@pytest.fixture(scope="module")
def build(checkpoint):
    """name -> Built: the case's checkpoint (built once per session) and its token ids."""
    done: dict[str, Built] = {}

    def get(name: str) -> Built:
        if name not in done:
            folder = checkpoint(CASES[name].family, **CASES[name].overrides)
            with open(os.path.join(folder, "config.json")) as f:
                vocab = json.load(f)["vocab_size"]
            done[name] = Built(folder, np.random.default_rng(7).integers(3, vocab, N_POSITIONS).tolist())
        return done[name]
    return get


@pytest.fixture(scope="module")
def gguf(build, converted_gguf):
    """(name, outtype) -> a GGUF file converted from the case's folder by llama.cpp's converter."""
    return lambda name, outtype: converted_gguf(build(name).folder, outtype)


@pytest.fixture(params=sorted(CASES))
def case(request, build) -> tuple[str, Built]:
    return request.param, build(request.param)


# ---------------------------------------------------------------------------------------------- the folder

def float64_pow_inv_freq(rope: dict, n_rot: int) -> np.ndarray:
    """transformers' float32 table, 1 / (factor_i · theta^(2i / n_rot)), with the power taken in float64
    and rounded once (every other step is IEEE float32 arithmetic, the same on every machine); LongRoPE's
    short factors or none."""
    exponents = np.arange(0, n_rot, 2).astype(np.float32) / np.float32(n_rot)
    powers = (float(np.float32(rope["rope_theta"])) ** exponents.astype(np.float64)).astype(np.float32)
    factors = rope.get("short_factor")
    if factors is not None:
        powers = np.asarray(factors, dtype=np.float32) * powers
    return np.float32(1.0) / powers


def test_rope_tables_are_transformers_with_a_float64_pow_within_1_ulp_of_it(case):
    """transformers' float32 pow differs in the last bit between CPUs (AVX2 and AVX-512 give other bits):
    pyllm's table is transformers' formula with that one step exact, the same bits on every machine."""
    name, b = case
    spec = pyllm.load(b.folder, threads=1).spec
    rotary = b.oracle.model.rotary_emb
    assert len(spec.ropes) == 1 and spec.n_rot == 2 * rotary.inv_freq.shape[0], name
    want = float64_pow_inv_freq(b.oracle.config.rope_parameters, spec.n_rot)
    np.testing.assert_array_equal(spec.ropes[0].inv_freq, want, err_msg=name)
    np.testing.assert_array_max_ulp(spec.ropes[0].inv_freq, rotary.inv_freq.numpy(), maxulp=1)
    assert np.float32(spec.ropes[0].scale) == np.float32(rotary.attention_scaling), name


def test_sliding_windows_are_transformers_per_layer_windows(case):
    name, b = case
    spec = pyllm.load(b.folder, threads=1).spec
    # Qwen's attention holds its layer's window; Phi-3's reads the config's on every layer
    expected = [(getattr(layer.self_attn, "sliding_window", b.oracle.config.sliding_window) or 0)
                for layer in b.oracle.model.layers]
    assert spec.sliding_windows == expected, name
    assert any(spec.sliding_windows) == ("sliding_window" in name), name


# ---------------------------------------------------------------------------------------------- GGUF

def test_phi3_fused_projections_bind_as_row_views_of_one_tensor(build, gguf):
    """qkv_proj rows [q; k; v] and gate_up_proj rows [gate; up] (GGUF attn_qkv, ffn_up) are bound
    where they lie in the file: consecutive row ranges of the fused tensor, no copy."""
    from pyllm.formats.gguf import GGUFFile
    from pyllm.formats.safetensors import open_checkpoint

    name = "phi3_gqa_untied"
    b = build(name)
    spec = pyllm.load(b.folder, threads=1).spec
    q, kv, ffn = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim, spec.ffn_dim
    sources = [(phi3.hf_tensors, open_checkpoint(b.folder).tensors, "model.layers.1.self_attn.qkv_proj.weight",
                "model.layers.1.mlp.gate_up_proj.weight"),
               (phi3.gguf_tensors, GGUFFile(gguf(name, "f32")).tensors, "blk.1.attn_qkv.weight", "blk.1.ffn_up.weight")]
    for bind, tensors, qkv_name, gate_up_name in sources:
        bound = bind(spec, tensors, "test")
        for fused_name, parts in ((qkv_name, [("wq", q), ("wk", kv), ("wv", kv)]),
                                  (gate_up_name, [("w_gate", ffn), ("w_up", ffn)])):
            fused = tensors[fused_name]
            row = fused.nbytes // fused.shape[0]
            start = 0
            for slot, rows in parts:
                view = bound[f"layers.1.{slot}"]
                assert isinstance(view, TensorInfo) and view.file is fused.file, slot
                assert view.shape == (rows, spec.dim) and view.offset == fused.offset + start * row, slot
                start += rows
            assert start == fused.shape[0]


def test_phi3_longrope_refuses_a_context_beyond_the_original_one(build, gguf):
    """Short factors are right only up to original_max_position_embeddings (64 here, of 256)."""
    name = "phi3_longrope_short_factors"
    for source in (build(name).folder, gguf(name, "f32")):
        assert pyllm.load(source, threads=1).n_ctx == 64  # the default stops there
        assert pyllm.load(source, threads=1, n_ctx=64).n_ctx == 64
        with pytest.raises(ValueError, match="n_ctx 65 is more than the 64 positions"):
            pyllm.load(source, threads=1, n_ctx=65)
    plain = pyllm.load(build("phi3_gqa_untied").folder, threads=1, n_ctx=256)  # no rope limit without LongRoPE
    assert plain.n_ctx == 256 and plain.spec.max_ctx == 0


@pytest.mark.parametrize("extra", [{}, {"attention_factor": 1.3}, {"factor": 8.0}],
                         ids=["derived", "attention_factor", "factor"])
@pytest.mark.parametrize("spelling", ["rope_scaling", "rope_parameters"])
def test_phi3_longrope_config_spellings_give_transformers_rotary(spelling, extra):
    """Phi-3-*-128k and Phi-4-mini files write rope_scaling {"type": "longrope", ...} with rope_theta and
    partial_rotary_factor at the top level; transformers 5 writes rope_parameters. Either way the
    short-factor table and the attention factor (given, or derived from factor or the context ratio)
    are transformers' (the table with its power taken in float64, within 1 ULP of transformers')."""
    import transformers
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    rope = {"short_factor": [1.0 + i / 37 for i in range(8)], "long_factor": [2.0 + i for i in range(8)], **extra}
    config = dict(architectures=["Phi3ForCausalLM"], hidden_size=80, num_attention_heads=4, num_hidden_layers=2,
                  intermediate_size=64, vocab_size=32064, max_position_embeddings=1024,
                  original_max_position_embeddings=128)
    if spelling == "rope_scaling":
        config.update(rope_scaling={"type": "longrope", **rope}, rope_theta=5000.0, partial_rotary_factor=0.8)
    else:
        config.update(rope_parameters={"rope_type": "longrope", "rope_theta": 5000.0, "partial_rotary_factor": 0.8,
                                       **rope})
    hf = Phi3RotaryEmbedding(transformers.Phi3Config.from_dict(config))
    spec = phi3.spec_from_config(config)
    assert spec.n_rot == 16 and spec.max_ctx == 128 and spec.max_seq_len == 1024
    np.testing.assert_array_equal(spec.ropes[0].inv_freq, float64_pow_inv_freq(hf.config.rope_parameters, 16))
    np.testing.assert_array_max_ulp(spec.ropes[0].inv_freq, hf.inv_freq.numpy(), maxulp=1)
    assert np.float32(spec.ropes[0].scale) == np.float32(hf.attention_scaling) != 1


# ---------------------------------------------------------------------------------------------- layer windows

@pytest.mark.parametrize("settings", [
    {},
    {"use_sliding_window": True},
    {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2},
    {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 0},
    {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 9},
    {"use_sliding_window": True, "sliding_window": None, "max_window_layers": 1},
    {"use_sliding_window": False, "sliding_window": 16, "max_window_layers": 0},
    {"sliding_window": 16, "max_window_layers": 0},
    {"use_sliding_window": True, "sliding_window": 16,
     "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]},
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())[:60] or "defaults")
@pytest.mark.parametrize("config_class", ["Qwen2Config", "Qwen3Config"])
def test_qwen_layer_windows_are_what_transformers_computes(settings, config_class):
    """Configs written before transformers 5 carry no layer_types: the window goes on layers
    >= max_window_layers, and only with use_sliding_window."""
    import transformers

    config = dict(settings, num_hidden_layers=4)
    hf = getattr(transformers, config_class)(**config)
    expected = [hf.sliding_window or 0 if t == "sliding_attention" else 0 for t in hf.layer_types]
    assert qwen2.layer_windows(config, 4) == expected


# ---------------------------------------------------------------------------------------------- bad input

def _copy_with_config(folder: str, target, change) -> str:
    target = str(target)
    shutil.copytree(folder, target)
    path = os.path.join(target, "config.json")
    with open(path) as f:
        config = json.load(f)
    change(config)
    with open(path, "w") as f:
        json.dump(config, f)
    return target


def _set(**values):
    return lambda config: config.update(values)


def _rope(**values):
    return lambda config: config["rope_parameters"].update(values)


@pytest.mark.parametrize("name,change,named", [
    ("qwen2_gqa_tied_qkv_bias", _set(use_sliding_window=True, sliding_window=512),
     "sliding_window 512 is larger than the context 256"),
    ("qwen2_gqa_tied_qkv_bias", _set(max_window_layers=-1), "max_window_layers"),
    ("qwen2_gqa_tied_qkv_bias", _set(num_key_value_heads=3), "num_key_value_heads 3"),
    ("qwen2_gqa_tied_qkv_bias", _set(num_attention_heads=5), "num_attention_heads 5"),
    ("qwen2_gqa_tied_qkv_bias", _set(layer_types=["full_attention"]), "layer_types"),
    ("qwen2_gqa_tied_qkv_bias", _set(layer_types=["full_attention", "local", "full_attention"]), "layer_types"),
    ("qwen2_gqa_tied_qkv_bias", _set(use_sliding_window=True, sliding_window=0), "sliding_window"),
    ("qwen3_gqa_tied_qk_norm_head_dim_24", _set(use_sliding_window=True, sliding_window=1000), "sliding_window 1000"),
    ("qwen3_gqa_tied_qk_norm_head_dim_24", _set(max_window_layers=-2), "max_window_layers"),
    ("qwen3_gqa_tied_qk_norm_head_dim_24", _set(num_key_value_heads=3), "num_key_value_heads 3"),
    ("qwen3_gqa_tied_qk_norm_head_dim_24", _set(head_dim=0), "head_dim"),
    ("phi3_longrope_short_factors", _rope(short_factor=[1.0] * 9), "short_factor must list 10 factors"),
    ("phi3_longrope_short_factors", _rope(long_factor=[1.0] * 11), "long_factor must list 10 factors"),
    ("phi3_longrope_short_factors", _rope(short_factor=[1.0] * 9 + [0.0]), "short_factor"),
    ("phi3_longrope_short_factors", _rope(attention_factor=-1.0), "attention_factor"),
    ("phi3_longrope_short_factors", _set(original_max_position_embeddings=0), "original_max_position_embeddings"),
    ("phi3_longrope_short_factors", _rope(rope_type="linear"), "rope_type 'linear'"),
    ("phi3_gqa_untied", _rope(partial_rotary_factor=0.55), "partial_rotary_factor"),
    ("phi3_gqa_untied", _set(num_key_value_heads=3), "num_key_value_heads 3"),
    ("phi3_gqa_untied", _set(num_attention_heads=3), "num_attention_heads 3"),
])
def test_bad_config_raises_format_error_naming_the_key(name, change, named, build, tmp_path):
    folder = _copy_with_config(build(name).folder, tmp_path / "bad", change)
    with pytest.raises(pyllm.FormatError, match=named) as e:
        pyllm.load(folder, threads=1)
    assert e.value.path.endswith("config.json")


def test_phi3_window_wider_than_the_context_is_accepted(build, tmp_path):
    """Phi-3-*-128k configs say sliding_window 262144 with 131072 positions: a window that never
    binds, which transformers runs as written."""
    folder = _copy_with_config(build("phi3_gqa_untied").folder, tmp_path / "wide", _set(sliding_window=512))
    assert pyllm.load(folder, threads=1).spec.sliding_windows == [512] * 3


def _rewrite_gguf(src: str, dst: str, changes: dict | None = None, tensors: dict | None = None,
                  drop: tuple = ()) -> str:
    """A copy of a GGUF file with metadata values changed, tensors replaced or added, keys or tensors
    dropped."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    changes, tensors = changes or {}, tensors or {}
    reader = GGUFReader(src)
    writer = GGUFWriter(dst, str(reader.fields["general.architecture"].contents()))
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop:
            continue
        sub = f.types[1] if f.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, changes.get(key, f.contents()), f.types[0], sub_type=sub)
    for t in reader.tensors:
        if t.name in drop:
            continue
        if t.name in tensors:
            writer.add_tensor(t.name, tensors[t.name])
        else:
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    for name, array in tensors.items():  # new ones go last
        if name not in {t.name for t in reader.tensors}:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def test_phi3_gguf_with_separate_q_k_v_gives_the_fused_files_logits(build, gguf, tmp_path):
    """llama.cpp also reads phi3 files whose attention projections are stored apart (attn_q/k/v)."""
    from gguf import GGUFReader

    name = "phi3_gqa_untied"
    fused = gguf(name, "f32")
    spec = pyllm.load(fused, threads=1).spec
    q, kv = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
    split, drop = {}, []
    for t in GGUFReader(fused).tensors:
        if t.name.endswith("attn_qkv.weight"):
            block = t.name[: -len("attn_qkv.weight")]
            data = np.asarray(t.data)
            split.update({block + "attn_q.weight": data[:q], block + "attn_k.weight": data[q:q + kv],
                          block + "attn_v.weight": data[q + kv:]})
            drop.append(t.name)
    apart = _rewrite_gguf(fused, str(tmp_path / "apart.gguf"), tensors=split, drop=tuple(drop))
    ids = build(name).ids
    assert np.array_equal(pyllm.load(apart, threads=2).logits(ids), pyllm.load(fused, threads=2).logits(ids))


@pytest.mark.parametrize("name,changes,tensors,drop,named", [
    ("qwen2_gqa_tied_qkv_bias", {"qwen2.attention.head_count_kv": 3}, {}, (), "qwen2.attention.head_count_kv 3"),
    ("qwen2_gqa_tied_qkv_bias", {}, {}, ("blk.2.attn_k.bias",), "blk.2.attn_k.bias"),
    ("qwen3_gqa_tied_qk_norm_head_dim_24", {}, {}, ("blk.1.attn_q_norm.weight",), "blk.1.attn_q_norm.weight"),
    ("phi3_longrope_short_factors", {}, {"rope_factors_short.weight": np.ones(9, np.float32)}, (),
     "rope_factors_short.weight must list 10 factors"),
    ("phi3_longrope_short_factors", {}, {"rope_factors_long.weight": np.ones(12, np.float32)}, (),
     "rope_factors_long.weight must list 10 factors"),
    ("phi3_longrope_short_factors", {}, {"rope_factors_short.weight": -np.ones(10, np.float32)}, (),
     "rope_factors_short.weight"),
    ("phi3_gqa_untied", {"phi3.rope.dimension_count": 19}, {}, (), "phi3.rope.dimension_count 19"),
    ("phi3_gqa_untied", {"phi3.attention.head_count_kv": 3}, {}, (), "phi3.attention.head_count_kv 3"),
    ("phi3_gqa_untied", {"phi3.feed_forward_length": 170}, {}, (), "ffn_up.weight"),
])
def test_bad_gguf_raises_format_error_naming_the_key(name, changes, tensors, drop, named, gguf, tmp_path):
    bad = _rewrite_gguf(gguf(name, "f32"), str(tmp_path / "bad.gguf"), changes, tensors, drop)
    with pytest.raises(pyllm.FormatError, match=named):
        pyllm.load(bad, threads=1)


# ---------------------------------------------------------------------------------------------- chat templates

def _template(name: str) -> str:
    """A real chat template as llama.cpp's sdist ships it (fetched from the model's own repository by
    its scripts/get_chat_template.py)."""
    path = os.path.join(os.path.dirname(llama_cpp_converter()), "models", "templates", name)
    with open(path, encoding="utf-8") as f:
        return f.read()


QWEN25 = "Qwen-Qwen2.5-7B-Instruct.jinja"
QWEN3 = "Qwen-Qwen3-0.6B.jinja"
PHI35 = "microsoft-Phi-3.5-mini-instruct.jinja"

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}]
SYSTEM = {"role": "system", "content": "You are terse."}
TURNS = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
         {"role": "user", "content": "And in 日本語?"}]
TOOL_TURNS = [
    {"role": "user", "content": "Weather in Paris and Zürich?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}]},
    {"role": "tool", "content": "{\"temperature\": 21}"},
    {"role": "tool", "content": "{\"temperature\": 14}"},
    {"role": "assistant", "content": "Paris 21 °C, Zürich 14 °C."},
    {"role": "user", "content": "Thanks"},
]
THINKING_TURNS = [{"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."},
                  {"role": "user", "content": "3+3?"},
                  {"role": "assistant", "content": "<think>\nthree and three\n</think>\n\n6"}]


@pytest.fixture(scope="module")
def qwen_folder_with_template(build, tmp_path_factory):
    """The tiny Qwen2 checkpoint (the real Qwen2 vocabulary and special tokens) with a template."""
    @functools.lru_cache(maxsize=None)
    def get(template: str) -> str:
        folder = str(tmp_path_factory.mktemp("chat"))
        src = build("qwen2_gqa_tied_qkv_bias").folder
        for name in os.listdir(src):
            if not name.endswith(".gguf"):
                shutil.copy(os.path.join(src, name), folder)
        with open(os.path.join(folder, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(_template(template))
        return folder
    return get


@functools.lru_cache(maxsize=None)
def _tokenizers(folder: str):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(folder), Tokenizer.from_folder(folder)


def _both(folder: str, messages: list[dict], add_generation_prompt: bool = True, **kw) -> tuple[str, str]:
    """pyllm's and transformers' renderings with the folder's template and special tokens."""
    tok, llm_tok = _tokenizers(folder)
    theirs = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kw)
    ours = render_chat(llm_tok.chat_template, messages, bos_token=llm_tok.bos_token, eos_token=llm_tok.eos_token,
                       add_generation_prompt=add_generation_prompt, **kw)
    return ours, theirs


CHATS = {"one-turn": TURNS[:1], "system+multi-turn": [SYSTEM] + TURNS, "tool-calls": TOOL_TURNS,
         "system+tool-calls": [SYSTEM] + TOOL_TURNS}


@pytest.mark.parametrize("with_tools", [False, True], ids=["no-tools", "tools"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("chat", sorted(CHATS))
@pytest.mark.parametrize("template", [QWEN25, QWEN3])
def test_qwen_chatml_templates_render_as_transformers(template, chat, add_generation_prompt, with_tools,
                                                      qwen_folder_with_template):
    folder = qwen_folder_with_template(template)
    kw = {"tools": TOOLS} if with_tools else {}
    ours, theirs = _both(folder, CHATS[chat], add_generation_prompt, **kw)
    assert ours == theirs
    assert ("<tools>" in ours) == with_tools
    assert ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"' in ours) == ("tool" in chat)
    assert "<tool_response>\n{\"temperature\": 14}\n</tool_response>" in ours or "tool" not in chat


def test_qwen25_tool_call_without_content_renders_as_transformers(qwen_folder_with_template):
    """OpenAI clients send an assistant turn that only calls tools with content null: Qwen2.5's
    template takes it (Qwen3's reads the content as a string and fails in transformers too)."""
    folder = qwen_folder_with_template(QWEN25)
    messages = [dict(m, content=None) if m.get("tool_calls") else m for m in TOOL_TURNS]
    ours, theirs = _both(folder, messages, tools=TOOLS)
    assert ours == theirs


@pytest.mark.parametrize("enable_thinking", [None, True, False])
def test_qwen3_template_renders_reasoning_as_transformers(enable_thinking, qwen_folder_with_template):
    folder = qwen_folder_with_template(QWEN3)
    kw = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    for messages in (THINKING_TURNS, THINKING_TURNS[:3]):
        ours, theirs = _both(folder, messages, **kw)
        assert ours == theirs
    assert "<think>\nTwo and two make four.\n</think>" not in theirs  # before the last query: dropped
    assert theirs.endswith("<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if enable_thinking is False else ""))


def test_qwen_model_renders_its_own_template_with_its_special_tokens(qwen_folder_with_template):
    folder = qwen_folder_with_template(QWEN25)
    llm = pyllm.load(folder, threads=1)
    _, theirs = _both(folder, TURNS)
    assert llm.render_chat(TURNS) == theirs
    assert theirs.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")
    ids = llm.tokenize(theirs, add_special=False)
    assert ids[0] == llm.tokenizer.hf.token_to_id("<|im_start|>") == 151644


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("chat", ["one-turn", "system+multi-turn"])
def test_phi35_template_renders_as_transformers(chat, add_generation_prompt, build, tmp_path):
    """Phi-3.5-mini-instruct's template with the tiny Phi-3 tokenizer (<|endoftext|> its eos)."""
    folder = str(tmp_path)
    src = build("phi3_gqa_untied").folder
    for name in os.listdir(src):
        if not name.endswith(".gguf"):
            shutil.copy(os.path.join(src, name), folder)
    with open(os.path.join(folder, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(_template(PHI35))
    ours, theirs = _both(folder, CHATS[chat], add_generation_prompt)
    assert ours == theirs
    assert theirs.endswith("<|assistant|>\n" if add_generation_prompt else "<|end|>\n<|endoftext|>")
    assert pyllm.load(folder, threads=1).render_chat(CHATS[chat]) == _both(folder, CHATS[chat])[1]
