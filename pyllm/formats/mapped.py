"""A read-only memory mapping of a model file, shared by the safetensors and GGUF readers.

Weights are used where they lie in the mapping: the C core receives addresses inside it, so the
mapping must outlive every model built from it (Model keeps a reference).
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import numpy as np

from ..dtypes import WeightType


class MappedFile:
    """An mmap of a whole file with its base address."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        with open(self.path, "rb") as f:
            self.size = os.fstat(f.fileno()).st_size
            # mmap of an empty file is an error on every OS; callers check size first.
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if self.size else None
        self._bytes = (
            np.frombuffer(self._mm, dtype=np.uint8) if self._mm is not None else np.zeros(0, np.uint8)
        )
        self.base_address = int(self._bytes.ctypes.data) if self.size else 0

    def view(self, offset: int, nbytes: int) -> memoryview:
        """Bytes [offset, offset + nbytes) without copying."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise ValueError(f"span [{offset}, {offset + nbytes}) outside a file of {self.size} bytes")
        return memoryview(self._bytes[offset : offset + nbytes])

    def release(self, offset: int, nbytes: int) -> None:
        """Lets the whole pages inside [offset, offset + nbytes) leave memory: they are read again
        from the file if touched. Where the OS has no such advice, nothing happens."""
        advice = getattr(mmap, "MADV_DONTNEED", None)
        if self._mm is None or advice is None or nbytes <= 0:
            return
        first = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE
        last = (offset + nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if last > first:
            self._mm.madvise(advice, first, last - first)

    def array(self, offset: int, nbytes: int) -> np.ndarray:
        """A read-only uint8 numpy view of bytes [offset, offset + nbytes)."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise ValueError(f"span [{offset}, {offset + nbytes}) outside a file of {self.size} bytes")
        return self._bytes[offset : offset + nbytes]


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies: validated by its reader before anything reaches C."""

    name: str
    wtype: WeightType
    shape: tuple[int, ...]  # outermost first, as safetensors and transformers write it
    offset: int  # absolute byte offset in file
    nbytes: int
    file: MappedFile

    @property
    def address(self) -> int:
        return self.file.base_address + self.offset

    def bytes(self) -> np.ndarray:
        return self.file.array(self.offset, self.nbytes)


@dataclass(frozen=True)
class WeightSummary:
    """What a file held for one tensor, without holding the file open."""

    name: str
    wtype: WeightType
    shape: tuple[int, ...]
    nbytes: int

    @classmethod
    def of(cls, info: TensorInfo) -> "WeightSummary":
        return cls(info.name, info.wtype, tuple(info.shape), info.nbytes)


class ArrayTensor:
    """A tensor pyllm made at load from one in the file (a transposed Conv1D weight, a norm with
    (1 + w) folded in): it owns its bytes, and binds like a TensorInfo."""

    def __init__(self, name: str, wtype: WeightType, array: np.ndarray):
        self.name = name
        self.wtype = wtype
        self.array = np.ascontiguousarray(array)
        self.shape = tuple(int(d) for d in self.array.shape)
        self.nbytes = int(self.array.nbytes)
        self.offset = 0

    @property
    def address(self) -> int:
        return int(self.array.ctypes.data)

    def bytes(self) -> np.ndarray:
        return self.array.reshape(-1).view(np.uint8)
