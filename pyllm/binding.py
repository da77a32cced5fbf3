"""Binds a checkpoint's tensors to the engine's slots and builds the C model over them.

Every tensor is checked here — present, the shape the spec implies, a type the core can multiply —
before its address reaches C. Matrices stay where they lie in the mmap; only the small vectors
(norms, biases) are widened to float32 copies.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np

from . import _core
from .arch.spec import ModelSpec
from .blas import openblas_thread_controls
from .dtypes import WeightType
from .errors import FormatError, UnsupportedModelError
from .formats.mapped import TensorInfo
from .tensors import to_float32


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


def int8_activations(core: _core.CoreModel) -> bool:
    """Whether the core's matmuls multiply 8-bit activations: with any quantized matrix they do, at
    every prompt length (so that prefill computes what decode does); with only float ones (f32, f16,
    bf16) activations stay float32."""
    return _int8_activations(core.weight_types)


def _int8_activations(weight_types) -> bool:
    return any(_core.vec_dot_type(int(t)) != int(WeightType.F32) for t in weight_types)


def default_kv_dtype(weight_types) -> str:
    """The KV cache type of pyllm.load(kv_dtype=None) for matrices of weight_types: f16 for quantized
    weights, as llama.cpp's default cache (half the cache's memory and reads; the logits move no more
    than another ISA's kernels move them through the 8-bit activations: tests/test_kv_cache.py), f32
    for float weights, whose logits are proven against transformers'."""
    return "f16" if _int8_activations(weight_types) else "f32"


def parse_dtype(dtype: str | None) -> WeightType | None:
    if dtype is None:
        return None
    key = str(dtype).lower()
    if key not in LOAD_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(LOAD_DTYPES)} or None, got {dtype!r}")
    return LOAD_DTYPES[key]


class _Binder:
    def __init__(self, spec: ModelSpec, source: str, dtype: WeightType | None, threads: int):
        self.spec = spec
        self.source = source
        self.dtype = dtype
        self.threads = threads
        self.owned: dict[tuple[str, int], np.ndarray] = {}  # converted matrices
        self.sizes = {"one": 1, "dim": spec.dim, "q": spec.n_heads * spec.head_dim,
                      "kv": spec.n_kv_heads * spec.head_dim, "ffn": spec.ffn_dim, "head": spec.head_dim,
                      "vocab": spec.vocab_size, "pos": spec.n_positions}

    def matrix(self, slot: str, info, rows: int, cols: int, head: bool = False) -> tuple[int, int, int, int]:
        if tuple(info.shape) != (rows, cols):
            raise FormatError(self.source, f"tensor {info.name!r} ({slot}) has shape {info.shape}, expected {(rows, cols)}")
        if not _core.supports(int(info.wtype)):
            raise UnsupportedModelError(f"{self.source}: tensor {info.name!r} has type {info.wtype.name}, which pyllm cannot multiply yet")
        target = self.dtype
        if head and target in LOW_BIT:
            target = WeightType.Q6_K
        if target in K_QUANT_FALLBACK and cols % 256:
            target = K_QUANT_FALLBACK[target]
        if target is None or target == info.wtype:
            return (int(info.wtype), rows, cols, info.address)
        block = _core.block_size(int(target))
        if cols % block:
            asked = self.dtype.name.lower() + (f" (here {target.name.lower()})" if target != self.dtype else "")
            raise ValueError(f"dtype={asked} needs rows of whole {block}-element blocks, but "
                             f"tensor {info.name!r} ({slot}) has rows of {cols} in {self.source}: "
                             f"choose a float dtype (f16, bf16, f32) for this model")
        key = (info.name, int(target))  # a tied head converted like the embeddings shares their bytes
        if key not in self.owned:
            self.owned[key] = _core.convert_tensor(int(info.wtype), info.bytes(), rows, cols,
                                                   int(target), self.threads)
        return (int(target), rows, cols, int(self.owned[key].ctypes.data))

    def vector(self, slot: str, info, n: int) -> np.ndarray:
        if tuple(info.shape) != (n,):
            raise FormatError(self.source, f"tensor {info.name!r} ({slot}) has shape {info.shape}, expected {(n,)}")
        return np.ascontiguousarray(to_float32(info), dtype=np.float32)

    def slot(self, key: str, table_entry, bound: Mapping) -> object | None:
        """The value for one slot of csrc/pyllm.h's list, or None where the family bound nothing."""
        name, kind, rows, cols, required = table_entry
        info = bound.get(key)
        if info is None:
            if required:
                raise FormatError(self.source, f"the model has no tensor for {key}")
            return None
        if kind == "matrix":
            return self.matrix(key, info, self.sizes[rows], self.sizes[cols], head=key == "lm_head")
        n = self.sizes[rows]
        if kind == "vector":
            return self.vector(key, info, n)
        # q/k norms are RMS in every family; the block norms are the spec's kind
        norm_kind = "rms" if name in ("q_norm", "k_norm") else self.spec.norm_kind
        bias = bound.get(key + ".bias")
        if bias is not None and norm_kind != "layer":
            raise FormatError(self.source, f"{key} is an RMS norm but the checkpoint gives it a bias")
        return (self.vector(key, info, n), None if bias is None else self.vector(key + ".bias", bias, n), norm_kind)


