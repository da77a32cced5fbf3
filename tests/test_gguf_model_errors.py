"""GGUF files whose metadata is malformed or contradicts their tensors are refused with a FormatError
naming what is wrong, never a TypeError or OverflowError, and never load a truncated model; a fuzzer
that swaps metadata values and types on a tiny model finds only loads that run or pyllm errors."""
from __future__ import annotations

import math
import random
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType as VT, GGUFWriter
from tokenizers.pre_tokenizers import ByteLevel

import pyllm

from fuzzing import run_cases


# ---- the real SmolLM2 file, rewritten ------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_reader(smollm2_gguf) -> GGUFReader:
    return GGUFReader(smollm2_gguf)


def rewrite(reader: GGUFReader, dst: Path, changes: dict) -> str:
    """A copy of the file with metadata changed: key -> (value, type, array element type)."""
    writer = GGUFWriter(dst, str(reader.fields["general.architecture"].contents()))
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or (key == "general.architecture" and key not in changes):
            continue  # the writer wrote the architecture; a change replaces it
        sub = f.types[1] if f.types[0] == VT.ARRAY else None
        value, vtype, sub = changes.get(key, (f.contents(), f.types[0], sub))
        writer.add_key_value(key, value, vtype, sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(dst)


def test_gguf_architecture_given_as_an_array_raises_format_error_naming_it(smollm2_reader, tmp_path):
    bad = rewrite(smollm2_reader, tmp_path / "bad.gguf", {"general.architecture": (["llama"], VT.ARRAY, VT.STRING)})
    with pytest.raises(pyllm.FormatError, match="general.architecture must be a string"):
        pyllm.load(bad, threads=1)


def test_gguf_block_count_below_the_files_layers_raises_format_error(smollm2_reader, tmp_path):
    """SmolLM2 has 30 blocks: a block_count of 9 would run the first 9 and ignore the rest."""
    bad = rewrite(smollm2_reader, tmp_path / "bad.gguf", {"llama.block_count": (9, VT.UINT32, None)})
    with pytest.raises(pyllm.FormatError, match=r"blk\.9\..*beyond its 9 layers"):
        pyllm.load(bad, threads=1)


def test_gguf_tokens_beyond_the_embedding_rows_raise_format_error(smollm2_reader, tmp_path):
    """llama.vocab_size and token_embd.weight say 49152 tokens; one more control token in the list
    would be matched in text and given an id with no embedding row."""
    tokens = list(smollm2_reader.fields["tokenizer.ggml.tokens"].contents()) + ["<|extra|>"]
    types = list(smollm2_reader.fields["tokenizer.ggml.token_type"].contents()) + [3]
    bad = rewrite(smollm2_reader, tmp_path / "bad.gguf", {
        "tokenizer.ggml.tokens": (tokens, VT.ARRAY, VT.STRING),
        "tokenizer.ggml.token_type": (types, VT.ARRAY, VT.INT32),
    })
    with pytest.raises(pyllm.FormatError, match="tokenizer.ggml.tokens gives 49153 token ids, more than the 49152 "
                                                "rows of token_embd.weight"):
        pyllm.load(bad, threads=1)


# ---- a tiny model, packed by hand so that any value of any type can be written ----------------------
#
# gguf.GGUFWriter refuses what a hostile file may hold (empty arrays, arrays of mixed nesting), so the
# fuzzer writes its files itself. A metadata value is (type, payload); an array's payload is
# (element type, [payloads]).

_SCALAR = {VT.UINT8: "<u1", VT.INT8: "<i1", VT.UINT16: "<u2", VT.INT16: "<i2", VT.UINT32: "<u4", VT.INT32: "<i4",
           VT.FLOAT32: "<f4", VT.BOOL: "<u1", VT.UINT64: "<u8", VT.INT64: "<i8", VT.FLOAT64: "<f8"}


def _pack(vtype: VT, payload) -> bytes:
    if vtype in _SCALAR:
        dtype = np.dtype(_SCALAR[vtype])
        if dtype.kind in "ui":  # wrapped into the type's range, as a file would hold it
            info = np.iinfo(dtype)
            payload = (int(payload) - int(info.min)) % (int(info.max) - int(info.min) + 1) + int(info.min)
        with np.errstate(over="ignore"):  # a float past float32's range is stored as inf
            return np.array(payload, dtype=dtype).tobytes()
    if vtype == VT.STRING:
        data = payload.encode("utf-8", "surrogatepass")
        return struct.pack("<Q", len(data)) + data
    etype, items = payload
    return struct.pack("<IQ", etype, len(items)) + b"".join(_pack(etype, item) for item in items)


def write_gguf(path: Path, metadata: dict, tensors: dict[str, np.ndarray]) -> None:
    """A GGUF v3 file of metadata (key -> (type, payload)) and float32 tensors, 32-byte aligned."""
    out = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(metadata))]
    for key, (vtype, payload) in metadata.items():
        out += [_pack(VT.STRING, key), struct.pack("<I", vtype), _pack(vtype, payload)]
    offset = 0
    for name, array in tensors.items():
        ne = array.shape[::-1]
        out += [_pack(VT.STRING, name), struct.pack(f"<I{len(ne)}Q", len(ne), *ne), struct.pack("<IQ", 0, offset)]
        offset += -(-array.nbytes // 32) * 32
    head = b"".join(out)
    data = b"".join(a.tobytes() + b"\0" * (-a.nbytes % 32) for a in tensors.values())
    path.write_bytes(head + b"\0" * (-len(head) % 32) + data)


BYTES = sorted(ByteLevel.alphabet())  # GPT-2's spellings of the 256 bytes
EXTRA = ["Ġh", "hi", "Ġhi", "<|im_start|>", "<|im_end|>"]
TOKENS = BYTES + EXTRA
DIM, HEADS, KV_HEADS, FFN, LAYERS = 16, 2, 1, 24, 2
HEAD_DIM = DIM // HEADS
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}<|im_start|>"


