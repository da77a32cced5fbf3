"""The GGUF reader: values and tensors read back exactly as written, the real SmolLM2 file agrees with
gguf.GGUFReader, and every malformed or mutated header raises FormatError and nothing else."""
from __future__ import annotations

import math
import random
import shutil
import struct
import time
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import GGUFValueType as VT

from pyllm.dtypes import BLOCK_LAYOUT, WeightType
from pyllm.errors import FormatError
from pyllm.formats.gguf import MAX_ARRAY_DEPTH, GGUFFile

from fuzzing import run_cases


# ---- hand-packed GGUF pieces ------------------------------------------------------------------


def s(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def arr(etype: int, count: int, payload: bytes) -> bytes:
    return struct.pack("<IQ", etype, count) + payload


def tinfo(name: str, ne: list[int], ttype: int, offset: int, n_dims: int | None = None) -> bytes:
    n = len(ne) if n_dims is None else n_dims
    dims = b"".join(struct.pack("<Q", d) for d in ne)
    return s(name) + struct.pack("<I", n) + dims + struct.pack("<IQ", ttype, offset)


def build(
    kvs: list[bytes],
    tinfos: list[bytes],
    data: bytes,
    *,
    version: int = 3,
    magic: bytes = b"GGUF",
    alignment: int = 32,
    n_tensors: int | None = None,
    n_kv: int | None = None,
) -> bytes:
    head = magic + struct.pack(
        "<IQQ", version, len(tinfos) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv
    )
    head += b"".join(kvs) + b"".join(tinfos)
    head += b"\0" * (-len(head) % alignment)
    return head + data


ARCH = kv("general.architecture", 8, s("test"))
# Two f32 tensors: a (2, 8) at 0 (64 bytes) and b (8,) at 64 (32 bytes).
GOOD_TENSORS = [tinfo("a", [8, 2], 0, 0), tinfo("b", [8], 0, 64)]
GOOD_DATA = np.arange(24, dtype="<f4").tobytes()


def good_file() -> bytes:
    return build([ARCH], GOOD_TENSORS, GOOD_DATA)


def write(tmp_path: Path, data: bytes, name: str = "t.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


# ---- files written by gguf.GGUFWriter ---------------------------------------------------------

# key → (value as written, vtype, sub_type, value expected back)
WRITER_VALUES: dict[str, tuple[object, VT, VT | None, object]] = {
    "t.u8": (255, VT.UINT8, None, 255),
    "t.i8": (-128, VT.INT8, None, -128),
    "t.u16": (65535, VT.UINT16, None, 65535),
    "t.i16": (-32768, VT.INT16, None, -32768),
    "t.u32": (2**32 - 1, VT.UINT32, None, 2**32 - 1),
    "t.i32": (-(2**31), VT.INT32, None, -(2**31)),
    "t.f32": (-1.25, VT.FLOAT32, None, -1.25),
    "t.f32_inf": (math.inf, VT.FLOAT32, None, math.inf),
    "t.f32_tiny": (0.1, VT.FLOAT32, None, float(np.float32(0.1))),
    "t.bool_true": (True, VT.BOOL, None, True),
    "t.bool_false": (False, VT.BOOL, None, False),
    "t.str": ("héllo ✓ 世界 🙂", VT.STRING, None, "héllo ✓ 世界 🙂"),
    "t.str_empty": ("", VT.STRING, None, ""),
    "t.u64": (2**64 - 1, VT.UINT64, None, 2**64 - 1),
    "t.i64": (-(2**63), VT.INT64, None, -(2**63)),
    "t.f64": (math.pi, VT.FLOAT64, None, math.pi),
    "t.arr_u8": ([0, 1, 255], VT.ARRAY, VT.UINT8, [0, 1, 255]),
    "t.arr_i8": ([-128, 0, 127], VT.ARRAY, VT.INT8, [-128, 0, 127]),
    "t.arr_u16": ([0, 65535], VT.ARRAY, VT.UINT16, [0, 65535]),
    "t.arr_i16": ([-32768, 32767], VT.ARRAY, VT.INT16, [-32768, 32767]),
    "t.arr_u32": ([0, 2**32 - 1], VT.ARRAY, VT.UINT32, [0, 2**32 - 1]),
    "t.arr_i32": ([-(2**31), 7], VT.ARRAY, VT.INT32, [-(2**31), 7]),
    "t.arr_f32": ([0.5, -2.0, -math.inf], VT.ARRAY, VT.FLOAT32, [0.5, -2.0, -math.inf]),
    "t.arr_bool": ([True, False, True], VT.ARRAY, VT.BOOL, [True, False, True]),
    "t.arr_str": (["a", "", "ü", "<|im_end|>"], VT.ARRAY, VT.STRING, ["a", "", "ü", "<|im_end|>"]),
    "t.arr_u64": ([0, 2**64 - 1], VT.ARRAY, VT.UINT64, [0, 2**64 - 1]),
    "t.arr_i64": ([-(2**63), 2**63 - 1], VT.ARRAY, VT.INT64, [-(2**63), 2**63 - 1]),
    "t.arr_f64": ([math.e, -0.0], VT.ARRAY, VT.FLOAT64, [math.e, -0.0]),
    "t.nested_str": ([["a", "b"], ["c"]], VT.ARRAY, None, [["a", "b"], ["c"]]),
    "t.nested_int": ([[1, 2, 3], [4]], VT.ARRAY, None, [[1, 2, 3], [4]]),
    "t.nested3": ([[[1], [2, 3]], [[4]]], VT.ARRAY, None, [[[1], [2, 3]], [[4]]]),
}


def _rng_f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def write_writer_file(path: Path, alignment: int | None = 64) -> dict[str, tuple[tuple[int, ...], WeightType]]:
    """A v3 file from GGUFWriter with every value type and f32/f16/q8_0 tensors; returns tensor shapes."""
    w = gguf.GGUFWriter(path, arch="test")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, (value, vtype, sub, _) in WRITER_VALUES.items():
        w.add_key_value(key, value, vtype, sub)
    expected = {}
    w.add_tensor("f32.2d", _rng_f32(3, 64, seed=1))
    expected["f32.2d"] = ((3, 64), WeightType.F32)
    w.add_tensor("f32.1d", _rng_f32(7, seed=2))
    expected["f32.1d"] = ((7,), WeightType.F32)
    w.add_tensor("f32.4d", _rng_f32(2, 3, 4, 5, seed=3))
    expected["f32.4d"] = ((2, 3, 4, 5), WeightType.F32)
    w.add_tensor("f16.2d", _rng_f32(5, 32, seed=4).astype(np.float16))
    expected["f16.2d"] = ((5, 32), WeightType.F16)
    q = gguf.quants.quantize(_rng_f32(4, 96, seed=5), GT.Q8_0)
    w.add_tensor("q8_0.2d", q, raw_dtype=GT.Q8_0)
    expected["q8_0.2d"] = ((4, 96), WeightType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


@pytest.fixture
def writer_file(tmp_path: Path) -> tuple[Path, dict]:
    p = tmp_path / "writer.gguf"
    return p, write_writer_file(p)


def _is_nested(field) -> bool:
    return field.types.count(VT.ARRAY) > 1


def test_every_metadata_value_type_reads_back_exactly(writer_file):
    path, _ = writer_file
    g = GGUFFile(path)
    assert g.version == 3
    assert g.alignment == 64
    assert g.get("general.architecture") == "test"
    for key, (_, _, _, expected) in WRITER_VALUES.items():
        got = g.get(key)
        assert got == expected and type(got) is type(expected), key
    assert math.copysign(1.0, g.get("t.arr_f64")[1]) == -1.0  # -0.0 kept
    assert all(type(b) is bool for b in g.get("t.arr_bool"))
    assert g.get("missing", 42) == 42


def test_writer_file_metadata_matches_gguf_reader(writer_file):
    path, _ = writer_file
    g = GGUFFile(path)
    reader = gguf.GGUFReader(path)
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    assert list(g.metadata) == keys  # file order kept
    for key in keys:
        field = reader.fields[key]
        if not _is_nested(field):  # GGUFReader flattens nested arrays; checked exactly above
            assert g.metadata[key] == field.contents(), key


def test_writer_file_tensors_match_gguf_reader(writer_file):
    path, expected = writer_file
    g = GGUFFile(path)
    reader = gguf.GGUFReader(path)
    assert g.data_offset == reader.data_offset
    assert [t.name for t in reader.tensors] == list(g.tensors)
    for rt in reader.tensors:
        info = g.tensors[rt.name]
        assert (info.shape, info.wtype) == expected[rt.name]
        assert info.shape == tuple(reversed(rt.shape.tolist()))
        assert int(info.wtype) == int(rt.tensor_type)
        assert info.offset == rt.data_offset
        assert info.offset % g.alignment == 0
        assert info.nbytes == rt.n_bytes
        assert info.bytes().tobytes() == rt.data.tobytes()
        assert info.address == g.file.base_address + info.offset


def test_f32_tensor_bytes_are_the_values_written(tmp_path):
    w = gguf.GGUFWriter(tmp_path / "v.gguf", arch="test")
    x = _rng_f32(6, 32, seed=9)
    w.add_tensor("x", x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    info = GGUFFile(tmp_path / "v.gguf").tensors["x"]
    np.testing.assert_array_equal(info.bytes().view("<f4").reshape(info.shape), x)


@pytest.mark.parametrize("wtype", sorted(BLOCK_LAYOUT), ids=lambda t: t.name)
def test_every_block_layout_type_has_gguf_readers_byte_size(tmp_path, wtype):
    block, size = BLOCK_LAYOUT[wtype]
    rows, cols = 3, 2 * max(block, 32)
    raw = np.random.default_rng(int(wtype)).integers(0, 256, (rows, cols // block * size), dtype=np.uint8)
    if wtype in (WeightType.F32, WeightType.F16, WeightType.BF16):
        raw[:] = 0  # keep float tensors free of NaN bit patterns; bytes are all that matter here
    w = gguf.GGUFWriter(tmp_path / "q.gguf", arch="test")
    w.add_tensor("w", raw, raw_dtype=GT(int(wtype)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    info = GGUFFile(tmp_path / "q.gguf").tensors["w"]
    rt = gguf.GGUFReader(tmp_path / "q.gguf").tensors[0]
    assert info.wtype == wtype
    assert info.shape == (rows, cols)
    assert info.nbytes == rt.n_bytes == raw.nbytes
    assert info.offset == rt.data_offset
    assert info.bytes().tobytes() == raw.tobytes()


def test_handwritten_version_2_file_reads(tmp_path):
    kvs = [
        ARCH,
        kv("general.alignment", 4, struct.pack("<I", 16)),
        kv("v2.count", 10, struct.pack("<Q", 12345678901)),
        kv("v2.empty_array", 9, arr(6, 0, b"")),
        kv("v2.flag", 7, b"\x01"),
        kv("v2.scores", 9, arr(6, 3, struct.pack("<3f", 0.0, -1.5, 2.25))),
        kv("v2.tokens", 9, arr(8, 3, s("<s>") + s("") + s("▁hi"))),
        kv("v2.nested", 9, arr(9, 2, arr(5, 1, struct.pack("<i", -7)) + arr(8, 0, b""))),
    ]
    tinfos = [tinfo("w", [32, 2], 8, 0), tinfo("n", [4], 0, 80)]  # q8_0 2×34 bytes, padded to 80
    data = bytes(range(68)) + b"\0" * 12 + struct.pack("<4f", 1, 2, 3, 4)
    p = write(tmp_path, build(kvs, tinfos, data, version=2, alignment=16))
    g = GGUFFile(p)
    assert g.version == 2
    assert g.alignment == 16
    assert g.metadata == {
        "general.architecture": "test",
        "general.alignment": 16,
        "v2.count": 12345678901,
        "v2.empty_array": [],
        "v2.flag": True,
        "v2.scores": [0.0, -1.5, 2.25],
        "v2.tokens": ["<s>", "", "▁hi"],
        "v2.nested": [[-7], []],
    }
    w, n = g.tensors["w"], g.tensors["n"]
    assert (w.wtype, w.shape, w.nbytes, w.offset) == (WeightType.Q8_0, (2, 32), 68, g.data_offset)
    assert (n.wtype, n.shape, n.nbytes, n.offset) == (WeightType.F32, (4,), 16, g.data_offset + 80)
    assert g.data_offset % 16 == 0
    assert n.bytes().view("<f4").tolist() == [1.0, 2.0, 3.0, 4.0]
    assert w.bytes().tobytes() == bytes(range(68))


def test_file_without_tensors_reads(tmp_path):
    g = GGUFFile(write(tmp_path, build([ARCH], [], b"")))
    assert g.tensors == {} and g.metadata == {"general.architecture": "test"}


def test_vocabulary_of_262k_strings_parses(tmp_path):
    rnd = random.Random(7)
    tokens = ["▁" + "".join(rnd.choice("abcdéfghij") for _ in range(rnd.randint(0, 12))) for _ in range(262144)]
    payload = b"".join(s(t) for t in tokens)
    p = write(tmp_path, build([ARCH, kv("tokenizer.ggml.tokens", 9, arr(8, len(tokens), payload))], [], b""))
    t0 = time.perf_counter()
    g = GGUFFile(p)
    print(f"262,144-string vocabulary parsed in {time.perf_counter() - t0:.3f} s")
    assert g.get("tokenizer.ggml.tokens") == tokens


# ---- the real SmolLM2 file --------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf) -> tuple[GGUFFile, gguf.GGUFReader]:
    t0 = time.perf_counter()
    g = GGUFFile(smollm2_gguf)
    print(f"SmolLM2 header parsed in {time.perf_counter() - t0:.3f} s")
    return g, gguf.GGUFReader(smollm2_gguf)


def test_smollm2_metadata_equals_gguf_reader(smollm2):
    g, reader = smollm2
    assert g.version == 3
    assert g.get("general.architecture") == "llama"
    assert g.get("llama.block_count") == 30
    assert g.get("llama.embedding_length") == 576
    assert len(g.get("tokenizer.ggml.tokens")) == 49152
    assert len(g.get("tokenizer.ggml.merges")) == 48900
    assert g.get("tokenizer.ggml.tokens")[1] == "<|im_start|>"
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    assert list(g.metadata) == keys
    for key in keys:
        assert g.metadata[key] == reader.fields[key].contents(), key


def test_smollm2_tensors_equal_gguf_reader(smollm2):
    g, reader = smollm2
    assert len(g.tensors) == 272
    assert g.data_offset == reader.data_offset
    assert [t.name for t in reader.tensors] == list(g.tensors)
    for rt in reader.tensors:
        info = g.tensors[rt.name]
        assert info.shape == tuple(reversed(rt.shape.tolist()))
        assert int(info.wtype) == int(rt.tensor_type)
        assert info.offset == rt.data_offset
        assert info.nbytes == rt.n_bytes
    counts = {}
    for t in g.tensors.values():
        counts[t.wtype] = counts.get(t.wtype, 0) + 1
    assert counts == {WeightType.Q4_1: 210, WeightType.F32: 61, WeightType.Q8_0: 1}
    assert g.tensors["token_embd.weight"].shape == (49152, 576)
    assert g.tensors["blk.0.ffn_up.weight"].shape == (1536, 576)
    assert g.tensors["blk.0.ffn_down.weight"].shape == (576, 1536)
    assert "output.weight" not in g.tensors


# ---- malformed files --------------------------------------------------------------------------


def meta(*kvs: bytes) -> bytes:
    """A file of these metadata entries and no tensors."""
    return build(list(kvs), [], b"")


def tens(*tinfos: bytes, data: bytes = b"\0" * 64, kvs: tuple[bytes, ...] = (ARCH,), alignment: int = 32) -> bytes:
    """A file of these tensor infos over data."""
    return build(list(kvs), list(tinfos), data, alignment=alignment)


def nested(depth: int) -> bytes:
    """An array value nested depth levels deep, an empty u8 array at the bottom."""
    value = arr(0, 0, b"")
    for _ in range(depth - 1):
        value = arr(9, 1, value)
    return value


def alignment_kv(a: int) -> bytes:
    return kv("general.alignment", 4, struct.pack("<I", a))


U64 = struct.Struct("<Q").pack


def cut_after(data: bytes, marker: bytes, keep: int) -> bytes:
    """data ending keep bytes after its first marker."""
    return data[:data.index(marker) + len(marker) + keep]


MALFORMED: dict[str, tuple[bytes, str]] = {
    "empty file": (b"", "truncated"),
    "bad magic": (b"GGML" + good_file()[4:], "not a GGUF file"),
    "version 1": (build([ARCH], GOOD_TENSORS, GOOD_DATA, version=1), "version 1"),
    "version 99": (build([ARCH], GOOD_TENSORS, GOOD_DATA, version=99), "version 99"),
    "big-endian": (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian"),
    "kv count 2**40": (build([ARCH], GOOD_TENSORS, GOOD_DATA, n_kv=2**40), "cannot fit"),
    "tensor count 2**63": (build([ARCH], GOOD_TENSORS, GOOD_DATA, n_tensors=2**63), "cannot fit"),
    "kv count one too many": (build([ARCH], [], b"", n_kv=2, alignment=1), "truncated"),
    "string length past the end": (meta(kv("k", 8, U64(1000) + b"abc")), "claims 1000 bytes"),
    "key length 2**64-1": (meta(U64(2**64 - 1) + b"k"), "claims"),
    "array count 2**62": (meta(kv("k", 9, arr(0, 2**62, b"\0" * 8))), "cannot fit"),
    "string array count 2**62": (meta(kv("k", 9, arr(8, 2**62, s("a")))), "cannot fit"),
    "nested array count 2**62": (meta(kv("k", 9, arr(9, 2**62, arr(0, 0, b"")))), "cannot fit"),
    "string in array past the end": (meta(kv("k", 9, arr(8, 2, s("a") + U64(99)))), "claims 99 bytes"),
    "string in array without room for its length": (
        cut_after(meta(kv("k", 9, arr(8, 2, s("a" * 10)))), b"a" * 10, 3), "has no room for its length"
    ),
    "unknown value type 13": (meta(kv("k", 13, b"\0" * 8)), "unknown value type 13"),
    "unknown value type 2**32-1": (meta(kv("k", 2**32 - 1, b"\0" * 8)), "unknown value type"),
    "unknown array element type": (meta(kv("k", 9, arr(42, 1, b"\0" * 8))), "unknown element type 42"),
    "arrays nested too deep": (meta(kv("k", 9, nested(MAX_ARRAY_DEPTH + 1))), "nested deeper"),
    "duplicate key": (meta(ARCH, ARCH), "duplicate metadata key"),
    "key not UTF-8": (meta(kv(b"bad\xff", 4, b"\0" * 4)), "not valid UTF-8"),
    "string value not UTF-8": (meta(kv("k", 8, s(b"\xc3\x28"))), "not valid UTF-8"),
    "string array item not UTF-8": (meta(kv("k", 9, arr(8, 2, s("ok") + s(b"\xed\xa0\x80")))), "not valid UTF-8"),
    "bool value 2": (meta(kv("k", 7, b"\x02")), "not 0 or 1"),
    "bool array value 7": (meta(kv("k", 9, arr(7, 2, b"\x01\x07"))), "not 0 or 1"),
    "alignment 0": (tens(*GOOD_TENSORS, data=GOOD_DATA, kvs=(ARCH, alignment_kv(0))), "not a power of two"),
    "alignment 3": (
        tens(*GOOD_TENSORS, data=GOOD_DATA, kvs=(ARCH, alignment_kv(3)), alignment=3),
        "not a power of two",
    ),
    "alignment as a string": (meta(kv("general.alignment", 8, s("32"))), "is a STRING, expected UINT32"),
    "unknown tensor type 4": (tens(tinfo("a", [32], 4, 0)), "ggml type 4"),
    "unknown tensor type 1000": (tens(tinfo("a", [32], 1000, 0)), "ggml type 1000"),
    "n_dims 0": (tens(tinfo("a", [], 0, 0)), "0 dimensions"),
    "n_dims 5": (tens(tinfo("a", [1, 1, 1, 1, 1], 0, 0)), "5 dimensions"),
    "n_dims 2**32-1": (tens(tinfo("a", [1], 0, 0, n_dims=2**32 - 1)), "dimensions"),
    "zero dimension": (tens(tinfo("a", [8, 0], 0, 0)), "zero dimension"),
    "row not a whole number of blocks": (tens(tinfo("a", [16, 2], 8, 0)), "not a multiple of the Q8_0 block size 32"),
    "absurd shape": (tens(tinfo("a", [2**63, 2**63, 2**63, 2**63], 0, 0)), "outside the file"),
    "offset misaligned": (tens(tinfo("a", [4], 0, 4)), "not a multiple of the alignment 32"),
    "offset 2**64-32": (tens(tinfo("a", [4], 0, 2**64 - 32)), "outside the file"),
    "tensor data past the end": (tens(tinfo("a", [8, 2], 0, 0), tinfo("b", [16], 0, 64), data=GOOD_DATA), "outside"),
    "overlapping tensors": (tens(tinfo("a", [8, 2], 0, 0), tinfo("b", [8], 0, 32), data=GOOD_DATA), "overlap"),
    "tensors at the same offset": (tens(tinfo("a", [8], 0, 0), tinfo("b", [8], 0, 0), data=GOOD_DATA), "overlap"),
    "duplicate tensor name": (tens(tinfo("a", [8], 0, 0), tinfo("a", [8], 0, 32), data=GOOD_DATA), "duplicate tensor"),
    "tensor name not UTF-8": (tens(s(b"\xff") + struct.pack("<IQIQ", 1, 8, 0, 0)), "not valid UTF-8"),
    "tensor count one too many": (build([ARCH], GOOD_TENSORS, b"", n_tensors=3, alignment=1), "truncated"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_file_raises_format_error(tmp_path, case):
    data, problem = MALFORMED[case]
    p = write(tmp_path, data)
    with pytest.raises(FormatError, match=problem) as info:
        GGUFFile(p)
    assert info.value.path == str(p)


def test_good_hand_packed_file_parses(tmp_path):
    # The baseline every malformed case departs from must itself be valid.
    g = GGUFFile(write(tmp_path, good_file()))
    assert [(t.name, t.shape) for t in g.tensors.values()] == [("a", (2, 8)), ("b", (8,))]


def test_nesting_at_the_depth_limit_parses(tmp_path):
    value = arr(0, 1, b"\x05")
    expected: object = [5]
    for _ in range(MAX_ARRAY_DEPTH - 1):
        value = arr(9, 1, value)
        expected = [expected]
    g = GGUFFile(write(tmp_path, build([kv("k", 9, value)], [], b"")))
    assert g.get("k") == expected


def test_every_truncation_before_the_last_tensor_byte_raises_format_error(tmp_path):
    path = tmp_path / "writer.gguf"
    write_writer_file(path)
    data = path.read_bytes()
    g = GGUFFile(path)
    header_end = g.data_offset
    end = max(t.offset + t.nbytes for t in g.tensors.values())
    del g
    cuts = set(range(header_end + 64)) | {end - 1, end - 100, (end + header_end) // 2}
    for n in sorted(cuts):
        p = write(tmp_path, data[:n], "cut.gguf")
        with pytest.raises(FormatError):
            GGUFFile(p)
        p.unlink()


# ---- fuzzing ----------------------------------------------------------------------------------


def write_fuzz_base(path: Path) -> None:
    """A file with a few hundred metadata entries of every kind and a score of tensors."""
    rnd = random.Random(99)
    w = gguf.GGUFWriter(path, arch="fuzz")
    for i in range(300):
        kind = i % 10
        key = f"fuzz.{i}"
        word = "".join(rnd.choice("abcxyzé✓") for _ in range(rnd.randint(0, 9)))
        if kind == 0:
            w.add_key_value(key, rnd.randint(0, 2**32 - 1), VT.UINT32)
        elif kind == 1:
            w.add_key_value(key, rnd.randint(-(2**63), 2**63 - 1), VT.INT64)
        elif kind == 2:
            w.add_key_value(key, rnd.random(), VT.FLOAT32)
        elif kind == 3:
            w.add_key_value(key, rnd.random() < 0.5, VT.BOOL)
        elif kind == 4:
            w.add_key_value(key, word, VT.STRING)
        elif kind == 5:
            w.add_key_value(key, [word + str(j) for j in range(rnd.randint(1, 20))], VT.ARRAY, VT.STRING)
        elif kind == 6:
            w.add_key_value(key, [rnd.random() for _ in range(rnd.randint(1, 20))], VT.ARRAY, VT.FLOAT32)
        elif kind == 7:
            w.add_key_value(key, [[word] * rnd.randint(1, 3), [str(i)]], VT.ARRAY)
        elif kind == 8:
            w.add_key_value(key, [[rnd.randint(0, 9)] * rnd.randint(1, 4) for _ in range(3)], VT.ARRAY)
        else:
            w.add_key_value(key, rnd.randint(0, 255), VT.UINT8)
    for i in range(20):
        rows = rnd.randint(1, 4)
        if i % 3 == 0:
            w.add_tensor(f"t{i}.q8", gguf.quants.quantize(_rng_f32(rows, 64, seed=i), GT.Q8_0), raw_dtype=GT.Q8_0)
        elif i % 3 == 1:
            w.add_tensor(f"t{i}.f16", _rng_f32(rows, 32, seed=i).astype(np.float16))
        else:
            w.add_tensor(f"t{i}.f32", _rng_f32(rows, 16, seed=i))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def field_spans(path: Path) -> list[tuple[int, int]]:
    """(offset, size) of every 4- and 8-byte header field (counts, lengths, types, offsets, dims)."""
    reader = gguf.GGUFReader(path)
    base = reader.data.__array_interface__["data"][0]
    spans = set()
    fields = list(reader.fields.values()) + [t.field for t in reader.tensors]
    for field in fields:
        for part in field.parts:
            if part.nbytes in (4, 8) and part.size == 1:
                spans.add((part.__array_interface__["data"][0] - base, part.nbytes))
    return sorted(spans)


HUGE = [2**64 - 1, 2**63, 2**62, 2**40, 2**32, 2**32 - 1, 2**31, 13, 9, 5, 0, 1]


def mutate(rnd: random.Random, data: bytes, header_end: int, spans: list[tuple[int, int]]) -> bytes:
    b = bytearray(data)
    op = rnd.randrange(5)
    if op == 0:  # flip bits, mostly in the header
        for _ in range(rnd.randint(1, 8)):
            i = rnd.randrange(header_end if rnd.random() < 0.9 else len(b))
            b[i] ^= 1 << rnd.randrange(8)
    elif op == 1:  # a header field gets an extreme or odd value
        for _ in range(rnd.randint(1, 3)):
            off, size = rnd.choice(spans)
            v = rnd.choice(HUGE + [rnd.getrandbits(64), len(b), len(b) - off]) % (1 << (8 * size))
            b[off : off + size] = v.to_bytes(size, "little")
    elif op == 2:  # a random u64 anywhere in the header
        i = rnd.randrange(header_end - 8)
        b[i : i + 8] = rnd.choice(HUGE + [rnd.getrandbits(64)]).to_bytes(8, "little")
    elif op == 3:  # truncate
        del b[rnd.randrange(len(b)) :]
    else:  # insert or delete a few bytes inside the header
        i = rnd.randrange(header_end)
        if rnd.random() < 0.5:
            del b[i : i + rnd.randint(1, 16)]
        else:
            b[i:i] = bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 16)))
    return bytes(b)


def check_parses_or_format_error(path: Path) -> bool:
    """True when the file parsed (and then its tensors provably lie inside it), False on FormatError."""
    try:
        g = GGUFFile(path)
    except FormatError:
        return False
    for t in g.tensors.values():
        assert 0 <= g.data_offset <= t.offset and t.offset + t.nbytes <= g.file.size
        assert t.nbytes > 0 and t.offset % g.alignment == 0
    return True


def test_fuzzed_synthetic_headers_parse_or_raise_format_error_in_bounded_memory(tmp_path):
    base_path = tmp_path / "base.gguf"
    write_fuzz_base(base_path)
    data = base_path.read_bytes()
    header_end = GGUFFile(base_path).data_offset
    spans = field_spans(base_path)

    def case(seed: int) -> str:
        p = write(tmp_path, mutate(random.Random(seed), data, header_end, spans), f"fuzz{seed}.gguf")
        tracemalloc.reset_peak()
        try:
            parsed = check_parses_or_format_error(p)
        finally:
            p.unlink()
        peak = tracemalloc.get_traced_memory()[1]
        assert peak < 64 * 2**20, f"parsing a {len(data)}-byte file took {peak / 1e6:.1f} MB"
        return "parsed" if parsed else "refused"

    tracemalloc.start()
    try:
        outcomes = run_cases(20_240_607, 1000, case)
    finally:
        tracemalloc.stop()
    assert outcomes["parsed"] > 0 and outcomes["refused"] > 0, outcomes


def test_fuzzed_smollm2_headers_parse_or_raise_format_error(smollm2_gguf, tmp_path):
    copy = tmp_path / "smollm2.gguf"
    shutil.copyfile(smollm2_gguf, copy)
    g = GGUFFile(copy)
    header_end = g.data_offset
    del g
    with open(copy, "rb") as f:
        header = f.read(header_end)

    def case(seed: int) -> str:
        rnd = random.Random(seed)
        b = bytearray(header)
        if rnd.random() < 0.3:  # a few bytes: often still parses or fails late in the vocabulary
            n = rnd.randint(1, 4)
        else:
            n = rnd.randint(50, 400)
        for _ in range(n):
            b[rnd.randrange(header_end)] = rnd.getrandbits(8)
        if rnd.random() < 0.3:  # and an extreme count or length somewhere in the first fields
            i = rnd.randrange(0, 4096)
            b[i : i + 8] = rnd.choice(HUGE).to_bytes(8, "little")
        with open(copy, "r+b") as f:  # same size in place: no earlier mapping is cut short
            f.write(b)
        return "parsed" if check_parses_or_format_error(copy) else "refused"

    run_cases(31_337, 30, case)
