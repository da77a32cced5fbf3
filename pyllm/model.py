"""Model: a loaded checkpoint and its sequence — tokenize, logits, generate, stream.

The model keeps one sequence (KV cache). A call whose prompt extends the tokens already in the
cache processes only the new ones; anything else starts the cache over from the shared prefix.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from . import _core, arch, hub
from .arch.spec import ModelSpec
from .binding import build_core, parse_dtype, to_float32
from .errors import ContextLengthError, FormatError
from .formats.gguf import GGUFFile
from .formats.safetensors import open_checkpoint
from .sampling import Sampler
from .threads import default_threads
from .tokenizer import IncrementalDecoder, Tokenizer
from .tokenizer_gguf import tokenizer_from_gguf

DEFAULT_MAX_CONTEXT = 4096  # the cache is sized for this unless n_ctx says otherwise


@dataclass
class Completion:
    """What generate returns."""

    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (an end-of-sequence token) or "length"
    prompt_tokens: int = 0
    usage: dict = field(default_factory=dict)


class Model:
    """A language model ready to run. Build one with pyllm.load()."""

    def __init__(self, core: _core.CoreModel, spec: ModelSpec, tokenizer: Tokenizer, n_ctx: int,
                 source: str, eos_ids: set[int]):
        self.spec = spec
        self.tokenizer = tokenizer
        self.source = source
        self.eos_ids = eos_ids
        self._core = core
        self._seq = _core.CoreSequence(core, n_ctx)
        self._cached: list[int] = []  # the ids whose keys/values are in the cache

    @property
    def n_ctx(self) -> int:
        return self._seq.n_ctx

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    @property
    def threads(self) -> int:
        return self._core.n_threads

    @property
    def tokens_processed(self) -> int:
        """Every token run through the network so far (prompt reuse shows here)."""
        return self._seq.tokens_processed

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of text, with BOS/EOS as the model's tokenizer config says when add_special.

        >>> llm.tokenize("Hello")  # doctest: +SKIP
        [19556]
        """
        return self.tokenizer.encode(text, add_special=add_special)

    def detokenize(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def reset(self) -> None:
        """Empties the cache."""
        self._seq.truncate(0)
        self._cached = []

    def _check_ids(self, ids: list[int]) -> list[int]:
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError("the prompt has no tokens")
        bad = [i for i in ids if not 0 <= i < self.spec.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {self.spec.vocab_size})")
        if len(ids) > self.n_ctx:
            raise ContextLengthError(
                f"the prompt has {len(ids)} tokens but the context holds {self.n_ctx} (n_ctx)")
        return ids

    def logits(self, ids) -> np.ndarray:
        """Float32 logits (len(ids), vocab_size) of ids run as a fresh sequence.

        >>> llm.logits(llm.tokenize("The sky is")).shape  # doctest: +SKIP
        (3, 49152)
        """
        ids = self._check_ids(list(ids))
        self.reset()
        out = self._seq.forward(ids, all_logits=True)
        self._cached = ids
        return out

    def _prefill(self, ids: list[int]) -> np.ndarray:
        """Logits after ids, reusing the cached prefix they share with the last call."""
        common = 0
        for a, b in zip(self._cached, ids):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)  # the last prompt token must run to give logits
        self._seq.truncate(common)
        self._cached = ids[:common]
        logits = self._seq.forward(ids[common:])
        self._cached = list(ids)
        return logits

    def _step(self, token: int) -> np.ndarray:
        logits = self._seq.forward([token])
        self._cached.append(token)
        return logits

    def stream_ids(self, prompt_ids, *, max_tokens: int = 128, temperature: float = 0.0,
                   seed: int | None = None, state: dict | None = None) -> Iterator[int]:
        """Yields generated token ids; state gets finish_reason when the iterator ends."""
        ids = self._check_ids(list(prompt_ids))
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        sampler = Sampler(temperature, seed)
        state = state if state is not None else {}
        state["finish_reason"] = "length"
        if max_tokens == 0:
            return
        logits = self._prefill(ids)
        for produced in range(max_tokens):
            token = sampler(logits)
            if token in self.eos_ids:
                state["finish_reason"] = "stop"
                return
            yield token
            if produced + 1 == max_tokens or self._seq.pos >= self.n_ctx:
                return  # "length": max_tokens reached or the context is full
            logits = self._step(token)

    def stream(self, prompt: str, *, max_tokens: int = 128, temperature: float = 0.0,
               seed: int | None = None) -> Iterator[str]:
        """Yields text pieces as tokens arrive, never half a UTF-8 character.

        >>> for piece in llm.stream("Once upon a time", max_tokens=16):  # doctest: +SKIP
        ...     print(piece, end="", flush=True)
        """
        decoder = IncrementalDecoder(self.tokenizer)
        for token in self.stream_ids(self.tokenize(prompt), max_tokens=max_tokens,
                                     temperature=temperature, seed=seed):
            piece = decoder.push(token)
            if piece:
                yield piece
        tail = decoder.flush()
        if tail:
            yield tail

    def generate(self, prompt: str, *, max_tokens: int = 128, temperature: float = 0.0,
                 seed: int | None = None) -> Completion:
        """Continues prompt; greedy when temperature is 0.

        >>> llm.generate("The capital of France is", max_tokens=8).text  # doctest: +SKIP
        ' Paris. It is the largest city in'
        """
        prompt_ids = self.tokenize(prompt)
        state: dict = {}
        out = list(self.stream_ids(prompt_ids, max_tokens=max_tokens, temperature=temperature,
                                   seed=seed, state=state))
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(out),
                 "total_tokens": len(prompt_ids) + len(out)}
        return Completion(self.detokenize(out), out, state["finish_reason"], len(prompt_ids), usage)


