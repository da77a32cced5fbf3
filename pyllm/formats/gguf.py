"""GGUF reader: mmap a .gguf file, parse and validate its header, describe its tensors.

GGUF (llama.cpp's format), versions 2 and 3, little-endian only. Layout::

    "GGUF"  u32 version  u64 tensor_count  u64 metadata_kv_count
    metadata_kv_count × (string key, u32 value_type, value)
    tensor_count × (string name, u32 n_dims, n_dims × u64 ne, u32 ggml_type, u64 offset)
    padding to `general.alignment` (default 32), then the data section

Strings are a u64 byte length and UTF-8 bytes; an array value is a u32 element type, a u64 count and
the elements (arrays may hold arrays). `ne[0]` is the innermost dimension; tensor offsets are relative to
the data section and multiples of the alignment.

Every count, length, type, shape and offset is checked against the file before it is used, so a
truncated or hostile file raises FormatError with the byte position and the problem, never an
IndexError, struct.error, MemoryError or a giant allocation. The C core later receives addresses that
were proven to lie inside the mapping.

Metadata values become plain Python objects: ints, floats, bools and strs; every array — numeric,
bool, string or nested — becomes a Python ``list`` (of lists, for arrays of arrays). Large numeric
arrays (token scores, token types) are decoded with numpy and converted with ``tolist()``, so they are
lists too; wrap them in ``np.asarray`` where an array is wanted.

Example::

    g = GGUFFile("SmolLM2-135M-Instruct.Q4_1.gguf")
    g.get("general.architecture")            # 'llama'
    len(g.get("tokenizer.ggml.tokens"))      # 49152
    g.tensors["blk.0.ffn_up.weight"].shape   # (1536, 576), outermost first
"""
from __future__ import annotations

import enum
import os
import struct

import numpy as np

from .._strings import gguf_strings
from ..dtypes import BLOCK_LAYOUT, WeightType, tensor_nbytes
from ..errors import FormatError
from .mapped import MappedFile, TensorInfo

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
# Real files nest arrays at most one level deep; the limit bounds recursion on hostile input.
MAX_ARRAY_DEPTH = 8


