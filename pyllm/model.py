"""Model: a loaded checkpoint and its sequence — tokenize, logits, generate, stream.

The model keeps one sequence (KV cache). A call whose prompt extends the tokens already in the
cache processes only the new ones; anything else starts the cache over from the shared prefix.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import numpy as np

from . import _core, arch, hub
from .arch.common import eos_ids
from .arch.spec import ModelSpec
from .binding import build_core, parse_dtype
from .errors import ContextLengthError, FormatError
from .formats.gguf import GGUFFile
from .formats.json_files import read_json_object
from .formats.mapped import WeightSummary
from .formats.safetensors import open_checkpoint
from .chat import ChatTemplateError, render_chat
from .generation import Completion, StopMatcher, Stream, TextAssembler
from .sampling import Sampler, SamplingParams, top_logprobs
from .embedding import POOLINGS, embed_ids
from .scheduler import PREFILL_CHUNK, prefill_chunks, run_to_completion, whole_chunks
from .scoring import Score, check_window, token_logprobs
from .threads import default_threads
from .tokenizer import Tokenizer
from .trace import Trace, check_captures, check_layers, run_trace
from .tokenizer_gguf import VOCABULARY_ARRAYS, tokenizer_from_gguf

DEFAULT_MAX_CONTEXT = 4096  # the cache is sized for this unless n_ctx says otherwise
MAX_THREADS = 1024  # more than any CPU this runs on has cores; a larger count is a mistake
MAX_PARALLEL = 1024  # KV caches one model may hold


class _Cache:
    """One KV cache of a model's pool: the ids of the whole prefill chunks it holds (what another
    prompt may reuse), and the generation using it (None: free, kept for a later prompt that
    shares its prefix)."""

    def __init__(self, seq: _core.CoreSequence):
        self.seq = seq
        self.ids: list[int] = []
        self.owner: object | None = None
        self.used = 0  # when it was last used, for taking the stalest one when none is free


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
        # Generations that interleave (streams, threads sharing the model) each hold a cache of
        # their own, up to `parallel` caches made as they are needed; past that the stalest is
        # taken, and the generation that held it runs its context again at its next step. Each
        # step runs under the lock.
        self._parallel = parallel
        self._caches: list[_Cache] = [_Cache(_core.CoreSequence(core, n_ctx))]
        self._clock = 0
        self._lock = threading.RLock()

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

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

    @property
    def tokens_processed(self) -> int:
        """Every token run through the network so far (prompt reuse shows here)."""
        return sum(c.seq.tokens_processed for c in self._caches)

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of text, with BOS/EOS as the model's tokenizer config says when add_special.

        >>> llm.tokenize("Hello")  # doctest: +SKIP
        [19556]
        """
        return self.tokenizer.encode(_check_text(text, "text"), add_special=add_special)

    def detokenize(self, ids) -> str:
        """The text of token ids (ints in [0, vocab_size))."""
        return self.tokenizer.decode(self._token_ids(ids, "ids"))

    def reset(self) -> None:
        """Empties every cache (a generation under way runs its context again at its next step)."""
        with self._lock:
            for cache in self._caches:
                cache.seq.truncate(0)
                cache.ids = []
                cache.owner = None

    def _token_ids(self, ids, name: str) -> list[int]:
        """ids as Python ints, or a ValueError naming the argument: int() would take 1.5, "1" and True."""
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise ValueError(f"{name} must be a sequence of token ids, got {type(ids).__name__}")
        ids = list(ids)
        for i in ids:
            if not _is_int(i):
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
        ids = self._check_ids(ids)
        with self._lock:
            cache = self._acquire(ids, None)
            cache.seq.truncate(0)
            cache.ids = []
            out = np.concatenate([cache.seq.forward(ids[a:b], all_logits=True)
                                  for a, b in prefill_chunks(0, len(ids))])
            cache.ids = whole_chunks(ids)
            return out

    @staticmethod
    def _shared(a: list[int], b: list[int]) -> int:
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        return n

    def _acquire(self, ids: list[int], owner: object | None) -> _Cache:
        """A cache for a generation (owner) about to run ids: the free one holding the longest
        prefix of them; when none is free, a new one while the pool has room (so one generation
        at a time uses one cache's memory), else the stalest."""
        free = [c for c in self._caches if c.owner is None]
        if free:
            cache = max(free, key=lambda c: (self._shared(c.ids, ids), -c.used))
        elif len(self._caches) < self._parallel:
            cache = _Cache(_core.CoreSequence(self._core, self._n_ctx))
            self._caches.append(cache)
        else:
            cache = min(self._caches, key=lambda c: c.used)
        cache.owner = owner
        self._clock += 1
        cache.used = self._clock
        return cache

    def _has_free_cache(self) -> bool:
        """Whether _acquire can give a cache without taking one a generation holds."""
        return len(self._caches) < self._parallel or any(c.owner is None for c in self._caches)

    def _release(self, cache: _Cache, owner: object) -> None:
        with self._lock:
            if cache.owner is owner:
                cache.owner = None

    def _prefill(self, ids: list[int], owner: object | None = None) -> np.ndarray:
        """Logits after ids, reusing the longest prefix of them a free cache holds."""
        return self._prefill_into(ids, owner)[1]

    def _prefill_into(self, ids: list[int], owner: object | None) -> tuple[_Cache, np.ndarray]:
        with self._lock:
            cache = self._take_prefix(ids, owner)
            for a, b in prefill_chunks(cache.seq.pos, len(ids)):
                logits = cache.seq.forward(ids[a:b])
            cache.ids = whole_chunks(ids)
            return cache, logits

    def _take_prefix(self, ids: list[int], owner: object | None) -> _Cache:
        """A cache for owner, truncated to the whole chunks it holds of ids (never all of ids: the
        last token must run to give logits)."""
        cache = self._acquire(ids, owner)
        common = min(self._shared(cache.ids, ids), len(ids) - 1)
        common -= common % PREFILL_CHUNK
        cache.seq.truncate(common)
        cache.ids = ids[:common]
        return cache

    def _step(self, token: int, cache: _Cache | None = None) -> np.ndarray:
        """Decodes one token in cache (default the pool's first, which the tests step by hand).
        Decoded keys/values are not reusable: a prefill computes those positions differently."""
        cache = cache or self._caches[0]
        logits = cache.seq.forward([token])
        self._clock += 1
        cache.used = self._clock
        return logits

    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(_check_text(prompt, "prompt"))
        return self._token_ids(prompt, "prompt")

    def _token_events(self, prompt_ids: list[int], params: SamplingParams, max_tokens: int,
                      logprobs: int | None, state: dict) -> Iterator[tuple[int, dict | None]]:
        """Yields (token id, logprob entry or None) until an end-of-sequence id, max_tokens or a
        full context; state["finish_reason"] says which."""
        ids = self._check_ids(prompt_ids, "prompt")
        _check_run_settings(max_tokens, logprobs)
        params.validate(self.vocab_size)
        sampler = Sampler(params)
        state["finish_reason"] = "length"
        if max_tokens == 0:
            return
        owner = object()
        cache, logits = self._prefill_into(ids, owner)
        generated: list[int] = []
        try:
            while True:
                token = sampler.sample(logits, ids, generated)
                if token in self.eos_ids:
                    state["finish_reason"] = "stop"
                    return
                generated.append(token)
                yield token, (self._logprob_entry(logits, token, logprobs) if logprobs is not None else None)
                if len(generated) == max_tokens or len(ids) + len(generated) > self.n_ctx:  # no room to run it
                    return
                with self._lock:
                    if cache.owner is owner:
                        logits = self._step(token, cache)
                    else:  # the pool was full and another generation took this cache
                        cache, logits = self._prefill_into(ids + generated, owner)
        finally:
            self._release(cache, owner)

    def _logprob_entry(self, logits: np.ndarray, token: int, top: int) -> dict:
        """The token's log-probability under the model's own distribution (before any sampling
        transform), with the top alternatives, as the OpenAI API reports them."""
        best = top_logprobs(logits, top)

        def entry(i: int) -> dict:
            return {"token": self.tokenizer.decode([int(i)]), "token_id": int(i),
                    "logprob": float(best.logprobs[i])}

        return {**entry(token), "top_logprobs": [entry(int(i)) for i in best.ids]}

    def _run(self, prompt, max_tokens: int, stop, logprobs: int | None, sampling: SamplingParams | None,
             params: dict, result: dict) -> Iterator[str]:
        """Text pieces of one generation; leaves the Completion in result["completion"]."""
        settings = _sampling_params(sampling, params)
        prompt_ids = self._prompt_ids(prompt)
        out = TextAssembler(self.tokenizer, stop, len(prompt_ids), logprobs is not None)
        state: dict = {}
        for token, entry in self._token_events(prompt_ids, settings, max_tokens, logprobs, state):
            piece = out.feed(token, entry)
            if piece:
                yield piece
            if out.stopped:
                break
        tail, result["completion"] = out.finish(state["finish_reason"])
        if tail:
            yield tail

    def stream(self, prompt, *, max_tokens: int = 128, stop=None, logprobs: int | None = None,
               sampling: SamplingParams | None = None, **params) -> Stream:
        """Yields text pieces as tokens arrive, never half a UTF-8 character; after the loop it
        holds what generate() returns: .text, .token_ids, .finish_reason, .usage, .logprobs (and
        .completion, the Completion itself).

        prompt is text or token ids; sampling settings come as a SamplingParams or as keywords
        (temperature, top_k, top_p, min_p, typical_p, repetition_penalty, presence_penalty,
        frequency_penalty, logit_bias, seed).

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
        _check_run_settings(max_tokens, logprobs)
        StopMatcher(stop)
        return Stream(self._run(prompt, max_tokens, stop, logprobs, sampling, params, result), result)

    def generate(self, prompt, *, max_tokens: int = 128, stop=None, logprobs: int | None = None,
                 sampling: SamplingParams | None = None, **params) -> Completion | list[Completion]:
        """Continues prompt (text or token ids); greedy unless a temperature is given.

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
            _check_run_settings(max_tokens, logprobs)
            StopMatcher(stop)
            settings.validate(self.vocab_size)
            prompts = [self._check_ids(self._prompt_ids(p), "prompt") for p in prompt]
            return run_to_completion(self, prompts, settings, max_tokens, stop, logprobs)
        s = self.stream(prompt, max_tokens=max_tokens, stop=stop, logprobs=logprobs,
                        sampling=sampling, **params)
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
        ids = self._check_ids(self._prompt_ids(prompt), "prompt")
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
        vectors = [embed_ids(self._core, self._check_ids(self.tokenize(_check_text(t, "texts")), "text"),
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
        _check_int("top", top, 0, self.vocab_size)
        window, stride = check_window(window, stride, self.n_ctx)
        logprobs, alternatives = token_logprobs(self._core, ids, window, stride, top, progress)
        decode = self.tokenizer.decode
        return Score(ids, [decode([i]) for i in ids], 1, logprobs,
                     [[(decode([j]), j, lp) for j, lp in alt] for alt in alternatives])

    def render_chat(self, messages: list[dict], chat_template: str | None = None) -> str:
        """The prompt text the model's chat template makes of messages, ready for the assistant."""
        template = chat_template or self.tokenizer.chat_template
        if not template:
            raise ChatTemplateError(
                f"{self.source} has no chat template; pass chat_template= to chat()")
        return render_chat(template, messages, bos_token=self.tokenizer.bos_token,
                           eos_token=self.tokenizer.eos_token, add_generation_prompt=True)

    def chat(self, messages: list[dict], *, stream: bool = False, chat_template: str | None = None,
             max_tokens: int = 256, **params):
        """Answers a conversation ([{"role": "user", "content": "..."}, ...]) through the model's own
        chat template; returns a Completion, or a Stream when stream=True. The rendered prompt is
        not given a second BOS; a follow-up turn reuses the cached conversation.

        >>> llm.chat([{"role": "user", "content": "What is the capital of France?"}]).text  # doctest: +SKIP
        'The capital of France is Paris.'
        """
        prompt = _check_text(self.render_chat(messages, chat_template), "messages (the rendered prompt)")
        ids = self.tokenizer.encode(prompt, add_special=False)
        if stream:
            return self.stream(ids, max_tokens=max_tokens, **params)
        return self.generate(ids, max_tokens=max_tokens, **params)


def _is_prompt_list(prompt) -> bool:
    """A list (or tuple) of prompts, as opposed to one prompt given as token ids."""
    if not isinstance(prompt, (list, tuple)):
        return False
    if not prompt:
        raise ValueError("the list of prompts is empty")
    return not _is_int(prompt[0])


def _is_int(value) -> bool:
    """A real integer (Python or NumPy): not a bool, a float or a string, which int() would take."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _check_int(name: str, value, low: int, high: int | None = None) -> int:
    if not _is_int(value) or value < low or (high is not None and value > high):
        bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an int {bounds}, got {value!r}")
    return int(value)


def _check_run_settings(max_tokens, logprobs) -> None:
    _check_int("max_tokens", max_tokens, 0)
    if logprobs is not None:
        _check_int("logprobs", logprobs, 0, 20)


def _check_text(text, name: str) -> str:
    """text, if UTF-8 can encode it: a lone surrogate (from a file read with errors="surrogateescape",
    or JSON's "\\ud800") is not text, and the tokenizer would fail with a TypeError."""
    if not isinstance(text, str):
        raise ValueError(f"{name} must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{name} holds a lone surrogate {text[e.start]!r} at index {e.start}, which is "
                         f"not text") from None
    return text


def _sampling_params(sampling: SamplingParams | None, params: dict) -> SamplingParams:
    if sampling is not None and params:
        raise ValueError("pass sampling settings either as a SamplingParams or as keywords, not both")
    if sampling is not None:
        return sampling
    try:
        return SamplingParams(**params)
    except TypeError as e:
        raise ValueError(f"unknown sampling setting: {e}") from None


def _read_config(folder: str, name: str) -> dict:
    return read_json_object(os.path.join(folder, name))


def _eos_from(folder: str, name: str) -> set[int]:
    try:
        return set(eos_ids(_read_config(folder, name).get("eos_token_id")))
    except ValueError as e:
        raise FormatError(os.path.join(folder, name), str(e)) from None


def _check_vocabulary(tokenizer: Tokenizer, spec: ModelSpec, path: str, vocabulary: str, rows: str) -> None:
    """Every id the tokenizer can produce needs an embedding row: a vocabulary larger than the
    model's would load, then fail on the first text that holds one of its last tokens."""
    if tokenizer.n_ids > spec.vocab_size:
        raise FormatError(path, f"{vocabulary} gives {tokenizer.n_ids} token ids, more than {rows}")


def _load_folder(folder: str, threads: int, dtype, kv_dtype):
    config = _read_config(folder, "config.json")
    try:
        family = arch.family_for(config)
        spec = family.spec_from_config(config)
    except (KeyError, TypeError, ValueError) as e:
        raise FormatError(os.path.join(folder, "config.json"), f"bad or missing setting: {e}") from None
    checkpoint = open_checkpoint(folder)
    bound = family.hf_tensors(spec, checkpoint.tensors, folder)
    core = build_core(spec, bound, folder, checkpoint, threads, dtype=dtype, kv_dtype=kv_dtype)
    tokenizer = Tokenizer.from_folder(folder)
    _check_vocabulary(tokenizer, spec, os.path.join(folder, "tokenizer.json"), "the tokenizer",
                      f"config.json's vocab_size of {spec.vocab_size} embedding rows")
    eos = _eos_from(folder, "config.json") | _eos_from(folder, "generation_config.json")
    if tokenizer.eos_id is not None:
        eos.add(tokenizer.eos_id)
    return core, spec, tokenizer, eos, {n: WeightSummary.of(t) for n, t in checkpoint.tensors.items()}


def _load_gguf(path: str, threads: int, dtype, kv_dtype):
    gguf = GGUFFile(path)
    meta = gguf.metadata
    try:
        family = arch.family_for_gguf(meta)
        spec = family.spec_from_gguf(meta, gguf.tensors, meta["general.architecture"])
    except (KeyError, TypeError, ValueError) as e:
        raise FormatError(path, f"bad or missing metadata: {e}") from None
    bound = family.gguf_tensors(spec, gguf.tensors, path)
    # the tokenizer first: building a large vocabulary's passes its peak of memory before the core
    # holds its packed copies of the weights
    info = tokenizer_from_gguf(meta, source=path)
    # The vocabulary lives in the tokenizer now; gguf stays alive with the core (it owns the mapping),
    # and its lists of every token, score and type (~40 MB for a 262k vocabulary) need not.
    for key in VOCABULARY_ARRAYS:
        meta.pop(key, None)
    _core.trim_heap()
    # Every value of the header is parsed now: its pages of the mapping (~6 MB of token strings for
    # a 262k vocabulary) can leave memory.
    gguf.file.release(0, gguf.data_offset)
    tokenizer = Tokenizer(hf=info.tokenizer, bos_id=info.bos_id, eos_id=info.eos_id,
                          chat_template=info.chat_template)
    tokenizer.bos_token = info.tokenizer.id_to_token(info.bos_id) if info.bos_id is not None else None
    tokenizer.eos_token = info.tokenizer.id_to_token(info.eos_id) if info.eos_id is not None else None
    tokenizer.n_ids = info.n_ids
    _check_vocabulary(tokenizer, spec, path, "tokenizer.ggml.tokens",
                      f"the {spec.vocab_size} rows of token_embd.weight")
    core = build_core(spec, bound, path, gguf, threads, dtype=dtype, kv_dtype=kv_dtype)
    return core, spec, tokenizer, set(info.eos_ids), {n: WeightSummary.of(t) for n, t in gguf.tensors.items()}


def load(source, *, threads: int | None = None, n_ctx: int | None = None,
         dtype: str | None = None, file: str | None = None, revision: str | None = None,
         token: str | bool | None = None, parallel: int = 4, kv_dtype: str | None = None) -> Model:
    """Loads a model: a Hugging Face folder (config.json, *.safetensors, tokenizer.json), a .gguf
    file, an alias such as "smollm2" (fetched into the cache on first use), or a Hugging Face id
    such as "HuggingFaceTB/SmolLM2-135M-Instruct" (needs pyllm[hub]; taken from the HF cache when it
    is there, else downloaded into it). A path that exists wins over an alias or an id.

    For an id: file picks the one .gguf file to load from a repository of GGUF files, by a glob
    ("*Q4_K_M.gguf") or its name; revision is a branch, tag or commit (default "main"); token the Hub
    token for a private or gated repository (default: HF_TOKEN, else the one `hf auth login` saved).

    threads is an int in [1, 1024], or None for the physical cores available (OMP_NUM_THREADS is
    honoured). parallel is how many generations (streams, threads) may hold a KV cache of their
    own at once; caches are made as generations overlap, n_ctx each, their memory used as filled. n_ctx defaults to the model's context, at most 4096; one beyond the model's context
    is refused with a ValueError (positions past it were never trained). dtype re-encodes every
    weight matrix at load, in C on all threads: "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0",
    "q5_1", "q4_k", "q5_k", "q6_k" (k-quants fall back to q5_0/q5_1/q8_0 for rows that are not whole
    256-blocks); norms stay f32. None keeps what the file holds. kv_dtype is the KV cache's element
    type: "f32", "f16" for half the memory and bandwidth (keys and values rounded to f16), or "q8_0"
    for 34 bytes per 32 values (each head's key and value quantized to 8 bits as stored; head_dim a
    multiple of 32); tests/test_kv_cache.py states how far logits move. None: f16 where the weights
    are quantized (as llama.cpp's default cache), f32 where they are all float (f32, f16, bf16).

    >>> llm = pyllm.load("smollm2")  # doctest: +SKIP
    >>> llm = pyllm.load("owner/Some-Model-GGUF", file="*Q4_K_M.gguf")  # doctest: +SKIP
    """
    if threads is not None:
        _check_int("threads", threads, 1, MAX_THREADS)
    if n_ctx is not None:
        _check_int("n_ctx", n_ctx, 1)
    _check_int("parallel", parallel, 1, MAX_PARALLEL)
    if kv_dtype is not None:
        _core.check_kv_dtype(kv_dtype)
    wtype = parse_dtype(dtype)
    path = hub.resolve(source, file=file, revision=revision, token=token)
    threads = int(threads) if threads is not None else default_threads()
    if os.path.isdir(path):
        core, spec, tokenizer, eos, weights = _load_folder(path, threads, wtype, kv_dtype)
    else:
        core, spec, tokenizer, eos, weights = _load_gguf(path, threads, wtype, kv_dtype)
    if n_ctx is None:
        n_ctx = min(spec.max_seq_len, DEFAULT_MAX_CONTEXT, spec.max_ctx or DEFAULT_MAX_CONTEXT)
    if n_ctx < 1:
        raise ValueError(f"n_ctx must be >= 1, got {n_ctx}")
    if spec.max_ctx and n_ctx > spec.max_ctx:
        raise ValueError(f"n_ctx {n_ctx} is more than the {spec.max_ctx} positions this model's rope scaling "
                         f"is computed for (LongRoPE's short factors; pyllm does not run its long factors)")
    if spec.n_positions and n_ctx > spec.n_positions:
        raise ValueError(f"n_ctx {n_ctx} is more than the {spec.n_positions} positions the model has learned")
    if n_ctx > spec.max_seq_len:
        raise ValueError(f"n_ctx {n_ctx} is more than the model's context of {spec.max_seq_len} tokens")
    return Model(core, spec, tokenizer, int(n_ctx), path, eos, weights, parallel=int(parallel))
