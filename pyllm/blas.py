"""Thread control of SciPy's OpenBLAS, so prefill runs sgemm on pyllm's own threads.

pyllm's pool splits each prefill matmul by weight rows and every thread calls sgemm on its slice,
dequantizing and multiplying without waiting on the others. That needs OpenBLAS single-threaded for
the call — else its own pool spins against ours. SciPy's wheels vendor OpenBLAS with prefixed symbols;
the core sets its thread count to 1 for the duration of a prefill and restores it after.
Where no OpenBLAS is found (e.g. Accelerate on macOS) the core calls sgemm from one thread instead.
"""
from __future__ import annotations

import ctypes
import glob
import os

_PREFIXES = ("scipy_openblas_", "openblas_")


def candidate_libraries() -> list[str]:
    found = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if "/" in line else ""
                if "openblas" in os.path.basename(path).lower() and path not in found:
                    found.append(path)
    except OSError:
        pass
    import scipy  # here, not at import: a quantized model never loads SciPy's BLAS

    root = os.path.dirname(scipy.__file__)
    for pattern in ("../scipy.libs/*openblas*", ".dylibs/*openblas*", "../scipy.libs/*.dll"):
        found += [p for p in glob.glob(os.path.join(root, pattern)) if p not in found]
    return found


def openblas_thread_controls() -> tuple[int, int]:
    """Addresses of (set_num_threads, get_num_threads) of SciPy's OpenBLAS, or (0, 0)."""
    import scipy.linalg.cython_blas  # noqa: F401  (loads the library whose symbols we look up)

    for path in candidate_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in _PREFIXES:
            try:
                set_fn = getattr(lib, prefix + "set_num_threads")
                get_fn = getattr(lib, prefix + "get_num_threads")
            except AttributeError:
                continue
            return (ctypes.cast(set_fn, ctypes.c_void_p).value or 0,
                    ctypes.cast(get_fn, ctypes.c_void_p).value or 0)
    return (0, 0)
