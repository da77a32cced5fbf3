"""ModelSpec: an architecture as data — hyper-parameters and the flags the C forward reads."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


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
