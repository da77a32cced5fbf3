"""Constrained decoding: output that matches a JSON schema, a regex, one of a list of choices or a
grammar (Lark, or llama.cpp's GBNF), through llguidance (`pip install "pyllm[structured]"`).

output_grammar() turns what the caller asks into llguidance's grammar text, once per request;
Constraint is one generation's parser state over it: the mask of the tokens that may come next,
and the tokens it consumed. llguidance builds its token trie from the model's own `tokenizers`
object (the same for a folder's tokenizer.json and a GGUF file's vocabulary), once per tokenizer.
"""
from __future__ import annotations

import json
import threading

import numpy as np

from . import _core
from .errors import PyllmError

# Between JSON tokens: a space, or a new line and an indent, so a model may write pretty JSON but
# not loop on whitespace until max_tokens (llama.cpp bounds it too). A schema's "x-guidance" wins.
JSON_WHITESPACE = r"(?:\n {0,16}| )?"
EXTRA_HINT = 'constrained output needs llguidance: pip install "pyllm[structured]"'


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise PyllmError(EXTRA_HINT) from None
    return llguidance


def schema_dict(json_schema) -> dict:
    """A JSON schema given as a dict, a JSON string or a pydantic model class, as a dict."""
    if isinstance(json_schema, type) and hasattr(json_schema, "model_json_schema"):
        return json_schema.model_json_schema()
    if isinstance(json_schema, str):
        try:
            json_schema = json.loads(json_schema)
        except ValueError as e:
            raise ValueError(f"json_schema is not valid JSON: {e}") from None
    if not isinstance(json_schema, dict):
        raise ValueError(f"json_schema must be a dict, a JSON string or a pydantic model class, "
                         f"got {type(json_schema).__name__}")
    try:
        json.dumps(json_schema)
    except (TypeError, ValueError) as e:
        raise ValueError(f"json_schema is not JSON: {e}") from None
    return json_schema


def output_grammar(json_schema=None, regex: str | None = None, choices=None,
                   grammar: str | None = None) -> str | None:
    """llguidance's grammar text for the one constraint given (None when none is), checked to compile.
    grammar is Lark (llguidance's dialect) or GBNF; choices a list of strings."""
    given = [n for n, v in (("json_schema", json_schema), ("regex", regex), ("choices", choices),
                            ("grammar", grammar)) if v is not None]
    if not given:
        return None
    if len(given) > 1:
        raise ValueError(f"pass one of json_schema, regex, choices and grammar, not {' and '.join(given)}")
    llg = _llguidance()
    if json_schema is not None:
        text = llg.LLMatcher.grammar_from_json_schema(json.dumps(schema_dict(json_schema)),
                                                       defaults={"whitespace_pattern": JSON_WHITESPACE})
    elif regex is not None:
        if not isinstance(regex, str):
            raise ValueError(f"regex must be a str, got {type(regex).__name__}")
        text = llg.LLMatcher.grammar_from_regex(regex)
    elif choices is not None:
        if isinstance(choices, str) or not all(isinstance(c, str) and c for c in choices) or not choices:
            raise ValueError("choices must be a non-empty list of non-empty strings")
        text = llg.grammar_from("choice", list(choices))
    else:
        if not isinstance(grammar, str):
            raise ValueError(f"grammar must be a str (Lark or GBNF), got {type(grammar).__name__}")
        try:
            text = llg.grammar_from("grammar", grammar)
        except ValueError as e:
            raise ValueError(f"grammar: {e}") from None
    failed, messages = llg.LLMatcher.validate_grammar_with_warnings(text)
    if failed:
        raise ValueError(f"{given[0]} cannot be used: {messages[0]}")
    return text


_building = threading.Lock()


def llg_tokenizer(tokenizer, n_vocab: int, eos_ids: set[int]):
    """llguidance's view of a pyllm Tokenizer, kept on the tokenizer: building its trie takes seconds
    at a 150k vocabulary (the server builds it off its event loop, once)."""
    key = (n_vocab, tuple(sorted(eos_ids)))
    with _building:
        cached = tokenizer.__dict__.get("_llguidance")
        if cached is None or cached[0] != key:
            llg = _llguidance()
            hf = tokenizer.hf
            text = hf.to_str()
            if hf.padding is not None or hf.truncation is not None:  # they would change what encode() gives
                state = json.loads(text)
                state["padding"] = state["truncation"] = None
                text = json.dumps(state)
            cached = key, llg.LLTokenizer(text, n_vocab=n_vocab, eos_token=list(key[1]))
            tokenizer.__dict__["_llguidance"] = cached
        return cached[1]