def _read_config(folder: str, name: str) -> dict:
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise FormatError(path, f"not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise FormatError(path, "expected a JSON object")
    return data


def _eos_from(config: dict) -> set[int]:
    value = config.get("eos_token_id")
    if value is None:
        return set()
    return {int(v) for v in (value if isinstance(value, list) else [value])}


def _load_folder(folder: str, threads: int, dtype):
    config = _read_config(folder, "config.json")
    family = arch.family_for(config)
    try:
        spec = family.spec_from_config(config)
    except (KeyError, TypeError, ValueError) as e:
        raise FormatError(os.path.join(folder, "config.json"), f"bad or missing setting: {e}") from None
    checkpoint = open_checkpoint(folder)
    names = (family.GLOBAL_NAMES, family.LAYER_NAMES)
    core = build_core(spec, names, checkpoint.tensors, folder, checkpoint, threads, dtype=dtype)
    tokenizer = Tokenizer.from_folder(folder)
    eos = _eos_from(config) | _eos_from(_read_config(folder, "generation_config.json"))
    if tokenizer.eos_id is not None:
        eos.add(tokenizer.eos_id)
    return core, spec, tokenizer, eos


def _load_gguf(path: str, threads: int, dtype):
    gguf = GGUFFile(path)
    meta = gguf.metadata
    family = arch.family_for_gguf(meta)
    shapes = {name: info.shape for name, info in gguf.tensors.items()}
    try:
        spec = family.spec_from_gguf(meta, shapes, meta["general.architecture"])
    except (KeyError, TypeError, ValueError) as e:
        raise FormatError(path, f"bad or missing metadata: {e}") from None
    if "rope_freqs.weight" in gguf.tensors:
        family.apply_rope_freq_factors(spec, to_float32(gguf.tensors["rope_freqs.weight"]))
    names = (family.GGUF_GLOBAL_NAMES, family.GGUF_LAYER_NAMES)
    core = build_core(spec, names, gguf.tensors, path, gguf, threads, dtype=dtype)
    info = tokenizer_from_gguf(meta, source=path)
    tokenizer = Tokenizer(hf=info.tokenizer, bos_id=info.bos_id, eos_id=info.eos_id,
                          chat_template=info.chat_template)
    tokenizer.bos_token = info.tokenizer.id_to_token(info.bos_id) if info.bos_id is not None else None
    tokenizer.eos_token = info.tokenizer.id_to_token(info.eos_id) if info.eos_id is not None else None
    return core, spec, tokenizer, set(info.eos_ids)


def load(source, *, threads: int | None = None, n_ctx: int | None = None,
         dtype: str | None = None) -> Model:
    """Loads a model: a Hugging Face folder (config.json, *.safetensors, tokenizer.json), a .gguf
    file, or an alias such as "smollm2" (fetched into the cache on first use).

    threads defaults to the physical cores available (OMP_NUM_THREADS is honoured); n_ctx to the
    model's context, at most 4096. dtype re-encodes every weight matrix at load, in C on all threads:
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k" (k-quants fall
    back to q5_0/q5_1/q8_0 for rows that are not whole 256-blocks); norms stay f32. None keeps what
    the file holds.

    >>> llm = pyllm.load("smollm2")  # doctest: +SKIP
    """
    wtype = parse_dtype(dtype)
    path = hub.resolve(source)
    threads = int(threads) if threads else default_threads()
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if os.path.isdir(path):
        core, spec, tokenizer, eos = _load_folder(path, threads, wtype)
    else:
        core, spec, tokenizer, eos = _load_gguf(path, threads, wtype)
    if n_ctx is None:
        n_ctx = min(spec.max_seq_len, DEFAULT_MAX_CONTEXT)
    if n_ctx < 1:
        raise ValueError(f"n_ctx must be >= 1, got {n_ctx}")
    return Model(core, spec, tokenizer, int(n_ctx), path, eos)