class ValueType(enum.IntEnum):
    """Metadata value types, numbered as the GGUF spec numbers them."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# Fixed-size types: the struct for one scalar and the numpy dtype for an array of them.
_FIXED: dict[int, tuple[struct.Struct, np.dtype]] = {
    ValueType.UINT8: (struct.Struct("<B"), np.dtype("<u1")),
    ValueType.INT8: (struct.Struct("<b"), np.dtype("<i1")),
    ValueType.UINT16: (struct.Struct("<H"), np.dtype("<u2")),
    ValueType.INT16: (struct.Struct("<h"), np.dtype("<i2")),
    ValueType.UINT32: (struct.Struct("<I"), np.dtype("<u4")),
    ValueType.INT32: (struct.Struct("<i"), np.dtype("<i4")),
    ValueType.FLOAT32: (struct.Struct("<f"), np.dtype("<f4")),
    ValueType.BOOL: (struct.Struct("<B"), np.dtype("<u1")),
    ValueType.UINT64: (struct.Struct("<Q"), np.dtype("<u8")),
    ValueType.INT64: (struct.Struct("<q"), np.dtype("<i8")),
    ValueType.FLOAT64: (struct.Struct("<d"), np.dtype("<f8")),
}

# The fewest bytes one element of each type can take: a count times this must fit in what is left of
# the file before anything is allocated for it.
_MIN_SIZE: dict[int, int] = {t: s.size for t, (s, _) in _FIXED.items()}
_MIN_SIZE[ValueType.STRING] = 8  # the length of an empty string
_MIN_SIZE[ValueType.ARRAY] = 4 + 8  # element type and count of an empty array

_MIN_KV_SIZE = 8 + 4 + 1  # empty key, value type, one-byte value
_MIN_TENSOR_INFO_SIZE = 8 + 4 + 8 + 4 + 8  # empty name, n_dims, one ne, type, offset


class _Cursor:
    """Reads little-endian fields from a buffer, checking every read against its end."""

    def __init__(self, path: str, buf: memoryview):
        self.path = path
        self.buf = buf
        self.pos = 0
        self.end = len(buf)

    def fail(self, problem: str) -> FormatError:
        return FormatError(self.path, problem)

    def need(self, n: int, what: str) -> None:
        if n > self.end - self.pos:
            raise self.fail(
                f"truncated: {what} at byte {self.pos} needs {n} bytes, "
                f"only {self.end - self.pos} remain"
            )

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def string(self, what: str) -> str:
        return self.strings(1, what, each=False)[0]

    def value(self, vtype: int, what: str, depth: int = 0) -> object:
        fixed = _FIXED.get(vtype)
        if fixed is not None:
            st = fixed[0]
            self.need(st.size, what)
            (v,) = st.unpack_from(self.buf, self.pos)
            if vtype == ValueType.BOOL:
                if v > 1:
                    raise self.fail(f"{what} at byte {self.pos} is a bool stored as {v}, not 0 or 1")
                v = bool(v)
            self.pos += st.size
            return v
        if vtype == ValueType.STRING:
            return self.string(what)
        if vtype == ValueType.ARRAY:
            return self.array(what, depth + 1)
        raise self.fail(f"{what} at byte {self.pos - 4} has unknown value type {vtype}")

    def array(self, what: str, depth: int) -> list:
        start = self.pos
        if depth > MAX_ARRAY_DEPTH:
            raise self.fail(f"{what} at byte {start}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
        etype = self.u32(f"element type of {what}")
        if etype not in _MIN_SIZE:
            raise self.fail(f"{what} at byte {start} has unknown element type {etype}")
        count = self.u64(f"count of {what}")
        left = self.end - self.pos
        if count * _MIN_SIZE[etype] > left:
            raise self.fail(
                f"{what} at byte {start} claims {count} {ValueType(etype).name} elements, "
                f"which cannot fit in the {left} bytes left in the file"
            )
        fixed = _FIXED.get(etype)
        if fixed is not None:
            dtype = fixed[1]
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
            if etype == ValueType.BOOL:
                if count and int(arr.max()) > 1:
                    raise self.fail(f"{what} at byte {start} holds a bool that is not 0 or 1")
                arr = arr.astype(bool)
            self.pos += count * dtype.itemsize
            return arr.tolist()
        if etype == ValueType.STRING:
            return self.strings(count, what)
        return [self.array(f"{what}[{i}]", depth + 1) for i in range(count)]

    def strings(self, count: int, what: str, each: bool = True) -> list[str]:
        """count strings (a u64 length, then UTF-8) parsed by the core in one call: a vocabulary
        holds up to ~262k. Errors name what[i], or what alone for a single string (each=False)."""
        out, pos, problem, i, detail = gguf_strings(self.buf, self.pos, count, self.end)
        name = f"{what}[{i}]" if each else what
        if problem == "truncated":
            raise self.fail(f"truncated: {name} at byte {pos} has no room for its length")
        if problem == "claims":
            raise self.fail(f"{name} at byte {pos} claims {detail} bytes, only {self.end - pos - 8} remain")
        if problem == "utf-8":
            raise self.fail(f"{name} at byte {pos} is not valid UTF-8 ({detail})")
        self.pos = pos
        return out


class GGUFFile:
    """A validated GGUF file.

    Attributes:
        path: the file's path.
        file: the MappedFile the tensors point into (keep it alive while they are used).
        version: 2 or 3.
        metadata: key → value, in file order; arrays are Python lists (see the module docstring).
        alignment: `general.alignment`, or 32.
        data_offset: absolute byte offset of the data section.
        tensors: name → TensorInfo in file order; shape outermost first (ne reversed, as safetensors
            and transformers write it), offset absolute in the file.

    Tensors need at least one element per dimension: a zero dimension is rejected (no model has empty
    tensors, and it would let many tensors share one offset).

    >>> g = GGUFFile("model.gguf")                      # doctest: +SKIP
    >>> g.get("llama.block_count"), g.tensors["token_embd.weight"].wtype   # doctest: +SKIP
    (30, <WeightType.Q8_0: 8>)
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.file = MappedFile(self.path)
        cur = _Cursor(self.path, self.file.view(0, self.file.size))
        self.version = self._read_preamble(cur)
        tensor_count = cur.u64("tensor count")
        kv_count = cur.u64("metadata count")
        left = cur.end - cur.pos
        if kv_count * _MIN_KV_SIZE + tensor_count * _MIN_TENSOR_INFO_SIZE > left:
            raise cur.fail(
                f"header claims {kv_count} metadata entries and {tensor_count} tensors, "
                f"which cannot fit in the {left} bytes left in the file"
            )
        self.metadata: dict[str, object] = {}
        alignment_type = None
        for i in range(kv_count):
            key = cur.string(f"metadata key #{i}")
            if key in self.metadata:
                raise cur.fail(f"duplicate metadata key {key!r}")
            vtype = cur.u32(f"value type of {key!r}")
            self.metadata[key] = cur.value(vtype, f"value of {key!r}")
            if key == "general.alignment":
                alignment_type = vtype
        self.alignment = self._alignment(cur, alignment_type)

        raw: list[tuple[str, tuple[int, ...], WeightType, int]] = []
        names: set[str] = set()
        for i in range(tensor_count):
            raw.append(self._read_tensor_info(cur, i, names))
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, wtype, rel in raw:
            self.tensors[name] = self._place(cur, name, shape, wtype, rel)
        self._check_overlaps(cur)

    def get(self, key: str, default: object = None) -> object:
        """The metadata value of key, or default."""
        return self.metadata.get(key, default)

    def __repr__(self) -> str:
        return (
            f"GGUFFile({self.path!r}, version={self.version}, "
            f"{len(self.metadata)} metadata keys, {len(self.tensors)} tensors)"
        )

    @staticmethod
    def _read_preamble(cur: _Cursor) -> int:
        cur.need(8, "magic and version")
        magic = bytes(cur.buf[0:4])
        if magic != GGUF_MAGIC:
            raise cur.fail(f"not a GGUF file: magic is {magic!r}, expected {GGUF_MAGIC!r}")
        cur.pos = 4
        version = cur.u32("version")
        if version not in SUPPORTED_VERSIONS:
            if version & 0xFFFF == 0 and struct.unpack(">I", struct.pack("<I", version))[0] in (2, 3):
                raise cur.fail("big-endian GGUF file; only little-endian GGUF files are supported")
            if version == 1:
                raise cur.fail("GGUF version 1 (32-bit counts, 2023) is not supported; re-convert the model")
            raise cur.fail(f"unsupported GGUF version {version}; versions 2 and 3 are read")
        return version

    def _alignment(self, cur: _Cursor, vtype: int | None) -> int:
        if vtype is None:
            return DEFAULT_ALIGNMENT
        if vtype != ValueType.UINT32:
            raise cur.fail(f"general.alignment is a {ValueType(vtype).name}, expected UINT32")
        a = self.metadata["general.alignment"]
        assert isinstance(a, int)
        if a == 0 or a & (a - 1):
            raise cur.fail(f"general.alignment {a} is not a power of two")
        return a

    @staticmethod
    def _read_tensor_info(
        cur: _Cursor, i: int, names: set[str]
    ) -> tuple[str, tuple[int, ...], WeightType, int]:
        start = cur.pos
        name = cur.string(f"name of tensor #{i}")
        if name in names:
            raise cur.fail(f"duplicate tensor name {name!r}")
        names.add(name)
        n_dims = cur.u32(f"n_dims of tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cur.fail(f"tensor {name!r} at byte {start} has {n_dims} dimensions, expected 1 to {MAX_DIMS}")
        ne = [cur.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims)]
        if 0 in ne:
            raise cur.fail(f"tensor {name!r} has a zero dimension: ne={ne}")
        type_id = cur.u32(f"type of tensor {name!r}")
        try:
            wtype = WeightType(type_id)
        except ValueError:
            wtype = None
        if wtype not in BLOCK_LAYOUT:
            raise cur.fail(f"tensor {name!r} has unknown or unsupported ggml type {type_id}")
        block = BLOCK_LAYOUT[wtype][0]
        if ne[0] % block:
            raise cur.fail(
                f"tensor {name!r}: row length ne[0]={ne[0]} is not a multiple of the "
                f"{wtype.name} block size {block}"
            )
        rel = cur.u64(f"offset of tensor {name!r}")
        return name, tuple(reversed(ne)), wtype, rel

    def _place(self, cur: _Cursor, name: str, shape: tuple[int, ...], wtype: WeightType, rel: int) -> TensorInfo:
        if rel % self.alignment:
            raise cur.fail(f"tensor {name!r} offset {rel} is not a multiple of the alignment {self.alignment}")
        # Python ints: a product of four u64 dimensions cannot overflow here, only exceed the file.
        nbytes = tensor_nbytes(wtype, shape)
        offset = self.data_offset + rel
        if offset + nbytes > self.file.size:
            raise cur.fail(
                f"tensor {name!r} data [{offset}, {offset + nbytes}) lies outside the file of "
                f"{self.file.size} bytes"
            )
        return TensorInfo(name, wtype, shape, offset, nbytes, self.file)

    def _check_overlaps(self, cur: _Cursor) -> None:
        spans = sorted(self.tensors.values(), key=lambda t: (t.offset, t.nbytes))
        for a, b in zip(spans, spans[1:]):
            if b.offset < a.offset + a.nbytes:
                raise cur.fail(
                    f"tensors {a.name!r} [{a.offset}, {a.offset + a.nbytes}) and {b.name!r} "
                    f"[{b.offset}, {b.offset + b.nbytes}) overlap"
                )