def tiny_metadata() -> dict:
    n = len(TOKENS)
    types = [1] * len(BYTES) + [1, 1, 1, 3, 3]
    return {
        "general.architecture": (VT.STRING, "llama"),
        "llama.block_count": (VT.UINT32, LAYERS),
        "llama.context_length": (VT.UINT32, 64),
        "llama.embedding_length": (VT.UINT32, DIM),
        "llama.feed_forward_length": (VT.UINT32, FFN),
        "llama.attention.head_count": (VT.UINT32, HEADS),
        "llama.attention.head_count_kv": (VT.UINT32, KV_HEADS),
        "llama.attention.layer_norm_rms_epsilon": (VT.FLOAT32, 1e-5),
        "llama.rope.freq_base": (VT.FLOAT32, 10000.0),
        "llama.rope.dimension_count": (VT.UINT32, HEAD_DIM),
        "llama.vocab_size": (VT.UINT32, n),
        "tokenizer.ggml.model": (VT.STRING, "gpt2"),
        "tokenizer.ggml.pre": (VT.STRING, "gpt2"),
        "tokenizer.ggml.tokens": (VT.ARRAY, (VT.STRING, TOKENS)),
        "tokenizer.ggml.token_type": (VT.ARRAY, (VT.INT32, types)),
        "tokenizer.ggml.merges": (VT.ARRAY, (VT.STRING, ["Ġ h", "h i", "Ġh i"])),
        "tokenizer.ggml.bos_token_id": (VT.UINT32, n - 2),
        "tokenizer.ggml.eos_token_id": (VT.UINT32, n - 1),
        "tokenizer.ggml.add_bos_token": (VT.BOOL, False),
        "tokenizer.chat_template": (VT.STRING, TEMPLATE),
    }


def tiny_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)

    def w(*shape):
        return (0.3 * rng.standard_normal(shape)).astype(np.float32)

    out = {"token_embd.weight": w(len(TOKENS), DIM), "output_norm.weight": 1 + w(DIM)}
    for i in range(LAYERS):
        out.update({f"blk.{i}.attn_norm.weight": 1 + w(DIM), f"blk.{i}.attn_q.weight": w(DIM, DIM),
                    f"blk.{i}.attn_k.weight": w(KV_HEADS * HEAD_DIM, DIM),
                    f"blk.{i}.attn_v.weight": w(KV_HEADS * HEAD_DIM, DIM),
                    f"blk.{i}.attn_output.weight": w(DIM, DIM), f"blk.{i}.ffn_norm.weight": 1 + w(DIM),
                    f"blk.{i}.ffn_gate.weight": w(FFN, DIM), f"blk.{i}.ffn_up.weight": w(FFN, DIM),
                    f"blk.{i}.ffn_down.weight": w(DIM, FFN)})
    return out


