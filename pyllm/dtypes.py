"""Weight types, numbered as ggml numbers them so a GGUF type id is used as it is.

The C core (csrc/pyllm.h, enum pl_type) uses the same numbers.
"""
from __future__ import annotations

import enum


class WeightType(enum.IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    BF16 = 30


# (elements per block, bytes per block) — the layouts of ggml's block structs.
BLOCK_LAYOUT: dict[WeightType, tuple[int, int]] = {
    WeightType.F32: (1, 4),
    WeightType.F16: (1, 2),
    WeightType.BF16: (1, 2),
    WeightType.Q4_0: (32, 2 + 16),
    WeightType.Q4_1: (32, 2 + 2 + 16),
    WeightType.Q5_0: (32, 2 + 4 + 16),
    WeightType.Q5_1: (32, 2 + 2 + 4 + 16),
    WeightType.Q8_0: (32, 2 + 32),
    WeightType.Q8_1: (32, 4 + 4 + 32),
    WeightType.Q2_K: (256, 256 // 16 + 256 // 4 + 2 + 2),
    WeightType.Q3_K: (256, 256 // 8 + 256 // 4 + 12 + 2),
    WeightType.Q4_K: (256, 2 + 2 + 12 + 256 // 2),
    WeightType.Q5_K: (256, 2 + 2 + 12 + 256 // 8 + 256 // 2),
    WeightType.Q6_K: (256, 256 // 2 + 256 // 4 + 256 // 16 + 2),
    WeightType.Q8_K: (256, 4 + 256 + 256 // 16 * 2),
}

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
