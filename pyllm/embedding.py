"""Model.embed: sentence vectors pooled from the final hidden states (after the final norm, as
transformers' output_hidden_states[-1] holds them). The head is not run."""
from __future__ import annotations

import numpy as np

from . import _core

POOLINGS = ("mean", "last")


def embed_ids(core: _core.CoreModel, ids: list[int], pooling: str, normalize: bool) -> np.ndarray:
    """One text's vector (dim,) float32: its own fresh sequence, every row through the final norm."""
    seq = _core.CoreSequence(core, len(ids))
    _, out = seq.forward_traced(ids, {"out_norm": True}, logits=False)
    rows = out["out_norm"].astype(np.float64)
    vector = rows.mean(axis=0) if pooling == "mean" else rows[-1]
    if normalize:
        norm = np.linalg.norm(vector)
        if norm > 0:
            vector = vector / norm
    return vector.astype(np.float32)
