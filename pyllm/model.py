"""Model: a loaded checkpoint — tokenize, logits, generate, stream, chat, embed, score, trace.

Each generation holds a cache of the model's pool (kvpool.py): a prompt that extends tokens a free
cache holds runs only from the last whole prefill chunk they share; its decode steps are
Generation.step (generation.py), as every generation's are.
"""
from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from . import _core, scheduler, speculative
from .arch.spec import ModelSpec
from .chat import ChatTemplateError, render_chat
from .checks import check_int, check_run_settings, check_text, is_int
from .constraints import output_grammar
from .embedding import POOLINGS, embed_ids
from .errors import ContextLengthError
from .generation import Completion, Generation, StopMatcher, Stream
from .kvpool import KVPool
from .sampling import SamplingParams
from .scoring import Score, check_window, token_logprobs
from .tokenizer import Tokenizer
from .trace import Trace, check_captures, check_layers, run_trace


class Model:
    """A language model ready to run. Build one with pyllm.load()."""

    def __init__(self, core: _core.CoreModel, spec: ModelSpec, tokenizer: Tokenizer, n_ctx: int,
                 source: str, eos_ids: set[int], weights: dict | None = None, parallel: int = 4):
        self.spec = spec
        self.weights = weights or {}  # tensor name -> WeightSummary, as stored in the file
        self.tokenizer = tokenizer
        self.source = source
        self.eos_ids = eos_ids
        self._core = core
        self._n_ctx = n_ctx
        self.pool = KVPool(core, n_ctx, parallel)  # a cache per generation that interleaves
        # how generations speculate unless they say otherwise (pyllm.speculative; load(speculative=))
        self.speculative: speculative.Speculation | None = None

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def core(self) -> _core.CoreModel:
        """The compiled model, for the engine, traces and embeddings that run it directly."""
        return self._core

    @property
    def kv_dtype(self) -> str:
        """The KV caches' element type: "f32", "f16" or "q8_0"."""
        return self._core.kv_dtype

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    @property
    def threads(self) -> int:
        return self._core.n_threads

    def __repr__(self) -> str:
        """What was loaded and how it runs: Model('SmolLM2-135M-Instruct.Q4_1.gguf', llama, 30 layers,
        dim 576, weights q4_1 + q8_0 (96 MB), n_ctx 4096, f16 KV cache, 2 threads)."""
        matrices = [w for w in self.weights.values() if len(w.shape) == 2]
        kinds = " + ".join(sorted({w.wtype.name.lower() for w in matrices})) or "none"
        mb = sum(w.nbytes for w in self.weights.values()) / 1e6
        size = f"{mb:,.0f} MB" if mb >= 10 else f"{mb:.2f} MB"
        return (f"Model({os.path.basename(os.path.normpath(self.source))!r}, {self.spec.family}, "
                f"{self.spec.n_layers} layers, dim {self.spec.dim}, weights {kinds} ({size}), "
                f"n_ctx {self.n_ctx}, {self.kv_dtype} KV cache, {self.threads} threads)")

    @property
    def tokens_processed(self) -> int:
        """Every token run through the network so far (prompt reuse shows here)."""
        return self.pool.tokens_processed

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of text, with BOS/EOS as the model's tokenizer config says when add_special.

        >>> llm.tokenize("Hello")  # doctest: +SKIP
        [19556]
        """
        return self.tokenizer.encode(check_text(text, "text"), add_special=add_special)

    def detokenize(self, ids) -> str:
        """The text of token ids (ints in [0, vocab_size))."""
        return self.tokenizer.decode(self._token_ids(ids, "ids"))

    def reset(self) -> None:
        """Empties every cache (a generation under way runs its context again at its next step)."""
        self.pool.reset()

    def _token_ids(self, ids, name: str) -> list[int]:
        """ids as Python ints, or a ValueError naming the argument: int() would take 1.5, "1" and True."""
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise ValueError(f"{name} must be a sequence of token ids, got {type(ids).__name__}")
        ids = list(ids)
        for i in ids:
            if not is_int(i):
                raise ValueError(f"{name} must hold int token ids, got {i!r} ({type(i).__name__})")
            if not 0 <= i < self.spec.vocab_size:
                raise ValueError(f"{name}: token id {i} is outside the vocabulary [0, {self.spec.vocab_size})")
        return [int(i) for i in ids]

    def _check_ids(self, ids, name: str = "ids") -> list[int]:
        ids = self._token_ids(ids, name)
        if not ids:
            raise ValueError(f"the {name} has no tokens")
        if len(ids) > self.n_ctx:
            raise ContextLengthError(
                f"the prompt has {len(ids)} tokens but the context holds {self.n_ctx} (n_ctx)")
        return ids

    def logits(self, ids) -> np.ndarray:
        """Float32 logits (len(ids), vocab_size) of ids run as a fresh sequence.

        >>> llm.logits(llm.tokenize("The sky is")).shape  # doctest: +SKIP
        (3, 49152)
        """
        return self.pool.all_logits(self._check_ids(ids))

    def _prefill(self, ids: list[int]) -> np.ndarray:
        """Logits after ids, reusing the longest prefix of them a free cache holds."""
        return self.pool.prefill(ids, None)[1]

    def _step(self, token: int) -> np.ndarray:
        """Decodes one token in the pool's first cache (the tests step by hand)."""
        with self.pool.lock:
            return self.pool.step(self.pool.caches[0], token)

    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(check_text(prompt, "prompt"))
        return self._token_ids(prompt, "prompt")

    def prompt_ids(self, prompt, name: str = "prompt") -> list[int]:
        """The ids of prompt (text or token ids), checked to fit the context."""
        return self._check_ids(self._prompt_ids(prompt), name)

    def speculation(self, value) -> speculative.Speculation | None:
        """What a generation's speculative= setting means here: None, the model's own (self.speculative);
        else pyllm.speculative.parse's reading of it ("lookup", "self:N", "draft:FILE", a Model, "off")."""
        return self.speculative if value is None else speculative.parse(value, self)

    def _run(self, prompt, max_tokens: int, stop, logprobs: int | None, sampling: SamplingParams | None,
             params: dict, result: dict, grammar: str | None, speculation) -> Iterator[str]:
        """Text pieces of one generation; leaves the Completion in result["completion"]."""
        settings = _sampling_params(sampling, params)
        ids = self.prompt_ids(prompt)
        check_run_settings(max_tokens, logprobs)
        settings.validate(self.vocab_size)
        gen = Generation(self, ids, settings, max_tokens, stop, logprobs, grammar)
        if speculation is not None:
            speculation.start(self, gen)
        if gen.finish_reason is None:
            yield from self._decode(gen)
        tail, result["completion"] = gen.finish()
        if tail:
            yield tail

    def _decode(self, gen: Generation) -> Iterator[str]:
        """Steps gen in a cache of the pool until it finishes."""
        if gen.speculator is not None:
            yield from speculative.decode(self.pool, gen)
            return
        pool, owner = self.pool, object()
        cache, logits = pool.prefill(gen.ids, owner)
        try:
            while True:
                piece = gen.step(logits)
                if piece is not None and piece.text:
                    yield piece.text
                if gen.finish_reason is not None:
                    return
                with pool.lock:
                    if pool.holds(cache, owner):
                        logits = pool.step(cache, piece.token_id, piece.forced)
                    else:  # the pool was full and another generation took this cache
                        cache, logits = pool.prefill(gen.context(), owner)
        finally:
            pool.release(cache, owner)

    def stream(self, prompt, *, max_tokens: int = 128, stop=None, logprobs: int | None = None,
               sampling: SamplingParams | None = None, json_schema=None, regex: str | None = None,
               choices=None, grammar: str | None = None, speculative=None, **params) -> Stream:
        """Yields text pieces as tokens arrive, never half a UTF-8 character; after the loop it
        holds what generate() returns: .text, .token_ids, .finish_reason, .usage, .logprobs (and
        .completion, the Completion itself).

        prompt is text or token ids; sampling settings come as a SamplingParams or as keywords
        (temperature, top_k, top_p, min_p, typical_p, repetition_penalty, presence_penalty,
        frequency_penalty, logit_bias, seed). speculative: "lookup", "self:N", "draft:FILE", a draft
        Model or "off" (pyllm.speculative), None for the model's own setting; the tokens are those
        of the plain path (greedy: the same bits; sampled: the same distribution), and the usage
        counts the tokens proposed and taken.

        One of json_schema (a dict or a pydantic model class), regex, choices (a list of strings)
        or grammar (Lark or GBNF) constrains the output to match it (pyllm.constraints; the
        `structured` extra): it ends with finish_reason "stop" only as a whole match.

        >>> s = llm.stream("Once upon a time", max_tokens=16)  # doctest: +SKIP
        >>> for piece in s:  # doctest: +SKIP
        ...     print(piece, end="", flush=True)
        >>> s.finish_reason  # doctest: +SKIP
        'length'
        """
        if _is_prompt_list(prompt):
            raise ValueError("stream() takes one prompt; generate() takes a list of them")
        result: dict = {}
        _sampling_params(sampling, params)  # bad settings raise here, not at the first next()
        check_run_settings(max_tokens, logprobs)
        StopMatcher(stop)
        text = output_grammar(json_schema, regex, choices, grammar)
        speculation = self.speculation(speculative)
        return Stream(self._run(prompt, max_tokens, stop, logprobs, sampling, params, result, text, speculation),
                      result)

    def generate(self, prompt, *, max_tokens: int = 128, stop=None, logprobs: int | None = None,
                 sampling: SamplingParams | None = None, json_schema=None, regex: str | None = None,
                 choices=None, grammar: str | None = None, speculative=None,
                 **params) -> Completion | list[Completion]:
        """Continues prompt (text or token ids); greedy unless a temperature is given. json_schema,
        regex, choices and grammar constrain the output as in stream(), each prompt of a list on its own.

        A list of prompts (texts, or lists of ids) is generated together and gives a list of
        Completions, each the one that prompt gets alone (the same seed, the same tokens): up to
        `parallel` (see load) prompts at a time hold a cache each, and each decode step advances
        them all at once, reading the weights once per step instead of once per prompt; a prompt
        takes the place of one that finishes (pyllm.scheduler).

        >>> llm.generate("The capital of France is", max_tokens=8).text  # doctest: +SKIP
        ' Paris. It is the largest city in'
        >>> [c.text for c in llm.generate(["The sky is", "Water boils at"], max_tokens=8)]  # doctest: +SKIP
        """
        if _is_prompt_list(prompt):
            settings = _sampling_params(sampling, params)
            check_run_settings(max_tokens, logprobs)
            StopMatcher(stop)
            settings.validate(self.vocab_size)
            text = output_grammar(json_schema, regex, choices, grammar)
            prompts = [self.prompt_ids(p) for p in prompt]
            return scheduler.run_to_completion(self, prompts, settings, max_tokens, stop, logprobs, text,
                                               speculative)
        s = self.stream(prompt, max_tokens=max_tokens, stop=stop, logprobs=logprobs, sampling=sampling,
                        json_schema=json_schema, regex=regex, choices=choices, grammar=grammar,
                        speculative=speculative, **params)
        for _ in s:
            pass
        return s.completion

    def trace(self, prompt, *, layers=None, capture=("hidden",)) -> Trace:
        """Runs prompt (text or ids) as a fresh sequence of its own and returns the intermediates
        named in capture, of the layers given (None: all; -1 is the last), as numpy arrays; see
        pyllm.trace for the names and shapes. The model's cache is left as it was.

        >>> t = llm.trace("The sky is", layers=[0, -1], capture=("hidden", "attn"))  # doctest: +SKIP
        >>> t["attn"].shape  # (layers, heads, tokens, tokens)  # doctest: +SKIP
        (2, 9, 4, 4)
        """
        capture = check_captures(capture)
        layers = check_layers(layers, self.spec.n_layers)
        ids = self.prompt_ids(prompt)
        _, arrays = run_trace(self._core, self.spec, ids, layers, capture)
        return Trace(ids, [self.tokenizer.decode([i]) for i in ids], layers, arrays)

    def logit_lens(self, hidden: np.ndarray) -> np.ndarray:
        """Logits (..., vocab) of residual-stream rows (..., dim), such as a trace's "hidden",
        through the model's own final norm and head: what each layer would predict if it were
        the last."""
        rows = np.ascontiguousarray(hidden, dtype=np.float32)
        if rows.ndim < 1 or rows.shape[-1] != self.spec.dim:
            raise ValueError(f"hidden must have rows of the model's width {self.spec.dim}, got {rows.shape}")
        flat = rows.reshape(-1, self.spec.dim)
        if not len(flat):
            return np.zeros(rows.shape[:-1] + (self.vocab_size,), dtype=np.float32)
        seq = _core.CoreSequence(self._core, min(len(flat), 256))
        return seq.head(flat).reshape(rows.shape[:-1] + (self.vocab_size,))

    def embed(self, texts, *, pooling: str = "mean", normalize: bool = True) -> np.ndarray:
        """Sentence vectors of texts (a str, or a list of them): the final hidden states (after the
        final norm) pooled by "mean" over every token or the "last" token, unit length when
        normalize. Returns float32 (dim,) for a str, (len(texts), dim) for a list.

        >>> v = llm.embed(["a cat", "a dog"])  # doctest: +SKIP
        >>> float(v[0] @ v[1])  # cosine similarity  # doctest: +SKIP
        0.93
        """
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        single = isinstance(texts, str)
        batch = [texts] if single else texts
        if isinstance(batch, (bytes, dict)) or not hasattr(batch, "__iter__"):
            raise ValueError(f"texts must be a str or a list of str, got {type(texts).__name__}")
        batch = list(batch)
        if not batch:
            raise ValueError("texts is empty")
        vectors = [embed_ids(self._core, self._check_ids(self.tokenize(check_text(t, "texts")), "text"),
                             pooling, bool(normalize)) for t in batch]
        return vectors[0] if single else np.stack(vectors)

    def score(self, text, *, top: int = 5, window: int | None = None, stride: int | None = None,
              progress=None) -> Score:
        """Log-probability of every token of text (or ids) given the ones before it, the top
        alternatives at each position and the perplexity. Texts longer than window (default
        n_ctx) go in sliding windows advancing by stride (default window // 2). progress(n), if
        given, is called as tokens are scored.

        >>> s = llm.score("The capital of France is Paris.")  # doctest: +SKIP
        >>> round(s.perplexity, 1), s.top[-1][0]  # doctest: +SKIP
        (12.3, ('.', 30, -0.41))
        """
        ids = self._prompt_ids(text)
        if len(ids) < 2:
            raise ValueError("scoring needs at least 2 tokens: the first has no context to be scored in")
        check_int("top", top, 0, self.vocab_size)
        window, stride = check_window(window, stride, self.n_ctx)
        logprobs, alternatives = token_logprobs(self._core, ids, window, stride, top, progress)
        decode = self.tokenizer.decode
        return Score(ids, [decode([i]) for i in ids], 1, logprobs,
                     [[(decode([j]), j, lp) for j, lp in alt] for alt in alternatives])

    def render_chat(self, messages: list[dict], chat_template: str | None = None,
                    tools: list[dict] | None = None) -> str:
        """The prompt text the model's chat template makes of messages (and tools, OpenAI's function
        definitions), ready for the assistant."""
        template = chat_template or self.tokenizer.chat_template
        if not template:
            raise ChatTemplateError(
                f"{self.source} has no chat template; pass chat_template= to chat()")
        return render_chat(template, messages, bos_token=self.tokenizer.bos_token,
                           eos_token=self.tokenizer.eos_token, add_generation_prompt=True, tools=tools)

    def chat_ids(self, messages: list[dict], chat_template: str | None = None, *, tools: list[dict] | None = None,
                 special_in_content: bool = False, prepare=None) -> list[int]:
        """The token ids of the prompt the chat template makes of messages. What the messages hold
        is text: "<|im_end|>" inside a message is the tokens of those characters, never the special
        token, so a message cannot close its turn and open another (special tokens are where the
        template writes them); special_in_content=True reads them as special tokens too. tools: OpenAI's
        function definitions, for templates that render them. prepare: a function of the messages once
        shielded, whose own special tokens stay special (the server's tool_calls.call_messages)."""
        tok = self.tokenizer
        prepare = prepare or (lambda m: m)
        if special_in_content:
            prompt = check_text(self.render_chat(prepare(messages), chat_template, tools),
                                "messages (the rendered prompt)")
            return tok.encode(prompt, add_special=False)
        try:
            prompt = self.render_chat(prepare(tok.shield(messages)), chat_template, tools)
        except ChatTemplateError as e:
            raise ChatTemplateError(tok.unshield(str(e))) from None
        return tok.encode_chat(check_text(prompt, "messages (the rendered prompt)"))

    def chat(self, messages: list[dict], *, stream: bool = False, chat_template: str | None = None,
             max_tokens: int = 256, special_in_content: bool = False, **params):
        """Answers a conversation ([{"role": "user", "content": "..."}, ...]) through the model's own
        chat template; returns a Completion, or a Stream when stream=True. The rendered prompt is
        not given a second BOS; a follow-up turn reuses the cached conversation. The messages'
        texts are text, special tokens' included, unless special_in_content (see chat_ids).

        >>> llm.chat([{"role": "user", "content": "What is the capital of France?"}]).text  # doctest: +SKIP
        'The capital of France is Paris.'
        """
        ids = self.chat_ids(messages, chat_template, special_in_content=special_in_content)
        if stream:
            return self.stream(ids, max_tokens=max_tokens, **params)
        return self.generate(ids, max_tokens=max_tokens, **params)


def _is_prompt_list(prompt) -> bool:
    """A list (or tuple) of prompts, as opposed to one prompt given as token ids."""
    if not isinstance(prompt, (list, tuple)):
        return False
    if not prompt:
        raise ValueError("the list of prompts is empty")
    return not is_int(prompt[0])


def _sampling_params(sampling: SamplingParams | None, params: dict) -> SamplingParams:
    if sampling is not None and params:
        raise ValueError("pass sampling settings either as a SamplingParams or as keywords, not both")
    if sampling is not None:
        return sampling
    try:
        return SamplingParams(**params)
    except TypeError as e:
        raise ValueError(f"unknown sampling setting: {e}") from None
