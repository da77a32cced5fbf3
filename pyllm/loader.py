"""load(): a source (folder, .gguf file, alias, hub id) → a Model, with every check of the files
it reads before a pointer reaches C."""
from __future__ import annotations

import os

from . import _core, arch, hub, speculative as speculation
from .arch.common import eos_ids
from .arch.spec import ModelSpec
from .binding import build_core, parse_dtype
from .checks import check_int
from .errors import ContextLengthError, FormatError
from .formats.gguf import GGUFFile
from .formats.json_files import read_json_object
from .formats.mapped import WeightSummary
from .formats.safetensors import open_checkpoint
from .model import Model
from .threads import default_threads
from .tokenizer import Tokenizer
from .tokenizer_gguf import VOCABULARY_ARRAYS, tokenizer_from_gguf

DEFAULT_MAX_CONTEXT = 4096  # the cache is sized for this unless n_ctx says otherwise
MAX_THREADS = 1024  # more than any CPU this runs on has cores; a larger count is a mistake
MAX_PARALLEL = 1024  # KV caches one model may hold
MAX_CONTEXT = 1 << 24  # positions: more than any model is trained for; the core counts them in an int


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


# (the head, the embeddings it is tied to, the prefix of the other tensors beside those embeddings)
TIED_NAMES = (("lm_head.weight", "model.embed_tokens.weight", "model."),
              ("lm_head.weight", "transformer.wte.weight", "transformer."),
              ("lm_head.weight", "model.language_model.embed_tokens.weight", "model.language_model."),
              ("language_model.lm_head.weight", "language_model.model.embed_tokens.weight", "language_model.model."))


def _with_tied_embeddings(tensors: dict) -> dict:
    """tensors, with the embeddings of a tied head saved once under the head's name (what
    safetensors.torch.save_model writes, keeping one name of tensors that share memory): they are
    that tensor, as transformers loads them."""
    for head, embeddings, prefix in TIED_NAMES:
        if head in tensors and embeddings not in tensors and any(n.startswith(prefix) for n in tensors):
            return {**tensors, embeddings: tensors[head]}
    return tensors


def _load_folder(folder: str, threads: int, dtype, kv_dtype):
    config = _read_config(folder, "config.json")
    try:
        family = arch.family_for(config)
        spec = family.spec_from_config(config)
    except (KeyError, TypeError, ValueError) as e:
        raise FormatError(os.path.join(folder, "config.json"), f"bad or missing setting: {e}") from None
    checkpoint = open_checkpoint(folder)
    tensors = _with_tied_embeddings(checkpoint.tensors) if spec.tied_embeddings else checkpoint.tensors
    bound = family.hf_tensors(spec, tensors, folder)
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
    tokenizer = Tokenizer.from_vocabulary(info.tokenizer, info.n_ids, info.bos_id, info.eos_id, info.chat_template)
    _check_vocabulary(tokenizer, spec, path, "tokenizer.ggml.tokens",
                      f"the {spec.vocab_size} rows of token_embd.weight")
    core = build_core(spec, bound, path, gguf, threads, dtype=dtype, kv_dtype=kv_dtype)
    return core, spec, tokenizer, set(info.eos_ids), {n: WeightSummary.of(t) for n, t in gguf.tensors.items()}


def load(source, *, threads: int | None = None, n_ctx: int | None = None,
         dtype: str | None = None, file: str | None = None, revision: str | None = None,
         token: str | bool | None = None, parallel: int = 4, kv_dtype: str | None = None,
         speculative=None) -> Model:
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
    is refused with a ContextLengthError (positions past it were never trained). dtype re-encodes every
    weight matrix at load, in C on all threads: "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0",
    "q5_1", "q4_k", "q5_k", "q6_k" (k-quants fall back to q5_0/q5_1/q8_0 for rows that are not whole
    256-blocks); norms stay f32. None keeps what the file holds. kv_dtype is the KV cache's element
    type: "f32", "f16" for half the memory and bandwidth (keys and values rounded to f16), or "q8_0"
    for 34 bytes per 32 values (each head's key and value quantized to 8 bits as stored; head_dim a
    multiple of 32); tests/test_kv_cache.py states how far logits move. None: f16 where the weights
    are quantized (as llama.cpp's default cache), f32 where they are all float (f32, f16, bf16).
    speculative is how its generations speculate unless they say otherwise (pyllm.speculative):
    "lookup", "self:N", "draft:FILE" or a draft Model; the outputs stay those of plain decoding.

    >>> llm = pyllm.load("smollm2")  # doctest: +SKIP
    >>> llm = pyllm.load("owner/Some-Model-GGUF", file="*Q4_K_M.gguf")  # doctest: +SKIP
    """
    if threads is not None:
        check_int("threads", threads, 1, MAX_THREADS)
    if n_ctx is not None:
        check_int("n_ctx", n_ctx, 1)
    check_int("parallel", parallel, 1, MAX_PARALLEL)
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
        raise ContextLengthError(f"n_ctx {n_ctx} is more than the {spec.max_ctx} positions this model's rope scaling "
                         f"is computed for (LongRoPE's short factors; pyllm does not run its long factors)")
    if spec.n_positions and n_ctx > spec.n_positions:
        raise ContextLengthError(f"n_ctx {n_ctx} is more than the {spec.n_positions} positions the model has learned")
    if n_ctx > spec.max_seq_len:
        raise ContextLengthError(f"n_ctx {n_ctx} is more than the model's context of {spec.max_seq_len} tokens")
    if n_ctx > MAX_CONTEXT:
        raise ContextLengthError(f"n_ctx {n_ctx} is more than the {MAX_CONTEXT:,} positions pyllm sizes a cache for")
    model = Model(core, spec, tokenizer, int(n_ctx), path, eos, weights, parallel=int(parallel))
    if isinstance(speculative, str) and speculative.startswith("draft:"):
        draft = load(speculative[len("draft:"):], threads=threads, n_ctx=n_ctx, parallel=1)
        model.speculative = speculation.with_draft(model, draft, name=speculative)
    else:
        model.speculative = speculation.parse(speculative, model)
    return model
