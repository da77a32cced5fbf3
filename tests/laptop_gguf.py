"""A Q4_K_M GGUF of a laptop model's shape, small enough for the tests: Llama-3.2-1B's layer (hidden 2,048,
32 heads, 8 KV heads, FFN 8,192, rope theta 500,000 with llama3 scaling, tied head) twice, over a vocabulary
of 2,048 tokens, random weights.

The shapes, weights, vocabulary and writer are benchmarks/laptop_shapes.py's, so the tests run the file the
benchmarks measure, cut down. Each matrix is quantized by llama.cpp's own code: `ggml_quantize_chunk` of
libggml-base, built once from the llama-cpp-python sdist the converter comes from (CMake, about 20 s of CPU;
llama-quantize itself would also build libllama and common, minutes on 2 cores), into the tests' cache. The
per-tensor types are llama.cpp's Q4_K_M choice (`llama_tensor_get_type` in src/llama-quant.cpp) for a llama
model: q6_K for the head (here the tied embedding) and for attn_v and ffn_down in the layers where
`use_more_bits` holds, q4_K for every other matrix, norms and rope factors f32. llama-quantize makes the same
rows from the same f16 weights (it widens them to f32 and calls ggml_quantize_chunk without an importance
matrix): checked byte for byte against llama-cpp-python 0.3.36's `llama_model_quantize` when written.

    >>> path = make_q4_k_m(tmp_dir + "/llama-3.2-1b-2-layers.Q4_K_M.gguf")   # doctest: +SKIP
"""
from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from families import cache_dir, llama_cpp_converter

LLAMA_3_2_1B_2_LAYERS = dict(layers=2, vocab=2048, context=8192)


def laptop_shapes():
    """benchmarks/laptop_shapes.py as a module (registered before it runs: its dataclass looks itself up)."""
    if "laptop_shapes" not in sys.modules:
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "laptop_shapes.py")
        spec = importlib.util.spec_from_file_location("laptop_shapes", path)
        module = sys.modules["laptop_shapes"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules["laptop_shapes"]


def ggml_base() -> ctypes.CDLL:
    """libggml-base of the sdist's vendor/llama.cpp, built into the cache on first use (built beside, then
    renamed into place, so a crash or a concurrent caller never leaves half a build behind)."""
    source = os.path.dirname(llama_cpp_converter())
    version = os.path.basename(os.path.dirname(os.path.dirname(source)))  # llama-cpp-python-X.Y.Z
    done = os.path.join(cache_dir(), f"ggml-base-{version}")
    library = os.path.join(done, "libggml-base.so")
    if not os.path.isfile(library):
        build = tempfile.mkdtemp(dir=cache_dir(), prefix=".ggml-base-")
        try:
            off = ("LLAMA_CURL", "LLAMA_OPENSSL", "LLAMA_BUILD_TESTS", "LLAMA_BUILD_EXAMPLES", "LLAMA_BUILD_SERVER",
                   "LLAMA_BUILD_TOOLS", "GGML_NATIVE")
            for cmd in (["cmake", "-S", source, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON"]
                        + [f"-D{o}=OFF" for o in off],
                        ["cmake", "--build", build, "-j", "2", "--target", "ggml-base"]):
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode:
                    raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                                       f"{proc.stderr[-3000:]}")
            os.makedirs(os.path.join(build, "done"))
            shutil.copy(os.path.realpath(os.path.join(build, "bin", "libggml-base.so")),
                        os.path.join(build, "done", "libggml-base.so"))
            try:
                os.rename(os.path.join(build, "done"), done)
            except OSError:
                if not os.path.isfile(library):  # not a concurrent caller that got there first
                    raise
        finally:
            shutil.rmtree(build, ignore_errors=True)
    lib = ctypes.CDLL(library)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return lib


def quantizer(lib: ctypes.CDLL):
    """quantize(rows as float32 (rows, cols), type) -> the type's bytes (rows, row bytes), by ggml."""
    from gguf import GGML_QUANT_SIZES

    def quantize(x: np.ndarray, qtype) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        rows, cols = x.shape
        block, size = GGML_QUANT_SIZES[qtype]
        out = np.empty((rows, cols // block * size), np.uint8)
        written = lib.ggml_quantize_chunk(int(qtype), x.ctypes.data, out.ctypes.data, 0, rows, cols, None)
        assert written == out.size
        return out

    return quantize


def q4_k_m_type(name: str, layers: int):
    """llama.cpp's Q4_K_M type of a llama model's matrix `name` (the head tied to the embedding)."""
    from gguf import GGMLQuantizationType as Q

    def use_more_bits(i: int) -> bool:
        return i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2

    if name in ("token_embd.weight", "output.weight"):
        return Q.Q6_K
    layer = re.match(r"blk\.(\d+)\.(attn_v|ffn_down)\.weight$", name)
    return Q.Q6_K if layer and use_more_bits(int(layer.group(1))) else Q.Q4_K


def make_q4_k_m(path: str) -> str:
    """Writes the 2-layer Llama-3.2-1B-shaped Q4_K_M file to path; returns path."""
    from gguf import LlamaFileType

    shapes = laptop_shapes()
    s = dataclasses.replace(shapes.SHAPES["llama-3.2-1b"], **LLAMA_3_2_1B_2_LAYERS)
    shapes.write_gguf("llama-3.2-1b, 2 layers", s, path, int(LlamaFileType.MOSTLY_Q4_K_M),
                      lambda name: q4_k_m_type(name, s.layers), quantizer(ggml_base()))
    return path
