"""GGUF files of the exact shapes of the models people run on laptops, with random weights, quantized by
llama.cpp's own `llama-quantize`, for timing pyllm and llama.cpp on the same file.

    python benchmarks/laptop_shapes.py                            # llama-3.2-1b Q4_K_M
    python benchmarks/laptop_shapes.py --model llama-3.2-3b --quant q4_k_m,q8_0,q4_0
    python benchmarks/laptop_shapes.py --model all --check        # every shape; load and run each in both engines
    PYLLM_BENCH_CACHE=/data/bench python benchmarks/laptop_shapes.py --model llama-3.1-8b

Decode speed does not depend on the weights' values, only on their shapes and types, and both engines
read the same file. Each model's hyper-parameters are those of its published config (SHAPES). The
weights are N(0, 0.02) (seeded per tensor), the norms ones, so activations stay finite; they are written
as f16 by gguf-py's GGUFWriter one tensor at a time (an 8B model never sits in memory whole), then
`llama-quantize` makes each --quant type from that f16 file, choosing per tensor as it does for a real
model (Q4_K_M: q6_K for the head and half the attn_v/ffn_down, q4_K elsewhere). The vocabulary is
synthetic, of the model's size: a SentencePiece-style "llama" vocabulary (<unk> <s> </s>, the byte
tokens <0x00>..<0xFF>, then characters, pairs and triples with descending scores), which both engines
load; the real models' byte-level BPE vocabularies would make the same embedding and head shapes.

Files go to the cache folder (--cache, or $PYLLM_BENCH_CACHE, default ~/.cache/pyllm-bench), never into
the repository; a file already there is reused. llama-quantize and llama-bench are built there too, once,
with CMake from the llama-cpp-python sdist's vendor/llama.cpp (CPU only, Release, -march=native).
"""
from __future__ import annotations

import argparse
import glob
import itertools
import math
import os
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass

import numpy as np

LLAMA_CPP_PYTHON = "0.3.36"  # the sdist whose vendor/llama.cpp is built: the llama.cpp bench.py times
CACHE = os.path.expanduser(os.environ.get("PYLLM_BENCH_CACHE", "~/.cache/pyllm-bench"))
SDIST_PLACES = ("~/.cache/pyllm", "~/.cache/pyllm/sdist")  # where an sdist or its extraction may already be
QUANTS = ("q4_k_m", "q8_0", "q4_0")
SCALE = 0.02  # weights' standard deviation, as the models' initializer_range
SEED = 0
CHUNK = 1 << 24  # elements of float32 drawn at once (64 MiB)


@dataclass(frozen=True)
class Shape:
    arch: str  # GGUF general.architecture
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool
    qkv_bias: bool
    rope_theta: float
    rms_eps: float
    context: int
    rope_llama3: tuple | None = None  # (factor, low_freq_factor, high_freq_factor, original context)


# From each model's config.json on its Hugging Face page.
SHAPES = {
    "llama-3.2-1b": Shape("llama", 2048, 16, 32, 8, 64, 8192, 128256, True, False, 500000.0, 1e-5, 131072,
                          (32.0, 1.0, 4.0, 8192)),
    "llama-3.2-3b": Shape("llama", 3072, 28, 24, 8, 128, 8192, 128256, True, False, 500000.0, 1e-5, 131072,
                          (32.0, 1.0, 4.0, 8192)),
    "qwen2.5-1.5b": Shape("qwen2", 1536, 28, 12, 2, 128, 8960, 151936, True, True, 1000000.0, 1e-6, 32768),
    "llama-3.1-8b": Shape("llama", 4096, 32, 32, 8, 128, 14336, 128256, False, False, 500000.0, 1e-5, 131072,
                          (8.0, 1.0, 4.0, 8192)),
}


# ----------------------------------------------------------------------------------------------
# llama.cpp's tools, built from the llama-cpp-python sdist
# ----------------------------------------------------------------------------------------------

