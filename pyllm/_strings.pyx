# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The loaders' string work in C: a GGUF file's string arrays (pyllm.formats.gguf) and the splits of a
vocabulary's tokens (pyllm.tokenizer_gguf)."""
# No typed memoryviews here: their support code would make this small module's C as big as _core's.
from libc.stdint cimport int64_t, uintptr_t
from libc.string cimport memcpy

import numpy as np

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.unicode cimport PyUnicode_DecodeUTF8

from pyllm._csrc cimport PL_ERR_NOMEM, pl_vocab_split_list, pl_vocab_split_list_free, pl_vocab_splits


def vocab_splits(list tokens):
    """Every split of a token into two of tokens (csrc/vocab.c), by token, then cut: four int64
    arrays, the token, the cut (its left part's characters) and the tokens of the two parts (of
    equal tokens, the first)."""
    encoded = [t.encode("utf-8", "surrogatepass") for t in tokens]  # a str may hold a lone surrogate
    cdef bytes data = b"".join(encoded)
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    del encoded
    cdef const int64_t *off = <const int64_t *><uintptr_t>offsets.ctypes.data
    cdef const char *base = data
    cdef pl_vocab_split_list found
    cdef int64_t n = len(tokens)
    cdef int rc
    with nogil:
        rc = pl_vocab_splits(base, off, n, &found)
    if rc == PL_ERR_NOMEM:
        raise MemoryError("no memory to split the vocabulary's tokens")
    if rc != 0:
        raise ValueError("a vocabulary of over 2^31 tokens, or a token of over 2^31 bytes")
    out = np.empty((4, found.n), dtype=np.int64)
    cdef int64_t *o = <int64_t *><uintptr_t>out.ctypes.data
    if found.n:
        memcpy(o, found.which, found.n * sizeof(int64_t))
        memcpy(o + found.n, found.cut, found.n * sizeof(int64_t))
        memcpy(o + 2 * found.n, found.left, found.n * sizeof(int64_t))
        memcpy(o + 3 * found.n, found.right, found.n * sizeof(int64_t))
    pl_vocab_split_list_free(&found)
    return tuple(out)


def gguf_strings(buf, Py_ssize_t pos, Py_ssize_t count, Py_ssize_t end):
    """GGUF's array of count strings from buf[pos] (each a little-endian u64 length, then that
    many bytes of UTF-8), none past end, for pyllm.formats.gguf (a vocabulary's 262k strings
    took 0.3 s in a Python loop). Returns (strings, the position after them, None, 0, ""), or
    where it fails (None, the byte of the failing string's length, the problem, its index, and
    for "utf-8" the decoder's reason; "truncated": no room for the length; "claims": n past end)."""
    cdef Py_buffer view
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if pos < 0 or end > view.len or pos > end:
            raise ValueError(f"bytes [{pos}, {end}) are not inside a buffer of {view.len}")
        return _strings_at(<const unsigned char *>view.buf, pos, count, end)
    finally:
        PyBuffer_Release(&view)


cdef tuple _strings_at(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t count, Py_ssize_t end):
    cdef list out = [None] * count
    cdef Py_ssize_t i, at
    cdef unsigned long long n
    cdef int b
    for i in range(count):
        at = pos
        if end - pos < 8:
            return None, at, "truncated", i, ""
        n = 0
        for b in range(8):
            n |= (<unsigned long long>buf[pos + b]) << (8 * b)
        pos += 8
        if n > <unsigned long long>(end - pos):
            return None, at, "claims", i, str(n)
        if n == 0:
            out[i] = ""
            continue
        try:
            out[i] = PyUnicode_DecodeUTF8(<const char *>&buf[pos], <Py_ssize_t>n, NULL)
        except UnicodeDecodeError as e:
            return None, at, "utf-8", i, e.reason
        pos += <Py_ssize_t>n
    return out, pos, None, 0, ""
