"""ModelSpec: an architecture as data — hyper-parameters and the flags the C forward reads."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

# Far above any real model, low enough that nothing sized from these values can exhaust memory
# before the tensor shapes (which a file must really hold) are checked against them.
MAX_SIZE = 1 << 20
MAX_LAYERS = 4096
MAX_VOCAB = 1 << 24


def as_int(value, name: str, low: int = 1, high: int = MAX_SIZE) -> int:
    """A hyper-parameter that must be a whole number in [low, high] (JSON may spell it 64.0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if not math.isfinite(value) or value != int(value) or not low <= int(value) <= high:
        raise ValueError(f"{name} must be a whole number in [{low}, {high}], got {value!r}")
    return int(value)


def as_float(value, name: str, positive: bool = True) -> float:
    """A real hyper-parameter: finite, and > 0 unless positive=False."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or (positive and value <= 0):
        raise ValueError(f"{name} must be a finite{' positive' if positive else ''} number, got {value!r}")
    return float(value)


@dataclass
class ModelSpec:
    family: str                 # "llama", ...
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    max_seq_len: int
    norm_eps: float
    rope_inv_freq: np.ndarray   # (head_dim / 2,) float32, any scaling applied
    rope_interleaved: bool      # rotate adjacent pairs (GGUF llama) instead of halves (HF)
    attn_scale: float
    tied_embeddings: bool
    sliding_windows: list[int]  # per layer; 0 = full attention
    activation: str = "silu"    # "silu" | "gelu_tanh"
    embed_scale: float = 1.0
    qkv_bias: bool = False
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None

    def validate(self) -> None:
        for name in ("n_layers", "dim", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even")
        if len(self.sliding_windows) != self.n_layers:
            raise ValueError("one sliding window per layer")
