"""The Llama family: LlamaForCausalLM and MistralForCausalLM (SmolLM2, TinyLlama, Llama 3.x, Mistral).

RMSNorm, SwiGLU, rotate-half RoPE (with llama3/linear scaling), grouped-query attention, an optional
sliding window (Mistral), tied or untied head. Everything else is the shared forward.
"""
from __future__ import annotations

import math

import numpy as np

from .. import rope
from ..errors import UnsupportedModelError
from .spec import MAX_LAYERS, MAX_VOCAB, ModelSpec, as_float, as_int

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
GGUF_ARCHITECTURES = ("llama",)


def _eos_ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value])]


def spec_from_config(config: dict) -> ModelSpec:
    """Reads the hyper-parameters from a transformers config.json dict."""
    dim = as_int(config.get("hidden_size"), "hidden_size")
    n_heads = as_int(config.get("num_attention_heads"), "num_attention_heads")
    head_dim = as_int(config.get("head_dim") or dim // n_heads, "head_dim")
    n_layers = as_int(config.get("num_hidden_layers"), "num_hidden_layers", high=MAX_LAYERS)
    window = as_int(config.get("sliding_window") or 0, "sliding_window", low=0, high=1 << 31)
    if config.get("use_sliding_window") is False:
        window = 0
    params = rope.rope_parameters(config)
    spec = ModelSpec(
        family="llama",
        n_layers=n_layers,
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=as_int(config.get("num_key_value_heads") or n_heads, "num_key_value_heads"),
        head_dim=head_dim,
        ffn_dim=as_int(config.get("intermediate_size"), "intermediate_size"),
        vocab_size=as_int(config.get("vocab_size"), "vocab_size", high=MAX_VOCAB),
        max_seq_len=as_int(config.get("max_position_embeddings", 2048), "max_position_embeddings", high=1 << 40),
        norm_eps=as_float(config.get("rms_norm_eps", 1e-6), "rms_norm_eps"),
        rope_inv_freq=rope.inv_freq(head_dim, params),
        rope_interleaved=False,
        attn_scale=1.0 / math.sqrt(head_dim),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        sliding_windows=[window] * n_layers,
        qkv_bias=bool(config.get("attention_bias", False)),
        eos_token_ids=_eos_ids(config.get("eos_token_id")),
        bos_token_id=config.get("bos_token_id"),
    )
    if config.get("hidden_act", "silu") not in ("silu", "swish"):
        raise UnsupportedModelError(f"activation {config['hidden_act']!r} is not supported for Llama")
    spec.validate()
    return spec


# Engine slot -> checkpoint tensor name, for the whole model and for layer i.
GLOBAL_NAMES = {
    "tok_embd": "model.embed_tokens.weight",
    "out_norm": "model.norm.weight",
    "lm_head": "lm_head.weight",
}
LAYER_NAMES = {
    "attn_norm": "model.layers.{i}.input_layernorm.weight",
    "wq": "model.layers.{i}.self_attn.q_proj.weight",
    "wk": "model.layers.{i}.self_attn.k_proj.weight",
    "wv": "model.layers.{i}.self_attn.v_proj.weight",
    "bq": "model.layers.{i}.self_attn.q_proj.bias",
    "bk": "model.layers.{i}.self_attn.k_proj.bias",
    "bv": "model.layers.{i}.self_attn.v_proj.bias",
    "wo": "model.layers.{i}.self_attn.o_proj.weight",
    "ffn_norm": "model.layers.{i}.post_attention_layernorm.weight",
    "w_gate": "model.layers.{i}.mlp.gate_proj.weight",
    "w_up": "model.layers.{i}.mlp.up_proj.weight",
    "w_down": "model.layers.{i}.mlp.down_proj.weight",
}


def spec_from_gguf(meta: dict, tensor_shapes: dict[str, tuple[int, ...]], arch: str = "llama") -> ModelSpec:
    """Reads the hyper-parameters from GGUF metadata (the `llama.*` keys llama.cpp writes).

    llama.cpp's converter permutes the q/k rows of llama models so that rotating adjacent pairs
    gives what transformers' rotate-half gives on the original rows: hence rope_interleaved.
    """
    def key(name, default=None):
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise KeyError(f"{arch}.{name}")
        return value

    dim = as_int(key("embedding_length"), f"{arch}.embedding_length")
    n_heads = as_int(key("attention.head_count"), f"{arch}.attention.head_count")
    n_kv = as_int(key("attention.head_count_kv", n_heads), f"{arch}.attention.head_count_kv")
    head_dim = as_int(key("attention.key_length", dim // n_heads), f"{arch}.attention.key_length")
    n_layers = as_int(key("block_count"), f"{arch}.block_count", high=MAX_LAYERS)
    if key("rope.dimension_count", head_dim) != head_dim:
        raise UnsupportedModelError("partial rotary embeddings are not supported")
    scaling = meta.get(f"{arch}.rope.scaling.type") or "none"
    params = {"rope_type": "default", "rope_theta": key("rope.freq_base", 10000.0)}
    if scaling == "linear":
        params.update(rope_type="linear", factor=key("rope.scaling.factor"))
    elif scaling != "none":
        raise UnsupportedModelError(f"rope scaling {scaling!r} is not supported")
    inv_freq = rope.inv_freq(head_dim, params)
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = as_int(meta.get(f"{arch}.vocab_size") or (len(tokens) if tokens is not None else 0)
                   or tensor_shapes["token_embd.weight"][0], f"{arch}.vocab_size", high=MAX_VOCAB)
    ffn = as_int(key("feed_forward_length"), f"{arch}.feed_forward_length")
    window = as_int(meta.get(f"{arch}.attention.sliding_window") or 0, f"{arch}.attention.sliding_window",
                    low=0, high=1 << 31)
    spec = ModelSpec(
        family="llama",
        n_layers=n_layers,
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        ffn_dim=ffn,
        vocab_size=vocab,
        max_seq_len=as_int(key("context_length", 2048), f"{arch}.context_length", high=1 << 40),
        norm_eps=as_float(key("attention.layer_norm_rms_epsilon", 1e-5), f"{arch}.attention.layer_norm_rms_epsilon"),
        rope_inv_freq=inv_freq,
        rope_interleaved=True,
        attn_scale=1.0 / math.sqrt(head_dim),
        tied_embeddings="output.weight" not in tensor_shapes,
        sliding_windows=[window] * n_layers,
        qkv_bias="blk.0.attn_q.bias" in tensor_shapes,
    )
    spec.validate()
    return spec


def apply_rope_freq_factors(spec: ModelSpec, factors: np.ndarray) -> None:
    """Llama 3.1 GGUF files carry the llama3 scaling as per-frequency divisors (rope_freqs)."""
    if factors.shape != spec.rope_inv_freq.shape:
        raise UnsupportedModelError(f"rope_freqs has {factors.shape[0]} factors, expected {spec.rope_inv_freq.shape[0]}")
    spec.rope_inv_freq = (spec.rope_inv_freq / factors.astype(np.float32)).astype(np.float32)


GGUF_GLOBAL_NAMES = {
    "tok_embd": "token_embd.weight",
    "out_norm": "output_norm.weight",
    "lm_head": "output.weight",
}
GGUF_LAYER_NAMES = {
    "attn_norm": "blk.{i}.attn_norm.weight",
    "wq": "blk.{i}.attn_q.weight",
    "wk": "blk.{i}.attn_k.weight",
    "wv": "blk.{i}.attn_v.weight",
    "bq": "blk.{i}.attn_q.bias",
    "bk": "blk.{i}.attn_k.bias",
    "bv": "blk.{i}.attn_v.bias",
    "wo": "blk.{i}.attn_output.weight",
    "ffn_norm": "blk.{i}.ffn_norm.weight",
    "w_gate": "blk.{i}.ffn_gate.weight",
    "w_up": "blk.{i}.ffn_up.weight",
    "w_down": "blk.{i}.ffn_down.weight",
}
