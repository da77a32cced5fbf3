"""The quantized loss of pyllm and llama.cpp on many texts, paired token by token: the mean KL
divergence from transformers' float32 load (benchmarks/kl_divergence.py's reference) over the first
512 ids of each of several sections of Python's reference manual (`pydoc_data.topics`, text neither
model has by heart), then the ratio pyllm ÷ llama.cpp over all tokens with a 95% interval from a
bootstrap over blocks of 64 tokens (neighbouring tokens' losses are not independent).

    python benchmarks/kl_paired.py ~/.cache/pyllm/gemma-3-270m-q4_k_m.gguf
    python benchmarks/kl_paired.py FILE.gguf --topics compound,types --save kl.json

One text's ratio moves by ±10% with the rounding of a few tokens (the ten worst tokens carry nearly
all of the difference between the engines), so a verdict needs thousands of tokens.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

import kl_divergence as K

TOPICS = "compound,types,formatstrings,string-methods,debugger,attribute-access,customization,execmodel,import,calls"


def token_kl(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """KL(ref || got) of each next-token distribution (rows predict ids[1:])."""
    p, q = K.log_softmax(ref[:-1]), K.log_softmax(got[:-1])
    return (np.exp(p) * (p - q)).sum(axis=-1)


def block_bootstrap(a: np.ndarray, b: np.ndarray, block: int = 64, rounds: int = 5000) -> tuple[float, float]:
    """A 95% interval of mean(b) / mean(a), resampling whole blocks of tokens."""
    n = len(a) // block
    a_blocks, b_blocks = a[:n * block].reshape(n, block).mean(1), b[:n * block].reshape(n, block).mean(1)
    rng = np.random.default_rng(0)
    picks = rng.integers(0, n, (rounds, n))
    ratios = b_blocks[picks].mean(1) / a_blocks[picks].mean(1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("--topics", default=TOPICS, help="pydoc_data.topics sections, a comma list")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save", default=None, help="write every token's KL per engine to this JSON file")
    args = ap.parse_args()

    import pydoc_data.topics

    import pyllm

    tokenizer = pyllm.load(args.gguf, threads=1, n_ctx=16)
    ours, theirs, saved = [], [], {}
    print("| text | ids | llama.cpp | pyllm | pyllm ÷ llama.cpp |\n|---|---:|---:|---:|---:|")
    for topic in args.topics.split(","):
        ids = tokenizer.tokenize(pydoc_data.topics.topics[topic])[:args.tokens]
        ref = K.reference_logits(args.gguf, ids)
        theirs_kl = token_kl(ref, K.llama_cpp_logits(args.gguf, ids, args.threads))
        ours_kl = token_kl(ref, K.pyllm_logits(args.gguf, ids, args.threads, "best", None, None))
        ours.append(ours_kl)
        theirs.append(theirs_kl)
        saved[topic] = {"llama.cpp": theirs_kl.tolist(), "pyllm": ours_kl.tolist()}
        print(f"| {topic} | {len(ids)} | {theirs_kl.mean():.5f} | {ours_kl.mean():.5f} | "
              f"{ours_kl.mean() / theirs_kl.mean():.3f} |", flush=True)
    a, b = np.concatenate(theirs), np.concatenate(ours)
    low, high = block_bootstrap(a, b)
    print(f"| all | {len(a)} | {a.mean():.5f} | {b.mean():.5f} | {b.mean() / a.mean():.3f} "
          f"(95%: {low:.3f}-{high:.3f}) |")
    if args.save:
        with open(args.save, "w") as f:
            json.dump(saved, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
