"""The GPT-2 family: GPT2LMHeadModel (GPT-2, DistilGPT2 and their fine-tunes) and GGUF `gpt2`.

LayerNorm with a bias before attention, before the MLP and at the end; learned position embeddings
and no rope; one fused `c_attn` projection with rows [q; k; v] and biases everywhere; a plain MLP with
tanh GELU; the head tied to the embeddings. transformers' Conv1D stores its weights (in, out): the HF
side binds transposed copies. llama.cpp's converter transposes them itself, so a GGUF's `attn_qkv`
(3·dim, dim) is cut into q, k and v rows as it lies.
"""
from __future__ import annotations

import math

from ..checks import as_float, as_int
from ..errors import UnsupportedModelError
from . import common
from .spec import MAX_LAYERS, MAX_VOCAB, ModelSpec

ARCHITECTURES = ("GPT2LMHeadModel",)
GGUF_ARCHITECTURES = ("gpt2",)
HF_NORMS = {"attn_norm": "ln_1", "ffn_norm": "ln_2"}

# gelu_new and gelu_pytorch_tanh are the same tanh approximation; the exact erf "gelu" is not.
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


def _setting(config: dict, key: str, alias: str):
    """A GPT-2 key, or the generic name transformers' GPT2Config also maps onto it."""
    return config.get(key) if config.get(key) is not None else config.get(alias)


def spec_from_config(config: dict) -> ModelSpec:
    activation = common.activation(config, ACTIVATIONS, key="activation_function")
    if config.get("scale_attn_by_inverse_layer_idx"):
        # scores × 1/(layer + 1) on top of the head scale: one scale per layer, which pyllm does not hold
        raise UnsupportedModelError("scale_attn_by_inverse_layer_idx is not supported")
    # reorder_and_upcast_attn only moves where the scale is applied and computes scores in float32
    # under mixed precision: pyllm's float32 attention is that already, so it is accepted as it is.
    dim = as_int(_setting(config, "n_embd", "hidden_size"), "n_embd")
    n_heads = as_int(_setting(config, "n_head", "num_attention_heads"), "n_head")
    if dim % n_heads:
        raise ValueError(f"n_head {n_heads} does not divide n_embd {dim}")
    head_dim = dim // n_heads
    n_layers = as_int(_setting(config, "n_layer", "num_hidden_layers"), "n_layer", high=MAX_LAYERS)
    n_positions = as_int(_setting(config, "n_positions", "max_position_embeddings"), "n_positions")
    ffn_dim = 4 * dim if config.get("n_inner") is None else as_int(config["n_inner"], "n_inner")
    spec = ModelSpec(
        family="gpt2",
        n_layers=n_layers,
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=n_heads,
        head_dim=head_dim,
        ffn_dim=ffn_dim,
        vocab_size=as_int(config.get("vocab_size"), "vocab_size", high=MAX_VOCAB),
        max_seq_len=n_positions,
        norm_eps=as_float(config.get("layer_norm_epsilon", 1e-5), "layer_norm_epsilon"),
        ropes=[],
        n_rot=0,
        rope_interleaved=False,
        attn_scale=1.0 / math.sqrt(head_dim) if config.get("scale_attn_weights", True) else 1.0,
        tied_embeddings=bool(config.get("tie_word_embeddings", True)),
        sliding_windows=[0] * n_layers,
        norm_kind="layer",
        activation=activation,
        n_positions=n_positions,
        qkv_bias=True,
        o_bias=True,
        eos_token_ids=common.eos_ids(config.get("eos_token_id")),
        bos_token_id=common.token_id(config.get("bos_token_id"), "bos_token_id"),
    )
    spec.validate()
    return spec


def spec_from_gguf(meta: dict, tensors: dict, arch: str) -> ModelSpec:
    k = common.GGUFKeys(meta, arch)
    dim, n_heads = k.int("embedding_length"), k.int("attention.head_count")
    if dim % n_heads:
        raise ValueError(f"{k.name('attention.head_count')} {n_heads} does not divide "
                         f"{k.name('embedding_length')} {dim}")
    if k.int("attention.head_count_kv", n_heads) != n_heads:
        raise UnsupportedModelError(f"{k.name('attention.head_count_kv')} differs from the head count")
    # llama.cpp sizes the position table by the context length: the binder checks the tensor agrees
    n_positions = k.int("context_length")
    return common.gguf_spec(meta, tensors, arch, "gpt2", ropes=[], n_rot=0, norm_kind="layer",
                            activation="gelu_tanh", n_positions=n_positions, max_seq_len=n_positions,
                            norm_eps=k.float("attention.layer_norm_epsilon"), qkv_bias=True, o_bias=True)


