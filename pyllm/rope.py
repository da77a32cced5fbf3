"""Rotary embedding frequencies, with the scalings checkpoints ask for.

Computed in float32 in transformers' order of operations, so angles (position × frequency, formed
in C) agree with the oracle's. One step is not IEEE arithmetic: pow, whose last bit numpy and torch
take from SIMD paths that differ by library and CPU (they disagree on AVX-512). pyllm's is the float64
power of the float32 operands rounded once: the same bits on every machine, within 1 ULP of
transformers' on any.
"""
from __future__ import annotations

import math

import numpy as np

from .checks import as_float
from .errors import UnsupportedModelError


def float32_theta(theta: float) -> np.float32:
    """theta as the float32 the frequencies are computed in; a base past float32's range is an error,
    not an infinity that would turn every frequency but the first into 0."""
    if not float(theta) <= float(np.finfo(np.float32).max):
        raise ValueError(f"rope_theta {theta!r} is beyond float32's range")
    return np.float32(theta)


def float32_powers(theta: float, n_rot: int) -> np.ndarray:
    """theta^(2i / n_rot) for i < n_rot / 2, the exponents float32 as transformers forms them, the
    power by the C library's float64 pow (correctly rounded to float32 but in cases far rarer than
    a float32 pow's errors), then rounded once."""
    exponents = np.arange(0, n_rot, 2, dtype=np.int64).astype(np.float32) / np.float32(n_rot)
    base = float(float32_theta(theta))
    return np.array([math.pow(base, float(e)) for e in exponents], dtype=np.float64).astype(np.float32)


def default_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """1 / theta^(2i / head_dim) for i < head_dim / 2, in float32."""
    return (np.float32(1.0) / float32_powers(theta, head_dim)).astype(np.float32)


def llama3_inv_freq(inv_freq: np.ndarray, scaling: dict) -> np.ndarray:
    """Llama 3.1's scaling: low frequencies divided by factor, high kept, a smooth blend between."""
    factor = as_float(scaling.get("factor"), "rope factor")
    low_freq_factor = as_float(scaling.get("low_freq_factor", 1.0), "low_freq_factor")
    high_freq_factor = as_float(scaling.get("high_freq_factor", 4.0), "high_freq_factor")
    old_context = as_float(scaling.get("original_max_position_embeddings", 8192),
                           "original_max_position_embeddings")
    if high_freq_factor <= low_freq_factor:
        raise ValueError(f"high_freq_factor {high_freq_factor} must exceed low_freq_factor {low_freq_factor}")
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_parameters(config: dict) -> dict:
    """The rope settings of a config.json in one shape, whichever spelling it uses.

    transformers 5 writes `rope_parameters` (rope_type, rope_theta and the scaling's keys); older
    checkpoints write `rope_theta` and an optional `rope_scaling` with `type` or `rope_type`.
    """
    params = config.get("rope_parameters")
    scaling = config.get("rope_scaling") or {}
    for key, value in (("rope_parameters", params), ("rope_scaling", scaling)):
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"{key} must be an object, got {str(value)[:80]!r}")
    if params and ("rope_type" in params or "rope_theta" in params):
        out = dict(params)
    else:
        out = dict(scaling)
        if "type" in out and "rope_type" not in out:
            out["rope_type"] = out.pop("type")
        out["rope_theta"] = config.get("rope_theta", out.get("rope_theta", 10000.0))
    out.setdefault("rope_type", "default")
    out.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    return out


def inv_freq(head_dim: int, params: dict) -> np.ndarray:
    """Frequencies for head_dim / 2 rotary pairs under the rope parameters given."""
    kind = params["rope_type"]
    base = default_inv_freq(head_dim, as_float(params["rope_theta"], "rope_theta"))
    if kind == "default":
        return base
    if kind == "linear":
        return (base / np.float32(as_float(params.get("factor"), "rope factor"))).astype(np.float32)
    if kind == "llama3":
        return llama3_inv_freq(base, params)
    raise UnsupportedModelError(f"rope scaling {kind!r} is not supported (default, linear, llama3 are)")
