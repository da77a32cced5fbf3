"""The Llama family: LlamaForCausalLM and MistralForCausalLM (SmolLM2, TinyLlama, Llama 3.x, Mistral).

RMSNorm, SwiGLU, rotate-half RoPE (with llama3/linear scaling), grouped-query attention, an optional
sliding window (Mistral), tied or untied head. Everything else is the shared forward.
"""
from __future__ import annotations

import math

from .. import rope
from .spec import ModelSpec

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")


def _eos_ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value])]


def spec_from_config(config: dict) -> ModelSpec:
    """Reads the hyper-parameters from a transformers config.json dict."""
    dim = int(config["hidden_size"])
    n_heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or dim // n_heads)
    n_layers = int(config["num_hidden_layers"])
    window = config.get("sliding_window") or 0
    if config.get("use_sliding_window") is False:
        window = 0
    params = rope.rope_parameters(config)
    spec = ModelSpec(
        family="llama",
        n_layers=n_layers,
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=int(config.get("num_key_value_heads") or n_heads),
        head_dim=head_dim,
        ffn_dim=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        max_seq_len=int(config.get("max_position_embeddings", 2048)),
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_inv_freq=rope.inv_freq(head_dim, params),
        rope_interleaved=False,
        attn_scale=1.0 / math.sqrt(head_dim),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        sliding_windows=[int(window)] * n_layers,
        qkv_bias=bool(config.get("attention_bias", False)),
        eos_token_ids=_eos_ids(config.get("eos_token_id")),
        bos_token_id=config.get("bos_token_id"),
    )
    if config.get("hidden_act", "silu") not in ("silu", "swish"):
        from ..errors import UnsupportedModelError

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
