"""From logits to the next token id: greedy at temperature 0, else sampling from softmax(logits/T)."""
from __future__ import annotations

import numpy as np


class Sampler:
    """Picks tokens; the same seed gives the same choices for the same logits."""

    def __init__(self, temperature: float = 0.0, seed: int | None = None):
        if not isinstance(temperature, (int, float)) or temperature < 0 or temperature != temperature:
            raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
        self.temperature = float(temperature)
        self.rng = np.random.default_rng(seed)

    def __call__(self, logits: np.ndarray) -> int:
        if self.temperature == 0.0:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / self.temperature
        z -= z.max()
        p = np.exp(z)
        p /= p.sum()
        # Inverse-CDF on one uniform draw: reproducible and independent of numpy's choice() internals.
        return int(min(np.searchsorted(np.cumsum(p), self.rng.random(), side="right"), len(p) - 1))