def llama_cpp_source(cache: str) -> str:
    """The vendor/llama.cpp folder of llama-cpp-python's sdist: an extraction already on disk, else the
    tarball (found, or fetched by pip) extracted into the cache."""
    name = f"llama-cpp-python-{LLAMA_CPP_PYTHON}"
    for place in (cache,) + SDIST_PLACES:
        src = os.path.join(os.path.expanduser(place), name, "vendor", "llama.cpp")
        if os.path.isfile(os.path.join(src, "CMakeLists.txt")):
            return src
    tarball = next((p for place in (cache,) + SDIST_PLACES
                    for p in glob.glob(os.path.join(os.path.expanduser(place), f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"))),
                   None)
    if tarball is None:
        # only this package from source: `--no-binary :all:` builds its build dependencies too (cmake,
        # 20 minutes on 2 cores) just to read the sdist's metadata
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
                        f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", cache], check=True)
        tarball = os.path.join(cache, f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz")
    with tarfile.open(tarball) as tar:
        tar.extractall(cache, filter="data")
    return os.path.join(cache, name, "vendor", "llama.cpp")


def llama_tools(cache: str, jobs: int = 2) -> dict[str, str]:
    """Paths of llama-quantize and llama-bench, built with CMake when either is missing."""
    build = os.path.join(cache, f"llama.cpp-{LLAMA_CPP_PYTHON}")
    tools = {t: os.path.join(build, "bin", t) for t in ("llama-quantize", "llama-bench")}
    if all(os.access(p, os.X_OK) for p in tools.values()):
        return tools
    src = llama_cpp_source(cache)
    print(f"building {', '.join(tools)} from {src} in {build} (several minutes on 2 cores)", flush=True)
    off = ("LLAMA_CURL", "LLAMA_OPENSSL", "LLAMA_BUILD_TESTS", "LLAMA_BUILD_EXAMPLES", "LLAMA_BUILD_SERVER",
           "LLAMA_BUILD_APP", "BUILD_SHARED_LIBS", "GGML_CUDA", "GGML_METAL", "GGML_VULKAN")
    subprocess.run(["cmake", "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON"]
                   + [f"-D{o}=OFF" for o in off], check=True)
    subprocess.run(["cmake", "--build", build, "--config", "Release", "-j", str(jobs), "--target", *tools],
                   check=True)
    return tools


# ----------------------------------------------------------------------------------------------
# The f16 GGUF
# ----------------------------------------------------------------------------------------------

def vocabulary(n: int) -> tuple[list[str], list[float], list[int]]:
    """n tokens of a SentencePiece-style vocabulary, their scores and llama.cpp token types: <unk> <s>
    </s>, the 256 byte tokens, then single characters, pairs and triples of an alphabet, every one
    splittable into two earlier tokens so BPE can build it; scores fall with the id."""
    from gguf import TokenType

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    singles = ["\u2581"] + [chr(c) for c in range(33, 127)]
    alphabet = "\u2581etaoinshrdlcumwfgypbvkjxqzETAOINSHRDLCUMWFGYPBVKJXQZ,.'-0123456789"
    words = itertools.chain(singles, map("".join, itertools.product(alphabet, repeat=2)),
                            map("".join, itertools.product(alphabet, repeat=3)))
    normal = list(itertools.islice(words, n - len(tokens)))
    if len(tokens) + len(normal) != n:
        raise ValueError(f"the synthetic vocabulary has fewer than {n} tokens")
    tokens += normal
    types += [TokenType.NORMAL] * len(normal)
    scores = [0.0] * 259 + [-float(i) for i in range(len(normal))]
    return tokens, scores, [int(t) for t in types]


def llama3_rope_factors(s: Shape) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's converter writes it for rope_scaling type llama3."""
    factor, low, high, original = s.rope_llama3
    freqs = 1.0 / s.rope_theta ** (np.arange(0, s.head_dim, 2, dtype=np.float64) / s.head_dim)
    wavelen = 2 * math.pi / freqs
    smooth = (original / wavelen - low) / (high - low)
    out = np.where(wavelen < original / high, 1.0,
                   np.where(wavelen > original / low, factor, 1 / ((1 - smooth) / factor + smooth)))
    return out.astype(np.float32)


def tensor_list(s: Shape) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape (rows, columns), kind) of every tensor, in llama.cpp's converter's order; kind
    is "matrix" (random f16), "norm" (ones, f32), "bias" (random f32) or "rope" (llama3 factors)."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    out = [("rope_freqs.weight", (s.head_dim // 2,), "rope")] if s.rope_llama3 else []
    out.append(("token_embd.weight", (s.vocab, s.hidden), "matrix"))
    for i in range(s.layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (s.hidden,), "norm"),
                (b + "attn_q.weight", (q, s.hidden), "matrix"),
                (b + "attn_k.weight", (kv, s.hidden), "matrix"),
                (b + "attn_v.weight", (kv, s.hidden), "matrix")]
        if s.qkv_bias:
            out += [(b + "attn_q.bias", (q,), "bias"), (b + "attn_k.bias", (kv,), "bias"),
                    (b + "attn_v.bias", (kv,), "bias")]
        out += [(b + "attn_output.weight", (s.hidden, q), "matrix"),
                (b + "ffn_norm.weight", (s.hidden,), "norm"),
                (b + "ffn_gate.weight", (s.ffn, s.hidden), "matrix"),
                (b + "ffn_up.weight", (s.ffn, s.hidden), "matrix"),
                (b + "ffn_down.weight", (s.hidden, s.ffn), "matrix")]
    out.append(("output_norm.weight", (s.hidden,), "norm"))
    if not s.tied:
        out.append(("output.weight", (s.vocab, s.hidden), "matrix"))
    return out


def tensor_data(s: Shape, index: int, shape: tuple[int, ...], kind: str) -> np.ndarray:
    if kind == "norm":
        return np.ones(shape, dtype=np.float32)
    if kind == "rope":
        return llama3_rope_factors(s)
    rng = np.random.default_rng([SEED, index])  # seeded per tensor: the same file whatever is made first
    if kind == "bias":
        return (rng.standard_normal(shape, dtype=np.float32) * SCALE).astype(np.float32)
    out = np.empty(shape, dtype=np.float16)  # drawn in chunks: 2 bytes an element held, not 6
    flat = out.reshape(-1)
    for start in range(0, flat.size, CHUNK):
        part = rng.standard_normal(min(CHUNK, flat.size - start), dtype=np.float32)
        part *= SCALE
        flat[start:start + part.size] = part
    return out


def write_gguf(name: str, s: Shape, path: str, file_type: int | None = None, matrix_type=None, quantize=None) -> None:
    """The GGUF of shape s, written tensor by tensor to path + ".part", renamed when complete: matrices
    f16, or matrix_type(tensor name) (a gguf.GGMLQuantizationType) as quantize(float32 rows, type) gives
    their bytes (tests/laptop_gguf.py writes a Q4_K_M file so); file_type the general.file_type."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, LlamaFileType

    tmp = path + ".part"
    w = GGUFWriter(tmp, s.arch)
    a = s.arch
    w.add_name(f"random {name}")
    w.add_file_type(int(LlamaFileType.MOSTLY_F16 if file_type is None else file_type))
    w.add_context_length(s.context)
    w.add_embedding_length(s.hidden)
    w.add_block_count(s.layers)
    w.add_feed_forward_length(s.ffn)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_dimension_count(s.head_dim)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(s.rms_eps)
    w.add_uint32(f"{a}.vocab_size", s.vocab)
    tokens, scores, types = vocabulary(s.vocab)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)

    tensors = tensor_list(s)
    types = [matrix_type(tname) if matrix_type and kind == "matrix" else None for tname, _, kind in tensors]
    for (tname, shape, kind), qtype in zip(tensors, types):
        if qtype in (None, GGMLQuantizationType.F16):
            dtype = np.float16 if kind == "matrix" else np.float32
            w.add_tensor_info(tname, shape, np.dtype(dtype), math.prod(shape) * np.dtype(dtype).itemsize)
        else:
            block, size = GGML_QUANT_SIZES[qtype]
            rows, cols = shape
            w.add_tensor_info(tname, (rows, cols // block * size), np.dtype(np.uint8), rows * (cols // block * size),
                              raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for i, ((tname, shape, kind), qtype) in enumerate(zip(tensors, types)):
        data = tensor_data(s, i, shape, kind)
        if qtype not in (None, GGMLQuantizationType.F16):
            data = quantize(data.astype(np.float32), qtype)
        w.write_tensor_data(data)
    w.close()
    os.replace(tmp, path)


def make(name: str, quant: str, cache: str, threads: int) -> str:
    """The path of name's GGUF quantized to quant, made (f16 first) when not in the cache."""
    s = SHAPES[name]
    out = os.path.join(cache, f"{name}-random.{quant.upper()}.gguf")
    if os.path.exists(out):
        return out
    os.makedirs(cache, exist_ok=True)
    f16 = os.path.join(cache, f"{name}-random.F16.gguf")
    if not os.path.exists(f16):
        t = time.perf_counter()
        write_gguf(name, s, f16)
        print(f"wrote {f16} ({os.path.getsize(f16) / 2**30:.2f} GiB) in {time.perf_counter() - t:.0f} s", flush=True)
    tools = llama_tools(cache)
    t = time.perf_counter()
    done = subprocess.run([tools["llama-quantize"], f16, out + ".part", quant.upper(), str(threads)],
                          capture_output=True, text=True)  # it logs every tensor; shown only on failure
    if done.returncode:
        raise SystemExit(f"llama-quantize {f16} {quant.upper()} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    os.replace(out + ".part", out)
    print(f"wrote {out} ({os.path.getsize(out) / 2**30:.2f} GiB) in {time.perf_counter() - t:.0f} s", flush=True)
    return out


def check(path: str, threads: int) -> None:
    """Loads path in pyllm and in llama.cpp (llama-cpp-python), runs a prompt of 16 ids through each and
    says whether the logits are finite and whether the greedy next tokens agree."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's pyllm
    import pyllm

    ids = list(range(300, 316))
    llm = pyllm.load(path, threads=threads, n_ctx=256)
    ours = np.asarray(llm._prefill(ids), dtype=np.float32)
    print(f"pyllm: {path}: logits {ours.shape}, finite {bool(np.isfinite(ours).all())}, "
          f"std {ours.std():.3f}, argmax {int(ours.argmax())}")
    del llm
    try:
        import llama_cpp
    except ImportError:
        print("llama.cpp: llama-cpp-python is not installed")
        return
    ref = llama_cpp.Llama(model_path=path, n_threads=threads, n_ctx=256, verbose=False)
    ref.eval(ids)
    # eval copies no logits into ref.scores without logits_all: read the last row from the context
    row = llama_cpp.llama_get_logits_ith(ref._ctx.ctx, -1)
    theirs = np.ctypeslib.as_array(row, shape=(ref.n_vocab(),)).astype(np.float32)
    print(f"llama.cpp: logits {theirs.shape}, finite {bool(np.isfinite(theirs).all())}, std {theirs.std():.3f}, "
          f"argmax {int(theirs.argmax())}; max |difference| {np.abs(ours - theirs).max():.3f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.2-1b", help=f"comma list of {', '.join(SHAPES)}, or all")
    p.add_argument("--quant", default="q4_k_m", help=f"comma list of {', '.join(QUANTS)} (llama-quantize types)")
    p.add_argument("--cache", default=CACHE, help="folder for the files and the llama.cpp build "
                                                  "(default $PYLLM_BENCH_CACHE or ~/.cache/pyllm-bench)")
    p.add_argument("--threads", type=int, default=2, help="threads for llama-quantize and --check")
    p.add_argument("--check", action="store_true", help="load and run each file in pyllm and llama.cpp")
    p.add_argument("--drop-f16", action="store_true", help="delete each model's f16 file (what every --quant "
                   "is made from; 16 GB at 8B) once its types are made")
    p.add_argument("--tools", action="store_true", help="only build llama-quantize and llama-bench, print paths")
    a = p.parse_args(argv)
    cache = os.path.abspath(os.path.expanduser(a.cache))
    if a.tools:
        for tool, path in llama_tools(cache).items():
            print(f"{tool}: {path}")
        return 0
    names = list(SHAPES) if a.model == "all" else a.model.split(",")
    quants = a.quant.lower().split(",")
    for bad in [n for n in names if n not in SHAPES] + [q for q in quants if q not in QUANTS]:
        p.error(f"unknown model or type {bad!r}")
    for name in names:
        for quant in quants:
            path = make(name, quant, cache, a.threads)
            print(path, flush=True)
            if a.check:
                check(path, a.threads)
        f16 = os.path.join(cache, f"{name}-random.F16.gguf")
        if a.drop_f16 and os.path.exists(f16):
            os.unlink(f16)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
