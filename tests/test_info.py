"""`pyllm info` describes the recipe it read for every family: norms, MLP, positions, attention,
biases — what makes one family differ from another."""
from __future__ import annotations

import subprocess
import sys

import pytest


EXPECTED = {
    "llama": ["RMSNorm", "gated SiLU", "rotating halves", "biases:          none", "separate head"],
    "mistral": ["sliding window 8 (SSS)"],
    "qwen2": ["biases:          q/k/v", "rotating halves"],
    "qwen3": ["per-head q/k norms"],
    "gemma": ["gated GELU (tanh)", "embeddings ×"],
    "gemma2": ["before and after attention and MLP", "soft-cap", "logit soft-cap"],
    "gemma3": ["per-head q/k norms", "per layer", "base 10000", "sliding window 8 (SSF)"],
    "phi3": ["gated SiLU", "rope on"],
    "gpt2": ["LayerNorm", "plain GELU (tanh)", "learned positions (128)", "q/k/v, output, MLP", "tied head"],
}


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_info_describes_each_family_recipe(family, family_checkpoint):
    folder = family_checkpoint(family)
    out = subprocess.run([sys.executable, "-m", "pyllm", "info", folder], capture_output=True, text=True,
                         check=True).stdout
    assert "architecture:" in out
    for piece in EXPECTED[family]:
        assert piece in out, (piece, out)
