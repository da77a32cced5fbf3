"""Model.generate over a list of prompts: every prompt its own sequence (KV cache), prefilled alone,
then decoded together — one forward step advances every unfinished sequence, reading each weight
once for all of them (pl_forward_batch). Each row of a step takes the decode path, so every prompt
gets exactly the tokens it gets alone (greedy, or sampled with the same seed)."""
from __future__ import annotations

import numpy as np

from . import _core
from .generation import Completion, TextAssembler
from .sampling import Sampler, SamplingParams

MAX_STEP_ROWS = 64  # sequences advanced by one forward call; more go in several calls per step


class _Sequence:
    """One prompt's generation: its cache, sampler, text so far and the logits of its next token."""

    def __init__(self, model, ids: list[int], params: SamplingParams, max_tokens: int, stop, logprobs):
        self.ids = ids
        self.sampler = Sampler(params)
        self.max_tokens = max_tokens
        self.logprobs = logprobs
        self.out = TextAssembler(model.tokenizer, stop, len(ids), logprobs is not None)
        self.generated: list[int] = []
        self.finish_reason = "length"
        self.done = max_tokens == 0
        self.seq = None if self.done else _core.CoreSequence(model._core, model.n_ctx)
        self.logits = None if self.done else self.seq.forward(ids)

    def choose(self, model) -> int | None:
        """Samples the next token and records it; None when the sequence ends instead of stepping."""
        token = self.sampler.sample(self.logits, self.ids, self.generated)
        if token in model.eos_ids:
            self.finish_reason, self.done = "stop", True
            return None
        self.generated.append(token)
        entry = model._logprob_entry(self.logits, token, self.logprobs) if self.logprobs is not None else None
        self.out.feed(token, entry)
        if (self.out.stopped or len(self.generated) == self.max_tokens
                or len(self.ids) + len(self.generated) > model.n_ctx):  # no room to run it
            self.done = True
            return None
        return token

    def result(self) -> Completion:
        self.seq = self.logits = None  # the cache is freed as soon as the result is taken
        return self.out.finish(self.finish_reason)[1]


def generate_batch(model, prompts: list[list[int]], params: SamplingParams, max_tokens: int, stop,
                   logprobs) -> list[Completion]:
    sequences = [_Sequence(model, ids, params, max_tokens, stop, logprobs) for ids in prompts]
    work = _core.CoreSequence(model._core, model.n_ctx, n_batch=min(len(prompts), MAX_STEP_ROWS))
    active = [s for s in sequences if not s.done]
    while active:
        stepping, tokens = [], []
        for s in active:
            token = s.choose(model)
            if token is not None:
                stepping.append(s)
                tokens.append(token)
        for start in range(0, len(stepping), MAX_STEP_ROWS):
            group = stepping[start:start + MAX_STEP_ROWS]
            logits = work.forward_batch([s.seq for s in group], np.asarray(tokens[start:start + MAX_STEP_ROWS]))
            for s, row in zip(group, logits):
                s.logits = row
        active = stepping
    return [s.result() for s in sequences]
