"""How much a quantized GGUF loses, per engine: the mean KL divergence of each next-token distribution
from the reference's, llama.cpp's own quality metric (`llama-perplexity --kl-divergence`), steadier than
a perplexity delta. The reference is transformers' float32 load of the same file (every matrix
dequantized), so pyllm and llama.cpp are measured against one distribution over the same ids.

    python benchmarks/kl_divergence.py ~/.cache/pyllm/gemma-3-270m-q4_k_m.gguf
    python benchmarks/kl_divergence.py FILE.gguf --isa avx2,avx512,scalar --kv-dtype f16,f32
    python benchmarks/kl_divergence.py FILE.gguf --text prose.txt --tokens 512 --engines pyllm

Prints, per engine and setting: mean KL (nats), its 99th percentile, the top-1 agreement with the
reference and the perplexity of the text under each; one window from the first token (BOS as the
file's tokenizer says), no sliding. llama.cpp is llama-cpp-python (logits of every position, its
default f16 cache) and is left out where it is not installed. Needs torch, transformers and gguf.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TEXT = os.path.join(HERE, "..", "tests", "data", "gettysburg.txt")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def compare(ref: np.ndarray, got: np.ndarray, ids: list[int]) -> dict:
    """KL(ref || got) per position, top-1 agreement and the text's perplexity under got; rows are the
    predictions of ids[1:]."""
    p, q = log_softmax(ref[:-1]), log_softmax(got[:-1])
    kl = (np.exp(p) * (p - q)).sum(axis=-1)
    nll = -q[np.arange(len(ids) - 1), ids[1:]]
    return {"kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99)),
            "top1": float((p.argmax(-1) == q.argmax(-1)).mean()), "ppl": float(np.exp(nll.mean()))}


def reference_logits(path: str, ids: list[int]) -> np.ndarray:
    import torch
    import transformers

    folder, name = os.path.split(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def llama_cpp_logits(path: str, ids: list[int], threads: int) -> np.ndarray | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    llm = llama_cpp.Llama(model_path=path, n_ctx=len(ids) + 8, n_batch=512, n_threads=threads,
                          n_threads_batch=threads, logits_all=True, verbose=False)
    llm.eval(ids)
    return np.array(llm.scores[:len(ids)], dtype=np.float32)


def pyllm_logits(path: str, ids: list[int], threads: int, isa: str, kv_dtype: str | None,
                 dtype: str | None) -> np.ndarray:
    import pyllm
    from pyllm import _core

    _core.set_isa(isa)
    llm = pyllm.load(path, threads=threads, n_ctx=max(len(ids), 16), kv_dtype=kv_dtype, dtype=dtype)
    return llm.logits(ids)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("--text", default=DEFAULT_TEXT, help="a UTF-8 text (default: tests/data/gettysburg.txt)")
    ap.add_argument("--tokens", type=int, default=512, help="ids scored at most (default 512)")
    ap.add_argument("--engines", default="pyllm,llama.cpp")
    ap.add_argument("--isa", default="best", help="pyllm's kernels, a comma list (best, avx512, avx2, scalar)")
    ap.add_argument("--kv-dtype", default="default", help="pyllm's cache types, a comma list (default, f16, f32)")
    ap.add_argument("--dtype", default=None, help="pyllm.load(dtype=) (f32: the weights widened)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import pyllm
    from pyllm import _core

    with open(args.text, encoding="utf-8") as f:
        ids = pyllm.load(args.gguf, threads=1, n_ctx=16).tokenize(f.read())[:args.tokens]
    ref = reference_logits(args.gguf, ids)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                            text=True).stdout.strip()
    print(f"{os.path.basename(args.gguf)}, {len(ids)} ids of {os.path.basename(args.text)}; reference: "
          f"transformers float32 (dequantized); {platform.processor() or platform.machine()}, best ISA "
          f"{_core.best_isa()}, {args.threads} threads; pyllm {commit}\n")
    print("| engine | setting | mean KL | KL p99 | top-1 | ppl |")
    print("|---|---|---:|---:|---:|---:|")
    print(f"| transformers f32 | reference | 0 | 0 | 1 | {compare(ref, ref, ids)['ppl']:.4f} |")
    engines = args.engines.split(",")
    if "llama.cpp" in engines:
        got = llama_cpp_logits(args.gguf, ids, args.threads)
        if got is None:
            print("| llama.cpp | not installed | | | | |")
        else:
            r = compare(ref, got, ids)
            print(f"| llama.cpp | f16 cache | {r['kl_mean']:.5f} | {r['kl_p99']:.5f} | {r['top1']:.4f} | "
                  f"{r['ppl']:.4f} |")
    if "pyllm" in engines:
        for isa in args.isa.split(","):
            for kv in args.kv_dtype.split(","):
                got = pyllm_logits(args.gguf, ids, args.threads, isa, None if kv == "default" else kv, args.dtype)
                r = compare(ref, got, ids)
                setting = f"{_core.current_isa()}, {kv} cache" + (f", dtype {args.dtype}" if args.dtype else "")
                print(f"| pyllm | {setting} | {r['kl_mean']:.5f} | {r['kl_p99']:.5f} | {r['top1']:.4f} | "
                      f"{r['ppl']:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
