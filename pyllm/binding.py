"""Binds a checkpoint's tensors to the engine's slots and builds the C model over them.

Every tensor is checked here — present, the shape the spec implies, a type the core can multiply —
before its address reaches C. Matrices stay where they lie in the mmap; only the small vectors
(norms, biases) are widened to float32 copies.
"""
from __future__ import annotations

from collections.abc import Mapping
import numpy as np

from . import _core
from .arch.spec import ModelSpec
from .dtypes import WeightType
from .errors import FormatError, UnsupportedModelError
from .formats.mapped import TensorInfo


def to_float32(info: TensorInfo) -> np.ndarray:
    """A float32 copy of a tensor of any stored type (used for norms and biases)."""
    raw = info.bytes()
    count = int(np.prod(info.shape, dtype=np.int64)) if info.shape else 1
    if info.wtype == WeightType.F32:
        return raw.view(np.float32).copy()
    if info.wtype == WeightType.F16:
        return raw.view(np.float16).astype(np.float32)
    if info.wtype == WeightType.BF16:
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return _core.to_f32(int(info.wtype), np.ascontiguousarray(raw), count)


class _Binder:
    def __init__(self, spec: ModelSpec, tensors: Mapping[str, TensorInfo], source: str):
        self.spec = spec
        self.tensors = tensors
        self.source = source

    def find(self, name: str) -> TensorInfo:
        info = self.tensors.get(name)
        if info is None:
            raise FormatError(self.source, f"tensor {name!r} is missing")
        return info

    def matrix(self, name: str, rows: int, cols: int) -> tuple[int, int, int, int]:
        info = self.find(name)
        if tuple(info.shape) != (rows, cols):
            raise FormatError(self.source, f"tensor {name!r} has shape {info.shape}, expected {(rows, cols)}")
        if not _core.supports(int(info.wtype)):
            raise UnsupportedModelError(f"{self.source}: tensor {name!r} has type {info.wtype.name}, which pyllm cannot multiply yet")
        return (int(info.wtype), rows, cols, info.address)

    def vector(self, name: str, n: int, optional: bool = False) -> np.ndarray | None:
        if optional and name not in self.tensors:
            return None
        info = self.find(name)
        if tuple(info.shape) != (n,):
            raise FormatError(self.source, f"tensor {name!r} has shape {info.shape}, expected {(n,)}")
        return np.ascontiguousarray(to_float32(info), dtype=np.float32)


def build_core(
    spec: ModelSpec,
    names: tuple[dict[str, str], dict[str, str]],
    tensors: Mapping[str, TensorInfo],
    source: str,
    keep: object,
    threads: int,
    use_blas: bool = True,
    norm_offset: float = 0.0,
) -> _core.CoreModel:
    """The C model for spec over tensors named by names (global map, per-layer map); keep owns
    the memory the tensors lie in."""
    b = _Binder(spec, tensors, source)
    g, names = names
    qd, kvd = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
    mats = {"tok_embd": b.matrix(g["tok_embd"], spec.vocab_size, spec.dim)}
    head = g["tok_embd"] if spec.tied_embeddings else g["lm_head"]
    mats["lm_head"] = b.matrix(head, spec.vocab_size, spec.dim)
    vecs: dict[str, np.ndarray | None] = {
        "rope_inv_freq": np.ascontiguousarray(spec.rope_inv_freq, dtype=np.float32),
        "out_norm": b.vector(g["out_norm"], spec.dim),
    }
    shapes = {
        "wq": (qd, spec.dim), "wk": (kvd, spec.dim), "wv": (kvd, spec.dim), "wo": (spec.dim, qd),
        "w_gate": (spec.ffn_dim, spec.dim), "w_up": (spec.ffn_dim, spec.dim),
        "w_down": (spec.dim, spec.ffn_dim),
    }
    for i in range(spec.n_layers):
        p = f"layers.{i}."
        for slot, (rows, cols) in shapes.items():
            mats[p + slot] = b.matrix(names[slot].format(i=i), rows, cols)
        for slot in ("attn_norm", "ffn_norm"):
            vecs[p + slot] = b.vector(names[slot].format(i=i), spec.dim)
        for slot, n in (("bq", qd), ("bk", kvd), ("bv", kvd)):
            if slot in names:
                vecs[p + slot] = b.vector(names[slot].format(i=i), n, optional=not spec.qkv_bias)
    if norm_offset:
        for key, arr in vecs.items():
            if key.endswith("norm") and arr is not None:
                arr += np.float32(norm_offset)
    hparams = {
        "n_layers": spec.n_layers, "dim": spec.dim, "n_heads": spec.n_heads,
        "n_kv_heads": spec.n_kv_heads, "head_dim": spec.head_dim, "ffn_dim": spec.ffn_dim,
        "vocab_size": spec.vocab_size, "norm_eps": spec.norm_eps, "attn_scale": spec.attn_scale,
        "embed_scale": spec.embed_scale, "activation": {"silu": 0, "gelu_tanh": 1}[spec.activation],
        "rope_interleaved": int(spec.rope_interleaved),
    }
    return _core.CoreModel(hparams, mats, vecs, list(spec.sliding_windows), keep, threads, use_blas)