HF_MODEL = {"tok_embd": "wte.weight", "pos_embd": "wpe.weight", "out_norm": "ln_f.weight",
            "out_norm.bias": "ln_f.bias"}
HF_LAYER = {
    "attn_norm": "h.{i}.ln_1.weight", "attn_norm.bias": "h.{i}.ln_1.bias",
    "bo": "h.{i}.attn.c_proj.bias",
    "ffn_norm": "h.{i}.ln_2.weight", "ffn_norm.bias": "h.{i}.ln_2.bias",
    "b_up": "h.{i}.mlp.c_fc.bias",
    "b_down": "h.{i}.mlp.c_proj.bias",
}
# Conv1D weights, stored (in, out)
HF_CONV1D = {"wo": "h.{i}.attn.c_proj.weight", "w_up": "h.{i}.mlp.c_fc.weight",
             "w_down": "h.{i}.mlp.c_proj.weight"}
HF_QKV = ("h.{i}.attn.c_attn.weight", "h.{i}.attn.c_attn.bias")


def hf_tensors(spec: ModelSpec, tensors: dict, source: str) -> dict:
    # GPT2LMHeadModel saves its body under "transformer."; OpenAI's original files have no prefix
    prefix = "transformer." if "transformer.wte.weight" in tensors else ""
    model = {slot: prefix + name for slot, name in HF_MODEL.items()}
    if not spec.tied_embeddings:
        model["lm_head"] = "lm_head.weight"
    layer = {slot: prefix + name for slot, name in {**HF_LAYER, **HF_CONV1D}.items()}
    weight, bias = (prefix + name for name in HF_QKV)
    bound = common.bind(tensors, source, spec.n_layers, model, {**layer, "qkv": weight, "qkv.bias": bias})
    for i in range(spec.n_layers):
        for slot in HF_CONV1D:
            bound[f"layers.{i}.{slot}"] = common.transposed(bound[f"layers.{i}.{slot}"], source)
        qkv = common.transposed(bound.pop(f"layers.{i}.qkv"), source)
        _split_qkv(spec, bound, i, qkv, bound.pop(f"layers.{i}.qkv.bias"), source)
    return bound


GGUF_MODEL = {"tok_embd": "token_embd.weight", "pos_embd": "position_embd.weight",
              "out_norm": "output_norm.weight", "out_norm.bias": "output_norm.bias"}
GGUF_LAYER = {
    "attn_norm": "blk.{i}.attn_norm.weight", "attn_norm.bias": "blk.{i}.attn_norm.bias",
    "qkv": "blk.{i}.attn_qkv.weight", "qkv.bias": "blk.{i}.attn_qkv.bias",
    "wo": "blk.{i}.attn_output.weight", "bo": "blk.{i}.attn_output.bias",
    "ffn_norm": "blk.{i}.ffn_norm.weight", "ffn_norm.bias": "blk.{i}.ffn_norm.bias",
    "w_up": "blk.{i}.ffn_up.weight", "b_up": "blk.{i}.ffn_up.bias",
    "w_down": "blk.{i}.ffn_down.weight", "b_down": "blk.{i}.ffn_down.bias",
}


def gguf_tensors(spec: ModelSpec, tensors: dict, source: str) -> dict:
    model = dict(GGUF_MODEL)
    if not spec.tied_embeddings:
        model["lm_head"] = "output.weight"
    bound = common.bind(tensors, source, spec.n_layers, model, GGUF_LAYER)
    for i in range(spec.n_layers):
        _split_qkv(spec, bound, i, bound.pop(f"layers.{i}.qkv"), bound.pop(f"layers.{i}.qkv.bias"), source)
    return bound


def _split_qkv(spec: ModelSpec, bound: dict, i: int, weight, bias, source: str) -> None:
    """Binds the rows [q; k; v] of a fused (3·dim, dim) projection and its bias as six slots."""
    sizes = [spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim]
    for slot, part in zip(("wq", "wk", "wv"), common.split_rows(weight, sizes, source)):
        bound[f"layers.{i}.{slot}"] = part
    for slot, part in zip(("bq", "bk", "bv"), common.split_rows(bias, sizes, source)):
        bound[f"layers.{i}.{slot}"] = part
