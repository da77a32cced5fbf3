"""Gemma 2: Gemma2ForCausalLM.

Gemma's block (gemma.py) with four norms per layer — input_layernorm before attention,
post_attention_layernorm on its output, pre_feedforward_layernorm before the MLP,
post_feedforward_layernorm on its output — query_pre_attn_scalar^-1/2 as the attention scale, the
soft-cap cap·tanh(s / cap) on attention scores (before the mask) and on the final logits, and layers
that alternate sliding and full attention (layer_types; a query at q sees keys in (q − W, q]).

GGUF files from llama.cpp's converter carry the window and both soft-caps but neither
query_pre_attn_scalar nor the layer pattern: llama.cpp (and so pyllm) scales by head_dim^-1/2 and makes
every second layer full, unless the file says otherwise (attention.sliding_window_pattern).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .. import rope
from ..checks import as_float, as_int
from . import common, gemma
from .spec import MAX_LAYERS, ModelSpec, Rope

ARCHITECTURES = ("Gemma2ForCausalLM",)
GGUF_ARCHITECTURES = ("gemma2",)
GGUF_VOCABULARY = gemma.GGUF_VOCABULARY
# norms around both blocks
HF_NORMS = {"attn_norm": "input_layernorm", "ffn_norm": "pre_feedforward_layernorm",
            "attn_post": "post_attention_layernorm", "mlp_post": "post_feedforward_layernorm"}

# Gemma2Config's defaults (transformers 5.23) for the keys pyllm reads.
DEFAULTS = dict(gemma.DEFAULTS, vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                num_attention_heads=8, num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh",
                max_position_embeddings=8192, query_pre_attn_scalar=256, sliding_window=4096,
                final_logit_softcapping=30.0, attn_logit_softcapping=50.0)

FULL, SLIDING = "full_attention", "sliding_attention"


def layer_types(config: dict, n_layers: int, default: list[str]) -> list[str]:
    """config["layer_types"], or default where the config has none, checked."""
    types = config.get("layer_types")
    if types is None:
        return default
    if not isinstance(types, list) or len(types) != n_layers:
        shown = f"{len(types)} entries" if isinstance(types, list) else repr(types)[:80]
        raise ValueError(f"layer_types must give one type per layer ({n_layers}), got {shown}")
    for t in types:
        if t not in (FULL, SLIDING):
            raise ValueError(f"layer_types holds {str(t)[:80]!r}; Gemma layers are {FULL} or {SLIDING}")
    return types


def sliding_windows(config: dict, types: list[str]) -> list[int]:
    """The window of each layer: sliding_window on sliding layers, 0 (the whole past) on full ones."""
    if SLIDING not in types:
        return [0] * len(types)
    if config.get("sliding_window") is None:
        raise ValueError("sliding_window is not set, but layer_types has sliding_attention layers")
    w = as_int(config["sliding_window"], "sliding_window", low=1, high=common.MAX_WINDOW)
    return [w if t == SLIDING else 0 for t in types]


def softcap(config: dict, key: str) -> float:
    """A soft-cap from the config: None (or null) is none, anything else must be > 0."""
    value = config.get(key)
    return 0.0 if value is None else as_float(value, key)


def attention_scale(config: dict) -> float:
    """query_pre_attn_scalar ** -0.5, as transformers computes it (a Python float)."""
    return as_float(config.get("query_pre_attn_scalar"), "query_pre_attn_scalar") ** -0.5


def spec_from_config(config: dict) -> ModelSpec:
    config = gemma.with_defaults(config, DEFAULTS)
    gemma.refuse_bidirectional(config)
    act = common.activation(config, gemma.GELU_TANH, key="hidden_activation")
    n_layers = as_int(config.get("num_hidden_layers"), "num_hidden_layers", high=MAX_LAYERS)
    types = layer_types(config, n_layers, [SLIDING if (i + 1) % 2 else FULL for i in range(n_layers)])
    bias = bool(config.get("attention_bias"))
    spec = common.hf_spec(config, "gemma2", activation=act, qkv_bias=bias, o_bias=bias,
                          sliding_windows=sliding_windows(config, types), attn_scale=attention_scale(config),
                          attn_softcap=softcap(config, "attn_logit_softcapping"),
                          logit_softcap=softcap(config, "final_logit_softcapping"),
                          embed_scale=gemma.embed_scale(as_int(config.get("hidden_size"), "hidden_size")))
    common.check_window(spec, "sliding_window")
    return spec


# ---------------------------------------------------------------- GGUF


def gguf_swa_layers(k: common.GGUFKeys, n_layers: int, default: int) -> list[bool]:
    """Which layers slide, as llama.cpp reads attention.sliding_window_pattern: a list of flags, one per
    layer, or a period n (every n-th layer full; 0: every layer slides), default when absent."""
    key = k.name("attention.sliding_window_pattern")
    value = k.meta.get(key, default)
    if isinstance(value, (list, tuple, np.ndarray)):
        if len(value) != n_layers or not all(isinstance(v, (bool, int, np.integer)) and v in (0, 1) for v in value):
            raise ValueError(f"{key} must hold one flag per layer ({n_layers})")
        return [bool(v) for v in value]
    n = as_int(value, key, low=0, high=MAX_LAYERS)
    return [n == 0 or i % n < n - 1 for i in range(n_layers)]


def gguf_local_rope(spec: ModelSpec, base: float, params: Mapping) -> Rope:
    """The sliding layers' table: the global one's scaling with another base."""
    return Rope(rope.inv_freq(spec.n_rot, {**params, "rope_theta": base}))


def spec_from_gguf(meta: dict, tensors: dict, arch: str) -> ModelSpec:
    k = common.GGUFKeys(meta, arch)
    spec = common.gguf_spec(meta, tensors, arch, "gemma2", activation="gelu_tanh",
                            qkv_bias="blk.0.attn_q.bias" in tensors, o_bias="blk.0.attn_output.bias" in tensors)
    # llama.cpp's defaults for what the file leaves out: a 4096 window on every second layer, soft-caps 50 and 30
    window = k.int("attention.sliding_window", 4096, low=0, high=common.MAX_WINDOW)
    swa = gguf_swa_layers(k, spec.n_layers, 2)
    spec.sliding_windows = [window if s else 0 for s in swa]
    if k.name("attention.sliding_window") in meta:
        common.check_window(spec, k.name("attention.sliding_window"))
    if k.name("rope.freq_base_swa") in meta:
        params = common.gguf_rope_parameters(k)
        spec.ropes.append(gguf_local_rope(spec, k.float("rope.freq_base_swa"), params))
        spec.layer_ropes = [1 if s else 0 for s in swa]
    spec.attn_softcap = k.float("attn_logit_softcapping", 50.0)
    spec.logit_softcap = k.float("final_logit_softcapping", 30.0)
    spec.attn_scale = gemma.gguf_attention_scale(spec)
    spec.embed_scale = gemma.embed_scale(spec.dim)
    spec.validate()
    return spec


# ---------------------------------------------------------------- names

HF_LAYER = {**gemma.HF_LAYER,
            "post_attn_norm": "model.layers.{i}.post_attention_layernorm.weight",
            "ffn_norm": "model.layers.{i}.pre_feedforward_layernorm.weight",
            "post_ffn_norm": "model.layers.{i}.post_feedforward_layernorm.weight"}
GGUF_LAYER = {**gemma.GGUF_LAYER,
              "post_attn_norm": "blk.{i}.post_attention_norm.weight",
              "post_ffn_norm": "blk.{i}.post_ffw_norm.weight"}


def hf_tensors(spec: ModelSpec, tensors: dict, source: str) -> dict:
    return gemma.bind(spec, tensors, source, gemma.HF_MODEL, HF_LAYER, gemma.HF_BIAS, gemma.HF_O_BIAS,
                      plus_one=True)


def gguf_tensors(spec: ModelSpec, tensors: dict, source: str) -> dict:
    return gemma.bind(spec, tensors, source, gemma.GGUF_MODEL, GGUF_LAYER, gemma.GGUF_BIAS, gemma.GGUF_O_BIAS,
                      plus_one=False)
