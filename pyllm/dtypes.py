"""Weight types, numbered as ggml numbers them so a GGUF type id is used as it is.

The C core declares them (csrc/pyllm.h, enum pl_type) and lays out their blocks (csrc/dtypes.c);
WeightType and BLOCK_LAYOUT are made from its table at import.
"""
from __future__ import annotations

import enum

from ._core import TYPE_LAYOUTS

# F32, F16, Q4_0, ..., Q4_K, ..., BF16: every type a file may hold, kernels or none
WeightType = enum.IntEnum("WeightType", [(name.upper(), t) for t, (name, _, _) in TYPE_LAYOUTS.items()],
                          module=__name__)

# (elements per block, bytes per block) — the layouts of ggml's block structs.
BLOCK_LAYOUT: dict[WeightType, tuple[int, int]] = {
    WeightType(t): (block, size) for t, (_, block, size) in TYPE_LAYOUTS.items()}

# safetensors dtype strings pyllm reads, and the weight type each maps to.
SAFETENSORS_DTYPES: dict[str, WeightType] = {
    "F32": WeightType.F32,
    "F16": WeightType.F16,
    "BF16": WeightType.BF16,
}


def row_nbytes(wtype: WeightType, n: int) -> int:
    """Bytes taken by n elements of a row; n must be a whole number of blocks."""
    block, size = BLOCK_LAYOUT[wtype]
    if n % block:
        raise ValueError(f"{n} elements is not a whole number of {wtype.name} blocks of {block}")
    return n // block * size


def tensor_nbytes(wtype: WeightType, shape: tuple[int, ...]) -> int:
    """Bytes taken by a tensor whose innermost (last, row) dimension is shape[-1]."""
    if not shape:
        return BLOCK_LAYOUT[wtype][1] if BLOCK_LAYOUT[wtype][0] == 1 else row_nbytes(wtype, 1)
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return rows * row_nbytes(wtype, shape[-1])
