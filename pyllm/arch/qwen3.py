"""The Qwen3 family: Qwen3ForCausalLM and GGUF `qwen3`.

Qwen2's block with a per-head RMSNorm on q and k before RoPE, an explicit head_dim (128 when the
config leaves it out, as transformers' Qwen3Config does) that need not be hidden_size / heads, and
biases on q, k, v and o only when attention_bias is set. Rotate-half RoPE in both formats; sliding
windows as in Qwen2 (use_sliding_window, layer_types / max_window_layers).
"""
from __future__ import annotations

from ..checks import as_int
from . import common
from .llama import GGUF_LAYER, GGUF_MODEL, GGUF_O_BIAS, GGUF_QKV_BIAS, HF_LAYER, HF_MODEL, HF_O_BIAS, HF_QKV_BIAS, names
from .qwen2 import context_length, layer_windows
from .spec import MAX_LAYERS, ModelSpec

ARCHITECTURES = ("Qwen3ForCausalLM",)
GGUF_ARCHITECTURES = ("qwen3",)

DEFAULT_HEAD_DIM = 128  # Qwen3Config's

HF_QK_NORM = {"q_norm": "model.layers.{i}.self_attn.q_norm.weight",
              "k_norm": "model.layers.{i}.self_attn.k_norm.weight"}
GGUF_QK_NORM = {"q_norm": "blk.{i}.attn_q_norm.weight", "k_norm": "blk.{i}.attn_k_norm.weight"}


def spec_from_config(config: dict) -> ModelSpec:
    common.activation({"hidden_act": config.get("hidden_act", "silu")}, {"silu": "silu", "swish": "silu"})
    n_layers = as_int(config.get("num_hidden_layers"), "num_hidden_layers", high=MAX_LAYERS)
    head_dim = as_int(config.get("head_dim", DEFAULT_HEAD_DIM), "head_dim")
    bias = bool(config.get("attention_bias", False))
    return common.hf_spec(config, "qwen3", head_dim=head_dim, qkv_bias=bias, o_bias=bias,
                          max_seq_len=context_length(config), sliding_windows=layer_windows(config, n_layers))


def spec_from_gguf(meta: dict, tensors: dict, arch: str) -> ModelSpec:
    return common.gguf_spec(meta, tensors, arch, "qwen3", qkv_bias="blk.0.attn_q.bias" in tensors,
                            o_bias="blk.0.attn_output.bias" in tensors, source_keys=common.gguf_head_keys(arch))


def hf_tensors(spec: ModelSpec, tensors: dict, source: str) -> dict:
    model, layer = names(spec, HF_MODEL, HF_LAYER, HF_QKV_BIAS, HF_O_BIAS)
    return common.bind(tensors, source, spec.n_layers, model, {**layer, **HF_QK_NORM})


def gguf_tensors(spec: ModelSpec, tensors: dict, source: str) -> dict:
    model, layer = names(spec, GGUF_MODEL, GGUF_LAYER, GGUF_QKV_BIAS, GGUF_O_BIAS)
    return common.bind(tensors, source, spec.n_layers, model, {**layer, **GGUF_QK_NORM})