def prepare(model) -> None:
    """Builds llguidance's tokenizer for model now (Constraint would at its first use)."""
    llg_tokenizer(model.tokenizer, model.vocab_size, model.eos_ids)


class Constraint:
    """One generation's parser over a grammar from output_grammar: mask(logits) leaves only the tokens
    that keep the output a prefix of a match (end of sequence only once it is a whole match),
    consume(token) advances it; finished once nothing can follow but the end."""

    def __init__(self, model, grammar: str):
        llg = _llguidance()
        n_vocab = model.vocab_size
        self.matcher = llg.LLMatcher(llg_tokenizer(model.tokenizer, n_vocab, model.eos_ids), grammar,
                                     log_level=0)
        if self.matcher.is_error():
            raise ValueError(f"the constraint cannot be used: {self.matcher.get_error()}")
        self.n_vocab = n_vocab
        self.bits = np.zeros(-(-n_vocab // 32), dtype=np.int32)
        self.masked = np.empty(n_vocab, dtype=np.float32)
        self._next_mask()

    def _next_mask(self) -> None:
        """The bits of the tokens that may come next, computed as soon as the parser has taken the
        last token: llguidance's tables are still in cache then, where after the forward pass that
        comes between they are not (SmolLM2 Q4_1: 0.19 ms a token computed after the pass, ~0.04
        before it; see benchmarks/RESULTS.md)."""
        self.matcher.unsafe_compute_mask_ptr(self.bits.ctypes.data, self.bits.nbytes)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of logits with the tokens that may not come next at -inf (the model's own logits
        stay as they are, for logprobs), written from the mask's bits a word at a time in C (numpy's
        unpacking and index writes took 0.07 ms a token on SmolLM2, 0.22 on Gemma 3)."""
        _core.masked_logits(np.ascontiguousarray(logits, dtype=np.float32), self.bits, self.masked)
        return self.masked

    def forced(self, limit: int) -> list[int]:
        """Up to limit tokens the grammar allows no alternative to (a required key's name, say),
        consumed: they can run through the model in one call instead of a decode step each."""
        tokens = self.matcher.compute_ff_tokens()[:max(limit, 0)]
        if tokens:
            if not self.matcher.consume_tokens(tokens):
                raise PyllmError(f"the constraint rejected its own forced tokens: {self.matcher.get_error()}")
            self._next_mask()
        return tokens

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of tokens, from the first, the parser would take in turn (a speculative round's
        drafts); the parser is left as it is."""
        return self.matcher.validate_tokens(tokens) if tokens else 0

    def mask_after(self, tokens: list[int], logits: np.ndarray) -> np.ndarray | None:
        """mask(logits) as it will be once tokens are taken (a draft model's drafts so far, so that
        its next one is one the parser would take), in a buffer of its own; None where the parser
        would not take them or nothing may follow them. The parser is left as it is."""
        if not tokens:
            return self.mask(logits)
        if self.valid_prefix(tokens) < len(tokens) or not self.matcher.consume_tokens(tokens):
            return None
        try:
            if self.matcher.is_stopped():
                return None
            bits = np.empty_like(self.bits)
            self.matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        finally:
            self.matcher.rollback(len(tokens))
        out = np.empty(self.n_vocab, dtype=np.float32)
        _core.masked_logits(np.ascontiguousarray(logits, dtype=np.float32), bits, out)
        return out

    def consume(self, token: int) -> None:
        if not self.matcher.consume_token(int(token)):
            raise PyllmError(f"the constraint rejected token {token}: {self.matcher.get_error()}")
        self._next_mask()

    @property
    def finished(self) -> bool:
        """The output is a whole match and nothing may follow it."""
        return self.matcher.is_stopped()

    @property
    def complete(self) -> bool:
        """The output so far is a whole match (more may still follow)."""
        return self.matcher.is_accepting()
