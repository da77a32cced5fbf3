"""Architectures: a registry from a checkpoint's declared architecture to its family module.

A family module gives `spec_from_config(config) -> ModelSpec` and the tensor-name maps
GLOBAL_NAMES / LAYER_NAMES (engine slot -> checkpoint name); binding.py does the rest.
"""
from __future__ import annotations

from types import ModuleType

from ..errors import UnsupportedModelError
from . import llama
from .spec import ModelSpec

FAMILIES: dict[str, ModuleType] = {name: llama for name in llama.ARCHITECTURES}
GGUF_FAMILIES: dict[str, ModuleType] = {name: llama for name in llama.GGUF_ARCHITECTURES}


def family_for(config: dict) -> ModuleType:
    declared = config.get("architectures") or []
    for name in declared:
        if name in FAMILIES:
            return FAMILIES[name]
    raise UnsupportedModelError(
        f"architecture {declared or config.get('model_type')!r} is not supported; "
        f"pyllm runs {sorted(FAMILIES)}"
    )


def family_for_gguf(metadata: dict) -> ModuleType:
    name = metadata.get("general.architecture")
    if name in GGUF_FAMILIES:
        return GGUF_FAMILIES[name]
    raise UnsupportedModelError(
        f"GGUF architecture {name!r} is not supported; pyllm runs {sorted(GGUF_FAMILIES)}"
    )


__all__ = ["FAMILIES", "GGUF_FAMILIES", "ModelSpec", "family_for", "family_for_gguf"]