def run_model(path: str) -> str:
    """'ran' when the file loads and its model tokenizes, runs, generates and chats; 'refused' on a
    pyllm error. Anything else escapes."""
    try:
        llm = pyllm.load(path, threads=1)
        ids = llm.tokenize("hi <|im_start|> hi <|x0|>") or [0]
        llm.logits(ids)
        llm.generate(ids, max_tokens=2)
        if llm.tokenizer.chat_template:
            llm.chat([{"role": "user", "content": "hi"}], max_tokens=2)
    except pyllm.PyllmError:
        return "refused"
    return "ran"


def test_tiny_gguf_model_loads_and_runs(tmp_path):
    """The fuzzer's starting point is a model that works."""
    path = tmp_path / "tiny.gguf"
    write_gguf(path, tiny_metadata(), tiny_tensors())
    assert run_model(str(path)) == "ran"


# ---- fuzzing the metadata -----------------------------------------------------------------------

# keys the tiny file lacks that a mutation may add
OPTIONAL_KEYS = ["llama.attention.sliding_window", "llama.attention.key_length", "llama.attention.value_length",
                 "llama.rope.scaling.type", "llama.rope.scaling.factor", "llama.attention.sliding_window_pattern",
                 "tokenizer.ggml.eot_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.scores",
                 "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix", "general.alignment"]
FAMILIES = ["gpt2", "gemma", "gemma2", "gemma3", "qwen2", "qwen3", "phi3", "mamba", "llama"]

SCALARS = {
    VT.UINT8: [0, 1, 255], VT.INT8: [-128, -1, 0, 1], VT.UINT16: [0, 2, 65535], VT.INT16: [-32768, -1, 3],
    VT.UINT32: [0, 1, 2, 3, 7, 8, 16, 24, 64, 2**31, 2**32 - 1], VT.INT32: [-(2**31), -1, 2, 16],
    VT.UINT64: [0, 1, 2**40, 2**63, 2**64 - 1], VT.INT64: [-(2**63), -1, 2**62],
    VT.FLOAT32: [math.nan, math.inf, -math.inf, 0.0, -1.0, 1e-30, 0.5, 3.0e38],
    VT.FLOAT64: [math.nan, -math.inf, 1e308, -0.0, 1e-5, 1e4], VT.BOOL: [True, False],
    VT.STRING: ["", "llama", "gpt2", "linear", "none", "x" * 300, "é✓\u2581", "{{ x", "{% for x in y %}"],
}


def random_value(rnd: random.Random, depth: int = 0) -> tuple[VT, object]:
    """A value of any type: an extreme scalar, a string, or an array (maybe empty, maybe nested)."""
    if rnd.random() < 0.7 or depth >= 2:
        vtype = rnd.choice(list(SCALARS))
        return vtype, rnd.choice(SCALARS[vtype])
    if rnd.random() < 0.3:  # an array of arrays
        items = [random_value(rnd, depth + 1) for _ in range(rnd.randint(0, 3))]
        arrays = [payload for vtype, payload in items if vtype == VT.ARRAY]
        return VT.ARRAY, (VT.ARRAY, arrays)
    etype = rnd.choice(list(SCALARS))
    return VT.ARRAY, (etype, [rnd.choice(SCALARS[etype]) for _ in range(rnd.randint(0, 4))])


