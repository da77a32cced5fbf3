"""What the families share: config and GGUF readers for the usual keys, binding tensors by name,
and the views and copies that family quirks need (fused rows, Conv1D transposes, (1 + w) norms).

A family module is small: it turns its config (or GGUF metadata) into a ModelSpec and its tensor
names into engine slots ("tok_embd", "layers.3.wq", "layers.3.attn_norm.bias", ...; the slot list
is csrc/pyllm.h's), using these helpers for everything that is not its own.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from .. import rope
from ..checks import as_float, as_int
from ..dtypes import WeightType, row_nbytes
from ..errors import FormatError, UnsupportedModelError
from ..formats.mapped import ArrayTensor, TensorInfo
from ..tensors import to_float32
from .spec import MAX_LAYERS, MAX_VOCAB, ModelSpec, Rope

Tensor = "TensorInfo | ArrayTensor"


# The C core holds windows and positions in 32-bit ints.
MAX_WINDOW = (1 << 31) - 1


@dataclasses.dataclass(frozen=True)
class SentencePieceRules:
    """How transformers builds a family's SentencePiece ("llama") vocabulary from a GGUF file where it
    differs from Llama's; a family's GGUF_VOCABULARY sets them, pyllm/tokenizer_gguf.py reads them."""
    # text keeps its spaces as ▁ (a normalizer) and is split after each run of them, never given
    # a dummy prefix; a token of spaces stored with real spaces ("  ") is respelled "▁▁"
    spaces_as_pieces: bool = False
    merges_by_id: bool = False  # the merge order follows the tokens' order in the file, not their scores
    unk_token: str | None = None  # the BPE model's unknown token, when the vocabulary holds it
    extra_special: tuple[str, ...] = ()  # special tokens beyond bos/eos/unk/pad, when the vocabulary holds them


LLAMA_VOCABULARY = SentencePieceRules()

# transformers' names of a decoder layer's norms, where the oracle (pyllm/oracle.py) reads the trace
# points around them: attn_norm and ffn_norm before the blocks, attn_post and mlp_post after them
# where a family has those. A family whose names differ gives its own HF_NORMS.
HF_NORMS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def eos_ids(value, key: str = "eos_token_id") -> list[int]:
    """eos_token_id as a list, whether the config gives an int, a list or nothing."""
    if value is None:
        return []
    return [as_int(v, key, low=0, high=MAX_VOCAB) for v in (value if isinstance(value, list) else [value])]


def token_id(value, key: str) -> int | None:
    return None if value is None else as_int(value, key, low=0, high=MAX_VOCAB)


def window(config: dict) -> int:
    """The sliding window of a config (0 = none), honouring use_sliding_window: false."""
    w = as_int(config.get("sliding_window") or 0, "sliding_window", low=0, high=MAX_WINDOW)
    return 0 if config.get("use_sliding_window") is False else w


def check_window(spec: ModelSpec, key: str) -> None:
    """A window longer than the context the model was trained for is a contradiction in the file."""
    for w in spec.sliding_windows:
        if w > spec.max_seq_len:
            raise ValueError(f"{key} {w} is larger than the context {spec.max_seq_len}")


def hf_spec(config: dict, family: str, **recipe) -> ModelSpec:
    """The spec of a Llama-shaped transformers config (the keys Llama, Mistral, Qwen, Gemma and Phi-3
    share); recipe overrides or adds fields (activation, norms, soft-caps, ropes, ...)."""
    dim = as_int(config.get("hidden_size"), "hidden_size")
    n_heads = as_int(config.get("num_attention_heads"), "num_attention_heads")
    if "head_dim" not in recipe:
        if config.get("head_dim") is None and dim % n_heads:
            raise ValueError(f"hidden_size {dim} is not a multiple of num_attention_heads {n_heads}")
        recipe["head_dim"] = as_int(config.get("head_dim") or dim // n_heads, "head_dim")
    head_dim = recipe["head_dim"]
    n_layers = as_int(config.get("num_hidden_layers"), "num_hidden_layers", high=MAX_LAYERS)
    if "ropes" not in recipe:
        recipe["ropes"] = [Rope(rope.inv_freq(head_dim, rope.rope_parameters(config)))]
    fields = dict(
        family=family,
        n_layers=n_layers,
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=as_int(n_heads if config.get("num_key_value_heads") is None else config["num_key_value_heads"],
                          "num_key_value_heads"),
        ffn_dim=as_int(config.get("intermediate_size"), "intermediate_size"),
        vocab_size=as_int(config.get("vocab_size"), "vocab_size", high=MAX_VOCAB),
        max_seq_len=as_int(config.get("max_position_embeddings", 2048), "max_position_embeddings", high=1 << 40),
        norm_eps=as_float(config.get("rms_norm_eps", 1e-6), "rms_norm_eps"),
        rope_interleaved=False,
        attn_scale=1.0 / math.sqrt(head_dim),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        sliding_windows=[window(config)] * n_layers,
        eos_token_ids=eos_ids(config.get("eos_token_id")),
        bos_token_id=token_id(config.get("bos_token_id"), "bos_token_id"),
    )
    fields.update(recipe)
    spec = ModelSpec(**fields)
    spec.validate()
    return spec


def activation(config: dict, allowed: Mapping[str, str], key: str = "hidden_act") -> str:
    """The engine's name for a config's activation, or UnsupportedModelError naming it."""
    name = config.get(key)
    if name is not None and not isinstance(name, str):
        raise ValueError(f"{key} must be the name of an activation, got {name!r}"[:200])
    if name not in allowed:
        raise UnsupportedModelError(f"{key} {name!r} is not supported; pyllm runs {sorted(allowed)}")
    return allowed[name]


class GGUFKeys:
    """The `{arch}.*` metadata of a GGUF file, each read checked and named in its error."""

    def __init__(self, meta: Mapping[str, object], arch: str):
        self.meta = meta
        self.arch = arch

    def name(self, key: str) -> str:
        return f"{self.arch}.{key}"

    def get(self, key: str, default=None):
        value = self.meta.get(self.name(key), default)
        if value is None:
            raise KeyError(self.name(key))
        return value

    def int(self, key: str, default=None, low: int = 1, high: int = 1 << 20) -> int:
        return as_int(self.get(key, default), self.name(key), low=low, high=high)

    def float(self, key: str, default=None) -> float:
        return as_float(self.get(key, default), self.name(key))


def gguf_spec(meta: Mapping[str, object], tensors: Mapping[str, Tensor], arch: str, family: str,
              **recipe) -> ModelSpec:
    """The spec of a GGUF file from the keys every llama.cpp architecture writes; recipe overrides or
    adds fields. llama.cpp's converter permutes llama q/k rows for adjacent-pair rotation; every
    other family keeps transformers' rotate-half layout (recipe sets rope_interleaved)."""
    k = GGUFKeys(meta, arch)
    dim = k.int("embedding_length")
    n_heads = k.int("attention.head_count")
    n_kv = k.int("attention.head_count_kv", n_heads)
    if "head_dim" not in recipe:
        if k.name("attention.key_length") not in meta and dim % n_heads:
            raise ValueError(f"{k.name('embedding_length')} {dim} is not a multiple of "
                             f"{k.name('attention.head_count')} {n_heads}")
        recipe["head_dim"] = k.int("attention.key_length", dim // n_heads)
    head_dim = recipe["head_dim"]
    if k.int("attention.value_length", head_dim) != head_dim:
        raise UnsupportedModelError(f"{k.name('attention.value_length')} differs from the key length")
    n_layers = k.int("block_count", high=MAX_LAYERS)
    if "ropes" not in recipe:
        n_rot = k.int("rope.dimension_count", head_dim)
        if n_rot > head_dim or n_rot % 2:
            raise ValueError(f"{k.name('rope.dimension_count')} {n_rot} must be even and at most {head_dim}")
        recipe.setdefault("n_rot", n_rot)
        recipe["ropes"] = [Rope(rope.inv_freq(n_rot, gguf_rope_parameters(k)))]
    tokens = meta.get("tokenizer.ggml.tokens")  # not a list: the tokenizer's reader says what is wrong
    vocab = as_int(meta.get(k.name("vocab_size")) or (len(tokens) if isinstance(tokens, list) else 0)
                   or _rows(tensors, "token_embd.weight"), k.name("vocab_size"), high=MAX_VOCAB)
    fields = dict(
        family=family,
        n_layers=n_layers,
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        ffn_dim=k.int("feed_forward_length"),
        vocab_size=vocab,
        max_seq_len=k.int("context_length", 2048, high=1 << 40),
        norm_eps=k.float("attention.layer_norm_rms_epsilon", 1e-5),
        rope_interleaved=False,
        attn_scale=1.0 / math.sqrt(head_dim),
        tied_embeddings="output.weight" not in tensors,
        sliding_windows=[k.int("attention.sliding_window", 0, low=0, high=MAX_WINDOW)] * n_layers,
    )
    fields.update(recipe)
    spec = ModelSpec(**fields)
    spec.validate()
    return spec


def gguf_rope_parameters(k: GGUFKeys) -> dict:
    """rope.freq_base and a linear scaling, in rope.rope_parameters' shape."""
    scaling = k.meta.get(k.name("rope.scaling.type")) or "none"
    params = {"rope_type": "default", "rope_theta": k.float("rope.freq_base", 10000.0)}
    if scaling == "linear":
        params.update(rope_type="linear", factor=k.float("rope.scaling.factor"))
    elif scaling != "none":
        raise UnsupportedModelError(f"rope scaling {scaling!r} is not supported")
    return params


def _rows(tensors: Mapping[str, Tensor], name: str) -> int:
    t = tensors.get(name)
    return int(t.shape[0]) if t is not None and t.shape else 0


def apply_rope_freq_factors(spec: ModelSpec, factors: np.ndarray, name: str = "rope_freqs.weight") -> None:
    """Frequency divisors stored beside the weights (Llama 3.1's rope_freqs, Phi-3's short factors)."""
    factors = np.asarray(factors, dtype=np.float32)
    for r in spec.ropes:
        if factors.shape != r.inv_freq.shape:
            raise FormatError(name, f"holds {factors.shape} factors, expected {r.inv_freq.shape}")
        if not np.all(np.isfinite(factors)) or np.any(factors <= 0):
            raise FormatError(name, "holds a non-finite or non-positive factor")
        r.inv_freq = (r.inv_freq / factors).astype(np.float32)


# ---------------------------------------------------------------- binding tensors to slots

def bind(tensors: Mapping[str, Tensor], source: str, n_layers: int, model_names: Mapping[str, str],
         layer_names: Mapping[str, str]) -> dict[str, Tensor]:
    """Engine slot -> tensor for every name in the maps ("{i}" in a layer name is the layer);
    a name the checkpoint lacks is a FormatError."""
    out = {slot: require(tensors, name, source) for slot, name in model_names.items()}
    for i in range(n_layers):
        for slot, name in layer_names.items():
            out[f"layers.{i}.{slot}"] = require(tensors, name.format(i=i), source)
    # a layer count smaller than the file's layers would silently run a truncated model
    for name in layer_names.values():
        if name.format(i=n_layers) in tensors:
            raise FormatError(source, f"the file has tensor {name.format(i=n_layers)!r}, beyond its {n_layers} layers")
    return out


def require(tensors: Mapping[str, Tensor], name: str, source: str) -> Tensor:
    t = tensors.get(name)
    if t is None:
        raise FormatError(source, f"tensor {name!r} is missing")
    return t


def rows(t: Tensor, start: int, count: int, source: str) -> Tensor:
    """Rows [start, start + count) of a matrix, or elements of a vector, without a copy: how a fused
    qkv or gate_up tensor binds as separate slots."""
    if not t.shape or start < 0 or count < 1 or start + count > t.shape[0]:
        raise FormatError(source, f"tensor {t.name!r} of shape {t.shape} has no rows [{start}, {start + count})")
    shape = (count, *t.shape[1:])
    if isinstance(t, ArrayTensor):
        return ArrayTensor(f"{t.name}[{start}:{start + count}]", t.wtype, t.array[start:start + count])
    row = row_nbytes(t.wtype, t.shape[1]) if len(t.shape) == 2 else row_nbytes(t.wtype, 1)
    return dataclasses.replace(t, name=f"{t.name}[{start}:{start + count}]", shape=shape,
                               offset=t.offset + start * row, nbytes=count * row)


def split_rows(t: Tensor, sizes: list[int], source: str) -> list[Tensor]:
    """A fused tensor cut into consecutive row blocks of the sizes given (which must cover it)."""
    if not t.shape or sum(sizes) != t.shape[0]:
        raise FormatError(source, f"tensor {t.name!r} of shape {t.shape} does not split into rows {sizes}")
    out, start = [], 0
    for n in sizes:
        out.append(rows(t, start, n, source))
        start += n
    return out


_NUMPY = {WeightType.F32: np.float32, WeightType.F16: np.uint16, WeightType.BF16: np.uint16}


def transposed(t: Tensor, source: str) -> ArrayTensor:
    """A copy of a 2-D float tensor stored (in, out), as GPT-2's Conv1D stores it, laid out (out, in)."""
    if t.wtype not in _NUMPY or len(t.shape) != 2:
        raise UnsupportedModelError(f"{source}: {t.name!r} ({t.wtype.name}, {t.shape}) cannot be transposed")
    a = t.bytes().view(_NUMPY[t.wtype]).reshape(t.shape)
    return ArrayTensor(f"{t.name}.T", t.wtype, a.T)


def plus_one(t: Tensor) -> ArrayTensor:
    """Gemma's RMSNorm multiplies by (1 + w): folded in at load, in float32 as transformers does."""
    return ArrayTensor(f"1+{t.name}", WeightType.F32, to_float32(t) + np.float32(1.0))


def gguf_head_keys(arch: str) -> dict[str, str]:
    """ModelSpec.source_keys that name the head counts by their GGUF keys in its messages."""
    return {"n_heads": f"{arch}.attention.head_count", "n_kv_heads": f"{arch}.attention.head_count_kv"}
