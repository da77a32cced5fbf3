"""Architectures: a registry from a checkpoint's declared architecture to its family module.

A family module (one per file here) gives ARCHITECTURES / GGUF_ARCHITECTURES (the names it answers
to), spec_from_config(config) and spec_from_gguf(meta, tensors, arch) -> ModelSpec, and
hf_tensors / gguf_tensors(spec, tensors, source) -> engine slot -> tensor; binding.py does the rest.
Its quirks outside the network are data here too, where it has them: GGUF_VOCABULARY (how its GGUF
vocabulary is built, read by tokenizer_gguf.py), HF_NORMS (its norms' names in transformers, read by
the oracle) and ALIASES (short names pyllm.load takes, fetched by hub.py).
"""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from ..errors import UnsupportedModelError
from ..packages import ModelPackage
from .common import HF_NORMS, LLAMA_VOCABULARY, SentencePieceRules
from .spec import ModelSpec

_NOT_FAMILIES = {"common", "spec"}


def _families() -> list[ModuleType]:
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in _NOT_FAMILIES)
    return [importlib.import_module(f"{__name__}.{name}") for name in names]


FAMILIES: dict[str, ModuleType] = {}
GGUF_FAMILIES: dict[str, ModuleType] = {}
ALIASES: dict[str, ModelPackage] = {}  # pyllm.load's short names for model files in PyPI wheels
for _module in _families():
    FAMILIES.update({name: _module for name in _module.ARCHITECTURES})
    GGUF_FAMILIES.update({name: _module for name in _module.GGUF_ARCHITECTURES})
    ALIASES.update(getattr(_module, "ALIASES", {}))


# transformers' causal-LM class of each model_type pyllm runs: what it loads when a config names no
# architectures (AutoModelForCausalLM)
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
               "gemma3": "Gemma3ForConditionalGeneration", "gemma3_text": "Gemma3ForCausalLM",
               "phi3": "Phi3ForCausalLM", "gpt2": "GPT2LMHeadModel"}


def family_for(config: dict) -> ModuleType:
    """The family module of a config.json, by its `architectures`, else by its `model_type`;
    ValueError if `architectures` is malformed."""
    declared = config.get("architectures") or []
    if not declared and isinstance(config.get("model_type"), str) and config["model_type"] in MODEL_TYPES:
        declared = [MODEL_TYPES[config["model_type"]]]
    if not isinstance(declared, list) or not all(isinstance(n, str) for n in declared):
        raise ValueError(f"architectures must be a list of names, got {declared!r}")
    for name in declared:
        if name in FAMILIES:
            return FAMILIES[name]
    raise UnsupportedModelError(
        f"architecture {declared or config.get('model_type')!r} is not supported; "
        f"pyllm runs {', '.join(sorted(FAMILIES))}"
    )


def family_for_gguf(metadata: dict) -> ModuleType:
    """The family module of a GGUF file; ValueError if general.architecture is malformed."""
    name = metadata.get("general.architecture")
    if not isinstance(name, str):
        raise ValueError(f"general.architecture must be a string, got {name!r}")
    if name in GGUF_FAMILIES:
        return GGUF_FAMILIES[name]
    raise UnsupportedModelError(
        f"GGUF architecture {name!r} is not supported; pyllm runs {', '.join(sorted(GGUF_FAMILIES))}"
    )


def hf_norm_layouts() -> list[dict[str, str]]:
    """Every family's names of a transformers decoder layer's norms (its HF_NORMS), the layouts with
    the most norms first: a layer is read by the first layout whose every name it has."""
    layouts = {tuple(sorted(getattr(m, "HF_NORMS", HF_NORMS).items())) for m in FAMILIES.values()}
    return [dict(names) for names in sorted(layouts, key=lambda names: (-len(names), names))]


def gguf_vocabulary(architecture: str) -> SentencePieceRules:
    """How a GGUF file of this general.architecture builds its SentencePiece vocabulary (Llama's way
    for a family that says nothing, or an architecture pyllm does not run)."""
    family = GGUF_FAMILIES.get(architecture)
    return getattr(family, "GGUF_VOCABULARY", LLAMA_VOCABULARY)


__all__ = ["ALIASES", "FAMILIES", "GGUF_FAMILIES", "ModelSpec", "family_for", "family_for_gguf", "gguf_vocabulary", "hf_norm_layouts"]