def nearby_value(rnd: random.Random, vtype: VT, payload) -> tuple[VT, object]:
    """The same type, another value: an int off by one or scaled, a float scaled or not finite."""
    if vtype in (VT.UINT32, VT.INT32, VT.UINT64, VT.INT64) and isinstance(payload, int):
        return vtype, rnd.choice([payload - 1, payload + 1, payload * 2, payload // 2, 0])
    if vtype in (VT.FLOAT32, VT.FLOAT64):
        return vtype, rnd.choice([payload * 10, -payload, 0.0, math.nan, math.inf])
    return random_value(rnd)


def _array(meta: dict, key: str, etype: VT, default: list) -> list:
    """The elements of an array of etype, or default where an earlier mutation replaced it."""
    vtype, payload = meta.get(key, (None, None))
    return list(payload[1]) if vtype == VT.ARRAY and payload[0] == etype else list(default)


def mutate_vocabulary(rnd: random.Random, meta: dict) -> str:
    tokens = _array(meta, "tokenizer.ggml.tokens", VT.STRING, TOKENS)
    types = _array(meta, "tokenizer.ggml.token_type", VT.INT32, tiny_metadata()["tokenizer.ggml.token_type"][1][1])
    op = rnd.randrange(6)
    if op == 0:  # control tokens past the embedding rows, matched in the prompt
        k = rnd.randint(1, 3)
        tokens += [f"<|x{i}|>" for i in range(k)]
        typed = k if rnd.random() < 0.8 else k - 1
        types += [3] * typed
        done = f"{k} control tokens appended ({typed} typed)"
    elif op == 1:
        tokens = tokens[:-1]
        done = "the last token dropped"
    elif op == 2:
        meta["tokenizer.ggml.merges"] = (VT.ARRAY, (VT.STRING, []))
        return "no merges"
    elif op == 3:
        merges = rnd.sample(["Ġ h", "h i", "Ġh i", "a b", "hi"], 2)
        meta["tokenizer.ggml.merges"] = (VT.ARRAY, (VT.STRING, merges))
        return f"merges {merges}"
    elif op == 4:
        types = [rnd.choice([1.0, math.inf, math.nan, -1.0, 3.0]) for _ in types]
        meta["tokenizer.ggml.token_type"] = (VT.ARRAY, (VT.FLOAT32, types))
        return "token types as floats"
    else:
        meta["tokenizer.ggml.scores"] = (VT.ARRAY, (VT.FLOAT32, [rnd.choice([0.0, math.nan, -math.inf])
                                                                 for _ in tokens]))
        meta["tokenizer.ggml.model"] = (VT.STRING, "llama")
        return "a SentencePiece vocabulary"
    meta["tokenizer.ggml.tokens"] = (VT.ARRAY, (VT.STRING, tokens))
    meta["tokenizer.ggml.token_type"] = (VT.ARRAY, (VT.INT32, types))
    return done


def mutated_metadata(seed: int) -> tuple[dict, list[str]]:
    """The tiny model's metadata with 1 to 3 changes drawn from seed, and what they were."""
    rnd = random.Random(seed)
    meta = tiny_metadata()
    done = []
    for _ in range(rnd.randint(1, 3)):
        op = rnd.random()
        key = rnd.choice(list(meta) + OPTIONAL_KEYS)
        if op < 0.45:
            meta[key] = random_value(rnd)
            done.append(f"{key} = {meta[key]!r}"[:120])
        elif op < 0.7 and key in meta:
            meta[key] = nearby_value(rnd, *meta[key])
            done.append(f"{key} = {meta[key]!r}"[:120])
        elif op < 0.8:
            meta.pop(key, None)
            done.append(f"no {key}")
        elif op < 0.95:
            done.append(mutate_vocabulary(rnd, meta))
        else:  # another family's name, with the keys renamed to its prefix
            arch = rnd.choice(FAMILIES)
            meta = {k.replace("llama.", f"{arch}.", 1): v for k, v in meta.items()}
            meta["general.architecture"] = (VT.STRING, arch)
            done.append(f"architecture {arch}")
    return meta, done


def test_fuzzed_gguf_metadata_loads_and_runs_or_raises_pyllm_errors(tmp_path):
    """Arrays where numbers belong, numbers past 32 and 64 bits, NaN and infinite floats, empty and
    nested arrays, vocabularies longer than the embedding or without merges, other families' names:
    each case is a load that runs or a PyllmError, never a TypeError, OverflowError, RecursionError,
    MemoryError or a plain ValueError."""
    tensors = tiny_tensors()

    def case(seed: int) -> str:
        meta, _ = mutated_metadata(seed)
        path = tmp_path / f"{seed}.gguf"
        write_gguf(path, meta, tensors)
        try:
            return run_model(str(path))
        finally:
            path.unlink()

    outcomes = run_cases(7_000_000, 800, case, describe=lambda seed: "; ".join(mutated_metadata(seed)[1]))
    assert outcomes["ran"] > 0 and outcomes["refused"] > 0, outcomes
