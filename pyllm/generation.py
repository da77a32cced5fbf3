"""One generation's decode step (logits → token or finish) and what it returns: completions,
streams, stop strings."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from .constraints import Constraint
from .sampling import Sampler, SamplingParams, top_logprobs
from .tokenizer import IncrementalDecoder


@dataclass
class Completion:
    """The result of Model.generate / Model.chat.

    finish_reason is "stop" (an end-of-sequence token or a stop string) or "length" (max_tokens
    or the context ran out). logprobs, when asked for, has one entry per generated token:
    {"token", "token_id", "logprob", "top_logprobs": [{"token", "token_id", "logprob"}, ...]}.
    """

    text: str
    token_ids: list[int]
    finish_reason: str
    usage: dict = field(default_factory=dict)
    logprobs: list[dict] | None = None


class StopMatcher:
    """Cuts streamed text at the first stop string, even one that spans several tokens.

    Text that could still turn out to be the start of a stop string is held back, so a stop string
    is never emitted, not even in part.
    """

    def __init__(self, stops: list[str] | str | None):
        if isinstance(stops, str):
            stops = [stops]
        self.stops = [s for s in (stops or [])]
        for s in self.stops:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
        self.text = ""     # all text seen
        self.emitted = 0   # characters of it already handed out
        self.stopped = False

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        longest = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.text)), longest, -1):
                if self.text.endswith(s[:k]):
                    longest = k
                    break
        return longest

    def feed(self, piece: str) -> str:
        """Adds text; returns what can be emitted now (all of it up to a stop string, if one ends)."""
        if self.stopped:
            return ""
        self.text += piece
        start = max(0, self.emitted - max((len(s) for s in self.stops), default=0))
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            end = min(hits)
        else:
            end = len(self.text) - self._held_back()
        out = self.text[self.emitted:end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return out

    def flush(self) -> str:
        """At the end of generation nothing more can complete a stop string: emit the rest."""
        if self.stopped:
            return ""
        out = self.text[self.emitted:]
        self.emitted = len(self.text)
        return out


class TextAssembler:
    """One generation's text as its tokens arrive: whole UTF-8 characters only, cut at the first
    stop string. feed() returns the text that may be shown now; finish() the rest and the result."""

    def __init__(self, tokenizer, stop, prompt_tokens: int, want_logprobs: bool):
        self.decoder = IncrementalDecoder(tokenizer)
        self.stops = StopMatcher(stop)
        self.prompt_tokens = prompt_tokens
        self.want_logprobs = want_logprobs
        self.tokens: list[int] = []
        self.entries: list[dict] = []
        self.text: list[str] = []

    @property
    def stopped(self) -> bool:
        """A stop string has appeared: the generation must end here."""
        return self.stops.stopped

    def feed(self, token: int, entry: dict | None) -> str:
        self.tokens.append(token)
        if entry is not None:
            self.entries.append(entry)
        piece = self.stops.feed(self.decoder.push(token))
        if piece:
            self.text.append(piece)
        return piece

    def finish(self, finish_reason: str) -> tuple[str, Completion]:
        """(the last text piece, the Completion); a stop string ends it with "stop"."""
        tail = ""
        if not self.stops.stopped:
            tail = self.stops.feed(self.decoder.flush()) + self.stops.flush()
            if tail:
                self.text.append(tail)
        if self.stops.stopped:
            finish_reason = "stop"
        usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": len(self.tokens),
                 "total_tokens": self.prompt_tokens + len(self.tokens)}
        return tail, Completion("".join(self.text), self.tokens, finish_reason, usage,
                                self.entries if self.want_logprobs else None)


@dataclass
class Piece:
    """A generated token and the text it lets through now ("" while UTF-8 or a possible stop
    string holds it back); logprob as Completion.logprobs lists it, when asked for. forced: the
    tokens a constraint allowed no alternative to after it (their text is in text); the next
    forward pass runs [token_id, *forced]."""
    text: str
    token_id: int
    logprob: dict | None
    forced: list[int] = field(default_factory=list)


def logprob_entry(tokenizer, logits: np.ndarray, token: int, top: int) -> dict:
    """The token's log-probability under the model's own distribution (before any sampling
    transform), with the top alternatives, as the OpenAI API reports them."""
    best = top_logprobs(logits, top)

    def entry(i: int) -> dict:
        return {"token": tokenizer.decode([int(i)]), "token_id": int(i), "logprob": float(best.logprobs[i])}

    return {**entry(token), "top_logprobs": [entry(int(i)) for i in best.ids]}


class Generation:
    """One generation between decode steps: a solo stream, a job of the scheduler (generate over a
    list, the server) alike. step(logits) samples the next token and applies the stop rule; once
    finish_reason is set, finish() gives the last text and the Completion."""

    def __init__(self, model, ids: list[int], params: SamplingParams, max_tokens: int, stop,
                 logprobs: int | None, grammar: str | None = None):
        self.tokenizer = model.tokenizer
        self.eos_ids = model.eos_ids
        self.n_ctx = model.n_ctx
        self.ids = ids
        self.sampler = Sampler(params)
        self.max_tokens = max_tokens
        self.logprobs = logprobs
        self.out = TextAssembler(model.tokenizer, stop, len(ids), logprobs is not None)
        self.generated: list[int] = []
        # grammar (constraints.output_grammar): only tokens that keep the output a prefix of a match
        self.constraint = Constraint(model, grammar) if grammar is not None else None
        self.speculator = None  # speculative decoding's state (pyllm.speculative), for the usage
        # max_tokens=0 ends before the prompt runs: nothing generated
        self.finish_reason: str | None = "length" if max_tokens == 0 else None

    def context(self) -> list[int]:
        """What the cache must hold before the next token: the prompt, and the tokens generated."""
        return self.ids + self.generated if self.generated else self.ids

    def step(self, logits: np.ndarray, token: int | None = None) -> Piece | None:
        """The next token sampled from logits (or token, where speculative decoding's rejection
        sampling chose it from them), or None at an end-of-sequence token. Sets finish_reason when
        the generation ends here: "stop" at end of sequence, "length" (made "stop" by finish()
        after a stop string) at a stop string, max_tokens, or a full context."""
        if token is None:
            allowed = self.constraint.mask(logits) if self.constraint is not None else logits
            token = self.sampler.sample(allowed, self.ids, self.generated)
        if token in self.eos_ids:
            self.finish_reason = "stop"
            return None
        self.generated.append(token)
        entry = logprob_entry(self.tokenizer, logits, token, self.logprobs) if self.logprobs is not None else None
        piece = Piece(self.out.feed(token, entry), token, entry)
        if self.constraint is not None:
            self.constraint.consume(token)
            if self.logprobs is None:  # a forced token has no logits of its own to report
                room = min(self.max_tokens - len(self.generated), self.n_ctx - len(self.ids) - len(self.generated))
                piece.forced = self.constraint.forced(room)
                self.generated += piece.forced
                piece.text += "".join(self.out.feed(t, None) for t in piece.forced)
            if self.constraint.finished:  # a whole match that nothing may follow: done
                self.finish_reason = "stop"
                return piece
        if (self.out.stopped or len(self.generated) == self.max_tokens
                or len(self.ids) + len(self.generated) > self.n_ctx):  # no room to run it
            self.finish_reason = "length"
        return piece

    def finish(self) -> tuple[str, Completion]:
        """(the last text piece, the Completion). Constrained output that is not a whole match
        (cut by max_tokens or a stop string) never ends with "stop"."""
        tail, completion = self.out.finish(self.finish_reason or "length")
        if self.constraint is not None and not self.constraint.complete:
            completion.finish_reason = "length"
        if self.speculator is not None:
            completion.usage.update(self.speculator.usage())
        return tail, completion


class Stream:
    """An iterator of text pieces. Once exhausted it holds every field of a generate() result —
    .text, .token_ids, .finish_reason, .usage, .logprobs — and the Completion itself as .completion;
    before that they are None."""

    def __init__(self, pieces: Iterator[str], result: dict):
        self._pieces = pieces
        self._result = result

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> str:
        return next(self._pieces)

    @property
    def completion(self) -> Completion | None:
        return self._result.get("completion")

    @property
    def text(self) -> str | None:
        c = self.completion
        return c.text if c else None

    @property
    def token_ids(self) -> list[int] | None:
        c = self.completion
        return c.token_ids if c else None

    @property
    def finish_reason(self) -> str | None:
        c = self.completion
        return c.finish_reason if c else None

    @property
    def usage(self) -> dict | None:
        c = self.completion
        return c.usage if c else None

    @property
    def logprobs(self) -> list[dict] | None:
        c = self.completion
        return c.logprobs if c else None
