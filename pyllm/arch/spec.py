"""ModelSpec: an architecture as data — hyper-parameters and the flags the C forward reads."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .._core import ACTIVATIONS, NORM_KINDS

MAX_LAYERS = 4096
MAX_VOCAB = 1 << 24


@dataclass
class Rope:
    """One rotary table: frequencies for n_rot / 2 pairs after any scaling, and the factor that
    multiplies cos and sin (longrope's attention factor; 1 otherwise)."""
    inv_freq: np.ndarray  # (n_rot / 2,) float32
    scale: float = 1.0


def _describe_rope(r: Rope, n_rot: int) -> str:
    """The base when the frequencies are base^(-2i / n_rot) / factor; otherwise (llama3, longrope
    scale each frequency differently) the range of wavelengths they span."""
    f = r.inv_freq.astype(np.float64)
    ratios = f[1:] / f[:-1]
    if len(f) > 1 and np.allclose(ratios, ratios[0], rtol=1e-4):
        text = f"base {ratios[0] ** (-n_rot / 2):.5g}"
        if abs(f[0] - 1) > 1e-6:
            text += f" ÷{1 / f[0]:.4g}"
    else:
        wavelengths = 2 * np.pi / f
        text = f"scaled, wavelengths {wavelengths.min():.4g}–{wavelengths.max():.4g}"
    return text + (f" ×{r.scale:.4g}" if r.scale != 1 else "")


@dataclass
class ModelSpec:
    """An architecture as data: the sizes and the block recipe the C forward obeys (csrc/pyllm.h).
    Which optional steps a layer has (biases, q/k norms, sandwich norms, a gate) is decided by which
    tensors the family binds; the rest is here."""
    family: str                 # "llama", "gemma3", ...
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    max_seq_len: int
    norm_eps: float
    ropes: list[Rope]           # rotary tables; empty without rope (GPT-2)
    rope_interleaved: bool      # rotate adjacent pairs (GGUF llama) instead of halves (HF)
    attn_scale: float
    tied_embeddings: bool
    sliding_windows: list[int]  # per layer; 0 = full attention
    layer_ropes: list[int] = field(default_factory=list)  # per layer, an index into ropes
    n_rot: int | None = None    # leading dims of a head that rotate; None = head_dim, 0 = no rope
    norm_kind: str = "rms"      # "rms" | "layer" (the block norms; q/k norms are always RMS)
    activation: str = "silu"    # "silu" | "gelu_tanh"
    attn_softcap: float = 0.0   # 0 = none
    logit_softcap: float = 0.0
    embed_scale: float = 1.0
    n_positions: int = 0        # rows of learned position embeddings (GPT-2); 0 = none
    max_ctx: int = 0            # the longest context the rope tables are right for (LongRoPE's short
                                # factors hold up to the original context); 0 = no such limit
    qkv_bias: bool = False      # q/k/v projections carry a bias (Qwen2, Llama attention_bias)
    o_bias: bool = False        # the output projection does too (Llama attention_bias)
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    # what the source calls a field, for validate's messages ({"n_heads": "qwen2.attention.head_count"});
    # a field not named here goes by its transformers config key
    source_keys: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if self.n_rot is None:
            self.n_rot = self.head_dim if self.ropes else 0
        if not self.layer_ropes:
            self.layer_ropes = [0] * self.n_layers

    def describe(self, slots: frozenset[str] = frozenset()) -> list[str]:
        """The recipe in words, one line per part (pyllm info); slots are the optional tensors the
        model has (q_norm, bq, post_attn_norm, w_gate, ...)."""
        norms = {"rms": "RMSNorm", "layer": "LayerNorm"}[self.norm_kind]
        if {"post_attn_norm", "post_ffn_norm"} & slots:
            norms += ", before and after attention and MLP"
        if "q_norm" in slots:
            norms += ", per-head q/k norms"
        mlp = ("gated " if "w_gate" in slots else "plain ") + {"silu": "SiLU", "gelu_tanh": "GELU (tanh)"}[self.activation]
        biases = [name for name, slot in (("q/k/v", "bq"), ("output", "bo"), ("MLP", "b_down")) if slot in slots]
        if self.n_rot:
            layout = "adjacent pairs" if self.rope_interleaved else "halves"
            bases = ", ".join(_describe_rope(r, self.n_rot) for r in self.ropes)
            position = f"rope on {self.n_rot}/{self.head_dim} dims, rotating {layout}; {bases}"
            if len(self.ropes) > 1:
                position += "; per layer " + "".join(str(r) for r in self.layer_ropes)
        elif self.n_positions:
            position = f"learned positions ({self.n_positions})"
        else:
            position = "none"
        windows = sorted(set(self.sliding_windows))
        attention = f"scale {self.attn_scale:.4g}"
        if any(self.sliding_windows):
            pattern = "".join("S" if w else "F" for w in self.sliding_windows)
            attention += f", sliding window {max(windows)} ({pattern})"
        if self.attn_softcap:
            attention += f", soft-cap {self.attn_softcap:g}"
        lines = [f"norms:           {norms} (eps {self.norm_eps:g})",
                 f"MLP:             {mlp}",
                 f"positions:       {position}",
                 f"attention:       {attention}",
                 f"biases:          {', '.join(biases) or 'none'}"]
        extras = []
        if self.embed_scale != 1:
            extras.append(f"embeddings ×{self.embed_scale:.6g}")
        if self.logit_softcap:
            extras.append(f"logit soft-cap {self.logit_softcap:g}")
        extras.append("tied head" if self.tied_embeddings else "separate head")
        lines.append(f"other:           {', '.join(extras)}")
        return lines

    def validate(self) -> None:
        """Raises ValueError naming the setting when the recipe contradicts itself."""
        for name in ("n_layers", "dim", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:  # the only check: the core's own guards only its buffers
            heads = self.source_keys.get("n_heads", "num_attention_heads")
            kv_heads = self.source_keys.get("n_kv_heads", "num_key_value_heads")
            raise ValueError(f"{heads} {self.n_heads} is not a multiple of {kv_heads} {self.n_kv_heads}")
        if not 0 <= self.n_rot <= self.head_dim or self.n_rot % 2:
            raise ValueError(f"the rotary dims {self.n_rot} must be even and at most head_dim {self.head_dim}")
        if self.n_rot and not self.ropes:
            raise ValueError("rotary dims without a rotary table")
        for rope in self.ropes:
            if rope.inv_freq.shape != (self.n_rot // 2,):
                raise ValueError(f"a rotary table has {rope.inv_freq.shape[0]} frequencies, expected "
                                 f"{self.n_rot // 2}")
            if not np.all(np.isfinite(rope.inv_freq)) or not math.isfinite(rope.scale) or rope.scale <= 0:
                raise ValueError("a rotary table holds a non-finite or non-positive value")
        if len(self.ropes) > 4:
            raise ValueError("at most 4 rotary tables")
        if len(self.sliding_windows) != self.n_layers or len(self.layer_ropes) != self.n_layers:
            raise ValueError("one sliding window and one rotary table per layer")
        if self.ropes and any(not 0 <= r < len(self.ropes) for r in self.layer_ropes):
            raise ValueError("a layer names a rotary table that does not exist")
        if self.max_ctx < 0:
            raise ValueError(f"max_ctx must be >= 0, got {self.max_ctx}")
        if any(w < 0 for w in self.sliding_windows):
            raise ValueError("sliding_window must be >= 0")
        for name in ("attn_softcap", "logit_softcap"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number > 0 (or absent), got {value}")
        if not math.isfinite(self.attn_scale) or self.attn_scale <= 0:
            raise ValueError(f"the attention scale must be finite and positive, got {self.attn_scale}")
        if self.norm_kind not in NORM_KINDS:
            raise ValueError(f"unknown norm kind {self.norm_kind!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.activation!r}")
