"""Pictures of what a model does with a prompt (the `plot` extra: matplotlib).

    attention(llm, prompt)   heatmaps of attention probabilities, a panel per (layer, head)
    logit_lens(llm, prompt)  each layer's residual through the final norm and head: the top token
                             per position and its probability
    entropy(llm, text)       per-token surprisal and the entropy of each prediction

Each returns a matplotlib Figure (no pyplot state, no display needed); save() writes it.
"""
from __future__ import annotations

import math
import os

import numpy as np

from .errors import PyllmError

MAX_PANELS = 64  # attention panels per figure: more are unreadable
MAX_COLUMNS = 6  # attention panels a row: more heads wrap onto the next rows, a grid rather than a strip
MAX_TICKS = 24  # token labels an attention panel's axis holds legibly
MAX_LENS_TOKENS = 48  # positions a logit-lens grid can label legibly


def _figure(width: float, height: float):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PyllmError('plots need matplotlib: pip install "pyllm[plot]"') from None
    return Figure(figsize=(width, height), layout="constrained")


def label(token: str) -> str:
    """A token as an axis label: whitespace made visible, long ones cut."""
    text = token.replace("\n", "\\n").replace("\t", "\\t")
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)  # fonts lack control glyphs
    if text.startswith(" "):
        text = "·" + text[1:]
    return text if len(text) <= 12 else text[:11] + "…"


def _name(llm) -> str:
    return f"{llm.spec.family}, {os.path.basename(llm.source.rstrip(os.sep))}"


def attention(llm, prompt, layers=None, heads=None):
    """Attention probabilities of the given layers (default: the first and last) and heads
    (default: all), one heatmap per (layer, head): queries down, keys across, tokens as labels. The
    panels of a layer fill rows of at most MAX_COLUMNS heads; each layer starts a new row."""
    n_layers = llm.spec.n_layers
    layers = [0, n_layers - 1] if layers is None else layers
    trace = llm.trace(prompt, layers=sorted(set(layers), key=list(layers).index), capture=("attn",))
    probs = trace["attn"]  # (L, H, T, T)
    n_heads = probs.shape[1]
    heads = list(range(n_heads)) if heads is None else heads
    for h in heads:
        if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < n_heads:
            raise ValueError(f"heads must be ints in [0, {n_heads}), got {h!r}")
    if len(trace.layers) * len(heads) > MAX_PANELS:
        raise ValueError(f"{len(trace.layers)} layers × {len(heads)} heads is more than {MAX_PANELS} panels: "
                         f"choose layers or heads")
    labels = [label(t) for t in trace.tokens]
    n = len(labels)
    cols = min(len(heads), MAX_COLUMNS)
    rows_per_layer = math.ceil(len(heads) / cols)
    rows = rows_per_layer * len(trace.layers)
    # inches a panel: ~0.13 in a labelled token, as 6 pt type needs
    size = max(1.6, min(3.4, 0.13 * min(n, MAX_TICKS) + 0.8))
    fig = _figure(size * cols + 1.6, (size + 0.5) * rows + 0.6)
    axes = fig.subplots(rows, cols, squeeze=False)
    step = math.ceil(n / MAX_TICKS)  # a long prompt labels every step-th token, so labels never overlap
    ticks = np.arange(0, n, step)
    shown = [labels[i] for i in ticks]
    image = None
    for r, layer in enumerate(trace.layers):
        for i, h in enumerate(heads):
            ax = axes[r * rows_per_layer + i // cols][i % cols]
            image = ax.imshow(probs[r, h], vmin=0.0, vmax=1.0, cmap="viridis", aspect="equal")
            ax.set_title(f"layer {layer} head {h}", fontsize=8)
            ax.set_xticks(ticks, shown, rotation=90, fontsize=6)
            ax.set_xlabel("key", fontsize=7)
            # queries are labelled once per row, at its left; the keys under every panel
            ax.set_yticks(ticks, shown if i % cols == 0 else [], fontsize=6)
            if i % cols == 0:
                ax.set_ylabel("query", fontsize=7)
        for i in range(len(heads), rows_per_layer * cols):  # the empty end of the layer's last row
            axes[r * rows_per_layer + i // cols][i % cols].set_axis_off()
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention probability")
    fig.suptitle(f"attention: {_name(llm)}")
    return fig


def logit_lens(llm, prompt, layers=None):
    """A grid, layers up and positions across: each cell the token the layer's residual stream
    would predict through the final norm and head, coloured by its probability."""
    trace = llm.trace(prompt, layers=layers, capture=("hidden",))
    n = len(trace.token_ids)
    if n > MAX_LENS_TOKENS:
        raise ValueError(f"the prompt has {n} tokens; a logit-lens grid labels at most {MAX_LENS_TOKENS}")
    logits = llm.logit_lens(trace["hidden"]).astype(np.float64)  # (L, T, vocab)
    logits -= logits.max(axis=-1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=-1, keepdims=True)
    best = probs.argmax(axis=-1)
    best_p = np.take_along_axis(probs, best[..., None], axis=-1)[..., 0]
    fig = _figure(max(6.0, 0.75 * n + 2.5), max(3.0, 0.32 * len(trace.layers) + 1.8))
    ax = fig.subplots()
    image = ax.imshow(best_p, vmin=0.0, vmax=1.0, cmap="Blues", aspect="auto", origin="lower")
    for r in range(best.shape[0]):
        for c in range(n):
            text = label(llm.tokenizer.decode([int(best[r, c])]))
            ax.text(c, r, text, ha="center", va="center", fontsize=6,
                    color="white" if best_p[r, c] > 0.6 else "black")
    ax.set_xticks(np.arange(n), [label(t) for t in trace.tokens], rotation=90, fontsize=7)
    ax.set_yticks(np.arange(len(trace.layers)), [str(l) for l in trace.layers], fontsize=7)
    ax.set_xlabel("input token (the cell predicts the next one)")
    ax.set_ylabel("layer")
    fig.colorbar(image, ax=ax, label="probability of the top token")
    fig.suptitle(f"logit lens: {_name(llm)}")
    return fig


def entropy(llm, text):
    """Two panels over the tokens of text: the surprisal of each token (-log2 p, bits) and the
    entropy of the distribution it was drawn from (bits)."""
    ids = llm.prompt_ids(text, "text")
    if len(ids) < 2:
        raise ValueError("the text needs at least 2 tokens")
    score = llm.score(ids, top=0)
    logits = llm.logits(ids)[:-1]
    ent = np.empty(len(logits))
    for i in range(0, len(logits), 64):
        x = logits[i:i + 64].astype(np.float64)
        x -= x.max(axis=1, keepdims=True)
        p = np.exp(x)
        p /= p.sum(axis=1, keepdims=True)
        ent[i:i + 64] = -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=1) / math.log(2)
    labels = [label(t) for t in score.tokens[score.first:]]
    x = np.arange(len(labels))
    fig = _figure(max(6.0, 0.28 * len(labels) + 2.0), 5.0)
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.bar(x, score.surprisal, color="tab:red")
    top.set_ylabel("surprisal (bits)")
    top.set_title(f"perplexity {score.perplexity:.2f} over {score.n_scored} tokens", fontsize=9)
    bottom.plot(x, ent, marker="o", markersize=3, color="tab:blue")
    bottom.set_ylabel("entropy (bits)")
    bottom.set_xticks(x, labels, rotation=90, fontsize=7)
    bottom.set_xlabel("token")
    fig.suptitle(f"surprisal and entropy: {_name(llm)}")
    return fig


def save(fig, path: str) -> None:
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise PyllmError(f"cannot write {path}: {e}") from None
