"""Small tensors read whole into NumPy: what the binder and the families widen to float32."""
from __future__ import annotations

import numpy as np

from . import _core
from .dtypes import WeightType
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
