"""Gemma (1): GemmaForCausalLM, and what Gemma 2 and 3 share with it.

Llama's block with Gemma's differences: embeddings multiplied by sqrt(hidden_size) in the activation
dtype (float32 here, as transformers rounds it: float32(hidden_size ** 0.5)); RMSNorm that multiplies
by (1 + w), folded into w at load for Hugging Face checkpoints (llama.cpp's converter already stores
1 + w in GGUF files); a GeGLU MLP with the tanh GELU; an explicit head_dim; a tied head.

A config gets transformers' class defaults for the keys it leaves out, as transformers reads it
(Gemma configs on the Hub lean on them: a missing tie_word_embeddings means tied).
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import UnsupportedModelError
from . import common, llama
from .spec import ModelSpec

ARCHITECTURES = ("GemmaForCausalLM",)
GGUF_ARCHITECTURES = ("gemma",)

# GemmaTokenizer, as transformers builds it from a GGUF file's vocabulary (Gemma 2 and 3 share it)
GGUF_VOCABULARY = common.SentencePieceRules(spaces_as_pieces=True, merges_by_id=True, unk_token="<unk>",
                                            extra_special=("<mask>",))

# GemmaConfig's defaults (transformers 5.23) for the keys pyllm reads.
DEFAULTS = dict(vocab_size=256000, hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,
                num_attention_heads=16, num_key_value_heads=16, head_dim=256, hidden_act="gelu_pytorch_tanh",
                max_position_embeddings=8192, rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False,
                bos_token_id=2, eos_token_id=1)

# Every GELU spelling a Gemma config uses means the tanh approximation: Gemma 1's official configs say
# "gelu" and transformers reads it as "gelu_pytorch_tanh"; gelu_new is the same function.
GELU_TANH = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}


def with_defaults(config: dict, defaults: dict) -> dict:
    """The config as transformers sees it: its class defaults under the keys the file gives."""
    return {**defaults, **config}


def refuse_bidirectional(config: dict) -> None:
    if config.get("use_bidirectional_attention"):
        raise UnsupportedModelError("use_bidirectional_attention is not supported: pyllm runs causal attention")


def embed_scale(dim: int) -> float:
    """sqrt(hidden_size) as transformers computes it (a Python float) and applies it (in float32)."""
    return float(np.float32(dim ** 0.5))


def spec_from_config(config: dict) -> ModelSpec:
    config = with_defaults(config, DEFAULTS)
    refuse_bidirectional(config)
    act = common.activation(config, {**GELU_TANH, "gelu": "gelu_tanh"}, key="hidden_act")
    bias = bool(config.get("attention_bias"))
    spec = common.hf_spec(config, "gemma", activation=act, qkv_bias=bias, o_bias=bias)
    # GemmaModel builds a plain causal mask: a sliding_window key in the config is ignored
    spec.sliding_windows = [0] * spec.n_layers
    spec.embed_scale = embed_scale(spec.dim)
    return spec


def gguf_attention_scale(spec: ModelSpec) -> float:
    """llama.cpp's Gemma 2/3 query scale: head_dim^-1/2, but (hidden / heads)^-1/2 for the 27B models
    (told apart by their layer counts, 46 and 62), whose query_pre_attn_scalar is that."""
    if (spec.family, spec.n_layers) in (("gemma2", 46), ("gemma3", 62)):
        return 1.0 / math.sqrt(spec.dim // spec.n_heads)
    return 1.0 / math.sqrt(spec.head_dim)


def spec_from_gguf(meta: dict, tensors: dict, arch: str) -> ModelSpec:
    spec = common.gguf_spec(meta, tensors, arch, "gemma", activation="gelu_tanh",
                            qkv_bias="blk.0.attn_q.bias" in tensors, o_bias="blk.0.attn_output.bias" in tensors)
    spec.sliding_windows = [0] * spec.n_layers  # llama.cpp's gemma has no window
    spec.embed_scale = embed_scale(spec.dim)
    return spec


# ---------------------------------------------------------------- names

# Gemma's tensors are named as Llama's.
HF_MODEL, HF_LAYER, HF_BIAS, HF_O_BIAS = llama.HF_MODEL, llama.HF_LAYER, llama.HF_QKV_BIAS, llama.HF_O_BIAS
GGUF_MODEL, GGUF_LAYER = llama.GGUF_MODEL, llama.GGUF_LAYER
GGUF_BIAS, GGUF_O_BIAS = llama.GGUF_QKV_BIAS, llama.GGUF_O_BIAS

NORM_SLOTS = ("attn_norm", "q_norm", "k_norm", "post_attn_norm", "ffn_norm", "post_ffn_norm")


def bind(spec: ModelSpec, tensors: dict, source: str, model: dict, layer: dict, bias: dict, o_bias: dict,
         plus_one: bool) -> dict:
    """Slot -> tensor for a Gemma-shaped checkpoint: the head only when untied, biases only when the
    spec has them, and every norm (out_norm included) as 1 + w where the file stores w."""
    model = {k: v for k, v in model.items() if k != "lm_head" or not spec.tied_embeddings}
    layer = {**layer, **(bias if spec.qkv_bias else {}), **(o_bias if spec.o_bias else {})}
    bound = common.bind(tensors, source, spec.n_layers, model, layer)
    if plus_one:
        for key, t in bound.items():
            if key == "out_norm" or key.rsplit(".", 1)[-1] in NORM_SLOTS:
                bound[key] = common.plus_one(t)
    return bound


def hf_tensors(spec: ModelSpec, tensors: dict, source: str) -> dict:
    return bind(spec, tensors, source, HF_MODEL, HF_LAYER, HF_BIAS, HF_O_BIAS, plus_one=True)


def gguf_tensors(spec: ModelSpec, tensors: dict, source: str) -> dict:
    return bind(spec, tensors, source, GGUF_MODEL, GGUF_LAYER, GGUF_BIAS, GGUF_O_BIAS, plus_one=False)
