"""The Qwen2 family: Qwen2ForCausalLM (Qwen2, Qwen2.5, QwQ) and GGUF `qwen2`.

Llama's block with a bias on the q, k and v projections (none on o), rotate-half RoPE in HF folders
and in llama.cpp's GGUF files alike (its converter permutes no rows for Qwen), tied or untied head.
A sliding window applies only when use_sliding_window is true, and then only on the layers that
layer_types marks "sliding_attention" — by default those at index >= max_window_layers, as
transformers' Qwen2Config computes them. llama.cpp's converter writes no window for qwen2.
"""
from __future__ import annotations

from ..checks import as_int
from . import common
from .llama import GGUF_LAYER, GGUF_MODEL, GGUF_O_BIAS, GGUF_QKV_BIAS, HF_LAYER, HF_MODEL, HF_O_BIAS, HF_QKV_BIAS, names
from .spec import MAX_LAYERS, ModelSpec

ARCHITECTURES = ("Qwen2ForCausalLM",)
GGUF_ARCHITECTURES = ("qwen2",)

# Qwen2Config's (and Qwen3Config's) defaults for keys a config.json may leave out.
DEFAULT_SLIDING_WINDOW = 4096
DEFAULT_MAX_WINDOW_LAYERS = 28
DEFAULT_CONTEXT = 32768  # max_position_embeddings
LAYER_TYPES = ("full_attention", "sliding_attention")


def context_length(config: dict) -> int:
    return as_int(config.get("max_position_embeddings", DEFAULT_CONTEXT), "max_position_embeddings", high=1 << 40)


def layer_windows(config: dict, n_layers: int) -> list[int]:
    """The window of each layer (0 = full attention) as transformers' Qwen2/Qwen3 attention sees it:
    config.sliding_window on the "sliding_attention" layers when use_sliding_window is true."""
    max_window_layers = as_int(config.get("max_window_layers", DEFAULT_MAX_WINDOW_LAYERS), "max_window_layers",
                               low=0, high=MAX_LAYERS)
    layer_types = config.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != n_layers:
            raise ValueError(f"layer_types must list {n_layers} layers, got {layer_types!r}")
        bad = [t for t in layer_types if t not in LAYER_TYPES]
        if bad:
            raise ValueError(f"layer_types holds {bad[0]!r}; expected one of {LAYER_TYPES}")
    if not config.get("use_sliding_window", False):
        return [0] * n_layers
    window = config.get("sliding_window", DEFAULT_SLIDING_WINDOW)
    if window is None:  # transformers keeps every layer full without a window to slide
        return [0] * n_layers
    window = as_int(window, "sliding_window", high=common.MAX_WINDOW)
    context = context_length(config)
    if window > context:  # a contradiction even where layer_types puts it on no layer
        raise ValueError(f"sliding_window {window} is larger than the context {context}")
    if layer_types is None:
        layer_types = ["sliding_attention" if i >= max_window_layers else "full_attention" for i in range(n_layers)]
    return [window if t == "sliding_attention" else 0 for t in layer_types]


def spec_from_config(config: dict) -> ModelSpec:
    common.activation({"hidden_act": config.get("hidden_act", "silu")}, {"silu": "silu", "swish": "silu"})
    n_layers = as_int(config.get("num_hidden_layers"), "num_hidden_layers", high=MAX_LAYERS)
    return common.hf_spec(config, "qwen2", qkv_bias=True, max_seq_len=context_length(config),
                          sliding_windows=layer_windows(config, n_layers))


def spec_from_gguf(meta: dict, tensors: dict, arch: str) -> ModelSpec:
    return common.gguf_spec(meta, tensors, arch, "qwen2", qkv_bias=True, source_keys=common.gguf_head_keys(arch))


def hf_tensors(spec: ModelSpec, tensors: dict, source: str) -> dict:
    return common.bind(tensors, source, spec.n_layers, *names(spec, HF_MODEL, HF_LAYER, HF_QKV_BIAS, HF_O_BIAS))


def gguf_tensors(spec: ModelSpec, tensors: dict, source: str) -> dict:
    return common.bind(tensors, source, spec.n_layers,
                       *names(spec, GGUF_MODEL, GGUF_LAYER, GGUF_QKV_BIAS, GGUF_O_BIAS))
