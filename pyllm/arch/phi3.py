"""The Phi-3 family: Phi3ForCausalLM (Phi-3, Phi-3.5 and Phi-4-mini text models) and GGUF `phi3`.

Llama's block with two fused projections, bound as row views of the one tensor (no copy):
`qkv_proj` rows [q; k; v] and `gate_up_proj` rows [gate; up]; llama.cpp's converter keeps both
fused (`attn_qkv`, and `ffn_up` holding [gate; up]) and permutes nothing: rotate-half RoPE in both
formats. partial_rotary_factor rotates only the leading dims of each head. One sliding window (the
config's) on every layer when set.

LongRoPE ("longrope", formerly "su"): frequencies divided per pair by short_factor for contexts up
to original_max_position_embeddings and by long_factor beyond, cos and sin multiplied by an
attention factor in both cases. transformers switches to the long factors once a sequence grows past
the original length; llama.cpp picks them for the whole run when the context it is given is longer.
pyllm builds the short-factor table and refuses a context longer than the original one (spec.max_ctx),
the one range where all three agree.
"""
from __future__ import annotations

import math

import numpy as np

from .. import rope
from ..checks import as_float, as_int
from ..errors import UnsupportedModelError
from ..tensors import to_float32
from . import common
from .spec import MAX_LAYERS, ModelSpec, Rope

ARCHITECTURES = ("Phi3ForCausalLM",)
GGUF_ARCHITECTURES = ("phi3",)

# Phi3Config's defaults for max_position_embeddings and original_max_position_embeddings
DEFAULT_CONTEXT = 4096
DEFAULT_ORIGINAL_CONTEXT = 4096


def longrope_inv_freq(n_rot: int, theta: float, factors: np.ndarray) -> np.ndarray:
    """1 / (factor_i · theta^(2i / n_rot)) in float32, in transformers' order of operations."""
    return (np.float32(1.0) / (factors.astype(np.float32) * rope.float32_powers(theta, n_rot))).astype(np.float32)


def _factors(value, n: int, key: str) -> np.ndarray:
    """A list of n finite positive rope factors, or ValueError naming key."""
    if not isinstance(value, (list, tuple, np.ndarray)) or len(value) != n:
        got = len(value) if isinstance(value, (list, tuple, np.ndarray)) else repr(value)
        raise ValueError(f"{key} must list {n} factors (one per rotary pair), got {got}")
    out = np.array([as_float(v, key) for v in value], dtype=np.float64)
    return out.astype(np.float32)


def _factor_tensor(t, n: int) -> np.ndarray:
    """A GGUF rope_factors_* tensor: a vector of n finite positive factors, or ValueError naming it."""
    if len(t.shape) != 1:
        raise ValueError(f"{t.name} must list {n} factors (one per rotary pair), got shape {tuple(t.shape)}")
    return _factors(list(to_float32(t)), n, t.name)


