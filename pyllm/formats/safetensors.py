"""Safetensors reader: mmap the file, parse and validate its header, describe each tensor in place.

The header is parsed here rather than by the `safetensors` package so that pyllm needs no extra
dependency at run time and so that every byte range is checked before an address reaches C.

Layout: an 8-byte little-endian u64 N, then N bytes of UTF-8 JSON, then the data section. Each JSON
entry is ``name: {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}`` with offsets relative
to the start of the data section (8 + N); an optional ``__metadata__`` entry maps str to str.

>>> ckpt = open_checkpoint("path/to/model")          # doctest: +SKIP
>>> info = ckpt.tensors["model.embed_tokens.weight"]  # doctest: +SKIP
>>> info.wtype, info.shape                            # doctest: +SKIP
(<WeightType.BF16: 30>, (49152, 576))
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

from ..checks import is_int
from ..dtypes import SAFETENSORS_DTYPES, WeightType, tensor_nbytes
from ..errors import FormatError
from .mapped import MappedFile, TensorInfo

# The reference implementation refuses headers over 100 MB; a bigger length prefix means corruption,
# and refusing it early avoids copying and parsing a huge span of weights as JSON.
MAX_HEADER_BYTES = 100 * 1024 * 1024

# Dtypes the safetensors format defines but pyllm does not run, so that such a file gets "unsupported"
# rather than "unknown" in its error.
KNOWN_SAFETENSORS_DTYPES = frozenset({
    "BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F64", "C64",
    "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "F16", "BF16", "F32",
})

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of duplicate keys silently; a header naming a tensor twice is corrupt.
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


class SafetensorsFile:
    """One .safetensors file, mapped read-only, its header validated.

    Attributes: ``path``, ``file`` (the MappedFile), ``tensors`` (name → TensorInfo, offsets absolute
    in the file) and ``metadata`` (the ``__metadata__`` entry, or {}).
    """

    path: str
    file: MappedFile
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            self.file = MappedFile(self.path)
        except OSError as e:
            raise FormatError(self.path, f"cannot open: {e.strerror or e}") from e
        header, data_start = self._read_header()
        self.metadata = self._parse_metadata(header.pop("__metadata__", {}))
        self.tensors = self._parse_tensors(header, data_start)

    def _fail(self, problem: str) -> FormatError:
        return FormatError(self.path, problem)

    def _read_header(self) -> tuple[dict[str, Any], int]:
        size = self.file.size
        if size < 8:
            raise self._fail(f"file of {size} bytes is too short for the 8-byte header length")
        (n,) = struct.unpack("<Q", self.file.view(0, 8))
        if n > MAX_HEADER_BYTES:
            raise self._fail(f"header length {n} is absurdly large (limit {MAX_HEADER_BYTES})")
        if 8 + n > size:
            raise self._fail(f"header length {n} runs past the end of a file of {size} bytes")
        raw = self.file.view(8, n).tobytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self._fail(f"header is not valid UTF-8 ({e.reason} at byte {e.start})") from None
        try:
            header = json.loads(text, object_pairs_hook=_reject_duplicate_keys)
        except (ValueError, RecursionError) as e:
            raise self._fail(f"header is not valid JSON ({e})") from None
        if not isinstance(header, dict):
            raise self._fail(f"header is a JSON {type(header).__name__}, not an object")
        return header, 8 + n

    def _parse_metadata(self, meta: Any) -> dict[str, str]:
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise self._fail("__metadata__ is not an object of string values")
        return dict(meta)

    def _parse_tensors(self, header: dict[str, Any], data_start: int) -> dict[str, TensorInfo]:
        data_len = self.file.size - data_start
        tensors: dict[str, TensorInfo] = {}
        spans: list[tuple[int, int, str]] = []
        for name, entry in header.items():
            wtype, shape, begin, end = self._parse_entry(name, entry)
            if end > data_len:
                raise self._fail(
                    f"tensor {name!r}: data_offsets [{begin}, {end}) run past the data section of "
                    f"{data_len} bytes (file truncated?)"
                )
            # Refuse a shape whose element count exceeds the whole data section before multiplying
            # further, so a hostile header with huge dimensions costs nothing.
            if 0 not in shape:
                count = 1
                for d in shape:
                    count *= d
                    if count > data_len:
                        raise self._fail(
                            f"tensor {name!r}: shape {list(shape)} holds more elements than the "
                            f"data section has bytes ({data_len})"
                        )
            nbytes = tensor_nbytes(wtype, shape)
            if nbytes != end - begin:
                raise self._fail(
                    f"tensor {name!r}: shape {list(shape)} of {entry['dtype']} needs {nbytes} bytes "
                    f"but data_offsets [{begin}, {end}) span {end - begin}"
                )
            tensors[name] = TensorInfo(name, wtype, shape, data_start + begin, nbytes, self.file)
            if end > begin:  # an empty range overlaps nothing
                spans.append((begin, end, name))
        spans.sort()
        for (_, prev_end, prev), (begin, _, name) in zip(spans, spans[1:]):
            if begin < prev_end:
                raise self._fail(f"tensors {prev!r} and {name!r} have overlapping data_offsets")
        return tensors

    def _parse_entry(self, name: str, entry: Any) -> tuple[WeightType, tuple[int, ...], int, int]:
        if not isinstance(entry, dict):
            raise self._fail(f"tensor {name!r}: header entry is not an object")
        for key in ("dtype", "shape", "data_offsets"):
            if key not in entry:
                raise self._fail(f"tensor {name!r}: header entry has no {key!r}")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str):
            raise self._fail(f"tensor {name!r}: dtype {dtype!r} is not a string")
        if dtype not in SAFETENSORS_DTYPES:
            if dtype in KNOWN_SAFETENSORS_DTYPES:
                raise self._fail(
                    f"tensor {name!r}: dtype {dtype} is unsupported "
                    f"(pyllm reads {', '.join(SAFETENSORS_DTYPES)})"
                )
            raise self._fail(f"tensor {name!r}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(is_int(d) and d >= 0 for d in shape):
            raise self._fail(f"tensor {name!r}: shape {shape!r} is not a list of non-negative ints")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(is_int(o) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise self._fail(
                f"tensor {name!r}: data_offsets {offsets!r} is not two ints with 0 <= begin <= end"
            )
        return SAFETENSORS_DTYPES[dtype], tuple(shape), offsets[0], offsets[1]

    def __repr__(self) -> str:
        return f"SafetensorsFile({self.path!r}, {len(self.tensors)} tensors)"


class Checkpoint:
    """The safetensors weights of one model folder, possibly sharded.

    Attributes: ``files`` (each shard, opened once), ``tensors`` (name → TensorInfo across all
    shards; names are unique) and ``metadata`` (the shards' ``__metadata__`` merged, first shard wins).
    """

    def __init__(self, files: list[SafetensorsFile], folder: str):
        self.folder = folder
        self.files = files
        self.tensors: dict[str, TensorInfo] = {}
        self.metadata: dict[str, str] = {}
        for f in files:
            for name, info in f.tensors.items():
                if name in self.tensors:
                    raise FormatError(
                        f.path, f"tensor {name!r} is also in {self.tensors[name].file.path}"
                    )
                self.tensors[name] = info
            for key, value in f.metadata.items():
                self.metadata.setdefault(key, value)

    def __repr__(self) -> str:
        return f"Checkpoint({self.folder!r}, {len(self.files)} files, {len(self.tensors)} tensors)"


def _read_index(index_path: Path) -> dict[str, str]:
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise FormatError(index_path, f"cannot read the index ({e})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(v, str) for v in weight_map.values()
    ):
        raise FormatError(index_path, "no 'weight_map' object of tensor name -> shard file name")
    return weight_map


def _check_shard_name(index_path: Path, shard: str) -> None:
    # The index comes from a download; a shard name must not reach outside the model folder.
    if (
        not shard
        or shard in (".", "..")
        or "/" in shard
        or "\\" in shard
        or os.sep in shard
        or (os.altsep and os.altsep in shard)
        or "\0" in shard
        or os.path.isabs(shard)
        or os.path.splitdrive(shard)[0]
    ):
        raise FormatError(index_path, f"shard name {shard!r} is not a plain file name in the folder")


def open_checkpoint(folder: str | os.PathLike) -> Checkpoint:
    """Open the safetensors weights of a model folder.

    Uses ``model.safetensors.index.json`` when present (sharded), else ``model.safetensors``, else
    every ``*.safetensors`` file in the folder. Raises FormatError when none is found or any is bad.
    """
    root = Path(folder)
    if not root.is_dir():
        raise FormatError(root, "not a folder")
    index_path = root / INDEX_NAME
    if index_path.is_file():
        weight_map = _read_index(index_path)
        shards: dict[str, SafetensorsFile] = {}
        for shard in dict.fromkeys(weight_map.values()):  # each shard once, in index order
            _check_shard_name(index_path, shard)
            if not (root / shard).is_file():
                raise FormatError(index_path, f"shard {shard!r} is missing from {root}")
            shards[shard] = SafetensorsFile(root / shard)
        for name, shard in weight_map.items():
            if name not in shards[shard].tensors:
                raise FormatError(shards[shard].path, f"tensor {name!r} listed in the index is absent")
        return Checkpoint(list(shards.values()), str(root))
    if (root / SINGLE_NAME).is_file():
        return Checkpoint([SafetensorsFile(root / SINGLE_NAME)], str(root))
    paths = sorted(p for p in root.glob("*.safetensors") if p.is_file())
    if not paths:
        raise FormatError(root, "no safetensors weights found")
    return Checkpoint([SafetensorsFile(p) for p in paths], str(root))
