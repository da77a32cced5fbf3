"""Model.score and perplexity: the log-probability the model gives each token of a text.

A text longer than the context is scored in sliding windows (as transformers' perplexity guide
does): each window runs afresh and scores only the tokens the windows before it did not, every
scored token seeing at least window - stride tokens of context.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import _core

CHUNK = 256  # tokens per forward call inside a window: bounds the (chunk, vocab) logits held
ROWS = 32    # logits rows turned into float64 log-probabilities at once


@dataclass
class Score:
    """Per-token scores of a text. Position i of the arrays is token_ids[i + first]: the first
    token(s) have no context to be scored in (a BOS, or the text's first token without one)."""
    token_ids: list[int]         # the whole text, BOS included when the model adds one
    tokens: list[str]            # the text of each id
    first: int                   # index of the first scored token
    logprobs: np.ndarray         # (n,) float64, log p(token | the tokens before it)
    top: list[list[tuple[str, int, float]]]  # per scored token: (text, id, logprob) of the best
                                 # alternatives, most likely first

    @property
    def n_scored(self) -> int:
        return len(self.logprobs)

    @property
    def perplexity(self) -> float:
        """exp of the mean negative log-likelihood over the scored tokens."""
        return math.exp(-float(np.mean(self.logprobs))) if self.n_scored else math.nan

    @property
    def surprisal(self) -> np.ndarray:
        """-log2 p of each scored token, in bits."""
        return -self.logprobs / math.log(2)


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    x = rows.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def _chunks(n: int) -> list[tuple[int, int]]:
    """[start, end) pieces of a window of n tokens, none shorter than the batch path's minimum
    unless the window itself is, so every position runs on the path a prompt of n would take."""
    bounds = list(range(0, n, CHUNK)) + [n]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] < _core.BLAS_MIN_TOKENS:
        del bounds[-2]
    return list(zip(bounds[:-1], bounds[1:]))


def token_logprobs(core: _core.CoreModel, ids: list[int], window: int, stride: int, top: int,
                   progress: Callable[[int], None] | None = None):
    """(logprobs (len(ids) - 1,), top alternatives) of ids[1:], in windows of at most window tokens
    that advance by stride. progress(n) is told how many more tokens were scored."""
    n = len(ids)
    logprobs = np.full(n - 1, np.nan)
    alternatives: list[list[tuple[int, float]]] = [[] for _ in range(n - 1)]
    seq = _core.CoreSequence(core, min(window, n), n_batch=CHUNK + _core.BLAS_MIN_TOKENS)
    scored_to = 1  # ids[:scored_to] need no score (the first has no context)
    begin = 0
    while scored_to < n:
        end = min(begin + window, n)
        seq.truncate(0)
        for lo, hi in _chunks(end - begin):
            logits = seq.forward(ids[begin + lo:begin + hi], all_logits=True)
            # row r predicts ids[begin + lo + r + 1]; keep the rows of tokens not scored yet
            for r0 in range(0, hi - lo, ROWS):
                rows = logits[r0:r0 + ROWS]
                targets = np.arange(begin + lo + r0 + 1, begin + lo + r0 + 1 + len(rows))
                keep = (targets >= scored_to) & (targets < end)
                if not keep.any():
                    continue
                lp = _log_softmax(rows[keep])
                t = targets[keep]
                logprobs[t - 1] = lp[np.arange(len(t)), np.asarray(ids)[t]]
                if top:
                    best = np.argpartition(-lp, min(top, lp.shape[1] - 1), axis=1)[:, :top]
                    for i, pos in enumerate(t):
                        order = best[i][np.argsort(-lp[i, best[i]], kind="stable")]
                        alternatives[pos - 1] = [(int(j), float(lp[i, j])) for j in order]
        if progress:
            progress(end - scored_to)
        scored_to = end
        if end == n:
            break
        begin += stride
    return logprobs, alternatives


def check_window(window, stride, n_ctx: int) -> tuple[int, int]:
    window = n_ctx if window is None else window
    if isinstance(window, bool) or not isinstance(window, int) or not 2 <= window <= n_ctx:
        raise ValueError(f"window must be an int in [2, n_ctx={n_ctx}], got {window!r}")
    stride = max(1, window // 2) if stride is None else stride
    if isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride <= window - 1:
        raise ValueError(f"stride must be an int in [1, window - 1 = {window - 1}], got {stride!r}")
    return window, stride