def _rope_settings(config: dict) -> tuple[dict, str]:
    """Phi3Config's reading of the rope keys: rope_scaling (older files) before rope_parameters,
    rope_theta and partial_rotary_factor from the top level when the dict lacks them, su/yarn read as
    longrope. Returns the settings and the key they came from (for errors)."""
    key = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
    params = config.get(key) or {}
    if not isinstance(params, dict):
        raise ValueError(f"{key} must be an object, got {params!r}")
    params = dict(params)
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    params.setdefault("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    kind = params.get("rope_type", params.get("type", "default"))
    params["rope_type"] = "longrope" if kind in ("su", "yarn") else kind
    return params, key


def spec_from_config(config: dict) -> ModelSpec:
    common.activation({"hidden_act": config.get("hidden_act", "silu")}, {"silu": "silu", "swish": "silu"})
    dim = as_int(config.get("hidden_size"), "hidden_size")
    n_heads = as_int(config.get("num_attention_heads"), "num_attention_heads")
    if config.get("head_dim") is None and dim % n_heads:
        raise ValueError(f"hidden_size {dim} is not a multiple of num_attention_heads {n_heads}")
    head_dim = as_int(dim // n_heads if config.get("head_dim") is None else config["head_dim"], "head_dim")
    params, key = _rope_settings(config)
    partial = as_float(params["partial_rotary_factor"], f"{key}.partial_rotary_factor")
    n_rot = int(head_dim * partial)
    if partial > 1 or n_rot < 2 or n_rot % 2:
        raise ValueError(f"{key}.partial_rotary_factor {partial} gives {n_rot} rotary dims of a {head_dim}-dim "
                         f"head; they must be even, at least 2 and at most the head")
    theta = as_float(params["rope_theta"], f"{key}.rope_theta")
    n_layers = as_int(config.get("num_hidden_layers"), "num_hidden_layers", high=MAX_LAYERS)
    context = as_int(config.get("max_position_embeddings", DEFAULT_CONTEXT), "max_position_embeddings", high=1 << 40)
    recipe: dict = dict(head_dim=head_dim, n_rot=n_rot, max_seq_len=context,
                        sliding_windows=[common.window(config)] * n_layers)
    kind = params["rope_type"]
    if kind == "default":
        recipe["ropes"] = [Rope(rope.default_inv_freq(n_rot, theta))]
    elif kind == "longrope":
        original = as_int(config.get("original_max_position_embeddings", DEFAULT_ORIGINAL_CONTEXT),
                          "original_max_position_embeddings", low=2, high=1 << 40)
        short = _factors(params.get("short_factor"), n_rot // 2, f"{key}.short_factor")
        _factors(params.get("long_factor"), n_rot // 2, f"{key}.long_factor")
        factor = params.get("factor")
        factor = context / original if factor is None else as_float(factor, f"{key}.factor")
        scale = params.get("attention_factor")
        if scale is None:
            scale = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        scale = as_float(scale, f"{key}.attention_factor")
        recipe["ropes"] = [Rope(longrope_inv_freq(n_rot, theta, short), scale)]
        recipe["max_ctx"] = original
    else:
        raise ValueError(f"{key}.rope_type {kind!r} is not one Phi-3 has (default, longrope)")
    return common.hf_spec(config, "phi3", **recipe)


def spec_from_gguf(meta: dict, tensors: dict, arch: str) -> ModelSpec:
    k = common.GGUFKeys(meta, arch)
    dim, n_heads = k.int("embedding_length"), k.int("attention.head_count")
    if k.name("attention.key_length") not in meta and dim % n_heads:
        raise ValueError(f"{k.name('embedding_length')} {dim} is not a multiple of "
                         f"{k.name('attention.head_count')} {n_heads}")
    head_dim = k.int("attention.key_length", dim // n_heads)
    n_rot = k.int("rope.dimension_count", head_dim)
    if n_rot > head_dim or n_rot % 2:
        raise ValueError(f"{k.name('rope.dimension_count')} {n_rot} must be even and at most {head_dim}")
    scaling = meta.get(k.name("rope.scaling.type")) or "none"
    if scaling not in ("none", "longrope"):
        raise UnsupportedModelError(f"{k.name('rope.scaling.type')} {scaling!r} is not supported for phi3")
    theta = k.float("rope.freq_base", 10000.0)
    scale = k.float("rope.scaling.attn_factor", 1.0)
    recipe: dict = dict(head_dim=head_dim, n_rot=n_rot, source_keys=common.gguf_head_keys(arch))
    short = tensors.get("rope_factors_short.weight")
    if short is not None:
        factors = _factor_tensor(short, n_rot // 2)
        recipe["ropes"] = [Rope(longrope_inv_freq(n_rot, theta, factors), scale)]
    else:
        recipe["ropes"] = [Rope(rope.default_inv_freq(n_rot, theta), scale)]
    long = tensors.get("rope_factors_long.weight")
    if long is not None:
        _factor_tensor(long, n_rot // 2)
        context = k.int("context_length", 2048, high=1 << 40)
        recipe["max_ctx"] = k.int("rope.scaling.original_context_length", context, high=1 << 40)
    return common.gguf_spec(meta, tensors, arch, "phi3", **recipe)


HF_MODEL = {"tok_embd": "model.embed_tokens.weight", "out_norm": "model.norm.weight",
            "lm_head": "lm_head.weight"}
HF_LAYER = {
    "attn_norm": "model.layers.{i}.input_layernorm.weight",
    "qkv": "model.layers.{i}.self_attn.qkv_proj.weight",
    "wo": "model.layers.{i}.self_attn.o_proj.weight",
    "ffn_norm": "model.layers.{i}.post_attention_layernorm.weight",
    "gate_up": "model.layers.{i}.mlp.gate_up_proj.weight",
    "w_down": "model.layers.{i}.mlp.down_proj.weight",
}
GGUF_MODEL = {"tok_embd": "token_embd.weight", "out_norm": "output_norm.weight", "lm_head": "output.weight"}
GGUF_LAYER = {
    "attn_norm": "blk.{i}.attn_norm.weight",
    "qkv": "blk.{i}.attn_qkv.weight",
    "wo": "blk.{i}.attn_output.weight",
    "ffn_norm": "blk.{i}.ffn_norm.weight",
    "gate_up": "blk.{i}.ffn_up.weight",  # [gate; up], 2·ffn rows
    "w_down": "blk.{i}.ffn_down.weight",
}
# llama.cpp also reads phi3 files whose attention projections are stored apart
GGUF_SEPARATE_QKV = {"wq": "blk.{i}.attn_q.weight", "wk": "blk.{i}.attn_k.weight", "wv": "blk.{i}.attn_v.weight"}


def _bind(spec: ModelSpec, tensors: dict, source: str, model: dict, layer: dict) -> dict:
    """Binds the names, then cuts each layer's fused tensors into the slots' row views."""
    model = {k: v for k, v in model.items() if k != "lm_head" or not spec.tied_embeddings}
    out = common.bind(tensors, source, spec.n_layers, model, layer)
    q, kv = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
    for i in range(spec.n_layers):
        fused = out.pop(f"layers.{i}.qkv", None)
        if fused is not None:
            for slot, view in zip(("wq", "wk", "wv"), common.split_rows(fused, [q, kv, kv], source)):
                out[f"layers.{i}.{slot}"] = view
        gate, up = common.split_rows(out.pop(f"layers.{i}.gate_up"), [spec.ffn_dim, spec.ffn_dim], source)
        out[f"layers.{i}.w_gate"], out[f"layers.{i}.w_up"] = gate, up
    return out


def hf_tensors(spec: ModelSpec, tensors: dict, source: str) -> dict:
    return _bind(spec, tensors, source, HF_MODEL, HF_LAYER)


def gguf_tensors(spec: ModelSpec, tensors: dict, source: str) -> dict:
    layer = dict(GGUF_LAYER)
    if "blk.0.attn_qkv.weight" not in tensors:
        del layer["qkv"]
        layer.update(GGUF_SEPARATE_QKV)
    return _bind(spec, tensors, source, GGUF_MODEL, layer)
