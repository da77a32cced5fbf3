"""Model.trace: the forward's intermediates, copied out by the C core where it computes them.

What can be captured, and the shape each comes back in (T tokens, L traced layers):

    embed        (T, dim)                      the embeddings as layer 0 sees them (scaled, + positions)
    attn_norm    (L, T, dim)                   a layer's attention-norm output
    q            (L, T, n_heads, head_dim)     queries after q-norm and rope
    k, v         (L, T, n_kv_heads, head_dim)  keys after k-norm and rope, values: as cached
    attn         (L, n_heads, T, T)            attention probabilities, 0 outside a query's window
    attn_out     (L, T, dim)                   what attention adds to the residual (after wo, its
                                               bias and any post-attention norm)
    resid_attn   (L, T, dim)                   the residual stream after that add
    ffn_norm     (L, T, dim)                   the MLP's input norm
    mlp_out      (L, T, dim)                   what the MLP adds (after any post-MLP norm)
    hidden       (L, T, dim)                   the residual stream after the block
    final_norm   (T, dim)                      the final norm's output
    logits       (T, vocab)                    after any final soft-cap

q and k come back in the rotate-halves layout transformers uses, whatever the file's layout (GGUF
llama files pair adjacent dimensions). transformers' output_hidden_states holds embed, then hidden
of layers 0..n-2, then final_norm (its last entry is normed).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import _core

LAYER_CAPTURES = ("attn_norm", "q", "k", "v", "attn", "attn_out", "resid_attn", "ffn_norm", "mlp_out",
                  "hidden")
MODEL_CAPTURES = ("embed", "final_norm", "logits")
CAPTURES = ("embed",) + LAYER_CAPTURES + ("final_norm", "logits")

# The user's names for the core's trace points where they differ.
_CORE_NAMES = {"attn": "probs", "final_norm": "out_norm"}


@dataclass
class Trace:
    """What Model.trace captured: arrays by capture name (shapes in the module's docstring)."""
    token_ids: list[int]
    tokens: list[str]          # each id's text, for labels
    layers: list[int]          # the traced layers, in the order of the layer arrays' first axis
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.arrays:
            raise KeyError(f"{name!r} was not captured; this trace holds {sorted(self.arrays)}")
        return self.arrays[name]

    def __contains__(self, name: str) -> bool:
        return name in self.arrays

    def layer(self, name: str, layer: int) -> np.ndarray:
        """One layer's array of a layer capture (the layer by its number in the model)."""
        if layer not in self.layers:
            raise KeyError(f"layer {layer} was not traced; this trace holds layers {self.layers}")
        return self[name][self.layers.index(layer)]


def check_captures(capture) -> tuple[str, ...]:
    if isinstance(capture, str):
        capture = (capture,)
    capture = tuple(capture)
    unknown = [c for c in capture if c not in CAPTURES]
    if unknown or not capture:
        raise ValueError(f"capture must name some of {', '.join(CAPTURES)}; got {list(capture)!r}")
    return capture


def check_layers(layers, n_layers: int) -> list[int]:
    """None -> every layer; ints may be negative (-1 is the last); each layer once."""
    if layers is None:
        return list(range(n_layers))
    if isinstance(layers, (int, np.integer)) and not isinstance(layers, bool):
        layers = [layers]
    out = []
    for layer in layers:
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not -n_layers <= layer < n_layers:
            raise ValueError(f"layers must be ints in [-{n_layers}, {n_layers}), got {layer!r}")
        layer = int(layer) % n_layers
        if layer in out:
            raise ValueError(f"layer {layer} is named twice")
        out.append(layer)
    return out


def halves_permutation(head_dim: int, n_rot: int) -> np.ndarray:
    """Index that turns a head stored with adjacent rotary pairs (2i, 2i+1) into the halves layout
    (i, i + n_rot/2): the inverse of the permutation llama.cpp's converter applies to q and k."""
    return np.concatenate([np.arange(0, n_rot, 2), np.arange(1, n_rot, 2), np.arange(n_rot, head_dim)])


def run_trace(core: _core.CoreModel, spec, ids: list[int], layers: list[int],
              capture: tuple[str, ...]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Runs ids as a fresh sequence of their own (the model's cache is left alone); returns the
    logits and the captured arrays in the shapes above."""
    wanted: dict = {}
    for name in capture:
        core_name = _CORE_NAMES.get(name, name)
        if name in LAYER_CAPTURES:
            wanted[core_name] = layers
        elif name != "logits":
            wanted[core_name] = True
    seq = _core.CoreSequence(core, len(ids))
    logits, raw = seq.forward_traced(ids, wanted)
    arrays: dict[str, np.ndarray] = {}
    hd = spec.head_dim
    n_rot = hd if spec.n_rot is None else spec.n_rot
    for name in capture:
        if name == "logits":
            arrays[name] = logits
            continue
        a = raw[_CORE_NAMES.get(name, name)]
        if name in ("q", "k", "v"):
            a = a.reshape(a.shape[0], a.shape[1], -1, hd)
            if name != "v" and spec.rope_interleaved and n_rot:
                a = np.ascontiguousarray(a[..., halves_permutation(hd, n_rot)])
        arrays[name] = a
    return logits, arrays
