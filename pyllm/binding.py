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
from .blas import openblas_thread_controls
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


# dtype= names for quantize-on-load, and what a k-quant falls back to for rows that are not whole
# 256-element super-blocks (as llama.cpp's quantizer does).
LOAD_DTYPES = {
    "f32": WeightType.F32, "f16": WeightType.F16, "bf16": WeightType.BF16,
    "q8_0": WeightType.Q8_0, "q4_0": WeightType.Q4_0, "q4_1": WeightType.Q4_1,
    "q5_0": WeightType.Q5_0, "q5_1": WeightType.Q5_1,
    "q4_k": WeightType.Q4_K, "q5_k": WeightType.Q5_K, "q6_k": WeightType.Q6_K,
}
K_QUANT_FALLBACK = {WeightType.Q4_K: WeightType.Q5_0, WeightType.Q5_K: WeightType.Q5_1,
                    WeightType.Q6_K: WeightType.Q8_0}
# The output head decides every token: 4- and 5-bit mixes keep it at 6 or 8 bits (llama.cpp does too).
LOW_BIT = {WeightType.Q4_0, WeightType.Q4_1, WeightType.Q5_0, WeightType.Q5_1, WeightType.Q4_K,
           WeightType.Q5_K}


def parse_dtype(dtype: str | None) -> WeightType | None:
    if dtype is None:
        return None
    key = str(dtype).lower()
    if key not in LOAD_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(LOAD_DTYPES)} or None, got {dtype!r}")
    return LOAD_DTYPES[key]


class _Binder:
    def __init__(self, spec: ModelSpec, tensors: Mapping[str, TensorInfo], source: str,
                 dtype: WeightType | None, threads: int):
        self.spec = spec
        self.tensors = tensors
        self.source = source
        self.dtype = dtype
        self.threads = threads
        self.owned: dict[tuple[str, int], np.ndarray] = {}  # converted matrices

    def find(self, name: str) -> TensorInfo:
        info = self.tensors.get(name)
        if info is None:
            raise FormatError(self.source, f"tensor {name!r} is missing")
        return info

    def matrix(self, name: str, rows: int, cols: int, head: bool = False) -> tuple[int, int, int, int]:
        info = self.find(name)
        if tuple(info.shape) != (rows, cols):
            raise FormatError(self.source, f"tensor {name!r} has shape {info.shape}, expected {(rows, cols)}")
        if not _core.supports(int(info.wtype)):
            raise UnsupportedModelError(f"{self.source}: tensor {name!r} has type {info.wtype.name}, which pyllm cannot multiply yet")
        target = self.dtype
        if head and target in LOW_BIT:
            target = WeightType.Q6_K
        if target in K_QUANT_FALLBACK and cols % 256:
            target = K_QUANT_FALLBACK[target]
        if target is None or target == info.wtype:
            return (int(info.wtype), rows, cols, info.address)
        key = (name, int(target))  # a tied head converted like the embeddings shares their bytes
        if key not in self.owned:
            self.owned[key] = _core.convert_tensor(int(info.wtype), info.bytes(), rows, cols,
                                                   int(target), self.threads)
        return (int(target), rows, cols, int(self.owned[key].ctypes.data))

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
    dtype: WeightType | None = None,
) -> _core.CoreModel:
    """The C model for spec over tensors named by names (global map, per-layer map); keep owns
    the memory the tensors lie in."""
    b = _Binder(spec, tensors, source, dtype, threads)
    g, names = names
    qd, kvd = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
    head = g["tok_embd"] if spec.tied_embeddings else g["lm_head"]
    mats = {"lm_head": b.matrix(head, spec.vocab_size, spec.dim, head=True)}
    mats["tok_embd"] = (mats["lm_head"] if spec.tied_embeddings
                        else b.matrix(g["tok_embd"], spec.vocab_size, spec.dim))
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
    hparams = {
        "n_layers": spec.n_layers, "dim": spec.dim, "n_heads": spec.n_heads,
        "n_kv_heads": spec.n_kv_heads, "head_dim": spec.head_dim, "ffn_dim": spec.ffn_dim,
        "vocab_size": spec.vocab_size, "norm_eps": spec.norm_eps, "attn_scale": spec.attn_scale,
        "embed_scale": spec.embed_scale, "activation": {"silu": 0, "gelu_tanh": 1}[spec.activation],
        "rope_interleaved": int(spec.rope_interleaved),
    }
    # Once every matrix has been re-encoded the file's mapping is not needed: dropping it lets
    # quantize-on-load end with the quantized bytes resident, not the file's as well.
    owned = {int(a.ctypes.data) for a in b.owned.values()}
    mapped = [m for m in mats.values() if m[3] not in owned]
    return _core.CoreModel(hparams, mats, vecs, list(spec.sliding_windows),
                           (keep if mapped else None, b.owned), threads, use_blas,
                           openblas_thread_controls())
