"""The safetensors reader: round trips against the `safetensors` package, sharded checkpoints, and a
FormatError (naming the file) for every malformed header, including fuzzed ones."""
from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import save_file as save_torch

from pyllm.dtypes import WeightType
from pyllm.errors import FormatError
from pyllm.formats.safetensors import Checkpoint, SafetensorsFile, open_checkpoint

from fuzzing import run_cases


def write_raw(
    path: Path, header: dict | list | bytes, data: bytes = b"", length: int | None = None
) -> Path:
    """A hand-made safetensors file: length prefix (the true one unless given), header, data."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def entry(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def assert_format_error(path: Path, *words: str) -> FormatError:
    with pytest.raises(FormatError) as info:
        SafetensorsFile(path)
    message = str(info.value)
    assert str(path) in message
    for word in words:
        assert word in message, message
    return info.value


# --- round trips ---------------------------------------------------------------------------------


def test_f32_f16_tensors_and_metadata_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        "a.weight": rng.standard_normal((3, 5)).astype(np.float32),
        "b.weight": rng.standard_normal((7,)).astype(np.float16),
        "c.weight": rng.standard_normal((2, 3, 4)).astype(np.float32),
    }
    path = tmp_path / "m.safetensors"
    save_numpy(arrays, path, metadata={"format": "pt", "note": "hello"})

    f = SafetensorsFile(path)
    assert f.metadata == {"format": "pt", "note": "hello"}
    assert set(f.tensors) == set(arrays)
    for name, array in arrays.items():
        info = f.tensors[name]
        assert info.shape == array.shape
        assert info.wtype == (WeightType.F32 if array.dtype == np.float32 else WeightType.F16)
        assert info.nbytes == array.nbytes
        assert info.bytes().tobytes() == array.tobytes()
        assert info.address == f.file.base_address + info.offset


def test_bf16_tensor_round_trips_bit_exact(tmp_path):
    t = torch.randn(4, 6).to(torch.bfloat16)
    path = tmp_path / "bf16.safetensors"
    save_torch({"w": t}, path)

    info = SafetensorsFile(path).tensors["w"]
    assert info.wtype == WeightType.BF16
    assert info.shape == (4, 6)
    assert info.bytes().tobytes() == t.view(torch.int16).numpy().tobytes()


def test_scalar_and_zero_size_tensors_are_read(tmp_path):
    arrays = {
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float16),
        "after": np.arange(3, dtype=np.float32),
    }
    path = tmp_path / "edge.safetensors"
    save_numpy(arrays, path)

    f = SafetensorsFile(path)
    assert f.metadata == {}
    assert f.tensors["scalar"].shape == ()
    assert f.tensors["scalar"].nbytes == 4
    assert f.tensors["scalar"].bytes().tobytes() == arrays["scalar"].tobytes()
    assert f.tensors["empty"].shape == (0, 4)
    assert f.tensors["empty"].nbytes == 0
    assert f.tensors["empty"].bytes().tobytes() == b""
    assert f.tensors["after"].bytes().tobytes() == arrays["after"].tobytes()


def test_offsets_are_absolute_in_the_file(tmp_path):
    data = np.arange(4, dtype=np.float32).tobytes()
    header = {"x": entry("F32", [2], 8, 16), "y": entry("F32", [2], 0, 8)}
    path = write_raw(tmp_path / "abs.safetensors", header, data)
    header_len = len(json.dumps(header).encode())

    f = SafetensorsFile(path)
    assert f.tensors["y"].offset == 8 + header_len
    assert f.tensors["x"].offset == 8 + header_len + 8
    assert f.tensors["x"].bytes().tobytes() == data[8:]


# --- checkpoints ---------------------------------------------------------------------------------


def make_sharded(folder: Path, weight_map: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    shards = {
        "model-00001-of-00002.safetensors": {
            "a": np.ones((2, 2), np.float32),
            "b": np.zeros(3, np.float16),
        },
        "model-00002-of-00002.safetensors": {"c": np.full((4,), 2.0, np.float32)},
    }
    for shard, arrays in shards.items():
        save_numpy(arrays, folder / shard, metadata={"format": "pt"})
    if weight_map is None:
        weight_map = {name: shard for shard, arrays in shards.items() for name in arrays}
    index = {"metadata": {"total_size": 34}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return {name: a for arrays in shards.values() for name, a in arrays.items()}


def test_sharded_checkpoint_reads_every_tensor_through_the_index(tmp_path):
    arrays = make_sharded(tmp_path)

    ckpt = open_checkpoint(tmp_path)
    assert isinstance(ckpt, Checkpoint)
    assert len(ckpt.files) == 2
    assert set(ckpt.tensors) == set(arrays)
    assert ckpt.metadata == {"format": "pt"}
    for name, array in arrays.items():
        assert ckpt.tensors[name].bytes().tobytes() == array.tobytes()
    assert ckpt.tensors["c"].file is ckpt.files[1].file


def test_sharded_checkpoint_with_missing_shard_raises_format_error(tmp_path):
    make_sharded(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FormatError, match="missing"):
        open_checkpoint(tmp_path)


def test_index_naming_a_tensor_absent_from_its_shard_raises_format_error(tmp_path):
    make_sharded(
        tmp_path,
        {
            "a": "model-00001-of-00002.safetensors",
            "c": "model-00001-of-00002.safetensors",  # c is really in the second shard
        },
    )
    with pytest.raises(FormatError, match="'c'"):
        open_checkpoint(tmp_path)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "sub/x.safetensors", "..", ""])
def test_shard_name_escaping_the_folder_raises_format_error(tmp_path, shard):
    folder = tmp_path / "model"
    folder.mkdir()
    save_numpy({"a": np.ones(2, np.float32)}, tmp_path / "outside.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": shard}}))
    with pytest.raises(FormatError, match="shard name"):
        open_checkpoint(folder)


def test_single_file_checkpoint_is_opened(tmp_path):
    save_numpy({"w": np.ones((2, 3), np.float32)}, tmp_path / "model.safetensors")
    ckpt = open_checkpoint(tmp_path)
    assert len(ckpt.files) == 1
    assert ckpt.tensors["w"].shape == (2, 3)


def test_unindexed_safetensors_files_are_all_opened(tmp_path):
    save_numpy({"a": np.ones(2, np.float32)}, tmp_path / "first.safetensors")
    save_numpy({"b": np.ones(3, np.float32)}, tmp_path / "second.safetensors")
    ckpt = open_checkpoint(tmp_path)
    assert set(ckpt.tensors) == {"a", "b"}


def test_duplicate_tensor_across_files_raises_format_error(tmp_path):
    save_numpy({"a": np.ones(2, np.float32)}, tmp_path / "first.safetensors")
    save_numpy({"a": np.ones(2, np.float32)}, tmp_path / "second.safetensors")
    with pytest.raises(FormatError, match="'a'"):
        open_checkpoint(tmp_path)


def test_folder_without_weights_raises_format_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FormatError, match="no safetensors weights found"):
        open_checkpoint(tmp_path)


# --- malformed files -----------------------------------------------------------------------------


def test_empty_file_raises_format_error(tmp_path):
    path = tmp_path / "empty.safetensors"
    path.write_bytes(b"")
    assert_format_error(path, "too short")


def test_five_byte_file_raises_format_error(tmp_path):
    path = tmp_path / "five.safetensors"
    path.write_bytes(b"\x01\x02\x03\x04\x05")
    assert_format_error(path, "too short")


def test_truncated_data_raises_format_error(tmp_path):
    path = tmp_path / "full.safetensors"
    save_numpy({"w": np.ones((4, 4), np.float32)}, path)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:-10])
    assert_format_error(cut, "'w'", "past the data section")


def test_header_length_past_end_of_file_raises_format_error(tmp_path):
    path = write_raw(tmp_path / "long.safetensors", {}, length=1000)
    assert_format_error(path, "past the end")


def test_absurd_header_length_raises_format_error(tmp_path):
    path = write_raw(tmp_path / "huge.safetensors", {}, length=2**64 - 1)
    assert_format_error(path, "absurdly large")


def test_garbage_json_raises_format_error(tmp_path):
    path = write_raw(tmp_path / "garbage.safetensors", b"{not json at all")
    assert_format_error(path, "not valid JSON")


def test_invalid_utf8_header_raises_format_error(tmp_path):
    path = write_raw(tmp_path / "utf8.safetensors", b'{"\xff": 1}')
    assert_format_error(path, "UTF-8")


def test_json_list_header_raises_format_error(tmp_path):
    path = write_raw(tmp_path / "list.safetensors", [1, 2, 3])
    assert_format_error(path, "not an object")


def test_entry_that_is_not_an_object_raises_format_error(tmp_path):
    path = write_raw(tmp_path / "entry.safetensors", {"w": [1, 2]})
    assert_format_error(path, "'w'", "not an object")


@pytest.mark.parametrize("key", ["dtype", "shape", "data_offsets"])
def test_entry_missing_a_field_raises_format_error(tmp_path, key):
    e = entry("F32", [2], 0, 8)
    del e[key]
    path = write_raw(tmp_path / "missing.safetensors", {"w": e}, bytes(8))
    assert_format_error(path, "'w'", key)


def test_unknown_dtype_raises_format_error(tmp_path):
    path = write_raw(tmp_path / "q9.safetensors", {"w": entry("Q9", [2], 0, 8)}, bytes(8))
    assert_format_error(path, "'w'", "unknown dtype", "Q9")


@pytest.mark.parametrize("dtype", ["I64", "F8_E4M3"])
def test_unsupported_dtype_raises_format_error(tmp_path, dtype):
    path = write_raw(tmp_path / "i64.safetensors", {"w": entry(dtype, [1], 0, 8)}, bytes(8))
    assert_format_error(path, "'w'", dtype, "unsupported")


def test_shape_byte_span_mismatch_raises_format_error(tmp_path):
    path = write_raw(tmp_path / "span.safetensors", {"w": entry("F32", [3], 0, 8)}, bytes(8))
    assert_format_error(path, "'w'", "needs 12 bytes")


def test_giant_shape_raises_format_error(tmp_path):
    header = {"w": entry("F32", [2**62] * 1000, 0, 8)}
    path = write_raw(tmp_path / "giant.safetensors", header, bytes(8))
    assert_format_error(path, "'w'", "more elements")


def test_overlapping_offsets_raise_format_error(tmp_path):
    header = {"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}
    path = write_raw(tmp_path / "overlap.safetensors", header, bytes(12))
    assert_format_error(path, "overlapping", "'a'", "'b'")


def test_out_of_range_offsets_raise_format_error(tmp_path):
    path = write_raw(tmp_path / "range.safetensors", {"w": entry("F32", [2], 8, 16)}, bytes(8))
    assert_format_error(path, "'w'", "past the data section")


@pytest.mark.parametrize("shape", [[-1], [2, -3], [2.0], [True], "2", None])
def test_bad_shape_raises_format_error(tmp_path, shape):
    path = write_raw(tmp_path / "shape.safetensors", {"w": entry("F32", shape, 0, 8)}, bytes(8))
    assert_format_error(path, "'w'", "shape")


def test_begin_after_end_raises_format_error(tmp_path):
    path = write_raw(tmp_path / "order.safetensors", {"w": entry("F32", [0], 8, 0)}, bytes(8))
    assert_format_error(path, "'w'", "begin <= end")


@pytest.mark.parametrize("offsets", [[-4, 0], [0], [0, 4, 8], [0.0, 4.0], "0,4"])
def test_malformed_data_offsets_raise_format_error(tmp_path, offsets):
    header = {"w": {"dtype": "F32", "shape": [1], "data_offsets": offsets}}
    path = write_raw(tmp_path / "offsets.safetensors", header, bytes(8))
    assert_format_error(path, "'w'", "data_offsets")


def test_duplicate_tensor_name_in_header_raises_format_error(tmp_path):
    one = b'{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
    raw = b'{"w": ' + one + b', "w": ' + one.replace(b"[0, 4]", b"[4, 8]") + b"}"
    path = write_raw(tmp_path / "dup.safetensors", raw, bytes(8))
    assert_format_error(path, "duplicate")


def test_non_string_metadata_raises_format_error(tmp_path):
    path = write_raw(tmp_path / "meta.safetensors", {"__metadata__": {"n": 1}})
    assert_format_error(path, "__metadata__")


def test_deeply_nested_header_raises_format_error(tmp_path):
    path = write_raw(tmp_path / "deep.safetensors", b"[" * 100_000 + b"]" * 100_000)
    assert_format_error(path, "JSON")


# --- fuzzing -------------------------------------------------------------------------------------


def test_mutated_files_parse_or_raise_format_error_only(tmp_path):
    good = tmp_path / "good.safetensors"
    save_numpy(
        {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.float16)},
        good,
        metadata={"k": "v"},
    )
    original = good.read_bytes()
    (header_len,) = struct.unpack("<Q", original[:8])
    digits = [8 + i for i, c in enumerate(original[8 : 8 + header_len]) if chr(c).isdigit()]

    def case(seed: int) -> str:
        rng = random.Random(seed)
        data = bytearray(original)
        kind = rng.choice(["flip", "digit", "truncate", "length", "mixed"])
        if kind == "digit":
            # Swapping one digit for another keeps the JSON valid, so the offset, shape and span
            # checks are reached, not just the JSON parser.
            pos = rng.choice(digits)
            data[pos] = ord(rng.choice("0123456789"))
        if kind in ("flip", "mixed"):
            for _ in range(rng.randint(1, 8)):
                data[8 + rng.randrange(header_len)] = rng.randrange(256)
        if kind == "length":
            new_len = rng.choice(
                [0, 1, header_len - 1, header_len + 1, len(data), 2**63, rng.randrange(2**64)]
            )
            data[:8] = struct.pack("<Q", new_len)
        if kind in ("truncate", "mixed"):
            data = data[: rng.randrange(len(data) + 1)]
        target = tmp_path / f"fuzz{seed}.safetensors"
        target.write_bytes(bytes(data))
        try:
            SafetensorsFile(target)
        except FormatError as e:
            assert str(target) in str(e)
            return "rejected"
        return "parsed"

    outcomes = run_cases(1234, 500, case)
    assert outcomes["rejected"] > 0 and outcomes["parsed"] > 0