def build_core(
    spec: ModelSpec,
    bound: Mapping,
    source: str,
    keep: object,
    threads: int,
    use_blas: bool = True,
    dtype: WeightType | None = None,
    kv_dtype: str | None = None,
) -> _core.CoreModel:
    """The C model for spec over bound (engine slot -> tensor, as a family's hf_tensors or
    gguf_tensors gives it); keep owns the memory the tensors lie in. Every slot of csrc/pyllm.h's
    list is checked here — shape, type, presence — before an address reaches C. kv_dtype: the cache
    type of its sequences, None for default_kv_dtype's."""
    if kv_dtype is not None:  # before any matrix is converted; the caller's ValueError, not a FormatError
        _core.check_kv_dtype(kv_dtype, spec.head_dim)
    b = _Binder(spec, source, dtype, threads)
    bound = dict(bound)
    if spec.tied_embeddings:
        bound.setdefault("lm_head", bound.get("tok_embd"))
    slots: dict[str, object] = {}
    # the head first: tied, the embeddings share its (possibly re-encoded) bytes
    for entry in sorted(_core.MODEL_SLOTS, key=lambda e: e[0] != "lm_head"):
        value = b.slot(entry[0], entry, bound)
        if value is not None:
            slots[entry[0]] = value
    if spec.tied_embeddings:
        slots["tok_embd"] = slots["lm_head"]
    for i in range(spec.n_layers):
        for entry in _core.LAYER_SLOTS:
            key = f"layers.{i}.{entry[0]}"
            value = b.slot(key, entry, bound)
            if value is not None:
                slots[key] = value
    if kv_dtype is None:
        kv_dtype = default_kv_dtype({v[0] for k, v in slots.items() if _core.is_matrix(k)})
    # Once every matrix has been re-encoded the file's mapping is not needed: dropping it lets
    # quantize-on-load end with the quantized bytes resident, not the file's as well.
    owned = {int(a.ctypes.data) for a in b.owned.values()}
    mapped = [v for k, v in slots.items() if _core.is_matrix(k) and v[3] not in owned]
    # The core multiplies by its copies of the matrices in one block of huge pages (packed where
    # the type has a packed kernel): the file's pages of each such matrix were read once to copy it
    # and leave memory right after (they come back only if read again, as the embedding rows of a
    # tied head are), so the file's bytes never stay resident beside the copies.
    place = {key: functools.partial(_release_span, bound[key]) for key in _placed_in_mapping(slots, bound)}
    try:
        return _core.CoreModel(spec, slots, ((keep, bound) if mapped else None, b.owned), threads, kv_dtype,
                               use_blas, openblas_thread_controls, place)
    except ValueError as e:
        raise FormatError(source, str(e)) from None


def _release_span(info: TensorInfo, start: int, nbytes: int) -> None:
    info.file.release(info.offset + start, nbytes)


def _placed_in_mapping(slots: dict, bound: Mapping) -> frozenset:
    """The matrix slots the core copies into its block of weights: those lying in a file's mapping
    as the file stores them, packed where the type has a packed kernel, and as they are where the
    block has huge pages (elsewhere a plain copy would only cost the time). A matrix re-encoded at
    load (dtype=) keeps its one owned copy instead: copying it would hold both in memory."""
    out = set()
    for key, value in slots.items():
        if key == "tok_embd" or not _core.is_matrix(key):
            continue
        if not (_core.packed_type(int(value[0])) or _core.weights_on_huge_pages()):
            continue
        info = bound.get(key)  # a tied lm_head is bound to the embeddings' tensor
        if isinstance(info, TensorInfo) and info.address == value[3]:
            out.add(key)
    return frozenset(out)
